"""Where migronaut reads its own state: always the primary.

Invariant: the changelog, the lock, run records and background state and partitions are read
from the primary, whatever read preference the user's URI carries. A secondary lags: a stale
changelog read would apply a migration twice, and a roll-up that summed stale partition counters
would lose them for good (it runs once per generation). Migration bodies keep the user's read
preference (``ctx.db``); only migronaut's own handles go through :func:`primary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["primary"]


def primary(db: Database[dict[str, Any]]) -> Database[dict[str, Any]]:
    """``db`` with primary reads (its collections inherit them)."""
    from pymongo import ReadPreference

    if db.read_preference == ReadPreference.PRIMARY:
        return db
    return db.with_options(read_preference=ReadPreference.PRIMARY)
