"""Lifecycle events of a migrator (reference core §10.2).

Invariant: a listener can never break a run. Whatever it raises is caught and logged at debug
level; the event name ``error`` is never used.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["EVENTS", "EventBus", "Listener"]

Listener = Callable[[dict[str, Any]], Any]

#: Every event a migrator emits besides the ``background:*`` ones; payloads are documented in
#: ``docs/observability.md`` (converge's in collections.md §2.8 and §7.8).
EVENTS = (
    "run:start",
    "run:end",
    "migration:start",
    "migration:success",
    "migration:skipped",
    "migration:error",
    "migration:log",
    "lock:acquired",
    "lock:released",
    "lock:lost",
    "converge:start",
    "converge:action",
    "converge:wait",
    "converge:end",
)

_log = logging.getLogger("migronaut.events")


class EventBus:
    def __init__(self) -> None:
        self._listeners: dict[str, list[Listener]] = {}
        self._lock = threading.Lock()

    def on(self, event: str, listener: Listener) -> None:
        with self._lock:
            self._listeners.setdefault(event, []).append(listener)

    def off(self, event: str, listener: Listener) -> None:
        with self._lock:
            listeners = self._listeners.get(event, [])
            if listener in listeners:
                listeners.remove(listener)

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        if not self._listeners:  # (nobody listening: a run emits several events per migration)
            return
        with self._lock:
            listeners = list(self._listeners.get(event, ()))
            listeners += self._listeners.get("*", ())
        for listener in listeners:
            try:
                listener({"event": event, **payload})
            except Exception as error:  # contained: listeners are external observers
                _log.debug("listener for %s failed: %s", event, error)
