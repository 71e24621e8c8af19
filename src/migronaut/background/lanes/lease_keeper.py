"""Lease keeping: the heartbeat thread of one held partition lease (lease = slot).

A lease is the lane's slot: ``maxParallel`` bounds the leases, so a lane holds its partition only
while the lease is renewed. :class:`LeaseKeeper` renews it once ``ttl/2`` passed since it was
last extended (by a renewal or a fenced checkpoint, :meth:`LeaseKeeper.touch`): its thread sleeps
until then, woken early only to stop, so a lane whose checkpoints keep the lease fresh costs one
wake-up per ``ttl/2`` and no round trip. The migration's control fields reach the keeper from its
store's one reader thread (:mod:`~migronaut.background.lanes.control_feed`), every
:data:`CONTROL_INTERVAL_S`, so the lane never spends a round trip on them per batch.

Invariant: **a lane that may have lost its slot stops.** A renewal that matches nothing marks the
lane lost at once (:meth:`LaneState.lose`); a renewal that fails (the network, an election) is
tried again soon, and only when no renewal succeeded for :data:`LEASE_LOST_AFTER` of the TTL —
when a reaper may take the lease — is the lane lost. Checkpoints are fenced by the lease token
anyway (:mod:`migronaut.background.batches.checkpoints`): the keeper only makes the stop early.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from migronaut.background.lanes.control_feed import ControlDoc, feed_for
from migronaut.background.lanes.turn import LaneState
from migronaut.background.state.store import Lease

__all__ = ["CONTROL_INTERVAL_S", "LEASE_LOST_AFTER", "LeaseKeeper", "control_outcome"]

#: How often the store's control reader reads each migration's control fields (seconds).
CONTROL_INTERVAL_S = 1.0
#: A lease not renewed for this share of its TTL may be reaped any moment: the lane stops.
LEASE_LOST_AFTER = 0.9


class LeaseKeeper:
    """The heartbeat thread of one held lease, and its lane's subscription to the control reads.

    The first stop outcome a control read shows (``paused``, ``cancelled``, ``failed``,
    ``stale``) goes to :attr:`LaneState.control` for the lane to act on. Started and joined,
    subscribed and unsubscribed, by its ``with`` block.
    """

    def __init__(self, lane: LaneState, lease: Lease, generation: int, plan: str) -> None:
        self._lane = lane
        self._lease = lease
        self._generation = generation
        self._plan = plan
        self._ttl_s = lease.ttl_ms / 1000.0
        self._stop = threading.Event()
        self._touched = time.monotonic()
        self._errors = 0
        self._feed = feed_for(lane.store, lane.store.control_read, CONTROL_INTERVAL_S)
        self._thread = threading.Thread(
            target=self._run, name=f"migronaut-lease-{lane.name}", daemon=True
        )

    def __enter__(self) -> LeaseKeeper:
        self._feed.join(self._lane.name, self)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._feed.leave(self._lane.name, self)

    def touch(self) -> None:
        """A fenced checkpoint just renewed the lease: the next renewal can wait."""
        self._touched = time.monotonic()

    def _run(self) -> None:
        renew_every = max(0.01, self._ttl_s / 2)
        retry_every = max(0.01, min(renew_every, self._ttl_s / 8, 1.0))
        due = self._touched + renew_every
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            touched = self._touched
            if time.monotonic() < touched + renew_every:
                due = touched + renew_every  # a checkpoint extended the lease meanwhile
                continue
            renewed = self._renew()
            if renewed is None:
                return
            due = self._touched + renew_every if renewed else time.monotonic() + retry_every

    def _renew(self) -> bool | None:
        """``True`` renewed, ``False`` failed (try again soon), ``None`` lost (lane stopped)."""
        try:
            held = self._lane.store.renew(self._lease)
        except Exception as error:
            self._errors += 1
            self._lane.logger.debug("lease renewal failed: %s", type(error).__name__)
            if time.monotonic() - self._touched < self._ttl_s * LEASE_LOST_AFTER:
                return False
            held = False
        else:
            self._errors = 0
        if held:
            self.touch()
            return True
        self._lane.lose(self._lease)
        return None

    def on_control(self, doc: ControlDoc, checked: dict[str, bool]) -> None:
        """A control read of this lane's migration (on the store's reader thread): its outcome
        for this lane's generation and plan, kept when it says stop. ``checked`` memoises the
        reshard check per plan epoch across the keepers of one read."""
        lane = self._lane
        if lane.control is not None:
            return
        outcome = control_outcome(doc, self._generation, self._plan)
        if outcome is None and lane.epoch:
            key = repr(sorted(lane.epoch.items()))
            try:
                if key not in checked:
                    checked[key] = lane.resharded()
            except Exception as error:  # checked again at the next read
                lane.logger.debug("reshard check failed: %s", type(error).__name__)
            else:
                outcome = "stale" if checked[key] else None
        if outcome is not None:
            lane.control = outcome


def control_outcome(doc: Mapping[str, Any] | None, generation: int, plan: str) -> str | None:
    """The stop outcome the control fields call for, or ``None`` to keep working."""
    if doc is None:
        return "cancelled"
    status = doc.get("status")
    if status in ("paused", "cancelled", "failed"):
        return str(status)
    if status != "running":
        return "stale"
    if doc.get("generation") != generation or (doc.get("plan") or {}).get("token") != plan:
        return "stale"
    return None
