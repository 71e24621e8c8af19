"""One ``MongoClient`` per cluster of a fleet, shared by every tenant on it.

A tenant is one database: opening a connection pool per tenant would cost a pool (and its
monitor threads) per tenant for no gain, so every tenant of a cluster borrows the cluster's client
(the ``client`` config key of its :class:`~migronaut.api.Migrator`, which never closes an injected
client). Each client is made lazily through the ordinary
:class:`~migronaut.core.connection.Connection` — same options as the CLI's connection, same
``CONNECTION_FAILED`` message naming the masked URI — and a cluster that cannot be reached fails
only its own tenants: the failure is kept and handed to each of them without asking again.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from migronaut.core.connection import Connection
from migronaut.core.project import Project
from migronaut.errors import ConfigInvalidError, ConnectionFailedError

if TYPE_CHECKING:
    from pymongo import MongoClient

    from migronaut.core.config import Config
    from migronaut.fleet.config import FleetConfig

__all__ = ["ClusterClients", "SharedClientConnection"]


class SharedClientConnection(Connection):
    """A tenant migrator's connection on its cluster's shared client: the client was pinged
    once for the whole cluster, so connecting a tenant sends nothing."""

    def connect(self) -> None:
        if self._client is None:
            self._client, self._owns_client = self.injected_client(self._project.config.client)


class ClusterClients:
    """The clients of a fleet's clusters, made on first use; :meth:`close` closes those made
    here (never a client injected through the config)."""

    def __init__(self, config: Config, *, quick_connect: bool = False) -> None:
        if config.fleet is None:
            raise _no_fleet()
        self._config = config
        self._fleet: FleetConfig = config.fleet
        self._quick = quick_connect
        self._connections: dict[str, Connection] = {}
        self._failures: dict[str, ConnectionFailedError] = {}
        self._lock = threading.Lock()
        #: one lock per cluster: a slow (unreachable) cluster never holds another one up
        self._cluster_locks: dict[str, threading.Lock] = {}

    @property
    def fleet(self) -> FleetConfig:
        return self._fleet

    @property
    def cwd(self) -> str:
        """The project's directory (a tenant ``callable`` is importable from there)."""
        return self._config.cwd

    def cluster_config(self, cluster: str) -> Config:
        """The config of ``cluster``: the fleet's config on that cluster's ``uri``."""
        uri = self._fleet.cluster(cluster).uri
        if uri is None:
            return self._config
        return replace(self._config, uri=uri, client=None,
                       origins={**self._config.origins, "uri": f"file:fleet.clusters.{cluster}"})

    def get(self, cluster: str) -> MongoClient[dict[str, Any]]:
        """The cluster's client, connected (pinged) once; an unreachable cluster raises its
        ``CONNECTION_FAILED`` again on every call without trying again."""
        with self._lock:
            failure = self._failures.get(cluster)
            if failure is not None:
                raise failure
            connection = self._connections.get(cluster)
            if connection is None:
                config = self.cluster_config(cluster)
                if not config.uri and config.client is None:
                    raise ConfigInvalidError(
                        f"Invalid configuration: the fleet's cluster '{cluster}' has no uri "
                        "(set uri, MIGRONAUT_URI or --uri)",
                        {"issues": [{"path": "uri", "message": "uri is required"}],
                         "cluster": cluster})
                project = Project(config, {}, config_path=None, cwd=None,
                                  flags_origin="argument")
                project.quick_connect = self._quick
                connection = Connection(project)
                self._connections[cluster] = connection
                self._cluster_locks[cluster] = threading.Lock()
            cluster_lock = self._cluster_locks[cluster]
        with cluster_lock:
            failure = self._failures.get(cluster)
            if failure is not None:
                raise failure
            try:
                connection.connect()  # idempotent; pings once
            except ConnectionFailedError as error:
                self._failures[cluster] = error
                raise
            return connection.client

    def tenant_config(self, cluster: str, name: str) -> Config:
        """The config of one tenant's ordinary migrator: its cluster's, on the tenant's
        database ``name``, with the cluster's shared client injected (a migrator never closes
        an injected client). ``CONNECTION_FAILED`` when the cluster does not answer."""
        config = self.cluster_config(cluster)
        return replace(config, db_name=name, client=self.get(cluster),
                       origins={**config.origins, "db_name": "argument"})

    def failure(self, cluster: str) -> ConnectionFailedError | None:
        """The ``CONNECTION_FAILED`` of a cluster found unreachable, else ``None``."""
        return self._failures.get(cluster)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, {}
            self._failures.clear()
        for connection in connections.values():
            connection.close()

    def __enter__(self) -> ClusterClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _no_fleet() -> ConfigInvalidError:
    return ConfigInvalidError(
        "Invalid configuration: no fleet is configured (add a [fleet] table naming the tenants)",
        {"issues": [{"path": "fleet", "message": "no [fleet] table"}]})
