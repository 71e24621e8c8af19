"""Where a run's ``async def`` bodies and hooks run: an event loop and an ``AsyncMongoClient``.

"The context matches the body's colour": a plain ``def`` gets pymongo's sync objects, an
``async def`` gets ``AsyncDatabase``/``AsyncMongoClient``/``AsyncClientSession``. The engine
itself stays synchronous and runs in one thread; an async body is submitted to the bridge's loop
and the engine thread waits for it. Under :class:`~migronaut.Migrator` the loop is a private one
(own thread, started on the first async body); under :class:`~migronaut.AsyncMigrator` it is the
caller's loop, so the engine must never run on that loop's thread (it runs in a worker thread).
A client the bridge made is closed with the bridge at the end of the run; an injected one never.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from migronaut.core.context import MigrationContext
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient
    from pymongo.asynchronous.client_session import AsyncClientSession

__all__ = ["AsyncBridge", "twin_client"]

T = TypeVar("T")
AsyncClient = Any  # AsyncMongoClient[dict[str, Any]]; Any keeps user-facing ctx fields simple


def twin_client(client: Any, cls: type[T]) -> T:
    """A new client of the other colour with the same constructor arguments as ``client``."""
    kwargs = getattr(client, "_init_kwargs", None)
    if not isinstance(kwargs, dict):
        raise ConfigInvalidError(
            f"Cannot derive a {cls.__name__} from the injected client: also set uri",
            {"option": "client"},
        )
    return cls(**kwargs)


class _Carried(Exception):
    """A coroutine's ``SystemExit``/``KeyboardInterrupt`` on its way to the engine thread.

    Raised as such inside a task, asyncio re-raises it out of the loop — stopping the loop's
    thread, while the engine thread waits for a result that never comes. Wrapped, it travels as
    the task's exception and is raised again, unwrapped, in the thread that waits.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(type(error).__name__)
        self.error = error


class AsyncBridge:
    """Runs coroutines for the engine thread on one loop, with one ``AsyncMongoClient``."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        client: AsyncMongoClient[dict[str, Any]] | None = None,
        client_factory: Callable[[], AsyncMongoClient[dict[str, Any]]] | None = None,
    ) -> None:
        self._loop = loop
        self._thread: threading.Thread | None = None
        self._client = client
        self._factory = client_factory
        self._owns_client = client is None
        self._lock = threading.Lock()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="migronaut-async-loop",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _client_on_loop(self) -> AsyncMongoClient[dict[str, Any]]:
        """The client, made on the loop that will use it (an async client binds to its loop)."""
        if self._client is None:
            assert self._factory is not None
            self._client = self._factory()
        return self._client

    def submit(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the loop and wait for it (from a thread that is not the loop's).

        The caller's ``contextvars`` travel with it (``run_coroutine_threadsafe`` copies them).
        """
        loop = self._ensure_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("migronaut: the engine must not run on its bridge's event loop")

        async def main() -> T:
            try:
                return await make()
            except (SystemExit, KeyboardInterrupt) as error:
                raise _Carried(error) from None

        try:
            return asyncio.run_coroutine_threadsafe(main(), loop).result()
        except _Carried as carried:
            raise carried.error from None

    def coloured(
        self, ctx: MigrationContext, session: AsyncClientSession | None = None
    ) -> MigrationContext:
        """``ctx`` with the async client, database and (transaction) session (on the loop)."""
        client = self._client_on_loop()
        # The fields are typed with the sync colour (what most bodies get): hence the Any.
        colour: dict[str, Any] = {"client": client, "db": client[ctx.db.name], "session": session}
        return replace(ctx, **colour)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await ``fn(*args)`` on the loop, every :class:`MigrationContext` argument coloured."""

        async def main() -> Any:
            coloured = [self.coloured(a) if isinstance(a, MigrationContext) else a for a in args]
            return await fn(*coloured)

        return self.submit(main)

    def transaction(
        self, callback: Callable[[AsyncClientSession, AsyncClient], Awaitable[None]]
    ) -> None:
        """Run ``callback(session, client)`` in ``with_transaction`` of an async session."""

        async def main() -> None:
            client = self._client_on_loop()
            async with client.start_session() as session:
                await session.with_transaction(lambda s: callback(s, client))

        self.submit(main)

    def close(self) -> None:
        """Close the client the bridge made and stop its private loop; never raises."""
        client, self._client = self._client, None
        if client is not None and self._owns_client and self._loop is not None:
            try:
                self.submit(client.close)
            except Exception:
                pass
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self._loop, self._thread = None, None
