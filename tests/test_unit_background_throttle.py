"""The AIMD controller and the pacing rules of background lanes (reference background §4.8)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pytest

from migronaut.background.lanes.throttle import (
    AdaptiveController,
    Throttle,
    ThrottleContext,
    controller_for,
    replication_lag_ms,
    reset_controllers,
)
from migronaut.core.context import Cancellation
from migronaut.errors import RunAbortedError


class Clock:
    """A hand-driven monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(clock: Clock, seed: dict[str, Any] | None = None, **overrides: Any) -> AdaptiveController:
    settings: dict[str, Any] = {
        "target_latency_ms": 500, "min_batch_size": 10, "max_batch_size": 400,
        "max_pause_ms": 1000,
    }
    settings.update(overrides)
    return AdaptiveController(**settings, seed=seed, clock=clock)


def test_starts_at_the_maximum_and_the_first_batch_only_warms_up() -> None:
    clock = Clock()
    controller = make(clock)
    assert (controller.batch_size, controller.pause_ms) == (400, 0)
    assert controller.record(5_000) is None  # warm-up: even a terrible first batch is not judged
    assert controller.batch_size == 400


def test_a_seeded_controller_starts_from_the_saved_state_and_judges_at_once() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 50, "pauseMs": 200})
    assert (controller.batch_size, controller.pause_ms) == (50, 200)
    report = controller.record(10)  # healthy: the pause is halved first
    assert controller.pause_ms == 100
    assert report is not None and report.reason == "recover"


def test_seed_values_are_clamped_to_the_settings() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 99_999, "pauseMs": 99_999})
    assert (controller.batch_size, controller.pause_ms) == (400, 1000)
    controller = make(clock, seed={"batchSize": 1})
    assert controller.batch_size == 10


def test_slow_batches_halve_the_size_at_most_once_per_round_trip() -> None:
    clock = Clock()
    controller = make(clock)
    controller.record(100)  # warm-up
    report = controller.record(800)
    assert controller.batch_size == 200
    assert report is not None and (report.reason, report.batch_size) == ("slow", 200)
    # another lane's slow batch 0.1 s later (less than the 800 ms round trip): ignored
    clock.advance(0.1)
    controller.record(800)
    assert controller.batch_size == 200
    clock.advance(0.8)
    controller.record(800)
    assert controller.batch_size == 100


def test_at_the_minimum_size_the_pause_starts_at_100_ms_and_doubles_up_to_the_cap() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 10})
    pauses = []
    for _ in range(6):
        clock.advance(1.0)
        controller.record(900)
        pauses.append(controller.pause_ms)
    assert controller.batch_size == 10
    assert pauses == [100, 200, 400, 800, 1000, 1000]


def test_overload_counts_like_slowness_with_its_own_reason() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 400})
    report = controller.record(1, overloaded=True)
    assert controller.batch_size == 200
    assert report is not None and report.reason == "overload"


def test_recovery_halves_the_pause_first_then_grows_by_a_twentieth() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 100, "pauseMs": 400})
    seen = []
    for _ in range(5):
        clock.advance(1.0)
        controller.record(10)
        seen.append((controller.batch_size, controller.pause_ms))
    # 400 → 200 → 100 → 50 → 25 ms while the size stays; the size grows once the pause is 0
    assert seen == [(100, 200), (100, 100), (100, 50), (100, 25), (100, 12)]
    for _ in range(4):  # 12 → 6 → 3 → 1 → 0
        controller.record(10)
    assert (controller.batch_size, controller.pause_ms) == (100, 0)
    controller.record(10)
    assert controller.batch_size == 120  # + max(1, 400 // 20)


def test_growth_is_at_least_one_and_never_exceeds_the_maximum() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 5}, min_batch_size=1, max_batch_size=7)
    controller.record(1)
    assert controller.batch_size == 6  # max(1, 7 // 20) = 1
    for _ in range(5):
        controller.record(1)
    assert controller.batch_size == 7


def test_a_healthy_controller_at_its_maximum_reports_nothing() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 400})
    assert all(controller.record(1) is None for _ in range(20))


def test_reports_come_at_most_every_10_s_with_the_worst_reason_since_the_last() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 400})
    first = controller.record(900)  # slow → reported at once
    assert first is not None and first.reason == "slow"
    clock.advance(1.0)
    assert controller.record(900, overloaded=True) is None  # within 10 s: held back
    clock.advance(1.0)
    assert controller.record(10) is None  # recovery: held back too
    clock.advance(8.5)
    report = controller.record(10)
    # the held-back changes are told now, carrying the worst reason (overload beats recover)
    assert report is not None
    assert (report.reason, report.batch_size) == ("overload", controller.batch_size)
    clock.advance(10.0)
    report = controller.record(10)
    assert report is not None and report.reason == "recover"


def test_state_is_what_a_checkpoint_saves() -> None:
    clock = Clock()
    controller = make(clock, seed={"batchSize": 40, "pauseMs": 0})
    assert controller.state() == {"batchSize": 40, "pauseMs": 0}


def test_from_spec_reads_the_resolved_camel_case_settings() -> None:
    controller = AdaptiveController.from_spec(
        {"targetLatencyMs": 50, "minBatchSize": 2, "maxBatchSize": 20, "maxPauseMs": 300}
    )
    assert (controller.min_batch_size, controller.max_batch_size) == (2, 20)
    assert controller.target_latency_ms == 50 and controller.max_pause_ms == 300


def test_one_controller_per_key_in_a_process() -> None:
    reset_controllers()
    adaptive = {"targetLatencyMs": 50, "minBatchSize": 2, "maxBatchSize": 20, "maxPauseMs": 300}
    a = controller_for(("db", "m", "r1", None), adaptive, seed={"batchSize": 8})
    b = controller_for(("db", "m", "r1", None), adaptive, seed={"batchSize": 3})
    assert a is b and a.batch_size == 8  # seeded once, by the first partition that asked
    c = controller_for(("db", "m", "r1", None), {**adaptive, "maxBatchSize": 10})
    assert c is not a  # a repin with other settings gets a fresh controller
    reset_controllers()


# ----------------------------------------------------------------------- replication lag


def _member(_id: int, state: str, at: datetime) -> dict[str, Any]:
    return {"_id": _id, "stateStr": state, "optimeDate": at}


def test_lag_is_primary_minus_the_worst_counting_secondary() -> None:
    t = datetime(2026, 1, 1, 12, 0, 0)
    status = {"members": [
        _member(0, "PRIMARY", t),
        _member(1, "SECONDARY", t - timedelta(seconds=2)),
        _member(2, "SECONDARY", t - timedelta(seconds=30)),  # hidden
        _member(3, "SECONDARY", t - timedelta(seconds=60)),  # delayed
        _member(4, "ARBITER", t - timedelta(seconds=90)),
    ]}
    assert replication_lag_ms(status) == 60_000  # without a config every secondary counts
    config = {"members": [
        {"_id": 0}, {"_id": 1}, {"_id": 2, "hidden": True}, {"_id": 3, "secondaryDelaySecs": 3600},
        {"_id": 4, "arbiterOnly": True},
    ]}
    assert replication_lag_ms(status, config) == 2_000
    config["members"][3] = {"_id": 3, "slaveDelay": 10}
    assert replication_lag_ms(status, config) == 2_000


def test_no_primary_or_no_secondary_means_no_lag() -> None:
    t = datetime(2026, 1, 1)
    assert replication_lag_ms({"members": [_member(0, "PRIMARY", t)]}) == 0
    assert replication_lag_ms({"members": [_member(1, "SECONDARY", t)]}) == 0
    assert replication_lag_ms({}) == 0


# -------------------------------------------------------------------------------- pacing


def _throttle(hook: Any = None, **spec: Any) -> tuple[Throttle, Cancellation]:
    cancellation = Cancellation()
    settings = {"pauseMs": 0, "maxReplicationLagMs": False, "collection": "c", **spec}
    throttle = Throttle(name="m", spec=settings, hook=hook, db=None,
                        cancellation=cancellation, logger=logging.getLogger("t"))
    return throttle, cancellation


def test_the_user_hook_sees_the_batch_and_its_number_is_an_extra_pause() -> None:
    seen: list[ThrottleContext] = []

    def hook(ctx: ThrottleContext) -> int:
        seen.append(ctx)
        return 1

    throttle, _ = _throttle(hook)
    assert throttle.before_batch(generation=3, partition="p", batch_size=50, first=True)
    assert (seen[0].name, seen[0].collection, seen[0].generation, seen[0].partition,
            seen[0].batch_size) == ("m", "c", 3, "p", 50)


def test_waits_end_as_soon_as_the_cancellation_is_set() -> None:
    throttle, cancellation = _throttle(pauseMs=3_600_000)
    cancellation.cancel(RunAbortedError("stop"))
    assert throttle.before_batch(generation=1, partition="p", batch_size=1) is False


def test_the_first_batch_skips_pause_ms() -> None:
    throttle, _ = _throttle(pauseMs=3_600_000)
    assert throttle.before_batch(generation=1, partition="p", batch_size=1, first=True)


@pytest.mark.parametrize("value", [None, 0, -5, "10", True])
def test_a_hook_returning_no_positive_number_adds_nothing(value: Any) -> None:
    throttle, _ = _throttle(lambda ctx: value)
    assert throttle.before_batch(generation=1, partition="p", batch_size=1, first=True)
