"""The programmatic API: :class:`Migrator`, :func:`run_migrations`, :func:`pending_migrations`.

Every CLI command is a method here; the CLI only parses flags, calls it, renders the result and
picks the exit code, so the two cannot drift. A :class:`Migrator` owns one connection and at most
one run at a time; a run is one lock acquisition around one command.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from migronaut._redact import redact
from migronaut.core.changelog import Changelog, applied_write, reverted_write
from migronaut.core.config import DEFAULT_LOGGER, Config, load_config
from migronaut.core.context import Cancellation, MigrationContext, RunInfo
from migronaut.core.files import ChecksumCache, discover, load_migrations
from migronaut.core.hooks import Hooks, call_hook, normalise_hooks
from migronaut.core.lock import MigrationLock, force_release, read_lock_status
from migronaut.core.plan import (
    build_status_rows,
    check_forward_only,
    plan_down,
    plan_up,
    validate_actor,
    validate_down_options,
    validate_up_options,
)
from migronaut.core.results import (
    AuditReport,
    BaselineResult,
    ImportResult,
    LockInfo,
    LockStatus,
    MigrationSummary,
    RunResult,
    StatusRow,
)
from migronaut.core.retry import as_connection_failed
from migronaut.core.runner import execute
from migronaut.errors import (
    BackgroundPendingError,
    ChecksumMismatchError,
    ConfigInvalidError,
    ConnectionFailedError,
    LockAlreadyHeldError,
    LockLostError,
    MigronautError,
    RunAbortedError,
    describe_exception,
)
from migronaut.observability.events import EventBus, Listener
from migronaut.observability.telemetry import NO_RUN, RunTrace, Telemetry, resolve_telemetry

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.client_session import ClientSession
    from pymongo.database import Database

    from migronaut.background.engine import BackgroundEngine
    from migronaut.core.adopt import Adoption
    from migronaut.core.async_bridge import AsyncBridge
    from migronaut.core.files import MigrationModule
    from migronaut.observability.history import RunLog, RunRecord
    from migronaut.observability.recorder import RunRecorder, RunRecording
    from migronaut.observability.runstore import RunStore

__all__ = [
    "Migrator",
    "ProgressReporter",
    "pending_migrations",
    "run_migrations",
]

Direction = Literal["up", "down"]
AdoptionResult = TypeVar("AdoptionResult", ImportResult, BaselineResult)
StatusFilter = Literal["all", "pending", "applied"]


class ProgressReporter(Protocol):
    """Receives the start and end of each migration (the CLI's spinner)."""

    def on_start(self, name: str, direction: str) -> None: ...

    def on_stop(self, outcome: str) -> None: ...


def executed_by() -> str:
    """``MIGRONAUT_USER``, else the OS user, else ``unknown`` (distroless containers)."""
    override = os.environ.get("MIGRONAUT_USER")
    if override:
        return override
    try:
        return getpass.getuser()
    except Exception:
        return os.environ.get("USER") or os.environ.get("USERNAME") or "unknown"


def _null_logger() -> logging.Logger:
    logger = logging.getLogger("migronaut.null")
    logger.propagate = False
    logger.disabled = True
    return logger


def _logger_of(config: Config) -> logging.Logger:
    """The configured logger: ``migronaut``'s by default, a silenced one for ``None``."""
    configured = config.logger
    if configured is DEFAULT_LOGGER:
        return logging.getLogger("migronaut")
    if configured is None:
        return _null_logger()
    return configured  # type: ignore[no-any-return]


@dataclass
class _Run:
    """The state of one run: its id, lock, cancellation and the results so far."""

    id: str
    command: str
    cancellation: Cancellation
    lock: MigrationLock | None = None
    results: list[RunResult] = field(default_factory=list)
    requested_by: str | None = None
    reason: str | None = None
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


class _WaitingForBackground(Exception):
    """Ends an ``up`` run cleanly before a migration whose background requirements are not done
    (``on_background_pending="stop"``); caught by the run loop."""


class Migrator:
    """Runs migrations against one database.

    ``config`` is a resolved :class:`~migronaut.core.config.Config` or a mapping of config keys
    (the flags tier: it wins over environment and config file); keyword arguments are config keys
    too. Use it as a context manager, or call :meth:`close`::

        with Migrator(uri="mongodb://localhost:27017", db_name="app") as migrator:
            migrator.up()
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None = None,
        *,
        config_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        progress: ProgressReporter | None = None,
        _flags_origin: Literal["flag", "argument"] = "argument",
        **overrides: Any,
    ) -> None:
        self._flags: dict[str, Any] = {}
        self._flags_origin = _flags_origin
        self._config: Config | None = None
        self._config_warned = False
        if isinstance(config, Config):
            self._config = config
        elif config is not None:
            self._flags.update(config)
        self._flags.update(overrides)
        self._config_path = config_path
        self._cwd = cwd
        self._progress = progress
        self._events = EventBus()
        self._client: MongoClient[dict[str, Any]] | None = None
        self._owns_client = False
        self._indexes_ensured = False
        self._checksums = ChecksumCache()
        self._state_lock = threading.Lock()
        self._run: _Run | None = None
        #: what the last ``up`` with ``on_background_pending="stop"`` stopped at
        self._waiting: list[dict[str, Any]] = []
        self._busy = 0
        self._latched_stop: str | None = None
        self._logger: logging.Logger | None = None
        self._background: BackgroundEngine | None = None
        self._state_db: Database[dict[str, Any]] | None = None
        self._directory: Path | None = None
        self._recorder: RunRecorder | None = None
        #: Problems that did not stop a command (e.g. a config file skipped by ``create``).
        self.warnings: list[str] = []

    # -- configuration and connection ---------------------------------------------------------
    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self._flags, config_path=self._config_path, cwd=self._cwd,
                                       flags_origin=self._flags_origin)
        self._warn_unsupported(self._config)
        return self._config

    def _warn_unsupported(self, config: Config) -> None:
        """Config keys that do nothing yet: one warning per migrator, whichever command runs."""
        if self._config_warned:
            return
        self._config_warned = True
        warning = config.unsupported_warning()
        if warning is not None:
            _logger_of(config).warning(warning, extra={"event": "config:unsupported"})

    @property
    def logger(self) -> logging.Logger:
        if self._logger is None:
            self._logger = _logger_of(self.config)
        return self._logger

    @property
    def hooks(self) -> Hooks:
        return normalise_hooks(self.config.hooks)

    @functools.cached_property
    def telemetry(self) -> Telemetry:
        """The ``telemetry`` config resolved (OpenTelemetry spans and metrics; no-op unset)."""
        return resolve_telemetry(self.config.telemetry, namespace=self.config.db_name)

    def connect(self) -> None:
        """Connect (idempotent). Creates nothing: read-only commands need only read roles; the
        changelog indexes come with the first run that may write it
        (:meth:`_ensure_changelog_indexes`)."""
        if self._client is not None:
            return
        config = self.config
        from pymongo import MongoClient
        from pymongo.errors import PyMongoError

        if config.client is not None:
            client, owned = self._injected_client(config.client)
        else:
            options = self._client_options()
            weak = [k for k in ("tlsInsecure", "tlsAllowInvalidCertificates",
                                "tlsAllowInvalidHostnames") if options.get(k)]
            if weak:
                self.logger.warning(
                    "⚠ client_options disables TLS verification (%s) — connections are exposed "
                    "to interception", ", ".join(weak)
                )
            try:
                client, owned = MongoClient(config.uri, **options), True
            except (PyMongoError, ValueError, TypeError) as error:
                raise self._connection_failed(error) from error
        try:
            client.admin.command("ping")
            self._client, self._owns_client = client, owned
        except PyMongoError as error:
            self._client = None
            if owned:
                client.close()
            raise self._connection_failed(error) from error
        self.logger.debug("Connected to MongoDB (db: %s)", config.db_name)

    def _connection_failed(self, error: BaseException) -> ConnectionFailedError:
        """``CONNECTION_FAILED`` naming the (masked) URI and the setting it came from, with the
        driver's reason but not its topology dump (the cause, shown by ``--verbose``, has it)."""
        config = self.config
        reason = describe_exception(error).split(", Topology Description:")[0]
        if config.client is not None:
            target = "with the injected client (client)"
            context: dict[str, Any] = {"cause": reason}
        else:
            uri = redact(config.uri or "")
            origin = config.origin("uri")
            target = f"at {uri} (uri from {origin})"
            context = {"uri": uri, "uriFrom": origin, "cause": reason}
        return ConnectionFailedError(
            f"Failed to connect to MongoDB {target}: {reason}", context, cause=error
        )

    def _client_options(self) -> dict[str, Any]:
        """The client's keyword arguments: migronaut's defaults never override what the URI
        sets (pymongo keyword arguments win over URI options), then ``client_options``."""
        config = self.config
        query = (config.uri or "").partition("?")[2].lower()
        options: dict[str, Any] = {
            key: value
            for key, value in (("serverSelectionTimeoutMS", 10_000), ("appname", "migronaut"))
            if f"{key.lower()}=" not in query
        }
        options.update(config.client_options or {})
        return options

    def _injected_client(self, client: Any) -> tuple[MongoClient[dict[str, Any]], bool]:
        """The engine's client from the ``client`` config key (``AsyncMigrator`` overrides)."""
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

    def _new_bridge(self) -> AsyncBridge:
        """Where ``async def`` bodies of a run go: a private loop, with an ``AsyncMongoClient``
        of the same URI and options (or a twin of the injected client) made for the run."""
        from pymongo import AsyncMongoClient

        from migronaut.core.async_bridge import AsyncBridge, twin_client

        config = self.config
        if config.client is not None:
            injected = config.client
            return AsyncBridge(client_factory=lambda: twin_client(injected, AsyncMongoClient))
        options = self._client_options()
        return AsyncBridge(client_factory=lambda: AsyncMongoClient(config.uri, **options))

    def close(self) -> None:
        """Disconnect; an injected client is never closed."""
        client, self._client = self._client, None
        self._background = None  # bound to the client: a later connect builds a fresh one
        self._state_db = None
        if client is not None and self._owns_client:
            try:
                client.close()
            except Exception:
                pass

    disconnect = close

    def __enter__(self) -> Migrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> MongoClient[dict[str, Any]]:
        self.connect()
        assert self._client is not None
        return self._client

    @property
    def db(self) -> Database[dict[str, Any]]:
        """The database migrations work on (``ctx.db``), with the URI's read preference."""
        return self.client[self.config.db_name or ""]

    @property
    def state_db(self) -> Database[dict[str, Any]]:
        """The same database for migronaut's own state: reads go to the primary."""
        if self._state_db is None or self._client is None:
            from migronaut.core.reads import primary

            self._state_db = primary(self.db)
        return self._state_db

    @property
    def changelog(self) -> Changelog:
        return Changelog(self.state_db[self.config.migrations_collection])

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = self.config.migrations_path  # resolved once: hot in status/up
        return self._directory

    def files(self) -> list[str]:
        """The migration files on disk, in run order (a missing directory is CONFIG_INVALID)."""
        return discover(self.directory, self.config.file_extensions,
                        origin=self.config.origin("migrations_dir"))

    def checksum(self, name: str) -> str | None:
        return self._checksums.checksum(self.directory / name)

    # -- events -------------------------------------------------------------------------------
    def on(self, event: str, listener: Listener) -> Migrator:
        """Listen to a lifecycle event (``run:start``, ``migration:success``, … or ``*``)."""
        self._events.on(event, listener)
        return self

    def off(self, event: str, listener: Listener) -> Migrator:
        self._events.off(event, listener)
        return self

    def _emit(self, event: str, **payload: Any) -> None:
        run = self._run
        if run is not None:
            payload.setdefault("runId", run.id)
            if run.recording is not None:
                run.recording.observe(event, payload)
        self._events.emit(event, payload)

    # -- run history ----------------------------------------------------------------------------
    @property
    def run_store(self) -> RunStore:
        """The run records and their log lines (``runs_collection``)."""
        from migronaut.observability.runstore import RunStore

        return RunStore(self.state_db, self.config.runs_collection)

    @property
    def recorder(self) -> RunRecorder:
        if self._recorder is None:
            from migronaut.observability.recorder import RunRecorder

            config = self.config
            self._recorder = RunRecorder(
                self.run_store if config.record_runs else None, logger=self.logger,
                ensure_indexes=config.ensure_indexes, executed_by=executed_by(),
                environment=config.resolved_environment,
            )
        return self._recorder

    def runs(self, limit: int = 20) -> list[RunRecord]:
        """The newest recorded runs, newest first (``migronaut logs``)."""
        from migronaut.observability.history import recent_runs

        with self._busy_scope():
            return recent_runs(self.run_store, limit, lock=self.lock_status().holder)

    def run_log(
        self, run_id: str | None = None, *, migration: str | None = None, level: str | None = None
    ) -> RunLog | None:
        """A recorded run (by id or unique id prefix; ``None``: the newest) and its log lines,
        optionally only one migration's and at or above ``level``."""
        from migronaut.observability.history import read_run_log

        with self._busy_scope():
            return read_run_log(self.run_store, run_id, migration=migration, level=level,
                                lock=self.lock_status().holder)

    # -- read-only commands -------------------------------------------------------------------
    def status(self, filter: StatusFilter = "all", *, checksums: bool = True) -> list[StatusRow]:
        """Every migration on disk or in the changelog, name-sorted."""
        if filter not in ("all", "pending", "applied"):
            raise ConfigInvalidError(
                f"filter must be 'all', 'pending' or 'applied' (got {filter!r})",
                {"option": "filter"},
            )
        with self._busy_scope():
            files = self.files()
            changelog = self.changelog
            checked = changelog.check()
            checked.require_readable(changelog.collection.name)
            if checked.duplicates:
                self.logger.warning(
                    "⚠ %s; up, down, redo, baseline and import refuse to run until one record "
                    "per migration is left", checked.duplicates_text(changelog.collection.name),
                    extra={"event": "changelog:duplicates"})
            use_checksums = checksums and filter != "pending"
            return build_status_rows(
                checked.records, files, checksum=self.checksum if use_checksums else None,
                filter=filter, duplicates=checked.duplicates,
            )

    def pending(self) -> list[StatusRow]:
        """Migrations that ``up`` would run (failed attempts included); never hashes files."""
        return self.status("pending")

    def dry_run(
        self,
        direction: Direction,
        file: str | None = None,
        *,
        steps: int | None = None,
        batch: int | None = None,
        to: str | None = None,
    ) -> list[StatusRow]:
        """Preview exactly what ``up``/``down`` would do: no lock, no writes, no events."""
        if direction == "up":
            validate_up_options(file, to=to)
            if steps is not None or batch is not None:
                raise ConfigInvalidError(
                    "--steps and --batch apply to dry-run down only", {"option": "steps"}
                )
        elif direction == "down":
            validate_down_options(file, steps=steps, batch=batch, to=to)
        else:
            raise ConfigInvalidError(
                f"dry-run direction must be 'up' or 'down' (got {direction!r})",
                {"option": "direction"},
            )
        with self._busy_scope():
            files = self.files()
            changelog = self.changelog
            changelog.verify()  # what the real run would refuse, the preview refuses
            if direction == "up":
                plan = plan_up(
                    changelog, files, self.directory, file=file, to=to, force=False,
                    strict=self.config.strict, on_out_of_order=self.config.on_out_of_order,
                    checksum=self.checksum,
                )
                self._warn_out_of_order(plan.late, plan.newest_applied)
                targets = [n for n in plan.targets if n not in plan.already_applied]
                rows = {r.file: r for r in build_status_rows(
                    changelog.records_named(targets), targets, checksum=None)}
                preview = [
                    _replace_row(rows[name], checksum=self.checksum(name)) for name in targets
                ]
                self.logger.info("◎ Dry-run  Would apply: %d", len(preview))
                return preview
            records = plan_down(changelog, file=file, steps=steps, batch=batch, to=to)
            check_forward_only(records)
            selected = {r["name"] for r in records}
            on_disk = [n for n in files if n in selected]
            rows = {r.file: r for r in build_status_rows(records, on_disk, checksum=self.checksum)}
            preview = [rows[r["name"]] for r in records]
            self.logger.info("◎ Dry-run  Would revert: %d", len(preview))
            return preview

    def lock_status(self) -> LockStatus:
        """The migration lock judged by the rule ``up`` applies: free, held, expired, or a
        document migronaut cannot read (held until :meth:`unlock`). Never acquires or releases."""
        with self._busy_scope():
            return read_lock_status(self._lock_collection(),
                                    ttl_ms=self.config.lock_ttl_seconds * 1000)

    def lock_info(self) -> LockInfo | None:
        """Who holds the migration lock (never acquires or releases it)."""
        return self.lock_status().holder

    def unlock(self) -> LockInfo | None:
        """Force-release the lock whoever holds it; returns the removed holder."""
        with self._busy_scope():
            return force_release(self._lock_collection())

    def audit(self) -> AuditReport:
        """Read-only health checks (reference core §11.3): config, connection, transactions,
        indexes, lock, checksums, pending, ordering, background, runtime.

        Never takes the lock, writes, emits an event or creates an index (not even with
        ``ensure_indexes`` on); a config or connection failure is a failed check, not an error.
        """
        from migronaut.core.audit import run_audit

        with self._busy_scope(), self._transient_connection():
            return run_audit(self)

    @contextmanager
    def _transient_connection(self) -> Iterator[None]:
        """A read-only command (``audit``, an import or baseline dry run) leaves the migrator as
        it found it: a connection it opened is closed again. Connecting writes nothing (no
        index: the changelog's come with the first run that may write it)."""
        opened = self._client is None
        try:
            yield
        finally:
            if opened:
                self.close()

    def next_batch(self) -> int:
        return self.changelog.max_batch() + 1

    def generate_id(self) -> str:
        generator = self.config.generate_id
        if generator is None:
            return str(uuid.uuid4())
        try:
            value = generator()
        except Exception as error:
            raise ConfigInvalidError(
                f"generate_id failed: {describe_exception(error)}", {"option": "generate_id"},
                cause=error,
            ) from error
        if not isinstance(value, str) or not value or len(value) > 128:
            raise ConfigInvalidError(
                "generate_id must return a non-empty string of at most 128 characters",
                {"option": "generate_id"},
            )
        return value

    # -- file commands (no connection) --------------------------------------------------------
    def create(
        self,
        name: str,
        *,
        template: str | os.PathLike[str] | None = None,
        background: bool = False,
    ) -> Path:
        """Write a new migration file from the built-in or a custom template.

        ``background=True`` writes the background-migration skeleton instead (its placeholder
        collection makes ``up`` refuse it until it is filled in); it cannot be combined with
        ``template`` (``CONFIG_INVALID``). A configured ``template_path`` does not apply to it.
        """
        from migronaut.core.templates import write_migration

        if background and template is not None:
            raise ConfigInvalidError(
                "--background cannot be combined with --template: the background skeleton is "
                "its own template",
                {"options": ["--background", "--template"]},
            )
        config = self._config or load_config(
            self._flags, config_path=self._config_path, cwd=self._cwd, require_db=False,
            lenient=True, warnings=self.warnings, flags_origin=self._flags_origin,
        )
        self._warn_unsupported(config)
        skeleton: str | None = None
        if background:
            from migronaut.background.spec import SKELETON

            skeleton = SKELETON
        template_path = template if template is not None else config.template_path
        return write_migration(
            config.migrations_path,
            name,
            extensions=config.file_extensions,
            sequential=config.sequential,
            template_path=Path(config.cwd, template_path) if template_path and not background
            else None,
            template=skeleton,
            origin=config.origin("migrations_dir"),
        )

    # -- mutating commands --------------------------------------------------------------------
    def up(
        self,
        file: str | None = None,
        *,
        to: str | None = None,
        step: bool = False,
        force: bool = False,
        no_lock: bool = False,
        strict: bool | None = None,
        batch: int | None = None,
        requested_by: str | None = None,
        reason: str | None = None,
        on_background_pending: Literal["error", "stop"] = "error",
    ) -> list[RunResult]:
        """Apply pending migrations (or one named file) in name order, under the lock.

        A migration whose ``requires`` are not done fails the run with ``BACKGROUND_PENDING``;
        with ``on_background_pending="stop"`` the run ends cleanly before it instead (event
        ``background:waiting``; :func:`run_migrations` reports it as ``waiting``).
        """
        validate_up_options(file, to=to, step=step, batch=batch, force=force,
                            requested_by=requested_by, reason=reason)
        _check_on_background_pending(on_background_pending)
        self._waiting = []

        def work(run: _Run) -> None:
            run.stop_when_waiting = on_background_pending == "stop"
            try:
                self._up(run, file, to=to, step=step, force=force, batch=batch,
                         strict=self.config.strict if strict is None else strict)
            finally:
                self._waiting = list(run.waiting)

        return self._locked_run("up", "up", work, no_lock=no_lock,
                                requested_by=requested_by, reason=reason)

    def down(
        self,
        file: str | None = None,
        *,
        steps: int | None = None,
        batch: int | None = None,
        to: str | None = None,
        no_lock: bool = False,
        requested_by: str | None = None,
        reason: str | None = None,
    ) -> list[RunResult]:
        """Revert the last batch (or a file, ``steps``, a ``batch``, everything after ``to``)."""
        validate_down_options(file, steps=steps, batch=batch, to=to,
                              requested_by=requested_by, reason=reason)

        def work(run: _Run) -> None:
            records = plan_down(self.changelog, file=file, steps=steps, batch=batch, to=to)
            check_forward_only(records)
            if not records:
                self.logger.info("Nothing to rollback")
                return
            self._execute(run, [r["name"] for r in records], "down")

        return self._locked_run("down", "down", work, no_lock=no_lock,
                                requested_by=requested_by, reason=reason)

    def redo(
        self,
        file: str | None = None,
        *,
        no_lock: bool = False,
        requested_by: str | None = None,
        reason: str | None = None,
    ) -> list[RunResult]:
        """Revert then re-apply the newest applied migration (or ``file``) under one lock."""
        validate_down_options(file, requested_by=requested_by, reason=reason)

        def work(run: _Run) -> None:
            if file is not None:
                records = plan_down(self.changelog, file=file, steps=None, batch=None, to=None)
            else:
                newest = self.changelog.newest_applied()
                records = [newest] if newest else []
            if not records:
                self.logger.info("Nothing to redo")
                return
            check_forward_only(records)
            name = records[0]["name"]
            self._execute(run, [name], "down")
            self._execute(run, [name], "up", batches=[self.changelog.max_batch() + 1])

        return self._locked_run("redo", None, work, no_lock=no_lock,
                                requested_by=requested_by, reason=reason)

    def import_changelog(
        self,
        tool: str = "migrate-mongo",
        *,
        source: str | None = None,
        target: str | None = None,
        dry_run: bool = False,
        trust_hash: bool = False,
        force: bool = False,
        no_lock: bool = False,
        requested_by: str | None = None,
        reason: str | None = None,
    ) -> ImportResult:
        """Adopt another tool's record of applied migrations (``migrate-mongo``,
        ``mongodb-migrations``, or ``migronaut`` — the Node original) so ``up`` runs only what
        is new; the records are forward-only.

        ``source`` defaults to the tool's collection, ``target`` to the changelog (for
        ``migronaut`` they are the same collection). A non-empty target needs ``force``.
        ``dry_run`` reads only: no lock, no events, no writes — not even an index. How a record
        finds its file: :mod:`migronaut.core.adopt`.
        """
        from migronaut.core.adopt import (
            IMPORT_TOOLS,
            ImportRequest,
            import_changelog,
            validate_import_options,
        )

        validate_import_options(tool, source, target)
        validate_actor(requested_by, reason)
        config = self.config
        request = ImportRequest(
            tool, source or IMPORT_TOOLS[tool].default_collection,
            target or config.migrations_collection, dry_run=dry_run, trust_hash=trust_hash,
            force=force,
        )
        validate_import_options(tool, request.source, request.target)  # defaults filled in
        return self._adopt(
            "import", dry_run,
            lambda adoption: import_changelog(
                request, source=self.state_db[request.source],
                target=Changelog(self.state_db[request.target]), files=self.files(),
                checksum=self.checksum, adoption=adoption, logger=self.logger,
                ensure_indexes=config.ensure_indexes
                and request.target != config.migrations_collection,
            ),
            no_lock=no_lock, requested_by=requested_by, reason=reason,
        )

    def baseline(
        self,
        to: str | None = None,
        *,
        dry_run: bool = False,
        no_lock: bool = False,
        requested_by: str | None = None,
        reason: str | None = None,
    ) -> BaselineResult:
        """Mark the pending files (up to ``to``, inclusive) applied WITHOUT running them, in one
        batch — for a database whose schema already matches them. Re-runnable; the records are
        forward-only. ``dry_run`` reads only: no lock, no events, no writes."""
        from migronaut.core.adopt import baseline, validate_baseline_options

        validate_baseline_options(to)
        validate_actor(requested_by, reason)
        return self._adopt(
            "baseline", dry_run,
            lambda adoption: baseline(
                changelog=self.changelog, files=self.files(), checksum=self.checksum, to=to,
                dry_run=dry_run, environment=self.config.resolved_environment,
                executed_by=executed_by(), adoption=adoption, logger=self.logger,
            ),
            no_lock=no_lock, requested_by=requested_by, reason=reason,
        )

    def stop(self, reason: str = "Run stopped by request") -> None:
        """Finish the migration in flight, skip the rest, release the lock: ``RUN_ABORTED``."""
        with self._state_lock:
            run = self._run
            if run is not None:
                run.cancellation.cancel(RunAbortedError(reason, {"reason": reason}))
            elif self._busy:
                self._latched_stop = reason

    # -- internals ----------------------------------------------------------------------------
    @contextmanager
    def _busy_scope(self) -> Iterator[None]:
        with self._state_lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._busy -= 1
                if not self._busy and self._run is None:
                    self._latched_stop = None

    def _adopt(
        self,
        command: str,
        dry_run: bool,
        work: Callable[[Adoption], AdoptionResult],
        *,
        no_lock: bool,
        requested_by: str | None,
        reason: str | None,
    ) -> AdoptionResult:
        """Run an import or baseline: a preview outside any run, or a locked run."""
        from migronaut.core.adopt import Adoption

        if dry_run:
            with self._busy_scope(), self._transient_connection():
                self.connect()
                self.changelog.verify()  # what the real run would refuse, the preview refuses
                return work(Adoption(None))
        outcome: list[AdoptionResult] = []

        def locked(run: _Run) -> None:
            adoption = Adoption(run.id, run.requested_by, run.reason,
                                check_stop=lambda: self._check_between(run))
            result = work(adoption)
            run.counts = result.counts()
            outcome.append(result)

        self._locked_run(command, None, locked, no_lock=no_lock, requested_by=requested_by,
                         reason=reason)
        return outcome[0]

    def _lock_collection(self) -> Any:
        return self.state_db[self.config.lock_collection]

    def _ensure_changelog_indexes(self) -> None:
        """The changelog indexes, once per instance, by the first run that may write it (under
        its lock); duplicate names stopping the unique one are ``STATE_INVALID``."""
        from pymongo.errors import PyMongoError

        if not self.config.ensure_indexes or self._indexes_ensured:
            return
        from migronaut.core.retry import as_connection_failed

        try:
            self.changelog.ensure_indexes()
        except PyMongoError as error:
            raise as_connection_failed(error) or ConnectionFailedError(
                f"Failed to create the changelog indexes: {describe_exception(error)}",
                cause=error,
            ) from error
        self._indexes_ensured = True

    def _warn_out_of_order(self, late: Sequence[str], newest: str | None) -> None:
        if late:
            self.logger.warning(
                "⚠ Out-of-order: %d pending migration(s) sort before the newest applied one "
                "(%s): %s", len(late), newest, ", ".join(late)
            )

    def _locked_run(
        self,
        command: str,
        direction: Direction | None,
        work: Callable[[_Run], None],
        *,
        no_lock: bool,
        requested_by: str | None,
        reason: str | None,
    ) -> list[RunResult]:
        with self._busy_scope():
            with self._state_lock:
                if self._run is not None:
                    raise ConfigInvalidError(
                        "A run is already in flight on this Migrator instance",
                        {"runId": self._run.id},
                    )
            self.connect()
            self.changelog.verify()  # refused before the lock: nothing touched, no run recorded
            run = _Run(self.generate_id(), command, Cancellation(),
                       requested_by=requested_by, reason=reason)
            started = time.monotonic()
            with self._state_lock:
                self._run = run
                latched, self._latched_stop = self._latched_stop, None
            if latched is not None:
                run.cancellation.cancel(RunAbortedError(latched, {"reason": latched}))
            try:
                return self._run_with_lock(run, direction, work, no_lock=no_lock,
                                           started=started)
            finally:
                with self._state_lock:
                    self._run = None
                if run.bridge is not None:
                    run.bridge.close()

    def _run_with_lock(
        self,
        run: _Run,
        direction: Direction | None,
        work: Callable[[_Run], None],
        *,
        no_lock: bool,
        started: float,
    ) -> list[RunResult]:
        config = self.config
        telemetry = self.telemetry  # a bad telemetry config fails before the lock
        if no_lock:
            self.logger.warning(
                "⚠ Running without a lock (--no-lock) — concurrent runs are unsafe"
            )
        else:
            run.lock = MigrationLock(
                self._lock_collection(),
                owner=run.id,
                ttl_ms=config.lock_ttl_seconds * 1000,
                executed_by=executed_by(),
                on_lost=lambda why: self._on_lock_lost(run, why),
                on_renew_failed=lambda n, err: self.logger.warning(
                    "⚠ Lock renewal failed (%d in a row): %s", n, describe_exception(err),
                    extra={"event": "lock:renew-failed", "runId": run.id},
                ),
            )
            try:
                run.lock.acquire()  # LOCK_ALREADY_HELD propagates: no run:start, no span
            except LockAlreadyHeldError:
                telemetry.lock_refused(run.command)
                raise
            except Exception as failed:
                converted = as_connection_failed(failed)
                if converted is None:
                    raise
                raise converted from failed
        self._emit("run:start", command=run.command, direction=direction)
        if run.lock is not None:
            self._emit("lock:acquired", owner=run.id, ttlMs=run.lock.ttl_ms,
                       acquireMs=run.lock.acquire_ms)
        else:
            self._emit("lock:acquired", skipped=True)
        run.trace = telemetry.start_run(run.id, run.command, direction,
                                        acquire_ms=run.lock.acquire_ms if run.lock else None)
        error: BaseException | None = None
        try:
            run.recording = self.recorder.begin(
                run.id, command=run.command, direction=direction, requested_by=run.requested_by,
                reason=run.reason, locked=run.lock is not None,
                emit=lambda line: self._emit("migration:log", **line),
                debug=self.logger.isEnabledFor(logging.DEBUG),
            )
            self._check_between(run)
            self._ensure_changelog_indexes()
            work(run)
        except BaseException as caught:
            converted = as_connection_failed(caught)  # never a raw driver error (exit 1)
            error = converted or caught
            if isinstance(error, MigronautError):
                error.context.setdefault("results", [r.to_dict() for r in run.results])
            if converted is not None:
                raise converted from caught
            raise
        finally:
            self._finish_run(run, direction, error, started)
        return run.results

    def _finish_run(
        self, run: _Run, direction: Direction | None, error: BaseException | None, started: float
    ) -> None:
        release_error: MigronautError | None = None
        lost: LockLostError | None = None
        if run.lock is not None:
            try:
                warning = run.lock.release(run_failed=error is not None)
                if warning:
                    self.logger.warning("⚠ %s", warning)
            except MigronautError as failed:
                release_error = failed
            self._emit("lock:released", owner=run.id)
            if error is None and release_error is None:
                # the work finished, but the lock was lost on the way (or found gone at release)
                error = lost = self._lock_lost_error(run)
        else:
            self._emit("lock:released", skipped=True)
        applied = sum(1 for r in run.results if r.status == "applied")
        reverted = sum(1 for r in run.results if r.status == "reverted")
        run.trace.end(error if error is not None else release_error,
                      applied=applied, reverted=reverted,
                      skipped=sum(1 for r in run.results if r.status == "skipped"),
                      total=len(run.results), duration_s=time.monotonic() - started)
        duration_ms = int((time.monotonic() - started) * 1000)
        end: dict[str, Any] = {
            "command": run.command, "direction": direction, "success": error is None,
            "durationMs": duration_ms, "applied": applied, "reverted": reverted,
            "total": len(run.results), **run.counts,
        }
        if error is not None:
            end["error"] = describe_exception(error)
        self._emit("run:end", **end)
        if run.recording is not None:
            run.recording.finish(error, duration_ms=duration_ms, total=len(run.results))
        if error is None and (applied or reverted):
            parts = [f"{applied} applied"] if applied else []
            parts += [f"{reverted} reverted"] if reverted else []
            self.logger.info("✔ Done     %s in %dms", ", ".join(parts), duration_ms,
                             extra={"runId": run.id, "durationMs": duration_ms})
        if lost is not None:
            raise lost
        if release_error is not None and error is None:
            raise release_error

    def _on_lock_lost(self, run: _Run, reason: str) -> None:
        self.logger.warning("⚠ Lost the migration lock mid-run (%s)", reason,
                            extra={"event": "lock:lost", "runId": run.id})
        self._emit("lock:lost", owner=run.id, reason=reason)
        run.trace.lock_lost(reason)
        if self.config.on_lock_lost == "abort":
            run.cancellation.cancel(
                LockLostError(
                    "Lost the migration lock mid-run", {"reason": reason, "aborted": True}
                )
            )

    def _lock_lost_error(self, run: _Run) -> LockLostError | None:
        """``LOCK_LOST`` for a run that lost its lock at any point, up to its release (abort
        mode): the migrations it ran may have overlapped with a successor's."""
        reason = run.lock.lost_reason if run.lock is not None else None
        if reason is None or self.config.on_lock_lost != "abort":
            return None
        return LockLostError("Lost the migration lock mid-run", {
            "reason": reason, "aborted": True, "results": [r.to_dict() for r in run.results]})

    def _abort_if_lock_lost(self, run: _Run) -> None:
        """In a transactional migration, right before its changelog write (after
        :meth:`MigrationLock.fence`): a lost lock aborts the transaction — data and record roll
        back, and whoever holds the lock now applies the migration once (under
        ``on_lock_lost = "warn"`` it commits)."""
        error = self._lock_lost_error(run)
        if error is not None:
            error.context.pop("results", None)
            raise error

    def _check_between(self, run: _Run) -> None:
        """The safe point between migrations: honour a lost lock or a stop request.

        The lock is confirmed (amortised) here, so a run whose lock was force-released or
        reclaimed stops before starting another migration."""
        if run.lock is not None:
            run.lock.confirm()
        if run.cancellation.cancelled:
            reason = run.cancellation.reason
            assert reason is not None
            error = type(reason)(reason.message, {**reason.context})
            raise error

    def _base_context(self, run: _Run, direction: Direction | None) -> MigrationContext:
        info = RunInfo(id=run.id, direction=direction, requested_by=run.requested_by,
                       reason=run.reason)
        from migronaut.observability.migration_log import MigrationLogger

        adapter = MigrationLogger(self.logger, {"runId": run.id, "direction": direction},
                                  sink=run.recording.line if run.recording else None)
        if run.bridge is None:
            run.bridge = self._new_bridge()
        return MigrationContext(db=self.db, client=self.client, cancellation=run.cancellation,
                                logger=adapter, run=info, bridge=run.bridge)

    def _up(
        self, run: _Run, file: str | None, *, to: str | None, step: bool, force: bool,
        batch: int | None, strict: bool,
    ) -> None:
        config = self.config
        plan = plan_up(self.changelog, self.files(), self.directory, file=file, to=to,
                       force=force, strict=strict, on_out_of_order=config.on_out_of_order,
                       checksum=self.checksum)
        self._warn_out_of_order(plan.late, plan.newest_applied)
        if not plan.targets:
            self.logger.info("Nothing to migrate")
            return
        targets: list[str] = []
        for name in plan.targets:
            record = plan.already_applied.get(name)
            if record is None:
                targets.append(name)
                continue
            actual = self.checksum(name)
            drifted = actual is not None and record.get("checksum") not in (None, "", actual)
            if force:
                self.logger.warning("⚠ Forcing   re-run of already-applied %s", name)
                targets.append(name)
                continue
            if drifted and strict:
                raise ChecksumMismatchError(
                    f"Checksum mismatch for {name}",
                    {"name": name, "expected": record.get("checksum"), "actual": actual},
                )
            if drifted:
                self.logger.warning("⚠ Warning  Checksum mismatch: %s", name)
            self.logger.debug("⏭ Skipped  %s", name)
            self._emit("migration:skipped", migration=name, direction="up",
                       reason="already-applied")
            run.results.append(RunResult(name, "skipped", reason="Already applied"))
        if not targets:
            return
        base = batch if batch is not None else self.changelog.max_batch() + 1
        self._execute(run, targets, "up", batches=None if step else [base] * len(targets),
                      step_base=base if step else None)

    def _execute(
        self,
        run: _Run,
        names: Sequence[str],
        direction: Direction,
        *,
        batches: Sequence[int] | None = None,
        step_base: int | None = None,
    ) -> None:
        """Run targets in order with hooks, events and records; stop at the first failure.

        Every target is loaded and validated first (:meth:`_preflight`): a broken file anywhere
        in the list refuses the run before the first migration, or any hook, runs.
        """
        migrations = self._preflight(names, direction)
        hooks = self.hooks
        ctx = self._base_context(run, direction)
        total = len(names)
        done = 0
        call_hook(hooks, "before_all", ctx)
        failure: BaseException | None = None
        try:
            for index, migration in enumerate(migrations):
                self._check_between(run)
                batch = None
                if direction == "up":
                    batch = batches[index] if batches else (step_base or 1) + done
                try:
                    with run.trace.migration(migration.name, direction, batch=batch,
                                             index=index, total=total):
                        self._execute_one(run, ctx, hooks, migration, direction, batch, index,
                                          total)
                except _WaitingForBackground:
                    break  # on_background_pending="stop": nothing after it runs
                done += 1
        except BaseException as error:
            failure = error
            raise
        finally:
            summary = {"success": failure is None, "applied": done, "direction": direction}
            try:
                call_hook(hooks, "after_all", ctx, summary)
            except MigronautError as hook_error:
                if failure is None:
                    raise
                self.logger.warning("⚠ after_all hook failed after a failed run: %s",
                                    hook_error.message)

    def _preflight(self, names: Sequence[str], direction: Direction) -> list[MigrationModule]:
        """Load and validate every file the run will execute (and, going up, every background
        spec) before the first one runs."""
        migrations = load_migrations(self.directory, names,
                                     reload=self.config.reload_migrations)
        background = [m for m in migrations if m.background is not None]
        if background and direction == "up":
            from migronaut.background.registration import Registrar

            registrar = Registrar(self.background, files=self.files())
            for migration in background:
                registrar.validate(migration)
        return migrations

    def _execute_one(
        self,
        run: _Run,
        base_ctx: MigrationContext,
        hooks: Hooks,
        migration: MigrationModule,
        direction: Direction,
        batch: int | None,
        index: int,
        total: int,
    ) -> None:
        config = self.config
        name = migration.name
        ctx = base_ctx.for_migration(migration=name, batch=batch)
        info = {"direction": direction, "index": index, "total": total}
        if direction == "up" and migration.background is None and migration.requires:
            self._require_background_done(run, migration.name, migration.requires)
        call_hook(hooks, "before_each", name, ctx, info)
        use_transaction = (
            migration.use_transaction if migration.use_transaction is not None
            else config.use_transaction
        )
        timeout_ms = migration.timeout_ms or config.timeout_ms
        run.trace.migration_attributes({"migronaut.migration.transaction": use_transaction})
        checksum = self.checksum(name) or ""
        if self._progress:
            self._progress.on_start(name, direction)
        self._emit("migration:start", migration=name, direction=direction, batch=batch)
        started = time.monotonic()

        def applied_record() -> dict[str, Any]:
            return {
                "name": name, "batch": batch, "status": "applied",
                "checksum": checksum, "environment": config.resolved_environment,
                "executedBy": executed_by(), "duration": outcome_ms(),
                "runId": run.id, "description": migration.description,
                "requestedBy": run.requested_by, "reason": run.reason,
                "kind": "background" if migration.background is not None else None,
            }

        def recorded(matched: int) -> None:
            if direction == "down" and matched == 0:
                self.logger.warning(
                    "⚠ Warning  Changelog record for %s was not 'applied' — revert not "
                    "recorded", name, extra={"event": "changelog:revert-miss"},
                )

        def record(session: ClientSession | None) -> None:
            lock = run.lock
            if lock is not None and session is not None:
                fence = lock.fence()
                if fence is not None:
                    renewal = self._lock_collection().update_one(*fence, session=session)
                    lock.fenced(renewal.matched_count == 1)
                self._abort_if_lock_lost(run)
            elif lock is not None:
                # The body's writes are done: its record is written whatever the lock says (a
                # changelog hiding them would let a later up apply it again); a lost lock stops
                # the run right after (_check_between, _finish_run).
                lock.confirm()
            if direction == "up":
                self.changelog.mark_applied(applied_record(), session)
            else:
                recorded(self.changelog.mark_reverted(
                    name, session, requested_by=run.requested_by, reason=run.reason
                ).matched_count)

        async def record_async(session: AsyncClientSession) -> None:
            database = session.client[config.db_name or ""]
            lock = run.lock
            fence = lock.fence() if lock is not None else None
            if lock is not None and fence is not None:  # (as record's, in the async transaction)
                renewal = await database[config.lock_collection].update_one(
                    *fence, session=session)
                lock.fenced(renewal.matched_count == 1)
            self._abort_if_lock_lost(run)
            change = applied_write(applied_record()) if direction == "up" else \
                reverted_write(name, requested_by=run.requested_by, reason=run.reason)
            collection = database[config.migrations_collection]
            recorded((await change.apply_async(collection, session)).matched_count)

        def outcome_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        body = self._background_body(migration, direction, checksum) \
            if migration.background is not None else \
            migration.up if direction == "up" else migration.down
        assert body is not None
        sessions: list[ClientSession] = []
        try:
            outcome = execute(body, ctx, name=name, direction=direction,
                              use_transaction=use_transaction, timeout_ms=timeout_ms,
                              record=record, batch=batch, sessions=sessions,
                              record_async=record_async, path=migration.path)
        except MigronautError as error:
            duration = outcome_ms()
            if self._progress:
                self._progress.on_stop("error")
            self._emit("migration:error", migration=name, direction=direction, batch=batch,
                       durationMs=duration, error=error.message)
            self.logger.error("✖ Error    %s", name, extra={
                "runId": run.id, "migration": name, "direction": direction, "batch": batch,
                "event": "migration:error"})
            run.results.append(RunResult(name, "error", duration=duration, batch=batch,
                                         error=error.message))
            try:
                failed_ctx = ctx.with_session(sessions[0]) if sessions else ctx
                call_hook(hooks, "on_error", name, error, failed_ctx)
            except MigronautError as hook_error:
                self.logger.warning("⚠ on_error hook failed for %s: %s", name, hook_error.message)
            fenced = isinstance(error, LockLostError)  # a run that lost its lock writes no more
            if direction == "up" and error.context.get("phase") != "changelog-write" \
                    and not fenced:
                self.changelog.mark_failed({
                    "name": name, "error": error.message,
                    "environment": config.resolved_environment, "executedBy": executed_by(),
                    "batch": batch, "duration": duration, "runId": run.id, "checksum": checksum,
                    "requestedBy": run.requested_by, "reason": run.reason,
                })
            error.context["durationMs"] = duration
            raise
        if self._progress:
            self._progress.on_stop("success")
        self._emit("migration:success", migration=name, direction=direction, batch=batch,
                   durationMs=outcome.duration_ms, attempts=outcome.attempts)
        if migration.background is not None:
            verb = "⧗ Registered" if direction == "up" else "⧗ Reverting"
        else:
            verb = "✔ Applied " if direction == "up" else "↩ Reverted"
        self.logger.info("%s %s   [%dms]", verb, name, outcome.duration_ms, extra={
            "runId": run.id, "migration": name, "direction": direction, "batch": batch,
            "durationMs": outcome.duration_ms, "attempts": outcome.attempts})
        run.results.append(RunResult(
            name, "applied" if direction == "up" else "reverted",
            duration=outcome.duration_ms, batch=batch))
        if migration.background is not None and direction == "up" and \
                self.config.background_inline:
            self._drive_inline(run, name)
        call_hook(hooks, "after_each", name, outcome.duration_ms, ctx, info)

    # -- background migrations ----------------------------------------------------------------
    @property
    def background(self) -> BackgroundEngine:
        """The background engine of this database (state, coordinator, controls, views)."""
        if self._background is None:
            from migronaut.background.engine import BackgroundEngine
            from migronaut.background.store import BackgroundStore

            config = self.config
            store = BackgroundStore(self.state_db, collection=config.background_collection,
                                    ensure_indexes=config.ensure_indexes)
            reserved = (config.migrations_collection, config.lock_collection,
                        config.converge_log_collection, *store.own_collections,
                        *self.run_store.collections)
            self._background = BackgroundEngine(
                db=self.state_db, store=store, directory=self.directory,
                lock_collection=self._lock_collection(),
                lock_ttl_ms=config.lock_ttl_seconds * 1000, logger=self.logger,
                emit=lambda event, payload: self._emit(event, **payload),
                reserved_collections=reserved, reload_migrations=config.reload_migrations,
                executed_by=executed_by(), telemetry=self.telemetry,
                shard_aware=config.background_shard_aware,
            )
        return self._background

    def _background_body(
        self, migration: MigrationModule, direction: Direction, checksum: str
    ) -> Callable[[MigrationContext], None]:
        """The "body" of a background file under up/down: (re-)register it, touch no document."""
        from migronaut.background.registration import Registrar

        registrar = Registrar(self.background, files=self.files())
        if direction == "up":
            registrar.validate(migration)  # fail before any write
        self.background.store.ready()  # indexes outside any transaction

        def body(ctx: MigrationContext) -> None:
            if direction == "up":
                registrar.register(migration, checksum=checksum, session=ctx.session)
            else:
                registrar.revert(migration, checksum=checksum, session=ctx.session)

        return body

    def _require_background_done(self, run: _Run, name: str, requires: Sequence[str]) -> None:
        """A contract migration refuses to run until its background requirements are done."""
        from migronaut.background.drift import probe_requirement

        for required in requires:  # reopens a completed one whose old shape reappeared
            probe_requirement(self.background, required)
        waiting = self.background.unmet(requires, self.changelog)
        if waiting:
            names = ", ".join(f"{w['migration']} ({w['status']})" for w in waiting)
            if run.stop_when_waiting:
                run.waiting.append({"migration": name, "waitsFor": waiting})
                self._emit("background:waiting", migration=name, waitsFor=waiting)
                self.logger.info("⧗ %s waits for %d background migration(s): %s — stopping here",
                                 name, len(waiting), names)
                raise _WaitingForBackground(name)
            raise BackgroundPendingError(
                f"{name} is blocked: {len(waiting)} background migration(s) not done: {names}",
                {"migration": name, "waitsFor": waiting,
                 "results": [r.to_dict() for r in run.results]},
            )

    def _drive_inline(self, run: _Run, name: str) -> None:
        """``background_inline``: run the registered migration to completion under the lock."""
        state = self.background.store.require(name)
        for required in state.get("requires") or []:
            if self.background.requirement_status(required, self.changelog) != "completed":
                self._drive_inline(run, required)
        spec = state.get("spec") or {}
        self.background.drive(name, concurrency=int(spec.get("maxParallel", 1)),
                              cancellation=run.cancellation, driver="inline", inline=True)


def _replace_row(row: StatusRow, **changes: Any) -> StatusRow:
    from dataclasses import replace

    return replace(row, **changes)


def _check_on_background_pending(value: Any) -> None:
    if value not in ("error", "stop"):
        raise ConfigInvalidError(
            f"on_background_pending must be 'error' or 'stop' (got {value!r})",
            {"option": "on_background_pending"},
        )


def run_migrations(
    config: Config | Mapping[str, Any] | None = None,
    *,
    on_lock_held: Literal["throw", "wait"] = "throw",
    on_background_pending: Literal["error", "stop"] = "error",
    lock_wait_timeout_ms: int | None = None,
    lock_poll_interval_ms: int = 500,
    no_lock: bool = False,
    stop_event: threading.Event | None = None,
    on_migrator: Callable[[Migrator], None] | None = None,
    config_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    _make_migrator: Callable[..., Migrator] = Migrator,
    **overrides: Any,
) -> MigrationSummary:
    """Apply every pending migration — the one call for application start-up.

    With ``on_lock_held="wait"`` a process that finds the lock held waits for the holder (a peer
    replica booting at the same time) and then applies whatever is still pending. The wait is
    bounded by *stall* time: it is re-armed whenever the holder's heartbeat advances.

    A migration whose background ``requires`` are not done raises ``BACKGROUND_PENDING``; with
    ``on_background_pending="stop"`` everything before it applies and the summary says
    ``up_to_date=False`` and ``waiting=[{migration, waitsFor: [{migration, status}]}]`` (event
    ``background:waiting``) — the next start-up goes on from there.
    """
    if on_lock_held not in ("throw", "wait"):
        raise ConfigInvalidError(
            "on_lock_held must be 'throw' or 'wait'", {"option": "on_lock_held"}
        )
    _check_on_background_pending(on_background_pending)
    for option, value in (("lock_wait_timeout_ms", lock_wait_timeout_ms),
                          ("lock_poll_interval_ms", lock_poll_interval_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0 or value > 2**31 - 1):
            raise ConfigInvalidError(f"{option} must be a positive integer", {"option": option})
    migrator = _make_migrator(config, config_path=config_path, cwd=cwd, **overrides)
    finished = threading.Event()
    if stop_event is not None:
        # The stop event also stops a run between migrations (reference core §8.4), not only
        # the wait between lock polls: forward it to Migrator.stop() while we run.
        event = stop_event

        def forward_stop() -> None:
            while not finished.is_set():
                if event.wait(0.05):
                    migrator.stop("Run stopped by request")
                    return

        threading.Thread(target=forward_stop, name="migronaut-stop-event", daemon=True).start()
    try:
        if on_migrator is not None:
            on_migrator(migrator)
        migrator.connect()
        started = time.monotonic()
        attempts = 0
        waited = False
        deadline: float | None = None
        last_seen: Any = None
        delay = lock_poll_interval_ms / 1000

        def record_wait(outcome: str, ended: float | None = None) -> None:
            if waited:
                migrator.telemetry.lock_wait((ended or time.monotonic()) - started, outcome)

        while True:
            attempts += 1
            if stop_event is not None and stop_event.is_set():
                record_wait("aborted")
                raise RunAbortedError("Lock wait aborted", {"attempts": attempts})
            attempted = time.monotonic()
            try:
                applied = migrator.up(no_lock=no_lock,
                                      on_background_pending=on_background_pending)
                break
            except LockAlreadyHeldError as refused:
                if on_lock_held != "wait" or refused.context.get("problems"):
                    raise  # a lock document nobody can read frees only by `unlock`: no wait
                holder = refused.context.get("holder") or {}
                now = time.monotonic()
                if not waited:
                    migrator.logger.info(
                        "Migration lock held by another process — waiting for it to release…"
                    )
                    waited = True
                if deadline is None or holder.get("lockedAt") != last_seen:
                    ttl = holder.get("ttlMs") or migrator.config.lock_ttl_seconds * 1000
                    budget = lock_wait_timeout_ms or max(90_000, int(1.5 * ttl))
                    deadline = now + budget / 1000
                    last_seen = holder.get("lockedAt")
                if now >= deadline:
                    refused.context.update({
                        "timedOut": True, "attempts": attempts,
                        "waitedMs": int((now - started) * 1000)})
                    record_wait("timeout")
                    raise
                pause = min(delay * random.uniform(0.75, 1.25), 5.0, max(0.0, deadline - now))
                if stop_event is not None:
                    if stop_event.wait(pause):
                        record_wait("aborted")
                        raise RunAbortedError("Lock wait aborted", {"attempts": attempts}) from None
                else:
                    time.sleep(pause)
                delay = min(delay * 2, 5.0)
            except MigronautError:
                record_wait("failed", attempted)  # the attempt after the wait failed otherwise
                raise
        record_wait("acquired", attempted)
        waited_ms = int((time.monotonic() - started) * 1000) if waited else 0
        waiting = list(migrator._waiting)
        return MigrationSummary(
            applied=applied,
            up_to_date=not waiting and not any(r.status == "applied" for r in applied),
            waited=waited,
            waited_ms=waited_ms,
            attempts=attempts,
            waiting=waiting if on_background_pending == "stop" else None,
        )
    finally:
        finished.set()
        migrator.close()


def pending_migrations(
    config: Config | Mapping[str, Any] | None = None,
    *,
    config_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    **overrides: Any,
) -> list[StatusRow]:
    """Read-only readiness probe: the migrations ``up`` would run."""
    with Migrator(config, config_path=config_path, cwd=cwd, **overrides) as migrator:
        return migrator.pending()
