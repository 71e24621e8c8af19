"""The connection of one migrator and the handles of migronaut's own state on it.

Owns the ``MongoClient`` (made from the URI and ``client_options``, or the injected ``client``
config key), the database migrations work on (``ctx.db``, with the URI's read preference), the same
database for migronaut's state (primary reads, :mod:`migronaut.core.reads`), the changelog, lock
and run-record handles, the run recorder, and where a run's ``async def`` bodies go (an
:class:`~migronaut.core.async_bridge.AsyncBridge`).

Invariants: connecting creates nothing (read-only commands need only read roles; the changelog
indexes come with the first run that may write it, once per client and database in a process,
:mod:`migronaut._ensured`); an injected client
is never closed; a failure to connect is ``CONNECTION_FAILED`` naming the masked URI and the
setting it came from. :class:`Connection` is the synchronous engine's; the asyncio API subclasses
it (:meth:`Connection.injected_client`, :meth:`Connection.new_bridge`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from migronaut._redact import redact
from migronaut.core.changelog import Changelog, ChangelogRead
from migronaut.core.project import executed_by
from migronaut.errors import ConfigInvalidError, ConnectionFailedError, describe_exception

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.core.async_bridge import AsyncBridge
    from migronaut.core.project import Project
    from migronaut.observability.recorder import RunRecorder
    from migronaut.observability.runstore import RunStore

__all__ = ["QUICK_SELECTION_MS", "SELECTION_MS", "Connection"]

#: How long the driver looks for a server before a command fails, unless
#: ``server_selection_timeout_ms`` (or the URI) says otherwise: runs ride out a failover …
SELECTION_MS = 10_000
#: … and a short read-only command of the CLI (``status``, ``audit`` …) says at once that
#: nothing answers.
QUICK_SELECTION_MS = 3_000
#: Hosts of a URI that point at this machine: a refused connection there suggests the dev server.
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1", "0.0.0.0")


class Connection:
    """One client (connected on first use, idempotently) and the handles bound to it."""

    def __init__(self, project: Project) -> None:
        self._project = project
        self._client: MongoClient[dict[str, Any]] | None = None
        self._owns_client = False
        self._state_db: Database[dict[str, Any]] | None = None
        self._changelog: Changelog | None = None
        #: this connection's own runs ensured the changelog indexes (not only another's)
        self._ensured_here = False
        self._recorder: RunRecorder | None = None

    @property
    def connected(self) -> bool:
        return self._client is not None

    def connect(self) -> None:
        """Connect (idempotent) and ping. Creates nothing."""
        if self._client is not None:
            return
        config = self._project.config
        from pymongo import MongoClient
        from pymongo.errors import PyMongoError

        from migronaut.core.retry import retry_transient

        if config.client is not None:
            client, owned = self.injected_client(config.client)
        else:
            options = self.client_options()
            weak = [k for k in ("tlsInsecure", "tlsAllowInvalidCertificates",
                                "tlsAllowInvalidHostnames") if options.get(k)]
            if weak:
                self._project.logger.warning(
                    "⚠ client_options disables TLS verification (%s) — connections are exposed "
                    "to interception", ", ".join(weak)
                )
            try:
                client, owned = MongoClient(config.uri, **options), True
            except (PyMongoError, ValueError, TypeError) as error:
                raise self._connection_failed(error) from error
        try:
            # a connection cut mid-ping is ridden out; an unreachable server is not (it has
            # already waited serverSelectionTimeoutMS)
            retry_transient(lambda: client.admin.command("ping"))
            self._client, self._owns_client = client, owned
        except PyMongoError as error:
            self._client = None
            if owned:
                client.close()
            raise self._connection_failed(error) from error
        self._project.logger.debug("Connected to MongoDB (db: %s)", config.db_name)

    def _connection_failed(self, error: BaseException) -> ConnectionFailedError:
        """``CONNECTION_FAILED`` naming the (masked) URI and the setting it came from, with the
        driver's reason but not its topology dump (the cause, shown by ``--verbose``, has it)."""
        config = self._project.config
        reason = describe_exception(error).split(", Topology Description:")[0]
        if config.client is not None:
            target = "with the injected client (client)"
            context: dict[str, Any] = {"cause": reason}
        else:
            uri = redact(config.uri or "")
            origin = config.origin("uri")
            target = f"at {uri} (uri from {origin})"
            context = {"uri": uri, "uriFrom": origin, "cause": reason}
        hint = ""
        if config.client is None and _is_local(config.uri or "") and "refused" in reason.lower():
            hint = (" — nothing listens there: start a local server with `migronaut dev-server` "
                    "(the 'embedded' extra), or point uri at your MongoDB")
        return ConnectionFailedError(
            f"Failed to connect to MongoDB {target}: {reason}{hint}", context, cause=error
        )

    def client_options(self) -> dict[str, Any]:
        """The client's keyword arguments: migronaut's defaults never override what the URI
        sets (pymongo keyword arguments win over URI options); the ``connect_timeout_ms`` and
        ``server_selection_timeout_ms`` keys do; ``client_options`` wins over all."""
        project = self._project
        config = project.config
        query = (config.uri or "").partition("?")[2].lower()
        selection = QUICK_SELECTION_MS if project.quick_connect else SELECTION_MS
        options: dict[str, Any] = {
            key: value
            for key, value in (("serverSelectionTimeoutMS", selection), ("appname", "migronaut"))
            if f"{key.lower()}=" not in query
        }
        for key, value in (("serverSelectionTimeoutMS", config.server_selection_timeout_ms),
                           ("connectTimeoutMS", config.connect_timeout_ms)):
            if value is not None:
                options[key] = value
        options.update(config.client_options or {})
        return options

    def injected_client(self, client: Any) -> tuple[MongoClient[dict[str, Any]], bool]:
        """The engine's client from the ``client`` config key, and whether it is ours to close
        (the asyncio API overrides this)."""
        from pymongo import MongoClient

        if not isinstance(client, MongoClient):
            hint = " (use AsyncMigrator for an AsyncMongoClient)" \
                if type(client).__name__ == "AsyncMongoClient" else ""
            raise ConfigInvalidError(
                f"Invalid configuration: client must be a pymongo MongoClient, got "
                f"{type(client).__name__}{hint}",
                {"issues": [{"path": "client", "message": "must be a pymongo MongoClient"}]},
            )
        return client, False

    def new_bridge(self) -> AsyncBridge:
        """Where ``async def`` bodies of a run go: a private loop, with an ``AsyncMongoClient``
        of the same URI and options (or a twin of the injected client) made for the run."""
        from pymongo import AsyncMongoClient

        from migronaut.core.async_bridge import AsyncBridge, twin_client

        config = self._project.config
        if config.client is not None:
            injected = config.client
            return AsyncBridge(client_factory=lambda: twin_client(injected, AsyncMongoClient))
        options = self.client_options()
        return AsyncBridge(client_factory=lambda: AsyncMongoClient(config.uri, **options))

    def close(self) -> None:
        """Disconnect; an injected client is never closed."""
        client, self._client = self._client, None
        self._state_db = None
        self._changelog = None
        if client is not None and self._owns_client:
            with contextlib.suppress(Exception):
                client.close()

    @property
    def client(self) -> MongoClient[dict[str, Any]]:
        self.connect()
        assert self._client is not None
        return self._client

    @property
    def db(self) -> Database[dict[str, Any]]:
        """The database migrations work on (``ctx.db``), with the URI's read preference."""
        return self.client[self._project.config.db_name or ""]

    @property
    def state_db(self) -> Database[dict[str, Any]]:
        """The same database for migronaut's own state: reads go to the primary."""
        if self._state_db is None or self._client is None:
            from migronaut.core.reads import primary

            self._state_db = primary(self.db)
        return self._state_db

    @property
    def changelog(self) -> Changelog:
        """The changelog of :attr:`state_db`, made once per connection (a run reads and writes
        it per migration)."""
        state_db = self.state_db
        changelog = self._changelog
        if changelog is None or changelog.collection.database is not state_db:
            changelog = Changelog(state_db[self._project.config.migrations_collection])
            self._changelog = changelog
        return changelog

    @property
    def lock_collection(self) -> Collection[dict[str, Any]]:
        return self.state_db[self._project.config.lock_collection]

    def ensure_changelog_indexes(self) -> bool:
        """The changelog indexes, once per (client, database) in this process, by the first run
        that may write it (under its lock); duplicate names stopping the unique one are
        ``STATE_INVALID``. True when ``createIndexes`` was sent now."""
        from pymongo.errors import PyMongoError

        from migronaut._ensured import ensure_once

        if not self._project.config.ensure_indexes:
            return False
        from migronaut.core.retry import as_connection_failed

        changelog = self.changelog
        try:
            return ensure_once(self.client, changelog.collection.database.name,
                               changelog.collection.name, changelog.ensure_indexes)
        except PyMongoError as error:
            raise as_connection_failed(error) or ConnectionFailedError(
                f"Failed to create the changelog indexes: {describe_exception(error)}",
                cause=error,
            ) from error

    def prepare_changelog(self, *, read: bool) -> ChangelogRead | None:
        """Under a run's lock, before its work: the changelog indexes (once per client and
        database in this process) and, with ``read``, every record in one checked read
        (:meth:`Changelog.read`). When the indexes were ensured before by another connection
        of this process, or ``read`` finds no record, an empty changelog (a database dropped
        since, indexes and all) gets them again: nothing is written without them."""
        sent = self.ensure_changelog_indexes()
        ensured_here, self._ensured_here = self._ensured_here, True
        found = self.changelog.read() if read else None
        if sent or not self._project.config.ensure_indexes:
            return found
        if found is not None:
            empty = found.empty
        else:
            empty = not ensured_here and self.changelog.is_empty()
        if empty:
            self.ensure_indexes_again()
        return found

    def ensure_indexes_again(self) -> None:
        """After a changelog read under the lock found no record although this process ensured
        its indexes before: the database may have been dropped since, so every index migronaut
        ensures there is sent again (changelog now, run records with this run's next write)."""
        from migronaut._ensured import forget

        forget(self.client, self.state_db.name)
        self.ensure_changelog_indexes()
        if self._recorder is not None:
            self._recorder.ensure_indexes()

    @property
    def run_store(self) -> RunStore:
        """The run records and their log lines (``runs_collection``)."""
        from migronaut.observability.runstore import RunStore

        return RunStore(self.state_db, self._project.config.runs_collection)

    @property
    def recorder(self) -> RunRecorder:
        """Writes each run's record and log lines (or only logs, ``record_runs`` off)."""
        if self._recorder is None:
            from migronaut.observability.recorder import RunRecorder

            project = self._project
            config = project.config
            self._recorder = RunRecorder(
                self.run_store if config.record_runs else None, logger=project.logger,
                ensure_indexes=config.ensure_indexes, executed_by=executed_by(),
                environment=config.resolved_environment,
            )
        return self._recorder


def _is_local(uri: str) -> bool:
    """Whether every host of a ``mongodb://`` URI is this machine (never for ``+srv``)."""
    if not uri.lower().startswith("mongodb://"):
        return False
    hosts = uri[len("mongodb://"):].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    names = [host.rsplit(":", 1)[0] if not host.startswith("[") else host.partition("]")[0] + "]"
             for host in hosts.split(",") if host]
    return bool(names) and all(name.lower() in _LOCAL_HOSTS for name in names)
