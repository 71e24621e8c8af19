"""What a migration body and a hook receive: :class:`MigrationContext` and its cancellation token.

The token is the Python counterpart of the original's ``AbortSignal``: it is set on ``stop()``,
SIGINT/SIGTERM, a lost lock or a timeout, carrying the typed error as its reason. A body that
loops over many documents should call ``ctx.cancellation.raise_if_cancelled()`` between batches;
nothing ever interrupts a body from outside.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from migronaut.errors import MigronautError, RunAbortedError

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.client_session import ClientSession
    from pymongo.database import Database

    from migronaut.core.async_bridge import AsyncBridge

__all__ = ["Cancellation", "MigrationContext", "RunInfo"]

Direction = Literal["up", "down"]


class Cancellation:
    """A thread-safe, one-way cancellation flag with a typed reason."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason: MigronautError | None = None
        self._lock = threading.Lock()

    def cancel(self, reason: MigronautError) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> MigronautError | None:
        return self._reason

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise self._reason or RunAbortedError("Run stopped by request")

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds; ``True`` as soon as the run is cancelled."""
        return self._event.wait(timeout)


@dataclass(frozen=True)
class RunInfo:
    """Frozen facts about the run and the migration in flight."""

    id: str
    direction: Direction | None = None
    migration: str | None = None
    batch: int | None = None
    attempt: int = 1
    requested_by: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class MigrationContext:
    """The single argument of ``up(ctx)``, ``down(ctx)`` and every hook.

    ``session`` is set only inside a transaction: pass ``session=ctx.session`` to every operation
    that must be part of it. An ``async def`` body or hook gets the async colour: ``db``,
    ``client`` and ``session`` are pymongo's ``AsyncDatabase``, ``AsyncMongoClient`` and
    ``AsyncClientSession`` (see <https://migronaut.readthedocs.io/en/latest/async/>).
    """

    db: Database[dict[str, Any]]
    client: MongoClient[dict[str, Any]]
    cancellation: Cancellation
    logger: logging.LoggerAdapter[logging.Logger]
    run: RunInfo
    session: ClientSession | None = None
    #: Where ``async def`` bodies run (set by the migrator for its runs); internal.
    bridge: AsyncBridge | None = field(default=None, repr=False, compare=False)

    def with_session(self, session: ClientSession | None) -> MigrationContext:
        return replace(self, session=session)

    def for_migration(self, **run: Any) -> MigrationContext:
        bind = getattr(self.logger, "bind", None)  # ctx.logger keeps its line sink
        logger = bind(**run) if callable(bind) else logging.LoggerAdapter(
            self.logger.logger,
            {**(self.logger.extra or {}), **{k: v for k, v in run.items() if v is not None}},
        )
        return replace(self, run=replace(self.run, **run), logger=logger)
