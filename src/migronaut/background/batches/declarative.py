"""The frame the two declarative modes share (:mod:`.plain` and :mod:`.transactional`).

A declarative batch reads documents (:mod:`.reading`), transforms them into guarded updates
(:mod:`.updates`) and records them with a fenced checkpoint (:mod:`.checkpoints`); a batch that
fails on an overloaded server tells the adaptive controller so, and a crashed holder's intent is
settled (:mod:`.plain` writes again what is not written yet).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.documents import Documents
from migronaut.background.batches.failures import overloaded
from migronaut.background.batches.reading import BatchReader
from migronaut.background.batches.unit import Batch, BatchUnit, Hold
from migronaut.background.batches.updates import GuardedUpdates
from migronaut.background.lanes.turn import LaneState
from migronaut.errors import LockLostError

__all__ = ["DocumentBatches"]


class DocumentBatches(BatchUnit):
    """The frame of the declarative modes: batches of documents read, transformed and written
    with guarded updates; a batch that fails on an overloaded server tells the controller."""

    def __init__(self, lane: LaneState, checkpoints: Checkpoints, documents: Documents,
                 reader: BatchReader, updates: GuardedUpdates) -> None:
        super().__init__(lane)
        self.checkpoints = checkpoints
        self.documents = documents
        self.reader = reader
        self.updates = updates
        #: server time of the current batch's write commands (what the controller judges)
        self.write_s = 0.0

    def run(self, hold: Hold, size: int) -> Batch:
        try:
            return self.batch(hold, size)
        except LockLostError:
            raise
        except Exception as error:
            if hold.controller is not None and overloaded(error):
                self.lane.report(hold.controller.record(0.0, overloaded=True))
            raise

    @abstractmethod
    def batch(self, hold: Hold, limit: int) -> Batch:
        """Work one batch of up to ``limit`` documents and checkpoint it."""

    def settle_intent(self, hold: Hold, ids: list[Any]) -> dict[str, int]:
        """The intent's documents now at the target version, counted as migrated."""
        written = self.updates.at_target(ids)
        return {"scanned": written, "migrated": written}
