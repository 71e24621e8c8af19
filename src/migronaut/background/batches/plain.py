"""Plain batches (reference §4.4): read, transform, checkpoint with intent, one guarded write.

Hot path (steady state): exactly three round trips per batch on the lane's thread — the read
(:mod:`.reading`), one unordered ``update`` command and the checkpoint (both data commands go
through :mod:`migronaut.background.lanes.wire`, which spends the least client CPU per document). The
checkpoint of a batch travels with the next batch's *intent* (the ids it is about to write), so
a lane killed between a write and its checkpoint, or whose write's reply was lost, leaves a record
the next holder settles the batch from (:meth:`PlainBatches.settle_intent`) — totals stay exact.
The intent stays under :data:`INTENT_MAX_BYTES`: a batch of long ``_id`` s is cut short (the rest
is the next batch), so the partition document never nears 16 MiB.

A guarded write that matches nothing is re-read and classified: landed (counted once), moved on
by the application (skipped) or still at the source version (re-transformed, up to
``maxConflictRetries`` rounds). The adaptive controller judges a batch by the server time of its
write commands, never by the ``migrate`` function's time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import bson

from migronaut.background.batches.declarative import DocumentBatches
from migronaut.background.batches.documents import at_version, id_key
from migronaut.background.batches.failures import (
    DOCUMENT_WRITE_CODES,
    DocError,
    write_error_message,
)
from migronaut.background.batches.unit import Batch, Hold, add_counters, nonzero
from migronaut.background.batches.updates import UNENCODABLE
from migronaut.background.lanes.wire import UpdateOutcome, guarded_updates
from migronaut.background.state.store import Lease
from migronaut.errors import LockLostError

__all__ = ["INTENT_MAX_BYTES", "PlainBatches"]

#: A plain batch's write intent (its ``_id`` s, stored on the partition by the checkpoint before
#: the write) stays under this many bytes: a batch of long ``_id`` s is cut short (the rest is the
#: next batch), so the partition document never nears the 16 MiB limit.
INTENT_MAX_BYTES = 2 * 1024 * 1024


class PlainBatches(DocumentBatches):
    """Declarative batches outside transactions: guarded writes, checkpoint with intent."""

    def batch(self, hold: Hold, limit: int) -> Batch:
        """Read, transform, checkpoint the previous batch with this one's intent, write."""
        lease, part, controller = hold.lease, hold.part, hold.controller
        self.write_s = 0.0
        docs = self.reader.read(self.documents.coll, part, limit)
        read = len(docs)
        docs = _within_intent(docs)
        counters = {"scanned": len(docs), "migrated": 0, "skipped": 0, "conflicts": 0,
                    "retried": 0, "failed": 0, "batches": 1}
        errors: list[DocError] = []
        ctx = self.updates.context(part)
        candidates: Sequence[dict[str, Any]] = docs
        max_rounds = int(self.lane.spec.get("maxConflictRetries", 3))
        rounds = 0
        left: list[Any] = []
        while candidates:
            written, ops, doc_errors = self.updates.prepare(candidates, ctx)
            errors.extend(doc_errors)
            if rounds == 0 and ops:
                self.checkpoints.flush(lease, part, controller,
                                       intent=[doc["_id"] for doc in written])
                hold.keeper.touch()
            retry = self._write(lease, written, ops, errors, counters)
            if not retry:
                break
            if rounds >= max_rounds:
                counters["conflicts"] += len(retry)
                left = retry
                break
            rounds += 1
            counters["retried"] += len(retry)
            candidates = self.reader.reread(retry)
            counters["skipped"] += len(retry) - len(candidates)
        latency_ms = self.write_s * 1000.0
        if controller is not None:
            self.lane.report(controller.record(latency_ms,
                                               overloaded=self.lane.throttle.take_lagged()))
        counters["failed"] = len(errors)
        exhausted = self.reader.advance(part, docs, read >= limit or len(docs) < read,
                                        [*(e.id for e in errors), *left])
        add_counters(part.pending, counters)
        part.pending_errors.extend(errors)
        over = self.checkpoints.over_budget(part.pending_errors if errors else ())
        done = exhausted and over is None
        if done or over is not None:
            self.checkpoints.flush(lease, part, controller, done=done)
            hold.keeper.touch()
        return Batch(nonzero(counters), latency_ms, limit, done, errors, over)

    def settle_intent(self, hold: Hold, ids: list[Any]) -> dict[str, int]:
        """Settle the batch a stored intent names, exactly once whenever its first write lands.

        That write's reply was lost (or its lane crashed): it may have landed, may still land
        (a request the server has not applied yet), or never will. So the documents still at
        the source version are written again, guarded, now: if the first write lands first,
        this one matches nothing and the re-read counts the document as landed; if it lands
        later, it matches nothing itself. The intent's other documents, already at the target,
        are counted as migrated. A document this write cannot settle (a document error, a
        conflict) is left to the read from the stored cursor, which counts it there.
        """
        still = self.reader.reread(ids)
        settling = {id_key(doc["_id"]) for doc in still}
        landed = self.updates.at_target([i for i in ids if id_key(i) not in settling])
        counters = {"scanned": landed, "migrated": landed}
        if not still:
            return counters
        written, ops, _errors = self.updates.prepare(still, self.updates.context(hold.part))
        settled = {"migrated": 0, "skipped": 0}
        self.write_s = 0.0
        self._write(hold.lease, written, ops, [], settled)
        counters["migrated"] += settled["migrated"]
        counters["skipped"] = settled["skipped"]
        counters["scanned"] += settled["migrated"] + settled["skipped"]
        return counters

    def _write(
        self,
        lease: Lease,
        written: list[dict[str, Any]],
        ops: list[Any],
        errors: list[DocError],
        counters: dict[str, int],
    ) -> list[Any]:
        """One unordered guarded ``update`` command; returns the ids to re-transform.

        Its round trip is the batch's server time (:attr:`write_s`). A retry after a lost reply
        first confirms the lease (:meth:`_confirm`).
        """
        from pymongo.errors import WriteError

        if not ops:
            return []
        try:
            outcome = self._send(lease, ops)
        except UNENCODABLE:
            kept_docs, kept_ops = self.updates.storable(written, ops, errors)
            if len(kept_ops) == len(ops):
                raise  # not a value BSON cannot store
            if not kept_ops:
                return []
            written, ops = kept_docs, kept_ops
            outcome = self._send(lease, ops)
        failed_at: set[int] = set()
        for item in outcome.write_errors:
            code = item.get("code")
            if code not in DOCUMENT_WRITE_CODES:
                raise WriteError(str(item.get("errmsg", "write error")), code, dict(item))
            index = int(item["index"])
            failed_at.add(index)
            errors.append(DocError(written[index].get("_id"), "write",
                                   write_error_message(item)))
        pending = [doc for i, doc in enumerate(written) if i not in failed_at]
        if outcome.matched >= len(pending):
            counters["migrated"] += len(pending)
            return []
        return self._classify(pending, counters)

    def _send(self, lease: Lease, ops: list[Any]) -> UpdateOutcome:
        started = time.monotonic()
        try:
            return guarded_updates(self.documents.write_coll, ops,
                                   confirm=lambda: self._confirm(lease))
        finally:
            self.write_s += time.monotonic() - started

    def _confirm(self, lease: Lease) -> None:
        """Renew the lease (fenced) before a write is sent again: ``LOCK_LOST`` when another
        lane holds the partition now, so a retried write never lands after a takeover."""
        if not self.lane.store.renew(lease):
            raise LockLostError("Lost the partition lease before retrying a write",
                                {"lease": True, "partition": str(lease.partition_id)})

    def _classify(self, pending: list[dict[str, Any]], counters: dict[str, int]) -> list[Any]:
        """Re-read unmatched candidates: which writes landed, which to retry (§4.4)."""
        documents = self.documents
        now = self.updates.landed([doc["_id"] for doc in pending], pending)
        retry: list[Any] = []
        for doc in pending:
            current = now.get(id_key(doc["_id"]))
            if current is None:
                counters["skipped"] += 1
                continue
            version = current.get(documents.field)
            if at_version(version, documents.target):
                if documents.revision_field is None or documents.occ != "revision":
                    counters["migrated"] += 1
                else:
                    before = doc.get(documents.revision_field) or 0
                    after = current.get(documents.revision_field) or 0
                    counters["migrated" if after == before + 1 else "skipped"] += 1
            elif at_version(version, documents.source):
                retry.append(doc["_id"])
            else:
                counters["skipped"] += 1
        return retry


_FIXED_SIZE_IDS: Final = frozenset({bson.ObjectId, int, bson.Int64, float, bool, datetime})


def _within_intent(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading documents whose ``_id`` s fit :data:`INTENT_MAX_BYTES` (at least one)."""
    total = 0
    for index, doc in enumerate(docs):
        value = doc.get("_id")
        kind = type(value)
        if kind in _FIXED_SIZE_IDS:
            total += 20  # an element of at most 8 bytes of value (12 for an ObjectId)
        elif isinstance(value, str):
            total += len(value.encode("utf-8", "surrogatepass")) + 16
        else:
            total += len(bson.encode({"": value}))
        if total > INTENT_MAX_BYTES and index:
            return docs[:index]
    return docs
