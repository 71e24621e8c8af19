"""The in-process background runner: lane threads that serve every runnable background migration.

Start one from application code (or let ``migronaut background work`` start one)::

    with Migrator(...) as migrator, BackgroundRunner(migrator, lanes=2):
        serve_requests()

Reference background §6.3. ``lanes`` lane loops share the runnable migrations round-robin. A turn
is one slice (:func:`migronaut.background.lanes.slices.run_slice`); a slice that finds no plan
(``stale``) or nothing left to claim (``exhausted``) is followed by one coordinator step (driver
``runner``), so a runner plans, finalizes and completes migrations by itself — any number of
runners, workers and CLI runs, in any number of processes, can serve the same migrations at once.

Invariants:

* the runner never takes the migration lock and has no run id: coordinator steps are serialised
  by the per-migration coordinator lock, lanes by leases; ``maxParallel`` holds across every
  process because the slot index enforces it, and within this process a migration is never worked
  by more lanes than its ``maxParallel``;
* a lane never raises: a failing turn is logged, handed to ``on_error`` and backs that migration
  off for ``min(60 s, 1 s × 2^failures)`` (jittered); an outage (a lost connection, an election)
  is not a failure until it outlasts the migration's ``maxOutageMs``: the migration is looked at
  again within 2 s; a slice that lost its lease takes the next turn at once, but from the
  third in a row each is a failing turn (a lane losing every slice never spins in silence);
  ``busy``/``wait`` answers back off for the
  answer's ``retryAfterMs`` without counting a failure, but a ``busy`` one (a coordinator lock
  held by another process, every slot leased elsewhere) for at most the poll interval, so a
  runner that asks gets its share of the work; the lanes of one
  runner take coordinator steps for one migration one at a time;
* :meth:`BackgroundRunner.stop` is cooperative: lanes finish the batch in flight, checkpoint and
  release their leases (a stop is never counted as a failure), and the threads are joined. Only
  when ``stop(timeout=...)`` gives up waiting are lane threads left behind (daemon threads, which
  end at their next batch boundary; their leases expire after the lock TTL otherwise).

The live drift watcher (reference §6.3/§6.8) is hosted by the runner when asked (``watch=True``)
or, by default, when the config's ``background_drift`` is ``stream`` or ``both``. It needs change
streams: on a server without them (a standalone, the dev server) an explicit ``watch=True`` is
refused by :meth:`BackgroundRunner.start` with ``CONFIG_INVALID``, while the config's default
degrades — a warning, ``on_error`` sees the error, drift is left to the poll (the verifier) and
the lanes serve as usual.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from migronaut._values import int_within, is_int
from migronaut.background.coordination.outage import DEFAULT_OUTAGE_MS, DriverOutage
from migronaut.background.state.fields import understood
from migronaut.core.context import Cancellation, LinkedCancellation
from migronaut.errors import (
    ChecksumMismatchError,
    ConfigInvalidError,
    LockLostError,
    MigrationFileNotFoundError,
    MigronautError,
    RunAbortedError,
    describe_exception,
)

if TYPE_CHECKING:
    import logging

    from migronaut.background.engine import BackgroundEngine
    from migronaut.background.tools.watch import Watcher
    from migronaut.core.config import Config

__all__ = ["BackgroundRunner", "RunnerHost", "RunnerStats", "work"]

#: Per-migration backoff after failing turns: ``min(cap, base × 2^failures)``, jittered.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
#: The runnable list is re-read at most every ``poll_interval_s``; never more often than this.
MIN_POLL_S = 0.01
MAX_LANES = 64
DEFAULT_VERIFY_INTERVAL_S = 600.0
#: Slice outcomes after which the lane simply takes its next turn.
_AGAIN = frozenset({"yielded", "lost", "stopped"})
#: Slice outcomes that mean the migration is not runnable any more: re-read the list.
_SETTLED = frozenset({"paused", "cancelled", "failed"})

#: Slices in a row that lost their lease before each further one counts as a failed turn
#: (warned, handed to ``on_error``, backed off): one lost lease is ordinary (a stall past the
#: TTL, a partition superseded under its lane), a lane that loses every slice must not spin.
LOST_IN_A_ROW = 3

OnError = Callable[[BaseException, "str | None"], Any]


class RunnerHost(Protocol):
    """What a runner serves through: a :class:`~migronaut.Migrator` is one.

    ``background`` connects on first use (so :meth:`BackgroundRunner.start` fails there on a bad
    URI); ``config`` says how drift is handled; ``logger`` gets the runner's own warnings.
    """

    @property
    def background(self) -> BackgroundEngine: ...

    @property
    def config(self) -> Config: ...

    @property
    def logger(self) -> logging.Logger: ...


@dataclass
class RunnerStats:
    """What a runner did so far (thread-safe snapshots through :attr:`BackgroundRunner.stats`)."""

    slices: int = 0
    coordinator_steps: int = 0
    failures: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slices": self.slices,
            "coordinatorSteps": self.coordinator_steps,
            "failures": self.failures,
            "outcomes": dict(self.outcomes),
            "counters": dict(self.counters),
        }


@dataclass
class _Entry:
    name: str
    max_parallel: int


class BackgroundRunner:
    """Lane threads serving the runnable background migrations of ``migrator``'s database.

    ``lanes`` (1–64) lane threads; ``poll_interval_s`` (≥ 0.01, default 5) bounds how often the
    runnable list is re-read and how long an idle lane sleeps; ``names`` restricts the runner to
    those migrations; ``slice_ms`` overrides each migration's ``sliceMs``; ``verify_interval_s``
    (default 600, ``None`` = never) runs the drift poll (``background_on_drift`` decides
    between reopening and reporting);
    ``on_error(error, migration)`` sees every failing turn (what it raises is ignored);
    ``cancellation`` is an outside stop signal (the runner stops when it is set); ``watch``
    hosts the live drift watcher (``None``: when the config's ``background_drift`` is not
    ``poll``; see the module docstring for a server without change streams).

    Options are checked when the runner is built (``CONFIG_INVALID``); :meth:`start` connects, so
    a bad URI fails there, synchronously.
    """

    def __init__(
        self,
        migrator: RunnerHost,
        *,
        lanes: int = 1,
        poll_interval_s: float = 5.0,
        names: Iterable[str] | None = None,
        slice_ms: int | None = None,
        verify_interval_s: float | None = DEFAULT_VERIFY_INTERVAL_S,
        on_error: OnError | None = None,
        cancellation: Cancellation | None = None,
        watch: bool | None = None,
    ) -> None:
        wanted = _checked_options(lanes, poll_interval_s, names, slice_ms, verify_interval_s,
                                  watch)
        self.migrator = migrator
        self.lanes = lanes
        self.poll_interval_s = float(poll_interval_s)
        self.names = wanted
        self.slice_ms = slice_ms
        self.verify_interval_s = verify_interval_s
        self.on_error = on_error
        self._outside = cancellation
        self._cancel: Cancellation = Cancellation()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._entries: list[_Entry] = []
        self._cursor = 0
        self._refresh_at = 0.0
        self._active: dict[str, int] = {}
        self._backoff: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._exhausted: dict[str, float] = {}
        #: slices in a row that lost their lease, per migration
        self._lost: dict[str, int] = {}
        self._coordinator_locks: dict[str, threading.Lock] = {}
        self._stats = RunnerStats()
        self._engine: BackgroundEngine | None = None
        self.watch = watch
        self._watcher: Watcher | None = None
        #: why the hosted watcher could not start (the server has no change streams), if so
        self.watch_error: MigronautError | None = None
        self._outages: dict[str, DriverOutage] = {}
        self._outage_budgets: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether lanes are serving (started, not stopped, at least one lane alive)."""
        return not self._cancel.cancelled and any(t.is_alive() for t in self._threads)

    @property
    def watcher(self) -> Watcher | None:
        """The hosted live drift watcher, when one runs."""
        return self._watcher

    @property
    def stats(self) -> RunnerStats:
        with self._lock:
            return RunnerStats(
                self._stats.slices, self._stats.coordinator_steps, self._stats.failures,
                dict(self._stats.outcomes), dict(self._stats.counters),
            )

    def start(self) -> BackgroundRunner:
        """Connect and start the lane threads (a no-op while already running)."""
        if self.running:
            return self
        self.stop()  # a previous run's threads, if any, are gone before new ones start
        self._engine = self.migrator.background  # connects: a bad URI fails here
        self._cancel = _linked(self._outside)
        with self._lock:
            self._refresh_at = 0.0
            self._entries, self._cursor = [], 0
            self._active.clear()
            self._backoff.clear()
            self._exhausted.clear()
            self._failures.clear()
            self._lost.clear()
        threads = [
            threading.Thread(target=self._lane, name=f"migronaut-runner-lane-{i}", daemon=True)
            for i in range(self.lanes)
        ]
        if self.verify_interval_s is not None:
            threads.append(threading.Thread(target=self._verifier,
                                            name="migronaut-runner-verify", daemon=True))
        self._start_watcher(self._engine)
        self._threads = threads
        for thread in threads:
            thread.start()
        self._engine.logger.debug("Background runner started with %d lane(s)", self.lanes)
        return self

    def _start_watcher(self, engine: BackgroundEngine) -> None:
        """Host the live drift watcher when asked, or when the drift mode says so."""
        config = self.migrator.config
        wanted = self.watch if self.watch is not None else config.background_drift != "poll"
        self.watch_error = None
        if not wanted:
            return
        try:
            self._watcher = engine.watch(on_drift=config.background_on_drift,
                                         cancellation=self._cancel)
        except ConfigInvalidError as refused:
            if self.watch:  # asked for explicitly: refuse, as watching alone would
                raise
            self.watch_error = refused
            engine.logger.warning(
                "⚠ Background runner: the live drift watcher cannot start (%s) — drift is left "
                "to the poll", refused.message)
            self._report(refused, None, warn=False)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop cooperatively and join the lanes; ``True`` when every lane has ended.

        Lanes finish the batch in flight, checkpoint and release their leases. With ``timeout``
        (seconds) the wait is bounded: lanes still busy then are left to end on their own (a
        warning says so; their leases expire after the lock TTL and the work resumes from the last
        checkpoint). Idempotent.
        """
        self._cancel.cancel(RunAbortedError("Background runner stopped", {}))
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.stop(30.0 if deadline is None else max(0.0, deadline - time.monotonic()))
        for thread in self._threads:
            if thread is threading.current_thread():
                continue
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        alive = [t for t in self._threads if t.is_alive() and t is not threading.current_thread()]
        if alive:
            self.migrator.logger.warning(
                "⚠ Background runner: %d lane(s) still busy after %gs — their leases expire "
                "after the lock TTL and the work resumes from the last checkpoint",
                len(alive), timeout or 0,
            )
            self._threads = alive
            return False
        self._threads = []
        return True

    def __enter__(self) -> BackgroundRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lanes ----------------------------------------------------------------------------
    def _lane(self) -> None:
        while not self._cancel.cancelled:
            try:
                self._refresh_if_due()
                picked = self._pick()
                if picked is None:
                    self._cancel.wait(self._idle_s())
                    continue
                try:
                    self._turn(picked)
                finally:
                    with self._lock:
                        self._active[picked.name] -= 1
            except Exception as error:  # the runner itself never throws
                self._report(error, None)
                self._cancel.wait(self.poll_interval_s)

    def _turn(self, entry: _Entry) -> None:
        engine = self._engine
        assert engine is not None
        name = entry.name
        try:
            outcome = self._slice(engine, name)
            if outcome == "lost":
                self._lost_slice(name)
                return
            with self._lock:
                self._lost.pop(name, None)
            if outcome is None or outcome in _AGAIN:
                self._succeeded(name)
                if outcome == "yielded":  # a partition still has work: no need to stay away
                    with self._lock:
                        self._exhausted.pop(name, None)
                return
            if outcome == "busy":
                return  # _slice backed the migration off for the answer's retryAfterMs
            if outcome in _SETTLED:
                self._succeeded(name)
                self._refresh_soon()
                return
            # stale (no current plan) or exhausted (nothing claimable): the coordinator decides.
            # One step at a time per migration in this process (another lane's step would only
            # answer busy); a lane that waited here takes the step after it, which is cheap.
            with self._coordinating(name):
                if self._cancel.cancelled:
                    return
                # (a lane that found nothing to claim glances first: while other lanes work,
                # or once the migration is done, no step under the lock is needed)
                glanced = engine.glance(name) if outcome == "exhausted" else None
                answer = glanced or engine.coordinate(name, driver="runner",
                                                      cancellation=self._cancel)
            with self._lock:
                self._stats.coordinator_steps += 1
            self._succeeded(name)
            if answer.next in ("done", "superseded"):
                self._refresh_soon()
            elif answer.next == "busy":
                # Another process holds the coordinator lock: its step takes milliseconds, so
                # look again within the poll interval rather than the lock's ttl/2.
                wait = (answer.retry_after_ms or 1000) / 1000
                self._back_off(name, min(wait, self.poll_interval_s))
            elif answer.next != "process":
                if answer.reason != "stopping":
                    self._back_off(name, (answer.retry_after_ms or 1000) / 1000)
            elif outcome == "exhausted" and not answer.lanes:
                # The open partitions are leased by other lanes: look again later (or as soon
                # as one of them yields its partition).
                with self._lock:
                    self._exhausted[name] = time.monotonic() + self.poll_interval_s
        except Exception as error:
            if self._cancel.cancelled:
                return  # an error while stopping is not a failure
            self._failed(name, error)

    def _slice(self, engine: BackgroundEngine, name: str) -> str | None:
        """One slice; its outcome, or ``None`` when the migration is not runnable any more."""
        state = engine.store.get(name)
        if state is not None:
            understood(state)  # a status it does not know is STATE_INVALID, not "not runnable"
        if state is None or state.get("status") not in ("blocked", "pending", "running"):
            self._refresh_soon()
            return None
        if state["status"] != "running" or state.get("phase") != "process":
            return "stale"  # nothing to claim before the coordinator has planned
        budget = (state.get("spec") or {}).get("maxOutageMs")
        if is_int(budget):
            self._outage_budgets[name] = budget
        try:
            result = engine.run_slice(name, slice_ms=self.slice_ms, cancellation=self._cancel,
                                      state=state)
        except (ChecksumMismatchError, MigrationFileNotFoundError):
            # A deploy in progress: the coordinator answers wait/checksum (warned once).
            return "stale"
        outcome = str(result.outcome)
        with self._lock:
            self._stats.slices += 1
            self._stats.outcomes[outcome] = self._stats.outcomes.get(outcome, 0) + 1
            for key, value in result.counters.items():
                if isinstance(value, int) and value:
                    self._stats.counters[key] = self._stats.counters.get(key, 0) + value
        if outcome == "busy":
            # Every slot is leased (by lanes elsewhere, which re-claim the moment they yield):
            # look again within the poll interval rather than the lease's ttl/2, so the work
            # spreads over every runner that asks.
            retry = result.retry_after_ms or max(1, engine.ttl_ms // 2)
            self._back_off(name, min(retry / 1000, self.poll_interval_s))
        return outcome

    def _verifier(self) -> None:
        assert self._engine is not None and self.verify_interval_s is not None
        engine = self._engine
        config = self.migrator.config
        while not self._cancel.wait(self.verify_interval_s):
            try:
                result = engine.verify(on_drift=config.background_on_drift,
                                       drift_mode=config.background_drift)
            except Exception as error:
                self._report(error, None)
                continue
            if isinstance(result, dict) and result.get("drift"):
                self._refresh_soon()

    # -- the shared list, round-robin, backoff --------------------------------------------
    def _refresh_if_due(self) -> None:
        if time.monotonic() < self._refresh_at:
            return
        if not self._refreshing.acquire(blocking=False):
            return  # another lane refreshes; use the list as it is
        try:
            engine = self._engine
            assert engine is not None
            try:
                rows = engine.runnable()
            finally:
                self._refresh_at = time.monotonic() + self.poll_interval_s
            entries = [
                _Entry(str(row["migration"]), max(1, int(row.get("maxParallel") or 1)))
                for row in rows
                if self.names is None or row["migration"] in self.names
            ]
            with self._lock:
                self._entries = entries
                self._cursor %= max(1, len(entries))
                known = {e.name for e in entries}
                for table in (self._backoff, self._exhausted, self._failures, self._lost):
                    for gone in [n for n in table if n not in known]:
                        del table[gone]
        finally:
            self._refreshing.release()

    def _coordinating(self, name: str) -> threading.Lock:
        with self._lock:
            lock = self._coordinator_locks.get(name)
            if lock is None:
                lock = self._coordinator_locks[name] = threading.Lock()
            return lock

    def _refresh_soon(self) -> None:
        self._refresh_at = 0.0

    def _pick(self) -> _Entry | None:
        """The next migration round-robin that is not backing off and has a free lane here."""
        now = time.monotonic()
        with self._lock:
            count = len(self._entries)
            for offset in range(count):
                index = (self._cursor + offset) % count
                entry = self._entries[index]
                if max(self._backoff.get(entry.name, 0.0),
                       self._exhausted.get(entry.name, 0.0)) > now:
                    continue
                if self._active.get(entry.name, 0) >= entry.max_parallel:
                    continue
                self._active[entry.name] = self._active.get(entry.name, 0) + 1
                self._cursor = (index + 1) % count
                return entry
        return None

    def _idle_s(self) -> float:
        """How long an idle lane sleeps: until a backoff ends or the list is due, ≤ the poll."""
        now = time.monotonic()
        with self._lock:
            wake = [until for table in (self._backoff, self._exhausted)
                    for until in table.values() if until > now]
        wake.append(self._refresh_at)
        return min(self.poll_interval_s, max(MIN_POLL_S, min(wake) - now))

    def _back_off(self, name: str, seconds: float) -> None:
        with self._lock:
            until = time.monotonic() + max(0.0, seconds)
            self._backoff[name] = max(self._backoff.get(name, 0.0), until)

    def _lost_slice(self, name: str) -> None:
        """A slice that lost its partition's lease: the next turn at once, unless it is the
        :data:`LOST_IN_A_ROW`-th in a row — then a failed turn (counted, warned, backed off)."""
        with self._lock:
            lost = self._lost[name] = self._lost.get(name, 0) + 1
        if lost < LOST_IN_A_ROW:
            return
        self._failed(name, LockLostError(
            f"Background migration {name}: {lost} slices in a row lost their partition's "
            "lease (another lane took it, or it was reaped or ended under them)",
            {"migration": name, "lostInARow": lost},
        ))

    def _succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name, None)
            outage = self._outages.get(name)
        if outage is not None:
            outage.clear()

    def _failed(self, name: str, error: BaseException) -> None:
        with self._lock:
            outage = self._outages.get(name)
            if outage is None:
                outage = self._outages[name] = DriverOutage(
                    self.migrator.logger, name,
                    self._outage_budgets.get(name, DEFAULT_OUTAGE_MS))
        pause = outage.pause_s(error)
        if pause is not None:  # an outage, within its budget: not a failure
            self._back_off(name, pause)
            self.migrator.logger.debug("Background runner: %s: an outage — again in %.1fs",
                                       name, pause)
            return
        with self._lock:
            failures = self._failures.get(name, 0)
            self._failures[name] = failures + 1
            self._stats.failures += 1
        delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** failures * random.uniform(0.8, 1.2))
        self._back_off(name, delay)
        self._report(error, name, retry_s=delay)

    def _report(self, error: BaseException, name: str | None, *,
                retry_s: float | None = None, warn: bool = True) -> None:
        if warn:
            message = error.message if isinstance(error, MigronautError) else \
                describe_exception(error)
            where = f"{name}: " if name else ""
            after = f" — retrying in {retry_s:.1f}s" if retry_s is not None else ""
            self.migrator.logger.warning("⚠ Background runner: %sa turn failed (%s)%s", where,
                                         message, after)
        if self.on_error is not None:
            try:
                self.on_error(error, name)
            except Exception:  # a throwing on_error is ignored
                pass


def _checked_options(
    lanes: int, poll_interval_s: float, names: Iterable[str] | None, slice_ms: int | None,
    verify_interval_s: float | None, watch: bool | None,
) -> frozenset[str] | None:
    """Refuse a bad runner option (``CONFIG_INVALID``); the wanted names, if any."""
    if not int_within(lanes, 1, MAX_LANES):
        raise ConfigInvalidError(
            f"lanes must be an integer from 1 to {MAX_LANES} (got {lanes!r})",
            {"option": "lanes"},
        )
    if isinstance(poll_interval_s, bool) or not isinstance(poll_interval_s, (int, float)) \
            or not poll_interval_s >= MIN_POLL_S:
        raise ConfigInvalidError(
            f"poll_interval_s must be a number of seconds ≥ {MIN_POLL_S} "
            f"(got {poll_interval_s!r})",
            {"option": "poll_interval_s"},
        )
    if slice_ms is not None and (not is_int(slice_ms)
                                 or not 1 <= slice_ms <= 3_600_000):
        raise ConfigInvalidError(
            f"slice_ms must be an integer from 1 to 3600000 (got {slice_ms!r})",
            {"option": "slice_ms"},
        )
    if verify_interval_s is not None and (
        isinstance(verify_interval_s, bool)
        or not isinstance(verify_interval_s, (int, float))
        or not verify_interval_s >= 0.1
    ):
        raise ConfigInvalidError(
            f"verify_interval_s must be None or a number of seconds ≥ 0.1 "
            f"(got {verify_interval_s!r})",
            {"option": "verify_interval_s"},
        )
    if watch is not None and not isinstance(watch, bool):
        raise ConfigInvalidError(
            f"watch must be True, False or None (got {watch!r})", {"option": "watch"})
    wanted = None if names is None else frozenset(names)
    if wanted is not None and not all(isinstance(n, str) and n for n in wanted):
        raise ConfigInvalidError("names must be migration file names", {"option": "names"})
    return wanted


def _linked(outside: Cancellation | None) -> Cancellation:
    """A fresh cancellation for one start, also set when the outside one is."""
    if outside is None:
        return Cancellation()
    return LinkedCancellation(outside)


def work(
    migrator: RunnerHost,
    *,
    lanes: int = 1,
    cancellation: Cancellation,
    poll_interval_s: float = 5.0,
    names: Iterable[str] | None = None,
) -> RunnerStats:
    """The worker loop of ``migronaut background work``: serve until ``cancellation`` is set.

    Starts a :class:`BackgroundRunner` (coordinator duties included), waits for the
    cancellation, then stops it cooperatively (lanes finish their batch, checkpoint and release
    their leases) and returns what it did. Any number of workers may run at once, on any hosts.
    """
    runner = BackgroundRunner(migrator, lanes=lanes, poll_interval_s=poll_interval_s,
                              names=names, cancellation=cancellation)
    runner.start()
    try:
        while not cancellation.wait(1.0):
            pass
    finally:
        runner.stop()
    return runner.stats
