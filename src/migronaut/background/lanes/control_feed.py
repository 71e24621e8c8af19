"""One control reader thread per store, shared by every lane working through it.

Each held lease's lane needs the migration's control fields (pause, cancel, fail, a new
generation or plan) about once a second. The lanes that share a store (one engine: ``background
work``, ``background run``, a Celery worker's engine) subscribe to its :class:`ControlFeed`: one
thread, ``migronaut-control``, reads each subscribed migration's control fields once an interval
and hands the document to every subscriber, which judges it against its own generation and plan.
The thread starts with the first subscriber and is stopped and joined when the last one leaves,
so ``L`` lanes cost one read a second per migration and one thread waking once a second, not
``L`` of each.

Invariant: **every subscriber sees a read at most one interval (plus the read's round trip)
old**. The reader schedules reads from the start of the previous one, and a subscriber that
joins between two reads gets the next one, so a pause reaches every lane within the bound one
read per lane gave. Renewals are not shared: each lease is renewed by its own keeper, fenced by
its own token (:mod:`~migronaut.background.lanes.lease_keeper`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["READER_THREAD", "ControlFeed", "ControlListener", "feed_for"]

#: The name of every store's control reader thread.
READER_THREAD = "migronaut-control"

#: The document of one control read (``None``: the state is gone), as the store returns it.
ControlDoc = Mapping[str, Any] | None

_log = logging.getLogger("migronaut.background")


class ControlListener(Protocol):
    """A subscriber: receives each control read of its migration, once.

    ``checked`` is shared by the subscribers of one read: what a check beyond the document
    found (a reshard, keyed by the plan's epoch), so each check runs once per read."""

    def on_control(self, doc: ControlDoc, checked: dict[str, bool]) -> None: ...


class ControlFeed:
    """The control reads of one store's migrations: one reader thread, one read per interval
    per migration, handed to every subscribed lane."""

    def __init__(self, read: Callable[[str], ControlDoc], interval_s: float) -> None:
        self._read = read
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._listeners: dict[str, list[ControlListener]] = {}
        #: the running reader and the event that stops it (``None`` while nobody subscribes)
        self._reader: tuple[threading.Thread, threading.Event] | None = None

    def join(self, name: str, listener: ControlListener) -> None:
        """Subscribe ``listener`` to ``name``'s reads; the first subscriber starts the reader."""
        with self._lock:
            self._listeners.setdefault(name, []).append(listener)
            if self._reader is None:
                stop = threading.Event()
                thread = threading.Thread(target=self._run, args=(stop,), name=READER_THREAD,
                                          daemon=True)
                self._reader = (thread, stop)
                thread.start()

    def leave(self, name: str, listener: ControlListener) -> None:
        """Unsubscribe; the last subscriber to leave stops the reader and waits for it (a read
        in flight ends first), so no thread outlives the lanes that needed it."""
        with self._lock:
            listeners = self._listeners.get(name, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(name, None)
            if self._listeners or self._reader is None:
                return
            thread, stop = self._reader
            self._reader = None
        stop.set()
        if thread is not threading.current_thread():
            thread.join()

    def _run(self, stop: threading.Event) -> None:
        """Every interval, one read per subscribed migration, until ``stop``."""
        due = time.monotonic() + self._interval_s
        while not stop.wait(max(0.0, due - time.monotonic())):
            due = time.monotonic() + self._interval_s
            with self._lock:
                names = list(self._listeners)
            for name in names:
                if stop.is_set():
                    return
                self._deliver(name)

    def _deliver(self, name: str) -> None:
        """Read ``name``'s control fields once and hand them to each of its subscribers. A
        failed read is logged and the next one is an interval later: checkpoints are fenced
        by the lease token anyway."""
        try:
            doc = self._read(name)
        except Exception as error:
            _log.debug("control read of %s failed: %s", name, type(error).__name__)
            return
        with self._lock:
            listeners = list(self._listeners.get(name, ()))
        checked: dict[str, bool] = {}
        for listener in listeners:
            listener.on_control(doc, checked)


_FEEDS: weakref.WeakKeyDictionary[Any, ControlFeed] = weakref.WeakKeyDictionary()
_FEEDS_LOCK = threading.Lock()


def feed_for(store: Any, read: Callable[[str], ControlDoc], interval_s: float) -> ControlFeed:
    """The feed shared by every lane working through ``store`` (built on first use)."""
    with _FEEDS_LOCK:
        feed = _FEEDS.get(store)
        if feed is None:
            feed = _FEEDS[store] = ControlFeed(read, interval_s)
        return feed
