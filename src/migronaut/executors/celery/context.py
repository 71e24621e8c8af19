"""What migronaut's tasks share inside one worker process: where the config comes from, the
:class:`~migronaut.api.Migrator` s (connected on first use, never across a fork), and the
shutdown signal a warm shutdown sets so lanes stop at their next batch boundary.

The background queue's tasks share ONE engine per process, as ``background work``'s lanes share
their runner's: one client and its monitor threads, one connection pool, the job and version-index
caches warm for every pool thread — a thread's first lane slice does not pay for a client of its
own. The migration queue's tasks (``up``, ``down``, ``sync``, …) keep a Migrator per thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.core.context import Cancellation

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.background.engine import BackgroundEngine
    from migronaut.core.config import Config
    from migronaut.executors.celery.settings import CelerySettings

__all__ = ["ConfigSource", "WorkerContext"]


@dataclass(frozen=True)
class ConfigSource:
    """How to build a Migrator: the arguments of ``Migrator(config, config_path=, cwd=)``."""

    config: Mapping[str, Any] | None = None
    config_path: str | None = None
    cwd: str | None = None

    def read(self) -> Config:
        """The configuration, checked, without requiring a ``db`` (what ``install`` reads: the
        ``celery`` table, the ``[fleet]``; a fleet's workers may have no database of their own).
        """
        from migronaut.core.config import load_config

        return load_config(dict(self.config) if self.config is not None else {},
                           config_path=self.config_path, cwd=self.cwd, require_db=False)

    def build(self) -> Migrator:
        from migronaut.api import Migrator

        return Migrator(dict(self.config) if self.config is not None else None,
                        config_path=self.config_path, cwd=self.cwd)


@dataclass
class WorkerContext:
    """Per-process state of the tasks. Thread-safe; a forked child starts afresh (pymongo
    clients must not cross a fork)."""

    source: ConfigSource
    settings: CelerySettings
    #: Set by a warm shutdown: lanes stop at their next batch boundary, checkpoint, release their
    #: lease and re-enqueue themselves; coordinators bow out and come back.
    shutdown: Cancellation = field(default_factory=Cancellation)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)
    _opened: list[Migrator] = field(default_factory=list)
    _pid: int = field(default_factory=os.getpid)
    _shared: Migrator | None = None

    def migrator(self) -> Migrator:
        """This thread's Migrator, built from the config source on first use."""
        self._after_fork()
        found: Migrator | None = getattr(self._local, "migrator", None)
        if found is None:
            found = self.source.build()
            self._local.migrator = found
            with self._lock:
                self._opened.append(found)
        return found

    def shared_migrator(self) -> Migrator:
        """The process's Migrator for background work, built and connected (its engine too) on
        first use under the lock, then used by every thread: the engine is thread-safe once
        built — the runner's lanes, coordinator steps and verifier share one the same way."""
        self._after_fork()
        shared = self._shared
        if shared is None:
            with self._lock:
                shared = self._shared
                if shared is None:
                    shared = self.source.build()
                    try:
                        shared.connect()
                        _ = shared.background
                    except BaseException:
                        shared.close()
                        raise
                    self._shared = shared
                    self._opened.append(shared)
        return shared

    def engine(self) -> BackgroundEngine:
        """The process's background engine (over :meth:`shared_migrator`)."""
        return self.shared_migrator().background

    def close(self) -> None:
        """Close every Migrator this process opened (worker process shutdown)."""
        with self._lock:
            opened, self._opened = self._opened, []
            self._shared = None
        for migrator in opened:
            migrator.close()
        self._local = threading.local()

    def _after_fork(self) -> None:
        if self._pid != os.getpid():  # a prefork child: nothing of the parent's is ours
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._local = threading.local()
            self._opened = []
            self._shared = None
            self.shutdown = Cancellation()

