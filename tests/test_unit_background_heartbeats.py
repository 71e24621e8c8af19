"""The timers of background lanes: each lease keeper's renewals, the store's one control reader.

A lease keeper sleeps until its renewal is due (``ttl/2`` after the lease was last extended) and
is woken early only to stop; the lanes of one store share one control reader thread, which stops
when the last lane leaves. Renewals and reads are counted on stand-ins for the store; the only
waits are generous upper bounds for something to happen.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from migronaut.background.lanes.control_feed import READER_THREAD, ControlDoc, ControlFeed
from migronaut.background.lanes.lease_keeper import LeaseKeeper
from migronaut.background.state.partitions import Lease

PLAN = "plan-token"
RUNNING = {"status": "running", "generation": 1, "plan": {"token": PLAN}}


class Store:
    """Counts renewals (with when each was sent) and control reads."""

    def __init__(self, control: dict[str, Any] | None = RUNNING) -> None:
        self.renewals: list[float] = []
        self.reads: list[str] = []
        self.control = control

    def renew(self, lease: Lease) -> bool:
        self.renewals.append(time.monotonic())
        return True

    def control_read(self, name: str) -> ControlDoc:
        self.reads.append(name)
        return self.control


class Lane:
    """What a lease keeper uses of its lane."""

    def __init__(self, store: Store, name: str = "m.py") -> None:
        self.store = store
        self.name = name
        self.logger = logging.LoggerAdapter(logging.getLogger("migronaut.test"), {})
        self.control: str | None = None
        self.epoch: dict[str, Any] = {}
        self.lost = False

    def lose(self, lease: Lease) -> None:
        self.lost = True


def lease(ttl_ms: int) -> Lease:
    return Lease(partition_id="p0", slot=0, token="t", owner="lane-0", ttl_ms=ttl_ms)


def threads_named(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def wait_for(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_lease_keeper_renews_when_half_the_ttl_passed_and_not_before() -> None:
    store = Store()
    lane = Lane(store)
    started = time.monotonic()
    with LeaseKeeper(lane, lease(400), 1, PLAN):  # type: ignore[arg-type]
        wait_for(lambda: len(store.renewals) >= 3)
    elapsed = time.monotonic() - started
    # every 0.2 s from the last extension: never sooner, so at most one per 0.2 s elapsed
    gaps = [b - a for a, b in zip([started, *store.renewals], store.renewals, strict=False)]
    assert all(gap >= 0.2 * 0.95 for gap in gaps), gaps
    assert len(store.renewals) <= elapsed / 0.2 + 1
    assert not lane.lost


def test_checkpoints_that_keep_the_lease_fresh_leave_nothing_to_renew() -> None:
    store = Store()
    lane = Lane(store)
    with LeaseKeeper(lane, lease(4_000), 1, PLAN) as keeper:  # type: ignore[arg-type]
        for _ in range(30):  # 1.5 s of checkpoints, each well inside the 2 s before renewal
            keeper.touch()
            time.sleep(0.05)
    assert store.renewals == []


def test_a_keeper_with_a_long_ttl_stops_at_once_without_renewing() -> None:
    store = Store()
    lane = Lane(store)
    keeper = LeaseKeeper(lane, lease(600_000), 1, PLAN)  # type: ignore[arg-type]
    with keeper:
        wait_for(lambda: len(threads_named("migronaut-lease-m.py")) == 1)
    # the stop woke it: its renewal was 300 s away
    assert threads_named("migronaut-lease-m.py") == []
    assert store.renewals == []


def test_the_lanes_of_one_store_share_one_reader_thread_that_stops_with_the_last() -> None:
    store = Store()
    lanes = [Lane(store, name) for name in ("a.py", "a.py", "b.py", "b.py")]
    keepers = [LeaseKeeper(lane, lease(600_000), 1, PLAN)  # type: ignore[arg-type]
               for lane in lanes]
    for keeper in keepers:
        keeper.__enter__()
    try:
        assert len(threads_named(READER_THREAD)) == 1
        wait_for(lambda: store.reads.count("a.py") >= 2 and store.reads.count("b.py") >= 2)
        assert len(threads_named(READER_THREAD)) == 1
        store.control = {**RUNNING, "status": "paused"}
        wait_for(lambda: all(lane.control is not None for lane in lanes))
        assert [lane.control for lane in lanes] == ["paused"] * 4
        for keeper in keepers[:3]:
            keeper.__exit__(None, None, None)
        assert len(threads_named(READER_THREAD)) == 1  # one lane still subscribed
    finally:
        keepers[3].__exit__(None, None, None)
    assert threads_named(READER_THREAD) == []


def test_the_reader_reads_each_migration_once_an_interval_for_all_its_subscribers() -> None:
    reads: list[str] = []
    seen: dict[int, int] = {}

    class Listener:
        def on_control(self, doc: ControlDoc, checked: dict[str, bool]) -> None:
            seen[id(self)] = seen.get(id(self), 0) + 1

    def read(name: str) -> ControlDoc:
        reads.append(name)
        return RUNNING

    feed = ControlFeed(read, 0.1)
    listeners = [Listener() for _ in range(4)]
    started = time.monotonic()
    for listener in listeners:
        feed.join("m.py", listener)
    wait_for(lambda: len(reads) >= 5)
    for listener in listeners:
        feed.leave("m.py", listener)
    elapsed = time.monotonic() - started
    done = len(reads)
    # one read per interval for the four, each handed to every subscriber
    assert done <= elapsed / 0.1 + 1
    assert all(seen[id(listener)] >= 5 for listener in listeners)
    assert threads_named(READER_THREAD) == []
    time.sleep(0.3)
    assert len(reads) == done  # nobody subscribed: no more reads


def test_a_failed_control_read_is_tried_again_at_the_next_interval() -> None:
    attempts: list[float] = []

    def read(name: str) -> ControlDoc:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ConnectionError("down")
        return None

    store = Store()
    lane = Lane(store)
    feed = ControlFeed(read, 0.1)
    keeper = LeaseKeeper(lane, lease(600_000), 1, PLAN)  # type: ignore[arg-type]
    feed.join(lane.name, keeper)
    try:
        wait_for(lambda: lane.control is not None)
    finally:
        feed.leave(lane.name, keeper)
    assert len(attempts) >= 2
    assert lane.control == "cancelled"  # the state is gone
