"""``lock`` and ``unlock``: the migration lock as ``up`` would judge it, and its forced release.

Invariant: reading the lock never acquires, renews or releases it; ``unlock`` removes it whoever
holds it (the holder stops after the migration in flight, see :mod:`migronaut.core.lock`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migronaut.core.lock import force_release, read_lock_status

if TYPE_CHECKING:
    from migronaut.core.results import LockInfo, LockStatus
    from migronaut.core.workspace import Workspace

__all__ = ["lock_status", "unlock"]


def lock_status(ws: Workspace) -> LockStatus:
    """The migration lock judged by the rule ``up`` applies (never acquires or releases)."""
    with ws.slot.busy():
        return read_lock_status(ws.connection.lock_collection,
                                ttl_ms=ws.project.config.lock_ttl_seconds * 1000)


def unlock(ws: Workspace) -> LockInfo | None:
    """Force-release the lock whoever holds it; returns the removed holder."""
    with ws.slot.busy():
        return force_release(ws.connection.lock_collection)
