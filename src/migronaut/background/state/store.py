"""Background state and partitions in MongoDB: the only place background state lives.

This module owns the state documents (registration, status moves, reads) and the indexes; the
partitions and leases are :mod:`~migronaut.background.state.partitions`'s, the stored shapes and
pipeline builders :mod:`~migronaut.background.state.fields`'s. :class:`BackgroundStore` is all
three to its readers.

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

import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from migronaut.background.state.fields import (
    ACTIONS,
    COUNTERS,
    HISTORY_KEPT,
    INDEXES,
    SCHEMA,
    TRANSITIONS,
    control_stamp,
    history_entry,
    literal,
    set_stage,
    state_update,
    transition,
)
from migronaut.background.state.partitions import Lease, PartitionStore
from migronaut.core.retry import retry_transient
from migronaut.errors import ConfigInvalidError, NotAppliedError

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection
    from pymongo.database import Database

#: The stored shapes are :mod:`~migronaut.background.state.fields`'s and the leases
#: :mod:`~migronaut.background.state.partitions`'s; they are re-exported here for their readers.
__all__ = [
    "ACTIONS",
    "COUNTERS",
    "INDEXES",
    "SCHEMA",
    "BackgroundStore",
    "Lease",
    "transition",
]


class BackgroundStore(PartitionStore):
    """State and partition collections of one database (the partitions and leases in
    :class:`~migronaut.background.state.partitions.PartitionStore`)."""

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
            for suffix, models in by_collection.items():  # idempotent: a cut is ridden out
                retry_transient(partial(self.db[self.name + suffix].create_indexes, models))
        else:
            missing = retry_transient(self.missing_indexes)
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

    def all(self, statuses: Sequence[str] | None = None, *,
            excluding: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The states (with one of ``statuses``, and none of ``excluding``), oldest first."""
        condition: dict[str, Any] = {}
        if statuses:
            condition["$in"] = list(statuses)
        if excluding:
            condition["$nin"] = list(excluding)
        query = {"status": condition} if condition else {}
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
            "control", "coordinator", "round", "chain",
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

    def withdraw(self, name: str, *, registration: str, generation: int,
                 session: ClientSession | None = None) -> bool:
        """Remove a registration that rewrote nothing (``down`` without a way back).

        Atomic: the state goes only while it is the registration and the ``generation`` the
        caller judged (``0``: no plan was ever committed) — a coordinator committing a plan
        first wins and the withdrawal matches nothing — and its partitions go only when the
        state did. In the ``down`` migration's ``session`` (its transaction, if any): an
        aborted ``down`` leaves the registration as it was, with the changelog.
        """
        result = self.states.delete_one(
            {"_id": name, "registration": registration, "generation": generation},
            session=session,
        )
        if result.deleted_count != 1:
            return False
        self.partitions.delete_many({"background": name}, session=session)
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
        allowed, to, _ = TRANSITIONS[action]
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
        pipeline = state_update(set_fields, server_times, inc, unset)
        result = self.states.update_one({"_id": name, **expect}, pipeline)
        return result.matched_count == 1

    def update_state_returning(
        self, name: str, expect: Mapping[str, Any], pipeline: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """A compare-and-set on the state (a :func:`state_update` pipeline) in one
        ``findAndModify``: the state as written, ``None`` when it matched nothing (saves
        reading it back)."""
        from pymongo import ReturnDocument

        return self.states.find_one_and_update(
            {"_id": name, **expect}, pipeline, return_document=ReturnDocument.AFTER)

    def commit_plan(
        self, name: str, expect: Mapping[str, Any], set_fields: Mapping[str, Any], *,
        server_times: Sequence[str] = (),
    ) -> dict[str, Any] | None:
        """A plan's compare-and-set commit (:meth:`update_state_returning`), which also moves
        a ``pending`` migration to ``running`` — the ``plan`` transition and its history entry,
        as :meth:`move` makes it — in the same write."""
        allowed, to, _ = TRANSITIONS["plan"]
        moves = {"$in": ["$status", list(allowed)]}
        pipeline = state_update(set_fields, server_times)
        pipeline[0]["$set"].update({
            "status": {"$cond": [moves, literal(to), "$status"]},
            "history": {"$cond": [moves, history_entry("plan", to, None, None), "$history"]},
        })
        return self.update_state_returning(name, expect, pipeline)

    def renew_chain(self, name: str, *, round: int, ref: str, ttl_ms: int) -> bool:
        """A queue coordinator chain's heartbeat, ``chain: {round, ref, at, until}`` in server
        time, written only while ``round`` is the stored one (a superseded chain renews
        nothing): the chain counts as live until ``until``. Whether it matched."""
        result = self.states.update_one(
            {"_id": name, "round": round},
            [{"$set": {"chain": {"round": literal(round), "ref": literal(ref), "at": "$$NOW",
                                 "until": {"$add": ["$$NOW", literal(ttl_ms)]}}}}])
        return result.matched_count == 1

    def control_read(self, name: str) -> dict[str, Any] | None:
        """The per-batch control read: status, generation and plan token only."""
        return self.states.find_one(
            {"_id": name}, {"status": 1, "generation": 1, "plan.token": 1}
        )
