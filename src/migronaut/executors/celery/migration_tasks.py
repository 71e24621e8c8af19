"""The migration queue's tasks: ``up``, ``down``, ``converge`` and the periodic ``sync``.

A task is a thin driver of one :class:`~migronaut.api.Migrator` call; correctness stays in
MongoDB. Invariants:

- a payload is validated before any work; a bad one fails the task once with
  ``QUEUE_JOB_INVALID`` and is never retried;
- a held migration lock never fails a task: it waits in the task (stall-bounded, reference
  core §5.5), then retries later (``self.retry``) — and so do a lost connection and a transient
  network error (:data:`RETRYABLE`); every other error fails the task once;
- whatever leaves a task (result, progress, error) is redacted outbound
  (:mod:`~migronaut.executors.celery.failures`);
- a redelivered ``up`` (a killed worker's task comes back) is harmless: the lock serialises it
  and an applied file is skipped;
- ``sync`` heals the background queue first, then applies what is pending, and never moves past
  a failed migration whose file has not changed (it reports it ``held``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from migronaut.commands.startup import retry_while_lock_held
from migronaut.errors import (
    ConnectionFailedError,
    LockAlreadyHeldError,
    MigronautError,
    QueueJobInvalidError,
    RunAbortedError,
)
from migronaut.executors.celery import background_producer
from migronaut.executors.celery.failures import outbound_error, outbound_value
from migronaut.executors.celery.payloads import validate

if TYPE_CHECKING:
    from celery.app.task import Task

    from migronaut.api import Migrator
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["RETRYABLE", "SYNC_SCHEDULE", "register"]

_log = logging.getLogger("migronaut.celery")
Result = TypeVar("Result")

#: Error codes a task retries (after its in-task lock wait, for a held lock).
RETRYABLE = frozenset({LockAlreadyHeldError.code, ConnectionFailedError.code})
#: Retries of a lost connection before the task fails (a held lock is retried for ever).
MAX_CONNECTION_RETRIES = 10
#: The beat entry ``install`` adds when ``sync_interval_s`` is set.
SYNC_SCHEDULE = "migronaut-sync"


def register(installed: MigronautCelery, options: dict[str, Any]) -> None:
    """Register the migration queue's tasks on ``installed.app`` (and the ``sync`` beat entry
    when ``sync_interval_s`` is set)."""
    from migronaut.executors.celery import producer

    app, settings = installed.app, installed.settings
    runners: dict[str, Callable[[_Job], dict[str, Any]]] = {
        "up": _up, "down": _down, "converge": _converge, "sync": _sync}
    for kind, runner in runners.items():
        installed.tasks[kind] = app.task(
            name=installed.task_name(kind), bind=True, max_retries=None, shared=False,
            **options)(_entry(installed, kind, runner))
    _route(app, [installed.task_name(kind) for kind in runners], settings.queue)
    if settings.sync_interval_s is not None:
        schedule = dict(app.conf.beat_schedule or {})
        schedule[SYNC_SCHEDULE] = {
            "task": installed.task_name("sync"), "schedule": float(settings.sync_interval_s),
            "args": ({"v": 1, "kind": "sync", "requestedBy": "celery-beat"},),
            "options": {"queue": settings.queue, "expires": float(settings.sync_interval_s)},
        }
        app.conf.beat_schedule = schedule
    producer.remember(installed)


def _route(app: Any, names: list[str], queue: str) -> None:
    """Route the tasks to the migration queue, before whatever routes the app already has."""
    ours = {name: {"queue": queue} for name in names}
    routes = app.conf.task_routes
    if routes is None:
        app.conf.task_routes = ours
    elif isinstance(routes, dict):
        app.conf.task_routes = {**routes, **ours}
    else:
        app.conf.task_routes = (ours, *(routes if isinstance(routes, (list, tuple))
                                        else (routes,)))


def _entry(installed: MigronautCelery, kind: str,
           runner: Callable[[_Job], dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def task(self: Task, data: Any = None) -> dict[str, Any]:
        return _Job(installed, self, kind, data).run(runner)

    task.__name__ = task.__qualname__ = f"migronaut_{kind}"
    task.__doc__ = f"migronaut's ``{kind}`` job (payload ``{{v: 1, kind: {kind!r}, …}}``)."
    return task


class _Job:
    """One task execution: its checked payload, the thread's migrator, progress and retries."""

    def __init__(self, installed: MigronautCelery, task: Task, kind: str, data: Any) -> None:
        self.installed = installed
        self.task = task
        self.kind = kind
        self.data = data
        self.payload: dict[str, Any] = {}
        self.applied: list[str] = []
        self.registered: list[str] = []

    @property
    def migrator(self) -> Migrator:
        return self.installed.context.migrator()

    def run(self, runner: Callable[[_Job], dict[str, Any]]) -> dict[str, Any]:
        outcome: BaseException | None = None
        try:
            self.payload = _checked(self.kind, self.data)
            with _Listening(self):
                return outbound_value(runner(self))  # type: ignore[no-any-return]
        except Exception as error:  # every error leaves the task redacted
            outcome = self._settle(error)
        # raised outside the except block: no chained original reaches a traceback Celery stores
        raise outcome

    def _settle(self, error: Exception) -> BaseException:
        """What to raise instead of ``error``: a retry (already sent) for what is worth another
        try, else the error redacted outbound."""
        from celery.exceptions import Retry

        if isinstance(error, Retry):
            return self._retried(error)
        clean = outbound_error(error)
        retries = int(self.task.request.retries or 0)
        if self.installed.context.shutdown.wait(0) and isinstance(error, RunAbortedError):
            # a warm shutdown ended the lock wait: the job goes back to the queue at once
            return self._retried(self.task.retry(countdown=0, exc=clean, throw=False))
        if _retryable(error) and (clean.code == LockAlreadyHeldError.code
                                  or retries < MAX_CONNECTION_RETRIES):
            countdown = min(60.0, 2.0 ** retries * random.uniform(0.75, 1.25))
            _log.warning("%s job %s: %s: %s — retrying in %.0f s", self.kind,
                         self.task.request.id, clean.code, clean.message, countdown)
            return self._retried(self.task.retry(countdown=countdown, exc=clean, throw=False))
        _log.error("%s job %s failed: %s: %s", self.kind, self.task.request.id, clean.code,
                   clean.message)
        return clean

    @staticmethod
    def _retried(retry: Any) -> BaseException:
        """Celery's ``Retry`` (the retry message is already sent; raising it ends the task)."""
        found: BaseException = retry
        return found

    def locked(self, attempt: Callable[[], Result]) -> Result:
        """``attempt()`` (a locked run), waiting in the task while the lock is held."""
        migrator = self.migrator
        return retry_while_lock_held(
            migrator, attempt, timeout_ms=self.installed.settings.lock_wait_timeout_ms,
            stop_event=self.installed.context.shutdown)

    def progress(self, migration: str | None = None) -> None:
        meta: dict[str, Any] = {"kind": self.kind, "applied": list(self.applied)}
        if migration is not None:
            meta["migration"] = migration
        if self.task.request.id is not None:
            self.task.update_state(state="PROGRESS", meta=outbound_value(meta))

    def enqueue_background(self) -> list[dict[str, Any]]:
        """Coordinators for the background migrations this job registered."""
        sent: list[dict[str, Any]] = []
        for name in dict.fromkeys(self.registered):
            sent += background_producer.enqueue_background(
                self.installed, name, requested_by=self.payload.get("requestedBy"),
                reason=self.payload.get("reason"))
        return sent

    @property
    def actor(self) -> dict[str, Any]:
        return {"requested_by": self.payload.get("requestedBy"),
                "reason": self.payload.get("reason")}


class _Listening:
    """The migrator's events a job reports: progress per migration, registered background
    migrations. The migrator outlives the job (one per worker thread): listeners come off."""

    def __init__(self, job: _Job) -> None:
        self.job = job

    def on_success(self, event: dict[str, Any]) -> None:
        self.job.applied.append(str(event.get("migration")))
        self.job.progress()

    def on_start(self, event: dict[str, Any]) -> None:
        self.job.progress(str(event.get("migration")))

    def on_registered(self, event: dict[str, Any]) -> None:
        if event.get("status") != "withdrawn":
            self.job.registered.append(str(event.get("migration")))

    def _pairs(self) -> tuple[tuple[str, Callable[[dict[str, Any]], None]], ...]:
        return (("migration:start", self.on_start), ("migration:success", self.on_success),
                ("background:registered", self.on_registered))

    def __enter__(self) -> _Listening:
        migrator = self.job.migrator
        for event, listener in self._pairs():
            migrator.on(event, listener)
        return self

    def __exit__(self, *exc: object) -> None:
        migrator = self.job.migrator
        for event, listener in self._pairs():
            migrator.off(event, listener)


def _checked(kind: str, data: Any) -> dict[str, Any]:
    payload = validate(kind, data)
    if kind == "up" and payload.get("migration") is None:
        for field in ("ordered", "checksum"):
            if field in payload:
                raise QueueJobInvalidError(
                    f"Invalid queue job: up job field {field!r} needs a migration",
                    {"kind": kind, "field": field})
    if kind == "up" and payload.get("migration") is not None and "to" in payload:
        raise QueueJobInvalidError("Invalid queue job: up job field 'to' cannot be combined "
                                   "with a migration", {"kind": kind, "field": "to"})
    if kind == "down" and payload.get("migration") is None and "ordered" in payload:
        raise QueueJobInvalidError("Invalid queue job: down job field 'ordered' needs a "
                                   "migration", {"kind": kind, "field": "ordered"})
    return payload


def _retryable(error: BaseException) -> bool:
    if isinstance(error, MigronautError):
        return error.code in RETRYABLE
    from pymongo.errors import ConnectionFailure

    return isinstance(error, ConnectionFailure)  # AutoReconnect, NetworkTimeout, selection


def _rows(results: list[Any]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in results]


def _up(job: _Job) -> dict[str, Any]:
    p = job.payload
    file = p.get("migration")
    migrator = job.migrator
    results = job.locked(lambda: migrator.up(
        file, to=p.get("to"), batch=p.get("batch"), ordered=p.get("ordered", False),
        checksum=p.get("checksum"), on_background_pending="error" if file else "stop",
        **job.actor))
    out: dict[str, Any] = {"kind": "up", "results": _rows(results),
                           "background": job.enqueue_background()}
    if file is not None:
        out["migration"] = file
    if migrator._waiting:
        out["waiting"] = migrator._waiting
    return out


def _down(job: _Job) -> dict[str, Any]:
    p = job.payload
    migrator = job.migrator
    results = job.locked(lambda: migrator.down(p.get("migration"),
                                               ordered=p.get("ordered", False), **job.actor))
    out: dict[str, Any] = {"kind": "down", "results": _rows(results),
                           "background": job.enqueue_background()}
    if p.get("migration") is not None:
        out["migration"] = p["migration"]
    return out


def _converge(job: _Job) -> dict[str, Any]:
    migrator = job.migrator
    result = job.locked(lambda: migrator.converge(
        ordered=job.payload.get("ordered", True), **job.actor))
    return {"kind": "converge", "converge": result.to_dict()}


def _sync(job: _Job) -> dict[str, Any]:
    """Heal, then apply what is pending — unless the first pending migration failed and its file
    is unchanged: then hold the line (``held``) until someone fixes it."""
    installed, migrator = job.installed, job.migrator
    healed = background_producer.enqueue_background(installed, **job.actor)
    out: dict[str, Any] = {"kind": "sync", "background": {"enqueued": healed}}
    plan = migrator.plan_sequence()
    if plan.runs and plan.runs[0].failed:
        held = plan.runs[0].migration
        _log.warning("sync: holding at %s — its last attempt failed and the file has not "
                     "changed; fix it (or run it by hand) and the next tick goes on", held)
        out.update(held={"migration": held, "reason": "failed"}, results=[])
        return out
    try:
        results = job.locked(lambda: migrator.up(on_background_pending="stop", **job.actor))
    except LockAlreadyHeldError:
        out.update(results=[], lockHeld=True)  # a tick never retries: the next one comes
        return out
    out["results"] = _rows(results)
    out["background"]["enqueued"] += job.enqueue_background()
    if migrator._waiting:
        out["waiting"] = migrator._waiting[0]
        out["held"] = {**migrator._waiting[0], "reason": "waiting for background migrations"}
    return out
