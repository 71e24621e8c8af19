"""Driving one migration in this process: coordinator steps and lane threads until it settles.

The ``run`` command (driver ``local``) and ``background_inline`` (driver ``inline``) drive here;
the in-process runner (:mod:`migronaut.background.runner`) serves many migrations its own way.

Invariants: the lanes of one drive stop with it (their cancellation is linked to the driver's);
an outage is ridden out, not counted, until it outlasts the spec's ``maxOutageMs``; a fatal
error (the file changed, a bad config) stops every lane and is raised once they have stopped.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from migronaut.background.coordination.outage import DEFAULT_OUTAGE_MS, DriverOutage
from migronaut.core.context import Cancellation, LinkedCancellation
from migronaut.errors import (
    BackgroundFailedError,
    ChecksumMismatchError,
    LockAlreadyHeldError,
    MigronautError,
    RunAbortedError,
)

if TYPE_CHECKING:
    from migronaut.background.coordination.coordinator import Coordinator
    from migronaut.background.coordination.handles import EngineHandles
    from migronaut.background.planning.job import BackgroundJob
    from migronaut.background.state.views import StateViews

__all__ = ["LOOK_AGAIN_S", "Driver"]

#: How long a drive waits before its next coordinator step while another process holds the
#: coordinator lock or leases every open partition (seconds).
LOOK_AGAIN_S = 1.0

#: Errors a lane does not retry: every lane stops and the driver raises the first.
_FATAL = frozenset({
    "CHECKSUM_MISMATCH", "MIGRATION_FILE_NOT_FOUND", "MIGRATION_INVALID_EXPORT",
    "MIGRATION_INVALID_NAME", "CONFIG_INVALID", "TRANSACTIONS_UNSUPPORTED",
})


class Driver:
    """Coordinates and runs lanes for one migration at a time, in this process."""

    def __init__(self, engine: EngineHandles, coordinator: Coordinator,
                 views: StateViews) -> None:
        self.engine = engine
        self.coordinator = coordinator
        self.views = views

    def drive(
        self, name: str, *, concurrency: int, until_done: bool, cancellation: Cancellation | None,
        driver: str, slice_ms: int | None, inline: bool, raise_if_busy: bool,
    ) -> dict[str, Any]:
        """Coordinate and run lanes until the migration settles (reference §6.1 runBackground);
        the options (and their defaults) are :meth:`EngineCore.drive`'s."""
        from migronaut.background.lanes.slices import run_slice

        cancel = cancellation or Cancellation()
        outage = DriverOutage(self.engine.logger, name)
        while True:
            if cancel.cancelled:
                raise RunAbortedError(
                    f"Stopped driving background migration {name} — it goes on from here",
                    {"migration": name},
                )
            try:
                answer, state, job = self.coordinator.step(name, driver=driver,
                                                           cancellation=cancel)
            except Exception as error:
                if cancel.cancelled or not outage.ride_out(error, cancel):
                    raise
                continue
            outage.clear()
            if answer.next in ("done", "superseded"):
                break
            if answer.next == "process" and until_done and answer.lanes == 0:
                # every open partition is leased by lanes elsewhere: starting a lane would only
                # claim nothing and step again at once — look again a little later instead
                cancel.wait(LOOK_AGAIN_S)
                continue
            if answer.next == "process":
                # the step's state and job are fresh: the lanes start from them
                if state is None or job is None:
                    state = self.engine.store.require(name)
                    job = self.engine.job(state)
                # no more lanes than partitions to claim now (at least one: the others'
                # leases may expire meanwhile)
                lanes = max(1, min(concurrency, int(job.spec.get("maxParallel", 1)),
                                   answer.lanes or concurrency))
                self._run_lanes(name, job, lanes, cancel, slice_ms, run_slice,
                                once=not until_done, state=state)
                if not until_done:
                    break
                continue
            if raise_if_busy and answer.next == "busy":
                raise LockAlreadyHeldError(
                    f"Another process is coordinating background migration {name} — try again "
                    "later",
                    {"migration": name, "retryAfterMs": answer.retry_after_ms},
                )
            if inline and answer.reason == "checksum":
                raise ChecksumMismatchError(answer.error or f"{name} changed on disk",
                                            {"name": name})
            if not until_done:
                break
            wait = (answer.retry_after_ms or 1000) / 1000
            if answer.next == "busy":
                # another process holds the coordinator lock: its step takes milliseconds, so
                # look again soon rather than after the lock's ttl/2
                wait = min(wait, LOOK_AGAIN_S)
            cancel.wait(wait)
        if state is None or answer.next != "done":
            state = self.engine.store.require(name)
        if state["status"] == "failed":
            raise BackgroundFailedError(
                f"Background migration {name} failed: {state.get('lastError')}",
                {"migration": name, "lastError": state.get("lastError")},
            )
        return self.views.view(state)

    def _run_lanes(
        self, name: str, job: BackgroundJob, lanes: int, cancel: Cancellation,
        slice_ms: int | None, run_slice: Callable[..., Any], *, once: bool,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        """Run ``lanes`` lane loops in threads until the current plan has nothing claimable;
        each lane's first slice starts from ``state`` (just read) instead of reading it."""
        fatal: list[MigronautError] = []
        lane_cancel = LinkedCancellation(cancel)
        budget_ms = int(job.spec.get("maxOutageMs", DEFAULT_OUTAGE_MS))

        def lane() -> None:
            failures = 0
            outage = DriverOutage(self.engine.logger, name, budget_ms)
            known = state
            while not lane_cancel.cancelled:
                try:
                    result = run_slice(
                        store=self.engine.store, job=job, db=self.engine.db, owner=uuid.uuid4().hex,
                        ttl_ms=self.engine.ttl_ms, cancellation=lane_cancel, slice_ms=slice_ms,
                        emit=self.engine.emit, logger=self.engine.logger,
                        telemetry=self.engine.telemetry, state=known,
                    )
                except MigronautError as error:
                    if not lane_cancel.cancelled and outage.ride_out(error, lane_cancel):
                        continue  # an outage: not a failure until it outlasts maxOutageMs
                    failures += 1
                    if error.code in _FATAL or failures >= 10:
                        fatal.append(error)
                        lane_cancel.cancel(error)
                        return
                    self.engine.logger.warning("⚠ %s: a slice failed (%s) — retrying", name,
                                               error.message)
                    lane_cancel.wait(min(30.0, 0.25 * 2 ** failures))
                    continue
                finally:
                    known = None  # later slices read the state afresh
                failures = 0
                outage.clear()
                if once or result.outcome not in ("yielded", "busy"):
                    return
                if result.outcome == "busy":
                    lane_cancel.wait((result.retry_after_ms or 1000) / 1000)

        # each lane runs in a copy of this context: its slice spans nest under the caller's span
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(lane,),
                                    name=f"migronaut-lane-{name}-{i}", daemon=True)
                   for i in range(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if fatal:
            raise fatal[0]


