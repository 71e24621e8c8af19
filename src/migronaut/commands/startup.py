"""``run_migrations``: apply everything pending at application start-up, waiting for a peer's lock.

With ``on_lock_held="wait"`` a process that finds the lock held waits for the holder (a peer
replica booting at the same time) and then applies whatever is still pending.

Invariants: the wait is bounded by *stall* time — re-armed whenever the holder's heartbeat
advances — and never waits on a lock document nobody can read (only ``unlock`` frees it); a stop
event stops the wait between polls and the run between migrations; the migrator is closed
whatever happens.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from migronaut._values import int_within
from migronaut.commands.migrate import check_on_background_pending
from migronaut.core.results import MigrationSummary
from migronaut.errors import (
    ConfigInvalidError,
    LockAlreadyHeldError,
    MigronautError,
    RunAbortedError,
)

if TYPE_CHECKING:
    import logging

    from migronaut.core.config import Config
    from migronaut.core.results import RunResult
    from migronaut.observability.telemetry import Telemetry

__all__ = ["Startable", "Stopper", "check_startup_options", "retry_while_lock_held",
           "run_at_startup"]


class Stopper(Protocol):
    """What stops a lock wait between polls: a ``threading.Event`` or a
    :class:`~migronaut.core.context.Cancellation` (``wait`` returns ``True`` once stopped)."""

    def wait(self, timeout: float | None = ...) -> bool: ...


class Startable(Protocol):
    """What start-up drives: a :class:`~migronaut.Migrator` (or the asyncio API's engine)."""

    @property
    def config(self) -> Config: ...

    @property
    def logger(self) -> logging.Logger: ...

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def _waiting(self) -> list[dict[str, Any]]: ...

    @property
    def _last_converge(self) -> Any: ...

    def connect(self) -> None: ...

    def up(self, *, no_lock: bool,
           on_background_pending: Literal["error", "stop"]) -> list[RunResult]: ...

    def stop(self, reason: str) -> None: ...

    def close(self) -> None: ...


Target = TypeVar("Target", bound=Startable)
Result = TypeVar("Result")


class _Waiter(Protocol):
    """What a lock wait reads from the migrator: its config, logger and telemetry."""

    @property
    def config(self) -> Config: ...

    @property
    def logger(self) -> logging.Logger: ...

    @property
    def telemetry(self) -> Telemetry: ...


def retry_while_lock_held(
    migrator: _Waiter,
    attempt: Callable[[], Result],
    *,
    timeout_ms: int | None,
    poll_interval_ms: int = 500,
    stop_event: Stopper | None = None,
) -> Result:
    """``attempt()`` (a locked run), retried while it is refused with ``LOCK_ALREADY_HELD``
    (reference core §5.5): the wait is bounded by stall time (``timeout_ms``, default
    ``max(90 s, 1.5 × the holder's TTL)``, re-armed while the holder's heartbeat advances); a
    timeout re-raises the refusal with ``context.timedOut``; ``stop_event`` aborts between polls
    (``RUN_ABORTED``). A lock document nobody can read is never waited on."""
    wait = _LockWait(migrator, timeout_ms=timeout_ms, poll_interval_ms=poll_interval_ms,
                     stop_event=stop_event)
    return wait.call(attempt, wait_for_lock=True)


def check_startup_options(
    on_lock_held: Any, on_background_pending: Any, lock_wait_timeout_ms: Any,
    lock_poll_interval_ms: Any, *, no_lock: Any = False, stop_event: Any = None,
    on_migrator: Any = None, config_path: Any = None, cwd: Any = None,
) -> None:
    """Refuse a bad option before any migrator exists: ``CONFIG_INVALID`` naming it
    (``context.option``), never a ``TypeError`` after connecting."""
    if on_lock_held not in ("throw", "wait"):
        raise _bad_option("on_lock_held", "must be 'throw' or 'wait'", on_lock_held)
    check_on_background_pending(on_background_pending)
    for option, value, optional in (("lock_wait_timeout_ms", lock_wait_timeout_ms, True),
                                    ("lock_poll_interval_ms", lock_poll_interval_ms, False)):
        if value is None and optional:
            continue
        if not int_within(value, 1, 2**31 - 1):
            raise _bad_option(option, "must be a positive integer", value)
    if not isinstance(no_lock, bool):
        raise _bad_option("no_lock", "must be True or False", no_lock)
    if stop_event is not None and not callable(getattr(stop_event, "wait", None)):
        raise _bad_option("stop_event", "must be a threading.Event (or None)", stop_event)
    if on_migrator is not None and not callable(on_migrator):
        raise _bad_option("on_migrator", "must be a callable taking the migrator (or None)",
                          on_migrator)
    for option, value in (("config_path", config_path), ("cwd", cwd)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise _bad_option(option, "must be a path (or None)", value)


def _bad_option(option: str, rule: str, value: Any) -> ConfigInvalidError:
    return ConfigInvalidError(f"{option} {rule} (got {value!r})",
                              {"option": option})


def run_at_startup(
    migrator: Target,
    *,
    on_lock_held: Literal["throw", "wait"],
    on_background_pending: Literal["error", "stop"],
    lock_wait_timeout_ms: int | None,
    lock_poll_interval_ms: int,
    no_lock: bool,
    stop_event: threading.Event | None,
    on_migrator: Callable[[Target], None] | None,
) -> MigrationSummary:
    """Apply every pending migration with ``migrator`` (closed at the end); see the module."""
    finished = threading.Event()
    if stop_event is not None:
        _forward_stop(stop_event, migrator, finished)
    try:
        if on_migrator is not None:
            on_migrator(migrator)
        migrator.connect()
        wait = _LockWait(migrator, timeout_ms=lock_wait_timeout_ms,
                         poll_interval_ms=lock_poll_interval_ms, stop_event=stop_event)
        applied = wait.call(lambda: migrator.up(no_lock=no_lock,
                                                on_background_pending=on_background_pending),
                            wait_for_lock=on_lock_held == "wait")
        attempts = wait.attempts
        waiting = list(migrator._waiting)
        return MigrationSummary(
            applied=applied,
            up_to_date=not waiting and not any(r.status == "applied" for r in applied),
            waited=wait.waited,
            waited_ms=int((time.monotonic() - wait.started) * 1000) if wait.waited else 0,
            attempts=attempts,
            waiting=waiting if on_background_pending == "stop" else None,
            converge=migrator._last_converge,
        )
    finally:
        finished.set()
        migrator.close()


def _forward_stop(stop_event: threading.Event, migrator: Startable,
                  finished: threading.Event) -> None:
    """The stop event also stops a run between migrations (reference core §8.4), not only the
    wait between lock polls: forward it to ``Migrator.stop()`` until ``finished``."""

    def forward() -> None:
        while not finished.is_set():
            if stop_event.wait(0.05):
                migrator.stop("Run stopped by request")
                return

    threading.Thread(target=forward, name="migronaut-stop-event", daemon=True).start()


class _LockWait:
    """One start-up's wait for a peer's lock: polls backing off (jittered, at most 5 s and a
    quarter of the budget, each logged at debug level), bounded by stall time (the budget is
    re-armed whenever the holder's heartbeat advances)."""

    def __init__(self, migrator: _Waiter, *, timeout_ms: int | None, poll_interval_ms: int,
                 stop_event: Stopper | None) -> None:
        self.migrator = migrator
        self.attempts = 0
        self.timeout_ms = timeout_ms
        self.stop_event = stop_event
        self.started = time.monotonic()
        self.waited = False
        self.deadline: float | None = None
        self.budget = 0  # ms of stall allowed, armed at the first refusal
        self.last_seen: Any = None
        self.delay = poll_interval_ms / 1000

    def call(self, attempt: Callable[[], Result], *, wait_for_lock: bool) -> Result:
        """``attempt()``, repeated after a pause while the lock is held (``wait_for_lock``)."""
        while True:
            self.attempts += 1
            if self.stop_event is not None and self.stop_event.wait(0):
                raise self.aborted(self.attempts)
            attempted = time.monotonic()
            try:
                result = attempt()
            except LockAlreadyHeldError as refused:
                if not wait_for_lock or refused.context.get("problems"):
                    raise  # a lock document nobody can read frees only by `unlock`: no wait
                self.pause(refused, self.attempts)
                continue
            except MigronautError:
                self.record("failed", attempted)  # the attempt after the wait failed otherwise
                raise
            self.record("acquired", attempted)
            return result

    def record(self, outcome: str, ended: float | None = None) -> None:
        """The wait's telemetry (only when there was a wait)."""
        if self.waited:
            self.migrator.telemetry.lock_wait((ended or time.monotonic()) - self.started, outcome)

    def aborted(self, attempts: int) -> RunAbortedError:
        self.record("aborted")
        return RunAbortedError("Lock wait aborted", {"attempts": attempts})

    def pause(self, refused: LockAlreadyHeldError, attempts: int) -> None:
        """After ``refused``: sleep until the next poll, or raise ``refused`` (timed out) or
        ``RUN_ABORTED`` (the stop event)."""
        holder = refused.context.get("holder") or {}
        now = time.monotonic()
        if not self.waited:
            self.migrator.logger.info(
                "Migration lock held by another process — waiting for it to release…"
            )
            self.waited = True
        if self.deadline is None or holder.get("lockedAt") != self.last_seen:
            ttl = holder.get("ttlMs") or self.migrator.config.lock_ttl_seconds * 1000
            self.budget = self.timeout_ms or max(90_000, int(1.5 * ttl))
            self.deadline = now + self.budget / 1000
            self.last_seen = holder.get("lockedAt")
        waited_ms = int((now - self.started) * 1000)
        if now >= self.deadline:
            refused.context.update({"timedOut": True, "attempts": attempts, "waitedMs": waited_ms})
            self.record("timeout")
            raise refused
        # jitter first, then the caps: no pause outlasts 5 s, a quarter of the budget or the
        # time left
        pause = min(self.delay * random.uniform(0.75, 1.25), 5.0, self.budget / 4000,
                    max(0.0, self.deadline - now))
        self.migrator.logger.debug(
            "Lock still held (attempt %d, waited %d ms) — next poll in %d ms",
            attempts, waited_ms, int(pause * 1000),
            extra={"attempts": attempts, "waitedMs": waited_ms,
                   "nextDelayMs": int(pause * 1000)})
        if self.stop_event is not None:
            if self.stop_event.wait(pause):
                raise self.aborted(attempts) from None
        else:
            time.sleep(pause)
        self.delay = min(self.delay * 2, 5.0)
