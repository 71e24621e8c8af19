"""Pure parts of the dashboard: throughput over time from stored partitions, progress derived
from stored times, Prometheus label escaping."""

from __future__ import annotations

import datetime as dt

from migronaut.dashboard.board import derived_progress, throughput

T0 = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_throughput_spreads_each_partition_over_the_time_it_was_worked() -> None:
    rows = [
        {"counters": {"scanned": 240}, "startedAt": at(0), "doneAt": at(24)},  # 10 docs/s
        {"counters": {"scanned": 120}, "startedAt": at(12), "updatedAt": at(24)},  # open
        {"counters": {"scanned": 0}, "startedAt": at(0), "updatedAt": at(30)},  # nothing read
        {"counters": {"processed": 5}},  # no times: not placed
    ]
    bars = throughput(rows, bars=4)
    assert [bar["documents"] for bar in bars] == [60.0, 60.0, 120.0, 120.0]
    assert [bar["rate"] for bar in bars] == [10.0, 10.0, 20.0, 20.0]
    assert bars[-1]["at"] == "2026-12-01T12:00:24.000Z"
    assert sum(bar["documents"] for bar in bars) == 360


def test_throughput_of_an_instant_and_of_nothing() -> None:
    assert throughput([]) == []
    assert throughput([{"counters": {"scanned": 0}, "doneAt": at(3)}]) == []
    one = throughput([{"counters": {"scanned": 7}, "doneAt": at(3)}], bars=3)
    assert [bar["documents"] for bar in one] == [7.0, 0.0, 0.0]


def test_progress_rate_and_eta_come_from_stored_times() -> None:
    view = {"status": "running", "totals": {"scanned": 300, "migrated": 290},
            "plan": {"estimate": 1200}, "startedAt": at(0)}
    progress = derived_progress(view, T0 + dt.timedelta(seconds=60))
    assert progress == {"done": 300, "estimate": 1200, "percent": 25.0, "rate": 5.0,
                        "etaSeconds": 180.0, "migrated": 290, "atLeast": False, "failed": 0,
                        "partitionPercent": None}
    paused = derived_progress({**view, "status": "paused", "lastProgressAt": at(30)},
                              T0 + dt.timedelta(seconds=600))
    assert (paused["rate"], paused["etaSeconds"]) == (10.0, None)
    done = derived_progress({**view, "status": "completed", "completedAt": at(100)},
                            T0 + dt.timedelta(seconds=600))
    assert (done["percent"], done["rate"], done["etaSeconds"]) == (100.0, 3.0, None)
    assert derived_progress({"status": "pending"}, T0)["percent"] is None

