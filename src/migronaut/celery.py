"""migronaut on Celery (extra ``celery``): ``install(app)`` on your own app, or the ready app.

``celery -A migronaut.celery worker -B`` starts a worker that serves both queues (and beat) with
the app :func:`create_app` builds from the migronaut config in the working directory.
"""

from __future__ import annotations

from typing import Any

from migronaut.executors.celery import MigronautCelery, create_app, enqueue_background, install
from migronaut.executors.celery.fleet_tasks import FleetEnqueued, enqueue_fleet
from migronaut.executors.celery.producer import (
    QueueHandle,
    enqueue_converge,
    enqueue_down,
    enqueue_up,
)

__all__ = ["FleetEnqueued", "MigronautCelery", "QueueHandle", "create_app", "enqueue_background",
           "enqueue_converge", "enqueue_down", "enqueue_fleet", "enqueue_up", "install"]


def __getattr__(name: str) -> Any:
    # ``celery -A migronaut.celery`` looks for ``app``: build it from the config on first use.
    if name in ("app", "migronaut"):
        app, installed = create_app()
        globals().update(app=app, migronaut=installed)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
