"""The version index ``{field: 1, _id: 1}`` of a migrated collection, looked up once per process.

The coordinator counts through it (plans, the final count) and lanes read their batches through
it; both ask here, so a migration lists the collection's indexes once, not once per coordinator
step and once per lane. A missing index is looked for again after :data:`RECHECK_S` (it may be
created meanwhile); a found one is kept until a hint naming it is refused (:func:`forget`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from migronaut.background.planning.id_ranges import index_named

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = ["RECHECK_S", "forget", "hint_refused", "version_index"]

#: A version index found missing is looked for again after this long (seconds).
RECHECK_S = 30.0

_found: dict[tuple[Any, ...], tuple[str | None, float]] = {}
_lock = threading.Lock()


def _key(coll: Collection[Any], field: str) -> tuple[Any, ...]:
    return (id(coll.database.client), coll.database.name, coll.name, field)


def version_index(coll: Collection[Any], field: str) -> str | None:
    """The index's name, ``None`` when the collection has none. A failed listing raises (and
    counts as missing until the next look)."""
    key = _key(coll, field)
    now = time.monotonic()
    with _lock:
        cached = _found.get(key)
    if cached is not None and (cached[0] is not None or now - cached[1] < RECHECK_S):
        return cached[0]
    found: str | None = None
    try:
        found = index_named(coll.index_information(), [(field, 1), ("_id", 1)])
    finally:
        with _lock:
            _found[key] = (found, now)
    return found


def forget(coll: Collection[Any], field: str) -> None:
    """The index went away (a hint naming it was refused): look it up again next time."""
    with _lock:
        _found.pop(_key(coll, field), None)


def hint_refused(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing a hint for an index that does not exist."""
    from pymongo.errors import OperationFailure

    return isinstance(error, OperationFailure) and error.code == 2 \
        and "hint" in str(error).lower()
