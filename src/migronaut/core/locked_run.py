"""The locked run: one lock acquisition around one command's work, from refusal to release.

The lifecycle, in order: refuse a second run on the same migrator and a changelog migronaut
cannot trust (before the lock: nothing touched, nothing recorded); acquire the lock (its
heartbeat renews it, :mod:`migronaut.core.lock`); ``run:start``, ``lock:acquired``, the
telemetry span and the run record; the changelog indexes; the work; then, whatever happened,
release, ``lock:released``, ``run:end``, the record's end and the "Done" line.

Invariants: a run that started always releases its lock and emits ``run:end``; once it holds
the lock, a run refuses to work while a migration is in doubt (``MIGRATION_IN_DOUBT``: a
changelog record another run left ``running``/``reverting``), except ``resolve``, which exists
to settle it; an error never leaves as a raw driver error (``CONNECTION_FAILED``); between two
migrations (:func:`check_between`) the lock is confirmed and a stop or lost lock honoured; a run
that lost its lock under ``on_lock_lost = "abort"`` ends with ``LOCK_LOST`` even when its work
finished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from migronaut.core.changelog import in_doubt_error, judge_unfinished
from migronaut.core.context import Cancellation
from migronaut.core.lock import MigrationLock, read_lock_status
from migronaut.core.project import executed_by
from migronaut.core.retry import as_connection_failed
from migronaut.core.run import Run
from migronaut.errors import (
    LockAlreadyHeldError,
    LockLostError,
    MigronautError,
    describe_exception,
)

if TYPE_CHECKING:
    from migronaut.core.results import RunResult
    from migronaut.core.run import Direction
    from migronaut.core.workspace import Workspace

__all__ = ["abort_if_lock_lost", "check_between", "locked_run", "refuse_in_doubt",
           "release_early"]


def locked_run(
    ws: Workspace,
    command: str,
    direction: Direction | None,
    work: Callable[[Run], None],
    *,
    no_lock: bool,
    requested_by: str | None,
    reason: str | None,
    settling: bool = False,
    reads_changelog: bool = False,
) -> list[RunResult]:
    """Run ``work`` as one run of ``command`` under the lock (or none, ``no_lock``);
    ``settling``: the run is the one that resolves in-doubt migrations (it does not refuse);
    ``reads_changelog``: every record is read once under the lock, checked, and kept in
    ``run.changelog_read`` for the work to plan from."""
    checked_before, ws.changelog_checked = ws.changelog_checked, False
    with ws.slot.busy():
        ws.slot.require_free()
        ws.connection.connect()
        if not (reads_changelog and checked_before):
            # refused before the lock: nothing touched or recorded (a run that reads the
            # changelog under its lock may rely on the check of a status read just before)
            ws.connection.changelog.verify()
        run = Run(ws.project.generate_id(), command, Cancellation(),
                  requested_by=requested_by, reason=reason, executed_by=executed_by())
        started = time.monotonic()
        ws.slot.enter(run)
        try:
            return _run_with_lock(ws, run, direction, work, no_lock=no_lock, started=started,
                                  settling=settling, reads_changelog=reads_changelog)
        finally:
            ws.slot.leave()
            if run.bridge is not None:
                run.bridge.close()


def _run_with_lock(
    ws: Workspace,
    run: Run,
    direction: Direction | None,
    work: Callable[[Run], None],
    *,
    no_lock: bool,
    started: float,
    settling: bool,
    reads_changelog: bool,
) -> list[RunResult]:
    project = ws.project
    telemetry = project.telemetry  # a bad telemetry config fails before the lock
    if no_lock:
        project.logger.warning(
            "⚠ Running without a lock (--no-lock) — concurrent runs are unsafe"
        )
    else:
        _acquire(ws, run)
    emit = ws.events.emit
    emit("run:start", command=run.command, direction=direction)
    if run.lock is not None:
        emit("lock:acquired", owner=run.id, ttlMs=run.lock.ttl_ms, acquireMs=run.lock.acquire_ms)
    else:
        emit("lock:acquired", skipped=True)
    run.trace = telemetry.start_run(run.id, run.command, direction,
                                    acquire_ms=run.lock.acquire_ms if run.lock else None)
    error: BaseException | None = None
    try:
        run.recording = ws.connection.recorder.begin(
            run.id, command=run.command, direction=direction, requested_by=run.requested_by,
            reason=run.reason, locked=run.lock is not None,
            emit=lambda line: emit("migration:log", **line),
            debug=project.logger.isEnabledFor(logging.DEBUG),
        )
        check_between(run)
        run.changelog_read = ws.connection.prepare_changelog(read=reads_changelog)
        if not settling:
            refuse_in_doubt(ws, run)
        work(run)
    except BaseException as caught:
        converted = as_connection_failed(caught)  # never a raw driver error (exit 1)
        error = converted or caught
        if isinstance(error, MigronautError):
            error.context.setdefault("results", [r.to_dict() for r in run.results])
        if converted is not None:
            raise converted from caught
        raise
    finally:
        _finish_run(ws, run, direction, error, started)
    return run.results


def refuse_in_doubt(ws: Workspace, run: Run) -> None:
    """``MIGRATION_IN_DOUBT`` when another run left a changelog record ``running``/``reverting``
    (read under the lock, from the primary): holding the lock, this run knows that one is gone
    or lost its lock, so what its body did is unknown. Without the lock, a record of the run
    that holds it now is reported as still running."""
    found = run.changelog_read
    unfinished = found.unfinished() if found is not None else ws.connection.changelog.unfinished()
    others = [r for r in unfinished
              if (r.get("intent") or {}).get("runId") != run.id]
    if not others:
        return
    if run.lock is not None:
        live_owner: str | None = run.lock.owner
    else:
        status = read_lock_status(ws.connection.lock_collection,
                                  ttl_ms=ws.project.config.lock_ttl_seconds * 1000)
        live_owner = status.holder.run_id if status.state == "held" and status.holder else None
    raise in_doubt_error(judge_unfinished(others, live_owner=live_owner))


def _acquire(ws: Workspace, run: Run) -> None:
    """Take the lock for ``run`` (``LOCK_ALREADY_HELD`` propagates: no run:start, no span)."""
    project = ws.project
    config = project.config
    run.lock = MigrationLock(
        ws.connection.lock_collection,
        owner=run.id,
        ttl_ms=config.lock_ttl_seconds * 1000,
        executed_by=run.executed_by,
        on_lost=lambda why: _on_lock_lost(ws, run, why),
        on_renew_failed=lambda n, err: project.logger.warning(
            "⚠ Lock renewal failed (%d in a row): %s", n, describe_exception(err),
            extra={"event": "lock:renew-failed", "runId": run.id},
        ),
    )
    try:
        run.lock.acquire()
    except LockAlreadyHeldError:
        project.telemetry.lock_refused(run.command)
        raise
    except Exception as failed:
        converted = as_connection_failed(failed)
        if converted is None:
            raise
        raise converted from failed


def _finish_run(
    ws: Workspace, run: Run, direction: Direction | None, error: BaseException | None,
    started: float,
) -> None:
    logger = ws.project.logger
    emit = ws.events.emit
    release_error: MigronautError | None = None
    lost: LockLostError | None = None
    if run.released_early:
        pass  # released (and ``lock:released`` emitted) by :func:`release_early`
    elif run.lock is not None:
        try:
            warning = run.lock.release(run_failed=error is not None)
            if warning:
                logger.warning("⚠ %s", warning)
        except MigronautError as failed:
            release_error = failed
        emit("lock:released", owner=run.id)
        if error is None and release_error is None:
            # the work finished, but the lock was lost on the way (or found gone at release)
            error = lost = _lock_lost_error(ws, run)
    else:
        emit("lock:released", skipped=True)
    applied = sum(1 for r in run.results if r.status == "applied")
    reverted = sum(1 for r in run.results if r.status == "reverted")
    skipped = sum(1 for r in run.results if r.status == "skipped")
    counts = run.counts  # a baseline or an import counts records, not per-migration results
    run.trace.end(error if error is not None else release_error,
                  applied=counts.get("applied", applied), reverted=reverted,
                  skipped=counts.get("skipped", skipped),
                  total=counts.get("total", len(run.results)),
                  duration_s=time.monotonic() - started)
    duration_ms = int((time.monotonic() - started) * 1000)
    end: dict[str, Any] = {
        "command": run.command, "direction": direction, "success": error is None,
        "durationMs": duration_ms, "applied": applied, "reverted": reverted,
        "total": len(run.results), **run.counts,
    }
    if error is not None:
        end["error"] = describe_exception(error)
    emit("run:end", **end)
    if run.recording is not None:
        run.recording.finish(error, duration_ms=duration_ms, total=len(run.results))
    if error is None and (applied or reverted):
        parts = [f"{applied} applied"] if applied else []
        parts += [f"{reverted} reverted"] if reverted else []
        logger.info("✔ Done     %s in %dms", ", ".join(parts), duration_ms,
                    extra={"runId": run.id, "durationMs": duration_ms})
    if lost is not None:
        raise lost
    if release_error is not None and error is None:
        raise release_error


def release_early(ws: Workspace, run: Run) -> bool:
    """Release the lock before the run's work ends — converge waiting for search index builds
    (collections §7.8) holds nobody up. ``lock:released`` carries ``early: true``; the run's
    end then releases nothing. False when there was no lock to release."""
    if run.lock is None or run.released_early:
        return False
    run.lock.release()
    run.released_early = True
    ws.events.emit("lock:released", owner=run.id, early=True)
    return True


def _on_lock_lost(ws: Workspace, run: Run, reason: str) -> None:
    ws.project.logger.warning("⚠ Lost the migration lock mid-run (%s)", reason,
                              extra={"event": "lock:lost", "runId": run.id})
    ws.events.emit("lock:lost", owner=run.id, reason=reason)
    run.trace.lock_lost(reason)
    if ws.project.config.on_lock_lost == "abort":
        run.cancellation.cancel(
            LockLostError(
                "Lost the migration lock mid-run", {"reason": reason, "aborted": True}
            )
        )


def _lock_lost_error(ws: Workspace, run: Run) -> LockLostError | None:
    """``LOCK_LOST`` for a run that lost its lock at any point, up to its release (abort
    mode): the migrations it ran may have overlapped with a successor's."""
    reason = run.lock.lost_reason if run.lock is not None else None
    if reason is None or ws.project.config.on_lock_lost != "abort":
        return None
    return LockLostError("Lost the migration lock mid-run", {
        "reason": reason, "aborted": True, "results": [r.to_dict() for r in run.results]})


def abort_if_lock_lost(ws: Workspace, run: Run) -> None:
    """In a transactional migration, right before its changelog write (after
    :meth:`MigrationLock.fence`): a lost lock aborts the transaction — data and record roll
    back, and whoever holds the lock now applies the migration once (under
    ``on_lock_lost = "warn"`` it commits)."""
    error = _lock_lost_error(ws, run)
    if error is not None:
        error.context.pop("results", None)
        raise error


def check_between(run: Run) -> None:
    """The safe point between migrations: honour a lost lock or a stop request.

    The lock is confirmed (amortised) here, so a run whose lock was force-released or
    reclaimed stops before starting another migration."""
    if run.lock is not None:
        run.lock.confirm()
    if run.cancellation.cancelled:
        reason = run.cancellation.reason
        assert reason is not None
        error = type(reason)(reason.message, {**reason.context})
        raise error
