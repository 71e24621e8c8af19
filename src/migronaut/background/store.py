"""Background state and partitions in MongoDB: the only place background state lives.

Invariants:

* every state move is a compare-and-set on the status it comes from, appending its history
  entry in the same pipeline update (the entry's ``from`` is the status before the update);
* a lease *is* the slot: the unique partial indexes on ``{background, lease.slot}`` and
  ``{background, lease.groupSlot}`` cap concurrency at ``maxParallel`` across every process, and
  claims refuse to run when those indexes are missing;
* every lease write (renew, checkpoint, release) is fenced by the lease token, and every
  staleness decision is made in server time (``$$NOW``);
* user values inside update pipelines are wrapped in ``$literal``.

Field names are the Node original's (reference background §2).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from migronaut.errors import (
    BackgroundConflictError,
    ConfigInvalidError,
    LockLostError,
    NotAppliedError,
)

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection
    from pymongo.database import Database

__all__ = [
    "ACTIONS",
    "COUNTERS",
    "INDEXES",
    "SCHEMA",
    "BackgroundStore",
    "Lease",
    "transition",
]

SCHEMA = 2
MAX_BAD_IDS = 1000
DOC_ERRORS_KEPT = 20
HISTORY_KEPT = 50

OPEN_STATUSES = ("blocked", "pending", "running", "paused")
TERMINAL = ("completed", "failed", "cancelled")
COUNTERS = (
    "scanned", "migrated", "skipped", "conflicts", "failed", "retried", "batches", "processed",
    "txnRetries",
)

#: Partition statuses a lane may still work on (and fail).
_OPEN = ["pending", "running"]
#: ``[renewedAt, now − the lease's own ttlMs]``: compared ``$gte`` a lease is live, ``$lt`` stale.
_LEASE_AGE = ["$lease.renewedAt", {"$subtract": ["$$NOW", "$lease.ttlMs"]}]

#: (collection suffix, name, keys, options) — the four indexes of reference background §2.2.
INDEXES: tuple[tuple[str, str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("", "status_registeredAt", [("status", 1), ("registeredAt", 1)], {}),
    ("_partitions", "claim",
     [("background", 1), ("generation", 1), ("plan", 1), ("status", 1), ("seq", 1)], {}),
    ("_partitions", "lease_slot", [("background", 1), ("lease.slot", 1)],
     {"unique": True, "partialFilterExpression": {"lease.slot": {"$exists": True}}}),
    ("_partitions", "lease_group_slot", [("background", 1), ("lease.groupSlot", 1)],
     {"unique": True, "partialFilterExpression": {"lease.groupSlot": {"$exists": True}}}),
)

# action -> (allowed from, goes to, already-done statuses) — reference background §2.5.
_TABLE: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "unblock": (("blocked",), "pending", ("pending", "running", "paused")),
    "plan": (("pending",), "running", ("running",)),
    "complete": (("running",), "completed", ("completed",)),
    "fail": (("blocked", "pending", "running"), "failed", ("failed",)),
    "pause": (("blocked", "pending", "running"), "paused", ("paused",)),
    "resume": (("paused",), "pending", ("blocked", "pending", "running")),
    "cancel": (("blocked", "pending", "running", "paused"), "cancelled", ("cancelled",)),
    "retry": (("failed", "cancelled"), "pending", ("pending",)),
    "reopen": (("completed",), "running", ("running",)),
}
ACTIONS = tuple(_TABLE)


def transition(name: str, status: str, action: str) -> tuple[str, bool]:
    """The status ``action`` leads to from ``status`` and whether it changes anything.

    Already being where the action leads is not an error (``changed`` is ``False``); anything
    else not in the table is ``BACKGROUND_CONFLICT``.
    """
    rule = _TABLE.get(action)
    if rule is not None:
        allowed, to, done = rule
        if status in allowed:
            return to, True
        if status in done:
            return status, False
    raise BackgroundConflictError(
        f"Cannot {action} background migration {name}: it is {status}",
        {"migration": name, "action": action, "status": status},
    )


def literal(value: Any) -> dict[str, Any]:
    return {"$literal": value}


def stamped(fields: Mapping[str, Any], *server_times: str) -> dict[str, Any]:
    """An object value for a pipeline ``$set``: ``fields`` as literals plus ``server_times``
    stamped with ``$$NOW``, replacing the stored object whole.

    A plain ``{"a": {...}}`` would be merged into the stored object by mongod (and ``{"a": …,
    "a.at": "$$NOW"}`` is refused, error 40176), so object values go through ``$mergeObjects``.
    """
    return {"$mergeObjects": [literal(dict(fields)), {name: "$$NOW" for name in server_times}]}


def set_stage(
    set_fields: Mapping[str, Any], server_times: Sequence[str] = ()
) -> dict[str, Any]:
    """A pipeline ``$set`` stage: ``set_fields`` as literals, ``server_times`` as ``$$NOW``.

    A server time inside a field that is also set (``plan`` and ``plan.at``) is stamped into
    that object, never named beside it (mongod refuses a path and its sub-path, 40176).
    """
    stage: dict[str, Any] = {k: literal(v) for k, v in set_fields.items()}
    for path in server_times:
        parent, _, leaf = path.partition(".")
        if leaf and parent in set_fields:
            stage[parent] = stamped(set_fields[parent], leaf)
        else:
            stage[path] = "$$NOW"
    return stage


def history_entry(action: str, to: str | None, by: str | None, reason: str | None) -> Any:
    entry: dict[str, Any] = {"at": "$$NOW", "action": literal(action), "from": "$status"}
    entry["to"] = literal(to) if to is not None else "$status"
    if by is not None:
        entry["by"] = literal(by)
    if reason is not None:
        entry["reason"] = literal(reason)
    return {
        "$concatArrays": [
            {"$slice": [{"$ifNull": ["$history", []]}, -(HISTORY_KEPT - 1)]},
            [entry],
        ]
    }


def control_stamp(action: str, by: str | None, reason: str | None) -> dict[str, Any]:
    """The state's ``control`` object: the last control applied, who asked and why."""
    fields: dict[str, Any] = {"action": action}
    if by:
        fields["requestedBy"] = by
    if reason:
        fields["reason"] = reason
    return stamped(fields, "at")


@dataclass
class Lease:
    """A held partition lease; every write through it is fenced by ``token``."""

    partition_id: Any
    slot: int
    token: str
    owner: str
    ttl_ms: int
    group_slot: str | None = None


class BackgroundStore:
    """State and partition collections of one database."""

    def __init__(
        self,
        db: Database[dict[str, Any]],
        *,
        collection: str = "_migronaut_background",
        ensure_indexes: bool = True,
    ) -> None:
        self.db = db
        self.name = collection
        self.states: Collection[dict[str, Any]] = db[collection]
        self.partitions: Collection[dict[str, Any]] = db[collection + "_partitions"]
        self.watch: Collection[dict[str, Any]] = db[collection + "_watch"]
        self._ensure_indexes = ensure_indexes
        self._indexes_ready = False

    @property
    def own_collections(self) -> tuple[str, ...]:
        return (self.name, self.name + "_partitions", self.name + "_watch")

    # -- indexes --------------------------------------------------------------------------
    def ready(self) -> None:
        """Create the four indexes (idempotent), or verify them when index creation is off."""
        if self._indexes_ready:
            return
        if self._ensure_indexes:
            from pymongo import IndexModel

            by_collection: dict[str, list[IndexModel]] = {}
            for suffix, name, keys, opts in INDEXES:
                by_collection.setdefault(suffix, []).append(IndexModel(keys, name=name, **opts))
            for suffix, models in by_collection.items():
                self.db[self.name + suffix].create_indexes(models)
        else:
            missing = self.missing_indexes()
            if missing:
                raise ConfigInvalidError(
                    "Background indexes are missing and ensure_indexes is off — refusing to run "
                    "without the slot cap: " + "; ".join(missing),
                    {"missing": missing},
                )
        self._indexes_ready = True

    def missing_indexes(self) -> list[str]:
        from pymongo.errors import OperationFailure

        missing = []
        present: dict[str, set[str]] = {}
        for suffix, name, keys, _ in INDEXES:
            coll = self.name + suffix
            if coll not in present:
                try:
                    present[coll] = set(self.db[coll].index_information())
                except OperationFailure:
                    present[coll] = set()
            if name not in present[coll]:
                key = ", ".join(f"{k}: {v}" for k, v in keys)
                missing.append(f"{coll}: {{{key}}} ({name})")
        return missing

    # -- state reads ----------------------------------------------------------------------
    def get(self, name: str, projection: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return self.states.find_one({"_id": name}, projection)

    def require(self, name: str) -> dict[str, Any]:
        state = self.get(name)
        if state is None:
            raise NotAppliedError(
                f"Background migration {name} is not registered", {"migration": name}
            )
        return state

    def all(self, statuses: Sequence[str] | None = None) -> list[dict[str, Any]]:
        query: dict[str, Any] = {"status": {"$in": list(statuses)}} if statuses else {}
        return list(self.states.find(query).sort([("registeredAt", 1), ("_id", 1)]))

    # -- registration ---------------------------------------------------------------------
    def register(
        self,
        name: str,
        *,
        status: str,
        direction: str,
        mode: str,
        collection: str | None,
        spec: Mapping[str, Any],
        checksum: str,
        requires: Sequence[str] = (),
        waits_for: Sequence[str] = (),
        description: str | None = None,
        session: ClientSession | None = None,
    ) -> dict[str, Any]:
        """(Re-)register: old partitions go first, then the state is replaced, history kept.

        Deleting partitions before replacing the state means a crash never leaves partitions
        that the new registration's generation numbers could mistake for its own.
        """
        self.partitions.delete_many({"background": name}, session=session)
        registration = str(uuid.uuid4())  # with dashes, as the Node original mints them
        fields: dict[str, Any] = {
            "schema": SCHEMA,
            "registration": registration,
            "status": status,
            "phase": "partition",
            "direction": direction,
            "mode": mode,
            "collection": collection,
            "spec": dict(spec),
            "checksum": checksum,
            "requires": list(requires),
            "waitsFor": list(waits_for),
            "description": description,
            "pass": 0,
            "generation": 0,
            "rolledGeneration": 0,
            "totals": {},
            "badIds": [],
            "docErrors": [],
            "failedPartitions": 0,
            "failures": 0,
            "reopened": 0,
        }
        stage: dict[str, Any] = {k: literal(v) for k, v in fields.items()}
        stage.update(
            {
                "registeredAt": "$$NOW",
                "updatedAt": "$$NOW",
                "history": {
                    "$concatArrays": [
                        {"$slice": [{"$ifNull": ["$history", []]}, -(HISTORY_KEPT - 1)]},
                        [{"$mergeObjects": [
                            {"at": "$$NOW", "action": "register", "to": literal(status),
                             "direction": literal(direction)},
                            # "from" only when there was a status (a re-registration)
                            {"$cond": [{"$ifNull": ["$status", False]}, {"from": "$status"},
                                       {}]},
                        ]}],
                    ]
                },
                "previous": {
                    "$cond": [
                        {"$ifNull": ["$registration", False]},
                        {
                            "registration": "$registration",
                            "status": "$status",
                            "direction": "$direction",
                            "pass": "$pass",
                            "totals": "$totals",
                            "registeredAt": "$registeredAt",
                            "completedAt": "$completedAt",
                        },
                        "$$REMOVE",
                    ]
                },
            }
        )
        unset = [
            "plan", "startedAt", "completedAt", "failedAt", "lastProgressAt", "lastError",
            "control", "coordinator", "round",
        ]
        from pymongo import ReturnDocument

        state = self.states.find_one_and_update(
            {"_id": name},
            [{"$set": stage}, {"$unset": unset}],
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        assert state is not None
        return state

    def withdraw(self, name: str, *, registration: str, generation: int) -> bool:
        """Remove a registration that rewrote nothing (``down`` without a way back).

        Atomic: the state goes only while it is the registration and the ``generation`` the
        caller judged (``0``: no plan was ever committed) — a coordinator committing a plan
        first wins and the withdrawal matches nothing — and its partitions go only when the
        state did.
        """
        result = self.states.delete_one(
            {"_id": name, "registration": registration, "generation": generation}
        )
        if result.deleted_count != 1:
            return False
        self.partitions.delete_many({"background": name})
        return True

    # -- status moves ---------------------------------------------------------------------
    def move(
        self,
        name: str,
        action: str,
        *,
        expect: Mapping[str, Any] | None = None,
        set_fields: Mapping[str, Any] | None = None,
        server_times: Sequence[str] = (),
        unset: Sequence[str] = (),
        by: str | None = None,
        reason: str | None = None,
        control: bool = False,
    ) -> dict[str, Any] | None:
        """Compare-and-set ``action``'s transition; ``None`` when the state moved meanwhile.

        ``expect`` narrows the filter (e.g. a generation); ``server_times`` are fields stamped
        with ``$$NOW``; the history entry is appended in the same update.
        """
        allowed, to, _ = _TABLE[action]
        query: dict[str, Any] = {"_id": name, "status": {"$in": list(allowed)}}
        query.update(expect or {})
        stage = set_stage(set_fields or {}, server_times)
        stage["status"] = literal(to)
        stage["updatedAt"] = "$$NOW"
        stage["history"] = history_entry(action, to, by, reason)
        if control:
            stage["control"] = control_stamp(action, by, reason)
        pipeline: list[dict[str, Any]] = [{"$set": stage}]
        if unset:
            pipeline.append({"$unset": list(unset)})
        from pymongo import ReturnDocument

        return self.states.find_one_and_update(
            query, pipeline, return_document=ReturnDocument.AFTER
        )

    def update_state(
        self,
        name: str,
        expect: Mapping[str, Any],
        set_fields: Mapping[str, Any],
        *,
        server_times: Sequence[str] = (),
        inc: Mapping[str, int] | None = None,
        unset: Sequence[str] = (),
    ) -> bool:
        """A compare-and-set on the state that does not move its status."""
        stage = set_stage(set_fields, server_times)
        for key, amount in (inc or {}).items():
            stage[key] = {"$add": [{"$ifNull": ["$" + key, 0]}, amount]}
        stage["updatedAt"] = "$$NOW"
        pipeline: list[dict[str, Any]] = [{"$set": stage}]
        if unset:
            pipeline.append({"$unset": list(unset)})
        result = self.states.update_one({"_id": name, **expect}, pipeline)
        return result.matched_count == 1

    def control_read(self, name: str) -> dict[str, Any] | None:
        """The per-batch control read: status, generation and plan token only."""
        return self.states.find_one(
            {"_id": name}, {"status": 1, "generation": 1, "plan.token": 1}
        )

    # -- partitions -----------------------------------------------------------------------
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
        self.partitions.delete_many({"background": name, "generation": {"$lt": generation}})

    def count_by_status(self, name: str, generation: int, token: str) -> dict[str, int]:
        counts = {s: 0 for s in ("pending", "running", "done", "failed", "cancelled",
                                 "superseded")}
        pipeline: list[dict[str, Any]] = [
            {"$match": {"background": name, "generation": generation, "plan": token}},
            {"$group": {"_id": "$status", "n": {"$sum": 1},
                        "leased": {"$sum": {"$cond": [{"$ifNull": ["$lease", False]}, 1, 0]}}}},
        ]
        leased = 0
        for row in self.partitions.aggregate(pipeline):
            counts[row["_id"]] = row["n"]
            leased += row["leased"]
        counts["leased"] = leased
        return counts

    def list_partitions(self, name: str) -> list[dict[str, Any]]:
        cursor = self.partitions.find({"background": name})
        return list(cursor.sort([("generation", -1), ("seq", 1)]))

    def set_open_partitions(
        self, name: str, generation: int, status: str, *, statuses: Sequence[str] = (
            "pending", "running")
    ) -> int:
        result = self.partitions.update_many(
            {"background": name, "generation": generation, "status": {"$in": list(statuses)}},
            {"$set": {"status": status}, "$currentDate": {"updatedAt": True}},
        )
        return result.modified_count

    def live_leases(self, name: str) -> int:
        """Leases renewed within their own TTL, judged in server time."""
        return self.partitions.count_documents(
            {"background": name, "lease": {"$exists": True}, "$expr": {"$gte": _LEASE_AGE}}
        )

    def reap_expired_leases(self, name: str) -> int:
        """Remove leases not renewed within their own TTL (server time); a reclaim each.

        Each lease is judged by the ``ttlMs`` its holder wrote, never by the TTL of the process
        looking: a worker with a shorter TTL must not take a longer-TTL holder's live slot.
        """
        result = self.partitions.update_many(
            {"background": name, "lease": {"$exists": True}, "$expr": {"$lt": _LEASE_AGE}},
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
    ) -> Lease | str:
        """Claim a partition and a free slot in one atomic write.

        Returns the :class:`Lease`, ``"exhausted"`` (no claimable partition) or ``"busy"`` (no
        free slot, or every free slot lost to a racing claimer). Expired leases are reaped first.
        ``shard_concurrency`` (sharded plans) also takes a group slot, see :meth:`_claim_grouped`.
        """
        import random

        self.ready()
        self.reap_expired_leases(name)
        free = [s for s in range(max_parallel) if s not in self.occupied_slots(name)]
        if not free:
            return "busy"
        start = (rng or random).randrange(len(free))
        slots = free[start:] + free[:start]
        claimable: dict[str, Any] = {
            "background": name,
            "generation": generation,
            "plan": plan,
            "status": {"$in": ["pending", "running"]},
            "lease": {"$exists": False},
        }
        if shard_concurrency is not None:
            return self._claim_grouped(claimable, slots, shard_concurrency, owner, ttl_ms)
        for slot in slots:
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
                projection={"_id": 1},
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError as error:
            pattern = (error.details or {}).get("keyPattern") or {}
            on_group = "lease.groupSlot" in pattern or "lease_group_slot" in str(error)
            return "group" if on_group else "slot"
        if doc is None:
            return None
        return Lease(doc["_id"], slot, token, owner, ttl_ms, group_slot)

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
        next checkpoint), so whoever holds the partition after a crash can count them.
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
            {"_id": lease.partition_id, "lease.token": lease.token, "status": {"$in": _OPEN}},
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
            {"_id": lease.partition_id, "lease.token": lease.token, "status": {"$in": _OPEN}},
            [{"$set": {"status": "failed", "lastError": literal(error), "updatedAt": "$$NOW"}},
             {"$unset": "lease"}],
        )
        if result.matched_count == 0:
            self.release(lease)

    def count_bad_ids(self, name: str, generation: int, state_bad_ids: Sequence[Any]) -> int:
        """Distinct failed ``_id``s: the state's (earlier generations) plus this generation's."""
        pipeline: list[dict[str, Any]] = [
            {"$match": {"background": name, "generation": generation}},
            {"$unwind": "$badIds"},
            {"$group": {"_id": None, "ids": {"$addToSet": "$badIds"}}},
        ]
        ids: list[Any] = []
        for row in self.partitions.aggregate(pipeline):
            ids = row["ids"]
        seen = {_canonical(i) for i in state_bad_ids}
        seen.update(_canonical(i) for i in ids)
        return len(seen)


def _canonical(value: Any) -> str:
    """A type-tagged key, so a string never stands in for an ObjectId with the same hex."""
    return f"{type(value).__name__}:{value!r}"
