"""Enqueueing migration jobs: ``enqueue_up``, ``enqueue_down``, ``enqueue_converge``, and the
:class:`QueueHandle` that waits for them.

A producer plans with the database (what is pending, now) and sends one job per migration as a
Celery chain: the jobs run one after another on whichever workers are free, share one batch, are
``ordered`` (a job refuses to run out of sequence) and pin the file's checksum (a worker with
other code refuses). A chain stops at its first failure: no later migration runs past a failed
one. The plan stops before a migration that waits for an unfinished background migration
(``waiting``) — the next ``enqueue_up``/``sync`` goes on from there.
"""

from __future__ import annotations

import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.core.plan import validate_actor, validate_down_options
from migronaut.errors import ConfigInvalidError, QueueJobFailedError
from migronaut.executors.celery.installation import MigronautCelery, has_result_backend
from migronaut.executors.celery.payloads import VERSION, fragment

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["QueueHandle", "QueuedJob", "enqueue_converge", "enqueue_down", "enqueue_up",
           "remember"]

_INSTALLED: weakref.WeakKeyDictionary[Any, MigronautCelery] = weakref.WeakKeyDictionary()


def remember(installed: MigronautCelery) -> None:
    """Let the producer functions take the Celery app itself (``install`` calls this)."""
    _INSTALLED[installed.app] = installed


def _installed(target: MigronautCelery | Celery, *, needs_results: bool = True
               ) -> MigronautCelery:
    """The installation behind ``target``, refused (before any planning or send) when its app
    stores no results and ``needs_results``: a handle could never tell whether its jobs ran."""
    if isinstance(target, MigronautCelery):
        found: MigronautCelery | None = target
    else:
        found = _INSTALLED.get(target)
    if found is None:
        raise ConfigInvalidError(
            "migronaut is not installed on this Celery app: call "
            "migronaut.celery.install(app) first (or pass what it returned)",
            {"option": "app"})
    if needs_results and not has_result_backend(found.app):
        raise ConfigInvalidError(
            "Invalid config: celery.result_backend is not set — the migration queue needs a "
            "result backend to report its jobs (QueueHandle.wait); a RabbitMQ broker carries "
            "the jobs, not their results. Set celery.result_backend (or "
            "MIGRONAUT_CELERY_RESULT_BACKEND), e.g. redis://…",
            {"key": "celery.result_backend", "option": "result_backend"})
    return found


@dataclass(frozen=True)
class QueuedJob:
    """One job sent: its Celery task id, kind and migration (if it has one)."""

    id: str
    kind: str
    migration: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "migration": self.migration}


@dataclass
class QueueHandle:
    """The jobs one ``enqueue_*`` call sent, in run order, and what it did not send
    (``waiting``: ``{migration, waitsFor}``). ``wait()`` collects their results."""

    app: Any
    group_id: str
    jobs: list[QueuedJob] = field(default_factory=list)
    batch: int | None = None
    waiting: dict[str, Any] | None = None

    @property
    def ids(self) -> list[str]:
        return [job.id for job in self.jobs]

    @property
    def up_to_date(self) -> bool:
        """Nothing was sent and nothing waits."""
        return not self.jobs and self.waiting is None

    def wait(self, timeout: float | None = None, *, interval: float = 0.2) -> list[dict[str, Any]]:
        """The jobs' results in run order, once every job succeeded.

        ``QUEUE_JOB_FAILED`` as soon as a job failed (naming it, its code and message; the jobs
        after it never run) or, after ``timeout`` seconds, with ``context.timedOut``."""
        from celery.result import AsyncResult

        deadline = None if timeout is None else time.monotonic() + timeout
        results: list[dict[str, Any]] = []
        for job in self.jobs:
            result = AsyncResult(job.id, app=self.app)
            while True:
                state = result.state
                if state == "SUCCESS":
                    results.append(result.result)
                    break
                if state in ("FAILURE", "REVOKED"):
                    raise self._failed(job, result.result, state)
                if deadline is not None and time.monotonic() >= deadline:
                    raise QueueJobFailedError(
                        f"Timed out after {timeout:g} s waiting for the {job.kind} job "
                        f"{job.id}" + (f" ({job.migration})" if job.migration else "")
                        + f" (state {state})",
                        {**job.to_dict(), "groupId": self.group_id, "timedOut": True,
                         "state": state, "completed": len(results)})
                time.sleep(interval)
        return results

    def _failed(self, job: QueuedJob, error: Any, state: str) -> QueueJobFailedError:
        code = getattr(error, "code", None) or (type(error).__name__ if error else state)
        message = getattr(error, "message", None) or str(error or state)
        where = f"{job.kind} job {job.id}" + (f" ({job.migration})" if job.migration else "")
        return QueueJobFailedError(
            f"Queue job failed: {where}: {code}: {message}",
            {**job.to_dict(), "groupId": self.group_id, "code": code, "message": message,
             "timedOut": False})


def enqueue_up(
    target: MigronautCelery | Celery,
    file: str | None = None,
    *,
    to: str | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
) -> QueueHandle:
    """Plan what is pending (or ``file``; up to ``to``) and send one ``up`` job per migration.

    The jobs are ``up(name, ordered=True, batch=<shared>, checksum=<planned>)`` in a chain; with
    ``converge_after_up`` a group that reaches the newest migration ends with a converge job
    (or, with nothing pending, a converge job only when a dry run shows drift). A migration that
    waits for background migrations is not sent (``handle.waiting``); naming it as ``file`` is
    ``BACKGROUND_PENDING``."""
    installed = _installed(target)
    validate_actor(requested_by, reason)
    migrator = installed.context.migrator()
    plan = migrator.plan_sequence(file, to=to)
    actor = _actor(requested_by, reason)
    group = uuid.uuid4().hex
    payloads = [{"v": VERSION, "kind": "up", "migration": run.migration, "ordered": True,
                 "batch": plan.batch, "checksum": run.checksum, "groupId": group, **actor}
                for run in plan.runs]
    if (file is None and to is None and plan.waiting is None and migrator.converges_after_up()
            and (payloads or not migrator.converge(dry_run=True).in_sync)):
        payloads.append({"v": VERSION, "kind": "converge", "ordered": True, "groupId": group,
                         **actor})
    return _send(installed, group, payloads, batch=plan.batch, waiting=plan.waiting)


def enqueue_down(
    target: MigronautCelery | Celery,
    file: str | None = None,
    *,
    requested_by: str | None = None,
    reason: str | None = None,
) -> QueueHandle:
    """Revert ``file`` — or the last batch, one ``down`` job per migration, newest first — each
    job ``ordered`` (it refuses unless its migration is the newest applied)."""
    installed = _installed(target)
    validate_down_options(file, requested_by=requested_by, reason=reason)
    rows = installed.context.migrator().dry_run("down", file)
    rows.sort(key=lambda row: (row.applied_at is not None, row.applied_at, row.file),
              reverse=True)
    group = uuid.uuid4().hex
    actor = _actor(requested_by, reason)
    return _send(installed, group, [
        {"v": VERSION, "kind": "down", "migration": row.file, "ordered": True, "groupId": group,
         **actor} for row in rows])


def enqueue_converge(
    target: MigronautCelery | Celery,
    *,
    requested_by: str | None = None,
    reason: str | None = None,
) -> QueueHandle:
    """One ``converge`` job: ordered (with collections declared, refused while migrations are
    pending; with none declared it has nothing to do and succeeds), never pruning."""
    installed = _installed(target)
    validate_actor(requested_by, reason)
    group = uuid.uuid4().hex
    return _send(installed, group, [{"v": VERSION, "kind": "converge", "ordered": True,
                                     "groupId": group, **_actor(requested_by, reason)}])


def _actor(requested_by: str | None, reason: str | None) -> dict[str, str]:
    return {k: v for k, v in (("requestedBy", requested_by), ("reason", reason)) if v}


def _send(installed: MigronautCelery, group: str, payloads: list[dict[str, Any]], *,
          batch: int | None = None, waiting: dict[str, Any] | None = None) -> QueueHandle:
    """Send ``payloads`` as one chain (each job runs after the previous one succeeded)."""
    from celery import chain

    app, queue = installed.app, installed.settings.queue
    jobs: list[QueuedJob] = []
    signatures = []
    for index, payload in enumerate(payloads):
        kind, migration = payload["kind"], payload.get("migration")
        job_id = f"mq-{group}-{index:04d}-{kind}" + (f"-{fragment(migration)}" if migration
                                                     else "")
        jobs.append(QueuedJob(job_id, kind, migration))
        signatures.append(app.signature(installed.task_name(kind), args=(payload,),
                                        queue=queue, task_id=job_id, immutable=True))
    if signatures:
        chain(*signatures).apply_async()
    return QueueHandle(app, group, jobs, batch, waiting)
