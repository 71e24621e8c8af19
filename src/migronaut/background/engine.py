"""The background engine: coordinator steps, plan commits, passes, controls and status views.

One :class:`BackgroundEngine` serves one database. It never takes the migration lock and has no
run id of its own: coordinator steps are serialised per migration by the ``background:<name>``
lock, and everything else is a compare-and-set on the stored state, so any number of engines in
any number of processes can drive the same migration (reference background §3, §2.5, §6.1).

Invariants: only one plan per generation commits (CAS on generation + previous plan token + status
+ checksum); every generation's partition counters are rolled up exactly once
(``rolledGeneration``), before any of its partitions is deleted — a pass that closes, a plan
superseded by a replan and a ``retry --from-start`` all roll up first; completion is decided only
by counting what is left, never by summing partitions.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migronaut.background.job import BackgroundJob, load_job
from migronaut.background.sharding import epoch_is_stale, plan_collection
from migronaut.background.store import (
    COUNTERS,
    DOC_ERRORS_KEPT,
    MAX_BAD_IDS,
    SCHEMA,
    TERMINAL,
    BackgroundStore,
    transition,
)
from migronaut.core.context import Cancellation
from migronaut.core.lock import MigrationLock
from migronaut.core.plan import FORWARD_ONLY_ORIGINS
from migronaut.errors import (
    BackgroundConflictError,
    BackgroundFailedError,
    ChecksumMismatchError,
    LockAlreadyHeldError,
    MigrationFileNotFoundError,
    MigronautError,
    RunAbortedError,
)
from migronaut.observability.telemetry import DISABLED, Telemetry

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.background.watch import Watcher

__all__ = ["Answer", "BackgroundEngine", "ControlResult"]

Emit = Callable[[str, dict[str, Any]], None]


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

    def to_dict(self) -> dict[str, Any]:
        names = {"waits_for": "waitsFor", "retry_after_ms": "retryAfterMs"}
        return {names.get(k, k): v for k, v in asdict(self).items() if v is not None}


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


class BackgroundEngine:
    """Coordinator, controls and views over one database's background migrations."""

    def __init__(
        self,
        *,
        db: Database[dict[str, Any]],
        store: BackgroundStore,
        directory: Path,
        lock_collection: Collection[dict[str, Any]],
        lock_ttl_ms: int,
        logger: logging.Logger,
        emit: Emit,
        reserved_collections: tuple[str, ...] = (),
        reload_migrations: bool = False,
        executed_by: str = "unknown",
        telemetry: Telemetry = DISABLED,
        shard_aware: str = "auto",
    ) -> None:
        self.db = db
        self.store = store
        self.directory = directory
        self.lock_collection = lock_collection
        self.ttl_ms = lock_ttl_ms
        self.logger = logger
        self.telemetry = telemetry
        self.emit = telemetry.observe_background(emit)
        self.reserved = reserved_collections
        self.reload = reload_migrations
        self.executed_by = executed_by
        #: the config's ``background_shard_aware``: ``auto`` plans sharded collections by shard
        self.shard_aware = shard_aware
        self._warned: set[str] = set()
        self._transactions: bool | None = None

    # -- jobs -----------------------------------------------------------------------------
    def job(self, state: Mapping[str, Any], *, strict: bool = True) -> BackgroundJob:
        return load_job(
            self.directory,
            state["_id"],
            state=state,
            reserved_collections=self.reserved,
            reload=self.reload,
            strict_checksum=strict,
        )

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.logger.warning(message, *args)

    # -- the coordinator ------------------------------------------------------------------
    def coordinate(
        self, name: str, *, driver: str = "local", cancellation: Cancellation | None = None
    ) -> Answer:
        """One idempotent coordinator step under the ``background:<name>`` lock."""
        lock = MigrationLock(
            self.lock_collection,
            owner=uuid.uuid4().hex,
            ttl_ms=self.ttl_ms,
            executed_by=self.executed_by,
            lock_id=f"background:{name}",
        )
        try:
            lock.acquire()
        except LockAlreadyHeldError:
            return Answer("busy", retry_after_ms=max(1, self.ttl_ms // 2))
        try:
            with self.telemetry.background_coordinate(name, driver=driver) as traced:
                answer = self._coordinate(name, driver, cancellation or Cancellation())
                traced.set({"migronaut.background.next": answer.next,
                            "migronaut.background.reason": answer.reason,
                            "migronaut.background.status": answer.status,
                            "migronaut.background.lanes": answer.lanes})
                return answer
        finally:
            lock.release(run_failed=True)

    def _coordinate(self, name: str, driver: str, cancellation: Cancellation) -> Answer:
        state = self.store.get(name)
        if state is None:
            return Answer("done", status="unregistered")
        if int(state.get("schema", SCHEMA)) > SCHEMA:
            self._warn_once(f"schema:{name}", "⚠ %s was written by a newer migronaut — waiting",
                            name)
            return Answer("wait", reason="newer-schema", retry_after_ms=self.ttl_ms // 2)
        status = state["status"]
        if status in TERMINAL or status == "paused":
            return Answer("done", status=status)
        if status == "blocked":
            state = self.try_unblock(state)
            if state["status"] == "blocked":
                return Answer("done", status="blocked", waits_for=list(state.get("waitsFor", [])))
        self.store.update_state(name, {}, {"coordinator": {"kind": driver}},
                                server_times=["coordinator.at"])
        try:
            job = self.job(state)
        except (ChecksumMismatchError, MigrationFileNotFoundError) as error:
            self._warn_once(f"checksum:{name}:{state.get('checksum')}",
                            "⚠ %s: %s — waiting", name, error.message)
            return Answer("wait", reason="checksum", error=error.message,
                          retry_after_ms=self.ttl_ms // 2)
        if job.spec.get("transaction") and not self.supports_transactions():
            self.fail_state(name, "the server is a standalone: run it with transaction: False "
                            "or on a replica set")
            return Answer("done", status="failed")
        for _ in range(int(job.spec.get("maxPasses", 10)) + 2):
            if cancellation.cancelled:
                return Answer("wait", reason="stopping")
            state = self.store.require(name)
            if state["status"] not in ("pending", "running"):
                return Answer("done", status=state["status"])
            plan = state.get("plan")
            if state.get("phase") == "replan" and plan:
                self.store.set_open_partitions(name, state["generation"], "superseded")
                if self.store.live_leases(name):
                    return Answer("wait", reason="replan-draining", retry_after_ms=1000)
                if int(state.get("rolledGeneration", 0)) < int(state["generation"]):
                    # the superseded plan's work counts: roll it up before a new plan's commit
                    # drops its partitions (its failures do not fail the migration: the new
                    # plan takes their documents again)
                    self._roll_up(state, closing=False)
                    state = self.store.require(name)
                answer = self._plan_pass(state, job)  # phase 'replan': the same pass
                if answer is not None:
                    return answer
                continue
            if state.get("phase") != "process" or not plan or plan.get("match") != \
                    self._match_hash(job):
                answer = self._plan_pass(state, job)
                if answer is not None:
                    return answer
                continue
            if epoch_is_stale(self.db, str(job.spec.get("collection")), plan.get("epoch")):
                self.logger.info("%s: the collection was resharded — replanning the pass", name)
                self.store.update_state(name, {"generation": state["generation"]},
                                        {"phase": "replan"})
                continue
            if state["status"] == "pending":
                self._move(name, "plan")
            reaped = self.store.reap_expired_leases(name)
            if reaped:
                self.logger.debug("%s: reclaimed %d expired lease(s)", name, reaped)
                self.telemetry.leases_reclaimed(reaped)
            counts = self.store.count_by_status(name, state["generation"], plan["token"])
            open_count = counts["pending"] + counts["running"]
            if open_count:
                leased = counts["leased"]
                max_parallel = int(job.spec.get("maxParallel", 1))
                lanes = max(0, min(open_count - leased, max_parallel - leased))
                return Answer("process", lanes=lanes, generation=state["generation"],
                              registration=state["registration"], counts=counts,
                              retry_after_ms=5000)
            answer = self._finalize(state, job)
            if answer is not None:
                return answer
        return Answer("wait", reason="passes", retry_after_ms=1000)

    def _match_hash(self, job: BackgroundJob) -> str:
        from migronaut.background.spec import match_hash

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
            topology = read_topology(self.db.client, self.store.states)
        except Exception:
            return True  # hello failed: let the transaction itself say
        if topology.transactions is None:
            return True
        self._transactions = topology.transactions
        return topology.transactions

    def _plan_pass(self, state: Mapping[str, Any], job: BackgroundJob) -> Answer | None:
        """Plan a pass (or a replan) and commit it by compare-and-set; ``None`` to loop on."""
        name = state["_id"]
        replan = state.get("phase") == "replan"
        new_pass = int(state.get("pass", 0)) + (0 if replan else 1)
        generation = int(state.get("generation", 0)) + 1
        token = uuid.uuid4().hex
        if job.mode == "step":
            from migronaut.background.planner import Plan

            plan = Plan(partitions=[{"scope": {"kind": "step"}, "estimate": 0}], method="step")
            meta = {"method": "step", "estimate": 0, "partitioner": "step"}
        else:
            plan = plan_collection(self.db, job.match(state.get("badIds")), job.spec,
                                   hint=self.version_hint(job), shard_aware=self.shard_aware,
                                   logger=self.logger, name=name)
            meta = plan.meta()
        self.store.insert_plan(name, generation, token, plan.partitions)
        previous = (state.get("plan") or {}).get("token")
        expect: dict[str, Any] = {
            "generation": state.get("generation", 0),
            "plan.token": previous if previous else {"$exists": False},
            "status": {"$in": ["pending", "running"]},
            "checksum": state.get("checksum"),
        }
        plan_doc = {**meta, "token": token, "generation": generation,
                    "partitions": len(plan.partitions), "match": self._match_hash(job)}
        committed = self.store.update_state(
            name, expect,
            {"generation": generation, "plan": plan_doc, "phase": "process", "pass": new_pass},
            server_times=["plan.at", "lastProgressAt"] + ([] if state.get("startedAt")
                                                           else ["startedAt"]),
        )
        if not committed:
            self.store.drop_plan(name, token)
            return Answer("wait", reason="plan-race", retry_after_ms=1000)
        self.store.drop_foreign_plans(name, token)
        payload = {"migration": name, "generation": generation, "pass": new_pass,
                   "partitions": len(plan.partitions), "estimate": plan.estimate,
                   "method": meta["method"]}
        if plan.at_least:
            payload["atLeast"] = True
        if plan.degraded:
            payload["degraded"] = plan.degraded
            self.logger.warning("⚠ %s: degraded plan (%s)", name, plan.degraded)
        self.emit("background:partitioned", payload)
        return None

    def version_hint(self, job: BackgroundJob) -> Any:
        """The version index ``{field: 1, _id: 1}`` when it exists (warned once when missing)."""
        from migronaut.background.planner import index_named

        collection = str(job.spec.get("collection"))
        field_name = str(job.spec.get("field", "__v"))
        key = [(field_name, 1), ("_id", 1)]
        try:
            info = self.db[collection].index_information()
        except Exception:
            info = {}
        if index_named(info, key) is not None:
            return key
        self.logger.debug("%s has no version index {%s: 1, _id: 1}", collection, field_name)
        return None

    def _finalize(self, state: Mapping[str, Any], job: BackgroundJob) -> Answer | None:
        """Close the current pass: roll up once, fail, complete or plan another pass."""
        name = state["_id"]
        generation = int(state["generation"])
        if int(state.get("rolledGeneration", 0)) < generation:
            self._roll_up(state)
        state = self.store.require(name)
        if int(state.get("failedPartitions") or 0):
            error = (f"{state['failedPartitions']} partition(s) failed: "
                     f"{state.get('lastError') or 'unknown error'}")
            self.fail_state(name, error)
            return Answer("done", status="failed", error=error)
        remaining = 0
        if job.mode != "step":
            opts: dict[str, Any] = {"limit": 1}
            hint = self.version_hint(job)
            if hint is not None:
                opts["hint"] = hint
            remaining = self.db[str(job.spec["collection"])].count_documents(
                job.match(state.get("badIds")), **opts)
        if remaining == 0:
            moved = self.store.move(
                name, "complete", expect={"generation": generation},
                set_fields={"phase": "process"}, server_times=["completedAt"])
            if moved is None and state["status"] == "pending":
                self._move(name, "plan")
                moved = self.store.move(
                    name, "complete", expect={"generation": generation},
                    set_fields={"phase": "process"}, server_times=["completedAt"])
            if moved is None:
                return None
            self.store.drop_generations_below(name, generation)
            totals = moved.get("totals", {})
            if moved.get("badIds"):
                self.logger.warning("⚠ %s completed with %d document(s) that could not be "
                                    "migrated", name, len(moved["badIds"]))
            self.emit("background:completed", {"migration": name, "totals": totals,
                                               "passes": moved.get("pass")})
            self.logger.info("✔ Background migration %s completed (%d migrated, %d pass(es))",
                             name, totals.get("migrated", 0), moved.get("pass", 0))
            if moved.get("direction") == "forward":
                self.on_completed(name)
            return Answer("done", status="completed")
        if int(state.get("pass", 0)) >= int(job.spec.get("maxPasses", 10)):
            error = (f"old-shape documents keep appearing after {state.get('pass')} pass(es) — "
                     "is an old version of the application still writing them?")
            self.fail_state(name, error)
            return Answer("done", status="failed", error=error)
        self.emit("background:pass", {"migration": name, "pass": state.get("pass"),
                                      "generation": generation, "totals": state.get("totals")})
        self.store.update_state(name, {"generation": generation, "phase": "process"},
                                {"phase": "partition"})
        self.store.drop_generations_below(name, generation)
        return None

    def _roll_up(
        self, state: Mapping[str, Any], *, closing: bool = True, counters_only: bool = False
    ) -> None:
        """Add the current generation's partition counters into ``totals``, once (CAS on
        ``rolledGeneration``).

        A write intent left on a partition (its lane stopped between a write and its next
        checkpoint, and no lane will hold the partition again) is counted here: its documents
        found at the target. ``closing`` (a pass closes) also records failed partitions, which
        fail the migration; a superseded plan's do not. ``counters_only`` leaves the failed ids
        and document errors alone (``retry --from-start`` has just cleared them).
        """
        name = state["_id"]
        generation = int(state["generation"])
        totals: dict[str, int] = {}
        bad_ids: list[Any] = list(state.get("badIds") or [])
        seen = {repr(i) for i in bad_ids}
        doc_errors: list[Any] = list(state.get("docErrors") or [])
        failed = 0
        last_error: str | None = None
        for partition in self.store.partitions.find({"background": name,
                                                     "generation": generation}):
            for key, value in (partition.get("counters") or {}).items():
                if value:
                    totals[key] = totals.get(key, 0) + int(value)
            if partition.get("reclaims"):
                totals["reclaims"] = totals.get("reclaims", 0) + int(partition["reclaims"])
            landed = self._landed_intent(state, partition)
            if landed:
                for key in ("scanned", "migrated"):
                    totals[key] = totals.get(key, 0) + landed
            for bad in partition.get("badIds") or []:
                if repr(bad) not in seen:
                    seen.add(repr(bad))
                    bad_ids.append(bad)
            doc_errors.extend(partition.get("lastDocErrors") or [])
            if partition.get("status") == "failed":
                failed += 1
                last_error = last_error or partition.get("lastError")
        inc = {f"totals.{k}": v for k, v in totals.items() if v}
        fields: dict[str, Any] = {"rolledGeneration": generation}
        if not counters_only:
            fields.update({"badIds": bad_ids[: MAX_BAD_IDS + 1],
                           "docErrors": doc_errors[-DOC_ERRORS_KEPT:]})
        if failed and closing:
            fields.update({"failedPartitions": failed, "lastError": last_error})
        self.store.update_state(name, {"rolledGeneration": {"$lt": generation}}, fields, inc=inc)

    def _landed_intent(self, state: Mapping[str, Any], partition: Mapping[str, Any]) -> int:
        """How many documents a partition's leftover write intent names that are now at the
        target version (written by the lane that stopped; never counted by a checkpoint)."""
        ids = list((partition.get("inflight") or {}).get("ids") or ())
        spec = state.get("spec") or {}
        if not ids or spec.get("mode") == "step" or not spec.get("collection"):
            return 0
        forward = state.get("direction", "forward") == "forward"
        target = int(spec["to"] if forward else spec["from"])
        version = str(spec.get("field") or "__v")
        at: dict[str, Any] = (
            {version: target} if target else {"$or": [{version: None}, {version: 0}]}
        )
        return self.db[str(spec["collection"])].count_documents(
            {"$and": [{"_id": {"$in": ids}}, at]})

    def fail_state(self, name: str, reason: str) -> None:
        from migronaut._redact import redact

        text = redact(reason, outbound=True)
        moved = self.store.move(name, "fail", set_fields={"lastError": text},
                                server_times=["failedAt"])
        if moved is not None:
            self.emit("background:failed", {"migration": name, "error": text})
            self.logger.error("✖ Background migration %s failed: %s", name, text)

    def _move(self, name: str, action: str, **kw: Any) -> dict[str, Any] | None:
        return self.store.move(name, action, **kw)

    # -- requires -------------------------------------------------------------------------
    def requirement_status(self, required: str, changelog: Any = None) -> str:
        state = self.store.get(required, {"status": 1, "direction": 1})
        if state is None:
            record = changelog.get(required) if changelog is not None else None
            if record and record.get("origin") in FORWARD_ONLY_ORIGINS:  # imported/baselined
                return "adopted"
            return "unregistered"
        if state.get("direction") == "revert":
            return "reverted"
        return str(state["status"])

    def unmet(self, requires: Sequence[str], changelog: Any = None) -> list[dict[str, str]]:
        waiting = []
        for required in requires:
            status = self.requirement_status(required, changelog)
            if status not in ("completed", "adopted"):
                waiting.append({"migration": required, "status": status})
        return waiting

    def try_unblock(self, state: Mapping[str, Any]) -> dict[str, Any]:
        name = state["_id"]
        waiting = [w["migration"] for w in self.unmet(state.get("requires") or [])]
        if waiting:
            if waiting != list(state.get("waitsFor") or []):
                self.store.update_state(name, {"status": "blocked"}, {"waitsFor": waiting})
            return {**state, "waitsFor": waiting}
        moved = self.store.move(name, "unblock", set_fields={"waitsFor": []})
        if moved is not None:
            self.emit("background:unblocked", {"migration": name})
            return moved
        return self.store.require(name)

    def on_completed(self, name: str) -> None:
        """A forward migration completed: unblock the migrations waiting for it."""
        for state in self.store.all(["blocked"]):
            if name in (state.get("requires") or []):
                self.try_unblock(state)

    # -- controls -------------------------------------------------------------------------
    def control(
        self,
        name: str,
        action: str,
        *,
        requested_by: str | None = None,
        reason: str | None = None,
        from_start: bool = False,
        wait: bool = False,
        wait_timeout_s: float = 120.0,
    ) -> ControlResult:
        """pause / resume / cancel / retry (reference §2.5), each a CAS with history."""
        for _ in range(5):
            state = self.store.require(name)
            status = state["status"]
            effective = "reopen" if action == "retry" and status == "completed" else action
            to, changed = transition(name, status, effective)
            if not changed and not (action == "retry" and from_start):
                return self._control_done(name, action, status, status, wait, wait_timeout_s,
                                          applied="unchanged")
            set_fields: dict[str, Any] = {}
            unset: list[str] = []
            if effective == "resume":
                waiting = [w["migration"] for w in self.unmet(state.get("requires") or [])]
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
                unset.append("lastError")
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
                self.store.set_open_partitions(name, generation, "cancelled")
            elif effective == "reopen":
                self.store.update_state(name, {}, {}, inc={"reopened": 1})
            elif action == "retry" and from_start:
                if int(state.get("rolledGeneration", 0)) < generation:
                    self._roll_up(state, closing=False, counters_only=True)  # totals are kept
                self.store.partitions.delete_many({"background": name,
                                                   "generation": {"$lte": generation}})
            elif action == "retry":
                self.store.partitions.update_many(
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

        from migronaut.background.store import control_stamp, history_entry, literal, set_stage

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
        return self.store.states.find_one_and_update(
            {"_id": name, "status": status, "registration": state.get("registration")},
            pipeline, return_document=ReturnDocument.AFTER)

    def _control_done(
        self, name: str, action: str, before: str, after: str, wait: bool, timeout_s: float,
        *, applied: str,
    ) -> ControlResult:
        if applied == "changed":
            self.emit("background:control", {"migration": name, "action": action,
                                             "from": before, "to": after})
            self.logger.info("%s: %s (%s → %s)", name, action, before, after)
        stopped: bool | None = None
        if wait and action in ("pause", "cancel"):
            deadline = time.monotonic() + timeout_s
            while self.store.live_leases(name) and time.monotonic() < deadline:
                time.sleep(0.25)
            stopped = self.store.live_leases(name) == 0
        return ControlResult(applied, after, stopped)

    def repin(self, name: str, *, requested_by: str | None = None,
              reason: str | None = None, changelog: Any = None) -> ControlResult:
        """Adopt the file as it is now: store its checksum and spec; replan when matching
        changes."""
        state = self.store.require(name)
        job = load_job(self.directory, name, reserved_collections=self.reserved,
                       reload=True, strict_checksum=False)
        spec = dict(job.resolved.spec)
        old = state.get("spec") or {}
        from migronaut.background.spec import match_hash

        direction = str(state.get("direction", "forward"))
        replan = (
            match_hash(old, direction) != match_hash(spec, direction)
            if old.get("mode") == spec.get("mode") else True
        ) or old.get("maxParallel") != spec.get("maxParallel") or \
            old.get("partitions") != spec.get("partitions")
        fields: dict[str, Any] = {"checksum": job.checksum, "spec": spec}
        if replan and state["status"] not in TERMINAL and state.get("plan"):
            fields["phase"] = "replan"
        from migronaut.background.store import history_entry, literal

        stage: dict[str, Any] = {k: literal(v) for k, v in fields.items()}
        stage["history"] = history_entry("repin", None, requested_by, reason)
        stage["updatedAt"] = "$$NOW"
        self.store.states.update_one({"_id": name}, [{"$set": stage}])
        if changelog is not None:
            changelog.set_checksum(name, job.checksum)
        self.emit("background:control", {"migration": name, "action": "repin",
                                         "replan": replan})
        return ControlResult("changed", state["status"],
                             extra={"replan": replan, "checksum": job.checksum})

    def unlock(
        self, name: str, *, requested_by: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Force-release the coordinator lock and every lease (holders are fenced); the state's
        history records who did it and why."""
        from migronaut.background.store import history_entry

        self.store.require(name)
        removed = self.lock_collection.delete_one({"_id": f"background:{name}"})
        leases = self.store.release_all_leases(name)
        self.store.states.update_one({"_id": name}, [{"$set": {
            "history": history_entry("unlock", None, requested_by, reason),
            "updatedAt": "$$NOW",
        }}])
        self.logger.warning("⚠ %s: released the coordinator lock (%s) and %d lease(s)", name,
                            "held" if removed.deleted_count else "none held", leases)
        self.emit("background:control", {"migration": name, "action": "unlock",
                                         "lock": bool(removed.deleted_count), "leases": leases})
        return {"lock": bool(removed.deleted_count), "leases": leases}

    # -- views ----------------------------------------------------------------------------
    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        states = [self.store.require(name)] if name else self.store.all()
        return [self.view(state) for state in states]

    def view(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The ``BackgroundStatus`` view (reference background §6.2)."""
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
            "totals": self._live_totals(state),
            "failedDocuments": len(state.get("badIds") or []),
            "requires": list(state.get("requires") or []),
            "waitsFor": list(state.get("waitsFor") or []),
            "liveLeases": self.store.live_leases(name),
            "registeredAt": state.get("registeredAt"),
            "startedAt": state.get("startedAt"), "completedAt": state.get("completedAt"),
            "lastProgressAt": state.get("lastProgressAt"), "lastError": state.get("lastError"),
            "description": state.get("description"),
        }
        if plan:
            view["partitions"] = self.store.count_by_status(name, int(plan["generation"]),
                                                            plan["token"])
            counts = view["partitions"]
            counts["total"] = sum(v for k, v in counts.items() if k != "leased")
            view["plan"] = {k: plan[k] for k in ("method", "estimate", "atLeast", "partitions",
                                                  "degraded") if k in plan}
            if plan.get("sharding"):
                view["sharding"] = {k: plan["sharding"][k] for k in (
                    "mode", "shardKey", "hashed", "groups") if k in plan["sharding"]}
        if state.get("coordinator"):
            view["coordinator"] = state["coordinator"]
        if state.get("previous"):
            view["previous"] = state["previous"]
        return {k: v for k, v in view.items() if v is not None}

    def _live_totals(self, state: Mapping[str, Any]) -> dict[str, int]:
        """Rolled-up totals plus the counters of the generation not rolled up yet."""
        totals = {k: int(v) for k, v in (state.get("totals") or {}).items()}
        generation = int(state.get("generation", 0))
        if generation and int(state.get("rolledGeneration", 0)) < generation:
            group: dict[str, Any] = {"_id": None}
            for key in COUNTERS:
                group[key] = {"$sum": {"$ifNull": [f"$counters.{key}", 0]}}
            rows = list(self.store.partitions.aggregate([
                {"$match": {"background": state["_id"], "generation": generation}},
                {"$group": group},
            ]))
            for key in COUNTERS:
                if rows and rows[0].get(key):
                    totals[key] = totals.get(key, 0) + int(rows[0][key])
        return totals

    def partitions_view(self, name: str) -> list[dict[str, Any]]:
        self.store.require(name)
        out = []
        for partition in self.store.list_partitions(name):
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
            out.append(row)
        return out

    def runnable(self) -> list[dict[str, Any]]:
        """Blocked/pending/running migrations a worker should serve, oldest first."""
        out = []
        for state in self.store.all(["blocked", "pending", "running"]):
            if state["status"] == "blocked":
                state = self.try_unblock(state)
                if state["status"] == "blocked":
                    continue
            out.append({
                "migration": state["_id"], "status": state["status"],
                "maxParallel": (state.get("spec") or {}).get("maxParallel", 1),
                "liveLeases": self.store.live_leases(state["_id"]),
                "registeredAt": state.get("registeredAt"),
            })
        return out

    # -- dry runs -------------------------------------------------------------------------
    def dry_run(
        self,
        name: str,
        *,
        sample: int | None = None,
        first: int | None = None,
        validate: bool = False,
        direction: str = "forward",
        steps: int | None = None,
        max_documents: int = 20,
        from_start: bool = False,
        deadline_ms: int = 50_000,
    ) -> dict[str, Any]:
        """Preview ``name`` (registered or not) without writing anything (reference §6.7).

        See :func:`migronaut.background.dryrun.dry_run` for the report and the errors, and
        :func:`migronaut.background.dryrun.exit_code` for the CLI exit code of a report.
        """
        from migronaut.background.dryrun import dry_run

        return dry_run(self, name, sample=sample, first=first, validate=validate,
                       direction=direction, steps=steps, max_documents=max_documents,
                       from_start=from_start, deadline_ms=deadline_ms)

    # -- driving --------------------------------------------------------------------------
    def drive(
        self,
        name: str,
        *,
        concurrency: int = 1,
        until_done: bool = True,
        cancellation: Cancellation | None = None,
        driver: str = "local",
        slice_ms: int | None = None,
        inline: bool = False,
        raise_if_busy: bool = False,
    ) -> dict[str, Any]:
        """Coordinate and run lanes until the migration settles (reference §6.1 runBackground).

        ``raise_if_busy`` (``run --once``): another process holding the coordinator lock is
        ``LOCK_ALREADY_HELD`` instead of a wait.
        """
        from migronaut.background.lanes import run_slice

        cancel = cancellation or Cancellation()
        outage = DriverOutage(self.logger, name)
        while True:
            if cancel.cancelled:
                raise RunAbortedError(
                    f"Stopped driving background migration {name} — it goes on from here",
                    {"migration": name},
                )
            try:
                answer = self.coordinate(name, driver=driver, cancellation=cancel)
            except Exception as error:
                if cancel.cancelled or not outage.ride_out(error, cancel):
                    raise
                continue
            outage.clear()
            if answer.next in ("done", "superseded"):
                break
            if answer.next == "process":
                state = self.store.require(name)
                job = self.job(state)
                lanes = max(1, min(concurrency, int(job.spec.get("maxParallel", 1))))
                self._run_lanes(name, job, lanes, cancel, slice_ms, run_slice,
                                once=not until_done)
                if not until_done:
                    break
                continue
            if raise_if_busy and answer.next == "busy":
                raise LockAlreadyHeldError(
                    f"Another process is coordinating background migration {name} — try again "
                    "later",
                    {"migration": name, "retryAfterMs": answer.retry_after_ms},
                )
            if inline and answer.reason == "checksum":
                raise ChecksumMismatchError(answer.error or f"{name} changed on disk",
                                            {"name": name})
            if not until_done:
                break
            cancel.wait((answer.retry_after_ms or 1000) / 1000)
        state = self.store.require(name)
        if state["status"] == "failed":
            raise BackgroundFailedError(
                f"Background migration {name} failed: {state.get('lastError')}",
                {"migration": name, "lastError": state.get("lastError")},
            )
        return self.view(state)

    def _run_lanes(
        self, name: str, job: BackgroundJob, lanes: int, cancel: Cancellation,
        slice_ms: int | None, run_slice: Callable[..., Any], *, once: bool,
    ) -> None:
        """Run ``lanes`` lane loops in threads until the current plan has nothing claimable."""
        fatal: list[MigronautError] = []
        lane_cancel = _Linked(cancel)
        budget_ms = int(job.spec.get("maxOutageMs", DEFAULT_OUTAGE_MS))

        def lane() -> None:
            failures = 0
            outage = DriverOutage(self.logger, name, budget_ms)
            while not lane_cancel.cancelled:
                try:
                    result = run_slice(
                        store=self.store, job=job, db=self.db, owner=uuid.uuid4().hex,
                        ttl_ms=self.ttl_ms, cancellation=lane_cancel, slice_ms=slice_ms,
                        emit=self.emit, logger=self.logger, telemetry=self.telemetry,
                    )
                except MigronautError as error:
                    if not lane_cancel.cancelled and outage.ride_out(error, lane_cancel):
                        continue  # an outage: not a failure until it outlasts maxOutageMs
                    failures += 1
                    if error.code in _FATAL or failures >= 10:
                        fatal.append(error)
                        lane_cancel.cancel(error)
                        return
                    self.logger.warning("⚠ %s: a slice failed (%s) — retrying", name,
                                        error.message)
                    lane_cancel.wait(min(30.0, 0.25 * 2 ** failures))
                    continue
                failures = 0
                outage.clear()
                if once or result.outcome not in ("yielded", "busy"):
                    return
                if result.outcome == "busy":
                    lane_cancel.wait((result.retry_after_ms or 1000) / 1000)

        # each lane runs in a copy of this context: its slice spans nest under the caller's span
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(lane,),
                                    name=f"migronaut-lane-{name}-{i}", daemon=True)
                   for i in range(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if fatal:
            raise fatal[0]

    # -- drift ----------------------------------------------------------------------------
    def verify(
        self,
        *,
        on_drift: str | None = None,
        collections: Sequence[str] | None = None,
        drift_mode: str | None = None,
    ) -> dict[str, Any]:
        """Poll for old-shape documents after completion (reference §3.7): ``{checked, skipped,
        drift: [{migration, collection, action}]}``. ``on_drift`` defaults to ``'reopen'`` and
        ``drift_mode`` (the config's ``background_drift``) to ``'poll'`` — pass the config's.
        See :func:`migronaut.background.drift.verify`."""
        from migronaut.background.drift import verify

        return verify(self, on_drift=on_drift, collections=collections, drift_mode=drift_mode)

    def watch(self, **options: Any) -> Watcher:
        """Start the live drift watcher (reference §6.8) and return its handle; a standalone
        server is refused with ``CONFIG_INVALID`` first. See
        :class:`migronaut.background.watch.Watcher` for the options."""
        from migronaut.background.watch import Watcher

        return Watcher(self, **options).start()

    def watch_status(self, collection: str | None = None) -> list[dict[str, Any]]:
        """The stored watch rows (never the resume token)."""
        from migronaut.background.watch import watch_status

        return watch_status(self, collection)


#: ``maxOutageMs`` of a spec stored before the setting existed.
DEFAULT_OUTAGE_MS = 300_000


class DriverOutage:
    """A driver's view of an outage (a lost connection, an election): how long it has lasted.

    While it lasts less than the budget, :meth:`ride_out` waits (jittered, doubling up to 2 s)
    and says to try again — the error is not a failure; past the budget it says ``False`` and
    the error counts. Any success :meth:`clear` s it. Used by the ``run`` driver and the runner.
    """

    def __init__(self, logger: logging.Logger, name: str,
                 budget_ms: int = DEFAULT_OUTAGE_MS) -> None:
        self.logger = logger
        self.name = name
        self.budget_s = max(0, budget_ms) / 1000.0
        self.since: float | None = None
        self.tries = 0

    def clear(self) -> None:
        self.since, self.tries = None, 0

    def pause_s(self, error: BaseException) -> float | None:
        """The pause before trying again, or ``None`` when ``error`` counts as a failure."""
        from migronaut.core.retry import is_outage

        if not is_outage(error):
            return None
        now = time.monotonic()
        if self.since is None:
            self.since = now
            message = error.message if isinstance(error, MigronautError) else (
                type(error).__name__)
            self.logger.info("%s: %s — retrying for up to %gs", self.name, message,
                             self.budget_s)
        if now - self.since >= self.budget_s:
            return None
        pause: float = min(2.0, 0.1 * 2 ** min(self.tries, 10)) * random.uniform(0.5, 1.0)
        self.tries += 1
        return pause

    def ride_out(self, error: BaseException, cancellation: Cancellation) -> bool:
        pause = self.pause_s(error)
        if pause is None:
            return False
        cancellation.wait(pause)
        return True


_FATAL = frozenset({
    "CHECKSUM_MISMATCH", "MIGRATION_FILE_NOT_FOUND", "MIGRATION_INVALID_EXPORT",
    "MIGRATION_INVALID_NAME", "CONFIG_INVALID", "TRANSACTIONS_UNSUPPORTED",
})


class _Linked(Cancellation):
    """A cancellation that is also set when its parent is (lanes stop with their driver)."""

    def __init__(self, parent: Cancellation) -> None:
        super().__init__()
        self._parent = parent

    @property
    def cancelled(self) -> bool:
        return super().cancelled or self._parent.cancelled

    @property
    def reason(self) -> MigronautError | None:
        return super().reason or self._parent.reason

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.cancelled:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            super().wait(0.1 if remaining is None else min(0.1, remaining))
        return True

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise self.reason or RunAbortedError("Run stopped by request")

