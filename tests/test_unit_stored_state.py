"""The checks of stored state, as pure functions: changelog records (``record_problems``,
``check_records``) and lock documents (``lock_problems``, ``judge_lock``, ``lock_info``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import Int64
from bson.decimal128 import Decimal128

from migronaut.core.changelog import check_records, record_problems
from migronaut.core.lock import judge_lock, lock_info, lock_problems
from migronaut.errors import StateInvalidError

NOW = dt.datetime(2025, 6, 1, 12, 0, 0)
# every status migronaut writes: settled records, and the intents of runs under way
KNOWN = "applied, reverted, failed, running, reverting"
GOOD = {"_id": 1, "name": "0001_a.py", "status": "applied", "batch": 1, "appliedAt": NOW}


def good(**changes: Any) -> dict[str, Any]:
    record = {**GOOD, **changes}
    return {k: v for k, v in record.items() if v is not ...}


@pytest.mark.parametrize("record", [
    good(),
    good(batch=Int64(3)),
    good(batch=4.0),  # what a shell edit may store: integral, and MongoDB compares it as 4
    good(status="reverted", revertedAt=NOW),
    good(status="failed", appliedAt=..., batch=2),  # a first attempt that failed
    good(status="reverted", batch=...),  # only an applied record needs its batch
    good(batch=None),  # applied without a batch: understood, but reported (check_records)
])
def test_records_migronaut_writes_have_no_problem(record: dict[str, Any]) -> None:
    assert record_problems(record) == []


@pytest.mark.parametrize(("record", "field", "message"), [
    (good(name=...), "name", "has no name"),
    (good(name=""), "name", "name '' is not a string"),
    (good(name=["a"]), "name", "name ['a'] is not a string"),
    (good(status=...), "status", "has no status"),
    (good(status="Applied"), "status", f"status 'Applied' is not one of {KNOWN}"),
    (good(status=None), "status", f"status None is not one of {KNOWN}"),
    (good(batch=True), "batch", "batch True is not a positive integer"),
    (good(batch=-1), "batch", "batch -1 is not a positive integer"),
    (good(batch=Decimal128("2")), "batch", "batch Decimal128('2') is not a positive integer"),
    (good(appliedAt=1_700_000_000_000), "appliedAt",
     "appliedAt 1700000000000 is not a date"),
    (good(appliedAt=...), "appliedAt", "is applied but has no appliedAt"),
])
def test_what_migronaut_does_not_understand_is_named_by_field(
    record: dict[str, Any], field: str, message: str
) -> None:
    [problem] = record_problems(record)
    assert (problem.field, problem.message) == (field, message)
    assert problem.record == (record["name"] if record.get("name") and
                              isinstance(record["name"], str) else "_id 1")


def test_a_long_value_is_cut_short() -> None:
    [problem] = record_problems(good(status="x" * 500))
    assert problem.message.startswith("status 'xxx") and problem.message.endswith(KNOWN)
    assert len(problem.message) < 90 + len(KNOWN)  # the 500 characters cut to 60


def test_check_records_sorts_out_problems_duplicates_and_records_without_a_batch() -> None:
    records = [
        good(_id=1, name="0001_a.py"),
        good(_id=2, name="0001_a.py", status="reverted"),
        good(_id=3, name="0002_b.py", batch=None),
        good(_id=4, name="0003_c.py", status="done"),
        good(_id=5, name="0004_d.py"),
    ]
    checked = check_records(iter(records))
    assert checked.records == records
    assert [r["_id"] for r in checked.readable] == [1, 2, 3, 5]
    assert [(p.record, p.field) for p in checked.problems] == [("0003_c.py", "status")]
    assert checked.duplicates == {"0001_a.py": 2}
    assert checked.unbatched == ("0002_b.py",)
    with pytest.raises(StateInvalidError) as unreadable:
        checked.require_readable("cl")
    assert unreadable.value.context["problems"] == [
        {"record": "0003_c.py", "field": "status",
         "message": f"status 'done' is not one of {KNOWN}"}]
    with pytest.raises(StateInvalidError) as duplicated:
        checked.require_unique("cl")
    assert duplicated.value.context == {"collection": "cl", "duplicates": {"0001_a.py": 2}}


def test_many_bad_records_name_five_and_count_the_rest() -> None:
    checked = check_records(good(_id=i, name=f"{i:04d}_x.py", status="?") for i in range(1, 9))
    with pytest.raises(StateInvalidError) as info:
        checked.require_readable("cl")
    assert info.value.message.startswith("8 changelog records (cl) migronaut cannot read: ")
    assert "(and 3 more) — fix or remove them" in info.value.message
    assert info.value.context["problemCount"] == 8


def test_a_large_changelog_is_checked_in_one_pass() -> None:
    many = [good(_id=i, name=f"{i:06d}_m.py", batch=i // 100 + 1) for i in range(20_000)]
    checked = check_records(many)
    assert (len(checked.readable), checked.problems, checked.duplicates) == (20_000, (), {})


# ------------------------------------------------------------------------------- lock documents

HOLDER = {"_id": "migronaut_lock", "lockedAt": NOW, "pid": 42, "host": "h", "executedBy": "u",
          "owner": "run-1", "nonce": "n", "ttlMs": 60_000}


def holder(**changes: Any) -> dict[str, Any]:
    doc = {**HOLDER, **changes}
    return {k: v for k, v in doc.items() if v is not ...}


@pytest.mark.parametrize("doc", [
    holder(),
    holder(ttlMs=...),  # written before ttlMs existed: judged by our TTL
    holder(nonce=...),  # written before the nonce existed
    holder(ttlMs=Int64(5_000)),
    holder(ttlMs=1500.5),
    holder(lockedAt=NOW + dt.timedelta(seconds=3)),  # a primary whose clock runs a little ahead
])
def test_lock_documents_migronaut_understands(doc: dict[str, Any]) -> None:
    assert lock_problems(doc, NOW) == ()


@pytest.mark.parametrize(("doc", "field", "message"), [
    (holder(lockedAt=...), "lockedAt", "lockedAt is missing"),
    (holder(lockedAt="2025-06-01"), "lockedAt", "lockedAt '2025-06-01' is not a date"),
    (holder(lockedAt=NOW + dt.timedelta(days=1)), "lockedAt",
     "lockedAt is in the future (server time): 2025-06-02T12:00:00.000Z is after "
     "2025-06-01T12:00:00.000Z"),
    (holder(owner=...), "owner", "owner is missing"),
    (holder(owner=7), "owner", "owner 7 is not a string"),
    (holder(ttlMs=0), "ttlMs", "ttlMs 0 is not a positive number of milliseconds"),
    (holder(ttlMs=float("nan")), "ttlMs", "ttlMs nan is not a positive number of milliseconds"),
    (holder(ttlMs=True), "ttlMs", "ttlMs True is not a positive number of milliseconds"),
    (holder(ttlMs=None), "ttlMs", "ttlMs None is not a positive number of milliseconds"),
    (holder(ttlMs=10**20), "ttlMs",
     "ttlMs 100000000000000000000 is not a positive number of milliseconds"),
])
def test_lock_documents_migronaut_cannot_read(doc: dict[str, Any], field: str,
                                              message: str) -> None:
    [problem] = lock_problems(doc, NOW)
    assert (problem.field, problem.message) == (field, message)
    status = judge_lock(doc, can_reclaim=False, now=NOW, ttl_ms=60_000)
    assert status.state == "invalid" and status.blocks_runs


def test_judge_lock_states() -> None:
    assert judge_lock(None, can_reclaim=True, now=NOW, ttl_ms=1).state == "free"
    assert judge_lock({"_id": "migronaut_lock"}, can_reclaim=True, now=NOW,
                      ttl_ms=1).state == "free"
    live = judge_lock(holder(lockedAt=NOW - dt.timedelta(seconds=7)), can_reclaim=False,
                      now=NOW, ttl_ms=1_000)
    assert (live.state, live.ttl_ms, live.held_for_s, live.blocks_runs) == ("held", 60_000, 7,
                                                                          True)
    expired = judge_lock(holder(ttlMs=...), can_reclaim=True, now=NOW, ttl_ms=30_000)
    assert (expired.state, expired.ttl_ms, expired.blocks_runs) == ("expired", 30_000, False)
    assert expired.to_dict()["state"] == "expired" and "problems" not in expired.to_dict()


def test_lock_info_never_shows_a_value_of_the_wrong_type() -> None:
    info = lock_info(holder(lockedAt="soon", pid="42", host=1, executedBy=None, owner=3,
                            ttlMs="60s"))
    assert info is not None
    assert (info.locked_at, info.pid, info.host, info.executed_by, info.run_id, info.ttl_ms) == (
        None, None, None, None, None, None)
    assert info.describe() == "pid None on None (None) since an unknown time"
    assert lock_info(holder(pid=42.0)).pid == 42  # type: ignore[union-attr]
