"""The operator's controls of a background migration: pause, resume, cancel, retry, repin, unlock.

Invariant: every control is a compare-and-set on the stored status (reference background §2.5,
the transition table in :mod:`migronaut.background.state.store`) with a history entry saying who did
it and why; a control that lost a race re-reads the state and decides again, and a repeated
control changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.background.planning.job import load_job
from migronaut.background.state.fields import (
    TERMINAL,
    control_stamp,
    history_entry,
    literal,
    set_stage,
    transition,
)
from migronaut.background.state.rollup import roll_up
from migronaut.errors import BackgroundConflictError

if TYPE_CHECKING:
    from migronaut.background.coordination.handles import EngineHandles
    from migronaut.background.state.requirements import Requirements

__all__ = ["ControlResult", "Controls"]


@dataclass
class ControlResult:
    applied: str
    status: str
    stopped: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"applied": self.applied, "status": self.status}
        if self.stopped is not None:
            out["stopped"] = self.stopped
        out.update(self.extra)
        return out



class Controls:
    """Controls over one database's background migrations, each a CAS with history."""

    def __init__(self, engine: EngineHandles, requirements: Requirements) -> None:
        self.engine = engine
        self.requirements = requirements

    def control(
        self, name: str, action: str, *, requested_by: str | None, reason: str | None,
        from_start: bool, wait: bool, wait_timeout_s: float,
    ) -> ControlResult:
        """pause / resume / cancel / retry (reference §2.5), each a CAS with history; the
        options (and their defaults) are :meth:`EngineCore.control`'s."""
        for _ in range(5):
            state = self.engine.store.require(name)
            status = state["status"]
            effective = "reopen" if action == "retry" and status == "completed" else action
            to, changed = transition(name, status, effective)
            if not changed and not (action == "retry" and from_start):
                return self._control_done(name, action, status, status, wait, wait_timeout_s,
                                          applied="unchanged")
            set_fields: dict[str, Any] = {}
            unset: list[str] = []
            if effective == "resume":
                requires = state.get("requires") or []
                waiting = [w["migration"] for w in self.requirements.unmet(requires)]
                if waiting:
                    to = "blocked"
                    set_fields["waitsFor"] = waiting
                elif state.get("plan") and state.get("phase") == "process":
                    to = "running"
            if effective == "reopen":
                set_fields.update({"phase": "partition"})
            if action == "retry" and from_start:
                set_fields.update({"phase": "partition", "pass": 0, "badIds": [],
                                   "failedPartitions": 0, "docErrors": []})
                # the failed documents are tried again: their count goes with their list (the
                # other totals are kept), so a document failing again is not counted twice
                unset.extend(["lastError", "totals.failed"])
            elif action == "retry" and effective == "retry":
                closed = int(state.get("rolledGeneration", 0)) >= int(state.get("generation", 0))
                set_fields["failedPartitions"] = 0
                if closed:
                    set_fields["phase"] = "partition"
            moved = self._cas_control(name, effective, status, to, set_fields, unset,
                                      requested_by, reason, state)
            if moved is None:
                continue  # lost a race: re-evaluate from the fresh state
            generation = int(state.get("generation", 0))
            if effective == "cancel":
                self.engine.store.set_open_partitions(name, generation, "cancelled")
            elif effective == "reopen":
                self.engine.store.update_state(name, {}, {}, inc={"reopened": 1})
            elif action == "retry" and from_start:
                if int(state.get("rolledGeneration", 0)) < generation:
                    # totals are kept
                    roll_up(self.engine, state, closing=False, counters_only=True)
                self.engine.store.partitions.delete_many({"background": name,
                                                          "generation": {"$lte": generation}})
            elif action == "retry":
                self.engine.store.partitions.update_many(
                    {"background": name, "generation": generation,
                     "status": {"$in": ["failed", "cancelled"]}},
                    {"$set": {"status": "pending", "failures": 0}},
                )
            return self._control_done(name, action, status, to, wait, wait_timeout_s,
                                      applied="changed")
        raise BackgroundConflictError(
            f"Cannot {action} background migration {name}: its state keeps changing",
            {"migration": name, "action": action},
        )

    def _cas_control(
        self, name: str, action: str, status: str, to: str, set_fields: dict[str, Any],
        unset: list[str], by: str | None, reason: str | None, state: Mapping[str, Any],
    ) -> dict[str, Any] | None:
        """Move ``status → to`` for a control (``to`` may differ from the table for resume)."""
        from pymongo import ReturnDocument

        stage = set_stage(set_fields)
        stage.update({
            "status": literal(to),
            "updatedAt": "$$NOW",
            "history": history_entry(action, to, by, reason),
            "control": control_stamp(action, by, reason),
        })
        if to == "pending" and action in ("retry",):
            stage["failedAt"] = "$$REMOVE"
        pipeline: list[dict[str, Any]] = [{"$set": stage}]
        if unset:
            pipeline.append({"$unset": unset})
        return self.engine.store.states.find_one_and_update(
            {"_id": name, "status": status, "registration": state.get("registration")},
            pipeline, return_document=ReturnDocument.AFTER)

    def _control_done(
        self, name: str, action: str, before: str, after: str, wait: bool, timeout_s: float,
        *, applied: str,
    ) -> ControlResult:
        if applied == "changed":
            self.engine.emit("background:control", {"migration": name, "action": action,
                                                    "from": before, "to": after})
            self.engine.logger.info("%s: %s (%s → %s)", name, action, before, after)
        stopped: bool | None = None
        if wait and action in ("pause", "cancel"):
            deadline = time.monotonic() + timeout_s
            while self.engine.store.live_leases(name) and time.monotonic() < deadline:
                time.sleep(0.25)
            stopped = self.engine.store.live_leases(name) == 0
        return ControlResult(applied, after, stopped)

    def repin(self, name: str, *, requested_by: str | None = None,
              reason: str | None = None, changelog: Any = None) -> ControlResult:
        """Adopt the file as it is now: store its checksum and spec; replan when matching
        changes."""
        state = self.engine.store.require(name)
        job = load_job(self.engine.directory, name, reserved_collections=self.engine.reserved,
                       reload=True, strict_checksum=False)
        spec = dict(job.resolved.spec)
        old = state.get("spec") or {}
        from migronaut.background.planning.spec import match_hash

        direction = str(state.get("direction", "forward"))
        replan = (
            match_hash(old, direction) != match_hash(spec, direction)
            if old.get("mode") == spec.get("mode") else True
        ) or old.get("maxParallel") != spec.get("maxParallel") or \
            old.get("partitions") != spec.get("partitions")
        fields: dict[str, Any] = {"checksum": job.checksum, "spec": spec}
        if replan and state["status"] not in TERMINAL and state.get("plan"):
            fields["phase"] = "replan"
        stage: dict[str, Any] = {k: literal(v) for k, v in fields.items()}
        stage["history"] = history_entry("repin", None, requested_by, reason)
        stage["updatedAt"] = "$$NOW"
        self.engine.store.states.update_one({"_id": name}, [{"$set": stage}])
        if changelog is not None:
            changelog.set_checksum(name, job.checksum)
        self.engine.emit("background:control", {"migration": name, "action": "repin",
                                                "replan": replan})
        return ControlResult("changed", state["status"],
                             extra={"replan": replan, "checksum": job.checksum})

    def unlock(
        self, name: str, *, requested_by: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Force-release the coordinator lock and every lease (holders are fenced); the state's
        history records who did it and why."""
        self.engine.store.require(name)
        removed = self.engine.lock_collection.delete_one({"_id": f"background:{name}"})
        leases = self.engine.store.release_all_leases(name)
        self.engine.store.states.update_one({"_id": name}, [{"$set": {
            "history": history_entry("unlock", None, requested_by, reason),
            "updatedAt": "$$NOW",
        }}])
        self.engine.logger.warning("⚠ %s: released the coordinator lock (%s) and %d lease(s)", name,
                                   "held" if removed.deleted_count else "none held", leases)
        self.engine.emit("background:control", {"migration": name, "action": "unlock",
                                                "lock": bool(removed.deleted_count),
                                                "leases": leases})
        return {"lock": bool(removed.deleted_count), "leases": leases}


