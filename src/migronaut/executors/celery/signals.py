"""Worker lifecycle: a warm shutdown tells running lanes to stop at their next batch boundary;
a worker process closes its MongoDB clients when it exits; a worker heals on start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from migronaut.errors import RunAbortedError

if TYPE_CHECKING:
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["connect"]


def connect(installed: MigronautCelery) -> None:
    """Connect the worker signals for ``installed`` (weakly held by Celery: keep references)."""
    from celery import signals

    def shutting_down(**_: Any) -> None:
        installed.context.shutdown.cancel(
            RunAbortedError("Worker shutting down: lanes stop at their next batch boundary"))

    def process_shutdown(**_: Any) -> None:
        installed.context.close()

    def ready(**_: Any) -> None:
        # the lane machinery now, not in the first slice (a worker serves the background queue)
        import migronaut.background.lanes  # noqa: F401

        # a worker that starts heals: coordinators for what is runnable (a live chain absorbs
        # its own), takeovers for what looks stalled
        from migronaut.executors.celery.background_tasks import heal

        heal(installed)

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutting_down.connect(shutting_down, weak=False)
    signals.worker_process_shutdown.connect(process_shutdown, weak=False)
