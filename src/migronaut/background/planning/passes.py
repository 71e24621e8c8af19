"""Planning a pass: the plan a coordinator step commits, and the counts that close it.

A pass's plan cuts the migration's documents into partitions
(:mod:`~migronaut.background.planning.sharding` picks the partitioner) and is committed by one
compare-and-set on the state, so only one plan per generation commits; the closing count asks
whether any document is left, through the version index when there is one. :class:`PassPlanning` is
the half of :class:`~migronaut.background.coordination.coordinator.Coordinator` that does this, kept
apart from the step's control flow; :class:`Answer` and :class:`Stamp` are the shapes both halves
write.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from migronaut.background.planning.sharding import plan_collection
from migronaut.background.planning.version_index import forget, hint_refused, version_index

if TYPE_CHECKING:
    from migronaut.background.coordination.handles import EngineHandles
    from migronaut.background.planning.id_ranges import Plan
    from migronaut.background.planning.job import BackgroundJob

__all__ = ["Answer", "PassPlanning", "Stamp", "merged"]


@dataclass
class Answer:
    """What a coordinator step decided (reference background §3.1)."""

    next: str
    lanes: int = 0
    generation: int | None = None
    registration: str | None = None
    counts: dict[str, int] | None = None
    status: str | None = None
    reason: str | None = None
    error: str | None = None
    waits_for: list[str] | None = None
    retry_after_ms: int | None = None
    #: the chain's round, for drivers that run coordinator chains (:data:`ROUND_DRIVERS`)
    round: int | None = None

    def to_dict(self) -> dict[str, Any]:
        names = {"waits_for": "waitsFor", "retry_after_ms": "retryAfterMs"}
        return {names.get(k, k): v for k, v in asdict(self).items() if v is not None}


class Stamp:
    """A step's record of its driver, ``coordinator: {kind, at}`` (reference background §3.1,
    5), written once per step that gets that far: by the step's first compare-and-set that can
    carry it (the plan commit, the roll-up, the completion), else alone when the step ends (or
    raises) — one round trip less for a step that commits or closes a pass."""

    def __init__(self, driver: str, *, ref: str | None = None,
                 round: int | None = None) -> None:
        self.driver = driver
        self.ref = ref
        self.round = round  # a new chain's round, written with the stamp (same lock, same step)
        self.pending = True

    def merge(self, set_fields: Mapping[str, Any] | None = None,
              server_times: Sequence[str] = ()) -> tuple[dict[str, Any], list[str]]:
        """``set_fields`` and ``server_times`` with the stamp added while it is pending."""
        fields, times = dict(set_fields or {}), list(server_times)
        if self.pending:
            fields["coordinator"] = {"kind": self.driver,
                                     **({"ref": self.ref} if self.ref else {})}
            times.append("coordinator.at")
            if self.round is not None:
                fields["round"] = self.round
        return fields, times

    def landed(self, written: bool) -> None:
        """The write that carried :meth:`merge`'s fields matched (or not)."""
        if written:
            self.pending = False


def merged(stamp: Stamp | None, set_fields: Mapping[str, Any],
           server_times: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """:meth:`Stamp.merge` when a step has a stamp; the fields alone otherwise."""
    if stamp is None:
        return dict(set_fields), list(server_times)
    return stamp.merge(set_fields, server_times)


class PassPlanning:
    """Plan commits, the closing count and the probes they need, for the coordinator."""

    engine: EngineHandles
    #: whether the server runs transactions, once a probe said so definitely
    _transactions: bool | None = None

    def _match_hash(self, job: BackgroundJob) -> str:
        from migronaut.background.planning.spec import match_hash

        return match_hash(dict(job.spec), job.direction)

    def supports_transactions(self) -> bool:
        """A replica set or mongos can run transactions; the dev server can too (it says so).

        Only an answer that says "no transactions here" counts as a standalone: a probe that
        fails for another reason (a write conflict on a busy server, a network blip) must not
        fail a migration — the transaction itself will say. A definite answer is kept for the
        engine's life.
        """
        from migronaut.core.topology import read_topology

        if self._transactions is not None:
            return self._transactions
        try:
            topology = read_topology(self.engine.db.client, self.engine.store.states)
        except Exception:
            return True  # hello failed: let the transaction itself say
        if topology.transactions is None:
            return True
        self._transactions = topology.transactions
        return topology.transactions

    def plan_pass(self, state: Mapping[str, Any], job: BackgroundJob) -> Answer | None:
        """Plan a pass (or a replan) and commit it by compare-and-set; ``None`` to loop on."""
        committed = self._plan_pass(state, job)
        return committed if isinstance(committed, Answer) else None

    def _plan_pass(
        self, state: Mapping[str, Any], job: BackgroundJob, stamp: Stamp | None = None
    ) -> Answer | tuple[dict[str, Any], int]:
        """:meth:`plan_pass`; committed, the state as written and the plan's partition count.
        The commit carries the step's ``stamp`` when it is still to be written."""
        name = state["_id"]
        replan = state.get("phase") == "replan"
        new_pass = int(state.get("pass", 0)) + (0 if replan else 1)
        generation = int(state.get("generation", 0)) + 1
        token = uuid.uuid4().hex
        if job.mode == "step":
            from migronaut.background.planning.id_ranges import Plan

            plan = Plan(partitions=[{"scope": {"kind": "step"}, "estimate": 0}], method="step")
            meta = {"method": "step", "estimate": 0, "partitioner": "step"}
        else:
            plan = self._plan_collection(state, job)
            meta = plan.meta()
        self.engine.store.insert_plan(name, generation, token, plan.partitions)
        previous = (state.get("plan") or {}).get("token")
        expect: dict[str, Any] = {
            "generation": state.get("generation", 0),
            "plan.token": previous if previous else {"$exists": False},
            "status": {"$in": ["pending", "running"]},
            "checksum": state.get("checksum"),
        }
        plan_doc = {**meta, "token": token, "generation": generation,
                    "partitions": len(plan.partitions), "match": self._match_hash(job)}
        set_fields, server_times = merged(
            stamp,
            {"generation": generation, "plan": plan_doc, "phase": "process", "pass": new_pass},
            ["plan.at", "lastProgressAt"] + ([] if state.get("startedAt") else ["startedAt"]),
        )
        committed = self.engine.store.commit_plan(name, expect, set_fields,
                                                  server_times=server_times)
        if stamp is not None:
            stamp.landed(committed is not None)
        if committed is None:
            self.engine.store.drop_plan(name, token)
            return Answer("wait", reason="plan-race", retry_after_ms=1000)
        self.engine.store.drop_foreign_plans(name, token)
        payload = {"migration": name, "generation": generation, "pass": new_pass,
                   "partitions": len(plan.partitions), "estimate": plan.estimate,
                   "method": meta["method"]}
        if plan.at_least:
            payload["atLeast"] = True
        if plan.degraded:
            payload["degraded"] = plan.degraded
            self.engine.logger.warning("⚠ %s: degraded plan (%s)", name, plan.degraded)
        self.engine.emit("background:partitioned", payload)
        return committed, len(plan.partitions)

    def _plan_collection(self, state: Mapping[str, Any], job: BackgroundJob) -> Plan:
        """Plan the pass's documents; a hint the server refuses (the version index went away
        since it was looked up) is forgotten and the plan made without it."""
        hint = self.version_hint(job)
        while True:
            try:
                return plan_collection(
                    self.engine.db, job.match(state.get("badIds")), job.spec, hint=hint,
                    shard_aware=self.engine.shard_aware, logger=self.engine.logger,
                    name=state["_id"])
            except Exception as error:
                if hint is None or not hint_refused(error):
                    raise
                forget(self.engine.db[str(job.spec["collection"])],
                       str(job.spec.get("field", "__v")))
                hint = None

    def version_hint(self, job: BackgroundJob) -> Any:
        """The version index ``{field: 1, _id: 1}`` when it exists (looked up once per process,
        :mod:`~migronaut.background.planning.version_index`)."""
        collection = str(job.spec.get("collection"))
        field_name = str(job.spec.get("field", "__v"))
        try:
            found = version_index(self.engine.db[collection], field_name)
        except Exception:
            found = None
        if found is not None:
            return [(field_name, 1), ("_id", 1)]
        self.engine.logger.debug("%s has no version index {%s: 1, _id: 1}", collection, field_name)
        return None

    def _remaining(self, state: Mapping[str, Any], job: BackgroundJob) -> int:
        """Whether documents are left to migrate (0 or 1): completion is decided by this count,
        never by summing partitions. A hint the server refuses (the index went away) is
        forgotten and the count made without it."""
        coll = self.engine.db[str(job.spec["collection"])]
        match = job.match(state.get("badIds"))
        hint = self.version_hint(job)
        if hint is not None:
            try:
                return coll.count_documents(match, limit=1, hint=hint)
            except Exception as error:
                if not hint_refused(error):
                    raise
                forget(coll, str(job.spec.get("field", "__v")))
        return coll.count_documents(match, limit=1)
