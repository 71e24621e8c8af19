"""``migronaut background <action>``: status, run, controls, dry runs, drift, progress and workers.

Reference background §6.5. Every action goes through :meth:`Session.run` (connect, call the
engine, close, render or print JSON, exit code); flags are checked before connecting, and so is
the ``--json``-needs-``--yes`` rule of the confirming actions (``cancel``, ``retry
--from-start``, ``repin``, ``unlock``).

``run``, ``work`` and ``watch`` are long-running: the first SIGINT/SIGTERM sets their
cancellation through the shared :class:`~migronaut.cli.signals.GracefulStop` (lanes finish the
batch in flight, checkpoint and release their leases), the second exits at once (130/143).

No output here ever contains a document or an ``_id`` except ``dry-run``'s rows: partition
scopes are shown by their type bracket only, never their bounds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import click

from migronaut._redact import sanitize_terminal
from migronaut.background.state.fields import max_parallel as stored_max_parallel
from migronaut.background.state.progress import TERMINAL, ProgressTracker, number, partition_json
from migronaut.cli.app import command, group
from migronaut.cli.output import Output
from migronaut.cli.render_background import (
    ControlOutcome,
    ProgressDisplay,
    render_control,
    render_dry_run,
    render_enqueued,
    render_partitions,
    render_status,
    render_verify,
    render_watch_stopped,
    render_worker_stopped,
)
from migronaut.cli.session import Session, parse_int
from migronaut.errors import EXIT_CODES, ConfigInvalidError, MigronautError, RunAbortedError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.background.engine import BackgroundEngine
    from migronaut.core.context import Cancellation

MAX_CONCURRENCY = 64
#: Every status a ``run --all`` serves (oldest registration first).
RUNNABLE = ("blocked", "pending", "running")

background = group(
    "background",
    help="Background migrations: long data rewrites worked in batches by lanes under leases. "
    "Actions: status, run, pause, resume, cancel, retry, repin, unlock, dry-run, verify, "
    "watch, progress, work, enqueue.",
    short_help="Background migrations: status, run, controls, workers.",
)


# ------------------------------------------------------------------------------------ helpers


def _int_flag(value: str | None, flag: str, low: int, high: int) -> int | None:
    """A numeric flag in ``low..high`` (``CONFIG_INVALID`` otherwise, before connecting)."""
    number = parse_int(value, flag)
    if number is not None and not low <= number <= high:
        raise ConfigInvalidError(
            f"{flag} must be an integer from {low} to {high} (got {value!r})", {"option": flag}
        )
    return number


def _seconds_flag(value: str | None, flag: str, low: float, high: float, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value.strip())
    except ValueError:
        number = float("nan")
    if not low <= number <= high:  # also refuses nan and inf
        raise ConfigInvalidError(
            f"{flag} must be a number of seconds from {low:g} to {high:g} (got {value!r})",
            {"option": flag},
        )
    return number


def _needs_yes(session: Session, yes: bool, action: str) -> None:
    """A confirming action in ``--json`` mode needs ``--yes`` — checked before connecting."""
    if session.options.json and not yes:
        raise ConfigInvalidError(
            f"background {action} needs confirmation — pass --yes in --json mode",
            {"option": "yes"},
        )


def _registered(engine: BackgroundEngine, name: str) -> dict[str, Any]:
    """The state of ``name``, or ``CONFIG_INVALID`` (``status``/``run``/``progress``)."""
    state = engine.state(name)
    if state is None:
        raise ConfigInvalidError(
            f"Background migration {name} is not registered — run up first",
            {"migration": name},
        )
    return state


def _requested_by() -> str:
    from migronaut.api import executed_by

    return executed_by()


class _Stopper:
    """What the shared :class:`GracefulStop` stops for a background command: a cancellation.

    Background commands run no migration run (no lock, no run id), so ``Migrator.stop`` has
    nothing to stop; the guard is re-bound to this object, which it calls the same way.
    """

    def __init__(self, cancellation: Cancellation) -> None:
        self.cancellation = cancellation

    def on(self, event: str, listener: Callable[[dict[str, Any]], Any]) -> None:
        pass

    def off(self, event: str, listener: Callable[[dict[str, Any]], Any]) -> None:
        pass

    def stop(self, reason: str) -> None:
        self.cancellation.cancel(RunAbortedError(reason, {"reason": reason}))


def _on_signal(session: Session, cancellation: Cancellation, finishing: str) -> None:
    """Route the first SIGINT/SIGTERM of this command to ``cancellation``; ``finishing`` is
    what the signal's line says happens next."""
    if session.guard is not None:
        session.guard.finishing = finishing
        session.guard.bind(cast("Migrator", _Stopper(cancellation)))


# ------------------------------------------------------------------------------------- status


@dataclass
class _StatusResult:
    views: list[dict[str, Any]]
    partitions: list[dict[str, Any]] | None = None


def _check_verdict(views: Sequence[Mapping[str, Any]], out: Output) -> int:
    """``--check``: failed → 32, anything not completed → 31, else 0."""
    statuses = [v.get("status") for v in views]
    if "failed" in statuses:
        out.error("✖ A background migration failed")
        return EXIT_CODES["BACKGROUND_FAILED"]
    if any(s != "completed" for s in statuses):
        out.error("✖ Background migrations are not all completed")
        return EXIT_CODES["BACKGROUND_PENDING"]
    return 0


@command(
    "status",
    parent=background,
    help="Background migrations (or NAME) as a table: status, versions, pass, partitions, "
    "lanes, documents migrated. --partitions shows NAME's partitions.",
    short_help="Show background migrations.",
)
@click.argument("name", required=False)
@click.option("--partitions", is_flag=True, help="NAME's partitions (needs NAME).")
@click.option("--check", is_flag=True,
              help="Exit 32 when one failed, 31 when not all are completed (for CI).")
def status(session: Session, name: str | None, partitions: bool, check: bool) -> int:
    if partitions and not name:
        raise ConfigInvalidError("--partitions needs a background migration NAME",
                                 {"option": "--partitions"})

    def action(migrator: Migrator) -> _StatusResult:
        engine = migrator.background
        if partitions:
            assert name is not None
            rows = [partition_json(r) for r in engine.partitions_view(name)]  # unknown → 9
            return _StatusResult(engine.status(name) if check else [], rows)
        if name is not None:
            _registered(engine, name)
        return _StatusResult(engine.status(name))

    def render(result: _StatusResult, out: Output) -> None:
        if result.partitions is not None:
            render_partitions(result.partitions, out)
        else:
            render_status(result.views, out)

    def to_json(result: _StatusResult) -> dict[str, Any]:
        if result.partitions is not None:
            return {"partitions": result.partitions}
        return {"background": result.views}

    return session.run(
        action, render=render, to_json=to_json,
        exit_code=(lambda result, out: _check_verdict(result.views, out)) if check else None,
    )


# ---------------------------------------------------------------------------------------- run


class _Ticker:
    """The spinner line of ``run``: ``Driving <name>… <n> migrated`` from the batch events."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.name = ""
        self.migrated = 0

    def start(self, name: str) -> None:
        self.name, self.migrated = name, 0
        self.session.out.spinner.show(f"Driving {name}…")

    def __call__(self, payload: dict[str, Any]) -> None:
        if payload.get("migration") != self.name:
            return
        self.migrated += number((payload.get("counters") or {}).get("migrated"))
        self.session.out.spinner.show(f"Driving {self.name}… {self.migrated} migrated")


@command(
    "run",
    parent=background,
    help="Drive NAME (or --all runnable ones, oldest first) until it completes, fails, is "
    "paused or cancelled, with --concurrency lanes in this process. Ctrl-C stops the lanes at "
    "their next batch (exit 11); the migration goes on later from its last checkpoint.",
    short_help="Drive background migrations here.",
)
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Every blocked, pending or running one.")
@click.option("--concurrency", metavar="N",
              help="Lanes in this process (1–64, default 1; capped at maxParallel).")
@click.option("--once", is_flag=True, help="One coordinator step and one round of slices.")
def run(session: Session, name: str | None, all_: bool, concurrency: str | None,
        once: bool) -> int:
    if (name is None) == (not all_):
        raise ConfigInvalidError("background run needs a NAME or --all (not both)",
                                 {"options": ["name", "--all"]})
    lanes = _int_flag(concurrency, "--concurrency", 1, MAX_CONCURRENCY) or 1
    from migronaut.core.context import Cancellation

    cancel = Cancellation()

    def action(migrator: Migrator) -> list[dict[str, Any]]:
        _on_signal(session, cancel, "lanes stop after the batch in flight, checkpoint and "
                                    "release their leases")
        engine = migrator.background
        if name is not None:
            _registered(engine, name)
            names = [name]
        else:
            names = [str(s["_id"]) for s in engine.states(RUNNABLE)]
        ticker = _Ticker(session)
        migrator.on("background:batch", ticker)
        views: list[dict[str, Any]] = []
        try:
            for each in names:
                state = engine.require(each)
                max_parallel = stored_max_parallel(state)  # unreadable: STATE_INVALID
                if lanes > max_parallel:
                    session.out.warn(f"⚠ --concurrency {lanes} is more than {each}'s "
                                     f"maxParallel ({max_parallel}) — using {max_parallel}")
                ticker.start(each)
                try:
                    views.append(engine.drive(each, concurrency=min(lanes, max_parallel),
                                              until_done=not once, cancellation=cancel,
                                              driver="cli", raise_if_busy=once))
                except MigronautError as error:
                    current: list[dict[str, Any]] = []
                    # (the view is a courtesy: a state it cannot show must not hide the error)
                    with contextlib.suppress(Exception):
                        stored = engine.state(each)
                        current = [engine.view(stored)] if stored is not None else []
                    error.context["results"] = views + current
                    raise
        finally:
            migrator.off("background:batch", ticker)
        return views

    def render(views: list[dict[str, Any]], out: Output) -> None:
        if views:
            render_status(views, out)
        else:
            out.info("Nothing to run: no background migration is blocked, pending or running")

    return session.run(action, render=render,
                       to_json=lambda views: {"background": views}, mutating=True)


# ----------------------------------------------------------------------------------- controls


def _control_json(control: ControlOutcome) -> dict[str, Any]:
    return control.result


def _state_line(engine: BackgroundEngine, name: str) -> str:
    view = engine.status(name)[0]
    migrated = number((view.get("totals") or {}).get("migrated"))
    return sanitize_terminal(
        f"⚠ {name} is {view.get('status')} (pass {view.get('pass', 0)}, {migrated} migrated, "
        f"{view.get('liveLeases', 0)} lane(s) working)"
    )


def _control_command(
    session: Session,
    action: str,
    name: str,
    *,
    reason: str | None,
    wait: bool = False,
    yes: bool = True,
    question: str | None = None,
    from_start: bool = False,
    repin: bool = False,
) -> int:
    def run_control(migrator: Migrator) -> ControlOutcome:
        engine = migrator.background
        by = _requested_by()
        if question is not None and not yes:
            _, changes = engine.would_change(name, action)
            if changes or from_start:
                session.out.warn(_state_line(engine, name))
                if not session.confirm(question, action=f"background {action}"):
                    return ControlOutcome(action, name, declined=True)
        extra: dict[str, Any] = {}
        if repin:
            engine.would_change(name, action)  # do not repin for a retry that cannot happen
            pinned = engine.repin(name, requested_by=by, reason=reason,
                                  changelog=migrator.changelog)
            extra = {k: pinned.extra[k] for k in ("replan", "checksum") if k in pinned.extra}
        result = engine.control(name, action, requested_by=by, reason=reason,
                                from_start=from_start, wait=wait)
        return ControlOutcome(action, name, {**result.to_dict(), **extra})

    return session.run(run_control, render=render_control, to_json=_control_json)


_REASON_HELP = "Why; recorded in the migration's history."


@command("pause", parent=background, short_help="Pause a background migration.",
         help="Pause NAME: lanes stop at their next batch and release their leases.")
@click.argument("name")
@click.option("--wait", is_flag=True, help="Wait (≤ 120 s) until no lane holds a lease.")
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
def pause(session: Session, name: str, wait: bool, reason: str | None) -> int:
    return _control_command(session, "pause", name, reason=reason, wait=wait)


@command("resume", parent=background, short_help="Resume a paused background migration.",
         help="Resume NAME (back to running, pending, or blocked while its requirements wait).")
@click.argument("name")
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
def resume(session: Session, name: str, reason: str | None) -> int:
    return _control_command(session, "resume", name, reason=reason)


@command("cancel", parent=background, short_help="Cancel a background migration.",
         help="Cancel NAME: its open partitions are cancelled and lanes stop at their next "
         "batch. Asks for confirmation unless --yes (required with --json).")
@click.argument("name")
@click.option("--wait", is_flag=True, help="Wait (≤ 120 s) until no lane holds a lease.")
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
@click.option("-y", "--yes", is_flag=True, help="Cancel without a prompt.")
def cancel(session: Session, name: str, wait: bool, reason: str | None, yes: bool) -> int:
    _needs_yes(session, yes, "cancel")
    return _control_command(session, "cancel", name, reason=reason, wait=wait, yes=yes,
                            question=f"Cancel {sanitize_terminal(name)}? [y/N] ")


@command("retry", parent=background, short_help="Retry a failed or cancelled migration.",
         help="Retry NAME when failed or cancelled (a completed one is reopened). --from-start "
         "forgets its passes and failed documents (asks unless --yes); --repin adopts the file "
         "as it is now first.")
@click.argument("name")
@click.option("--from-start", is_flag=True, help="Start over (asks for confirmation).")
@click.option("--repin", is_flag=True, help="Pin the file as it is now before retrying.")
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
@click.option("-y", "--yes", is_flag=True, help="Confirm --from-start without a prompt.")
def retry(session: Session, name: str, from_start: bool, repin: bool, reason: str | None,
          yes: bool) -> int:
    if from_start:
        _needs_yes(session, yes, "retry --from-start")
    return _control_command(
        session, "retry", name, reason=reason, yes=yes or not from_start, from_start=from_start,
        repin=repin,
        question=f"Retry from the start {sanitize_terminal(name)}? [y/N] " if from_start else None,
    )


@command("repin", parent=background, short_help="Adopt a changed background migration file.",
         help="Pin NAME to its file as it is now (its checksum and settings); a change to what "
         "it matches or to its parallelism replans the current pass. Asks unless --yes.")
@click.argument("name")
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
@click.option("-y", "--yes", is_flag=True, help="Repin without a prompt.")
def repin(session: Session, name: str, reason: str | None, yes: bool) -> int:
    _needs_yes(session, yes, "repin")

    def run_repin(migrator: Migrator) -> ControlOutcome:
        engine = migrator.background
        if not yes:
            engine.require(name)
            session.out.warn(_state_line(engine, name))
            if not session.confirm(f"Repin {sanitize_terminal(name)} to the file as it is now? "
                                   "[y/N] ", action="background repin"):
                return ControlOutcome("repin", name, declined=True)
        result = engine.repin(name, requested_by=_requested_by(), reason=reason,
                              changelog=migrator.changelog)
        return ControlOutcome("repin", name, result.to_dict())

    return session.run(run_repin, render=render_control, to_json=_control_json)


@command("unlock", parent=background, short_help="Force-release a migration's lock and leases.",
         help="Force-release NAME's coordinator lock and every lease of its partitions (their "
         "holders are fenced at their next write). Asks unless --yes.")
@click.argument("name")
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
@click.option("-y", "--yes", is_flag=True, help="Release without a prompt.")
def unlock(session: Session, name: str, reason: str | None, yes: bool) -> int:
    _needs_yes(session, yes, "unlock")

    def run_unlock(migrator: Migrator) -> ControlOutcome:
        engine = migrator.background
        if not yes:
            engine.require(name)
            session.out.warn(_state_line(engine, name))
            if not session.confirm(f"Release the coordinator lock and every lease of "
                                   f"{sanitize_terminal(name)}? [y/N] ",
                                   action="background unlock"):
                return ControlOutcome("unlock", name, declined=True)
        session.check_stop()
        released = engine.unlock(name, requested_by=_requested_by(), reason=reason)
        return ControlOutcome("unlock", name, released)

    return session.run(run_unlock, render=render_control, to_json=_control_json,
                       mutating=True)


# --------------------------------------------------------------------- dry-run, verify, watch


def _dry_run_exit(report: Mapping[str, Any], out: Output) -> int:
    from migronaut.background.tools.dryrun import exit_code

    return exit_code(report)


@command("dry-run", parent=background, short_help="Preview a background migration.",
         help="Preview NAME on a few documents (declarative) or steps (step mode) without "
         "writing: --sample N random or --first N documents; --validate runs the real write "
         "path in an aborted transaction (replica set).")
@click.argument("name")
@click.option("--sample", metavar="N", help="N random documents (1–1000, default 5).")
@click.option("--first", metavar="N", help="The first N documents by _id (1–1000).")
@click.option("--validate", is_flag=True, help="Write in a sandbox transaction, then abort.")
@click.option("--revert", is_flag=True, help="Preview the revert direction.")
@click.option("--steps", metavar="N", help="Step mode: run N steps (1–50, default 1).")
@click.option("--from-start", is_flag=True, help="Step mode: start without a checkpoint.")
@click.option("--max-docs", metavar="N", help="Changed documents shown (1–1000, default 20).")
@click.option("--deadline-ms", metavar="N", help="Time limit (1–50000 ms, default 50000).")
def dry_run(session: Session, name: str, sample: str | None, first: str | None, validate: bool,
            revert: bool, steps: str | None, from_start: bool, max_docs: str | None,
            deadline_ms: str | None) -> int:
    options: dict[str, Any] = {
        "sample": _int_flag(sample, "--sample", 1, 1000),
        "first": _int_flag(first, "--first", 1, 1000),
        "steps": _int_flag(steps, "--steps", 1, 50),
        "max_documents": _int_flag(max_docs, "--max-docs", 1, 1000),
        "deadline_ms": _int_flag(deadline_ms, "--deadline-ms", 1, 50_000),
    }
    if options["sample"] is not None and options["first"] is not None:
        raise ConfigInvalidError("--sample and --first cannot be combined (not both)",
                                 {"options": ["--sample", "--first"]})
    options = {k: v for k, v in options.items() if v is not None}
    if validate:
        options["validate"] = True
    if from_start:
        options["from_start"] = True
    options["direction"] = "revert" if revert else "forward"
    return session.run(
        lambda migrator: migrator.background.dry_run(name, **options),
        render=render_dry_run, to_json=lambda report: report, exit_code=_dry_run_exit,
    )


@command("verify", parent=background, short_help="Look for old-shape documents (drift).",
         help="Probe every completed background migration's collection for documents in the "
         "old shape; they are reopened (a new pass; background_on_drift), or only reported "
         "with --report. Exit 31 on drift.")
@click.option("--report", is_flag=True, help="Report drift only, never reopen.")
def verify(session: Session, report: bool) -> int:

    def probe(migrator: Migrator) -> dict[str, Any]:
        config = migrator.config
        result: dict[str, Any] = migrator.background.verify(
            on_drift="report" if report else config.background_on_drift,
            drift_mode=config.background_drift,
        )
        return result

    return session.run(
        probe, render=render_verify, to_json=lambda result: result,
        exit_code=lambda result, out: EXIT_CODES["BACKGROUND_PENDING"] if result.get("drift")
        else 0,
    )


@command("watch", parent=background, short_help="Upgrade old-shape writes live (replica set).",
         help="Follow change streams on the collections of completed background migrations "
         "(or COLLECTION) and upgrade old-shape writes as they land (--report: only report). "
         "Needs a replica set. Ctrl-C stops: streams closed, positions saved, locks released "
         "(exit 0).")
@click.argument("collection", required=False)
@click.option("--report", is_flag=True, help="Report old-shape writes, never upgrade them.")
def watch(session: Session, collection: str | None, report: bool) -> int:
    from migronaut.core.context import Cancellation

    cancel = Cancellation()
    out = session.out

    def on_state(event: dict[str, Any]) -> None:
        out.info(sanitize_terminal(f"… {event.get('collection')}: {event.get('state')}"))

    def run_watch(migrator: Migrator) -> dict[str, Any]:
        _on_signal(session, cancel, "the watcher stops")
        engine = migrator.background
        options: dict[str, Any] = {"upgrade": not report, "cancellation": cancel,
                                   "on_drift": "report" if report else
                                   migrator.config.background_on_drift}
        if collection is not None:
            options["collections"] = [collection]
        migrator.on("background:watch", on_state)
        try:
            watcher = engine.watch(**options)  # standalone → 6
            out.spinner.stop()
            out.info("Watching for old-shape writes — Ctrl-C to stop")
            try:
                while not cancel.wait(0.5) and watcher.running:
                    pass
            finally:
                watcher.stop()
        finally:
            migrator.off("background:watch", on_state)
        if watcher.error is not None:
            raise watcher.error
        return {"watch": watcher.status(), "upgraded": number(watcher.counters.get("upgraded"))}

    return session.run(run_watch, render=render_watch_stopped,
                       to_json=lambda result: {"watch": result["watch"]}, mutating=True)


# ----------------------------------------------------------------------------------- progress


@command("progress", parent=background, short_help="Live progress of background migrations.",
         help="A live view of NAME (or every background migration) and its partitions: "
         "documents done, rate, ETA, lanes, failures — refreshed every --interval seconds until "
         "they are all completed, failed or cancelled, or Ctrl-C (exit 0; 32 when one failed). "
         "--json prints one JSON document per tick, one per line.")
@click.argument("name", required=False)
@click.option("--interval", metavar="S", help="Seconds between refreshes (0.1–3600, default 2).")
def progress(session: Session, name: str | None, interval: str | None) -> int:
    seconds = _seconds_flag(interval, "--interval", 0.1, 3600.0, 2.0)
    out = session.out

    def follow(migrator: Migrator) -> list[dict[str, Any]]:
        engine = migrator.background
        if name is not None:
            _registered(engine, name)
        tracker = ProgressTracker()
        display = ProgressDisplay(out)
        rows: list[dict[str, Any]] = []
        try:
            while True:
                views = engine.status(name)
                now = time.monotonic()
                rows = [tracker.migration(
                    v, engine.partitions_view(str(v["migration"]))
                    if v.get("status") not in TERMINAL or name else [], now) for v in views]
                finished = all(r["status"] in TERMINAL for r in rows)
                display.show(rows, finished)
                if finished or out.stdout_closed:  # done, or nobody reads any more
                    break
                time.sleep(seconds)
        except KeyboardInterrupt:
            pass
        finally:
            display.close()
        return rows

    def verdict(rows: list[dict[str, Any]], out: Output) -> int:
        if any(r["status"] == "failed" for r in rows):
            out.error("✖ A background migration failed")
            return EXIT_CODES["BACKGROUND_FAILED"]
        return 0

    return session.run(follow, exit_code=verdict)


# --------------------------------------------------------------------------------------- work


@command("work", parent=background, short_help="Run a background worker (N lanes).",
         help="A long-running worker: --lanes N lane threads serve every runnable background "
         "migration (coordinator duties included) until SIGTERM/SIGINT, which stops it cleanly "
         "(lanes finish their batch, checkpoint and release their leases; exit 0). Run as many "
         "as you like, on any hosts.")
@click.option("--lanes", metavar="N", help="Lane threads (1–64, default 1).")
@click.option("--poll", metavar="S",
              help="Seconds between looks for runnable migrations (0.01–3600, default 5).")
def work(session: Session, lanes: str | None, poll: str | None) -> int:
    count = _int_flag(lanes, "--lanes", 1, MAX_CONCURRENCY) or 1
    poll_s = _seconds_flag(poll, "--poll", 0.01, 3600.0, 5.0)
    from migronaut.core.context import Cancellation

    cancel = Cancellation()

    def serve(migrator: Migrator) -> dict[str, Any]:
        from migronaut.background.runner import work as work_loop

        _on_signal(session, cancel, "stopping the worker: lanes finish the batch in flight, "
                                    "checkpoint and release their leases")
        migrator.background.ready()  # connect; fail fast on a bad URI or missing indexes
        session.out.spinner.stop()
        session.out.info(f"⇉ Worker started — {count} lane(s), looking for work every "
                         f"{poll_s:g}s (Ctrl-C to stop)")
        stats = work_loop(migrator, lanes=count, cancellation=cancel, poll_interval_s=poll_s)
        return {"lanes": count, **stats.to_dict()}

    return session.run(serve, render=render_worker_stopped,
                       to_json=lambda result: {"worker": result}, mutating=True)


# ------------------------------------------------------------------------------------ enqueue


def _celery_extra() -> None:
    """Refuse before connecting when the ``celery`` extra is not installed."""
    try:
        import celery  # noqa: F401
    except ImportError:
        raise ConfigInvalidError(
            "background enqueue needs the celery extra: pip install 'migronaut[celery]'",
            {"extra": "celery"},
        ) from None


@command("enqueue", parent=background,
         short_help="Queue background work on Celery (a heal, or NAME).",
         help="Send coordinator tasks to the Celery background queue (broker from the config's "
         "celery table or MIGRONAUT_CELERY_BROKER_URL). Without NAME, a heal: one coordinator "
         "per runnable background migration (a live coordinator chain absorbs its own), and a "
         "takeover for a running one that looks stalled. With NAME, that migration's "
         "coordinator (NOT_APPLIED when it is not registered).")
@click.argument("name", required=False)
@click.option("--reason", metavar="TEXT", help=_REASON_HELP)
def enqueue(session: Session, name: str | None, reason: str | None) -> int:
    _celery_extra()
    options = session.options

    def send(migrator: Migrator) -> list[dict[str, Any]]:
        from migronaut.executors.celery import create_app, enqueue_background

        _, installed = create_app(config=options.config_flags(), config_path=options.config)
        return enqueue_background(installed, name, requested_by=_requested_by(), reason=reason,
                                  engine=migrator.background)

    return session.run(send, render=render_enqueued, to_json=lambda jobs: {"jobs": jobs})
