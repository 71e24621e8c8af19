"""``up``, ``down`` and ``redo``: the runs that apply and revert migrations; ``dry-run``, their
preview (kept beside them so the two plan alike).

Each run is a locked run (:mod:`migronaut.core.locked_run`) whose work plans its targets
(:mod:`migronaut.core.plan`) and hands them to the run loop (:mod:`migronaut.core.run_loop`).
The preview plans the same way without the lock: no writes, no events.

Invariants: every option is checked before connecting; ``up`` skips what is already applied
(a drifted checksum is a warning, or ``CHECKSUM_MISMATCH`` under ``strict``) unless ``force``
re-runs it; ``down`` and ``redo`` refuse forward-only records; ``redo`` reverts and re-applies
under one lock, the re-apply in a new batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from migronaut.commands.up_converge import after_up, forget_definitions, note_preview
from migronaut.core.changelog import UNFINISHED, in_doubt_error, judge_unfinished
from migronaut.core.lock import read_lock_status
from migronaut.core.locked_run import locked_run
from migronaut.core.plan import (
    build_status_rows,
    check_forward_only,
    checksum_mismatch,
    drift_advice,
    plan_down,
    plan_up,
    validate_down_options,
    validate_up_options,
)
from migronaut.core.results import RunResult
from migronaut.core.run_loop import run_targets
from migronaut.errors import ConfigInvalidError, LockAlreadyHeldError

if TYPE_CHECKING:
    from migronaut.core.results import StatusRow
    from migronaut.core.run import Direction, Run
    from migronaut.core.workspace import Workspace

__all__ = ["check_on_background_pending", "down", "dry_run", "redo", "up"]


def check_on_background_pending(value: Any) -> None:
    if value not in ("error", "stop"):
        raise ConfigInvalidError(
            f"on_background_pending must be 'error' or 'stop' (got {value!r})",
            {"option": "on_background_pending"},
        )


def up(
    ws: Workspace,
    file: str | None,
    *,
    to: str | None,
    step: bool,
    force: bool,
    no_lock: bool,
    strict: bool | None,
    batch: int | None,
    requested_by: str | None,
    reason: str | None,
    on_background_pending: Literal["error", "stop"],
    converge: bool | None = None,
    ordered: bool = False,
    checksum: str | None = None,
) -> list[RunResult]:
    """Apply pending migrations (or one named file) in name order, under the lock; a bulk
    ``up`` converges the declared collections afterwards in the same run when ``converge`` (or,
    unset, ``converge_after_up``) says so (:mod:`migronaut.commands.up_converge`)."""
    validate_up_options(file, to=to, step=step, batch=batch, force=force,
                        requested_by=requested_by, reason=reason, converge=converge,
                        ordered=ordered, checksum=checksum)
    check_on_background_pending(on_background_pending)
    ws.waiting = []
    ws.last_converge = None
    # resolved before the lock: a broken definition file fails `up` before any migration runs
    after = after_up(ws, file=file, to=to, converge=converge, requested_by=requested_by,
                     reason=reason)

    def work(run: Run) -> None:
        run.stop_when_waiting = on_background_pending == "stop"
        try:
            _up(ws, run, file, to=to, step=step, force=force, batch=batch,
                strict=ws.project.config.strict if strict is None else strict,
                ordered=ordered, checksum=checksum)
        finally:
            ws.waiting = list(run.waiting)
        if after is not None:
            after.run(run)

    try:
        results = locked_run(ws, "up", "up", work, no_lock=no_lock,
                             requested_by=requested_by, reason=reason, reads_changelog=True)
    except LockAlreadyHeldError:
        raise  # refused before anything ran: a lock-wait retry reuses the definitions
    except BaseException:
        forget_definitions(ws)
        raise
    forget_definitions(ws)
    return results


def _up(
    ws: Workspace, run: Run, file: str | None, *, to: str | None, step: bool, force: bool,
    batch: int | None, strict: bool, ordered: bool = False, checksum: str | None = None,
) -> None:
    project = ws.project
    logger = project.logger
    found = run.changelog_read  # read once under the lock: the plan and the batch come from it
    assert found is not None
    plan = plan_up(found, project.files(), project.directory, file=file,
                   to=to, force=force, strict=strict,
                   on_out_of_order=project.config.on_out_of_order, checksum=project.checksum,
                   ordered=ordered, planned_checksum=checksum, drift=file is None)
    project.warn_out_of_order(plan.late, plan.newest_applied)
    if plan.drifted:
        logger.warning("⚠ Warning  %d applied migration(s) changed since they were applied and "
                       "will not run again: %s. %s", len(plan.drifted),
                       ", ".join(plan.drifted[:10]) + (", …" if len(plan.drifted) > 10 else ""),
                       drift_advice("FILE"),
                       extra={"event": "checksum:mismatch", "drifted": plan.drifted})
    if not plan.targets:
        logger.info("Nothing to migrate")
        return
    targets: list[str] = []
    for name in plan.targets:
        record = plan.already_applied.get(name)
        if record is None:
            targets.append(name)
            continue
        actual = project.checksum(name)
        drifted = actual is not None and record.get("checksum") not in (None, "", actual)
        if force:
            logger.warning("⚠ Forcing   re-run of already-applied %s", name)
            targets.append(name)
            run.rerun.add(name)
            continue
        if drifted and strict:
            raise checksum_mismatch(name, record.get("checksum"), actual)
        if drifted:
            logger.warning("⚠ Warning  Checksum mismatch: %s", name)
        logger.debug("⏭ Skipped  %s", name)
        ws.events.emit("migration:skipped", migration=name, direction="up",
                       reason="already-applied")
        run.results.append(RunResult(name, "skipped", reason="Already applied"))
    if not targets:
        return
    base = batch if batch is not None else found.max_batch() + 1
    run_targets(ws, run, targets, "up", batches=None if step else [base] * len(targets),
                step_base=base if step else None)


def down(
    ws: Workspace,
    file: str | None,
    *,
    steps: int | None,
    batch: int | None,
    to: str | None,
    no_lock: bool,
    requested_by: str | None,
    reason: str | None,
    ordered: bool = False,
) -> list[RunResult]:
    """Revert the last batch (or a file, ``steps``, a ``batch``, everything after ``to``);
    ``ordered`` (with a file): only the newest applied migration."""
    validate_down_options(file, steps=steps, batch=batch, to=to,
                          requested_by=requested_by, reason=reason, ordered=ordered)

    def work(run: Run) -> None:
        records = plan_down(ws.connection.changelog, file=file, steps=steps, batch=batch, to=to,
                            ordered=ordered)
        check_forward_only(records)
        if not records:
            ws.project.logger.info("Nothing to rollback")
            return
        run_targets(ws, run, [r["name"] for r in records], "down")

    return locked_run(ws, "down", "down", work, no_lock=no_lock,
                      requested_by=requested_by, reason=reason)


def redo(
    ws: Workspace,
    file: str | None,
    *,
    no_lock: bool,
    requested_by: str | None,
    reason: str | None,
) -> list[RunResult]:
    """Revert then re-apply the newest applied migration (or ``file``) under one lock."""
    validate_down_options(file, requested_by=requested_by, reason=reason)

    def work(run: Run) -> None:
        changelog = ws.connection.changelog
        if file is not None:
            records = plan_down(changelog, file=file, steps=None, batch=None, to=None)
        else:
            newest = changelog.newest_applied()
            records = [newest] if newest else []
        if not records:
            ws.project.logger.info("Nothing to redo")
            return
        check_forward_only(records)
        name = records[0]["name"]
        run_targets(ws, run, [name], "down")
        run_targets(ws, run, [name], "up", batches=[ws.connection.changelog.max_batch() + 1])

    return locked_run(ws, "redo", None, work, no_lock=no_lock,
                      requested_by=requested_by, reason=reason)


def dry_run(
    ws: Workspace,
    direction: Direction,
    file: str | None,
    *,
    steps: int | None,
    batch: int | None,
    to: str | None,
) -> list[StatusRow]:
    """Preview exactly what ``up``/``down`` would do: no lock, no writes, no events."""
    _check_preview_options(direction, file, steps=steps, batch=batch, to=to)
    project = ws.project
    with ws.slot.busy():
        files = project.files()
        changelog = ws.connection.changelog
        checked = changelog.verify()  # what the real run would refuse, the preview refuses
        if any(r.get("status") in UNFINISHED for r in checked.readable):
            lock = read_lock_status(ws.connection.lock_collection,
                                    ttl_ms=project.config.lock_ttl_seconds * 1000)
            owner = lock.holder.run_id if lock.state == "held" and lock.holder else None
            raise in_doubt_error(judge_unfinished(checked.readable, live_owner=owner))
        if direction == "up":
            plan = plan_up(
                changelog, files, project.directory, file=file, to=to, force=False,
                strict=project.config.strict, on_out_of_order=project.config.on_out_of_order,
                checksum=project.checksum,
            )
            project.warn_out_of_order(plan.late, plan.newest_applied)
            targets = [n for n in plan.targets if n not in plan.already_applied]
            rows = {r.file: r for r in build_status_rows(
                changelog.records_named(targets), targets, checksum=None)}
            preview = [replace(rows[name], checksum=project.checksum(name)) for name in targets]
            project.logger.info("◎ Dry-run  Would apply: %d", len(preview))
            note_preview(ws, file=file, to=to)
            return preview
        records = plan_down(changelog, file=file, steps=steps, batch=batch, to=to)
        check_forward_only(records)
        selected = {r["name"] for r in records}
        on_disk = [n for n in files if n in selected]
        rows = {r.file: r for r in build_status_rows(records, on_disk, checksum=project.checksum)}
        preview = [rows[r["name"]] for r in records]
        project.logger.info("◎ Dry-run  Would revert: %d", len(preview))
        return preview


def _check_preview_options(
    direction: Direction, file: str | None, *, steps: int | None, batch: int | None,
    to: str | None,
) -> None:
    if direction == "up":
        validate_up_options(file, to=to)
        if steps is not None or batch is not None:
            raise ConfigInvalidError(
                "--steps and --batch apply to dry-run down only", {"option": "steps"}
            )
    elif direction == "down":
        validate_down_options(file, steps=steps, batch=batch, to=to)
    else:
        raise ConfigInvalidError(
            f"dry-run direction must be 'up' or 'down' (got {direction!r})",
            {"option": "direction"},
        )
