"""The fleet API: :class:`Fleet` (sync) and :class:`AsyncFleet`.

A façade like :class:`~migronaut.api.Migrator`: it resolves the configuration, the tenants and
the clusters' shared clients, and hands the work to the module that owns it (:mod:`.status` for
``status``, :mod:`.runner` for the runs, :mod:`.runs` for the run records). The CLI's ``fleet``
commands call it and only render.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from migronaut.api import Migrator
from migronaut.core.config import Config, load_config, with_overrides
from migronaut.errors import ConfigInvalidError, ConnectionFailedError
from migronaut.fleet.clients import ClusterClients, SharedClientConnection
from migronaut.fleet.status import FleetStatus, TenantStatus, read_tenant_status
from migronaut.fleet.tenants import Tenant, resolve_tenants

if TYPE_CHECKING:
    from migronaut.fleet.config import FleetConfig

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
        _quick_connect: bool = False,
        _flags_origin: Literal["flag", "argument"] = "argument",
        **overrides: Any,
    ) -> None:
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
        return TenantMigrator(self._clients.tenant_config(tenant.cluster, tenant.name))

    def tenant_status(self, tenant: Tenant) -> TenantStatus:
        """One tenant's status (the ordinary ``status`` over its database)."""
        try:
            migrator = self.migrator(tenant)
        except ConnectionFailedError as error:
            from migronaut.fleet.status import UNREACHABLE

            return TenantStatus(tenant, UNREACHABLE, 0, 0, error.to_dict())
        with migrator:
            return read_tenant_status(tenant, migrator)

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

    async def tenants(self) -> list[Tenant]:
        return await asyncio.to_thread(self._fleet.tenants)

    async def status(self, *, concurrency: int | None = None) -> FleetStatus:
        return await asyncio.to_thread(lambda: self._fleet.status(concurrency=concurrency))

    async def close(self) -> None:
        await asyncio.to_thread(self._fleet.close)

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
