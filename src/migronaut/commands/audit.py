"""``audit``: the read-only health checks (:mod:`migronaut.core.audit`) run for a migrator.

Invariant: the migrator is left as it was found — a connection the audit opened is closed again,
and nothing is locked, written, emitted or indexed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut.core.audit import Auditable
    from migronaut.core.results import AuditReport
    from migronaut.core.workspace import Workspace

__all__ = ["audit"]


def audit(ws: Workspace, target: Auditable) -> AuditReport:
    """Read-only health checks of ``target`` (the migrator), leaving the connection as found."""
    from migronaut.core.audit import run_audit

    with ws.slot.busy(), ws.transient():
        return run_audit(target)
