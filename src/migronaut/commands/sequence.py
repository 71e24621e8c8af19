"""Planning a sequenced ``up``: one logical run split into single-file runs (reference core
§11.7) for an external driver such as a queue.

The plan is read-only (no lock, no writes, no events). Invariant: it lists what a bulk ``up``
would apply, in the same order, each file with the checksum it has now (the job pins it) and one
shared batch; it stops before an ordinary migration whose background ``requires`` are not done
(``waiting``), because that run would refuse it anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.core.plan import plan_up, validate_up_options
from migronaut.errors import BackgroundPendingError

if TYPE_CHECKING:
    from migronaut.commands.background import BackgroundWiring
    from migronaut.core.workspace import Workspace

__all__ = ["PlannedRun", "SequencePlan", "plan_sequence"]


@dataclass(frozen=True)
class PlannedRun:
    """One single-file ``up`` of the sequence: ``up(migration, ordered=True, batch=,
    checksum=)``. ``failed``: its last attempt failed and the file has not changed since."""

    migration: str
    checksum: str
    failed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"migration": self.migration, "checksum": self.checksum, "failed": self.failed}


@dataclass(frozen=True)
class SequencePlan:
    """What a sequenced ``up`` will run: ``runs`` in order sharing ``batch``; ``waiting`` names
    the migration it stops before and the background migrations it ``waitsFor``."""

    runs: list[PlannedRun]
    batch: int
    waiting: dict[str, Any] | None = None
    late: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [r.to_dict() for r in self.runs], "batch": self.batch,
                "waiting": self.waiting}


def plan_sequence(ws: Workspace, wiring: BackgroundWiring, file: str | None = None, *,
                  to: str | None = None) -> SequencePlan:
    """The single-file runs a bulk ``up`` (or ``up(file)``) amounts to now; see the module.

    ``file``: that file alone, refused as an ordered run would refuse it (``MIGRATION_BLOCKED``
    while an earlier file is pending; ``BACKGROUND_PENDING`` while its requirements are not
    done); nothing when it is applied already."""
    validate_up_options(file, to=to)
    project = ws.project
    with ws.slot.busy():
        files = project.files()
        changelog = ws.connection.changelog
        changelog.verify()
        plan = plan_up(changelog, files, project.directory, file=file, to=to, force=False,
                       strict=project.config.strict,
                       on_out_of_order=project.config.on_out_of_order,
                       checksum=project.checksum, ordered=file is not None)
        project.warn_out_of_order(plan.late, plan.newest_applied)
        names = [n for n in plan.targets if n not in plan.already_applied]
        batch = changelog.max_batch() + 1
        records = {r["name"]: r for r in changelog.records_named(names)}
        runs: list[PlannedRun] = []
        waiting: dict[str, Any] | None = None
        for migration in project.load(names):
            name = migration.name
            if migration.background is None and migration.requires:
                unmet = wiring.engine.unmet(migration.requires, changelog)
                if unmet:
                    waiting = {"migration": name, "waitsFor": unmet}
                    break
            checksum = project.checksum(name) or ""
            record = records.get(name) or {}
            runs.append(PlannedRun(name, checksum, failed=record.get("status") == "failed"
                                   and record.get("checksum") == checksum))
        if waiting is not None:
            listed = ", ".join(f"{w['migration']} ({w['status']})" for w in waiting["waitsFor"])
            if file is not None:
                raise BackgroundPendingError(
                    f"{file} is blocked: {len(waiting['waitsFor'])} background migration(s) "
                    f"not done: {listed}", waiting)
            project.logger.info("⧗ %s waits for background migration(s): %s — not enqueued yet",
                                waiting["migration"], listed)
        return SequencePlan(runs, batch, waiting, plan.late)
