"""One control read a second per migration, shared by every lane of a process.

Each held lease has its :class:`~migronaut.background.lease_keeper.LeaseKeeper`, and each keeper
needs the migration's control fields (pause, cancel, fail, a new generation or plan) about once a
second. Read per keeper, ``L`` lanes cost ``L`` reads a second for the same answer. The keepers of
lanes that share a store (one engine: ``background work``, ``background run``, a Celery worker's
engine) subscribe to its :class:`ControlFeed` instead: at its control tick a keeper asks the feed
to :meth:`~ControlFeed.poll`, and the first keeper to ask once the last read is
:data:`~migronaut.background.lease_keeper.CONTROL_INTERVAL_S` old reads for all of them and hands
the document to every subscriber, which judges it against its own generation and plan.

Invariant: **every subscriber sees a read at most one interval old**. The keeper that read last
ticks again one interval later and reads then unless another keeper already did, so consecutive
reads are at most one interval (plus a timer's slack) apart and a pause reaches every lane within
the bound one read per lane gave. Renewals are not shared: each lease is renewed by its own
keeper, fenced by its own token (a renewal that matches nothing stops that lane alone).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["SLACK", "ControlFeed", "ControlListener", "feed_for"]

#: A read younger than ``interval - SLACK`` is reused: keepers' timers that fire a little early
#: do not cause a second read of the same second.
SLACK = 0.05

#: The document of one control read (``None``: the state is gone), as the store returns it.
ControlDoc = Mapping[str, Any] | None


class ControlListener(Protocol):
    """A subscriber: receives each control read of its migration, once.

    ``checked`` is shared by the subscribers of one read: what a check beyond the document
    found (a reshard, keyed by the plan's epoch), so each check runs once per read."""

    def on_control(self, doc: ControlDoc, checked: dict[str, bool]) -> None: ...


class ControlFeed:
    """The control reads of one store's migrations, one per interval, shared by its lanes."""

    def __init__(self, read: Callable[[str], ControlDoc], interval_s: float) -> None:
        self._read = read
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._listeners: dict[str, list[ControlListener]] = {}
        #: when the last read of each migration started (monotonic), by whichever keeper
        self._last: dict[str, float] = {}

    def join(self, name: str, listener: ControlListener) -> None:
        with self._lock:
            self._listeners.setdefault(name, []).append(listener)

    def leave(self, name: str, listener: ControlListener) -> None:
        with self._lock:
            listeners = self._listeners.get(name, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(name, None)
                self._last.pop(name, None)

    def poll(self, name: str) -> bool:
        """Read ``name``'s control fields for every subscriber unless a read started less than
        an interval ago; ``True`` when this call read. A failed read raises (the caller logs it)
        and counts as a read: the next one is an interval later, as a keeper of its own did."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(name)
            if last is not None and now - last < self._interval_s - SLACK:
                return False
            self._last[name] = now
        doc = self._read(name)
        with self._lock:
            listeners = list(self._listeners.get(name, ()))
        checked: dict[str, bool] = {}
        for listener in listeners:
            listener.on_control(doc, checked)
        return True


_FEEDS: weakref.WeakKeyDictionary[Any, ControlFeed] = weakref.WeakKeyDictionary()
_FEEDS_LOCK = threading.Lock()


def feed_for(store: Any, read: Callable[[str], ControlDoc], interval_s: float) -> ControlFeed:
    """The feed shared by every lane working through ``store`` (built on first use)."""
    with _FEEDS_LOCK:
        feed = _FEEDS.get(store)
        if feed is None:
            feed = _FEEDS[store] = ControlFeed(read, interval_s)
        return feed
