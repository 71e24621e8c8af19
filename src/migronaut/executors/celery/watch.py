"""The worker's watch over coordinator chains: every half ``chain_ttl_ms`` a worker looks in
MongoDB for a runnable background migration whose chain stopped renewing its heartbeat, and
sends it a takeover — so a chain whose worker was killed is taken over about ``chain_ttl_ms``
after its next run was due, by any surviving worker, without beat or an operator.

It only takes over dead chains: a migration nobody enqueued waits for a heal (worker start, the
verify tick, ``background enqueue``, ``up`` on a project with a ``celery`` table).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from migronaut.executors.celery.background_producer import take_over_dead_chains
from migronaut.executors.celery.failures import outbound_error
from migronaut.executors.celery.tenant_heals import heal_tenants

if TYPE_CHECKING:
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["ChainWatch"]

logger = logging.getLogger("migronaut")


class ChainWatch:
    """A daemon thread of the worker's main process; it ends with the warm shutdown."""

    def __init__(self, installed: MigronautCelery) -> None:
        self.installed = installed
        self.thread: threading.Thread | None = None

    @property
    def interval_s(self) -> float:
        return self.installed.settings.chain_ttl_ms / 2000

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="migronaut-chain-watch",
                                           daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        shutdown = self.installed.context.shutdown
        while not shutdown.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """One look, at the worker's own database's chains and at the fleet tenants' listed
        as having background work; never raises (the next tick tries again)."""
        try:
            take_over_dead_chains(self.installed)
        except Exception as error:
            logger.warning("⚠ the coordinator chain watch failed (%s) — it looks again in %gs",
                           outbound_error(error).message, self.interval_s)
        heal_tenants(self.installed, dead_only=True)
