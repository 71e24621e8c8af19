"""The coordinator: one idempotent step at a time, serialised per migration by a lock.

A step (reference background §3) reads the stored state and decides what happens next: plan a
pass (or a replan) and commit it, reclaim expired leases, ask for lanes, or close the pass —
roll it up, then fail, complete or plan another pass. It never takes the migration lock and has
no run id: steps are serialised by the ``background:<name>`` lock and everything else is a
compare-and-set on the stored state, so any number of engines in any number of processes can
coordinate the same migration.

Invariants: only one plan per generation commits (CAS on generation + previous plan token +
status + checksum); a superseded plan's counters are rolled up before a new plan's commit drops
its partitions; completion is decided only by counting what is left, never by summing
partitions.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from migronaut.background.planning.passes import Answer, PassPlanning, Stamp, merged
from migronaut.background.planning.sharding import epoch_is_stale
from migronaut.background.state.fields import (
    TERMINAL,
    is_count,
    stored_round,
    understood,
)
from migronaut.background.state.rollup import roll_up
from migronaut.core.context import Cancellation
from migronaut.core.lock import MigrationLock
from migronaut.errors import (
    ChecksumMismatchError,
    LockAlreadyHeldError,
    MigrationFileNotFoundError,
)

if TYPE_CHECKING:
    from migronaut.background.coordination.handles import EngineHandles
    from migronaut.background.planning.job import BackgroundJob
    from migronaut.background.state.requirements import Requirements

__all__ = ["ROUND_DRIVERS", "Answer", "Coordinator", "Step"]

#: Drivers whose coordinators run as chains of queue tasks (reference background §3.1 step 5):
#: a chain without a round is handed ``round + 1``; a chain whose round is not the stored one
#: was superseded (a heal or a takeover started a newer chain) and stops.
ROUND_DRIVERS = frozenset({"celery"})

#: Up to this many partitions in a plan, a step counts them from the partitions themselves
#: (one ``find``) and a closing pass rolls up those same documents instead of reading them again.
_READ_PARTITIONS_UP_TO = 16
#: The statuses :meth:`PartitionStore.count_by_status` reports, all zero.
_NO_PARTITIONS = ("pending", "running", "done", "failed", "cancelled", "superseded", "leased")


class Step(NamedTuple):
    """A coordinator step's answer, with the state it decided on and the job it loaded (when
    it got that far): a driver that goes on to run lanes starts from them instead of reading
    the state and loading the file again."""

    answer: Answer
    state: dict[str, Any] | None = None
    job: BackgroundJob | None = None


class Coordinator(PassPlanning):
    """Coordinator steps, plan commits and pass closing for one database's migrations (the
    planning half is :class:`~migronaut.background.planning.passes.PassPlanning`'s)."""

    def __init__(self, engine: EngineHandles, requirements: Requirements) -> None:
        self.engine = engine
        self.requirements = requirements
        self._transactions = None

    def coordinate(
        self, name: str, *, driver: str = "local", cancellation: Cancellation | None = None,
        ref: str | None = None, round: int | None = None,
    ) -> Answer:
        """One idempotent coordinator step under the ``background:<name>`` lock.

        ``ref`` names the driver's job (a task id), recorded in ``coordinator.ref``. ``round``
        is the chain's round for :data:`ROUND_DRIVERS` (``None``: a new chain, handed the next
        round); other drivers ignore it.
        """
        return self.step(name, driver=driver, cancellation=cancellation, ref=ref,
                         round=round).answer

    def step(
        self, name: str, *, driver: str = "local", cancellation: Cancellation | None = None,
        ref: str | None = None, round: int | None = None,
    ) -> Step:
        """:meth:`coordinate`, with the state and job the answer was decided on."""
        lock = MigrationLock(
            self.engine.lock_collection,
            owner=uuid.uuid4().hex,
            ttl_ms=self.engine.ttl_ms,
            executed_by=self.engine.executed_by,
            lock_id=f"background:{name}",
        )
        try:
            lock.acquire()
        except LockAlreadyHeldError:
            return Step(Answer("busy", retry_after_ms=max(1, self.engine.ttl_ms // 2)))
        try:
            with self.engine.telemetry.background_coordinate(name, driver=driver) as traced:
                step = self._coordinate(name, driver, cancellation or Cancellation(), ref,
                                        round)
                answer = step.answer
                traced.set({"migronaut.background.next": answer.next,
                            "migronaut.background.reason": answer.reason,
                            "migronaut.background.status": answer.status,
                            "migronaut.background.lanes": answer.lanes})
                return step
        finally:
            lock.release(run_failed=True)

    def glance(self, name: str, *, round: int | None = None) -> Answer | None:
        """What a step would answer, when two reads without the lock can tell; else ``None``.

        ``done`` for a migration that is finished, paused or not registered (a step says so
        without writing anything); ``process`` with no lane to add while it runs the plan of its
        current generation (in the chain's ``round``, for a round driver) and live leases cover
        every open partition a lane could take (``maxParallel`` of them at most) — a step would
        only stamp the state. ``None`` whenever a step could do more: plan, close a pass, reap,
        fan out lanes, supersede a chain, unblock, replan.

        A queue's re-check and a lane that found nothing left to claim glance first, so while
        lanes work the coordinator lock is taken only when a step has something to decide.
        """
        state = self.engine.store.get(name)
        if state is None:
            return Answer("done", status="unregistered")
        if not understood(state):
            return None
        status = state["status"]
        if status in TERMINAL or status == "paused":
            return Answer("done", status=status)
        if status != "running" or state.get("phase") != "process":
            return None
        if round is not None and stored_round(state) != round:
            return None
        plan, generation = state.get("plan"), state.get("generation")
        spec = state.get("spec")
        max_parallel = spec.get("maxParallel", 1) if isinstance(spec, Mapping) else None
        if plan is None or generation is None or not is_count(max_parallel):
            return None  # a step reads the job's own spec, and says what is wrong with it
        token = str(plan["token"])
        counts, live = self.engine.store.open_counts(name, generation, token)
        open_count = counts["pending"] + counts["running"]
        if not open_count or live < min(open_count, max_parallel):
            return None
        return Answer("process", lanes=0, generation=generation,
                      registration=state.get("registration"), counts=counts,
                      retry_after_ms=5000, round=round)

    def _coordinate(self, name: str, driver: str, cancellation: Cancellation, ref: str | None,
                    round: int | None) -> Step:
        state = self.engine.store.get(name)
        if state is None:
            return Step(Answer("done", status="unregistered"))
        if not understood(state):
            self.engine.warn_once(f"schema:{name}",
                                  "⚠ %s was written by a newer migronaut — waiting", name)
            return Step(Answer("wait", reason="newer-schema",
                               retry_after_ms=self.engine.ttl_ms // 2))
        status = state["status"]
        if status in TERMINAL or status == "paused":
            return Step(Answer("done", status=status), state)
        if status == "blocked":
            state = self.requirements.try_unblock(state)
            if state["status"] == "blocked":
                return Step(Answer("done", status="blocked",
                                   waits_for=list(state.get("waitsFor", []))))
        written_round: int | None = None
        if driver in ROUND_DRIVERS:
            stored = stored_round(state)
            if round is not None and round != stored:
                return Step(Answer("superseded", round=round), state)
            if round is None:
                round = written_round = stored + 1
        else:
            round = None
        stamp = Stamp(driver, ref=ref, round=written_round)
        try:
            step = self._run(name, state, cancellation, stamp)
        except BaseException:
            with contextlib.suppress(Exception):
                self._write_stamp(name, stamp)
            raise
        self._write_stamp(name, stamp)
        step.answer.round = round
        return step

    def _write_stamp(self, name: str, stamp: Stamp) -> None:
        """The step's driver record, when no write of the step carried it."""
        if stamp.pending:
            set_fields, server_times = stamp.merge()
            self.engine.store.update_state(name, {}, set_fields, server_times=server_times)
            stamp.landed(True)

    def _run(self, name: str, state: dict[str, Any], cancellation: Cancellation,
             stamp: Stamp) -> Step:
        """The step from loading the job on (reference §3.1, 6–9)."""
        try:
            job = self.engine.job(state)
        except (ChecksumMismatchError, MigrationFileNotFoundError) as error:
            self.engine.warn_once(f"checksum:{name}:{state.get('checksum')}",
                                  "⚠ %s: %s — waiting", name, error.message)
            return Step(Answer("wait", reason="checksum", error=error.message,
                               retry_after_ms=self.engine.ttl_ms // 2), state)
        if job.spec.get("transaction") and not self.supports_transactions():
            self.fail_state(name, "the server is a standalone: run it with transaction: False "
                            "or on a replica set")
            return Step(Answer("done", status="failed"), None, job)
        # The state just read (or just written by this step) stands for the next read: the
        # lock serialises coordinator steps, and every write below is a compare-and-set anyway.
        fresh: dict[str, Any] | None = state
        #: partitions of the plan this step committed (none can be leased or closed yet)
        planned: int | None = None
        for _ in range(int(job.spec.get("maxPasses", 10)) + 2):
            if cancellation.cancelled:
                return Step(Answer("wait", reason="stopping"), fresh, job)
            state = fresh if fresh is not None else self.engine.store.require(name)
            fresh = None
            if state["status"] not in ("pending", "running"):
                return Step(Answer("done", status=state["status"]), state, job)
            plan = state.get("plan")
            if state.get("phase") == "replan" and plan:
                self.engine.store.set_open_partitions(name, state["generation"], "superseded")
                if self.engine.store.live_leases(name):
                    return Step(Answer("wait", reason="replan-draining", retry_after_ms=1000),
                                state, job)
                if int(state.get("rolledGeneration", 0)) < int(state["generation"]):
                    # the superseded plan's work counts: roll it up before a new plan's commit
                    # drops its partitions (its failures do not fail the migration: the new
                    # plan takes their documents again)
                    roll_up(self.engine, state, closing=False)
                    state = self.engine.store.require(name)
                committed = self._plan_pass(state, job, stamp)  # 'replan': the same pass
                if isinstance(committed, Answer):
                    return Step(committed, None, job)
                fresh, planned = committed
                continue
            if state.get("phase") != "process" or not plan or plan.get("match") != \
                    self._match_hash(job):
                committed = self._plan_pass(state, job, stamp)
                if isinstance(committed, Answer):
                    return Step(committed, None, job)
                fresh, planned = committed
                continue
            if epoch_is_stale(self.engine.db, str(job.spec.get("collection")), plan.get("epoch")):
                self.engine.logger.info("%s: the collection was resharded — replanning the pass",
                                        name)
                self.engine.store.update_state(name, {"generation": state["generation"]},
                                               {"phase": "replan"})
                planned = None
                continue
            if state["status"] == "pending":
                state = self._move(name, "plan") or self.engine.store.require(name)
                if state["status"] not in ("pending", "running"):
                    return Step(Answer("done", status=state["status"]), state, job)
            counts, partitions = self._counts(state, planned)
            open_count = counts["pending"] + counts["running"]
            if open_count:
                leased = counts["leased"]
                max_parallel = int(job.spec.get("maxParallel", 1))
                lanes = max(0, min(open_count - leased, max_parallel - leased))
                return Step(Answer("process", lanes=lanes, generation=state["generation"],
                                   registration=state["registration"], counts=counts,
                                   retry_after_ms=5000), state, job)
            closed = self._finalize(state, job, stamp, partitions)
            if closed is not None:
                return closed
            planned = None
        return Step(Answer("wait", reason="passes", retry_after_ms=1000), None, job)

    def _counts(
        self, state: Mapping[str, Any], planned: int | None
    ) -> tuple[dict[str, int], list[dict[str, Any]] | None]:
        """The current plan's partitions by status, expired leases reclaimed first; with a
        small plan, also the generation's partitions as read (for the roll-up, when they are
        all closed: the same read, not a second one).

        A plan this step just committed has ``planned`` pending partitions and no lease: nothing
        to read. Otherwise expired leases are reaped only when some partition is leased (a lease
        on another plan's partition is reaped by the claim it would block).
        """
        if planned is not None:
            counts = dict.fromkeys(_NO_PARTITIONS, 0)
            counts["pending"] = planned
            return counts, None
        name, plan = state["_id"], state["plan"]
        small = int(plan.get("partitions") or 0) <= _READ_PARTITIONS_UP_TO
        counts, partitions = self._read_counts(name, state["generation"], plan["token"], small)
        if counts["leased"]:
            reaped = self.engine.store.reap_expired_leases(name)
            if reaped:
                self.engine.logger.debug("%s: reclaimed %d expired lease(s)", name, reaped)
                self.engine.telemetry.leases_reclaimed(reaped)
                counts, partitions = self._read_counts(name, state["generation"], plan["token"],
                                                       small)
        return counts, partitions

    def _read_counts(
        self, name: str, generation: int, token: str, small: bool
    ) -> tuple[dict[str, int], list[dict[str, Any]] | None]:
        """:meth:`PartitionStore.count_by_status`, or for a small plan the generation's
        partitions (one ``find``) counted here the same way."""
        store = self.engine.store
        if not small:
            return store.count_by_status(name, generation, token), None
        partitions = store.generation_partitions(name, generation)
        return store.counted(p for p in partitions if p.get("plan") == token), partitions

    def _finalize(self, state: Mapping[str, Any], job: BackgroundJob,
                  stamp: Stamp | None = None,
                  partitions: list[dict[str, Any]] | None = None) -> Step | None:
        """Close the current pass: roll up once, fail, complete or plan another pass (the
        roll-up or the completion carries the step's ``stamp`` when it is still to be written;
        ``partitions``: the generation's, just read under this step's lock)."""
        name = state["_id"]
        generation = int(state["generation"])
        if int(state.get("rolledGeneration", 0)) < generation:
            set_fields, server_times = merged(stamp, {}, [])
            rolled = roll_up(self.engine, state, set_fields=set_fields,
                             server_times=server_times, partitions=partitions)
            if stamp is not None:
                stamp.landed(rolled is not None)
            state = rolled or self.engine.store.require(name)
        if int(state.get("failedPartitions") or 0):
            error = (f"{state['failedPartitions']} partition(s) failed: "
                     f"{state.get('lastError') or 'unknown error'}")
            self.fail_state(name, error)
            return Step(Answer("done", status="failed", error=error), None, job)
        remaining = self._remaining(state, job) if job.mode != "step" else 0
        if remaining == 0:
            set_fields, server_times = merged(stamp, {"phase": "process"}, ["completedAt"])
            moved = self.engine.store.move(
                name, "complete", expect={"generation": generation},
                set_fields=set_fields, server_times=server_times)
            if moved is None and state["status"] == "pending":
                self._move(name, "plan")
                moved = self.engine.store.move(
                    name, "complete", expect={"generation": generation},
                    set_fields=set_fields, server_times=server_times)
            if stamp is not None:
                stamp.landed(moved is not None)
            if moved is None:
                return None
            self.engine.store.drop_generations_below(name, generation)
            totals = moved.get("totals", {})
            if moved.get("badIds"):
                self.engine.logger.warning("⚠ %s completed with %d document(s) that could not be "
                                           "migrated", name, len(moved["badIds"]))
            self.engine.emit("background:completed", {"migration": name, "totals": totals,
                                                      "passes": moved.get("pass")})
            self.engine.logger.info(
                "✔ Background migration %s completed (%d migrated, %d pass(es))",
                name, totals.get("migrated", 0), moved.get("pass", 0))
            if moved.get("direction") == "forward":
                self.requirements.on_completed(name)
            return Step(Answer("done", status="completed"), moved, job)
        if int(state.get("pass", 0)) >= int(job.spec.get("maxPasses", 10)):
            error = (f"old-shape documents keep appearing after {state.get('pass')} pass(es) — "
                     "is an old version of the application still writing them?")
            self.fail_state(name, error)
            return Step(Answer("done", status="failed", error=error), None, job)
        self.engine.emit("background:pass", {"migration": name, "pass": state.get("pass"),
                                             "generation": generation,
                                             "totals": state.get("totals")})
        self.engine.store.update_state(name, {"generation": generation, "phase": "process"},
                                       {"phase": "partition"})
        self.engine.store.drop_generations_below(name, generation)
        return None

    def fail_state(self, name: str, reason: str) -> None:
        from migronaut._redact import redact

        text = redact(reason)
        moved = self.engine.store.move(name, "fail", set_fields={"lastError": text},
                                       server_times=["failedAt"])
        if moved is not None:
            self.engine.emit("background:failed", {"migration": name, "error": text})
            self.engine.logger.error("✖ Background migration %s failed: %s", name, text)

    def _move(self, name: str, action: str, **kw: Any) -> dict[str, Any] | None:
        return self.engine.store.move(name, action, **kw)

