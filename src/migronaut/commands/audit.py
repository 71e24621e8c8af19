"""``audit``: the read-only health checks (:mod:`migronaut.core.audit`) run for a migrator.

The core checks know nothing of declared collections or background migrations; this layer
knows them and adds, after the core checks and in this order, the ``collections`` drift check (a
warning; planned like ``converge --dry-run``), the ``search`` check
(:mod:`migronaut.commands.search_audit`) and the ``background`` check
(:mod:`migronaut.background.tools.audit`).

Invariant: the migrator is left as it was found — a connection the audit opened is closed again,
and nothing is locked, written, emitted or indexed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from migronaut.core.audit import AddedCheck, Auditable, AuditFacts, run_audit

if TYPE_CHECKING:
    from migronaut.background.engine import BackgroundEngine
    from migronaut.core.results import AuditCheck, AuditReport
    from migronaut.core.workspace import Workspace

__all__ = ["BackgroundAuditable", "audit"]


class BackgroundAuditable(Auditable, Protocol):
    """An :class:`~migronaut.core.audit.Auditable` with background migrations (a Migrator)."""

    @property
    def background(self) -> BackgroundEngine: ...


def audit(ws: Workspace, target: BackgroundAuditable) -> AuditReport:
    """Read-only health checks of ``target`` (the migrator), leaving the connection as found."""
    with ws.slot.busy(), ws.transient():
        return run_audit(target, added=[_collections_check(ws), _search_check(target),
                                     _background_check(target)])


def _collections_check(ws: Workspace) -> AddedCheck:
    """The ``collections`` check (only when something is declared): declared collections,
    validators and indexes against the live state, as ``converge --dry-run`` plans them —
    drift is a warning (collections.md §4.2), fixed by ``migronaut converge``."""

    def run(facts: AuditFacts) -> AuditCheck | None:
        from migronaut.commands.converge_plan import plan_declared
        from migronaut.core.results import AuditCheck
        from migronaut.declared.sources import load_definitions
        from migronaut.errors import ConfigInvalidError

        config = facts.config
        if not config.collections and not config.collections_dir:
            return None
        try:
            definitions = load_definitions(config)
        except ConfigInvalidError as error:
            return AuditCheck("collections", "warn",
                              f"Definitions do not load: {error.message}")
        if not definitions:
            return None
        result = plan_declared(ws, definitions)
        total = len(result.collections)
        if result.in_sync:
            return AuditCheck("collections", "pass",
                              f"{total} collection(s) match their declarations")
        drifted = [plan.name for plan in result.collections if plan.changes or plan.conflicts]
        conflicts = sum(len(plan.conflicts) for plan in result.collections)
        detail = (f"{result.changed} change(s) pending in {len(drifted)} of {total} "
                  f"collection(s): {', '.join(drifted)}")
        if conflicts:
            detail += f" · {conflicts} conflict(s)"
        return AuditCheck("collections", "warn",
                          detail + " (migronaut converge --dry-run shows the plan)")

    return AddedCheck("collections", run)


def _search_check(target: Auditable) -> AddedCheck:
    """The ``search`` check: only when some definition declares search indexes."""

    def run(facts: AuditFacts) -> AuditCheck | None:
        from migronaut.commands.search_audit import audit_search

        return audit_search(facts.config, target.db)

    return AddedCheck("search", run)


def _background_check(target: BackgroundAuditable) -> AddedCheck:
    """The ``background`` check: reads the engine only when it runs (inside the core's guard)."""

    def run(facts: AuditFacts) -> AuditCheck | None:
        from migronaut.background.tools.audit import audit_background

        return audit_background(
            target.background, changelog=target.changelog, records=facts.records,
            files=facts.files, checksum=target.checksum, now=facts.now,
            drift_mode=facts.config.background_drift,
        )

    return AddedCheck("background", run)
