"""A fleet run fanned out over the migration queue: one ``fleet-tenant`` task per tenant, and the
``fleet-step`` task that coordinates them.

The fleet run record (:mod:`migronaut.fleet.runs`) is the coordinator's memory: the producer
writes the record with the run's plan (the tenants in start order and the policy), and every
step reads it, decides what to send under the rules of :mod:`migronaut.fleet.schedule` (the
canary stage first; the rest only once every canary succeeded; no new tenant once the failure
budget is spent; at most ``concurrency`` tenants in flight, ``per_cluster_concurrency`` per
cluster), marks the tenants it sends ``started`` in one conditional update (a step that raced
another reads again: a tenant is sent once), then sends them. A tenant task writes its outcome
into the record and sends the next step, so no task ever waits for another: a worker is never
blocked by a coordinator. The step that finds nothing running and nothing left to send marks the
rest skipped and ends the record.

Each tenant task drives the tenant's ordinary migrator on its cluster's shared client — its own
lock and changelog, exactly as ``migronaut --db TENANT up`` — so a redelivered task is harmless:
an outcome already recorded is returned as it is, and a tenant that died mid-way is serialised by
its lock and skips what it applied. Once a tenant's ``up`` has run (a run planned with
``background``), the task enqueues that tenant's pending background migrations as tenant jobs of
the background queue, which the workers run against the tenant's database.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from migronaut._values import is_int
from migronaut.errors import (
    ConnectionFailedError,
    QueueJobInvalidError,
    StateInvalidError,
)
from migronaut.executors.celery.failures import outbound_error, outbound_value
from migronaut.executors.celery.payloads import VERSION, fragment, validate
from migronaut.fleet.runner import (
    FAILED,
    SKIPPED_BUDGET,
    SKIPPED_CANARY,
    SKIPPED_STOPPED,
    STARTED,
    FleetResult,
    FleetRun,
    TenantOutcome,
    operation,
)
from migronaut.fleet.runs import FleetRunStore, TenantEntry, parse_record
from migronaut.fleet.schedule import ClusterSlots, FailureBudget, FleetPolicy, stages
from migronaut.fleet.tenants import Tenant

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Task
    from pymongo.collection import Collection

    from migronaut.executors.celery.context import FleetWorker
    from migronaut.executors.celery.installation import MigronautCelery
    from migronaut.fleet.api import Fleet

__all__ = ["COMMANDS", "FleetEnqueued", "decide", "enqueue_fleet", "register"]

_log = logging.getLogger("migronaut.celery")

TENANT_KIND = "fleet-tenant"
STEP_KIND = "fleet-step"
#: The fleet commands the queue runs.
COMMANDS = ("up", "down", "converge")
#: The record field holding the queued run's plan and its step counter.
PLAN_FIELD = "queue"
PLAN_VERSION = 1
#: How many times a step reads the record again after losing a race to another step.
STEP_ATTEMPTS = 50


# -- the worker side ----------------------------------------------------------------------------
def register(installed: MigronautCelery, options: dict[str, Any]) -> None:
    """Register ``fleet-tenant`` and ``fleet-step`` on the migration queue (only when the
    config has a ``[fleet]``: without one there is nothing to fan out). The tasks share the
    process's :class:`~migronaut.executors.celery.context.FleetWorker` with the tenants'
    background jobs; the worker context closes it at process shutdown."""
    from migronaut.executors.celery.migration_tasks import _route

    if installed.context.source.read().fleet is None:
        return
    app = installed.app
    for kind, body in ((TENANT_KIND, _tenant_task), (STEP_KIND, _step_task)):
        installed.tasks[kind] = app.task(
            name=installed.task_name(kind), bind=True, max_retries=None, shared=False,
            **options)(_entry(installed, kind, body))
    _route(app, [installed.task_name(k) for k in (TENANT_KIND, STEP_KIND)],
           installed.settings.queue)


Body = Callable[["MigronautCelery", "FleetWorker", "Task", dict[str, Any]], dict[str, Any]]


def _entry(installed: MigronautCelery, kind: str, body: Body) -> Callable[..., dict[str, Any]]:
    def task(self: Task, data: Any = None) -> dict[str, Any]:
        outcome: BaseException | None = None
        try:
            payload = _checked(kind, data)
            worker = installed.context.fleet()
            return outbound_value(body(installed, worker, self, payload))  # type: ignore[no-any-return]
        except Exception as error:
            outcome = _settle(self, kind, error)
        raise outcome

    task.__name__ = task.__qualname__ = f"migronaut_{kind.replace('-', '_')}"
    task.__doc__ = f"migronaut's ``{kind}`` job (payload ``{{v: 1, kind: {kind!r}, …}}``)."
    return task


def _settle(task: Task, kind: str, error: Exception) -> BaseException:
    """A lost connection (the record, the broker) is retried; everything else fails once,
    redacted."""
    import random

    from celery.exceptions import Retry

    if isinstance(error, Retry):
        retry: BaseException = error
        return retry
    clean = outbound_error(error)
    retries = int(task.request.retries or 0)
    if clean.code == ConnectionFailedError.code and retries < 10:
        countdown = min(60.0, 2.0 ** retries * random.uniform(0.75, 1.25))
        _log.warning("%s job %s: %s — retrying in %.0f s", kind, task.request.id,
                     clean.message, countdown)
        found: BaseException = task.retry(countdown=countdown, exc=clean, throw=False)
        return found
    _log.error("%s job %s failed: %s: %s", kind, task.request.id, clean.code, clean.message)
    return clean


def _checked(kind: str, data: Any) -> dict[str, Any]:
    payload = validate(kind, data)
    if kind == TENANT_KIND and payload["command"] != "down" and "steps" in payload:
        raise QueueJobInvalidError("Invalid queue job: fleet-tenant job field 'steps' needs "
                                   "command 'down'", {"kind": kind, "field": "steps"})
    return payload


def _record(fleet: Fleet, run_id: str) -> tuple[Collection[dict[str, Any]], dict[str, Any]]:
    """The run record (primary read), ``QUEUE_JOB_INVALID`` when there is none: a job for a
    run nobody started is junk."""
    from pymongo.errors import PyMongoError

    from migronaut.core.retry import as_connection_failed

    collection = fleet.run_store().collection
    try:
        document = collection.find_one({"_id": run_id})
    except PyMongoError as error:
        raise as_connection_failed(error) or ConnectionFailedError(
            f"Failed to read the fleet run record {run_id}: {error}", cause=error) from error
    if document is None:
        raise QueueJobInvalidError(
            f"Invalid queue job: runId {run_id!r} names no recorded fleet run",
            {"field": "runId", "runId": run_id})
    return collection, document


def _tenant_task(installed: MigronautCelery, worker: FleetWorker, task: Task,
                 payload: dict[str, Any]) -> dict[str, Any]:
    """One tenant: the ordinary command through its migrator, the outcome into the record,
    then the next step."""
    fleet = worker.fleet()
    tenant = worker.tenant(payload["cluster"], payload["tenant"])
    run_id = payload["runId"]
    collection, document = _record(fleet, run_id)
    plan = read_plan(document)
    if plan.command != payload["command"]:
        raise QueueJobInvalidError(
            f"Invalid queue job: fleet run {run_id} runs {plan.command!r}, not "
            f"{payload['command']!r}", {"kind": TENANT_KIND, "field": "command"})
    entry = _entries(document).get(tenant.name)
    if entry is None or entry.cluster != tenant.cluster:  # a step marks a tenant before sending
        raise QueueJobInvalidError(
            f"Invalid queue job: fleet run {run_id} never sent tenant {tenant.name!r} of "
            f"cluster {tenant.cluster!r}", {"kind": TENANT_KIND, "field": "tenant",
                                            "tenant": tenant.name, "runId": run_id})
    if entry.state != STARTED:  # redelivered after it ended (its background jobs maybe not)
        return {"kind": TENANT_KIND, "runId": run_id, "tenant": tenant.name,
                "cluster": tenant.cluster, "state": entry.state, "redelivered": True,
                **_background(installed, worker, plan, TenantOutcome(
                    tenant, entry.state, error=dict(entry.error or {}) or None))}
    from migronaut.observability.events import EventBus

    run = FleetRun(command=plan.command, tenants=[tenant], policy=plan.policy,
                   work=operation(plan.command, steps=plan.steps), migrator=fleet.migrator,
                   store=FleetRunStore(collection), events=EventBus(),
                   telemetry=fleet.telemetry, options={})
    run.run_id = run_id
    outcome = run._tenant(tenant)
    _write(lambda: collection.update_one(
        {"_id": run_id, f"tenants.{tenant.name}.state": STARTED},
        {"$set": {f"tenants.{tenant.name}": outcome.entry().to_document()}}))
    queued = _background(installed, worker, plan, outcome)
    send_step(installed, run_id)
    return {"kind": TENANT_KIND, "runId": run_id, **outcome.to_json(), **queued}


def _background(installed: MigronautCelery, worker: FleetWorker, plan: Plan,
                outcome: TenantOutcome) -> dict[str, Any]:
    """After a tenant's ``up`` ran (when the run asked for it): its background migrations'
    coordinators on the background queue, as a heal of that tenant — the ones the run
    registered, the ones left pending before, a takeover for a dead chain; a live chain absorbs
    its own. A failed ``up`` counts too, as for ``migronaut up``: what it registered is
    committed, and a contract migration that stopped on ``BACKGROUND_PENDING`` waits for
    exactly these. Not for a tenant that was skipped or whose cluster did not answer. Never
    raises: the tenant's outcome stands, and a failed send is logged with what to run
    instead."""
    from migronaut.executors.celery.background_producer import enqueue_background
    from migronaut.executors.celery.tenant_heals import remember_tenant

    if not (plan.background and plan.command == "up" and _reached(outcome)):
        return {}
    tenant = outcome.tenant
    try:
        with worker.engine(tenant.cluster, tenant.name) as engine:
            if engine.runnable():  # listed first: the heals reach it if this worker dies now
                remember_tenant(worker, tenant)
            sent = enqueue_background(installed, engine=engine, tenant=tenant,
                                      requested_by=plan.actor.get("requestedBy"),
                                      reason=plan.actor.get("reason"))
    except Exception as error:
        clean = outbound_error(error)
        _log.warning("⚠ tenant %s: its background migrations were not enqueued (%s: %s) — "
                     "run `migronaut fleet enqueue up` again to hand them over",
                     tenant.name, clean.code, clean.message)
        return {"backgroundError": clean.to_dict()}
    return {"background": sent}


def _reached(outcome: TenantOutcome) -> bool:
    """Whether the tenant's ``up`` ran against its database (succeeded, up to date, or failed
    there — not skipped, not refused by an unreachable cluster)."""
    if outcome.ok:
        return True
    return outcome.state == FAILED and (outcome.error or {}).get("code") \
        != ConnectionFailedError.code


def _step_task(installed: MigronautCelery, worker: FleetWorker, task: Task,
               payload: dict[str, Any]) -> dict[str, Any]:
    return step(installed, worker.fleet(), payload["runId"])


# -- the plan in the record ---------------------------------------------------------------------
class Plan:
    """A queued run's plan as stored in its record: the tenants in start order, the command,
    the policy, and the step counter every step's update is conditional on."""

    def __init__(self, command: str, tenants: list[Tenant], policy: FleetPolicy,
                 steps: int | None, seq: int, actor: Mapping[str, str], *,
                 background: bool = False) -> None:
        self.command = command
        self.tenants = tenants
        self.policy = policy
        self.steps = steps
        self.seq = seq
        self.actor = dict(actor)
        #: whether a tenant's successful ``up`` enqueues its background migrations
        self.background = background

    def to_document(self) -> dict[str, Any]:
        policy = self.policy
        return {"v": PLAN_VERSION, "seq": self.seq, "command": self.command,
                "steps": self.steps, "tenants": [[t.cluster, t.name] for t in self.tenants],
                "concurrency": policy.concurrency,
                "perClusterConcurrency": policy.per_cluster_concurrency,
                "canary": policy.canary, "maxFailures": policy.max_failures,
                "onLock": policy.on_lock, "lockWaitMs": policy.lock_wait_ms,
                "background": self.background, **self.actor}


def read_plan(document: Mapping[str, Any]) -> Plan:
    """The plan of a queued run's record, checked (``STATE_INVALID`` naming the field: a step
    never schedules from a plan it does not understand)."""
    run_id = document.get("_id")

    def invalid(path: str, problem: str) -> StateInvalidError:
        return StateInvalidError(
            f"Fleet run record {run_id!r} cannot be read: {PLAN_FIELD}.{path} {problem}",
            {"record": str(run_id), "field": f"{PLAN_FIELD}.{path}",
             "problems": [f"{PLAN_FIELD}.{path} {problem}"]})

    plan = document.get(PLAN_FIELD)
    if not isinstance(plan, Mapping):
        raise invalid("", "is missing (not a run sent to the queue)")
    if plan.get("v") != PLAN_VERSION:
        raise invalid("v", f"is {plan.get('v')!r}, not {PLAN_VERSION}")

    def integer(key: str, *, optional: bool = False, low: int = 0) -> Any:
        value = plan.get(key)
        if value is None and optional:
            return None
        if not is_int(value) or value < low:
            raise invalid(key, f"is {value!r}, not an integer ≥ {low}")
        return value

    command = plan.get("command")
    if command not in COMMANDS:
        raise invalid("command", f"is {command!r}, not one of {', '.join(COMMANDS)}")
    raw = plan.get("tenants")
    if not isinstance(raw, list) or not all(
            isinstance(pair, list) and len(pair) == 2
            and all(isinstance(part, str) for part in pair) for pair in raw):
        raise invalid("tenants", "is not a list of [cluster, tenant] pairs")
    on_lock = plan.get("onLock")
    if on_lock not in ("skip", "wait"):
        raise invalid("onLock", f"is {on_lock!r}, not 'skip' or 'wait'")
    policy = FleetPolicy(
        concurrency=integer("concurrency", low=1),
        per_cluster_concurrency=integer("perClusterConcurrency", optional=True, low=1),
        canary=integer("canary"), max_failures=integer("maxFailures", optional=True),
        on_lock=on_lock, lock_wait_ms=integer("lockWaitMs", low=1))
    background = plan.get("background", False)  # a plan written before the option: none
    if not isinstance(background, bool):
        raise invalid("background", f"is {background!r}, not true or false")
    actor = {key: plan[key] for key in ("requestedBy", "reason") if isinstance(plan.get(key), str)}
    return Plan(command, [Tenant(name, cluster) for cluster, name in raw], policy,
                integer("steps", optional=True, low=1), integer("seq"), actor,
                background=background)


def _entries(document: Mapping[str, Any]) -> dict[str, TenantEntry]:
    """The record's tenant entries, read fail closed through the record's own parser."""
    return {entry.name: entry for entry in parse_record(document).tenants}


# -- the coordinating step ----------------------------------------------------------------------
class Decision:
    """What one step does: tenants to send, and — once the run is over — every tenant's final
    outcome (unsent ones skipped) for the record."""

    def __init__(self, send: list[Tenant], final: list[TenantOutcome] | None) -> None:
        self.send = send
        self.final = final


def decide(plan: Plan, entries: Mapping[str, TenantEntry]) -> Decision:
    """The fleet's scheduling rules applied to the record's entries (pure): the canary stage,
    then the rest if every canary succeeded; no new tenant once the budget is spent; at most
    ``concurrency`` tenants (``per_cluster_concurrency`` per cluster) in flight."""
    policy = plan.policy
    canary, rest = stages(plan.tenants, policy.canary)
    states = {name: entry.state for name, entry in entries.items()}
    budget = FailureBudget(policy.max_failures,
                           sum(1 for state in states.values() if state == FAILED))
    slots = ClusterSlots(policy.per_cluster_concurrency)
    running = [t for t in plan.tenants if states.get(t.name) == STARTED]
    for tenant in running:
        slots.take(tenant.cluster)
    canary_over = all(states.get(t.name, STARTED) != STARTED for t in canary)
    canary_failed = canary_over and not all(
        TenantOutcome(t, states[t.name]).ok for t in canary)
    stage = canary if not canary_over else [] if canary_failed else rest
    queue = [t for t in stage if t.name not in states]
    send: list[Tenant] = []
    while queue and not budget.exhausted and len(running) + len(send) < policy.concurrency:
        index = slots.next_startable(queue)
        if index is None:
            break
        tenant = queue.pop(index)
        slots.take(tenant.cluster)
        send.append(tenant)
    unsent = [t for t in plan.tenants if t.name not in states and t not in send]
    over = not running and not send and (not unsent or budget.exhausted or canary_failed)
    if not over:
        return Decision(send, None)
    skipped = SKIPPED_BUDGET if budget.exhausted else SKIPPED_CANARY if canary_failed \
        else SKIPPED_STOPPED
    final = [TenantOutcome(t, skipped) if t.name not in entries else TenantOutcome(
        t, entries[t.name].state, error=dict(entries[t.name].error or {}) or None,
        started_at=entries[t.name].started_at, ended_at=entries[t.name].ended_at,
        changed=entries[t.name].changed) for t in plan.tenants]
    return Decision([], final)


def step(installed: MigronautCelery, fleet: Fleet, run_id: str) -> dict[str, Any]:
    """One coordinating step of run ``run_id``: read the record, send what the rules allow
    (each tenant once: the update that marks them ``started`` is conditional on the step
    counter), or end the run when nothing runs and nothing is left to send."""
    for _ in range(STEP_ATTEMPTS):
        collection, document = _record(fleet, run_id)
        plan = read_plan(document)
        entries = _entries(document)
        if document.get("outcome") != "running":
            return {"kind": STEP_KIND, "runId": run_id, "outcome": document.get("outcome"),
                    "sent": []}
        decision = decide(plan, entries)
        now = dt.datetime.now(dt.UTC)
        changes: dict[str, Any] = {
            f"tenants.{t.name}": TenantEntry(t.name, t.cluster, STARTED, now).to_document()
            for t in decision.send}
        outcome = None
        if decision.final is not None:
            result = FleetResult(run_id, plan.command, plan.policy, decision.final,
                                 document["startedAt"], now)
            outcome = result.outcome
            changes.update({f"tenants.{o.tenant.name}": o.entry().to_document()
                            for o in decision.final if o.tenant.name not in entries})
            changes.update(outcome=outcome, endedAt=now)
        if not changes:
            return {"kind": STEP_KIND, "runId": run_id, "sent": [], "running": sum(
                1 for e in entries.values() if e.state == STARTED)}
        seq = f"{PLAN_FIELD}.seq"
        result_ = collection.update_one({"_id": run_id, seq: plan.seq, "outcome": "running"},
                                        {"$set": changes, "$inc": {seq: 1}})
        if result_.modified_count == 0:
            continue  # another step moved first: decide again on what it wrote
        for tenant in decision.send:
            _send_tenant(installed, run_id, plan, tenant)
        out: dict[str, Any] = {"kind": STEP_KIND, "runId": run_id,
                               "sent": [t.name for t in decision.send]}
        if outcome is not None:
            out["outcome"] = outcome
        return out
    raise ConnectionFailedError(  # retried: the record is too busy for now
        f"Fleet run {run_id}: the record kept changing under {STEP_ATTEMPTS} steps",
        {"runId": run_id})


def _write(call: Callable[[], Any]) -> None:
    FleetRunStore._write(call)


def _tenant_task_id(run_id: str, tenant: Tenant) -> str:
    return f"fleet-{run_id}-{fragment(tenant.cluster)}-{fragment(tenant.name)}"


def _send_tenant(installed: MigronautCelery, run_id: str, plan: Plan, tenant: Tenant) -> None:
    payload: dict[str, Any] = {"v": VERSION, "kind": TENANT_KIND, "runId": run_id,
                               "tenant": tenant.name, "cluster": tenant.cluster,
                               "command": plan.command, **plan.actor}
    if plan.steps is not None and plan.command == "down":
        payload["steps"] = plan.steps
    installed.app.send_task(installed.task_name(TENANT_KIND), args=(payload,),
                            queue=installed.settings.queue,
                            task_id=_tenant_task_id(run_id, tenant))


def send_step(installed: MigronautCelery, run_id: str) -> str:
    """Send one coordinating step of ``run_id``; its task id."""
    task_id = f"fleet-step-{run_id}-{uuid.uuid4().hex[:8]}"
    installed.app.send_task(installed.task_name(STEP_KIND),
                            args=({"v": VERSION, "kind": STEP_KIND, "runId": run_id},),
                            queue=installed.settings.queue, task_id=task_id)
    return task_id


# -- the producer -------------------------------------------------------------------------------
class FleetEnqueued:
    """What ``fleet enqueue`` did: the run (its record id), its tenants and policy."""

    def __init__(self, run_id: str, command: str, tenants: list[Tenant], policy: FleetPolicy,
                 step_id: str, *, background: bool = False) -> None:
        self.run_id = run_id
        self.command = command
        self.tenants = tenants
        self.policy = policy
        self.step_id = step_id
        self.background = background

    def to_json(self) -> dict[str, Any]:
        return {"runId": self.run_id, "command": self.command, "total": len(self.tenants),
                "canary": [t.name for t in self.tenants[:self.policy.canary]],
                "policy": self.policy.to_json(), "stepTask": self.step_id,
                "background": self.background}


def enqueue_fleet(target: MigronautCelery | Celery, fleet: Fleet, command: str = "up", *,
                  steps: int | None = None, requested_by: str | None = None,
                  reason: str | None = None, background: bool = True,
                  **policy: Any) -> FleetEnqueued:
    """Plan a fleet run of ``command`` (tenants resolved and ordered now, the policy the
    config's with ``policy`` overrides), write its record, and send its first step.

    With ``background`` (``up`` only), each tenant whose ``up`` succeeds has its pending
    background migrations enqueued on the background queue by the worker that ran it, as
    tenant jobs the workers run against that tenant's database.

    ``target`` is the Celery app migronaut is installed on (or what ``install`` returned); no
    result backend is needed — the steps and tenant tasks meet in the run record. A fleet with
    an unreachable cluster is refused (``CONNECTION_FAILED``): the plan must name every tenant.
    Nothing is sent when the plan cannot be written."""
    from migronaut.core.plan import validate_actor
    from migronaut.errors import ConfigInvalidError
    from migronaut.executors.celery.producer import _installed
    from migronaut.fleet.schedule import order_tenants

    installed = _installed(target, needs_results=False)

    if command not in COMMANDS:
        raise ConfigInvalidError(f"fleet enqueue runs {', '.join(COMMANDS)} (got {command!r})",
                                 {"option": "command"})
    if command == "down" and (not is_int(steps)
                              or steps < 1):
        raise ConfigInvalidError(f"steps must be a positive integer (got {steps!r})",
                                 {"option": "steps"})
    validate_actor(requested_by, reason)
    if not isinstance(background, bool):
        raise ConfigInvalidError(f"background must be true or false (got {background!r})",
                                 {"option": "background"})
    if installed.tasks.get(STEP_KIND) is None:
        raise ConfigInvalidError("the fleet tasks are not installed on this Celery app (the "
                                 "config has no [fleet] table)", {"option": "fleet"})
    checked = fleet.policy(**policy)
    tenants = fleet.tenants()
    if fleet.unreachable_clusters:
        raise next(iter(fleet.unreachable_clusters.values()))
    sizes = fleet._sizes(tenants) if checked.order == "size" else None
    ordered = order_tenants(tenants, checked.order, sizes=sizes, seed=checked.seed)
    actor = {k: v for k, v in (("requestedBy", requested_by), ("reason", reason)) if v}
    background = background and command == "up"
    plan = Plan(command, ordered, checked, steps if command == "down" else None, 0, actor,
                background=background)
    run_id = uuid.uuid4().hex
    store = fleet.run_store()
    store.start(run_id, command, {**checked.to_json(), "queue": installed.settings.queue,
                                  **({"steps": steps} if command == "down" else {}),
                                  "tenants": fleet._pattern}, len(ordered))
    # the run lives on the workers, not in this process: its record names no pid to watch
    _write(lambda: store.collection.update_one(
        {"_id": run_id}, {"$set": {"host": f"celery:{installed.settings.queue}", "pid": 0,
                                   PLAN_FIELD: plan.to_document()}}))
    step_id = send_step(installed, run_id)
    return FleetEnqueued(run_id, command, ordered, checked, step_id, background=background)
