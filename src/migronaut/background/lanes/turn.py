"""What every unit of one lane turn shares: the migration, how the turn stops, where events go.

A lane turn (a *slice*, :func:`migronaut.background.lanes.slices.run_slice`) is worked by small
units — the skeleton in :mod:`~migronaut.background.lanes.slices`, the lease keeper, a batch unit of
:mod:`migronaut.background.batches`. They share one :class:`LaneState`, owned by the thread that
called ``run_slice``: the pinned spec and plan generation, the stop signal (the caller's
cancellation, a lost lease), the control outcome the lease keeper read, the deadline, the user
logger and the event sink. It also holds the shapes user code receives as ``ctx``.

Invariant: **a stop is noticed, never missed.** :attr:`LaneState.signal` is set when the caller
cancels or the lease is lost; :attr:`LaneState.pacing` also when the keeper read a control
outcome (pause, cancel, new plan), so pacing waits end early on it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from migronaut.background.lanes.throttle import Throttle
from migronaut.background.planning.sharding import epoch_is_stale
from migronaut.core.context import Cancellation, LinkedCancellation
from migronaut.errors import LockLostError
from migronaut.observability.migration_log import MigrationLogger, log_line

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.client_session import ClientSession
    from pymongo.database import Database

    from migronaut.background.planning.job import BackgroundJob
    from migronaut.background.state.store import BackgroundStore, Lease

Emit = Callable[[str, dict[str, Any]], None]

_POLL_S = 0.05


@dataclass(frozen=True)
class BackgroundInfo:
    """``ctx.background``: which migration, plan generation and partition a call works for.

    ``attempt`` counts the transactions a transactional batch went through (1 otherwise).
    """

    name: str
    generation: int
    partition: str
    attempt: int = 1
    run_id: str | None = None


@dataclass(frozen=True)
class TransformContext:
    """The ``ctx`` of ``migrate(doc, ctx)`` / ``migrate_batch(docs, ctx)`` (and the reverts).

    ``cancellation`` is set when the slice stops (the lane finishes the batch regardless);
    ``session``/``db``/``client`` are set only in transactional mode — pass ``session`` to side
    writes that must commit with the batch.
    """

    cancellation: Cancellation
    logger: logging.LoggerAdapter[logging.Logger]
    direction: str
    background: BackgroundInfo
    session: ClientSession | None = None
    db: Database[dict[str, Any]] | None = None
    client: MongoClient[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StepContext:
    """The ``ctx`` of ``step(ctx)`` / ``revert_step(ctx)`` (reference §1.7).

    ``checkpoint`` is ``None`` on the first call, then what the previous call returned;
    ``deadline`` is the slice's end in epoch milliseconds; ``session`` only in transactional mode.
    """

    db: Database[dict[str, Any]]
    client: MongoClient[dict[str, Any]]
    checkpoint: Any
    deadline: int
    cancellation: Cancellation
    logger: logging.LoggerAdapter[logging.Logger]
    direction: str
    background: BackgroundInfo
    session: ClientSession | None = None


class LaneState:
    """One slice's shared state; owned by the thread that called ``run_slice``."""

    def __init__(
        self,
        *,
        store: BackgroundStore,
        job: BackgroundJob,
        db: Database[dict[str, Any]],
        state: Mapping[str, Any],
        caller: Cancellation,
        slice_ms: int | None,
        emit: Emit,
        logger: logging.Logger,
        run_id: str | None,
    ) -> None:
        self.store = store
        self.job = job
        self.db = db
        self.name = job.name
        self.spec: Mapping[str, Any] = job.spec
        self.direction = job.direction
        self.mode = str(self.spec.get("mode", "declarative"))
        transaction = self.spec.get("transaction") or False
        self.transaction: Mapping[str, Any] | None = (
            transaction if isinstance(transaction, Mapping) else None
        )
        self.logger = logger
        self.run_id = run_id
        self.generation = int(state["generation"])
        self.state_bad_ids: list[Any] = list(state.get("badIds") or [])
        #: ``{uuid, key}`` of a sharded collection: a reshard makes the plan stale
        self.epoch: Mapping[str, Any] | None = state["plan"].get("epoch")
        #: the first stop outcome the lease keeper read (``paused``, ``stale``, …)
        self.control: str | None = None
        self.lost = False
        self.caller = caller
        self.signal = LinkedCancellation(caller, stopped="Slice stopped", poll_s=_POLL_S)
        self.pacing = LinkedCancellation(self.signal, also=lambda: self.control is not None,
                                         stopped="Slice stopped", poll_s=_POLL_S)
        budget_ms = slice_ms if slice_ms is not None else int(self.spec.get("sliceMs", 30_000))
        self.deadline = time.monotonic() + budget_ms / 1000.0
        self.deadline_epoch_ms = int(time.time() * 1000) + budget_ms
        self._emit = emit
        self._log_seq = itertools.count(1)
        self.user_logger = MigrationLogger(
            logger, {"migration": self.name, "runId": run_id}, sink=self._user_line
        )
        self.throttle = Throttle(
            name=self.name, spec=self.spec, hook=job.functions.throttle, db=db,
            cancellation=self.pacing, logger=logger,
        )

    def info(self, partition: str, generation: int, attempt: int = 1) -> BackgroundInfo:
        """``ctx.background`` for a call on ``partition``."""
        return BackgroundInfo(self.name, generation, partition, attempt, self.run_id)

    # -- events ---------------------------------------------------------------------------
    def emit(self, event: str, payload: dict[str, Any]) -> None:
        body = {"migration": self.name, **payload}
        if self.run_id is not None:
            body["runId"] = self.run_id
        try:
            self._emit(event, body)
        except Exception as error:  # listeners never break work
            self.logger.debug("listener for %s failed: %s", event, error)

    def report(self, report: Any) -> None:
        """A throttle report of the adaptive controller, as a ``background:throttle`` event."""
        if report is not None:
            self.emit("background:throttle", {
                "reason": report.reason, "batchSize": report.batch_size,
                "pauseMs": report.pause_ms,
            })

    def _user_line(
        self, level: int, msg: object, args: tuple[Any, ...], fields: dict[str, Any],
        correlation: Mapping[str, Any], userland: bool,
    ) -> None:
        """A ``userland`` ``ctx.logger`` line of a transform or step: ``migration:log`` with
        ``kind: 'background'`` (reference background §7.1); other lines only reach the logger."""
        if userland:
            self.emit("migration:log", log_line(
                kind="background", level=level, msg=msg, args=args, fields=fields,
                correlation=correlation, seq=next(self._log_seq)))

    # -- stops ----------------------------------------------------------------------------
    def resharded(self) -> bool:
        """Whether the collection was resharded since the plan (its epoch is stale)."""
        if not self.epoch:
            return False
        return epoch_is_stale(self.db, str(self.spec.get("collection")), self.epoch)

    def lose(self, lease: Lease) -> None:
        """Called by the lease keeper: the lease is gone; stop the lane."""
        self.lost = True
        self.signal.cancel(
            LockLostError(
                "Lost the partition lease: another lane holds it now",
                {"lease": True, "partition": str(lease.partition_id)},
            )
        )
