"""Step batches (reference §4.6): one call of the migration's ``step(ctx)`` per batch.

The step owns its reads and writes; the lane owns its checkpoint. Each call gets the checkpoint
the previous call returned and must return ``{checkpoint, done}`` (plus optional ``processed`` /
``migrated`` counts); the checkpoint, at most :data:`STEP_CHECKPOINT_MAX` bytes of BSON, is stored
as the partition's cursor by a fenced checkpoint. In transactional mode the call and its
checkpoint commit together, retried on transient errors up to ``maxRetries``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import bson

from migronaut._values import is_int
from migronaut.background.batches import transactions
from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.failures import SliceFailure, clip
from migronaut.background.batches.unit import Batch, BatchUnit, Hold, Part
from migronaut.background.lanes.turn import StepContext
from migronaut.core._calls import call_user
from migronaut.errors import LockLostError, MigronautError, describe_exception

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

    from migronaut.background.lanes.turn import LaneState

__all__ = ["STEP_CHECKPOINT_MAX", "StepBatches"]

#: A step's checkpoint, encoded as ``{checkpoint: ...}``, may not exceed this (bytes).
STEP_CHECKPOINT_MAX = 64 * 1024


class StepBatches(BatchUnit):
    """``step`` mode: the user's function does the work, the lane checkpoints what it returns."""

    def __init__(self, lane: LaneState, checkpoints: Checkpoints) -> None:
        super().__init__(lane)
        self.checkpoints = checkpoints

    def run(self, hold: Hold, size: int) -> Batch:
        lane = self.lane
        fn = lane.job.functions.step_for(lane.direction)
        if fn is None:
            raise SliceFailure(f"there is no step function for direction {lane.direction}")
        if lane.transaction is not None:
            return self._in_transaction(hold, fn, lane.transaction)
        started = time.monotonic()
        result = self._call(fn, self._context(hold.part, 1, None))
        checkpoint, done, counters = _validate(result)
        latency_ms = (time.monotonic() - started) * 1000.0
        hold.part.cursor = {"checkpoint": checkpoint}
        self.checkpoints.write(hold.lease, hold.part.cursor, counters, done=done)
        hold.keeper.touch()
        return Batch(counters, latency_ms, 1, done)

    def _context(self, part: Part, attempt: int,
                 session: ClientSession | None) -> StepContext:
        lane = self.lane
        return StepContext(
            db=lane.db, client=lane.db.client, checkpoint=part.cursor.get("checkpoint"),
            deadline=lane.deadline_epoch_ms, cancellation=lane.signal, logger=lane.user_logger,
            direction=lane.direction, background=lane.info(part.key, part.generation, attempt),
            session=session,
        )

    def _call(self, fn: Callable[..., Any], ctx: StepContext) -> Any:
        try:
            return call_user(fn, ctx)
        except (MigronautError, SliceFailure):
            raise
        except Exception as error:
            from pymongo.errors import PyMongoError

            # (the error kind first: a server refusing transactions raises here in any mode)
            retryable = isinstance(error, PyMongoError) and (
                transactions.txn_error_kind(error) is not None)
            if retryable and ctx.session is not None:
                raise  # transient inside a transaction: retried by the caller
            signal = self.lane.signal
            if signal.cancelled:
                signal.raise_if_cancelled()
            raise SliceFailure(f"step raised {clip(describe_exception(error))}") from error

    def _in_transaction(
        self, hold: Hold, fn: Callable[..., Any], settings: Mapping[str, Any]
    ) -> Batch:
        from pymongo.errors import PyMongoError

        lane, part = self.lane, hold.part
        timeout_ms = int(settings.get("timeoutMs", 10_000))
        retries = transactions.Retries(settings, "step")
        txn_retries = 0
        attempt_no = 0
        while True:
            lane.signal.raise_if_cancelled()
            started = time.monotonic()
            attempt_no += 1
            try:
                with transactions.transaction(lane, timeout_ms) as session:
                    result = self._call(fn, self._context(part, attempt_no, session))
                    checkpoint, done, counters = _validate(result)
                    carried = self.carried.get("txnRetries", 0)
                    if txn_retries + carried:
                        counters["txnRetries"] = txn_retries + carried
                    cursor = {"checkpoint": checkpoint}
                    self.checkpoints.write(hold.lease, cursor, counters, done=done,
                                           session=session)
                    transactions.commit(session)
                    self.carried.pop("txnRetries", None)
            except LockLostError:
                raise
            except PyMongoError as error:
                if transactions.outage(error) or transactions.txn_error_kind(error) is None:
                    self.carry_retries(txn_retries)
                    raise
                txn_retries += 1
                given_up = retries.failed(error)
                if given_up is not None:
                    self.carry_retries(txn_retries)
                    raise given_up from error
                retries.pause(lane.signal)
                continue
            part.cursor = cursor
            hold.keeper.touch()
            return Batch(counters, (time.monotonic() - started) * 1000.0, 1, done)


def _validate(result: Any) -> tuple[Any, bool, dict[str, int]]:
    """What a step returned, as (checkpoint, done, counters); a slice failure when malformed."""
    if not isinstance(result, Mapping) or not isinstance(result.get("done"), bool):
        raise SliceFailure(
            "step must return { checkpoint, done } — done a boolean "
            f"(got {type(result).__name__})")
    checkpoint = result.get("checkpoint")
    try:
        size = len(bson.encode({"checkpoint": checkpoint}))
    except Exception as error:
        raise SliceFailure(
            f"step returned a checkpoint that cannot be stored as BSON ({type(error).__name__})"
        ) from error
    if size > STEP_CHECKPOINT_MAX:
        raise SliceFailure(
            f"step returned a checkpoint of {size} bytes, more than {STEP_CHECKPOINT_MAX} — "
            "keep a cursor in it, not data")
    counters = {"batches": 1}
    for key in ("processed", "migrated"):
        value = result.get(key)
        if is_int(value) and value > 0:
            counters[key] = value
    return checkpoint, result["done"], counters
