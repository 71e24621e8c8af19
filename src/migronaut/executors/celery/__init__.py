"""migronaut's tasks on a Celery app: migrations and background migrations as queue jobs.

:func:`install` puts the tasks on your own app; :func:`create_app` builds a ready app from the
migronaut config for teams without one (``celery -A migronaut.celery worker -B`` serves both
queues). Two queues, so migrations never wait behind background work: ``celery.queue`` (default
``migronaut``) for ``up``/``down``/``converge``/``sync``, and ``<queue>-background`` for the
coordinator, lane and verify tasks (reference background §6.4).

Every task acks late and is rejected back to the queue when its worker dies; MongoDB's lock,
leases and fenced checkpoints make a redelivered task harmless.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migronaut.executors.celery.background_producer import enqueue_background
from migronaut.executors.celery.context import ConfigSource, WorkerContext
from migronaut.executors.celery.installation import TASK_OPTIONS, MigronautCelery
from migronaut.executors.celery.settings import resolve_settings

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["MigronautCelery", "create_app", "enqueue_background", "install"]

#: Broker URLs kombu serves with its Redis transport.
_REDIS_URLS = ("redis://", "rediss://", "redis+socket://")


def _source(config: Mapping[str, Any] | None, config_path: str | os.PathLike[str] | None,
            cwd: str | os.PathLike[str] | None) -> ConfigSource:
    return ConfigSource(
        config=dict(config) if config is not None else None,
        config_path=None if config_path is None else str(Path(config_path).resolve()),
        cwd=None if cwd is None else str(Path(cwd).resolve()),
    )


def _transport_options(visibility_timeout_s: int) -> dict[str, Any]:
    """Redis: a message unacked by a dead worker comes back after the visibility timeout; the
    sweep that brings it back runs about every 100 s by default — sooner for a short timeout."""
    options: dict[str, Any] = {"visibility_timeout": visibility_timeout_s}
    if visibility_timeout_s < 300:
        options.update(unacked_restore_interval=1, unacked_restore_throttle=1)
    return options


def install(
    app: Celery,
    *,
    config: Mapping[str, Any] | None = None,
    config_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    **options: Any,
) -> MigronautCelery:
    """Register migronaut's tasks, queues, routes and beat entries on ``app``.

    ``config``/``config_path``/``cwd`` are what ``Migrator(...)`` takes (the config is read
    here, once, to check it; each worker process connects on its first task). ``options`` are
    :class:`~migronaut.executors.celery.settings.CelerySettings` keys and win over the config's
    ``celery`` table and the ``MIGRONAUT_CELERY_*`` variables. Unknown options are
    ``CONFIG_INVALID``.
    """
    from migronaut.executors.celery import (
        background_tasks,
        fleet_tasks,
        migration_tasks,
        signals,
    )

    source = _source(config, config_path, cwd)
    table = source.read().celery  # reads and checks the config; does not connect
    settings = resolve_settings(table, options)
    installed = MigronautCelery(app, settings, WorkerContext(source, settings))
    migration_tasks.register(installed, TASK_OPTIONS)
    background_tasks.register(installed, TASK_OPTIONS)
    fleet_tasks.register(installed, TASK_OPTIONS)
    signals.connect(installed)
    return installed


def create_app(
    *,
    config: Mapping[str, Any] | None = None,
    config_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    **options: Any,
) -> tuple[Celery, MigronautCelery]:
    """A Celery app configured for migronaut (broker and result backend from the config's
    ``celery`` table or ``MIGRONAUT_CELERY_BROKER_URL``/``…_RESULT_BACKEND``, default the local
    Redis), with the tasks installed."""
    from celery import Celery
    from kombu.entity import Queue

    from migronaut.executors.celery import signals

    source = _source(config, config_path, cwd)
    settings = resolve_settings(source.read().celery, options)
    broker = settings.broker_url or "redis://127.0.0.1:6379/0"
    app = Celery("migronaut", broker=broker, backend=settings.result_backend or (
        broker if broker.startswith(_REDIS_URLS) else None))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
        result_extended=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(settings.visibility_timeout_s),
        result_backend_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        task_default_queue=settings.queue,
        task_queues=(Queue(settings.queue),  # type: ignore[no-untyped-call]
                     Queue(settings.background_queue_name)),  # type: ignore[no-untyped-call]
    )
    installed = install(app, config=config, config_path=config_path, cwd=cwd, **options)
    if broker.startswith(_REDIS_URLS):
        signals.quiet_redis_polling(app)
    return app, installed
