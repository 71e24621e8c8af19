"""Pacing of background batches: the AIMD controller, pauses, the user hook, replication lag.

Invariants:

* the controller never exceeds the author's ``batchSize`` (resolution clamps ``maxBatchSize``) nor
  ``maxPauseMs``, decreases at most once per round trip and reports a change at most every 10 s,
  carrying the worst reason seen since the last report (reference background §4.8);
* every wait is abortable through a :class:`~migronaut.core.context.Cancellation`;
* replication lag is read at most every 5 s per client (the replica config at most every 60 s),
  and a server that cannot answer (``replSetGetStatus`` unsupported, mongos, standalone, no
  ``clusterMonitor`` role) turns lag checking off for the process without breaking any lane —
  error 13 warns once, everything else is quiet.

Nothing here writes to MongoDB; the controller's state is persisted by the lane's checkpoint
(partition ``throttle {batchSize, pauseMs}``) and seeds the next controller of the process.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from migronaut.core._calls import call_user

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.database import Database

    from migronaut.core.context import Cancellation

__all__ = [
    "AdaptiveController",
    "Throttle",
    "ThrottleContext",
    "ThrottleReport",
    "controller_for",
    "replication_lag_ms",
    "reset_controllers",
]

#: Report a controller change at most this often (seconds).
REPORT_INTERVAL_S = 10.0
#: First pause when the batch size is already at its minimum (ms).
FIRST_BACKOFF_PAUSE_MS = 100
#: Replication lag: status read interval, config read interval, wait step (seconds).
LAG_READ_INTERVAL_S = 5.0
LAG_CONFIG_INTERVAL_S = 60.0
LAG_WAIT_STEP_S = 1.0

#: Reasons ranked for "the worst since the last report".
_RANK = {"recover": 0, "slow": 1, "overload": 2}
#: Server answers meaning "no replica-set status here" (mongos, standalone, not a command).
_LAG_QUIET_CODES = frozenset({59, 76, 115})
_LAG_QUIET_TEXT = ("not supported", "unsupported", "no such command", "not running with --replset")

_log = logging.getLogger("migronaut.background")


# --------------------------------------------------------------------------- AIMD controller


@dataclass(frozen=True)
class ThrottleReport:
    """A controller change worth telling (event ``background:throttle``)."""

    reason: str
    batch_size: int
    pause_ms: int


class AdaptiveController:
    """Additive-increase / multiplicative-decrease sizing of batches (reference §4.8).

    ``record()`` judges one batch: slow (latency above the target) or overloaded → halve the batch
    size down to the minimum, then double an extra pause (starting at 100 ms, capped by
    ``max_pause_ms``); healthy → first halve the pause, then grow the size by
    ``max(1, max_batch_size // 20)``. The first judged batch only warms up unless the controller
    was seeded from a saved state. Thread-safe: the lanes of a process share one controller per
    migration (and shard group).
    """

    def __init__(
        self,
        *,
        target_latency_ms: float,
        min_batch_size: int,
        max_batch_size: int,
        max_pause_ms: int,
        seed: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target_latency_ms = float(target_latency_ms)
        self.max_batch_size = max(1, int(max_batch_size))
        self.min_batch_size = max(1, min(int(min_batch_size), self.max_batch_size))
        self.max_pause_ms = max(0, int(max_pause_ms))
        self._clock = clock
        self._lock = threading.Lock()
        seeded_size = _int_or_none((seed or {}).get("batchSize"))
        seeded_pause = _int_or_none((seed or {}).get("pauseMs"))
        self._size = self.max_batch_size
        self._pause = 0
        if seeded_size is not None:
            self._size = min(self.max_batch_size, max(self.min_batch_size, seeded_size))
        if seeded_pause is not None:
            self._pause = min(self.max_pause_ms, max(0, seeded_pause))
        self._warm = seeded_size is not None or seeded_pause is not None
        self._last_decrease: float | None = None
        self._last_report: float | None = None
        self._pending: str | None = None

    @classmethod
    def from_spec(
        cls,
        adaptive: Mapping[str, Any],
        *,
        seed: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> AdaptiveController:
        """A controller from the resolved spec's ``adaptive`` object (camelCase keys)."""
        return cls(
            target_latency_ms=adaptive["targetLatencyMs"],
            min_batch_size=adaptive["minBatchSize"],
            max_batch_size=adaptive["maxBatchSize"],
            max_pause_ms=adaptive["maxPauseMs"],
            seed=seed,
            clock=clock,
        )

    @property
    def batch_size(self) -> int:
        return self._size

    @property
    def pause_ms(self) -> int:
        return self._pause

    def state(self) -> dict[str, int]:
        """What a checkpoint saves on the partition (``throttle``)."""
        with self._lock:
            return {"batchSize": self._size, "pauseMs": self._pause}

    def record(self, latency_ms: float, *, overloaded: bool = False) -> ThrottleReport | None:
        """Judge one batch; returns a report when a change is due to be told."""
        with self._lock:
            now = self._clock()
            if not self._warm:
                self._warm = True
                return None
            reason: str | None = None
            if overloaded or latency_ms > self.target_latency_ms:
                window_s = max(latency_ms, 1.0) / 1000.0
                if self._last_decrease is None or now - self._last_decrease >= window_s:
                    reason = self._decrease("overload" if overloaded else "slow")
                    self._last_decrease = now
            elif self._pause > 0 or self._size < self.max_batch_size:
                if self._pause > 0:
                    self._pause //= 2
                else:
                    step = max(1, self.max_batch_size // 20)
                    self._size = min(self.max_batch_size, self._size + step)
                reason = "recover"
            if reason is not None and (
                self._pending is None or _RANK[reason] > _RANK[self._pending]
            ):
                self._pending = reason
            return self._maybe_report(now)

    def _decrease(self, reason: str) -> str | None:
        if self._size > self.min_batch_size:
            self._size = max(self.min_batch_size, self._size // 2)
            return reason
        pause = min(self.max_pause_ms, max(FIRST_BACKOFF_PAUSE_MS, self._pause * 2))
        if pause != self._pause:
            self._pause = pause
            return reason
        return None

    def _maybe_report(self, now: float) -> ThrottleReport | None:
        if self._pending is None:
            return None
        if self._last_report is not None and now - self._last_report < REPORT_INTERVAL_S:
            return None
        report = ThrottleReport(self._pending, self._size, self._pause)
        self._pending = None
        self._last_report = now
        return report


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


_controllers: dict[tuple[Any, ...], AdaptiveController] = {}
_controllers_lock = threading.Lock()


def controller_for(
    key: tuple[Any, ...],
    adaptive: Mapping[str, Any],
    *,
    seed: Mapping[str, Any] | None = None,
) -> AdaptiveController:
    """The process's controller for ``key`` (database, migration, registration, group).

    Created on first use, seeded from the saved ``throttle`` state of the partition that asked;
    a change of the adaptive settings (a repin) makes a fresh controller.
    """
    full_key = (*key, tuple(sorted(adaptive.items())))
    with _controllers_lock:
        controller = _controllers.get(full_key)
        if controller is None:
            controller = AdaptiveController.from_spec(adaptive, seed=seed)
            _controllers[full_key] = controller
        return controller


def reset_controllers() -> None:
    """Forget every process-wide controller (tests, and a runner that starts over)."""
    with _controllers_lock:
        _controllers.clear()


# ------------------------------------------------------------------------ replication lag


def replication_lag_ms(
    status: Mapping[str, Any], config: Mapping[str, Any] | None = None
) -> float:
    """Primary optime minus the worst counting secondary's, in ms (0 when nothing to compare).

    Arbiters never count; with ``config`` (the ``replSetGetConfig`` answer's ``config``), hidden
    members and delayed members (``secondaryDelaySecs``/``slaveDelay`` > 0) do not count either.
    Without a config every secondary counts.
    """
    excluded: set[Any] = set()
    for member in (config or {}).get("members", ()) or ():
        delay = member.get("secondaryDelaySecs", member.get("slaveDelay", 0)) or 0
        if member.get("hidden") or delay > 0 or member.get("arbiterOnly"):
            excluded.add(member.get("_id"))
    primary: datetime | None = None
    worst: datetime | None = None
    for member in status.get("members", ()) or ():
        state = member.get("stateStr")
        optime = member.get("optimeDate")
        if not isinstance(optime, datetime):
            continue
        if state == "PRIMARY":
            primary = optime
        elif state == "SECONDARY" and member.get("_id") not in excluded:
            worst = optime if worst is None or optime < worst else worst
    if primary is None or worst is None:
        return 0.0
    return max(0.0, (primary - worst).total_seconds() * 1000.0)


class _LagMonitor:
    """Per-client lag reader shared by the lanes of a process (throttled, self-disabling)."""

    def __init__(self, client: MongoClient[Any]) -> None:
        self._client_ref = weakref.ref(client)
        self._lock = threading.Lock()
        self.off = False
        self._lag: float = 0.0
        self._read_at: float | None = None
        self._config: Mapping[str, Any] | None = None
        self._config_at: float | None = None

    def lag_ms(self, *, fresh: bool, logger: logging.Logger) -> float | None:
        """Current lag, or ``None`` when lag checking is off for this client."""
        with self._lock:
            if self.off:
                return None
            now = time.monotonic()
            if not fresh and self._read_at is not None and now - self._read_at < (
                LAG_READ_INTERVAL_S
            ):
                return self._lag
            client = self._client_ref()
            if client is None:
                return None
            try:
                status = client.admin.command("replSetGetStatus")
            except Exception as error:
                self._turn_off(error, logger)
                return None
            if self._config_at is None or now - self._config_at >= LAG_CONFIG_INTERVAL_S:
                self._config_at = now
                try:
                    self._config = client.admin.command("replSetGetConfig").get("config")
                except Exception:  # unreadable config: every secondary counts
                    self._config = None
            self._lag = replication_lag_ms(status, self._config)
            self._read_at = now
            return self._lag

    def _turn_off(self, error: Exception, logger: logging.Logger) -> None:
        global _warned_unauthorized
        self.off = True
        code = getattr(error, "code", None)
        text = str(error).lower()
        if code == 13:
            if not _warned_unauthorized:
                _warned_unauthorized = True
                logger.warning(
                    "Cannot read replication lag (replSetGetStatus needs the clusterMonitor "
                    "role) — background batches are not paced by lag"
                )
            return
        if code in _LAG_QUIET_CODES or any(t in text for t in _LAG_QUIET_TEXT):
            return
        logger.debug("replication lag unreadable, lag checking off: %s", type(error).__name__)


_warned_unauthorized = False
_monitors: weakref.WeakKeyDictionary[Any, _LagMonitor] = weakref.WeakKeyDictionary()
_monitors_lock = threading.Lock()


def _monitor_for(client: MongoClient[Any]) -> _LagMonitor:
    with _monitors_lock:
        monitor = _monitors.get(client)
        if monitor is None:
            monitor = _LagMonitor(client)
            _monitors[client] = monitor
        return monitor


# -------------------------------------------------------------------------------- Throttle


@dataclass(frozen=True)
class ThrottleContext:
    """The argument of the user's ``throttle(ctx)`` hook; a positive return is an extra pause."""

    name: str
    collection: str | None
    generation: int
    partition: str
    batch_size: int
    cancellation: Cancellation


class Throttle:
    """What a lane waits for before each batch (reference §4.8), in order:

    1. ``pauseMs`` (not before the lane's first batch) plus the controller's extra pause;
    2. the user's ``throttle(ctx)`` hook — a positive number is an extra pause in ms;
    3. replication lag above ``maxReplicationLagMs``: wait 1 s and re-read while it lasts (this
       marks the batch "lagged", an overload signal for the controller).

    Every wait returns early when ``cancellation`` is set; the lane checks it afterwards.
    """

    def __init__(
        self,
        *,
        name: str,
        spec: Mapping[str, Any],
        hook: Callable[[ThrottleContext], Any] | None,
        db: Database[Any] | None,
        cancellation: Cancellation,
        logger: logging.Logger,
    ) -> None:
        self.name = name
        self.pause_ms = int(spec.get("pauseMs", 0) or 0)
        max_lag = spec.get("maxReplicationLagMs", False)
        self.max_lag_ms: float | None = (
            None if max_lag is False or max_lag is None else float(max_lag)
        )
        self.collection = spec.get("collection")
        self._hook = hook
        self._cancellation = cancellation
        self._logger = logger
        self._monitor = (
            _monitor_for(db.client)
            if db is not None and self.max_lag_ms is not None
            else None
        )
        self._lagged = False

    def before_batch(
        self,
        *,
        generation: int,
        partition: str,
        batch_size: int,
        extra_pause_ms: int = 0,
        first: bool = False,
    ) -> bool:
        """Wait as the pacing rules say; ``False`` when the cancellation cut a wait short."""
        pause = (0 if first else self.pause_ms) + max(0, extra_pause_ms)
        if pause > 0 and self._cancellation.wait(pause / 1000.0):
            return False
        if self._hook is not None:
            extra = call_user(
                self._hook,
                ThrottleContext(
                    name=self.name,
                    collection=self.collection,
                    generation=generation,
                    partition=partition,
                    batch_size=batch_size,
                    cancellation=self._cancellation,
                ),
            )
            if (
                isinstance(extra, (int, float))
                and not isinstance(extra, bool)
                and extra > 0
                and self._cancellation.wait(float(extra) / 1000.0)
            ):
                return False
        return self._wait_for_lag()

    def _wait_for_lag(self) -> bool:
        if self._monitor is None or self.max_lag_ms is None:
            return not self._cancellation.cancelled
        lag = self._monitor.lag_ms(fresh=False, logger=self._logger)
        while lag is not None and lag > self.max_lag_ms:
            self._lagged = True
            if self._cancellation.wait(LAG_WAIT_STEP_S):
                return False
            lag = self._monitor.lag_ms(fresh=True, logger=self._logger)
        return not self._cancellation.cancelled

    def take_lagged(self) -> bool:
        """Whether a lag wait happened since the last call (an overload signal)."""
        lagged, self._lagged = self._lagged, False
        return lagged
