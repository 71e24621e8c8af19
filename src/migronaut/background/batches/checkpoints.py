"""Checkpoint writes: the one place a lane records progress (fenced checkpoint, exact totals).

Invariants:

* **A lane that lost its lease records nothing.** Every checkpoint is filtered by the lease token
  and ``status: running`` (:meth:`BackgroundStore.checkpoint`); in a transaction it is the
  transaction's last write, so a fenced-out lane commits nothing. Counters enter the slice's
  totals only after their checkpoint succeeded, so a lost batch is never counted (the next
  holder replays it; the version filter makes the replay a no-op).
* **Totals are exact.** A plain batch's checkpoint carries the *intent* of the next write (the
  ``_id`` s it is about to write): a lane killed between a write and its checkpoint leaves a
  record the next holder settles the batch from
  (:func:`migronaut.background.lanes.recovery.recover`).
* **The error budget is judged before the checkpoint**, so a batch that exhausts
  ``maxDocumentErrors`` never marks its partition done: the lane fails it instead (§4.7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from migronaut.background.batches.failures import DocError
from migronaut.background.batches.unit import Part, nonzero

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

    from migronaut.background.lanes.throttle import AdaptiveController
    from migronaut.background.lanes.turn import LaneState
    from migronaut.background.state.store import Lease

__all__ = ["Checkpoints"]


class Checkpoints:
    """Writes a lane's fenced checkpoints and judges its document-error budget."""

    def __init__(self, lane: LaneState) -> None:
        self.lane = lane

    def write(
        self, lease: Lease, cursor: Mapping[str, Any], counters: Mapping[str, int], *,
        errors: Sequence[DocError] = (), controller: AdaptiveController | None = None,
        done: bool = False, session: ClientSession | None = None,
        intent: Sequence[Any] | None = None,
    ) -> None:
        """Record a batch at ``cursor``: its counters, document errors, the controller's state
        and, for a plain batch, the next write's ``intent``."""
        at = datetime.now(UTC)
        self.lane.store.checkpoint(
            lease,
            cursor=cursor,
            counters=nonzero(counters),
            bad_ids=[e.id for e in errors],
            doc_errors=[{"error": e.message, "reason": e.reason, "at": at} for e in errors],
            throttle=controller.state() if controller is not None else None,
            done=done,
            session=session,
            intent=intent,
        )

    def flush(
        self,
        lease: Lease,
        part: Part,
        controller: AdaptiveController | None,
        *,
        intent: Sequence[Any] | None = None,
        done: bool = False,
    ) -> None:
        """Checkpoint what the lane has not recorded yet, with the next write's intent."""
        self.write(lease, part.cursor, part.pending, errors=part.pending_errors,
                   controller=controller, done=done, intent=intent)
        part.pending = {}
        part.pending_errors = []
        part.intent = intent is not None

    def over_budget(self, errors: Sequence[DocError]) -> int | None:
        """Distinct failed documents including ``errors`` when more than the budget allows."""
        if not errors:
            return None
        lane = self.lane
        total = lane.store.count_bad_ids(
            lane.name, lane.generation, [*lane.state_bad_ids, *(e.id for e in errors)])
        return total if total > int(lane.spec.get("maxDocumentErrors", 0) or 0) else None
