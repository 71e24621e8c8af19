"""The background store's lease and state semantics, exactly as the original keeps them.

Reference background §2 and §4.2: a lease is live or stale by its own ``ttlMs`` (judged in server
time); failing a slice or a partition only touches an open partition; withdrawing a registration
is atomic; partitions carry ``createdAt``; history entries carry ``from``; ``unlock`` writes a
history entry; any checkpoint resets ``failures``. Each test arranges the stored documents, acts
through the store or the engine, and asserts on what is stored.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from pymongo.database import Database

from migronaut import Migrator
from migronaut.background.state.store import BackgroundStore, Lease

NAME = "20260101000000_rewrite.py"
SPEC = {"mode": "declarative", "collection": "items", "from": 0, "to": 1, "maxParallel": 1}


def planned(db: Database[dict[str, Any]], partitions: int = 2) -> tuple[BackgroundStore, str]:
    """A registered migration with a committed plan of ``partitions`` partitions."""
    store = BackgroundStore(db)
    store.register(NAME, status="pending", direction="forward", mode="declarative",
                   collection="items", spec=SPEC, checksum="0" * 64)
    token = uuid.uuid4().hex
    store.insert_plan(NAME, 1, token, [{"scope": {"kind": "step"}, "estimate": 0}] * partitions)
    assert store.update_state(NAME, {}, {
        "generation": 1, "phase": "process",
        "plan": {"token": token, "generation": 1, "partitions": partitions},
    })
    assert store.move(NAME, "plan") is not None
    return store, token


def claim(store: BackgroundStore, token: str, *, ttl_ms: int, max_parallel: int = 1,
          owner: str = "a") -> Lease | str:
    return store.claim(NAME, generation=1, plan=token, max_parallel=max_parallel,
                       ttl_ms=ttl_ms, owner=owner)


def age(store: BackgroundStore, lease: Lease, ms: int) -> None:
    """Make ``lease`` look last renewed ``ms`` ago (server time)."""
    store.partitions.update_one({"_id": lease.partition_id}, [
        {"$set": {"lease.renewedAt": {"$subtract": ["$$NOW", ms]}}}])


def partition(store: BackgroundStore, lease: Lease) -> dict[str, Any]:
    found = store.partitions.find_one({"_id": lease.partition_id})
    assert found is not None
    return found


# ----------------------------------------------------------------------------------- leases


def test_a_long_lease_is_not_reaped_by_a_process_with_a_shorter_ttl(
    db: Database[dict[str, Any]]
) -> None:
    """The reported case: ttlMs 600,000, renewed 90 s ago, looked at by a 60 s process."""
    store, token = planned(db)
    held = claim(store, token, ttl_ms=600_000, owner="long")
    assert isinstance(held, Lease)
    age(store, held, 90_000)

    assert claim(store, token, ttl_ms=60_000, owner="short") == "busy"  # its slot is taken
    assert store.reap_expired_leases(NAME) == 0
    assert store.live_leases(NAME) == 1
    kept = partition(store, held)
    assert kept["lease"]["owner"] == "long" and kept["reclaims"] == 0

    age(store, held, 600_001)  # past its own TTL: now anyone reaps it
    assert store.reap_expired_leases(NAME) == 1
    assert store.live_leases(NAME) == 0
    assert "lease" not in partition(store, held) and partition(store, held)["reclaims"] == 1


def test_reaping_filters_on_the_slot_so_the_partial_slot_index_serves_it(
    db: Database[dict[str, Any]], mongo_uri: str
) -> None:
    """The reap's filter carries the partial index's own condition (``lease.slot`` exists),
    so the index on ``{background, lease.slot}`` — leased partitions only — can serve it
    instead of every partition of the migration being looked at."""
    from pymongo import MongoClient, monitoring

    class Updates(monitoring.CommandListener):
        def __init__(self) -> None:
            self.filters: list[dict[str, Any]] = []

        def started(self, event: Any) -> None:
            if event.command_name == "update":
                self.filters += [dict(u["q"]) for u in event.command["updates"]]

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    store, token = planned(db)
    held = claim(store, token, ttl_ms=1_000)
    assert isinstance(held, Lease)
    age(store, held, 5_000)
    slot_index = next(i for i in store.partitions.list_indexes()
                      if "lease.slot" in i["key"])
    assert list(slot_index["key"]) == ["background", "lease.slot"]
    partial = dict(slot_index["partialFilterExpression"])

    listener = Updates()
    watched: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, event_listeners=[listener])
    try:
        assert BackgroundStore(watched[db.name]).reap_expired_leases(NAME) == 1
    finally:
        watched.close()
    (reap,) = listener.filters
    assert reap["background"] == NAME
    assert {k: v for k, v in reap.items() if k in partial} == partial
    assert "lease" not in reap
    assert "lease" not in partition(store, held) and partition(store, held)["reclaims"] == 1


def test_a_short_lease_past_its_own_ttl_is_reaped_by_a_longer_ttl_process(
    db: Database[dict[str, Any]]
) -> None:
    store, token = planned(db)
    held = claim(store, token, ttl_ms=1_000, owner="short")
    assert isinstance(held, Lease)
    age(store, held, 5_000)
    assert store.live_leases(NAME) == 0
    taken = claim(store, token, ttl_ms=600_000, owner="long")  # claims reap first
    assert isinstance(taken, Lease) and taken.slot == held.slot
    assert partition(store, held)["reclaims"] == 1
    assert store.live_leases(NAME) == 1


# ----------------------------------------------------------------------- failing partitions


@pytest.mark.parametrize("closed", ["cancelled", "superseded", "done"])
def test_failing_a_slice_or_a_partition_leaves_a_closed_partition_as_it_is(
    db: Database[dict[str, Any]], closed: str
) -> None:
    store, token = planned(db)
    held = claim(store, token, ttl_ms=60_000)
    assert isinstance(held, Lease)
    store.partitions.update_one({"_id": held.partition_id}, {"$set": {"status": closed}})

    assert store.fail_slice(held, "boom", max_failures=1) is False
    part = partition(store, held)
    assert part["status"] == closed and part["failures"] == 0 and "lastError" not in part
    assert "lease" not in part  # the slot is freed all the same

    again = claim(store, token, ttl_ms=60_000)  # the other, open partition
    assert isinstance(again, Lease) and again.partition_id != held.partition_id
    store.partitions.update_one({"_id": again.partition_id}, {"$set": {"status": closed}})
    store.fail_partition(again, "over budget")
    part = partition(store, again)
    assert part["status"] == closed and "lastError" not in part and "lease" not in part


def test_failing_an_open_partition_counts_and_fails_it(db: Database[dict[str, Any]]) -> None:
    store, token = planned(db, partitions=1)
    held = claim(store, token, ttl_ms=60_000)
    assert isinstance(held, Lease)
    assert store.fail_slice(held, "first", max_failures=2) is False
    assert partition(store, held)["failures"] == 1
    held = claim(store, token, ttl_ms=60_000)
    assert isinstance(held, Lease)
    assert store.fail_slice(held, "second", max_failures=2) is True
    part = partition(store, held)
    assert part["status"] == "failed" and part["lastError"] == "second" and "lease" not in part


def test_any_checkpoint_resets_the_failure_count(db: Database[dict[str, Any]]) -> None:
    store, token = planned(db, partitions=1)
    held = claim(store, token, ttl_ms=60_000)
    assert isinstance(held, Lease)
    store.partitions.update_one({"_id": held.partition_id}, {"$set": {"failures": 2}})
    store.checkpoint(held, cursor={"lastId": 1}, counters={})  # no counter moved
    assert partition(store, held)["failures"] == 0


# --------------------------------------------------------------------- stored fields, history


def test_partitions_carry_created_at_and_history_entries_carry_from(
    db: Database[dict[str, Any]]
) -> None:
    before = datetime.now()
    store, _ = planned(db)
    for part in store.list_partitions(NAME):
        assert isinstance(part["createdAt"], datetime)
        assert part["createdAt"] >= before.replace(microsecond=0) - _slack()
    history = store.require(NAME)["history"]
    assert history[0]["action"] == "register" and "from" not in history[0]  # a new document
    assert history[-1] == {**history[-1], "action": "plan", "from": "pending", "to": "running"}

    store.register(NAME, status="pending", direction="revert", mode="declarative",
                   collection="items", spec=SPEC, checksum="0" * 64)
    entry = store.require(NAME)["history"][-1]
    assert (entry["action"], entry["from"], entry["to"]) == ("register", "running", "pending")


def test_unlock_writes_a_history_entry_naming_who_and_why(
    db: Database[dict[str, Any]], mongo_uri: str, db_name: str, tmp_path: Any
) -> None:
    store, token = planned(db)
    held = claim(store, token, ttl_ms=60_000)
    assert isinstance(held, Lease)
    with Migrator(uri=mongo_uri, db_name=db_name, migrations_dir=str(tmp_path)) as migrator:
        result = migrator.background.unlock(NAME, requested_by="ops", reason="stuck worker")
    assert result == {"lock": False, "leases": 1}
    entry = store.require(NAME)["history"][-1]
    assert {k: entry.get(k) for k in ("action", "from", "to", "by", "reason")} == {
        "action": "unlock", "from": "running", "to": "running", "by": "ops",
        "reason": "stuck worker"}
    assert "lease" not in partition(store, held)


def test_a_control_stamp_replaces_the_previous_one_whole(db: Database[dict[str, Any]]) -> None:
    """mongod merges a nested document set in a pipeline: the stamp must not keep the last
    control's ``reason`` when the new one gives none."""
    store, _ = planned(db)
    assert store.move(NAME, "pause", by="ops", reason="night", control=True) is not None
    assert store.move(NAME, "resume", control=True) is not None
    control = store.require(NAME)["control"]
    assert control["action"] == "resume" and "reason" not in control
    assert "requestedBy" not in control and isinstance(control["at"], datetime)


def test_the_coordinator_and_plan_stamps_are_whole_objects_with_server_times(
    db: Database[dict[str, Any]]
) -> None:
    store, _ = planned(db)
    store.update_state(NAME, {}, {"coordinator": {"kind": "cli", "ref": "job-1"}},
                       server_times=["coordinator.at"])
    store.update_state(NAME, {}, {"coordinator": {"kind": "runner"}},
                       server_times=["coordinator.at"])
    coordinator = store.require(NAME)["coordinator"]
    assert coordinator["kind"] == "runner" and "ref" not in coordinator
    assert isinstance(coordinator["at"], datetime)


# ------------------------------------------------------------------------------ withdrawal


def test_withdraw_deletes_only_the_registration_and_generation_it_judged(
    db: Database[dict[str, Any]]
) -> None:
    store, _ = planned(db)  # a plan was committed: generation 1
    registration = store.require(NAME)["registration"]
    assert store.withdraw(NAME, registration=registration, generation=0) is False
    assert store.get(NAME) is not None  # a coordinator committed first: nothing deleted
    assert store.partitions.count_documents({"background": NAME}) == 2
    assert store.withdraw(NAME, registration="other", generation=1) is False
    assert store.partitions.count_documents({"background": NAME}) == 2
    assert store.withdraw(NAME, registration=registration, generation=1) is True
    assert store.get(NAME) is None
    assert store.partitions.count_documents({"background": NAME}) == 0


def _slack() -> Any:
    from datetime import timedelta

    return timedelta(seconds=5)


# --------------------------------------------------------------------- counts in one read


def test_counts_and_live_leases_answer_as_the_two_reads_they_replace(
    db: Database[dict[str, Any]]
) -> None:
    """The status view's one ``aggregate`` gives the current plan's counts (leased: set,
    expired or not) and the migration's live leases (any plan, judged by each lease's own TTL)
    exactly as ``count_by_status`` and ``live_leases`` do; so does ``counted`` over the
    partitions as read."""
    store, token = planned(db, partitions=4)
    live = claim(store, token, ttl_ms=60_000, max_parallel=3, owner="live")
    expired = claim(store, token, ttl_ms=60_000, max_parallel=3, owner="expired")
    assert isinstance(live, Lease) and isinstance(expired, Lease)
    age(store, expired, 61_000)
    pending = store.partitions.find_one({"background": NAME, "lease": {"$exists": False}})
    assert pending is not None
    store.partitions.update_one({"_id": pending["_id"]}, {"$set": {"status": "done"}})
    # another plan's partition with a live lease, and another migration's: live counts the first
    other = uuid.uuid4().hex
    store.insert_plan(NAME, 1, other, [{"scope": {"kind": "step"}, "estimate": 0}])
    store.partitions.update_one({"plan": other}, [{"$set": {"lease": {
        "slot": 7, "token": "t", "owner": "o", "ttlMs": 60_000, "renewedAt": "$$NOW"}}}])
    store.insert_plan("another.py", 1, token, [{"scope": {"kind": "step"}, "estimate": 0}])
    store.partitions.update_one({"background": "another.py"}, [{"$set": {"lease": {
        "slot": 0, "token": "t", "owner": "o", "ttlMs": 60_000, "renewedAt": "$$NOW"}}}])

    counts, live_count = store.counts_and_live_leases(NAME, 1, token)
    assert counts == store.count_by_status(NAME, 1, token) == {
        "pending": 1, "running": 2, "done": 1, "failed": 0, "cancelled": 0, "superseded": 0,
        "leased": 2}
    assert live_count == store.live_leases(NAME) == 2
    mine = [p for p in store.generation_partitions(NAME, 1) if p["plan"] == token]
    assert store.counted(mine) == counts
    assert len(store.generation_partitions(NAME, 1)) == 5  # every plan of the generation


def test_counts_and_live_leases_of_a_plan_without_partitions_are_zero(
    db: Database[dict[str, Any]]
) -> None:
    store, _ = planned(db, partitions=1)
    counts, live_count = store.counts_and_live_leases(NAME, 1, "no-such-plan")
    assert counts == store.counted([]) == {
        "pending": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0, "superseded": 0,
        "leased": 0}
    assert live_count == 0
