"""Outages are not failures: how a lane rides one out and starts again with exact totals.

A lost connection, an election or a primary stepping down (see
:func:`migronaut.core.retry.is_outage`) is ridden out by the lane holding the partition: it keeps
its lease (the keeper keeps renewing), backs off (:class:`Outage`), then starts again from what
the partition document records (:func:`reload`) — settling the write intent's batch
(:func:`recover`) and reading on from the stored cursor — so a write whose reply was lost is
counted exactly once, whenever it lands. Only an outage longer than ``maxOutageMs`` counts as a
failed slice.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.failures import describe_server
from migronaut.background.batches.unit import BatchUnit, Hold, add_counters, nonzero
from migronaut.background.lanes.settle import Outcome
from migronaut.background.lanes.turn import LaneState
from migronaut.background.state.store import Lease
from migronaut.core.retry import is_outage
from migronaut.errors import LockLostError, RunAbortedError

__all__ = [
    "OUTAGE_PAUSE_MAX_S", "OUTAGE_PAUSE_S", "Outage", "recover", "reload", "work_through_outages",
]

#: First pause of an outage (seconds); it doubles up to :data:`OUTAGE_PAUSE_MAX_S`, jittered.
OUTAGE_PAUSE_S = 0.1
OUTAGE_PAUSE_MAX_S = 5.0


class Outage:
    """How long a lane has been riding out an outage, against the ``maxOutageMs`` budget."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_s = max(0, budget_ms) / 1000.0
        self.since: float | None = None
        self.tries = 0

    def clear(self) -> None:
        """Progress: the outage (if any) is over."""
        self.since, self.tries = None, 0

    def ride_out(self, error: BaseException, lane: LaneState) -> bool:
        """Wait before trying again (jittered, doubling); ``False`` when the budget is spent
        and ``error`` should count as a failure. A stop or a lost lease ends the wait."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            lane.logger.info("%s: %s — retrying for up to %gs", lane.name, describe_server(error),
                             self.budget_s, extra={"migration": lane.name})
        if now - self.since >= self.budget_s:
            return False
        pause = min(OUTAGE_PAUSE_MAX_S, OUTAGE_PAUSE_S * 2 ** min(self.tries, 10))
        self.tries += 1
        if lane.signal.wait(pause * random.uniform(0.5, 1.0)):
            lane.signal.raise_if_cancelled()
        return True


def work_through_outages(
    lane: LaneState, batches: BatchUnit, checkpoints: Checkpoints, outage: Outage, hold: Hold,
    partition: Mapping[str, Any], counters: dict[str, int],
    work: Callable[[Hold, dict[str, int]], Outcome],
) -> Outcome:
    """``work`` the partition; after an outage (lost connection, election) start again from
    what the partition document says, keeping the lease.

    Whatever of the lane's work landed is exactly what the stored partition records: its
    checkpoint's counters and cursor, and the intent naming the one batch that may have been
    written after it. Starting again from there — settling the intent's batch, then reading on
    from the stored cursor — counts every document once, whether the last command applied
    before its reply was lost, never applied, or applies later still. Outages are not failures until
    the outage budget (``maxOutageMs``) runs out; the lease keeper keeps renewing meanwhile.
    """
    part = hold.part
    while True:
        try:
            if partition.get("inflight"):
                recover(lane, batches, checkpoints, hold, partition["inflight"], counters)
            outcome = work(hold, counters)
            if part.unflushed:
                checkpoints.flush(hold.lease, part, hold.controller)
            return outcome
        except Exception as error:
            if isinstance(error, (LockLostError, RunAbortedError)) or lane.caller.cancelled:
                raise
            if not is_outage(error) or not outage.ride_out(error, lane):
                raise
        for key, value in part.pending.items():  # written, maybe not recorded: see intent
            counters[key] = counters.get(key, 0) - value
        reloaded = reload(lane, outage, hold.lease)
        if reloaded is None:
            return Outcome("exhausted", counters)
        partition = reloaded
        part.cursor = dict(partition.get("cursor") or {})
        part.pending, part.pending_errors = {}, []
        part.intent = bool(partition.get("inflight"))


def reload(lane: LaneState, outage: Outage, lease: Lease) -> dict[str, Any] | None:
    """The held partition as stored (outages ridden out); ``None`` when it is done.

    ``LOCK_LOST`` when another lane holds it now (a reaper took the lease meanwhile).
    """
    while True:
        try:
            doc = lane.store.partitions.find_one({"_id": lease.partition_id})
            break
        except Exception as error:
            if not is_outage(error) or not outage.ride_out(error, lane):
                raise
    if doc is not None and (doc.get("lease") or {}).get("token") == lease.token:
        return doc
    if doc is not None and doc.get("status") == "done":
        return None  # its last checkpoint landed, or its next holder finished it
    raise LockLostError("Lost the partition lease", {"lease": True,
                                                     "partition": str(lease.partition_id)})


def recover(
    lane: LaneState, batches: BatchUnit, checkpoints: Checkpoints, hold: Hold,
    inflight: Mapping[str, Any], counters: dict[str, int],
) -> None:
    """Settle the batch a holder named in its last checkpoint but did not checkpoint since
    (it crashed, or lost the reply of its write): its write may have landed, may land later,
    or never. The batch unit settles it (:meth:`BatchUnit.settle_intent`: in plain batches the
    documents already written are counted and the others written again, guarded, so whichever
    write lands counts once) and the fenced checkpoint records it and clears the intent.
    """
    part = hold.part
    found = nonzero(batches.settle_intent(hold, list(inflight.get("ids") or ())))
    part.intent = True
    part.pending = dict(found)
    checkpoints.flush(hold.lease, part, None)
    add_counters(counters, found)
    if found.get("migrated"):
        lane.logger.debug("%s: %d document(s) of a batch in doubt were counted",
                          lane.name, found["migrated"], extra={"partition": part.key})
