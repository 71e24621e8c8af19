"""What a migration body and a hook receive: :class:`MigrationContext` and its cancellation token.

The token is the Python counterpart of the original's ``AbortSignal``: it is set on ``stop()``,
SIGINT/SIGTERM, a lost lock or a timeout, carrying the typed error as its reason. A body that
loops over many documents should call ``ctx.cancellation.raise_if_cancelled()`` between batches;
nothing ever interrupts a body from outside.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from migronaut.errors import MigronautError, RunAbortedError

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.client_session import ClientSession
    from pymongo.database import Database

__all__ = [
    "Cancellation", "CoroutineBridge", "LinkedCancellation", "MigrationContext", "RunInfo",
]

Direction = Literal["up", "down"]


class CoroutineBridge(Protocol):
    """Where ``async def`` bodies run: what :class:`~migronaut.core.async_bridge.AsyncBridge`
    offers a context (declared here, so the context does not import the bridge)."""

    def call(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def coloured(self, ctx: MigrationContext, session: Any = None) -> MigrationContext: ...

    def transaction(self, callback: Callable[[Any, Any], Awaitable[None]]) -> None: ...


class Cancellation:
    """A thread-safe, one-way cancellation flag with a typed reason."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason: MigronautError | None = None
        self._lock = threading.Lock()
        #: linked cancellations to wake when this one is set (weakly: a lane's come and go)
        self._linked: weakref.WeakSet[Cancellation] | None = None

    def cancel(self, reason: MigronautError) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._event.set()
        self._wake_linked()

    def _link(self, child: Cancellation) -> None:
        """Wake ``child`` when this one is set (at once if it already is)."""
        with self._lock:
            if self._linked is None:
                self._linked = weakref.WeakSet()
            self._linked.add(child)
        if self.cancelled:
            child._wake()

    def _wake(self) -> None:
        """A parent was set: so is this one's event (its reason stays the parent's), and the
        cancellations linked below it are woken in turn."""
        self._event.set()
        self._wake_linked()

    def _wake_linked(self) -> None:
        with self._lock:
            linked = list(self._linked) if self._linked else []
        for child in linked:
            child._wake()

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


class LinkedCancellation(Cancellation):
    """A cancellation that is also set when its parent is, or when ``also()`` says so.

    Lanes stop with their driver, and a lane's pacing waits end early on a control. The parent
    wakes this one's event when it is set, so a :meth:`wait` sleeps without polling; only an
    ``also`` predicate (which nothing signals) is polled, every ``poll_s`` seconds.
    """

    def __init__(
        self,
        parent: Cancellation,
        *,
        also: Callable[[], bool] | None = None,
        stopped: str = "Run stopped by request",
        poll_s: float = 0.1,
    ) -> None:
        super().__init__()
        self._parent = parent
        self._also = also
        self._stopped = stopped
        self._poll_s = poll_s
        parent._link(self)

    @property
    def cancelled(self) -> bool:
        return (super().cancelled or self._parent.cancelled
                or (self._also is not None and self._also()))

    @property
    def reason(self) -> MigronautError | None:
        return super().reason or self._parent.reason

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise self.reason or RunAbortedError(self._stopped)

    def wait(self, timeout: float | None = None) -> bool:
        if self._also is None:
            return self._event.wait(timeout) or self.cancelled
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.cancelled:
            remaining = self._poll_s if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            super().wait(min(self._poll_s, remaining))
        return True


_T = TypeVar("_T")


def _changed(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for these frozen dataclasses without ``__post_init__``: a copy of
    the instance's fields with ``changes`` (fields only, as ``replace`` would check). Five times
    cheaper: it runs twice per migration of a run."""
    fields = obj.__dict__
    if not fields.keys() >= changes.keys():
        raise TypeError(f"unknown field: {', '.join(sorted(changes.keys() - fields.keys()))}")
    copy = object.__new__(type(obj))
    copy.__dict__.update(fields, **changes)
    return copy


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
    bridge: CoroutineBridge | None = field(default=None, repr=False, compare=False)

    def with_session(self, session: ClientSession | None) -> MigrationContext:
        return replace(self, session=session)

    def for_migration(self, **run: Any) -> MigrationContext:
        bind = getattr(self.logger, "bind", None)  # ctx.logger keeps its line sink
        logger = bind(**run) if callable(bind) else logging.LoggerAdapter(
            self.logger.logger,
            {**(self.logger.extra or {}), **{k: v for k, v in run.items() if v is not None}},
        )
        return _changed(self, run=_changed(self.run, **run), logger=logger)
