"""Settling a held partition: whatever happened, its lease ends in exactly one way.

After the lane worked a partition, :func:`settle` and :func:`settle_error` decide what becomes
of the lease (lease = slot): released for the next lane (yielded, paused, stopped…), given up by
the last checkpoint (``done``), failed with the partition (document errors over budget), or
recorded as a failed slice (``maxSliceFailures`` fails the partition). Invariants:

* **A stop is not a failure.** An error while the caller's cancellation is set ends the slice as
  ``stopped`` (progress flushed when possible); only other errors count against
  ``maxSliceFailures``.
* **A lost lease frees only what is still ours**: the release is fenced by the token, a no-op
  when another lane holds the partition now.
"""

from __future__ import annotations

from dataclasses import dataclass

from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.failures import wrap
from migronaut.background.batches.unit import BatchUnit, Part, add_counters
from migronaut.background.lanes.turn import LaneState
from migronaut.background.state.store import Lease
from migronaut.errors import LockLostError, MigronautError, TransactionsUnsupportedError

__all__ = ["Outcome", "release", "settle", "settle_error"]


@dataclass
class Outcome:
    """How the work on one held partition ended, with the counters it checkpointed."""

    outcome: str
    counters: dict[str, int]
    error: MigronautError | None = None


def settle(lane: LaneState, lease: Lease, part: Part, outcome: Outcome) -> Outcome:
    """End a hold that returned: fail the partition over budget, else release the lease (an
    ``exhausted`` partition's last checkpoint already gave it up).

    ``background:slice:end`` goes out first: an exhausted partition's slot is already free, and
    the next claim of it is one round trip — the event must not trail it by another."""
    lane.emit("background:slice:end", {
        "partition": part.key, "outcome": outcome.outcome, "counters": outcome.counters,
    })
    if outcome.counters.get("batches"):
        try:
            lane.store.update_state(lane.name, {}, {}, server_times=["lastProgressAt"])
        except Exception as error:
            lane.logger.debug("lastProgressAt not updated: %s", type(error).__name__)
    if outcome.outcome == "failed" and outcome.error is not None:
        message = outcome.error.message
        lane.store.fail_partition(lease, message)
        lane.store.move(
            lane.name, "fail", set_fields={"lastError": message},
            server_times=["failedAt"], reason="document errors over budget",
        )
        lane.logger.error("✖ %s", message, extra={"migration": lane.name})
        lane.emit("background:failed", {"error": message})
    elif outcome.outcome != "exhausted":
        release(lane, lease)
    return outcome


def settle_error(
    lane: LaneState, batches: BatchUnit, checkpoints: Checkpoints, lease: Lease, part: Part,
    error: BaseException, counters: dict[str, int],
) -> Outcome:
    """End a hold that raised: ``lost``, ``stopped``, or a counted slice failure (raised as a
    :class:`MigronautError` whose ``context.partitionFailed`` says whether the partition
    failed for good)."""
    fenced = isinstance(error, LockLostError) and bool(error.context.get("lease"))
    if lane.lost or fenced:
        lost = error if fenced and isinstance(error, LockLostError) else LockLostError(
            "Lost the partition lease", {"lease": True, "partition": part.key})
        # fenced by the token: frees the slot when the lease is still ours (the partition was
        # superseded or cancelled under it), a no-op when another lane holds it
        release(lane, lease)
        lane.emit("background:lease:lost", {"partition": part.key})
        lane.emit("background:slice:end", {
            "partition": part.key, "outcome": "lost", "counters": counters,
        })
        return Outcome("lost", counters, lost)
    if lane.caller.cancelled and isinstance(error, Exception):
        # a shutdown or deploy, never a failure — whatever the stop made user code raise
        add_counters(part.pending, batches.take_carried())
        if part.unflushed:
            try:
                checkpoints.flush(lease, part, None)
            except Exception as flush_error:  # the next holder recovers the intent
                lane.logger.debug("progress not flushed: %s", type(flush_error).__name__)
        release(lane, lease)
        lane.emit("background:slice:end", {
            "partition": part.key, "outcome": "stopped", "counters": counters,
        })
        return Outcome("stopped", counters)
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: leave quickly
        release(lane, lease)
        raise error
    failure = wrap(lane.name, error, part.key)
    partition_failed = False
    if failure.code != TransactionsUnsupportedError.code:
        try:
            partition_failed = lane.store.fail_slice(
                lease, failure.message,
                max_failures=int(lane.spec.get("maxSliceFailures", 3) or 3),
                counters=batches.take_carried(),
            )
        except Exception as store_error:
            lane.logger.debug("slice failure not recorded: %s", type(store_error).__name__)
    else:
        release(lane, lease)
    failure.context.update({"background": lane.name, "partition": part.key,
                            "partitionFailed": partition_failed})
    lane.emit("background:slice:end", {
        "partition": part.key, "outcome": "error", "error": failure.message,
        "counters": counters,
    })
    raise failure from error


def release(lane: LaneState, lease: Lease) -> None:
    """Give the slot back (fenced by the token); a failure leaves the lease to expire."""
    try:
        lane.store.release(lease)
    except Exception as error:  # the lease expires by itself
        lane.logger.debug("lease not released: %s", type(error).__name__)
