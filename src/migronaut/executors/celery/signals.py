"""Worker lifecycle: a warm shutdown tells running lanes to stop at their next batch boundary;
a worker process closes its MongoDB clients when it exits; a worker heals on start and then
watches for dead coordinator chains; the ready app's worker polls a Redis broker less often."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from migronaut.errors import RunAbortedError

if TYPE_CHECKING:
    from celery import Celery

    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["REDIS_BRPOP_TIMEOUT_S", "connect", "quiet_redis_polling"]

#: The ready app's worker waits this long in each BRPOP on a Redis broker (kombu's default, 1 s,
#: wakes an idle consumer loop every second to ask again). A message still arrives the moment it
#: is pushed: the timeout only says when an empty wait ends.
REDIS_BRPOP_TIMEOUT_S = 5


def connect(installed: MigronautCelery) -> None:
    """Connect the worker signals for ``installed`` (weakly held by Celery: keep references)."""
    from celery import signals

    from migronaut.executors.celery.watch import ChainWatch

    watch = ChainWatch(installed)

    def shutting_down(**_: Any) -> None:
        installed.context.shutdown.cancel(
            RunAbortedError("Worker shutting down: lanes stop at their next batch boundary"))

    def process_shutdown(**_: Any) -> None:
        installed.context.close()

    def ready(**_: Any) -> None:
        # the lane machinery now, not in the first slice (a worker serves the background queue)
        import migronaut.background.lanes.slices  # noqa: F401

        # a worker that starts heals: coordinators for what is runnable (a live chain absorbs
        # its own), takeovers for what looks stalled — in its database and the fleet tenants'
        from migronaut.executors.celery.background_tasks import heal
        from migronaut.executors.celery.tenant_heals import heal_tenants

        heal(installed)
        heal_tenants(installed)
        # and watches the chains: one whose worker dies is taken over within about a minute
        watch.start()

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutting_down.connect(shutting_down, weak=False)
    signals.worker_process_shutdown.connect(process_shutdown, weak=False)


def quiet_redis_polling(app: Celery) -> None:
    """Make a worker of ``app`` (its broker Redis) block up to :data:`REDIS_BRPOP_TIMEOUT_S` in
    each BRPOP (kombu takes the ``polling_interval`` transport option as the BRPOP timeout):
    an idle consumer loop wakes about half as often (docs/benchmarks.md, the Celery section).

    Only for a worker that runs kombu's event loop — the option is also the sleep between empty
    polls of a synchronous consumer (a green pool's worker, a control client), which would
    receive later — and only for the ready app: a user's own app keeps its broker settings."""
    from celery import signals

    conf = app.conf

    def worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or not getattr(sender, "use_eventloop", False):
            return
        options = dict(conf.broker_transport_options or {})
        options.setdefault("polling_interval", REDIS_BRPOP_TIMEOUT_S)
        conf.broker_transport_options = options

    signals.worker_init.connect(worker_init, weak=False)
