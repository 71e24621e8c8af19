"""The fleet API: :class:`Fleet` (sync) and :class:`AsyncFleet`.

A façade like :class:`~migronaut.api.Migrator`: it resolves the configuration, the tenants and
the clusters' shared clients, and hands the work to the module that owns it (:mod:`.status` for
``status``, :mod:`.runner` for the runs, :mod:`.runs` for the run records). The CLI's ``fleet``
commands call it and only render.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from migronaut._suggest import suggest
from migronaut._values import is_int
from migronaut.aio import _off_loop as off_loop
from migronaut.api import Migrator
from migronaut.core.config import DEFAULT_LOGGER, Config, load_config, with_overrides
from migronaut.errors import (
    ConfigInvalidError,
    ConnectionFailedError,
    FleetInvalidError,
    MigronautError,
)
from migronaut.fleet.clients import ClusterClients, SharedClientConnection
from migronaut.fleet.config import RUN_KEYS, check_policy_value
from migronaut.fleet.runner import FleetResult, FleetRun, operation
from migronaut.fleet.runs import FleetRunRecord, FleetRunStore
from migronaut.fleet.schedule import FleetPolicy
from migronaut.fleet.status import FleetStatus, TenantStatus, read_tenant_status
from migronaut.fleet.tenants import Tenant, resolve_tenants
from migronaut.observability.events import EventBus
from migronaut.observability.telemetry import Telemetry, resolve_telemetry

if TYPE_CHECKING:
    from migronaut.fleet.config import FleetConfig
    from migronaut.observability.events import Listener

__all__ = ["AsyncFleet", "Fleet"]

R = TypeVar("R")


class TenantMigrator(Migrator):
    """The ordinary migrator of one tenant, on its cluster's shared (already pinged) client."""

    _connection = SharedClientConnection


class Fleet:
    """Every tenant database of the configured fleet, one ordinary migrator each.

    ``config`` is a resolved :class:`~migronaut.core.config.Config` or a mapping of config keys
    (the flags tier); when ``None`` the configuration is loaded the ordinary way (flags >
    ``MIGRONAUT_*`` > config file). ``tenants`` is a glob narrowing the fleet (``--tenants``).
    ``tenant_logger`` replaces the configured logger in the tenants' migrators (``None``
    silences them: the CLI reports each tenant's outcome itself).
    Use it as a context manager, or call :meth:`close`::

        with Fleet(tenants="tenant_0*") as fleet:
            print(fleet.status().counts())
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None = None,
        *,
        tenants: str | None = None,
        config_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        tenant_logger: Any = DEFAULT_LOGGER,
        _quick_connect: bool = False,
        _flags_origin: Literal["flag", "argument"] = "argument",
        **overrides: Any,
    ) -> None:
        self._tenant_logger = tenant_logger
        if isinstance(config, Config):
            resolved = with_overrides(config, **overrides) if overrides else config
        else:
            resolved = load_config({**(config or {}), **overrides}, config_path=config_path,
                                   cwd=cwd, require_db=False, flags_origin=_flags_origin)
        if resolved.fleet is None:
            raise ConfigInvalidError(
                "Invalid configuration: no fleet is configured (add a [fleet] table naming "
                "the tenants: names, pattern, regex, registry or callable)",
                {"issues": [{"path": "fleet", "message": "no [fleet] table"}]})
        self.config = resolved
        self._pattern = tenants
        self._clients = ClusterClients(resolved, quick_connect=_quick_connect)
        self._tenants: list[Tenant] | None = None
        self._unreachable: dict[str, ConnectionFailedError] = {}
        self._events = EventBus()
        self._stop = threading.Event()
        self._current: FleetRun | None = None

    @property
    def fleet_config(self) -> FleetConfig:
        assert self.config.fleet is not None
        return self.config.fleet

    @property
    def clients(self) -> ClusterClients:
        """The clusters' shared clients."""
        return self._clients

    def tenants(self) -> list[Tenant]:
        """The fleet's tenants, resolved once (``FLEET_INVALID`` naming what is wrong). A
        cluster that does not answer is left out and reported by :meth:`status`."""
        if self._tenants is None:
            unreachable: dict[str, ConnectionFailedError] = {}
            self._tenants = resolve_tenants(self.fleet_config, self._clients, self._pattern,
                                            unreachable=unreachable)
            self._unreachable = unreachable
        return list(self._tenants)

    @property
    def unreachable_clusters(self) -> dict[str, ConnectionFailedError]:
        """Clusters whose tenants could not be listed (after :meth:`tenants`)."""
        return dict(self._unreachable)

    def migrator(self, tenant: Tenant) -> Migrator:
        """The tenant's ordinary :class:`~migronaut.api.Migrator` — what ``migronaut --db
        TENANT`` works with — on its cluster's shared client (``CONNECTION_FAILED`` when the
        cluster does not answer). Close it after use (the shared client stays open)."""
        config = self._clients.tenant_config(tenant.cluster, tenant.name)
        if self._tenant_logger is not DEFAULT_LOGGER:
            config = replace(config, logger=self._tenant_logger)
        return TenantMigrator(config)

    def tenant_status(self, tenant: Tenant) -> TenantStatus:
        """One tenant's status (the ordinary ``status`` over its database)."""
        return read_tenant_status(tenant, self.migrator)

    def status(self, *, concurrency: int | None = None) -> FleetStatus:
        """Every tenant's state, read ``concurrency`` tenants at a time (default: the fleet's
        ``concurrency``)."""
        tenants = self.tenants()
        statuses = self._map(self.tenant_status, tenants, concurrency)
        return FleetStatus(statuses, {name: error.to_dict()
                                      for name, error in self._unreachable.items()})

    def _map(self, fn: Callable[[Tenant], R], tenants: list[Tenant],
             concurrency: int | None) -> list[R]:
        workers = max(1, min(concurrency or self.fleet_config.concurrency, len(tenants) or 1))
        if workers == 1:
            return [fn(tenant) for tenant in tenants]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="migronaut-fleet") as pool:
            return list(pool.map(fn, tenants))

    # -- events ---------------------------------------------------------------------------------
    def on(self, event: str, listener: Listener) -> Fleet:
        """Listen to ``fleet:start``, ``fleet:tenant:start``, ``fleet:tenant:end``,
        ``fleet:end`` (or ``*``)."""
        self._events.on(event, listener)
        return self

    def off(self, event: str, listener: Listener) -> Fleet:
        self._events.off(event, listener)
        return self

    # -- runs -----------------------------------------------------------------------------------
    def policy(self, **overrides: Any) -> FleetPolicy:
        """The config's ``[fleet]`` policy with ``overrides`` (``None`` values ignored), checked
        like the config keys (``CONFIG_INVALID`` naming the option)."""
        values: dict[str, Any] = {}
        for key, value in overrides.items():
            if value is None:
                continue
            if key == "seed":
                values[key] = value
                continue
            if key not in RUN_KEYS:
                close = suggest(key, RUN_KEYS)
                raise ConfigInvalidError(
                    f"Unknown fleet option {key!r}" + (f" (did you mean '{close}'?)"
                                                       if close else ""), {"option": key})
            checked, problem = check_policy_value(key, value)
            if problem:
                raise ConfigInvalidError(f"Invalid fleet option {key}: {problem}",
                                         {"option": key})
            values[key] = checked
        return replace(self.fleet_config.policy(), **values)

    def up(self, **policy: Any) -> FleetResult:
        """``up`` in every tenant (an up-to-date tenant costs one status read)."""
        return self._run("up", {}, policy)

    def down(self, *, steps: int = 1, **policy: Any) -> FleetResult:
        """``down --steps N`` in every tenant."""
        if not is_int(steps) or steps < 1:
            raise ConfigInvalidError(f"steps must be a positive integer (got {steps!r})",
                                     {"option": "steps"})
        return self._run("down", {"steps": steps}, policy)

    def converge(self, **policy: Any) -> FleetResult:
        """``converge`` (the declared collections) in every tenant."""
        return self._run("converge", {}, policy)

    def audit(self, **policy: Any) -> FleetResult:
        """The read-only ``audit`` in every tenant; a tenant whose audit fails is ``failed``
        (``AUDIT_FAILED`` with its report)."""
        return self._run("audit", {}, policy)

    def stop(self, reason: str = "Fleet run stopped by request") -> None:
        """Start no more tenants; running ones finish their migration in flight and stop."""
        self._stop.set()
        run = self._current
        if run is not None:
            run.stop(reason)

    def _run(self, command: str, arguments: dict[str, Any], overrides: dict[str, Any]
             ) -> FleetResult:
        policy = self.policy(**overrides)
        tenants = self.tenants()
        store = self.run_store()
        run = FleetRun(
            command=command, tenants=tenants, policy=policy,
            work=operation(command, **arguments), migrator=self.migrator, store=store,
            events=self._events, telemetry=self.telemetry,
            options={**policy.to_json(), **arguments, "tenants": self._pattern},
            sizes=self._sizes, stop=self._stop)
        self._current = run
        clock = time.monotonic()
        try:
            outcomes, started, ended = run.run()
        finally:
            self._current = None
            self._stop.clear()  # a stop ends this run, not the fleet's next one
        result = FleetResult(run.run_id, command, policy, outcomes, started, ended,
                             {name: error.to_dict() for name, error in self._unreachable.items()})
        store.end(result.outcome)
        self._events.emit("fleet:end", {
            "runId": run.run_id, "command": command, "ok": result.ok,
            "outcome": result.outcome, "counts": result.counts(),
            "failed": [o.tenant.name for o in result.failed],
            "durationMs": int((time.monotonic() - clock) * 1000)})
        return result

    def _sizes(self, tenants: list[Tenant]) -> dict[Tenant, int]:
        """Each tenant's data size (``dbStats``) for ``order="size"``; unknown when its
        cluster does not answer."""
        from pymongo.errors import PyMongoError

        out: dict[Tenant, int] = {}
        for tenant in tenants:
            try:
                stats = self._clients.get(tenant.cluster)[tenant.name].command("dbStats")
                out[tenant] = int(stats.get("dataSize", 0))
            except (MigronautError, PyMongoError):
                continue
        return out

    # -- run records ----------------------------------------------------------------------------
    def run_store(self) -> FleetRunStore:
        """The fleet run records, in ``admin_db`` on the ``default`` cluster (else the
        first one)."""
        from migronaut.core.reads import primary

        fleet = self.fleet_config
        cluster = fleet.clusters[0].name
        client = self._clients.get(cluster)
        return FleetRunStore(primary(client[fleet.admin_db])[fleet.runs_collection])

    def runs(self, limit: int = 20) -> list[FleetRunRecord]:
        """The newest fleet run records, newest first."""
        return self.run_store().runs(limit)

    def logs(self, run_id: str | None = None) -> FleetRunRecord:
        """A fleet run record by id or unique prefix (``None``: the newest); a run that is
        not found is ``FLEET_INVALID`` naming it."""
        record = self.run_store().get(run_id)
        if record is None:
            raise FleetInvalidError(
                f"No fleet run {run_id!r} in {self.fleet_config.admin_db}."
                f"{self.fleet_config.runs_collection}" if run_id else
                "No fleet run recorded yet", {"runId": run_id})
        return record

    @functools.cached_property
    def telemetry(self) -> Telemetry:
        """The ``telemetry`` config resolved (a span per tenant of a run)."""
        return resolve_telemetry(self.config.telemetry, namespace=None)

    def close(self) -> None:
        """Close the clusters' clients (never a client injected through the config)."""
        self._clients.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncFleet:
    """The asyncio twin of :class:`Fleet`: the same operations and results, each run in a
    worker thread so the event loop never blocks (like :class:`~migronaut.aio.AsyncMigrator`).
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None = None,
        *,
        tenants: str | None = None,
        config_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **overrides: Any,
    ) -> None:
        self._fleet = Fleet(config, tenants=tenants, config_path=config_path, cwd=cwd,
                            **overrides)

    @property
    def config(self) -> Config:
        return self._fleet.config

    @property
    def sync(self) -> Fleet:
        """The synchronous fleet underneath."""
        return self._fleet

    def on(self, event: str, listener: Listener) -> AsyncFleet:
        self._fleet.on(event, listener)
        return self

    def off(self, event: str, listener: Listener) -> AsyncFleet:
        self._fleet.off(event, listener)
        return self

    async def tenants(self) -> list[Tenant]:
        return await asyncio.to_thread(self._fleet.tenants)

    async def status(self, *, concurrency: int | None = None) -> FleetStatus:
        return await asyncio.to_thread(lambda: self._fleet.status(concurrency=concurrency))

    async def up(self, **policy: Any) -> FleetResult:
        """``Fleet.up``; cancelling the awaiting task stops the run (running tenants finish
        their migration in flight) and re-raises once it has ended."""
        return await off_loop(self._fleet.stop, lambda: self._fleet.up(**policy))

    async def down(self, *, steps: int = 1, **policy: Any) -> FleetResult:
        return await off_loop(self._fleet.stop, lambda: self._fleet.down(steps=steps, **policy))

    async def converge(self, **policy: Any) -> FleetResult:
        return await off_loop(self._fleet.stop, lambda: self._fleet.converge(**policy))

    async def audit(self, **policy: Any) -> FleetResult:
        return await off_loop(self._fleet.stop, lambda: self._fleet.audit(**policy))

    async def runs(self, limit: int = 20) -> list[FleetRunRecord]:
        return await asyncio.to_thread(lambda: self._fleet.runs(limit))

    async def logs(self, run_id: str | None = None) -> FleetRunRecord:
        return await asyncio.to_thread(lambda: self._fleet.logs(run_id))

    def stop(self, reason: str = "Fleet run stopped by request") -> None:
        self._fleet.stop(reason)

    async def close(self) -> None:
        await asyncio.to_thread(self._fleet.close)

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
