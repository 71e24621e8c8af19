"""Transactional batches (reference §4.5): each batch read, written and checkpointed in one
snapshot transaction.

The checkpoint is the transaction's last write (fenced by the lease token), so a batch either
commits whole — documents, counters, cursor — or not at all, and a fenced-out lane commits
nothing. The batch reads :class:`~bson.raw_bson.RawBSONDocument` to keep the leading documents
whose BSON fits :data:`TXN_BATCH_BYTES`, then decodes each once. Strict mode: a document that
fails is excluded and the batch retried without it; a guarded write that matches nothing retries
the batch. Time/size limits halve the transaction size, :data:`TXN_GROW_AFTER` clean batches in
a row grow it ×1.5, and a single document that keeps conflicting is left to the next pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import bson
from bson.raw_bson import RawBSONDocument

from migronaut.background.batches.checkpoints import Checkpoints
from migronaut.background.batches.declarative import DocumentBatches
from migronaut.background.batches.documents import Documents, id_key
from migronaut.background.batches.failures import (
    DOCUMENT_WRITE_CODES,
    DocError,
    write_error_message,
)
from migronaut.background.batches.reading import BatchReader
from migronaut.background.batches.transactions import (
    Conflict,
    Retries,
    commit,
    outage,
    transaction,
    txn_error_kind,
)
from migronaut.background.batches.unit import Batch, Hold, nonzero
from migronaut.background.batches.updates import UNENCODABLE, GuardedUpdates
from migronaut.background.lanes.wire import UpdateOutcome, guarded_updates
from migronaut.errors import LockLostError

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

    from migronaut.background.lanes.turn import LaneState

__all__ = ["TXN_BATCH_BYTES", "TXN_GROW_AFTER", "TransactionalBatches"]

#: A transactional batch keeps the leading documents whose BSON fits in this (bytes).
TXN_BATCH_BYTES = 8 * 1024 * 1024
#: Clean transactional batches in a row before the transaction size grows by ×1.5.
TXN_GROW_AFTER = 5


class _DocumentFailure(Exception):
    """Strict mode: documents failed; exclude them and retry the batch."""

    def __init__(self, errors: list[DocError]) -> None:
        super().__init__(errors[0].message)
        self.errors = errors


class TransactionalBatches(DocumentBatches):
    """Declarative batches, each in one transaction with its checkpoint."""

    def __init__(self, lane: LaneState, checkpoints: Checkpoints, documents: Documents,
                 reader: BatchReader, updates: GuardedUpdates) -> None:
        super().__init__(lane, checkpoints, documents, reader, updates)
        assert lane.transaction is not None
        self.transaction: Mapping[str, Any] = lane.transaction
        #: the transaction size the lane settled on (documents), and clean batches in a row
        self.size: int | None = None
        self.clean = 0

    def batch(self, hold: Hold, limit: int) -> Batch:
        from pymongo.errors import PyMongoError

        lane, controller = self.lane, hold.controller
        retries = Retries(self.transaction, "batch")
        size = min(self.size or limit, limit)
        excluded: dict[str, DocError] = {}
        attempt_no = 0
        txn_retries = 0
        last_read: list[Any] = []
        while True:
            if lane.signal.cancelled:
                self.carry_retries(txn_retries)
                lane.signal.raise_if_cancelled()
            attempt_no += 1
            started = time.monotonic()
            try:
                batch = self._attempt(hold, size, excluded, attempt_no, txn_retries, last_read)
            except LockLostError:
                raise
            except _DocumentFailure as failure:
                for doc_error in failure.errors:
                    excluded[id_key(doc_error.id)] = doc_error
                continue
            except (Conflict, PyMongoError) as error:
                kind = None if outage(error) else txn_error_kind(error)
                if kind is None:
                    # not retried here (an outage is ridden out by the partition's holder):
                    # the retries so far are recorded with the next checkpoint or the failure
                    self.carry_retries(txn_retries)
                    raise
                txn_retries += 1
                if controller is not None and kind != "conflict":
                    lane.report(controller.record(
                        (time.monotonic() - started) * 1000.0, overloaded=True))
                if len(last_read) == 1:
                    doc_id = last_read[0]
                    if kind == "limit":
                        excluded[id_key(doc_id)] = DocError(
                            doc_id, "transaction",
                            "the document's transaction hit a time or size limit")
                        continue
                    if kind == "conflict":
                        return self._step_past(hold, doc_id, txn_retries, limit)
                if kind == "limit" and size > 1:
                    size = max(1, size // 2)
                    self.size, self.clean = size, 0
                    continue
                given_up = retries.failed(error)
                if given_up is not None:
                    self.carry_retries(txn_retries)
                    raise given_up from error
                if retries.attempts > retries.max / 2 and size > 1:
                    size = max(1, size // 2)
                    self.size, self.clean = size, 0
                retries.pause(lane.signal)
                continue
            hold.keeper.touch()
            if attempt_no == 1 and not excluded:
                self.clean += 1
                if self.clean >= TXN_GROW_AFTER:
                    self.clean = 0
                    size = min(limit, math.ceil(size * 1.5))
            else:
                self.clean = 0
            self.size = size
            return batch

    def _attempt(
        self,
        hold: Hold,
        size: int,
        excluded: Mapping[str, DocError],
        attempt: int,
        txn_retries: int,
        last_read: list[Any],
    ) -> Batch:
        from pymongo.errors import WriteError

        part, controller = hold.part, hold.controller
        timeout_ms = int(self.transaction.get("timeoutMs", 10_000))
        self.write_s = 0.0
        with transaction(self.lane, timeout_ms) as session:
            raws = self.reader.read(self.documents.raw_coll, part, size, session, timeout_ms)
            kept: list[RawBSONDocument] = []
            total = 0
            for raw in raws:
                total += len(raw.raw)
                if kept and total > TXN_BATCH_BYTES:
                    break
                kept.append(raw)
            cut = len(kept) < len(raws)
            last_read[:] = [_raw_id(raw) for raw in kept]
            decode, options = bson.decode, self.documents.decode_options
            todo = [decode(raw.raw, options) for raw in kept
                    if id_key(_raw_id(raw)) not in excluded]
            failed = [excluded[id_key(i)] for i in last_read if id_key(i) in excluded]
            ctx = self.updates.context(part, attempt, session)
            written, ops, errors = self.updates.prepare(todo, ctx)
            if errors:
                raise _DocumentFailure(errors)
            if ops:
                outcome = self._write(written, ops, session)
                refused = [
                    DocError(written[int(item["index"])].get("_id"), "write",
                             write_error_message(item))
                    for item in outcome.write_errors
                    if item.get("code") in DOCUMENT_WRITE_CODES
                ]
                if refused:
                    raise _DocumentFailure(refused)
                if outcome.write_errors:
                    item = outcome.write_errors[0]
                    raise WriteError(str(item.get("errmsg", "write error")),
                                     item.get("code"), dict(item))
                if outcome.matched < len(ops):
                    raise Conflict("a guarded write matched nothing")
            carried = self.carried.get("txnRetries", 0)
            counters = {"scanned": len(kept), "migrated": len(ops), "failed": len(failed),
                        "batches": 1, "txnRetries": txn_retries + carried}
            over = self.checkpoints.over_budget(failed)
            cursor_before = part.cursor
            last = [decode(kept[-1].raw, options)] if kept else []
            exhausted = self.reader.advance(part, last, cut or len(raws) >= size,
                                            [e.id for e in failed])
            done = exhausted and over is None
            try:
                self.checkpoints.write(hold.lease, part.cursor, counters, errors=failed,
                                       controller=controller, done=done, session=session)
                committing = time.monotonic()
                try:
                    commit(session)
                finally:
                    self.write_s += time.monotonic() - committing
            except BaseException:
                part.cursor = cursor_before
                raise
            if carried:
                self.carried.pop("txnRetries", None)
            latency_ms = self.write_s * 1000.0
        if controller is not None:
            self.lane.report(controller.record(latency_ms,
                                               overloaded=self.lane.throttle.take_lagged()))
        return Batch(nonzero(counters), latency_ms, size, done, failed, over)

    def _write(
        self, written: list[dict[str, Any]], ops: list[Any], session: ClientSession
    ) -> UpdateOutcome:
        """The batch's guarded writes in the transaction (timed); a statement BSON cannot store
        fails its document (the attempt is retried without it)."""
        started = time.monotonic()
        try:
            return guarded_updates(self.documents.coll, ops, session=session)
        except UNENCODABLE:
            refused: list[DocError] = []
            self.updates.storable(written, ops, refused)
            if not refused:
                raise
            raise _DocumentFailure(refused) from None
        finally:
            self.write_s += time.monotonic() - started

    def _step_past(self, hold: Hold, doc_id: Any, txn_retries: int, limit: int) -> Batch:
        """A one-document batch that keeps conflicting: leave it to the next pass."""
        carried = self.carried.get("txnRetries", 0)
        counters = {"scanned": 1, "conflicts": 1, "batches": 1,
                    "txnRetries": txn_retries + carried}
        self.reader.step_past(hold.part, doc_id)
        self.checkpoints.write(hold.lease, hold.part.cursor, counters,
                               controller=hold.controller)
        self.carried.pop("txnRetries", None)
        hold.keeper.touch()
        return Batch(counters, 0.0, limit, False)


def _raw_id(raw: RawBSONDocument) -> Any:
    return raw["_id"]
