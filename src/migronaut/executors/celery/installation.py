"""One installation of migronaut's tasks on a Celery app (what :func:`install` returns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Task

    from migronaut.executors.celery.context import WorkerContext
    from migronaut.executors.celery.settings import CelerySettings

__all__ = ["TASK_OPTIONS", "MigronautCelery", "has_result_backend"]

#: Options every migronaut task is declared with (a task may add its own).
TASK_OPTIONS: dict[str, Any] = {"acks_late": True, "reject_on_worker_lost": True}


@dataclass
class MigronautCelery:
    """migronaut installed on one Celery app: its settings, the per-process worker context and
    the registered tasks (by job kind). The producer methods live on the modules that own the
    kinds and are bound here."""

    app: Celery
    settings: CelerySettings
    context: WorkerContext
    tasks: dict[str, Task] = field(default_factory=dict)

    def task_name(self, kind: str) -> str:
        """The Celery task name of a job kind (``migronaut.up``, ``migronaut.background-lane``)."""
        return f"migronaut.{kind}"


def has_result_backend(app: Celery) -> bool:
    """Whether ``app`` stores results (Celery's ``DisabledBackend`` stores none: a RabbitMQ
    broker without ``result_backend``)."""
    return type(app.backend).__name__ != "DisabledBackend"
