"""Human renderings of ``migronaut background`` results: the status, partition and progress
tables, control outcomes, dry-run lines, and the live progress display.

The commands (:mod:`migronaut.cli.commands.background`) decide what to fetch and which exit code
to give; this module only turns what they fetched into cells and lines. Nothing here contains a
document or an ``_id`` except the dry-run rows: partition scopes are shown by their type bracket
only, never their bounds. Every value from the database passes through
:func:`~migronaut._redact.sanitize_terminal`; rich is imported lazily, only to draw.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut._redact import sanitize_terminal
from migronaut.background.state.progress import TERMINAL, number
from migronaut.cli.output import CYAN, DIM, GREEN, RED, YELLOW, Output

if TYPE_CHECKING:
    from migronaut.cli.render import Cell

STATUS_COLUMNS = ("Background migration", "Status", "Collection", "Versions", "Pass",
                  "Partitions", "Lanes", "Migrated", "Note")
PARTITION_COLUMNS = ("#", "Status", "Scope", "Migrated", "Lease", "Claims", "Error")
PROGRESS_COLUMNS = ("Background migration", "Status", "Pass", "Done", "Rate", "ETA", "Lanes",
                    "Failures")
PROGRESS_PARTITION_COLUMNS = ("#", "Status", "Scope", "Done", "Lease", "Failures")
STATUS_STYLE = {"completed": GREEN, "running": CYAN, "pending": YELLOW, "blocked": YELLOW,
                "paused": YELLOW, "failed": RED, "cancelled": DIM,
                "done": GREEN, "superseded": DIM}


def scope_text(scope: Mapping[str, Any] | None, group_name: str | None = None) -> str:
    scope = scope or {}
    kind = scope.get("kind")
    text = "step" if kind == "step" else str(scope.get("bracket") or kind or "—")
    if kind == "key-range" and not scope.get("bracket"):
        text = "key range"
    return sanitize_terminal(text + (f" @{group_name}" if group_name else ""))


def lease_text(lease: Mapping[str, Any] | None) -> str:
    if not lease:
        return ""
    return sanitize_terminal(f"slot {lease.get('slot')} · {lease.get('host')}:{lease.get('pid')}")


def _note(view: Mapping[str, Any]) -> tuple[str, str | None]:
    if view.get("waitsFor"):
        return sanitize_terminal("waits for " + ", ".join(map(str, view["waitsFor"]))), YELLOW
    if view.get("lastError"):
        return sanitize_terminal(str(view["lastError"])), RED
    if view.get("failedDocuments"):
        return f"{view['failedDocuments']} document(s) failed", YELLOW
    return "", None


def _status_cells(view: Mapping[str, Any]) -> list[Cell]:
    status = str(view.get("status"))
    low, high = view.get("from"), view.get("to")
    if view.get("direction") == "revert":
        low, high = high, low  # a revert rewrites `to` back to `from`
    versions = "step" if view.get("mode") == "step" else f"{low} → {high}"
    counts = view.get("partitions")
    partitions = f"{counts.get('done', 0)}/{counts.get('total', 0)}" if counts else "—"
    return [
        (sanitize_terminal(str(view.get("migration"))), None),
        (status, STATUS_STYLE.get(status)),
        (sanitize_terminal(str(view.get("collection") or "—")), None),
        (versions, None),
        (str(view.get("pass", 0)), None),
        (partitions, None),
        (f"{view.get('liveLeases', 0)}/{view.get('maxParallel', 1)}", None),
        (str(number((view.get("totals") or {}).get("migrated"))), None),
        _note(view),
    ]


def render_status(views: Sequence[Mapping[str, Any]], out: Output) -> None:
    """The ``Background migration | Status | … | Note`` table."""
    from migronaut.cli.render import table

    if not views:
        out.info("No background migrations registered")
        return
    table(STATUS_COLUMNS, [_status_cells(v) for v in views], out,
          wrap=("Background migration", "Note"))
    for view in views:
        if view.get("sharding"):
            out.info(_sharding_text(view["migration"], view["sharding"]))


def _sharding_text(name: str, sharding: Mapping[str, Any]) -> str:
    """``<name>: sharded — <mode>, key {k: 1} (hashed), shard-a 8, shard-b 8``."""
    parts = [str(sharding.get("mode"))]
    key = sharding.get("shardKey")
    if key:
        shown = ", ".join(f"{field}: {value}" for field, value in key.items())
        parts.append(f"key {{{shown}}}" + (" (hashed)" if sharding.get("hashed") else ""))
    else:
        parts.append("shard key unreadable (needs clusterMonitor)")
    groups = sharding.get("groups") or {}
    if groups:
        parts.append(", ".join(f"{group} {count}" for group, count in groups.items()))
    return sanitize_terminal(f"{name}: sharded — " + " · ".join(parts))


def _partition_cells(row: Mapping[str, Any]) -> list[Cell]:
    status = str(row.get("status"))
    return [
        (str(row.get("seq", "")), None),
        (status, STATUS_STYLE.get(status)),
        (scope_text(row.get("scope"), row.get("group")), None),
        (str(number((row.get("counters") or {}).get("migrated"))), None),
        (lease_text(row.get("lease")), None),
        (str(row.get("claims", 0)), None),
        (sanitize_terminal(str(row.get("lastError") or "")), RED),
    ]


def render_partitions(rows: Sequence[Mapping[str, Any]], out: Output) -> None:
    """The ``# | Status | Scope | Migrated | Lease | Claims | Error`` table."""
    from migronaut.cli.render import table

    if not rows:
        out.info("No partitions (nothing planned yet)")
        return
    table(PARTITION_COLUMNS, [_partition_cells(r) for r in rows], out, wrap=("Error",))


@dataclass
class ControlOutcome:
    """A control's outcome for rendering; ``declined`` when the prompt was answered no."""

    action: str
    name: str
    result: dict[str, Any] = field(default_factory=dict)
    declined: bool = False


def render_control(control: ControlOutcome, out: Output) -> None:
    if control.declined:
        out.info("Aborted")
        return
    result = control.result
    status = result.get("status")
    if control.action == "unlock":
        held = "" if result.get("lock") else " (none held)"
        out.info(f"✔ Released the coordinator lock{held} and {result.get('leases', 0)} lease(s)")
        return
    if control.action == "repin":
        replanned = " — the current plan is replanned" if result.get("replan") else ""
        out.info(f"✔ Repinned {sanitize_terminal(control.name)} "
                 f"(checksum {str(result.get('checksum', ''))[:12]}…){replanned}")
        return
    if result.get("applied") != "changed":  # a change is told by the engine's own line
        out.info(f"✔ Nothing to do — {status}")
    if result.get("stopped") is False:
        out.warn("⚠ Lanes still hold leases after waiting — they stop at their next batch")


def _json_text(value: Any) -> str:
    import json

    return sanitize_terminal(json.dumps(value, default=str, ensure_ascii=False))


def render_dry_run(report: Mapping[str, Any], out: Output) -> None:
    """The dry-run lines of reference background §6.5 (documents as relaxed EJSON)."""
    if report.get("mode") == "step":
        for step in report.get("steps") or []:
            after = f"✖ {step['error']}" if step.get("error") else \
                _json_text(step.get("checkpointOut"))
            done = " (done)" if step.get("done") else ""
            out.info(f"◎ Step {step.get('step')}: {_json_text(step.get('checkpointIn'))} → "
                     f"{sanitize_terminal(after)}{done}")
    else:
        for row in report.get("documents") or []:
            if row.get("error"):
                out.info(f"✖ {_json_text(row.get('_id'))}: {sanitize_terminal(str(row['error']))}")
            elif row.get("validation") == "skipped":
                out.info(f"◌ {_json_text(row.get('_id'))}: not validated (stopped before it)")
            else:
                out.info(f"✔ {_json_text(row.get('_id'))}: {_json_text(row.get('change'))}")
        failed = number(report.get("failed"))
        out.info(f"◎ {number(report.get('migrated'))} of {number(report.get('found'))} would be "
                 f"migrated, {failed} would fail")
    for refusal in report.get("refusals") or []:
        out.info(f"✖ Refused {sanitize_terminal(str(refusal.get('method')))}: "
                 f"{sanitize_terminal(str(refusal.get('reason')))}")
    if report.get("aborted") or report.get("mode") == "step":
        out.info(f"◎ {len(report.get('ops') or [])} operation(s), all rolled back")
    if report.get("stoppedBy") == "deadline":
        out.warn("⚠ Stopped at the deadline")


def render_verify(result: Mapping[str, Any], out: Output) -> None:
    """``✔ No drift (…)``; each finding was already logged by the engine as
    ``⚠ <collection>: old-shape documents after <migration> — <action>``."""
    if not result.get("drift"):
        out.info(f"✔ No drift ({number(result.get('checked'))} checked, "
                 f"{number(result.get('skipped'))} skipped)")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _done_text(row: Mapping[str, Any]) -> str:
    estimate = number(row.get("estimate"))
    total = f"{'≥' if row.get('atLeast') else ''}{estimate}" if estimate else "?"
    percent = row.get("percent")
    suffix = f" ({percent:.0f}%)" if isinstance(percent, (int, float)) else ""
    return f"{row.get('done', 0)}/{total}{suffix}"


def _progress_cells(row: Mapping[str, Any]) -> list[Cell]:
    status = str(row.get("status"))
    rate = row.get("rate")
    failures = number(row.get("failedDocuments")) + number(row.get("failedPartitions"))
    return [
        (sanitize_terminal(str(row.get("migration"))), None),
        (status, STATUS_STYLE.get(status)),
        (str(row.get("pass", 0)), None),
        (_done_text(row), None),
        ("—" if rate is None else f"{rate:g}/s", None),
        (_duration(row.get("etaSeconds")), None),
        (f"{row.get('liveLeases', 0)}/{row.get('maxParallel', 1)}", None),
        (str(failures), RED if failures else None),
    ]


def _progress_partition_cells(row: Mapping[str, Any]) -> list[Cell]:
    status = str(row.get("status"))
    failures = number(row.get("failures"))
    return [
        (str(row.get("seq", "")), None),
        (status, STATUS_STYLE.get(status)),
        (scope_text(row.get("scope"), (row.get("scope") or {}).get("group")), None),
        (_done_text(row), None),
        (lease_text(row.get("lease")), None),
        (str(failures), RED if failures else None),
    ]


def progress_line(row: Mapping[str, Any]) -> str:
    rate = row.get("rate")
    failures = number(row.get("failedDocuments")) + number(row.get("failedPartitions"))
    return sanitize_terminal(
        f"◎ {row.get('migration')}  {row.get('status')}  pass {row.get('pass', 0)}  "
        f"{_done_text(row)}  {'—' if rate is None else f'{rate:g}'} docs/s  "
        f"ETA {_duration(row.get('etaSeconds'))}  lanes {row.get('liveLeases', 0)}/"
        f"{row.get('maxParallel', 1)}  failures {failures}"
    )


#: Partition rows a live view shows per migration before it hides the settled ones.
LIVE_PARTITION_ROWS = 20


def _live_partition_rows(partitions: Sequence[Mapping[str, Any]]) -> list[list[Cell]]:
    """All partitions when few; else the open ones (≤ 20) and a ``… N more`` row."""
    shown = list(partitions)
    if len(shown) > LIVE_PARTITION_ROWS:
        shown = [p for p in shown if p.get("status") in ("running", "pending", "failed")]
    rows = [_progress_partition_cells(p) for p in shown[:LIVE_PARTITION_ROWS]]
    hidden = len(partitions) - len(rows)
    if hidden:
        rows.append([("…", DIM), (f"{hidden} more", DIM)] + [("", None)] * 4)
    return rows


class LiveView:
    """The progress view on a terminal: one redrawn rich view (summary + partition tables)."""

    def __init__(self, out: Output) -> None:
        from rich.live import Live

        from migronaut.cli.render import console

        stream = out.stream_for(20)
        self._live = Live(console=console(out, stream, stream), auto_refresh=False,
                          transient=False)
        self._live.start()

    def update(self, rows: Sequence[Mapping[str, Any]]) -> None:
        from rich.console import Group

        from migronaut.cli.render import rich_table

        parts: list[Any] = [rich_table(PROGRESS_COLUMNS, [_progress_cells(r) for r in rows],
                                       wrap=("Background migration",))]
        for row in rows:
            if row.get("partitions") and row.get("status") not in TERMINAL:
                parts.append(rich_table(
                    PROGRESS_PARTITION_COLUMNS, _live_partition_rows(row["partitions"]),
                    title=sanitize_terminal(str(row.get("migration"))),
                ))
        self._live.update(Group(*parts), refresh=True)

    def close(self) -> None:
        self._live.stop()


def render_watch_stopped(result: Mapping[str, Any], out: Output) -> None:
    out.info(f"✔ Stopped watching — {result.get('upgraded', 0)} document(s) upgraded")


def render_worker_stopped(result: Mapping[str, Any], out: Output) -> None:
    migrated = number((result.get("counters") or {}).get("migrated"))
    out.info(f"✔ Worker stopped — {result.get('slices', 0)} slice(s), {migrated} document(s) "
             "migrated; leases released")


class ProgressDisplay:
    """One tick of ``background progress`` on ``out``: a JSON line (``--json``), a redrawn live
    view (a terminal) or one plain line per migration (a pipe or a file)."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self._live: LiveView | None = None

    def show(self, rows: Sequence[Mapping[str, Any]], finished: bool) -> None:
        from migronaut._json import iso

        out = self.out
        if out.json_mode:
            out.json({"at": iso(dt.datetime.now(dt.UTC)), "background": list(rows),
                      "done": finished}, compact=True)
        elif not rows:
            out.info("No background migrations registered")
        elif _tty(out):
            out.spinner.stop()
            self._live = self._live or LiveView(out)
            self._live.update(rows)
        else:
            for row in rows:
                out.info(progress_line(row))

    def close(self) -> None:
        if self._live is not None:
            self._live.close()


def _tty(out: Output) -> bool:
    try:
        return bool(out.stream_for(20).isatty())
    except (AttributeError, ValueError, OSError):
        return False


def render_enqueued(jobs: Sequence[Mapping[str, Any]], out: Output) -> None:
    """What ``background enqueue`` sent: one line per coordinator task."""
    if not jobs:
        out.info("✔ Nothing enqueued — no runnable background migration, or a live coordinator "
                 "chain already serves each one")
        return
    for job in jobs:
        kind = "a takeover coordinator" if job.get("takeover") else "a coordinator"
        out.info(sanitize_terminal(f"⇉ {job.get('migration')}: {kind} queued "
                                   f"(task {job.get('id')})"))
