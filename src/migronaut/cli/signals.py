"""Graceful SIGINT/SIGTERM for the mutating commands (``up``, ``down``, ``redo``, ``unlock``).

The first signal asks the run to stop after the migration in flight (``Migrator.stop`` →
``RUN_ABORTED``, exit 11): the body is never interrupted, its record is written and the lock is
released. The second signal exits immediately with 130 (SIGINT) or 143 (SIGTERM).

Invariants: the signal handler itself only counts and hands the work to a short-lived thread —
it never takes a lock or writes to a stream the interrupted main thread may be holding. A stop
requested before the run has started (config load, connect) is latched and applied when the run
reaches its lock (the ``run:start`` event). Previous handlers are restored on exit; handlers are
installed only in the main thread (the only one Python delivers signals to).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from migronaut.errors import RunAbortedError

if TYPE_CHECKING:
    from migronaut.cli.output import Output
    from migronaut.observability.events import Listener

__all__ = ["GracefulStop", "Stoppable"]


class Stoppable(Protocol):
    """What a first signal stops: a :class:`~migronaut.api.Migrator` or a
    :class:`~migronaut.fleet.api.Fleet`."""

    def on(self, event: str, listener: Listener) -> Any: ...

    def off(self, event: str, listener: Listener) -> Any: ...

    def stop(self, reason: str) -> None: ...

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """Context manager routing SIGINT/SIGTERM to :meth:`Migrator.stop` for one command."""

    def __init__(self, output: Output) -> None:
        self._output = output
        self._migrator: Stoppable | None = None
        self._previous: dict[int, Any] = {}
        self._count = 0
        self._lock = threading.Lock()
        #: ``"Received SIGINT"`` once a first signal arrived.
        self.requested: str | None = None
        #: What the first signal's line says happens next (a background command says its own).
        self.finishing = "finishing the current migration, then stopping"

    def bind(self, migrator: Stoppable) -> None:
        """Attach the migrator a first signal must stop (latched signals apply on run start)."""
        migrator.on("run:start", self._on_run_start)
        with self._lock:
            self._migrator = migrator
            reason = self.requested
        if reason is not None:
            migrator.stop(reason)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self._migrator is not None:
            self._migrator.off("run:start", self._on_run_start)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The previous handlers while a prompt waits: Ctrl-C there aborts (exit 130)."""
        installed = dict(self._previous)
        for sig, previous in installed.items():
            signal.signal(sig, previous)
        try:
            yield
        finally:
            for sig in installed:
                signal.signal(sig, self._handle)

    def raise_if_requested(self) -> None:
        """For work outside a run (``unlock``): stop before doing it."""
        if self.requested is not None:
            raise RunAbortedError(self.requested, {"reason": self.requested})

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if self._count > 1:
            os._exit(128 + signum)
        name = signal.Signals(signum).name
        threading.Thread(
            target=self._request, args=(name,), name="migronaut-stop", daemon=True
        ).start()

    def _request(self, name: str) -> None:
        self._output.warn(
            f"⚠ {name} received — {self.finishing}. Press again to exit immediately."
        )
        with self._lock:
            self.requested = f"Received {name}"
            migrator = self._migrator
        if migrator is not None:
            migrator.stop(self.requested)

    def _on_run_start(self, payload: dict[str, Any]) -> None:
        with self._lock:
            reason, migrator = self.requested, self._migrator
        if reason is not None and migrator is not None:
            migrator.stop(reason)
