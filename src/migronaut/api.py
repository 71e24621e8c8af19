"""The programmatic API: :class:`Migrator`, :func:`run_migrations`, :func:`pending_migrations`.

Every CLI command is a method here; the CLI only parses flags, calls it, renders the result and
picks the exit code, so the two cannot drift. A :class:`Migrator` owns one connection and at most
one run at a time; a run is one lock acquisition around one command.

This module is a façade: each method hands its work to the module that owns it — the commands
(:mod:`migronaut.commands`, one function per verb) over the runtime objects of a
:class:`~migronaut.core.workspace.Workspace` (project, connection, run slot, events). No logic
lives here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from migronaut.commands import adopt, lock, logs, migrate, startup, status
from migronaut.commands.background import BackgroundWiring
from migronaut.core.connection import Connection
from migronaut.core.project import Project
from migronaut.core.project import executed_by as executed_by  # re-exported (the CLI uses it)
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
from migronaut.core.workspace import ProgressReporter, Workspace

if TYPE_CHECKING:
    import logging
    from pathlib import Path

    from pymongo import MongoClient
    from pymongo.database import Database

    from migronaut.background.engine import BackgroundEngine
    from migronaut.commands.resolve import Resolution
    from migronaut.commands.sequence import SequencePlan
    from migronaut.commands.status import StatusFilter
    from migronaut.core.changelog import Changelog
    from migronaut.core.config import Config
    from migronaut.core.hooks import Hooks
    from migronaut.core.run import Direction
    from migronaut.declared.plan import ConvergeResult
    from migronaut.observability.events import Listener
    from migronaut.observability.history import RunLog, RunRecord
    from migronaut.observability.recorder import RunRecorder
    from migronaut.observability.runstore import RunStore
    from migronaut.observability.telemetry import Telemetry

__all__ = [
    "Migrator",
    "ProgressReporter",
    "pending_migrations",
    "run_migrations",
]


class Migrator:
    """Runs migrations against one database.

    ``config`` is a resolved :class:`~migronaut.core.config.Config` or a mapping of config keys
    (the flags tier: it wins over environment and config file); keyword arguments are config keys
    too. Use it as a context manager, or call :meth:`close`::

        with Migrator(uri="mongodb://localhost:27017", db_name="app") as migrator:
            migrator.up()
    """

    #: How the workspace connects (the asyncio API plugs in its own).
    _connection: ClassVar[type[Connection]] = Connection

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None = None,
        *,
        config_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        progress: ProgressReporter | None = None,
        _flags_origin: Literal["flag", "argument"] = "argument",
        _quick_connect: bool = False,
        **overrides: Any,
    ) -> None:
        # _flags_origin and _quick_connect are the CLI's: what its flags are, and whether the
        # command only reads (a refused connection then fails in seconds, not ten).
        project = Project(config, overrides, config_path=config_path, cwd=cwd,
                          flags_origin=_flags_origin)
        project.quick_connect = _quick_connect
        self._ws = Workspace(project, background=BackgroundWiring, progress=progress,
                             connection=self._connection)
        self._background = cast("BackgroundWiring", self._ws.background)
        #: Problems that did not stop a command (e.g. a config file skipped by ``create``).
        self.warnings: list[str] = project.warnings

    # -- configuration and connection ---------------------------------------------------------
    @property
    def config(self) -> Config:
        return self._ws.project.config

    @property
    def logger(self) -> logging.Logger:
        return self._ws.project.logger

    @property
    def hooks(self) -> Hooks:
        return self._ws.project.hooks

    @property
    def telemetry(self) -> Telemetry:
        """The ``telemetry`` config resolved (OpenTelemetry spans and metrics; no-op unset)."""
        return self._ws.project.telemetry

    def connect(self) -> None:
        """Connect (idempotent). Creates nothing: read-only commands need only read roles; the
        changelog indexes come with the first run that may write it
        (:meth:`~migronaut.core.connection.Connection.ensure_changelog_indexes`)."""
        self._ws.connection.connect()

    def close(self) -> None:
        """Disconnect; an injected client is never closed."""
        self._ws.close()

    disconnect = close

    def __enter__(self) -> Migrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> MongoClient[dict[str, Any]]:
        return self._ws.connection.client

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` succeeded (and :meth:`close` has not run since); no I/O."""
        return self._ws.connection.connected

    @property
    def db(self) -> Database[dict[str, Any]]:
        """The database migrations work on (``ctx.db``), with the URI's read preference."""
        return self._ws.connection.db

    @property
    def state_db(self) -> Database[dict[str, Any]]:
        """The same database for migronaut's own state: reads go to the primary."""
        return self._ws.connection.state_db

    @property
    def changelog(self) -> Changelog:
        return self._ws.connection.changelog

    @property
    def directory(self) -> Path:
        return self._ws.project.directory

    def files(self) -> list[str]:
        """The migration files on disk, in run order (a missing directory is CONFIG_INVALID)."""
        return self._ws.project.files()

    def checksum(self, name: str) -> str | None:
        return self._ws.project.checksum(name)

    # -- events -------------------------------------------------------------------------------
    def on(self, event: str, listener: Listener) -> Migrator:
        """Listen to a lifecycle event (``run:start``, ``migration:success``, … or ``*``)."""
        self._ws.events.on(event, listener)
        return self

    def off(self, event: str, listener: Listener) -> Migrator:
        self._ws.events.off(event, listener)
        return self

    # -- run history ----------------------------------------------------------------------------
    @property
    def run_store(self) -> RunStore:
        """The run records and their log lines (``runs_collection``)."""
        return self._ws.connection.run_store

    @property
    def recorder(self) -> RunRecorder:
        return self._ws.connection.recorder

    def runs(self, limit: int = 20) -> list[RunRecord]:
        """The newest recorded runs, newest first (``migronaut logs``)."""
        return logs.runs(self._ws, limit)

    def run_log(
        self, run_id: str | None = None, *, migration: str | None = None, level: str | None = None
    ) -> RunLog | None:
        """A recorded run (by id or unique id prefix; ``None``: the newest) and its log lines,
        optionally only one migration's and at or above ``level``."""
        return logs.run_log(self._ws, run_id, migration=migration, level=level)

    # -- read-only commands -------------------------------------------------------------------
    def status(self, filter: StatusFilter = "all", *, checksums: bool = True) -> list[StatusRow]:
        """Every migration on disk or in the changelog, name-sorted."""
        return status.status(self._ws, filter, checksums=checksums)

    def pending(self) -> list[StatusRow]:
        """Migrations that ``up`` would run (failed attempts included); never hashes files."""
        return self.status("pending")

    def dry_run(self, direction: Direction, file: str | None = None, *, steps: int | None = None,
                batch: int | None = None, to: str | None = None) -> list[StatusRow]:
        """Preview exactly what ``up``/``down`` would do: no lock, no writes, no events."""
        return migrate.dry_run(self._ws, direction, file, steps=steps, batch=batch, to=to)

    def lock_status(self) -> LockStatus:
        """The migration lock judged by the rule ``up`` applies: free, held, expired, or a
        document migronaut cannot read (held until :meth:`unlock`). Never acquires or releases."""
        return lock.lock_status(self._ws)

    def lock_info(self) -> LockInfo | None:
        """Who holds the migration lock (never acquires or releases it)."""
        return self.lock_status().holder

    def unlock(self) -> LockInfo | None:
        """Force-release the lock whoever holds it; returns the removed holder."""
        return lock.unlock(self._ws)

    def audit(self) -> AuditReport:
        """Read-only health checks (reference core §11.3): config, connection, transactions,
        indexes, lock, checksums, pending, ordering, background, runtime.

        Never takes the lock, writes, emits an event or creates an index (not even with
        ``ensure_indexes`` on); a config or connection failure is a failed check, not an error.
        """
        from migronaut.commands.audit import audit

        return audit(self._ws, self)

    def next_batch(self) -> int:
        """The batch the next bulk ``up`` will use (a peek: nothing is reserved)."""
        return self._ws.connection.changelog.max_batch() + 1

    def plan_sequence(self, file: str | None = None, *, to: str | None = None) -> SequencePlan:
        """What a bulk ``up`` (or ``up(file)``) amounts to as single-file runs — for a queue
        that applies them one job each (``up(name, ordered=True, batch=, checksum=)``). Read-only;
        stops before a migration that waits for background migrations (``waiting``)."""
        from migronaut.commands.sequence import plan_sequence

        return plan_sequence(self._ws, self._background, file, to=to)

    def generate_id(self) -> str:
        return self._ws.project.generate_id()

    # -- file commands (no connection) --------------------------------------------------------
    def create(self, name: str, *, template: str | os.PathLike[str] | None = None,
               background: bool = False) -> Path:
        """Write a new migration file from the built-in or a custom template.

        ``background=True`` writes the background-migration skeleton instead (its placeholder
        collection makes ``up`` refuse it until it is filled in); it cannot be combined with
        ``template`` (``CONFIG_INVALID``). A configured ``template_path`` does not apply to it.
        """
        from migronaut.commands.create import create

        return create(self._ws.project, name, template=template, background=background)

    # -- mutating commands --------------------------------------------------------------------
    def up(self, file: str | None = None, *, to: str | None = None, step: bool = False,
           force: bool = False, no_lock: bool = False, strict: bool | None = None,
           batch: int | None = None, requested_by: str | None = None, reason: str | None = None,
           on_background_pending: Literal["error", "stop"] = "error",
           converge: bool | None = None, ordered: bool = False,
           checksum: str | None = None) -> list[RunResult]:
        """Apply pending migrations (or one named file) in name order, under the lock.

        Sequenced single-file runs (a queue splitting one logical run into one call per file):
        ``batch`` labels the file's batch (several calls can share :meth:`next_batch`);
        ``ordered=True`` keeps the bulk run's guarantees — the file must be of the sequence,
        every earlier file applied (else ``MIGRATION_BLOCKED``), strict and out-of-order checks
        as in a bulk ``up``; ``checksum`` pins the file to the content planned (else
        ``CHECKSUM_MISMATCH`` with ``context.planned``).

        A migration whose ``requires`` are not done fails the run with ``BACKGROUND_PENDING``;
        with ``on_background_pending="stop"`` the run ends cleanly before it instead (event
        ``background:waiting``; :func:`run_migrations` reports it as ``waiting``).

        A bulk ``up`` converges the declared collections after the migrations, in the same run,
        when ``converge`` is true (unset: the ``converge_after_up`` config key) — even when
        nothing was pending. It still returns the migration rows only; a failed converge raises
        ``CONVERGE_FAILED`` with ``context.results`` (the rows, applied and recorded) and
        ``context.converge``. ``converge=True`` with ``file`` or ``to`` is ``CONFIG_INVALID``.
        """
        return migrate.up(self._ws, file, to=to, step=step, force=force, no_lock=no_lock,
                          strict=strict, batch=batch, requested_by=requested_by, reason=reason,
                          on_background_pending=on_background_pending, converge=converge,
                          ordered=ordered, checksum=checksum)

    def down(self, file: str | None = None, *, steps: int | None = None,
             batch: int | None = None, to: str | None = None, no_lock: bool = False,
             requested_by: str | None = None, reason: str | None = None,
             ordered: bool = False) -> list[RunResult]:
        """Revert the last batch (or a file, ``steps``, a ``batch``, everything after ``to``);
        ``ordered=True`` with a file refuses (``MIGRATION_BLOCKED``) unless it is the newest
        applied migration."""
        return migrate.down(self._ws, file, steps=steps, batch=batch, to=to, no_lock=no_lock,
                            requested_by=requested_by, reason=reason, ordered=ordered)

    def redo(self, file: str | None = None, *, no_lock: bool = False,
             requested_by: str | None = None, reason: str | None = None) -> list[RunResult]:
        """Revert then re-apply the newest applied migration (or ``file``) under one lock."""
        return migrate.redo(self._ws, file, no_lock=no_lock, requested_by=requested_by,
                            reason=reason)

    def resolve(self, file: str, *, applied: bool, reason: str,
                requested_by: str | None = None) -> Resolution:
        """Record the outcome of a migration in doubt (``MIGRATION_IN_DOUBT``): ``applied=True``
        when its body finished, ``False`` when it did not (it is pending again). Under the lock;
        ``reason`` is required and kept on the record and in the run log."""
        from migronaut.commands.resolve import resolve

        return resolve(self._ws, file, outcome="applied" if applied else "pending",
                       reason=reason, requested_by=requested_by)

    def converge(self, *, dry_run: bool = False, prune: bool = False, no_lock: bool = False,
                 ordered: bool = False, rebuild_unique: bool = False,
                 wait_for_search_indexes: bool | None = None, requested_by: str | None = None,
                 reason: str | None = None) -> ConvergeResult:
        """Make the declared collections, validators and indexes exist as declared, under the
        lock (``dry_run``: plan only — no lock, no writes, no events). Any conflict refuses the
        whole run before the first write (``CONVERGE_FAILED``); see docs/collections.md."""
        from migronaut.commands import converge as converge_command  # pymongo-heavy: lazily

        return converge_command.converge(self._ws, converge_command.ConvergeOptions(
            dry_run=dry_run, prune=prune, no_lock=no_lock, ordered=ordered,
            rebuild_unique=rebuild_unique, wait_for_search_indexes=wait_for_search_indexes,
            requested_by=requested_by, reason=reason))

    def converges_after_up(self) -> bool:
        """Whether a bulk ``up`` converges afterwards: ``converge_after_up`` is on and something
        is declared. Reads the config only (no connection, no definition file)."""
        from migronaut.commands.up_converge import converges_after_up

        return converges_after_up(self._ws.project.config)

    def converge_history(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` (1–1000) converge history entries, newest first."""
        from migronaut.commands import converge as converge_command

        return converge_command.converge_history(self._ws, limit)

    def import_changelog(self, tool: str = "migrate-mongo", *, source: str | None = None,
                         target: str | None = None, dry_run: bool = False,
                         trust_hash: bool = False, force: bool = False, no_lock: bool = False,
                         requested_by: str | None = None,
                         reason: str | None = None) -> ImportResult:
        """Adopt another tool's record of applied migrations (``migrate-mongo``,
        ``mongodb-migrations``, or ``migronaut`` — the Node original) so ``up`` runs only what
        is new; the records are forward-only.

        ``source`` defaults to the tool's collection, ``target`` to the changelog (for
        ``migronaut`` they are the same collection). A non-empty target needs ``force``.
        ``dry_run`` reads only: no lock, no events, no writes — not even an index. How a record
        finds its file: :mod:`migronaut.core.adopt`.
        """
        return adopt.import_changelog(
            self._ws, tool, source=source, target=target, dry_run=dry_run,
            trust_hash=trust_hash, force=force, no_lock=no_lock, requested_by=requested_by,
            reason=reason)

    def baseline(self, to: str | None = None, *, dry_run: bool = False, no_lock: bool = False,
                 requested_by: str | None = None, reason: str | None = None) -> BaselineResult:
        """Mark the pending files (up to ``to``, inclusive) applied WITHOUT running them, in one
        batch — for a database whose schema already matches them. Re-runnable; the records are
        forward-only. ``dry_run`` reads only: no lock, no events, no writes."""
        return adopt.baseline(self._ws, to, dry_run=dry_run, no_lock=no_lock,
                              requested_by=requested_by, reason=reason)

    def stop(self, reason: str = "Run stopped by request") -> None:
        """Finish the migration in flight, skip the rest, release the lock: ``RUN_ABORTED``."""
        self._ws.slot.stop(reason)

    # -- background migrations ----------------------------------------------------------------
    @property
    def background(self) -> BackgroundEngine:
        """The background engine of this database (state, coordinator, controls, views)."""
        return self._background.engine

    @property
    def _waiting(self) -> list[dict[str, Any]]:
        """What the last ``up`` with ``on_background_pending="stop"`` stopped at."""
        return self._ws.waiting

    @property
    def _last_converge(self) -> ConvergeResult | None:
        """The converge the last ``up`` ran after its migrations, if it converged."""
        result: ConvergeResult | None = self._ws.last_converge
        return result


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

    Every option is checked before anything connects: a bad one is ``CONFIG_INVALID`` naming it
    (``context.option``).
    """
    startup.check_startup_options(
        on_lock_held, on_background_pending, lock_wait_timeout_ms, lock_poll_interval_ms,
        no_lock=no_lock, stop_event=stop_event, on_migrator=on_migrator,
        config_path=config_path, cwd=cwd)
    migrator = _make_migrator(config, config_path=config_path, cwd=cwd, **overrides)
    return startup.run_at_startup(
        migrator, on_lock_held=on_lock_held, on_background_pending=on_background_pending,
        lock_wait_timeout_ms=lock_wait_timeout_ms, lock_poll_interval_ms=lock_poll_interval_ms,
        no_lock=no_lock, stop_event=stop_event, on_migrator=on_migrator)


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
