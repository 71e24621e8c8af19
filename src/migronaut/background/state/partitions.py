"""Partitions and leases in MongoDB: plans, claims, fenced checkpoints and slots.

Invariants:

* a lease *is* the slot: the unique partial indexes on ``{background, lease.slot}`` and
  ``{background, lease.groupSlot}`` cap concurrency at ``maxParallel`` across every process, and
  claims refuse to run when those indexes are missing;
* every lease write (renew, checkpoint, release) is fenced by the lease token, and every
  staleness decision is made in server time (``$$NOW``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from migronaut.background.state.fields import DOC_ERRORS_KEPT, MAX_BAD_IDS, literal
from migronaut.background.state.partition_reads import LEASE_AGE, OPEN, PartitionReads
from migronaut.errors import LockLostError

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

__all__ = ["Lease", "PartitionStore"]

@dataclass
class Lease:
    """A held partition lease; every write through it is fenced by ``token``."""

    partition_id: Any
    slot: int
    token: str
    owner: str
    ttl_ms: int
    group_slot: str | None = None
    #: the partition document as the claim wrote it (``None``: read it)
    claimed: dict[str, Any] | None = field(default=None, repr=False, compare=False)


class PartitionStore(PartitionReads):
    """The partition collection of one database: plans, claims, leases and checkpoints (the
    read-side aggregates are :class:`~migronaut.background.state.partition_reads.PartitionReads`').

    The state side (:class:`~migronaut.background.state.store.BackgroundStore`) builds on it and
    provides :meth:`ready` (the indexes a claim needs).
    """

    def ready(self) -> None:
        """Make sure the indexes exist (the store's); a claim needs the slot indexes."""
        raise NotImplementedError

    def insert_plan(
        self, name: str, generation: int, token: str, partitions: Sequence[Mapping[str, Any]]
    ) -> None:
        now = datetime.now(UTC)  # display only: every decision is made in server time
        docs = []
        for seq, partition in enumerate(partitions):
            doc = {
                "background": name,
                "generation": generation,
                "plan": token,
                "seq": seq,
                "status": "pending",
                "createdAt": now,
                "updatedAt": now,
                "cursor": {},
                "counters": {},
                "badIds": [],
                "lastDocErrors": [],
                "claims": 0,
                "reclaims": 0,
                "failures": 0,
            }
            doc.update(partition)
            docs.append(doc)
        if docs:
            self.partitions.insert_many(docs, ordered=False)

    def drop_plan(self, name: str, token: str) -> None:
        self.partitions.delete_many({"background": name, "plan": token})

    def drop_foreign_plans(self, name: str, token: str) -> None:
        """Open or superseded partitions of any plan other than the current one."""
        self.partitions.delete_many(
            {
                "background": name,
                "plan": {"$ne": token},
                "status": {"$in": ["pending", "running", "superseded"]},
            }
        )

    def count_foreign_partitions(self, name: str, generation: int, token: str) -> int:
        """Partitions of ``generation`` that belong to another plan than the committed one
        (a crash between a plan's insert and its commit leaves them)."""
        return self.partitions.count_documents(
            {"background": name, "generation": generation, "plan": {"$ne": token}}
        )

    def drop_generations_below(self, name: str, generation: int) -> None:
        """Partitions of the generations before ``generation`` (plans start at generation 1:
        below it there is nothing to drop, and nothing is sent)."""
        if generation > 1:
            self.partitions.delete_many({"background": name, "generation": {"$lt": generation}})

    def set_open_partitions(
        self, name: str, generation: int, status: str, *, statuses: Sequence[str] = (
            "pending", "running")
    ) -> int:
        result = self.partitions.update_many(
            {"background": name, "generation": generation, "status": {"$in": list(statuses)}},
            {"$set": {"status": status}, "$currentDate": {"updatedAt": True}},
        )
        return result.modified_count

    def reap_expired_leases(self, name: str) -> int:
        """Remove leases not renewed within their own TTL (server time); a reclaim each.

        Each lease is judged by the ``ttlMs`` its holder wrote, never by the TTL of the process
        looking: a worker with a shorter TTL must not take a longer-TTL holder's live slot.
        Filtered on ``lease.slot`` (every lease holds one) so the partial unique index on
        ``{background, lease.slot}`` serves it: only leased partitions are looked at.
        """
        result = self.partitions.update_many(
            {"background": name, "lease.slot": {"$exists": True}, "$expr": {"$lt": LEASE_AGE}},
            [
                {"$unset": "lease"},
                {"$set": {"reclaims": {"$add": [{"$ifNull": ["$reclaims", 0]}, 1]},
                          "updatedAt": "$$NOW"}},
            ],
        )
        return result.modified_count

    def release_all_leases(self, name: str) -> int:
        result = self.partitions.update_many(
            {"background": name, "lease": {"$exists": True}}, {"$unset": {"lease": ""}}
        )
        return result.modified_count

    def occupied_slots(self, name: str) -> set[int]:
        cursor = self.partitions.find(
            {"background": name, "lease.slot": {"$exists": True}}, {"lease.slot": 1, "_id": 0}
        )
        return {doc["lease"]["slot"] for doc in cursor}

    def claim(
        self,
        name: str,
        *,
        generation: int,
        plan: str,
        max_parallel: int,
        ttl_ms: int,
        owner: str,
        rng: Any = None,
        shard_concurrency: int | None = None,
        slot: int | None = None,
    ) -> Lease | str:
        """Claim a partition and a free slot in one atomic write.

        Returns the :class:`Lease`, ``"exhausted"`` (no claimable partition) or ``"busy"`` (no
        free slot, or every free slot lost to a racing claimer). The first try takes ``slot``
        — the one a lane just gave back with its finished partition, most likely still free —
        or else a slot at random and, when it wins, costs that one write; when it does not,
        expired leases are reaped (they may hold the slot or the partition) and the free slots
        tried in turn. ``shard_concurrency`` (sharded plans) also takes a group slot, see
        :meth:`_claim_grouped`.
        """
        import random

        self.ready()
        start = (slot if slot is not None and 0 <= slot < max_parallel
                 else (rng or random).randrange(max_parallel))
        slots = [*range(start, max_parallel), *range(start)]
        claimable: dict[str, Any] = {
            "background": name,
            "generation": generation,
            "plan": plan,
            "status": {"$in": ["pending", "running"]},
            "lease": {"$exists": False},
        }
        first: Lease | str | None = "slot"
        if shard_concurrency is None:
            first = self._take(claimable, slots[0], None, owner, ttl_ms)
            if isinstance(first, Lease):
                return first
        reaped = self.reap_expired_leases(name)
        occupied = self.occupied_slots(name)
        free = [s for s in slots if s not in occupied]
        if not free:
            return "busy"
        if shard_concurrency is not None:
            return self._claim_grouped(claimable, free, shard_concurrency, owner, ttl_ms)
        if first is None and not reaped:
            return "exhausted"  # nothing was claimable, and no reaped lease freed a partition
        for slot in free:
            claimed = self._take(claimable, slot, None, owner, ttl_ms)
            if claimed == "slot":
                continue  # another claimer took this slot: try the next one
            if claimed is None:
                return "exhausted"
            return claimed
        return "busy"

    def _claim_grouped(
        self, claimable: dict[str, Any], slots: list[int], shard_concurrency: int, owner: str,
        ttl_ms: int,
    ) -> Lease | str:
        """A sharded claim (reference background §4.2 step 5).

        Pick a candidate partition, then take group slot ``"<group>#k"`` for the first free
        ``k < shard_concurrency`` (partitions without a group share ``"#k"``). Every group slot
        taken → the group is full: pick again among the other groups. A candidate claimed by
        someone else between pick and write → pick again. Racing claimers on full shards
        therefore end ``exhausted``, not busy.
        """
        full: list[Any] = []
        while True:
            query = {**claimable, "group": {"$nin": full}} if full else claimable
            candidate = self.partitions.find_one(
                query, {"_id": 1, "group": 1}, sort=[("status", -1), ("seq", 1)])
            if candidate is None:
                return "exhausted"
            group = candidate.get("group")
            mine = {**claimable, "_id": candidate["_id"]}
            taken = False
            for k in range(shard_concurrency):
                group_slot = f"{group or ''}#{k}"
                for slot in slots:
                    claimed = self._take(mine, slot, group_slot, owner, ttl_ms)
                    if claimed == "slot":
                        continue
                    if claimed == "group":
                        break  # this group slot is held: try the next k
                    if claimed is None:
                        taken = True
                        break
                    return claimed
                else:
                    return "busy"  # every free slot lost to racing claimers
                if taken:
                    break
            if not taken:
                full.append(group)

    def _take(
        self, query: Mapping[str, Any], slot: int, group_slot: str | None, owner: str,
        ttl_ms: int,
    ) -> Lease | str | None:
        """One atomic claim write: the :class:`Lease`, ``None`` when nothing matched, or which
        unique index refused it (``"slot"`` or ``"group"``)."""
        from pymongo import ReturnDocument
        from pymongo.errors import DuplicateKeyError

        token = uuid.uuid4().hex
        lease: dict[str, Any] = {
            "slot": literal(slot), "token": literal(token), "owner": literal(owner),
            "host": literal(socket.gethostname()), "pid": literal(os.getpid()),
            "ttlMs": literal(ttl_ms), "renewedAt": "$$NOW", "claimedAt": "$$NOW",
        }
        if group_slot is not None:
            lease["groupSlot"] = literal(group_slot)
        try:
            doc = self.partitions.find_one_and_update(
                dict(query),
                [{"$set": {
                    "lease": lease,
                    "status": "running",
                    "claims": {"$add": [{"$ifNull": ["$claims", 0]}, 1]},
                    "startedAt": {"$ifNull": ["$startedAt", "$$NOW"]},
                    "updatedAt": "$$NOW",
                }}],
                sort=[("status", -1), ("seq", 1)],
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError as error:
            pattern = (error.details or {}).get("keyPattern") or {}
            on_group = "lease.groupSlot" in pattern or "lease_group_slot" in str(error)
            return "group" if on_group else "slot"
        if doc is None:
            return None
        return Lease(doc["_id"], slot, token, owner, ttl_ms, group_slot, claimed=doc)

    def load_partition(self, lease: Lease) -> dict[str, Any] | None:
        return self.partitions.find_one({"_id": lease.partition_id, "lease.token": lease.token})

    def renew(self, lease: Lease) -> bool:
        result = self.partitions.update_one(
            {"_id": lease.partition_id, "lease.token": lease.token},
            [{"$set": {"lease.renewedAt": "$$NOW"}}],
        )
        return result.matched_count == 1

    def release(self, lease: Lease) -> None:
        self.partitions.update_one(
            {"_id": lease.partition_id, "lease.token": lease.token},
            {"$unset": {"lease": ""}, "$currentDate": {"updatedAt": True}},
        )

    def checkpoint(
        self,
        lease: Lease,
        *,
        cursor: Any,
        counters: Mapping[str, int],
        bad_ids: Iterable[Any] = (),
        doc_errors: Sequence[Mapping[str, Any]] = (),
        throttle: Mapping[str, Any] | None = None,
        done: bool = False,
        session: ClientSession | None = None,
        intent: Sequence[Any] | None = None,
    ) -> None:
        """Record a batch: fenced by the lease token and ``status: running``.

        A lane whose lease was reaped or taken gets ``LOCK_LOST`` and its progress is not
        recorded. Progress (any counter, or done) resets the consecutive-failure count.
        ``intent`` names the documents the lane writes next (kept in ``inflight`` until the
        next checkpoint), so whoever holds the partition after a crash or an outage can settle them.
        """
        stage: dict[str, Any] = {
            "lease.renewedAt": "$$NOW",
            "updatedAt": "$$NOW",
            "cursor": literal(cursor),
            "inflight": literal({"ids": list(intent)}) if intent is not None else "$$REMOVE",
            "failures": 0,  # failures count in a row: any checkpoint is progress
        }
        for key, amount in counters.items():
            if amount:
                stage["counters." + key] = {
                    "$add": [{"$ifNull": ["$counters." + key, 0]}, amount]
                }
        bad = list(bad_ids)
        if bad:
            stage["badIds"] = {
                "$slice": [{"$setUnion": [{"$ifNull": ["$badIds", []]}, literal(bad)]},
                           MAX_BAD_IDS + 1]
            }
        if doc_errors:
            stage["lastDocErrors"] = {
                "$slice": [
                    {"$concatArrays": [
                        {"$ifNull": ["$lastDocErrors", []]}, literal(list(doc_errors))
                    ]},
                    -DOC_ERRORS_KEPT,
                ]
            }
        if throttle is not None:
            stage["throttle"] = literal(dict(throttle))
        pipeline: list[dict[str, Any]] = [{"$set": stage}]
        if done:
            pipeline.append({"$set": {"status": "done", "doneAt": "$$NOW"}})
            pipeline.append({"$unset": "lease"})
        result = self.partitions.update_one(
            {"_id": lease.partition_id, "lease.token": lease.token, "status": "running"},
            pipeline,
            session=session,
        )
        if result.matched_count != 1:
            raise LockLostError(
                "Lost the partition lease: another lane holds it now",
                {"lease": True, "partition": str(lease.partition_id)},
            )

    def fail_slice(
        self, lease: Lease, error: str, *, max_failures: int,
        counters: Mapping[str, int] | None = None,
    ) -> bool:
        """Count a failed slice on the partition; ``True`` when the partition failed for good.

        A lane whose lease was taken by another lane is ignored (its failure is not the
        partition's), and so is a partition no longer open (cancelled or superseded under it).
        ``counters`` are added with the failure: work the slice did that no checkpoint recorded
        and nothing else will (the retries of a transaction that never committed).
        """
        from pymongo import ReturnDocument

        stage: dict[str, Any] = {
            "failures": {"$add": [{"$ifNull": ["$failures", 0]}, 1]},
            "lastError": literal(error),
            "updatedAt": "$$NOW",
        }
        for key, amount in (counters or {}).items():
            if amount:
                stage["counters." + key] = {
                    "$add": [{"$ifNull": ["$counters." + key, 0]}, amount]
                }
        doc = self.partitions.find_one_and_update(
            {"_id": lease.partition_id, "lease.token": lease.token, "status": {"$in": OPEN}},
            [
                {"$set": stage},
                {"$set": {"status": {"$cond": [
                    {"$gte": ["$failures", max_failures]}, "failed", "$status"]}}},
                {"$unset": "lease"},
            ],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            self.release(lease)  # no longer open: it keeps its status, the slot is freed
        return bool(doc and doc.get("status") == "failed")

    def fail_partition(self, lease: Lease, error: str) -> None:
        """Fail the held partition for good — only while it is open (a ``cancelled`` or
        ``superseded`` partition still holding its lease keeps its status; the lease is
        released all the same)."""
        result = self.partitions.update_one(
            {"_id": lease.partition_id, "lease.token": lease.token, "status": {"$in": OPEN}},
            [{"$set": {"status": "failed", "lastError": literal(error), "updatedAt": "$$NOW"}},
             {"$unset": "lease"}],
        )
        if result.matched_count == 0:
            self.release(lease)

