"""A fleet run: the ordinary command in every tenant, in a bounded thread pool, under the rules of
:mod:`migronaut.fleet.schedule`.

Each tenant runs exactly what ``migronaut --db TENANT <command>`` runs — its own lock, changelog
and background state — through its ordinary migrator on its cluster's shared client; nothing here
decides what a migration is or whether it ran. ``up`` reads the tenant's status first, so an
up-to-date tenant costs one read and no lock. A tenant whose lock is held is ``skipped-locked``
(``on_lock="skip"``) or waited for up to ``lock_wait_ms``; a tenant that fails counts against the
failure budget; a failed canary stage leaves the rest untouched (``skipped-canary``). The run
record (:mod:`migronaut.fleet.runs`) is written at most four times a second while tenants run,
and at the end.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut._json import iso
from migronaut.errors import (
    AuditFailedError,
    FleetPartialError,
    LockAlreadyHeldError,
    MigronautError,
    describe_exception,
)
from migronaut.fleet.runs import FleetRunStore, TenantEntry
from migronaut.fleet.schedule import ClusterSlots, FailureBudget, FleetPolicy, order_tenants, stages
from migronaut.fleet.status import UP_TO_DATE, state_of

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.fleet.tenants import Tenant
    from migronaut.observability.events import EventBus
    from migronaut.observability.telemetry import Telemetry

__all__ = [
    "FAILED",
    "FINAL_STATES",
    "SKIPPED_BUDGET",
    "SKIPPED_CANARY",
    "SKIPPED_LOCKED",
    "SKIPPED_STOPPED",
    "STARTED",
    "SUCCEEDED",
    "UP_TO_DATE",
    "FleetResult",
    "FleetRun",
    "TenantOutcome",
]

STARTED = "started"
SUCCEEDED = "succeeded"
FAILED = "failed"
SKIPPED_LOCKED = "skipped-locked"
SKIPPED_BUDGET = "skipped-budget"
SKIPPED_CANARY = "skipped-canary"
SKIPPED_STOPPED = "skipped-stopped"
#: A tenant's final state in a fleet run, in the order summaries show them.
FINAL_STATES = (SUCCEEDED, UP_TO_DATE, FAILED, SKIPPED_LOCKED, SKIPPED_BUDGET, SKIPPED_CANARY,
                SKIPPED_STOPPED)
_OK = (SUCCEEDED, UP_TO_DATE)
#: How often a tenant waiting for its lock (``on_lock="wait"``) tries again.
LOCK_POLL_S = 0.5


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class TenantOutcome:
    """What a fleet run did in one tenant: its final state, the ordinary command's result as
    JSON (the ``RunResult`` rows, the converge or audit report), the typed error, timings."""

    tenant: Tenant
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    duration_ms: int | None = None
    #: migrations applied (``up``) or reverted (``down``) in this tenant
    changed: int = 0

    @property
    def ok(self) -> bool:
        return self.state in _OK

    def entry(self) -> TenantEntry:
        return TenantEntry(self.tenant.name, self.tenant.cluster, self.state, self.started_at,
                           self.ended_at, self.error, self.changed)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tenant": self.tenant.name, "cluster": self.tenant.cluster,
                               "state": self.state, "changed": self.changed,
                               "durationMs": self.duration_ms}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class FleetResult:
    """A fleet run's outcome: one :class:`TenantOutcome` per tenant (in start order) and a
    summary. ``ok`` when every tenant succeeded or was already up to date."""

    run_id: str
    command: str
    policy: FleetPolicy
    outcomes: list[TenantOutcome]
    started_at: dt.datetime
    ended_at: dt.datetime
    unreachable_clusters: dict[str, dict[str, Any]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(FINAL_STATES, 0)
        for outcome in self.outcomes:
            out[outcome.state] = out.get(outcome.state, 0) + 1
        return out

    @property
    def ok(self) -> bool:
        return not self.unreachable_clusters and all(o.ok for o in self.outcomes)

    @property
    def failed(self) -> list[TenantOutcome]:
        """Every tenant that did not succeed (failed or skipped)."""
        return [o for o in self.outcomes if not o.ok]

    @property
    def outcome(self) -> str:
        """The run record's outcome: ``succeeded``, ``stopped`` or ``partial``."""
        if self.ok:
            return "succeeded"
        if any(o.state == SKIPPED_STOPPED for o in self.outcomes):
            return "stopped"
        return "partial"

    def error(self) -> FleetPartialError | None:
        """``FLEET_PARTIAL`` naming every tenant that did not succeed, or ``None``."""
        if self.ok:
            return None
        bad = self.failed
        counts = {k: v for k, v in self.counts().items() if v and k not in _OK}
        names = ", ".join(o.tenant.name for o in bad[:5]) + (" …" if len(bad) > 5 else "")
        where = f"; clusters not answering: {', '.join(self.unreachable_clusters)}" \
            if self.unreachable_clusters else ""
        return FleetPartialError(
            f"Fleet {self.command}: {len(bad)} of {len(self.outcomes)} tenants did not succeed "
            f"({', '.join(f'{v} {k}' for k, v in counts.items())}): {names}{where}",
            {"runId": self.run_id, "tenants": [
                {"tenant": o.tenant.name, "cluster": o.tenant.cluster, "state": o.state,
                 **({"error": o.error} if o.error else {})} for o in bad],
             **({"unreachableClusters": self.unreachable_clusters}
                if self.unreachable_clusters else {})})

    def to_json(self) -> dict[str, Any]:
        duration = int((self.ended_at - self.started_at).total_seconds() * 1000)
        out: dict[str, Any] = {
            "runId": self.run_id, "command": self.command, "ok": self.ok,
            "outcome": self.outcome, "total": len(self.outcomes), "counts": self.counts(),
            "startedAt": iso(self.started_at), "endedAt": iso(self.ended_at),
            "durationMs": duration, "policy": self.policy.to_json(),
            "failed": [o.tenant.name for o in self.failed],
            "tenants": [o.to_json() for o in self.outcomes]}
        if self.unreachable_clusters:
            out["unreachableClusters"] = self.unreachable_clusters
        return out


#: The ordinary command in one tenant: returns (state, result JSON, changed).
Operation = Callable[["Migrator"], tuple[str, Any, int]]


def operation(command: str, *, steps: int | None = None) -> Operation:
    """The per-tenant work of ``command`` — the same API call ``migronaut --db TENANT`` makes."""
    if command == "up":
        return _up
    if command == "down":
        return lambda migrator: _down(migrator, steps)
    if command == "converge":
        return _converge
    if command == "audit":
        return _audit
    raise ValueError(f"unknown fleet command {command!r}")


def _up(migrator: Migrator) -> tuple[str, Any, int]:
    state, _, _ = state_of(migrator.status("all", checksums=False))
    if state == UP_TO_DATE:  # one read, no lock
        return UP_TO_DATE, [], 0
    rows = migrator.up()
    applied = sum(1 for row in rows if row.status == "applied")
    return (SUCCEEDED if applied else UP_TO_DATE), [row.to_dict() for row in rows], applied


def _down(migrator: Migrator, steps: int | None) -> tuple[str, Any, int]:
    rows = migrator.down(steps=steps)
    reverted = sum(1 for row in rows if row.status == "reverted")
    return (SUCCEEDED if reverted else UP_TO_DATE), [row.to_dict() for row in rows], reverted


def _converge(migrator: Migrator) -> tuple[str, Any, int]:
    result = migrator.converge()
    return SUCCEEDED, result.to_dict(), 0


def _audit(migrator: Migrator) -> tuple[str, Any, int]:
    report = migrator.audit()
    if not report.ok:
        raise AuditFailedError(
            f"Audit failed in {migrator.config.db_name}: {report.failed} check(s) failed",
            {"report": report.to_dict()})
    return SUCCEEDED, report.to_dict(), 0


class FleetRun:
    """One fleet run over ``tenants``: schedules them, runs ``work`` in each, records it all."""

    def __init__(
        self,
        *,
        command: str,
        tenants: list[Tenant],
        policy: FleetPolicy,
        work: Operation,
        migrator: Callable[[Tenant], Migrator],
        store: FleetRunStore,
        events: EventBus,
        telemetry: Telemetry,
        options: Mapping[str, Any],
        sizes: Callable[[list[Tenant]], Mapping[Tenant, int]] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.command = command
        self.tenants = tenants
        self.policy = policy
        self.work = work
        self._migrator = migrator
        self.store = store
        self.events = events
        self.telemetry = telemetry
        self.options = dict(options)
        self._sizes = sizes
        self.stop_event = stop or threading.Event()
        self.run_id = uuid.uuid4().hex
        self._active: dict[str, Migrator] = {}
        self._active_lock = threading.Lock()

    def stop(self, reason: str = "Fleet run stopped by request") -> None:
        """Start no more tenants; the ones running finish their migration in flight and stop."""
        self.stop_event.set()
        with self._active_lock:
            active = list(self._active.values())
        for migrator in active:
            migrator.stop(reason)

    # -- the schedule -----------------------------------------------------------------------
    def run(self) -> tuple[list[TenantOutcome], dt.datetime, dt.datetime]:
        policy = self.policy
        sizes = self._sizes(self.tenants) if policy.order == "size" and self._sizes else None
        ordered = order_tenants(self.tenants, policy.order, sizes=sizes, seed=policy.seed)
        canary, rest = stages(ordered, policy.canary)
        started = _now()
        self.store.start(self.run_id, self.command, self.options, len(ordered))
        self.events.emit("fleet:start", {
            "runId": self.run_id, "command": self.command, "tenants": len(ordered),
            "canary": [t.name for t in canary], "policy": policy.to_json()})
        outcomes: dict[Tenant, TenantOutcome] = {}
        budget = FailureBudget(policy.max_failures)
        slots = ClusterSlots(policy.per_cluster_concurrency)
        pool = ThreadPoolExecutor(max_workers=max(1, min(policy.concurrency, len(ordered) or 1)),
                                  thread_name_prefix="migronaut-fleet")
        try:
            for stage, queue in (("canary", canary), ("rest", rest)):
                if stage == "rest" and canary and not all(outcomes[t].ok for t in canary):
                    break
                self._stage(queue, pool, budget, slots, outcomes)
                if budget.exhausted or self.stop_event.is_set():
                    break
        finally:
            pool.shutdown(wait=True)
            self._skip_the_rest(ordered, outcomes, budget, canary)
            self.store.flush()
        return [outcomes[t] for t in ordered], started, _now()

    def _stage(self, queue: list[Tenant], pool: ThreadPoolExecutor, budget: FailureBudget,
               slots: ClusterSlots, outcomes: dict[Tenant, TenantOutcome]) -> None:
        queue = list(queue)
        running: dict[Future[TenantOutcome], Tenant] = {}
        while True:
            while (queue and len(running) < self.policy.concurrency and not budget.exhausted
                   and not self.stop_event.is_set()):
                index = slots.next_startable(queue)
                if index is None:
                    break
                tenant = queue.pop(index)
                slots.take(tenant.cluster)
                self.store.note(TenantEntry(tenant.name, tenant.cluster, STARTED, _now()))
                self.events.emit("fleet:tenant:start", {
                    "runId": self.run_id, "tenant": tenant.name, "cluster": tenant.cluster})
                running[pool.submit(self._tenant, tenant)] = tenant
            self.store.flush(throttled=True)
            if not running:
                return
            done, _ = wait(running, timeout=self.store.due_in(), return_when=FIRST_COMPLETED)
            for future in done:
                tenant = running.pop(future)
                slots.give_back(tenant.cluster)
                outcome = future.result()
                outcomes[tenant] = outcome
                if outcome.state == FAILED:
                    budget.failed()
                self.store.note(outcome.entry())
                self.events.emit("fleet:tenant:end", {
                    "runId": self.run_id, "command": self.command, **outcome.to_json()})

    def _skip_the_rest(self, ordered: list[Tenant], outcomes: dict[Tenant, TenantOutcome],
                       budget: FailureBudget, canary: list[Tenant]) -> None:
        canary_failed = bool(canary) and not all(
            outcomes[t].ok for t in canary if t in outcomes)
        for tenant in ordered:
            if tenant in outcomes:
                continue
            state = SKIPPED_STOPPED if self.stop_event.is_set() else SKIPPED_BUDGET \
                if budget.exhausted else SKIPPED_CANARY if canary_failed else SKIPPED_STOPPED
            outcomes[tenant] = TenantOutcome(tenant, state)
            self.store.note(outcomes[tenant].entry())

    # -- one tenant ---------------------------------------------------------------------------
    def _tenant(self, tenant: Tenant) -> TenantOutcome:
        started = _now()
        clock = time.monotonic()
        scope = self.telemetry.fleet_tenant(tenant.name, tenant.cluster, self.command,
                                            self.run_id)
        with scope:
            state, result, error, changed = self._attempt(tenant)
            scope.set({"migronaut.fleet.tenant.state": state}, metric=True)
            if error is not None and state == FAILED:
                scope.fail(error)
        return TenantOutcome(tenant, state, result, error.to_dict() if error else None, started,
                             _now(), int((time.monotonic() - clock) * 1000), changed)

    def _attempt(self, tenant: Tenant) -> tuple[str, Any, MigronautError | None, int]:
        deadline = time.monotonic() + self.policy.lock_wait_ms / 1000
        while True:
            try:
                migrator = self._migrator(tenant)
            except MigronautError as error:  # its cluster did not answer
                return FAILED, None, error, 0
            with self._active_lock:
                self._active[tenant.name] = migrator
            try:
                state, result, changed = self.work(migrator)
                return state, result, None, changed
            except LockAlreadyHeldError as error:
                if self.policy.on_lock != "wait" or time.monotonic() >= deadline \
                        or self.stop_event.wait(min(LOCK_POLL_S, deadline - time.monotonic())):
                    return SKIPPED_LOCKED, None, error, 0
            except MigronautError as error:
                return FAILED, _partial(error), error, _changed(error)
            except Exception as error:  # a defect must not sink the other tenants
                return FAILED, None, MigronautError(
                    f"Unexpected error in tenant {tenant.name}: {describe_exception(error)}",
                    cause=error), 0
            finally:
                with self._active_lock:
                    self._active.pop(tenant.name, None)
                migrator.close()


def _partial(error: MigronautError) -> Any:
    results = error.context.get("results")
    return results if isinstance(results, list) else None


def _changed(error: MigronautError) -> int:
    results = _partial(error) or []
    return sum(1 for row in results
               if isinstance(row, Mapping) and row.get("status") in ("applied", "reverted"))
