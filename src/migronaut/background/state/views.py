"""The read side of background migrations: status views, partition rows, the runnable list.

Invariant: a view only reads (the runnable list may unblock a migration whose requirements are
done — the same compare-and-set move a coordinator step makes); totals shown before a pass
closes add the counters of the generation not rolled up yet, so they never go backwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut.background.planning.shard_facts import plan_group_partitions, plan_shard_key
from migronaut.background.state.fields import TERMINAL, max_parallel, understood
from migronaut.background.state.rollup import live_totals, summed_totals
from migronaut.errors import StateInvalidError

if TYPE_CHECKING:
    from migronaut.background.coordination.handles import EngineHandles
    from migronaut.background.state.requirements import Requirements

__all__ = ["StateViews"]


class StateViews:
    """Status views of one database's background migrations (reference background §6.2)."""

    def __init__(self, engine: EngineHandles, requirements: Requirements) -> None:
        self.engine = engine
        self.requirements = requirements

    def status(self, name: str | None = None, *, invalid_rows: bool = False
               ) -> list[dict[str, Any]]:
        """The views of ``name`` (or of every migration): the states, then one aggregate over
        their partitions — two reads whatever the number of migrations and partitions.

        A state migronaut cannot read is ``STATE_INVALID`` naming the migration and the field;
        with ``invalid_rows`` (a dashboard showing the others) it is the row
        ``{migration, status: "invalid", error}`` instead."""
        states = [self.engine.store.require(name)] if name else self.engine.store.all()
        if not states:
            return []
        summary = self.engine.store.summary([state["_id"] for state in states])
        out = []
        for state in states:
            try:
                out.append(self.view(state, summary.get(state["_id"], [])))
            except StateInvalidError as error:
                if not invalid_rows:
                    raise
                out.append({"migration": state["_id"], "status": "invalid",
                            "error": error.to_dict()})
        return out

    def view(self, state: Mapping[str, Any],
             summary: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """The ``BackgroundStatus`` view (reference background §6.2); ``summary`` (the
        migration's rows of :meth:`PartitionStore.summary`) saves its two partition reads.
        A state field it cannot read is ``STATE_INVALID`` naming it (:func:`understood`)."""
        understood(state)
        name = state["_id"]
        spec = state.get("spec") or {}
        plan = state.get("plan") or None
        view: dict[str, Any] = {
            "migration": name, "status": state.get("status"), "phase": state.get("phase"),
            "direction": state.get("direction"), "registration": state.get("registration"),
            "mode": state.get("mode"), "collection": state.get("collection"),
            "from": spec.get("from"), "to": spec.get("to"),
            "generation": state.get("generation", 0), "pass": state.get("pass", 0),
            "maxParallel": spec.get("maxParallel", 1),
            "transaction": bool(spec.get("transaction")),
            "totals": live_totals(self.engine, state) if summary is None
            else summed_totals(state, summary),
            "failedDocuments": len(state.get("badIds") or []),
            "requires": list(state.get("requires") or []),
            "waitsFor": list(state.get("waitsFor") or []),
            "liveLeases": None,  # below, with the partition counts
            "registeredAt": state.get("registeredAt"),
            "startedAt": state.get("startedAt"), "completedAt": state.get("completedAt"),
            "lastProgressAt": state.get("lastProgressAt"), "lastError": state.get("lastError"),
            "description": state.get("description"),
        }
        counts, view["liveLeases"] = self._partition_facts(name, plan, summary)
        if plan and counts is not None:
            view["partitions"] = counts
            counts["total"] = sum(v for k, v in counts.items() if k != "leased")
            view["plan"] = {k: plan[k] for k in ("method", "estimate", "atLeast", "partitions",
                                                  "degraded") if k in plan}
            if plan.get("sharding"):
                view["sharding"] = _sharding_view(plan["sharding"])
        if state.get("coordinator"):
            view["coordinator"] = state["coordinator"]
        if state.get("previous"):
            view["previous"] = state["previous"]
        return {k: v for k, v in view.items() if v is not None}

    def _partition_facts(
        self, name: str, plan: Mapping[str, Any] | None,
        summary: Sequence[Mapping[str, Any]] | None,
    ) -> tuple[dict[str, int] | None, int]:
        """The current plan's partitions by status (with ``leased``; ``None`` without a plan)
        and the live leases: from ``summary`` when given, else in one aggregate (one count
        without a plan)."""
        store = self.engine.store
        if summary is not None:
            live = sum(int(row.get("live") or 0) for row in summary)
            if not plan:
                return None, live
            return store.summary_counts(summary, int(plan["generation"]), plan["token"]), live
        if not plan:
            return None, store.live_leases(name)
        return store.counts_and_live_leases(name, int(plan["generation"]), plan["token"])

    def partitions_view(self, name: str) -> list[dict[str, Any]]:
        self.engine.store.require(name)
        out = []
        for partition in self.engine.store.list_partitions(name):
            lease = partition.get("lease")
            row: dict[str, Any] = {
                "id": str(partition["_id"]), "generation": partition.get("generation"),
                "seq": partition.get("seq"), "status": partition.get("status"),
                "scope": partition.get("scope"), "estimate": partition.get("estimate"),
                "counters": partition.get("counters") or {},
                "claims": partition.get("claims", 0), "reclaims": partition.get("reclaims", 0),
                "failures": partition.get("failures", 0),
            }
            if partition.get("group") is not None:
                row["group"] = partition["group"]
            if lease:
                row["lease"] = {k: lease.get(k) for k in ("slot", "owner", "host", "pid",
                                                           "renewedAt")}
            if partition.get("throttle"):
                row["throttle"] = partition["throttle"]
            if partition.get("lastError"):
                row["lastError"] = partition["lastError"]
            # failures of a generation not rolled up yet (the dashboard shows them live)
            for key in ("badIds", "lastDocErrors"):
                if partition.get(key):
                    row[key] = list(partition[key])
            for when in ("startedAt", "doneAt", "updatedAt"):  # throughput over time
                if partition.get(when) is not None:
                    row[when] = partition[when]
            out.append(row)
        return out

    def runnable(self) -> list[dict[str, Any]]:
        """Blocked/pending/running migrations a worker should serve, oldest first — and any
        whose ``status`` or ``spec`` migronaut does not know: serving one refuses it with
        ``STATE_INVALID`` naming the field (a worker reports that), where leaving it out would
        pass over it in silence."""
        out = []
        for state in self.engine.store.all(excluding=("paused", *TERMINAL)):
            if state.get("status") == "blocked":
                state = self.requirements.try_unblock(state)
                if state["status"] == "blocked":
                    continue
            try:
                parallel = max_parallel(state)
            except StateInvalidError:
                parallel = 1  # serving it refuses it, naming the field
            out.append({
                "migration": state["_id"], "status": state.get("status"),
                "maxParallel": parallel,
                "liveLeases": self.engine.store.live_leases(state["_id"]),
                "registeredAt": state.get("registeredAt"),
            })
        return out

    def chains(self, names: Sequence[str]) -> dict[str, bool]:
        """Of ``names``, those with a queue coordinator chain's heartbeat (``chain``), and
        whether it is live: renewed in the migration's current round and not expired, judged
        in server time. A migration without one is left out (its chain never ran a step)."""
        if not names:
            return {}
        states = self.engine.store.states
        recorded = states.find({"_id": {"$in": list(names)}, "chain": {"$exists": True}},
                               {"_id": 1})
        found = {str(row["_id"]): False for row in recorded}
        if found:
            live = states.find({"_id": {"$in": list(found)}, "$expr": {"$and": [
                {"$eq": ["$chain.round", {"$ifNull": ["$round", 0]}]},
                {"$gt": ["$chain.until", "$$NOW"]},
            ]}}, {"_id": 1})
            found.update({str(row["_id"]): True for row in live})
        return found

    def failing(self, name: str) -> bool:
        """Whether an open partition of ``name`` counts failed slices in a row: a lane may be
        waiting out a retry back-off, holding no lease and making no progress."""
        return self.engine.store.partitions.count_documents(
            {"background": name, "status": {"$in": ["pending", "running"]},
             "failures": {"$gt": 0}}, limit=1) > 0

    def stalled(self, quiet_ms: int, *, name: str | None = None,
                coordinator: bool = True) -> list[str]:
        """``running`` migrations (or ``name``) with no live lease whose latest sign of life
        is older than ``quiet_ms``, judged in server time (reference background §6.4
        "Takeover"). Signs of life: ``lastProgressAt``, ``startedAt``, ``registeredAt`` and,
        with ``coordinator``, ``coordinator.at`` (a queue chain asking whether its own lanes
        are stranded leaves its own steps out)."""
        signs = ["$lastProgressAt", "$startedAt", "$registeredAt"] + (
            ["$coordinator.at"] if coordinator else [])
        query: dict[str, Any] = {
            "status": "running",
            "$expr": {"$lt": [{"$max": signs}, {"$subtract": ["$$NOW", quiet_ms]}]},
        }
        if name is not None:
            query["_id"] = name
        quiet = [str(row["_id"]) for row in self.engine.store.states.find(query, {"_id": 1})]
        return [found for found in quiet if not self.engine.store.live_leases(found)]


def _sharding_view(sharding: Mapping[str, Any]) -> dict[str, Any]:
    """``{mode, shardKey?, hashed, groups?}`` (partitions per shard) from a plan's ``sharding``,
    whether Python or the Node original committed it."""
    view: dict[str, Any] = {"mode": sharding.get("mode")}
    key = plan_shard_key(sharding)
    if key is not None:
        view["shardKey"] = key
    view["hashed"] = bool(sharding.get("hashed", key is not None and "hashed" in key.values()))
    groups = plan_group_partitions(sharding)
    if groups:
        view["groups"] = groups
    return view
