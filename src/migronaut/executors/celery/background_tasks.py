"""The background queue's tasks: the coordinator, lanes and the periodic verify (reference
background §6.4, mapped onto Celery without chords: a coordinator re-checks MongoDB by countdown).

``migronaut.background`` (the coordinator chain)
    loops on coordinator steps (driver ``celery``, ref = its task id, the chain's round;
    a re-check glances first and takes the lock only when a step has something to decide):
    ``process`` fans out lane tasks (ids deterministic per slot, so a redelivery does not double
    them) and re-checks after ``poll_interval_ms``; ``wait`` re-checks after the answer's
    ``retryAfterMs``, ``busy`` (the lock held by a lane closing its pass) within the poll
    interval; ``done`` ends the chain (a completed migration heals: dependents
    may be unblocked); ``superseded`` ends it (a newer round took over). A chain whose lanes
    look stranded (no lease, no progress for ``stall_ms`` while their ids still look live —
    a killed worker's tasks) starts a new round, which gives its lanes fresh ids.
``migronaut.background-lane``
    one slice: ``yielded``/``stopped``/``lost`` continue at once as the same task, ``busy``
    after the answer's ``retryAfterMs``, anything else completes (``exhausted`` after one
    coordinator step in the chain's round, so the last lane closes the pass at once). A failed
    slice (already counted on its partition in MongoDB) retries after
    ``min(5 min, 1 s × 2^(retry−1))`` and gives up after ``max_lane_retries``, completing with
    outcome ``gave-up``.
``migronaut.background-verify``
    the drift poll, then a heal; on beat every ``verify_interval_ms`` (unless ``None``).

A coordinator or lane job that names a fleet tenant (``tenant``/``cluster``) works that tenant's
database through the process's tenant engine
(:meth:`~migronaut.executors.celery.context.FleetWorker.engine`), and everything it sends —
its lanes, its continuation, the heal after it completes — names the same tenant. The verify
tick, the start-up heal and the chain watch look at the worker's own database only.

A task continues itself by sending itself again (same id, new payload, marked ``QUEUED`` in the
result backend first) and writes its result only when it ends, so the result backend's state of
a chain or lane slot says whether it is live (see
:mod:`~migronaut.executors.celery.background_producer`). On a warm shutdown
(``WorkerContext.shutdown``) a lane stops at its next batch boundary, checkpoints, releases its
lease and re-enqueues itself; a coordinator bows out and comes back — nothing waits for a lease
TTL. Every error that leaves a task goes through :func:`~.failures.outbound_error`.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from migronaut.errors import QueueJobInvalidError
from migronaut.executors.celery.background_producer import (
    enqueue_background,
    lane_id,
    send_once,
    send_queued,
    tenant_fields,
    tenant_of,
)
from migronaut.executors.celery.failures import outbound_error
from migronaut.executors.celery.payloads import VERSION, validate
from migronaut.executors.celery.tenant_heals import heal_tenants

if TYPE_CHECKING:
    from celery.app.task import Task

    from migronaut.background.coordination.coordinator import Answer
    from migronaut.background.engine import BackgroundEngine
    from migronaut.background.lanes.slices import SliceResult
    from migronaut.executors.celery.installation import MigronautCelery
    from migronaut.fleet.tenants import Tenant

__all__ = ["VERIFY_SCHEDULE", "lane_backoff_s", "register"]

logger = logging.getLogger("migronaut")

#: The beat entry of the verify tick.
VERIFY_SCHEDULE = "migronaut-background-verify"
#: A coordinator step that raises is tried this many times, ``COORDINATOR_BACKOFF_S`` apart,
#: before the chain fails (the next heal starts a new one).
COORDINATOR_ATTEMPTS = 3
COORDINATOR_BACKOFF_S = 30.0
#: Lane retry backoff: ``min(LANE_BACKOFF_CAP_S, 1 s × 2^(retry−1))``.
LANE_BACKOFF_CAP_S = 300.0
#: Slice outcomes after which a lane continues at once, as the same task.
_AGAIN = frozenset({"yielded", "stopped", "lost"})


def lane_backoff_s(retry: int) -> float:
    """Seconds before the ``retry``-th retry of a failed lane slice (``retry`` ≥ 1)."""
    return min(LANE_BACKOFF_CAP_S, 2.0 ** max(0, retry - 1))


@dataclass(frozen=True)
class Again:
    """A task's decision to continue as itself: the payload to carry and when."""

    payload: dict[str, Any]
    countdown: float = 0.0


def _checked(kind: str, payload: Any) -> dict[str, Any]:
    try:
        return validate(kind, payload)
    except QueueJobInvalidError as error:
        logger.error("✖ %s", error.message)
        raise outbound_error(error) from None


def _run(task: Task, installed: MigronautCelery, kind: str, decide: Any,
         payload: dict[str, Any]) -> Any:
    """Run ``decide(payload, task_id)``; continue the task as itself when it says
    :class:`Again`, else write its result; let every error leave redacted.

    The tasks are declared ``ignore_result`` and keep the ledger themselves: a continuation is
    sent under the same id, marked ``QUEUED`` first, and nothing is written when a run ends in
    one — one result-backend write per slice where ``Task.retry`` cost a ``RETRY`` write and
    a formatted traceback. Failures are still stored (``store_errors_even_if_ignored``)."""
    task_id = str(task.request.id)
    try:
        decided = decide(payload, task_id)
        if isinstance(decided, Again):
            send_queued(installed, kind, decided.payload, task_id,
                        countdown=max(0.0, decided.countdown))
            return None
        # (store_result, not mark_as_done: that one skips when the message asked to ignore it)
        installed.app.backend.store_result(task_id, decided, "SUCCESS", request=task.request)
    except Exception as error:
        raise outbound_error(error) from None
    return decided


def heal(installed: MigronautCelery, engine: BackgroundEngine | None = None,
         tenant: Tenant | None = None) -> list[dict[str, Any]]:
    """A heal that never raises (worker start, after a coordinator completes): what was sent
    (for ``tenant``, through its ``engine``: that tenant's migrations)."""
    try:
        return enqueue_background(installed, engine=engine, tenant=tenant)
    except Exception as error:
        logger.warning("⚠ background heal failed (%s) — the next heal retries",
                       outbound_error(error).message)
        return []


class _MigrationStep:
    """What a coordinator and a lane run share: a warm shutdown before or during the step makes
    the task continue as itself (nothing is lost: the step stopped at a boundary), and an error
    goes to :meth:`failed`."""

    def __init__(self, installed: MigronautCelery) -> None:
        self.installed = installed
        self.settings = installed.settings

    def __call__(self, data: dict[str, Any], task_id: str) -> Any:
        context = self.installed.context
        if context.shutdown.cancelled:
            return Again(data)
        name = data["migration"]
        with self.engine(data) as engine:
            try:
                outcome = self.step(engine, name, data, task_id)
            except Exception as error:
                if context.shutdown.cancelled:
                    return Again(data)
                return self.failed(name, data, error)
            return self.after(engine, name, data, outcome, task_id)

    def engine(self, data: dict[str, Any]) -> AbstractContextManager[BackgroundEngine]:
        """The engine the job works: its tenant's (``QUEUE_JOB_INVALID`` for a database the
        fleet does not list) or, without a tenant, the worker's own."""
        tenant = tenant_of(data)
        context = self.installed.context
        if tenant is None:
            return nullcontext(context.engine())
        return context.fleet().engine(tenant.cluster, tenant.name)

    def coordinate(self, engine: BackgroundEngine, name: str, data: dict[str, Any],
                   task_id: str) -> Answer:
        """One coordinator step in the chain's round (``data["round"]``), as ``task_id`` —
        unless a glance without the lock tells what it would answer (a chain's re-check while
        its lanes work, a lane that finished while others still do, a finished migration)."""
        round_ = data.get("round")
        if round_ is not None:
            glanced = engine.glance(name, round=round_)
            if glanced is not None:
                return glanced
        return engine.coordinate(name, driver="celery", cancellation=self.installed.context
                                 .shutdown, ref=task_id, round=round_)

    def step(self, engine: BackgroundEngine, name: str, data: dict[str, Any],
             task_id: str) -> Any:
        raise NotImplementedError

    def failed(self, name: str, data: dict[str, Any], error: Exception) -> Any:
        raise NotImplementedError

    def after(self, engine: BackgroundEngine, name: str, data: dict[str, Any], outcome: Any,
              task_id: str) -> Any:
        raise NotImplementedError


class Coordinator(_MigrationStep):
    """The coordinator chain's decisions (one task run = steps until a countdown or an end).

    A run that continues the chain renews its heartbeat in MongoDB for the countdown plus
    ``chain_ttl_ms``: a heal judges the chain by it, so a chain whose worker was killed is taken
    over about ``chain_ttl_ms`` after its next run was due, whatever the ledger still says."""

    def __call__(self, data: dict[str, Any], task_id: str) -> Any:
        decided = super().__call__(data, task_id)
        if isinstance(decided, Again) and decided.payload.get("round") is not None:
            self.renew(str(data["migration"]), decided, task_id)
        return decided

    def renew(self, name: str, decided: Again, task_id: str) -> None:
        """Renew the chain's heartbeat until its next run is due, plus ``chain_ttl_ms``."""
        ttl_ms = int(max(0.0, decided.countdown) * 1000) + self.settings.chain_ttl_ms
        try:
            with self.engine(decided.payload) as engine:
                engine.renew_chain(name, round=int(decided.payload["round"]), ref=task_id,
                                   ttl_ms=ttl_ms)
        except Exception as error:  # the next run renews; a heal meanwhile costs a new round
            logger.warning("⚠ %s: the coordinator chain could not renew its heartbeat (%s)",
                           name, outbound_error(error).message)

    def step(self, engine: BackgroundEngine, name: str, data: dict[str, Any],
             task_id: str) -> Answer:
        return self.coordinate(engine, name, data, task_id)

    def failed(self, name: str, data: dict[str, Any], error: Exception) -> Any:
        attempt = int(data.get("attempt") or 0) + 1
        if attempt >= COORDINATOR_ATTEMPTS:
            raise error
        logger.warning("⚠ %s: a coordinator step failed (%s) — again in %gs", name,
                       outbound_error(error).message, COORDINATOR_BACKOFF_S)
        return Again({**data, "attempt": attempt}, COORDINATOR_BACKOFF_S)

    def after(self, engine: BackgroundEngine, name: str, data: dict[str, Any], outcome: Any,
              task_id: str) -> Any:
        answer: Answer = outcome
        data = {k: v for k, v in data.items() if k != "attempt"}
        if answer.round is not None:
            data["round"] = answer.round
        return self.decide(engine, name, data, answer)

    def decide(self, engine: BackgroundEngine, name: str, data: dict[str, Any],
               answer: Answer) -> Any:
        poll_s = self.settings.poll_interval_ms / 1000
        if answer.next == "done":
            logger.info("✔ %s: %s", name, answer.status)
            if answer.status == "completed":
                heal(self.installed, engine, tenant_of(data))
            chain_round = data.get("round")  # the chain's, also when the step ended early
            return {"kind": "background", "migration": name, "status": answer.status,
                    **({"round": chain_round} if chain_round is not None else {})}
        if answer.next == "superseded":
            logger.info("↷ %s: round %s superseded by a newer coordinator", name, answer.round)
            return {"kind": "background", "migration": name, "status": "superseded",
                    "round": answer.round}
        if answer.next != "process":
            if answer.reason == "stopping":
                return Again(data)
            wait_s = (answer.retry_after_ms or 0) / 1000 or poll_s
            if answer.next == "busy":
                # another step (a lane closing its pass) holds the coordinator lock for
                # milliseconds: look again within the poll interval, not the lock's ttl/2
                wait_s = min(wait_s, poll_s)
            return Again(data, wait_s)
        if answer.lanes:
            sent = self.fan_out(name, data, answer)
            if sent:
                logger.info("⇉ %s: %d lane(s) for generation %s (round %s)", name, sent,
                            answer.generation, answer.round)
            elif not (answer.counts or {}).get("leased"):
                quiet_ms = self.stranded_after_ms(engine, name)
                if engine.stalled(quiet_ms, name=name, coordinator=False):
                    logger.warning("⚠ %s: its lanes look stranded (no lease, no progress for %d "
                                   "ms) — starting a new round", name, quiet_ms)
                    return Again({k: v for k, v in data.items() if k != "round"})
        return Again(data, poll_s)

    def stranded_after_ms(self, engine: BackgroundEngine, name: str) -> int:
        """How long lanes that the ledger calls live may hold no lease and make no progress
        before the chain calls them stranded (killed with their worker): ``chain_ttl_ms`` — or
        ``stall_ms`` while a partition counts failed slices, since a lane waiting out its retry
        back-off (up to 5 minutes) holds no lease either."""
        quiet_ms = min(self.settings.chain_ttl_ms, self.settings.stall_ms)
        return self.settings.stall_ms if engine.failing(name) else quiet_ms

    def fan_out(self, name: str, data: dict[str, Any], answer: Answer) -> int:
        """Send the lane slots the answer asks for that are not live; how many were sent."""
        leased = int((answer.counts or {}).get("leased") or 0)
        registration, generation = str(answer.registration), int(answer.generation or 0)
        round_ = int(data.get("round") or 1)
        tenant = tenant_of(data)
        sent = 0
        for lane in range(min(64, leased + answer.lanes)):
            payload = {"v": VERSION, "kind": "background-lane", "migration": name,
                       "registration": registration, "generation": generation,
                       "round": round_, "lane": lane, **tenant_fields(tenant)}
            task_id = lane_id(self.settings.background_queue_name, name, registration,
                              generation, round_, lane, tenant)
            if send_once(self.installed, "background-lane", payload, task_id):
                sent += 1
        return sent


class Lane(_MigrationStep):
    """One lane slice per task run."""

    def step(self, engine: BackgroundEngine, name: str, data: dict[str, Any],
             task_id: str) -> SliceResult:
        state = engine.state(name)
        spec = (state or {}).get("spec")
        # a spec it cannot read is run_slice's to refuse (STATE_INVALID naming it), not ours
        spec_ms = spec.get("sliceMs") if isinstance(spec, dict) else None
        # the setting is a ceiling (it must fit in the broker's visibility timeout)
        slice_ms = None if isinstance(spec_ms, int) and spec_ms <= self.settings.slice_ms \
            else self.settings.slice_ms
        return engine.run_slice(name, slice_ms=slice_ms, cancellation=self.installed.context
                                .shutdown, ref=task_id, state=state)

    def after(self, engine: BackgroundEngine, name: str, data: dict[str, Any], outcome: Any,
              task_id: str) -> Any:
        result: SliceResult = outcome
        data = {k: v for k, v in data.items() if k != "retry"}
        if result.outcome in _AGAIN:
            return Again(data)
        if result.outcome == "busy":
            wait_ms = result.retry_after_ms or self.settings.poll_interval_ms
            return Again(data, wait_ms / 1000)
        if result.outcome == "exhausted" and data.get("round") is not None:
            # (a lane without a round must never start one: that would supersede the chain)
            self.close_pass(engine, name, data, task_id)
        return {"kind": "background-lane", "migration": name, "outcome": result.outcome,
                "counters": dict(result.counters)}

    def close_pass(self, engine: BackgroundEngine, name: str, data: dict[str, Any],
                   task_id: str) -> None:
        """A lane that found nothing left to claim takes one coordinator step in its chain's
        round (as ``background work``'s lanes do): the last lane closes the pass at once
        instead of leaving it to the chain's next re-check. A step that fails or is superseded
        changes nothing — the chain decides from MongoDB anyway."""
        try:
            answer = self.coordinate(engine, name, data, task_id)
        except Exception as error:
            logger.debug("%s: a lane's coordinator step failed (%s)", name,
                         outbound_error(error).message)
            return
        if answer.next == "done" and answer.status == "completed":
            heal(self.installed, engine, tenant_of(data))

    def failed(self, name: str, data: dict[str, Any], error: Exception) -> Any:
        clean = outbound_error(error)
        retry = int(data.get("retry") or 0) + 1
        if retry > self.settings.max_lane_retries:
            logger.warning("✖ %s: a lane gave up after %d retries: %s", name, retry - 1,
                           clean.message)
            return {"kind": "background-lane", "migration": name, "outcome": "gave-up",
                    "code": clean.code, "error": clean.message}
        delay = lane_backoff_s(retry)
        logger.warning("⚠ %s: a lane slice failed (%s) — retry %d in %gs", name, clean.message,
                       retry, delay)
        return Again({**data, "retry": retry}, delay)


class Verify:
    """The verify tick: the drift poll, then a heal."""

    def __init__(self, installed: MigronautCelery) -> None:
        self.installed = installed

    def __call__(self, data: dict[str, Any], task_id: str) -> Any:
        migrator = self.installed.context.shared_migrator()
        config = migrator.config
        result = migrator.background.verify(on_drift=config.background_on_drift,
                                            drift_mode=config.background_drift)
        enqueued = enqueue_background(self.installed, engine=migrator.background)
        tenants = heal_tenants(self.installed)
        return {"kind": "background-verify", "checked": result.get("checked"),
                "skipped": result.get("skipped"), "drift": result.get("drift", []),
                "enqueued": enqueued + tenants}


def register(installed: MigronautCelery, options: dict[str, Any]) -> None:
    """Register the background queue's tasks on ``installed.app`` (and the verify tick's beat
    entry unless ``verify_interval_ms`` is ``None``)."""
    app, settings = installed.app, installed.settings
    queue = settings.background_queue_name
    # shared=False: a shared task is added to every app of the process, so a second app (a
    # producer's, a test's) would run the first installation's task, with its settings.
    # No STARTED and no result written by Celery: a running slot is live in the ledger from its
    # QUEUED mark until _run writes its result (see _run)
    task_options = {**options, "bind": True, "max_retries": None, "track_started": False,
                    "ignore_result": True, "store_errors_even_if_ignored": True,
                    "queue": queue, "shared": False}
    for kind, decide_class in (("background", Coordinator), ("background-lane", Lane),
                               ("background-verify", Verify)):
        installed.tasks[kind] = app.task(name=installed.task_name(kind), **task_options)(
            _task_body(installed, kind, decide_class(installed)))
    if settings.verify_interval_ms is not None:
        schedule = dict(app.conf.beat_schedule or {})
        schedule[VERIFY_SCHEDULE] = {
            "task": installed.task_name("background-verify"),
            "schedule": settings.verify_interval_ms / 1000,
            "args": [{"v": VERSION, "kind": "background-verify"}],
            "options": {"queue": queue},
        }
        app.conf.beat_schedule = schedule


def _task_body(installed: MigronautCelery, kind: str, decide: Any) -> Any:
    def body(task: Task, payload: Any) -> Any:
        return _run(task, installed, kind, decide, _checked(kind, payload))

    body.__name__ = body.__qualname__ = kind.replace("-", "_")
    body.__doc__ = f"migronaut's {kind} task (reference background §6.4)."
    return body
