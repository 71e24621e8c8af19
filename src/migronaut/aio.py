"""The asyncio API: :class:`AsyncMigrator` and :func:`arun_migrations` (FastAPI start-up).

Not a second engine: every call runs the synchronous engine of :class:`~migronaut.Migrator` in a
worker thread (``asyncio.to_thread``), so the event loop never blocks, while ``async def``
migration bodies and hooks come back to the caller's loop with pymongo's ``AsyncMongoClient``
(the context matches the body's colour, see :mod:`migronaut.core.async_bridge`). A plain ``def``
body keeps the sync objects and runs in the worker thread.

Cancellation: when the awaiting task is cancelled, the migrator is stopped — the migration in
flight finishes, the rest is skipped, the lock is released — and ``CancelledError`` is re-raised
once the run has ended (a second cancellation stops the waiting, not the run).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, cast

from migronaut.api import Migrator, ProgressReporter, run_migrations
from migronaut.core.connection import Connection
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from pymongo import MongoClient

    from migronaut.core.async_bridge import AsyncBridge
    from migronaut.core.config import Config
    from migronaut.core.project import Project
    from migronaut.core.results import MigrationSummary
    from migronaut.observability.events import Listener

__all__ = ["AsyncMigrator", "arun_migrations"]

P = ParamSpec("P")
R = TypeVar("R")
STOPPED_BY_CANCEL = "Run stopped: the awaiting task was cancelled"


class _LoopConnection(Connection):
    """The connection of an :class:`AsyncMigrator`'s engine: the ``client`` config key is an
    ``AsyncMongoClient``, and ``async def`` bodies go to the caller's loop."""

    def __init__(self, project: Project) -> None:
        super().__init__(project)
        self.loop: asyncio.AbstractEventLoop | None = None

    def injected_client(self, client: Any) -> tuple[MongoClient[dict[str, Any]], bool]:
        from pymongo import AsyncMongoClient, MongoClient

        from migronaut.core.async_bridge import twin_client

        if not isinstance(client, AsyncMongoClient):
            raise ConfigInvalidError(
                f"Invalid configuration: client must be a pymongo AsyncMongoClient for "
                f"AsyncMigrator, got {type(client).__name__}",
                {"issues": [{"path": "client", "message": "must be a pymongo AsyncMongoClient"}]},
            )
        # The engine's own reads and writes (changelog, lock) use a sync twin it owns.
        return twin_client(client, MongoClient), True

    def new_bridge(self) -> AsyncBridge:
        from pymongo import AsyncMongoClient

        from migronaut.core.async_bridge import AsyncBridge

        if self.loop is None:  # called outside an AsyncMigrator coroutine: a private loop
            return super().new_bridge()
        config = self._project.config
        if config.client is not None:
            return AsyncBridge(loop=self.loop, client=config.client)
        options = self.client_options()
        return AsyncBridge(loop=self.loop,
                           client_factory=lambda: AsyncMongoClient(config.uri, **options))


class _LoopEngine(Migrator):
    """The sync engine of an :class:`AsyncMigrator`: async bodies go to the caller's loop, and
    the ``client`` config key is an ``AsyncMongoClient``."""

    _connection = _LoopConnection

    def __init__(self, *args: Any, loop: asyncio.AbstractEventLoop | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The caller's loop (set by each coroutine of the :class:`AsyncMigrator`)."""
        return cast("_LoopConnection", self._ws.connection).loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        cast("_LoopConnection", self._ws.connection).loop = loop


async def _off_loop(stop: Callable[[str], None], fn: Callable[[], R]) -> R:
    """Await ``fn()`` run in a worker thread; on cancellation stop, wait for the end, re-raise."""
    work = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop(STOPPED_BY_CANCEL)
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            pass  # the run's own error (RUN_ABORTED…) yields to the cancellation
        raise


def _threaded(
    method: Callable[Concatenate[Migrator, P], R],
) -> Callable[Concatenate[AsyncMigrator, P], Coroutine[Any, Any, R]]:
    """The ``async def`` twin of a :class:`Migrator` method (same arguments, same result)."""

    async def twin(self: AsyncMigrator, /, *args: P.args, **kwargs: P.kwargs) -> R:
        engine = self.engine
        engine.loop = asyncio.get_running_loop()
        return await _off_loop(engine.stop, functools.partial(method, engine, *args, **kwargs))

    functools.update_wrapper(twin, method)  # name and docstring (the return type stays twin's)
    return twin


class AsyncMigrator:
    """:class:`~migronaut.Migrator` for asyncio applications: the same constructor arguments,
    every method that does I/O is ``async def``; ``client=`` takes an ``AsyncMongoClient``
    (never closed by migronaut)::

        async with AsyncMigrator(uri="mongodb://localhost:27017", db_name="app") as migrator:
            await migrator.up()
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None = None,
        *,
        config_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        progress: ProgressReporter | None = None,
        **overrides: Any,
    ) -> None:
        self.engine = _LoopEngine(config, config_path=config_path, cwd=cwd, progress=progress,
                                  **overrides)

    @property
    def config(self) -> Config:
        return self.engine.config

    @property
    def warnings(self) -> list[str]:
        return self.engine.warnings

    # Plain methods: thread-safe, no I/O.
    def on(self, event: str, listener: Listener) -> AsyncMigrator:
        """Listen to a lifecycle event; listeners run in the engine's worker thread."""
        self.engine.on(event, listener)
        return self

    def off(self, event: str, listener: Listener) -> AsyncMigrator:
        self.engine.off(event, listener)
        return self

    def stop(self, reason: str = "Run stopped by request") -> None:
        """Finish the migration in flight, skip the rest, release the lock: ``RUN_ABORTED``."""
        self.engine.stop(reason)

    def converges_after_up(self) -> bool:
        """Whether a bulk ``up`` converges afterwards (config only, no I/O)."""
        return self.engine.converges_after_up()

    connect = _threaded(Migrator.connect)
    up = _threaded(Migrator.up)
    down = _threaded(Migrator.down)
    redo = _threaded(Migrator.redo)
    resolve = _threaded(Migrator.resolve)
    converge = _threaded(Migrator.converge)
    converge_history = _threaded(Migrator.converge_history)
    status = _threaded(Migrator.status)
    pending = _threaded(Migrator.pending)
    dry_run = _threaded(Migrator.dry_run)
    lock_status = _threaded(Migrator.lock_status)
    lock_info = _threaded(Migrator.lock_info)
    unlock = _threaded(Migrator.unlock)
    create = _threaded(Migrator.create)
    next_batch = _threaded(Migrator.next_batch)
    plan_sequence = _threaded(Migrator.plan_sequence)
    import_changelog = _threaded(Migrator.import_changelog)
    baseline = _threaded(Migrator.baseline)
    audit = _threaded(Migrator.audit)
    runs = _threaded(Migrator.runs)
    run_log = _threaded(Migrator.run_log)
    aclose = _threaded(Migrator.close)
    close = aclose

    async def __aenter__(self) -> AsyncMigrator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def arun_migrations(
    config: Config | Mapping[str, Any] | None = None,
    *,
    on_lock_held: Literal["throw", "wait"] = "throw",
    **options: Any,
) -> MigrationSummary:
    """:func:`~migronaut.run_migrations` for an asyncio start-up (FastAPI lifespan): the same
    arguments; ``async def`` bodies run on the caller's loop, ``client=`` is an
    ``AsyncMongoClient``, and cancelling the awaiting task stops the run (or the lock wait)."""
    loop = asyncio.get_running_loop()
    stop_event = options.pop("stop_event", None) or threading.Event()
    make = functools.partial(_LoopEngine, loop=loop)
    return await _off_loop(
        lambda _reason: stop_event.set(),
        functools.partial(run_migrations, config, on_lock_held=on_lock_held,
                          stop_event=stop_event, _make_migrator=make, **options),
    )
