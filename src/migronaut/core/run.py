"""A run — one lock acquisition around one command — the slot that holds it, and its events.

Invariants: a migrator has at most one run in flight (:class:`RunSlot`); a stop asked for while a
command is busy but before its run exists is latched and delivered when the run starts, and
forgotten when the migrator goes idle. Every event emitted while a run is in flight carries its
``runId`` and is seen by the run's recording (:class:`RunEvents`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from migronaut.core.context import Cancellation
from migronaut.errors import ConfigInvalidError, RunAbortedError
from migronaut.observability.events import EventBus, Listener
from migronaut.observability.telemetry import NO_RUN, RunTrace

if TYPE_CHECKING:
    from collections.abc import Iterator

    from migronaut.core.async_bridge import AsyncBridge
    from migronaut.core.changelog import ChangelogRead
    from migronaut.core.lock import MigrationLock
    from migronaut.core.results import RunResult
    from migronaut.observability.recorder import RunRecording

__all__ = ["Direction", "Run", "RunEvents", "RunSlot"]

Direction = Literal["up", "down"]


@dataclass
class Run:
    """The state of one run: its id, lock, cancellation and the results so far."""

    id: str
    command: str
    cancellation: Cancellation
    lock: MigrationLock | None = None
    #: The lock was released before the run's end (converge's search wait, collections §7.8).
    released_early: bool = False
    results: list[RunResult] = field(default_factory=list)
    requested_by: str | None = None
    reason: str | None = None
    #: Who runs it (``executedBy`` of its records and lock), looked up once per run.
    executed_by: str = ""
    #: Counts of a run whose outcome is not per-migration results (import, baseline): run:end.
    counts: dict[str, int] = field(default_factory=dict)
    trace: RunTrace = NO_RUN
    recording: RunRecording | None = None
    #: Where this run's ``async def`` bodies run (made on first use, closed with the run).
    bridge: AsyncBridge | None = None
    #: ``up`` with ``on_background_pending="stop"``: a migration whose background requirements
    #: are not done ends the run cleanly instead of failing it; what it waits for is kept here.
    stop_when_waiting: bool = False
    waiting: list[dict[str, Any]] = field(default_factory=list)
    #: ``up --force``: the applied migrations this run re-runs (its claim of their records
    #: expects ``applied``; any other ``up`` claim expects a record that is not).
    rerun: set[str] = field(default_factory=set)
    #: ``up``: the changelog as read once under the lock, what the run plans from.
    changelog_read: ChangelogRead | None = None


class RunSlot:
    """The run in flight on one migrator, how many commands are busy, and a latched stop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Run | None = None
        self._busy = 0
        self._latched_stop: str | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A command at work: a stop asked for meanwhile waits for its run (if it starts one)."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                if not self._busy and self.current is None:
                    self._latched_stop = None

    def require_free(self) -> None:
        with self._lock:
            if self.current is not None:
                raise ConfigInvalidError(
                    "A run is already in flight on this Migrator instance",
                    {"runId": self.current.id},
                )

    def enter(self, run: Run) -> None:
        """``run`` is now in flight; a stop latched before it started cancels it."""
        with self._lock:
            self.current = run
            latched, self._latched_stop = self._latched_stop, None
        if latched is not None:
            run.cancellation.cancel(RunAbortedError(latched, {"reason": latched}))

    def leave(self) -> None:
        with self._lock:
            self.current = None

    def stop(self, reason: str) -> None:
        """Cancel the run in flight, or latch the stop for the run a busy command is setting up."""
        with self._lock:
            run = self.current
            if run is not None:
                run.cancellation.cancel(RunAbortedError(reason, {"reason": reason}))
            elif self._busy:
                self._latched_stop = reason


class RunEvents:
    """The lifecycle events of one migrator (``run:start``, ``migration:success``, … or ``*``)."""

    def __init__(self, slot: RunSlot) -> None:
        self._bus = EventBus()
        self._slot = slot

    def on(self, event: str, listener: Listener) -> None:
        self._bus.on(event, listener)

    def off(self, event: str, listener: Listener) -> None:
        self._bus.off(event, listener)

    def emit(self, event: str, **payload: Any) -> None:
        run = self._slot.current
        if run is not None:
            payload.setdefault("runId", run.id)
            if run.recording is not None:
                run.recording.observe(event, payload)
        self._bus.emit(event, payload)
