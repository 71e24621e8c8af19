"""Which of migronaut's collections had their indexes ensured, per (client, database), in this
process: ``createIndexes`` is sent once, not with every run.

Invariants: a collection is marked only after its ``createIndexes`` succeeded; an entry lives
as long as its client (weakly keyed: a new client ensures again); :func:`forget` drops every
mark of a database, which a run does when the changelog it reads under the lock turns out empty
(the database may have been dropped since, indexes and all), so the next ensure sends again.
Thread-safe: a fleet's tenants run on one shared client from many threads.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["ensure_once", "forget", "is_ensured"]

_marks: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def is_ensured(client: Any, db_name: str, collection: str) -> bool:
    with _lock:
        return (db_name, collection) in _marks.get(client, ())


def ensure_once(client: Any, db_name: str, collection: str, create: Callable[[], object]) -> bool:
    """Call ``create`` unless ``collection`` of ``db_name`` on ``client`` is marked; mark it
    when ``create`` returns (an error propagates, nothing marked). True when it was called."""
    if is_ensured(client, db_name, collection):
        return False
    create()
    with _lock:
        _marks.setdefault(client, set()).add((db_name, collection))
    return True


def forget(client: Any, db_name: str) -> None:
    """Drop every mark of ``db_name`` on ``client``: its indexes are ensured again."""
    with _lock:
        marks = _marks.get(client)
        if marks:
            marks.difference_update({mark for mark in marks if mark[0] == db_name})
