"""``migronaut logs``: the recorded runs, and one run's record with its ``ctx.logger`` lines.

Read-only. ``migronaut logs`` lists the newest runs; ``migronaut logs RUN_ID`` (or a unique
prefix of it) / ``--last`` shows one run. Every value read back is sanitised before it reaches
the terminal; ``--json`` prints the records as stored (camelCase).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from migronaut._redact import sanitize_terminal
from migronaut.cli.app import command
from migronaut.cli.output import CYAN, DIM, GREEN, INFO, RED, YELLOW, Output, paint
from migronaut.cli.render import applied_at, table
from migronaut.cli.session import Session, parse_int
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.observability.history import RunLog, RunRecord

RUN_COLUMNS = ("Run", "Command", "Outcome", "By", "Reason", "Started", "Duration", "Applied",
               "Reverted")
_OUTCOME_STYLE = {"success": GREEN, "failed": RED, "lock-lost": RED, "stopped": YELLOW,
                  "interrupted": YELLOW, "running": CYAN}
_LEVEL_STYLE = {"debug": DIM, "warning": YELLOW, "error": RED, "critical": RED}
DEFAULT_LIMIT = 20


@command(
    "logs",
    help="Show the recorded runs (newest first), or one run — RUN_ID, a unique prefix of it, "
    "or --last — with who ran it, why, its outcome and the log lines its migrations wrote "
    "through ctx.logger.",
    short_help="Show recorded runs and their log lines.",
)
@click.argument("run_id", metavar="[RUN_ID]", required=False)
@click.option("--last", is_flag=True, help="Show the newest run.")
@click.option("--migration", metavar="NAME", help="Only the lines of this migration.")
@click.option("--level", metavar="LEVEL",
              help="Only lines at or above LEVEL: debug, info, warning, error, critical.")
@click.option("--limit", metavar="N", help=f"How many runs to list (default {DEFAULT_LIMIT}).")
def logs(
    session: Session,
    run_id: str | None,
    last: bool,
    migration: str | None,
    level: str | None,
    limit: str | None,
) -> int:
    from migronaut.observability.history import check_level, check_limit, run_log_json

    if run_id is not None and last:
        raise ConfigInvalidError("RUN_ID and --last cannot be combined",
                                 {"options": ["RUN_ID", "--last"]})
    one_run = run_id is not None or last
    if not one_run:
        for flag, value in (("--migration", migration), ("--level", level)):
            if value is not None:
                raise ConfigInvalidError(f"{flag} needs a run: pass RUN_ID or --last",
                                         {"option": flag})
        parsed = parse_int(limit, "--limit")
        count = DEFAULT_LIMIT if parsed is None else check_limit(parsed, "--limit")
        return session.run(
            lambda migrator: migrator.runs(count),
            render=render_runs,
            to_json=lambda runs: [run.to_dict() for run in runs],
            read_only=True,
        )
    if limit is not None:
        raise ConfigInvalidError("--limit lists runs: it cannot be combined with RUN_ID or --last",
                                 {"option": "--limit"})
    check_level(level)
    return session.run(
        lambda migrator: migrator.run_log(run_id, migration=migration, level=level),
        render=render_run_log,
        to_json=run_log_json,
        read_only=True,
    )


def _duration(ms: int | None) -> str:
    return "" if ms is None else f"{ms}ms"


def _outcome(run: RunRecord) -> tuple[str, str | None]:
    return run.outcome, _OUTCOME_STYLE.get(run.outcome)


def render_runs(runs: Sequence[RunRecord], out: Output) -> None:
    """The ``Run | Command | Outcome | By | Reason | Started | Duration | Applied | Reverted``
    table."""
    if not runs:
        out.info("No runs recorded")
        return
    rows = [
        [
            (sanitize_terminal(run.run_id), None),
            (sanitize_terminal(run.command or ""), None),
            _outcome(run),
            (sanitize_terminal(run.requested_by or ""), None),
            (sanitize_terminal(run.reason or ""), None),
            (applied_at(run.started_at), None),
            (_duration(run.duration_ms), None),
            (str(len(run.applied)), None),
            (str(len(run.reverted)), None),
        ]
        for run in runs
    ]
    table(RUN_COLUMNS, rows, out, wrap=("Reason",))


def render_run_log(log: RunLog | None, out: Output) -> None:
    """The run's facts, one per line, then its log lines in order."""
    if log is None:
        out.info("No runs recorded")
        return
    colour = out.colour(out.stream_for(INFO))
    run = log.run
    outcome = paint(run.outcome, _OUTCOME_STYLE.get(run.outcome), colour)
    if run.error:
        code = run.error.get("code")
        message = run.error.get("message", "")
        outcome += f" — {code}: {message}" if code else f" — {message}"
    if run.lock_lost:
        outcome += f" (lock lost: {run.lock_lost})"
    command = run.command or ""
    if run.direction and run.direction != run.command:
        command += f" ({run.direction})"
    by = run.requested_by or ""
    if run.requested_by_source and run.requested_by_source != "argument":
        by += f" (from {run.requested_by_source})"
    facts = [
        ("Run", run.run_id),
        ("Command", command + ("" if run.locked is not False else " --no-lock")),
        ("Outcome", outcome),
        ("By", by),
        ("Reason", run.reason or "—"),
        ("Executed", f"{run.executed_by or '?'} on {run.host or '?'} (pid {run.pid})"),
        ("Started", f"{applied_at(run.started_at)}  ({_duration(run.duration_ms) or '…'})"),
        ("Applied", ", ".join(run.applied) or "—"),
        ("Reverted", ", ".join(run.reverted) or "—"),
    ]
    if run.skipped:
        facts.append(("Skipped", str(run.skipped)))
    if run.log_lines_dropped:
        facts.append(("Dropped", f"{run.log_lines_dropped} log line(s) beyond the limit"))
    text = [f"{paint(name.ljust(9), CYAN, colour)} {sanitize_terminal(value)}"
            for name, value in facts]
    text.append("")
    if not log.lines:
        text.append(paint("No log lines kept for this run", DIM, colour))
    for line in log.lines:
        text.append(_line(line, colour))
    out.block("\n".join(text))


def _line(line: dict[str, Any], colour: bool) -> str:
    """``HH:MM:SS.mmm LEVEL    migration  msg  {data}`` in local time."""
    import datetime as dt

    at = line.get("at")
    when = ""
    if isinstance(at, dt.datetime):
        local = (at if at.tzinfo else at.replace(tzinfo=dt.UTC)).astimezone()
        when = local.strftime("%H:%M:%S.") + f"{local.microsecond // 1000:03d}"
    level = str(line.get("level", ""))
    parts = [when, paint(level.upper().ljust(8), _LEVEL_STYLE.get(level), colour)]
    if line.get("migration"):
        parts.append(sanitize_terminal(str(line["migration"])))
    parts.append(sanitize_terminal(str(line.get("msg", ""))))
    data = line.get("data")
    if data:
        from migronaut._json import json_default

        parts.append(paint(sanitize_terminal(json.dumps(data, default=json_default,
                                                        ensure_ascii=False)), DIM, colour))
    return "  ".join(parts)
