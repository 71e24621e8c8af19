"""``audit``: the read-only health checks (:mod:`migronaut.core.audit`) run for a migrator.

The core checks know nothing of declared collections or background migrations; this layer adds
the ``search`` check (:mod:`migronaut.commands.search_audit`) and the ``background`` check
(:mod:`migronaut.background.audit`) after them, in that order.

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
        return run_audit(target, added=[_search_check(target), _background_check(target)])


def _search_check(target: Auditable) -> AddedCheck:
    """The ``search`` check: only when some definition declares search indexes."""

    def run(facts: AuditFacts) -> AuditCheck | None:
        from migronaut.commands.search_audit import audit_search

        return audit_search(facts.config, target.db)

    return AddedCheck("search", run)


def _background_check(target: BackgroundAuditable) -> AddedCheck:
    """The ``background`` check: reads the engine only when it runs (inside the core's guard)."""

    def run(facts: AuditFacts) -> AuditCheck | None:
        from migronaut.background.audit import audit_background

        return audit_background(
            target.background, changelog=target.changelog, records=facts.records,
            files=facts.files, checksum=target.checksum, now=facts.now,
            drift_mode=facts.config.background_drift,
        )

    return AddedCheck("background", run)
