"""What migronaut's tasks share inside one worker process: where the config comes from, the
:class:`~migronaut.api.Migrator` s (connected on first use, never across a fork), and the
shutdown signal a warm shutdown sets so lanes stop at their next batch boundary.

The background queue's tasks share ONE engine per process, as ``background work``'s lanes share
their runner's: one client and its monitor threads, one connection pool, the job and version-index
caches warm for every pool thread — a thread's first lane slice does not pay for a client of its
own. The migration queue's tasks (``up``, ``down``, ``sync``, …) keep a Migrator per thread.

A fleet's tasks share one :class:`FleetWorker`: the fleet (one client per cluster), the tenants
it lists, and a bounded set of tenant background engines, each over its tenant's ordinary
Migrator on the cluster's shared client — a tenant's background jobs run exactly as its own
``background work`` would.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.core.context import Cancellation
from migronaut.errors import QueueJobInvalidError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.background.engine import BackgroundEngine
    from migronaut.core.config import Config
    from migronaut.executors.celery.settings import CelerySettings
    from migronaut.fleet.api import Fleet
    from migronaut.fleet.tenants import Tenant

__all__ = ["TENANT_ENGINES", "ConfigSource", "FleetWorker", "WorkerContext"]

#: How many tenant background engines a worker process keeps connected; past it, the least
#: recently used one that no task is using is closed.
TENANT_ENGINES = 32


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
    _fleet: FleetWorker | None = None

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

    def fleet(self) -> FleetWorker:
        """The process's fleet side (the fleet, its tenants, their background engines)."""
        self._after_fork()
        with self._lock:
            if self._fleet is None:
                self._fleet = FleetWorker(self.source)
            return self._fleet

    def close(self) -> None:
        """Close every Migrator this process opened, the tenants' too (worker process
        shutdown)."""
        with self._lock:
            opened, self._opened = self._opened, []
            self._shared = None
            fleet, self._fleet = self._fleet, None
        for migrator in opened:
            migrator.close()
        if fleet is not None:
            fleet.close()
        self._local = threading.local()

    def _after_fork(self) -> None:
        if self._pid != os.getpid():  # a prefork child: nothing of the parent's is ours
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._local = threading.local()
            self._opened = []
            self._shared = None
            self._fleet = None
            self.shutdown = Cancellation()


class FleetWorker:
    """The fleet in one worker process: one :class:`~migronaut.fleet.api.Fleet` (one client per
    cluster, shared by every tenant task of the process), built on first use and never across a
    fork, and the tenants' background engines (at most :data:`TENANT_ENGINES` idle ones)."""

    def __init__(self, source: ConfigSource) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._fleet: Fleet | None = None
        self._pid = os.getpid()
        self._known: dict[tuple[str, str], Tenant] = {}
        self._has_fleet: bool | None = None
        #: (cluster, tenant) -> [its connected Migrator, how many tasks use its engine now]
        self._engines: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()

    def fleet(self) -> Fleet:
        from migronaut.fleet.api import Fleet

        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._fleet, self._known = os.getpid(), None, {}
                self._engines = OrderedDict()
            if self._fleet is None:
                if self.source.read().fleet is None:
                    raise QueueJobInvalidError(
                        "Invalid queue job: it names a tenant, but this worker's config has no "
                        "[fleet] table", {"field": "tenant"})
                config = self.source.config
                self._fleet = Fleet(dict(config) if config is not None else None,
                                    config_path=self.source.config_path, cwd=self.source.cwd)
            return self._fleet

    def has_fleet(self) -> bool:
        """Whether this worker's config declares a ``[fleet]`` (read once)."""
        if self._has_fleet is None:
            self._has_fleet = self.source.read().fleet is not None
        return self._has_fleet

    def tenant(self, cluster: str, name: str) -> Tenant:
        """The fleet's tenant ``name`` on ``cluster``; one the fleet does not list (resolved
        again once, in case it was added since) is ``QUEUE_JOB_INVALID`` — a task never
        touches a database outside the fleet."""
        key = (cluster, name)
        found = self._known.get(key)
        if found is None:
            fleet = self.fleet()
            for tenant in _resolve_fresh(fleet):
                self._known[(tenant.cluster, tenant.name)] = tenant
            found = self._known.get(key)
        if found is None:
            raise QueueJobInvalidError(
                f"Invalid queue job: {name!r} is not a tenant of the fleet on cluster "
                f"{cluster!r}", {"field": "tenant", "tenant": name, "cluster": cluster})
        return found

    @contextmanager
    def engine(self, cluster: str, name: str) -> Iterator[BackgroundEngine]:
        """The background engine of tenant ``name`` (checked: :meth:`tenant`) while the block
        runs: its ordinary Migrator on the cluster's shared client, connected on first use and
        kept for the next job. An engine in use is never closed; past
        :data:`TENANT_ENGINES`, idle ones are, least recently used first."""
        tenant = self.tenant(cluster, name)
        key = (tenant.cluster, tenant.name)
        fleet = self.fleet()
        with self._lock:
            slot = self._engines.get(key)
            if slot is not None:
                slot[1] += 1
                self._engines.move_to_end(key)
        if slot is None:
            migrator = fleet.migrator(tenant)
            try:
                migrator.connect()
                _ = migrator.background
            except BaseException:
                migrator.close()
                raise
            spare: Migrator | None = None
            with self._lock:
                slot = self._engines.get(key)
                if slot is None:
                    slot = self._engines[key] = [migrator, 1]
                else:  # another thread connected it meanwhile: use that one
                    slot[1] += 1
                    self._engines.move_to_end(key)
                    spare = migrator
            if spare is not None:
                spare.close()
        try:
            yield slot[0].background
        finally:
            with self._lock:
                slot[1] -= 1
                idle = self._evict()
            for migrator in idle:
                migrator.close()

    def _evict(self) -> list[Migrator]:
        """The idle engines' migrators past the bound, taken out of the cache (under the
        lock)."""
        evicted: list[Migrator] = []
        for key in list(self._engines):
            if len(self._engines) <= TENANT_ENGINES:
                break
            if self._engines[key][1] == 0:
                evicted.append(self._engines.pop(key)[0])
        return evicted

    def close(self) -> None:
        with self._lock:
            fleet, self._fleet = self._fleet, None
            engines, self._engines = list(self._engines.values()), OrderedDict()
        for migrator, _ in engines:
            migrator.close()
        if fleet is not None:
            fleet.close()


def _resolve_fresh(fleet: Fleet) -> list[Tenant]:
    from migronaut.fleet.tenants import resolve_tenants

    return resolve_tenants(fleet.fleet_config, fleet.clients, None, unreachable={})

