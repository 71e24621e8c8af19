"""The run loop: a run's targets, in order, between ``before_all`` and ``after_all``.

Invariants: every target is loaded and validated before the first one runs (a broken file, or a
broken background spec going up, anywhere in the list refuses the run before any migration or
hook); between two targets the lock is confirmed and a stop honoured
(:func:`~migronaut.core.locked_run.check_between`) — a claim of the next target sent with the
previous one's record (:class:`~migronaut.core.step.Handover`) is given back when the run stops
there; the loop stops at the first failure, and
``after_all`` runs whatever happened (its own failure after a failed run is only a warning).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from migronaut.core.context import MigrationContext, RunInfo
from migronaut.core.hooks import call_hook
from migronaut.core.locked_run import check_between
from migronaut.core.step import Handover, WaitingForBackground, run_step
from migronaut.errors import MigronautError

if TYPE_CHECKING:
    from migronaut.core.files import MigrationModule
    from migronaut.core.run import Direction, Run
    from migronaut.core.workspace import Workspace

__all__ = ["run_targets"]


def run_targets(
    ws: Workspace,
    run: Run,
    names: Sequence[str],
    direction: Direction,
    *,
    batches: Sequence[int] | None = None,
    step_base: int | None = None,
) -> None:
    """Run targets in order with hooks, events and records; stop at the first failure.

    Going up, ``batches`` gives each target its batch; without it (``step``) each target gets
    its own, counting from ``step_base``.
    """
    migrations = _preflight(ws, names, direction)
    hooks = ws.project.hooks
    ctx = _base_context(ws, run, direction)
    total = len(names)
    done = 0
    call_hook(hooks, "before_all", ctx)
    failure: BaseException | None = None
    handover = Handover()
    try:
        for index, migration in enumerate(migrations):
            check_between(run)
            batch = None
            if direction == "up":
                batch = batches[index] if batches else (step_base or 1) + done
            following = None
            if index + 1 < total:
                following = (migrations[index + 1],
                             None if direction != "up" else batches[index + 1] if batches
                             else (step_base or 1) + done + 1)
            try:
                with run.trace.migration(migration.name, direction, batch=batch,
                                         index=index, total=total):
                    run_step(ws, run, ctx, hooks, migration, direction, batch, index, total,
                             handover=handover, following=following)
            except WaitingForBackground:
                break  # on_background_pending="stop": nothing after it runs
            done += 1
    except BaseException as error:
        failure = error
        raise
    finally:
        handover.give_back()  # a claim sent ahead for a body that never started
        summary = {"success": failure is None, "applied": done, "direction": direction}
        try:
            call_hook(hooks, "after_all", ctx, summary)
        except MigronautError as hook_error:
            if failure is None:
                raise
            ws.project.logger.warning("⚠ after_all hook failed after a failed run: %s",
                                      hook_error.message)


def _preflight(ws: Workspace, names: Sequence[str], direction: Direction) -> list[MigrationModule]:
    """Load and validate every file the run will execute (and, going up, every background
    spec) before the first one runs."""
    migrations = ws.project.load(names)
    background = [m for m in migrations if m.background is not None]
    if background and direction == "up":
        ws.background.validate(background)
    return migrations


def _base_context(ws: Workspace, run: Run, direction: Direction | None) -> MigrationContext:
    info = RunInfo(id=run.id, direction=direction, requested_by=run.requested_by,
                   reason=run.reason)
    from migronaut.observability.migration_log import MigrationLogger

    adapter = MigrationLogger(ws.project.logger, {"runId": run.id, "direction": direction},
                              sink=run.recording.line if run.recording else None)
    if run.bridge is None:
        run.bridge = ws.connection.new_bridge()
    connection = ws.connection
    return MigrationContext(db=connection.db, client=connection.client,
                            cancellation=run.cancellation, logger=adapter, run=info,
                            bridge=run.bridge)
