"""How a background driver rides out an outage: the budget, the backoff and the typed error.

Used by every driver of lanes — :mod:`migronaut.background.coordination.driving` (``run``, inline),
the in-process runner and the live drift watcher — so none of them imports another for it.

Invariant: an outage (a lost connection, an election) is not a failure until it outlasts its
budget (a spec's ``maxOutageMs``); any success ends it.
"""

from __future__ import annotations

import logging
import random
import time

from migronaut.core.context import Cancellation
from migronaut.errors import MigronautError

__all__ = ["DEFAULT_OUTAGE_MS", "DriverOutage"]

#: ``maxOutageMs`` of a spec stored before the setting existed.
DEFAULT_OUTAGE_MS = 300_000


class DriverOutage:
    """A driver's view of an outage (a lost connection, an election): how long it has lasted.

    While it lasts less than the budget, :meth:`ride_out` waits (jittered, doubling up to 2 s)
    and says to try again — the error is not a failure; past the budget it says ``False`` and
    the error counts. Any success :meth:`clear` s it. Used by the ``run`` driver and the runner.
    """

    def __init__(self, logger: logging.Logger, name: str,
                 budget_ms: int = DEFAULT_OUTAGE_MS) -> None:
        self.logger = logger
        self.name = name
        self.budget_s = max(0, budget_ms) / 1000.0
        self.since: float | None = None
        self.tries = 0

    def clear(self) -> None:
        self.since, self.tries = None, 0

    def pause_s(self, error: BaseException) -> float | None:
        """The pause before trying again, or ``None`` when ``error`` counts as a failure."""
        from migronaut.core.retry import is_outage

        if not is_outage(error):
            return None
        now = time.monotonic()
        if self.since is None:
            self.since = now
            message = error.message if isinstance(error, MigronautError) else (
                type(error).__name__)
            self.logger.info("%s: %s — retrying for up to %gs", self.name, message,
                             self.budget_s)
        if now - self.since >= self.budget_s:
            return None
        pause: float = min(2.0, 0.1 * 2 ** min(self.tries, 10)) * random.uniform(0.5, 1.0)
        self.tries += 1
        return pause

    def ride_out(self, error: BaseException, cancellation: Cancellation) -> bool:
        pause = self.pause_s(error)
        if pause is None:
            return False
        cancellation.wait(pause)
        return True
