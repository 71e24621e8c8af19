"""Lanes: one slice of work on a background migration — claim, hold, batches, settle.

:func:`run_slice` is one lane turn (reference background §4): it claims a partition and a slot,
keeps the lease alive, works the partition in batches, records every batch with a checkpoint
fenced by the lease token, enforces the error budgets and returns an outcome. This module is the
skeleton — claim → hold the lease → run batches → settle → release — and each step has its unit:

================================================  =============================================
:mod:`~migronaut.background.lanes.turn`           what the units share: spec, stop signal,
                                                  control outcome, deadline, events, ``ctx``
:mod:`~migronaut.background.lanes.lease_keeper`   lease = slot: renewals on the heartbeat
                                                  thread, the lane's control subscription
:mod:`~migronaut.background.batches`              one :class:`~.batches.unit.BatchUnit` per mode:
                                                  :mod:`~.batches.plain`,
                                                  :mod:`~.batches.transactional`,
                                                  :mod:`~.batches.step`, chosen by
                                                  :mod:`~.batches.modes`; fenced checkpoint and
                                                  exact totals in :mod:`~.batches.checkpoints`
:mod:`~migronaut.background.lanes.recovery`       outages ridden out, intents counted once
:mod:`~migronaut.background.lanes.settle`         how the lease ends (released, failed, lost)
================================================  =============================================

Control reads live off the lane: one reader thread per store reads the state's control fields
every :data:`CONTROL_INTERVAL_S` for all the lanes of that store
(:mod:`~migronaut.background.lanes.control_feed`), and the skeleton checks the latest answer at each
batch boundary (pacing waits end early on it), so a pause, cancel or new plan is noticed within
about a second plus the batch in flight, without a round trip per batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut._values import is_int
from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.failures import (
    DOCUMENT_WRITE_CODES,
    over_budget_error,
    user_message,
    wrap,
    write_error_message,
)
from migronaut.background.batches.modes import unit_for
from migronaut.background.batches.transactions import TXN_TRANSIENT_CODES
from migronaut.background.batches.unit import Hold, Part, add_counters
from migronaut.background.lanes.lease_keeper import CONTROL_INTERVAL_S, LeaseKeeper
from migronaut.background.lanes.recovery import Outage, reload, work_through_outages
from migronaut.background.lanes.settle import Outcome, release, settle, settle_error
from migronaut.background.lanes.throttle import AdaptiveController, controller_for
from migronaut.background.lanes.turn import (
    BackgroundInfo,
    Emit,
    LaneState,
    StepContext,
    TransformContext,
)
from migronaut.background.state.fields import understood
from migronaut.background.state.store import BackgroundStore, Lease
from migronaut.core.context import Cancellation
from migronaut.errors import (
    ChecksumMismatchError,
    ConfigInvalidError,
    LockLostError,
    MigronautError,
)
from migronaut.observability.telemetry import DISABLED, Telemetry

if TYPE_CHECKING:
    from pymongo.database import Database

    from migronaut.background.planning.job import BackgroundJob

__all__ = [
    "CONTROL_INTERVAL_S",
    "DOCUMENT_WRITE_CODES",
    "OUTCOMES",
    "TXN_TRANSIENT_CODES",
    "BackgroundInfo",
    "SliceResult",
    "StepContext",
    "TransformContext",
    "_user_message",
    "_write_error_message",
    "run_slice",
    "settled_outcome",
]

#: what :mod:`~migronaut.background.tools.watch` reuses from the batches, under its old names
_user_message, _write_error_message = user_message, write_error_message

OUTCOMES = (
    "yielded", "exhausted", "busy", "stale", "paused", "cancelled", "failed", "stopped", "lost",
)


@dataclass(frozen=True)
class SliceResult:
    """What one slice did: an outcome of :data:`OUTCOMES`, the counters it checkpointed, when to
    come back (``busy``) and the error behind a ``failed`` or ``lost`` outcome."""

    outcome: str
    counters: dict[str, int] = field(default_factory=dict)
    retry_after_ms: int | None = None
    error: MigronautError | None = None


def run_slice(
    *,
    store: BackgroundStore,
    job: BackgroundJob,
    db: Database[dict[str, Any]],
    owner: str,
    ttl_ms: int,
    cancellation: Cancellation,
    slice_ms: int | None = None,
    emit: Emit,
    logger: logging.Logger,
    run_id: str | None = None,
    telemetry: Telemetry = DISABLED,
    state: Mapping[str, Any] | None = None,
) -> SliceResult:
    """One lane turn on ``job`` (reference background §4.1).

    ``state`` is the migration's state when the caller has just read it (a coordinator step
    that answered ``process``); otherwise the slice reads it.

    Returns the outcome; raises ``CHECKSUM_MISMATCH`` when the file is not the pinned version,
    ``TRANSACTIONS_UNSUPPORTED`` when a transactional spec meets a standalone server, and a
    :class:`MigronautError` (``context.partitionFailed`` says whether the partition failed for
    good) when the slice failed — after counting the failure on the partition.
    """
    if slice_ms is not None and (
        not is_int(slice_ms)
        or not 1 <= slice_ms <= 3_600_000
    ):
        raise ConfigInvalidError(
            f"sliceMs must be an integer from 1 to 3600000, got {slice_ms!r}",
            {"sliceMs": repr(slice_ms)},
        )
    from pymongo.errors import PyMongoError

    name = job.name
    try:
        if state is None:
            state = store.get(name)
    except PyMongoError as error:
        raise wrap(name, error) from error
    settled = settled_outcome(state)
    if settled is not None:
        return settled
    assert state is not None
    if state.get("checksum") and state["checksum"] != job.checksum:
        raise ChecksumMismatchError(
            f"Background migration {name} changed on disk since it was registered "
            "(a deploy in progress? repin it to adopt the change)",
            {"name": name, "expected": state.get("checksum"), "actual": job.checksum},
        )
    if state.get("direction", "forward") != job.direction:
        return SliceResult("stale")
    try:
        lane = _Lane(
            LaneState(store=store, job=job, db=db, state=state, caller=cancellation,
                      slice_ms=slice_ms, emit=emit, logger=logger, run_id=run_id),
            state, owner=owner, ttl_ms=ttl_ms, telemetry=telemetry,
        )
        if lane.lane.resharded():
            return SliceResult("stale")
        return lane.run()
    except PyMongoError as error:  # claims, state moves: no lease held, nothing to count
        if cancellation.cancelled:
            return SliceResult("stopped")
        raise wrap(name, error) from error


def settled_outcome(state: Mapping[str, Any] | None) -> SliceResult | None:
    """The outcome of a slice on a migration with nothing to claim now (unregistered, paused,
    cancelled, failed, completed, not planned, newer schema), or ``None`` to go on and claim.

    A status, phase, generation, plan or schema migronaut does not know is ``STATE_INVALID``
    naming the field (as for a coordinator step), never "nothing to claim"."""
    if state is None:
        return SliceResult("cancelled")
    if not understood(state):
        return SliceResult("stale")
    status = state.get("status")
    if status in ("paused", "cancelled", "failed"):
        return SliceResult(str(status))
    plan = state.get("plan") or {}
    if status != "running" or state.get("phase") != "process" or not plan.get("token"):
        return SliceResult("exhausted" if status == "completed" else "stale")
    return None


class _Lane:
    """The skeleton of one slice: claims partitions and works each under its lease."""

    def __init__(self, lane: LaneState, state: Mapping[str, Any], *, owner: str, ttl_ms: int,
                 telemetry: Telemetry) -> None:
        self.lane = lane
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.telemetry = telemetry
        self.plan = str(state["plan"]["token"])
        self.partitioner = str(state["plan"].get("partitioner") or "id")
        #: how many partitions the plan has (a done partition is never reopened in its plan)
        self.partitions = int(state["plan"].get("partitions") or 0)
        self.registration = state.get("registration")
        self.first_batch = True
        self.outage = Outage(int(lane.spec.get("maxOutageMs", 300_000)))
        self.checkpoints = Checkpoints(lane)
        self.batches = unit_for(lane, self.checkpoints, state["plan"])

    def run(self) -> SliceResult:
        """Claim partitions one after another until the slice's time is up or none is left."""
        lane, worked = self.lane, False
        slot: int | None = None  # the slot the last partition gave back: claimed first
        counters: dict[str, int] = {}
        max_parallel = int(lane.spec.get("maxParallel", 1) or 1)
        shard_concurrency = (int(lane.spec.get("shardConcurrency", 1) or 1)
                             if self.partitioner == "shard" else None)
        while True:
            if lane.caller.cancelled:
                return SliceResult("stopped", counters)
            if worked and time.monotonic() >= lane.deadline:
                return SliceResult("yielded", counters)
            if worked and lane.resharded():  # (the keeper also checks, once a second)
                return SliceResult("stale", counters)
            claimed = lane.store.claim(
                lane.name, generation=lane.generation, plan=self.plan,
                max_parallel=max_parallel, ttl_ms=self.ttl_ms, owner=self.owner,
                shard_concurrency=shard_concurrency, slot=slot,
            )
            if claimed == "exhausted":
                return SliceResult("exhausted", counters)
            if claimed == "busy" or not isinstance(claimed, Lease):
                if worked:
                    return SliceResult("yielded", counters)
                return SliceResult("busy", counters, retry_after_ms=max(1, self.ttl_ms // 2))
            outcome = self._hold(claimed)
            worked, slot = True, claimed.slot
            add_counters(counters, outcome.counters)
            if outcome.outcome != "exhausted":
                return SliceResult(outcome.outcome, counters, error=outcome.error)
            if self.partitions == 1:  # the plan's one partition is done: nothing to claim
                return SliceResult("exhausted", counters)

    def _hold(self, lease: Lease) -> Outcome:
        """Work one claimed partition under its lease; settle the lease whatever happens."""
        lane = self.lane
        partition = lease.claimed  # as the claim wrote it: no need to read it back
        if partition is None:
            try:
                partition = reload(lane, self.outage, lease)
            except LockLostError:
                partition = None
            except Exception:
                release(lane, lease)
                raise
        if partition is None:
            lane.emit("background:lease:lost", {"partition": str(lease.partition_id)})
            return Outcome("lost", {}, LockLostError(
                "Lost the partition lease right after claiming it", {"lease": True}))
        part = Part(
            id=partition["_id"], key=str(partition["_id"]),
            generation=int(partition.get("generation", lane.generation)),
            scope=partition.get("scope") or {}, cursor=dict(partition.get("cursor") or {}),
        )
        controller = self._controller(partition)
        lane.emit("background:slice:start", {
            "generation": part.generation, "partition": part.key, "slot": lease.slot,
        })
        counters: dict[str, int] = {}
        with self.telemetry.background_slice(
            lane.name, partition=part.key, generation=part.generation, slot=lease.slot,
            run_id=lane.run_id,
        ) as traced:
            try:
                with LeaseKeeper(lane, lease, part.generation,
                                 str(partition.get("plan"))) as keeper:
                    hold = Hold(lease, part, keeper, controller)
                    outcome = work_through_outages(
                        lane, self.batches, self.checkpoints, self.outage, hold, partition,
                        counters, self._work)
            except BaseException as error:
                outcome = settle_error(lane, self.batches, self.checkpoints, lease, part, error,
                                       counters)
            else:
                outcome = settle(lane, lease, part, outcome)
            traced.set({"migronaut.background.slice.outcome": outcome.outcome}, metric=True)
            if outcome.outcome == "failed" and outcome.error is not None:
                traced.fail(outcome.error)
            traced.set({f"migronaut.background.slice.{key}": outcome.counters.get(key)
                        for key in ("batches", "migrated")})
            return outcome

    def _work(self, hold: Hold, counters: dict[str, int]) -> Outcome:
        """Batches until the partition is done, the slice's time is up or something stops it."""
        lane, part, controller = self.lane, hold.part, hold.controller
        batches = 0
        while True:
            if lane.signal.cancelled:
                if lane.caller.cancelled:
                    return Outcome("stopped", counters)
                lane.signal.raise_if_cancelled()
            if batches and time.monotonic() >= lane.deadline:
                return Outcome("yielded", counters)
            if lane.control is not None:
                return Outcome(lane.control, counters)
            size = controller.batch_size if controller else int(lane.spec.get("batchSize", 500))
            if not lane.throttle.before_batch(
                generation=part.generation, partition=part.key, batch_size=size,
                extra_pause_ms=controller.pause_ms if controller else 0,
                first=self.first_batch,
            ):
                continue
            self.first_batch = False
            batch = self.batches.run(hold, size)
            self.outage.clear()
            batches += 1
            add_counters(counters, batch.counters)
            lane.emit("background:batch", {
                "partition": part.key, "counters": batch.counters,
                "latencyMs": round(batch.latency_ms, 3), "batchSize": batch.batch_size,
            })
            if batch.over_budget is not None:
                return Outcome("failed", counters, over_budget_error(
                    lane.name, batch.over_budget, int(lane.spec.get("maxDocumentErrors", 0) or 0),
                    batch.errors[-1].message))
            if batch.done:
                return Outcome("exhausted", counters)

    def _controller(self, partition: Mapping[str, Any]) -> AdaptiveController | None:
        adaptive = self.lane.spec.get("adaptive")
        if self.lane.mode != "declarative" or not isinstance(adaptive, Mapping):
            return None
        key = (self.lane.db.name, self.lane.name, self.registration, partition.get("group"))
        return controller_for(key, adaptive, seed=partition.get("throttle"))

