"""Enqueueing background work: heals (one coordinator per runnable migration, takeovers for
stalled ones) and one named migration (reference background §6.4 "Heals")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["enqueue_background"]


def enqueue_background(
    installed: MigronautCelery,
    migration: str | None = None,
    *,
    stall_ms: int | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
) -> list[dict[str, Any]]:
    """Enqueue coordinators: for ``migration``, or (a heal) for every runnable one.

    Returns ``[{migration, id, takeover?}]``, one entry per coordinator task sent.
    """
    return []
