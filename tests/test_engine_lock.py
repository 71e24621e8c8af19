"""The migration lock against a server (reference core §5): acquire, renew, release, staleness,
refusal, force release and a lock lost mid-run."""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

import pytest
from pymongo.errors import AutoReconnect

from helpers.engine import (
    LOCK_ID,
    LOCKS,
    LOSES_LOCK_AND_WAITS,
    Events,
    applied,
    calls,
    captured_logger,
    hold_lock,
    make_migrator,
    records,
    wait_until,
    write_simple,
)
from migronaut import LockAlreadyHeldError, LockLostError
from migronaut.core import lock as lock_module
from migronaut.core.lock import MigrationLock


def new_lock(db: Any, owner: str = "run-a", ttl_ms: int = 60_000) -> MigrationLock:
    return MigrationLock(db[LOCKS], owner=owner, ttl_ms=ttl_ms, executed_by="tester")


def test_acquire_writes_the_holder_document_and_release_deletes_it(db: Any) -> None:
    lock = new_lock(db)
    lock.acquire()
    try:
        doc = db[LOCKS].find_one({"_id": LOCK_ID})
        assert set(doc) == {
            "_id",
            "lockedAt",
            "pid",
            "host",
            "executedBy",
            "owner",
            "nonce",
            "ttlMs",
        }
        assert doc["pid"] == os.getpid() and doc["host"] == socket.gethostname()
        assert doc["owner"] == "run-a" and doc["executedBy"] == "tester"
        assert doc["ttlMs"] == 60_000 and doc["nonce"] == lock.nonce
        assert lock.held
    finally:
        lock.release()
    assert db[LOCKS].count_documents({}) == 0
    assert not lock.held


def test_a_repeating_owner_id_cannot_share_the_lock(db: Any) -> None:
    first, second = new_lock(db, owner="same-id"), new_lock(db, owner="same-id")
    first.acquire()
    try:
        with pytest.raises(LockAlreadyHeldError):
            second.acquire()
        assert not second.held
        assert db[LOCKS].find_one()["nonce"] == first.nonce
    finally:
        first.release()


def test_renew_and_release_are_scoped_by_owner_and_nonce(db: Any) -> None:
    lock = new_lock(db)
    lock.acquire()
    assert lock.renew() is True
    # another run took the lock over (same owner id even): renewals no longer match...
    db[LOCKS].update_one({"_id": LOCK_ID}, {"$set": {"nonce": "successor-nonce"}})
    assert lock.renew() is False
    # ...and our release never deletes the successor's lock
    lock.release()
    assert db[LOCKS].find_one()["nonce"] == "successor-nonce"


def test_a_fresh_lock_is_refused_with_the_holder(db: Any) -> None:
    hold_lock(db, owner="their-run", ttl_ms=45_000)
    lock = new_lock(db)
    with pytest.raises(LockAlreadyHeldError) as info:
        lock.acquire()
    error = info.value
    assert error.exit_code == 3
    holder = error.context["holder"]
    assert holder["pid"] == 4242 and holder["host"] == "other-host"
    assert holder["executedBy"] == "other-user" and holder["runId"] == "their-run"
    assert holder["ttlMs"] == 45_000 and holder["lockedAt"].endswith("Z")
    assert "pid 4242 on other-host (other-user)" in error.message
    assert "their-nonce" not in json.dumps(error.to_dict()) + error.message
    assert db[LOCKS].find_one()["owner"] == "their-run"  # untouched


def test_a_stale_lock_is_reclaimed(db: Any) -> None:
    hold_lock(db, owner="crashed-run", age_ms=5_000, ttl_ms=1_000)  # past its own TTL
    lock = new_lock(db, owner="run-b", ttl_ms=60_000)
    lock.acquire()
    try:
        doc = db[LOCKS].find_one()
        assert doc["owner"] == "run-b" and doc["nonce"] == lock.nonce
    finally:
        lock.release()


def test_a_lock_becomes_reclaimable_once_its_ttl_passes_in_server_time(db: Any) -> None:
    hold_lock(db, owner="crashed-run", age_ms=0, ttl_ms=1_000)
    lock = new_lock(db, owner="run-b", ttl_ms=60_000)
    with pytest.raises(LockAlreadyHeldError):
        lock.acquire()

    def try_acquire() -> bool:
        try:
            lock.acquire()
        except LockAlreadyHeldError:
            return False
        return True

    wait_until(try_acquire, timeout=10, interval=0.1, what="the 1 s TTL to pass")
    try:
        assert db[LOCKS].find_one()["owner"] == "run-b"
    finally:
        lock.release()


def test_a_holder_is_judged_by_its_own_ttl_not_the_acquirers(db: Any) -> None:
    """A holder with a 10 min TTL heartbeats every 5 min: a peer with a 1 s TTL must not take
    its lock in between; a holder whose document has no ``ttlMs`` is judged by the acquirer's."""
    hold_lock(db, owner="slow-heartbeat", age_ms=120_000, ttl_ms=600_000)
    with pytest.raises(LockAlreadyHeldError):
        new_lock(db, owner="impatient", ttl_ms=1_000).acquire()
    assert db[LOCKS].find_one()["owner"] == "slow-heartbeat"

    db[LOCKS].update_one({"_id": LOCK_ID}, {"$unset": {"ttlMs": ""}})  # an older holder
    lock = new_lock(db, owner="run-b", ttl_ms=60_000)
    lock.acquire()  # 120 s old, judged by our 60 s
    try:
        assert db[LOCKS].find_one()["owner"] == "run-b"
    finally:
        lock.release()


def test_a_lock_document_that_cannot_be_read_is_never_taken_over(db: Any) -> None:
    hold_lock(db, owner="odd", age_ms=3_600_000)
    db[LOCKS].update_one({"_id": LOCK_ID}, {"$set": {"lockedAt": "an hour ago"}})
    with pytest.raises(LockAlreadyHeldError) as info:
        new_lock(db, ttl_ms=1_000).acquire()
    assert info.value.context["problems"] == [
        {"field": "lockedAt", "message": "lockedAt 'an hour ago' is not a date"}]
    assert db[LOCKS].find_one()["lockedAt"] == "an hour ago"


@pytest.mark.parametrize("stale", [False, True])
def test_racing_acquirers_get_exactly_one_owner(db: Any, stale: bool) -> None:
    for _round in range(3):
        db[LOCKS].delete_many({})
        if stale:
            hold_lock(db, owner="crashed", age_ms=120_000)
        locks = [new_lock(db, owner=f"run-{i}") for i in range(6)]
        barrier = threading.Barrier(len(locks))
        outcomes: list[str] = []

        def race(
            lock: MigrationLock,
            barrier: threading.Barrier = barrier,
            outcomes: list[str] = outcomes,
        ) -> None:
            barrier.wait()
            try:
                lock.acquire()
                outcomes.append("won")
            except LockAlreadyHeldError:
                outcomes.append("refused")

        threads = [threading.Thread(target=race, args=(lock,)) for lock in locks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(outcomes) == ["refused"] * 5 + ["won"]
        winner = next(lock for lock in locks if lock.held)
        assert db[LOCKS].find_one()["nonce"] == winner.nonce
        winner.release()


def test_the_heartbeat_renews_lockedat(db: Any) -> None:
    lock = new_lock(db, ttl_ms=2_000)  # heartbeat every second
    lock.acquire()
    try:
        first = db[LOCKS].find_one()["lockedAt"]
        wait_until(
            lambda: db[LOCKS].find_one()["lockedAt"] > first, timeout=10, what="a heartbeat renewal"
        )
        assert lock.lost_reason is None
    finally:
        lock.release()
    assert db[LOCKS].count_documents({}) == 0


def test_migrator_lock_info_and_unlock(project: Any, db: Any) -> None:
    with make_migrator(project) as migrator:
        assert migrator.lock_info() is None
        assert migrator.unlock() is None
        hold_lock(db, owner="stuck-run")
        info = migrator.lock_info()
        assert info is not None and info.run_id == "stuck-run" and info.pid == 4242
        assert db[LOCKS].count_documents({}) == 1  # reading never releases
        removed = migrator.unlock()
        assert removed is not None and removed.run_id == "stuck-run"
        assert db[LOCKS].count_documents({}) == 0


def test_a_held_lock_refuses_up_and_down_without_touching_anything(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    with make_migrator(project) as migrator:
        for run in (migrator.up, migrator.down, migrator.redo):
            with pytest.raises(LockAlreadyHeldError):
                run()
        assert [r.status for r in migrator.up(no_lock=True)] == ["applied"]
    assert db[LOCKS].find_one()["owner"] == "someone-else"


def test_the_run_holds_the_lock_and_a_repeating_generate_id_cannot_join_it(
    project: Any, db: Any
) -> None:
    project.write_migration(
        "0001_nested",
        """
        def up(ctx):
            ctx.db["owners"].insert_one(ctx.db["_migronaut_locks"].find_one({}, {"_id": 0}))

        def down(ctx):
            pass
    """,
    )
    refused: list[BaseException] = []
    with (
        make_migrator(project, generate_id=lambda: "fixed-id") as first,
        make_migrator(project, generate_id=lambda: "fixed-id") as second,
    ):

        def second_run(payload: dict[str, Any]) -> None:
            try:
                second.up()
            except BaseException as error:
                refused.append(error)

        first.on("migration:start", second_run)
        first.up()
    assert len(refused) == 1 and isinstance(refused[0], LockAlreadyHeldError)
    assert db["owners"].find_one()["owner"] == "fixed-id"
    assert records(db)["0001_nested.py"]["runId"] == "fixed-id"
    assert db[LOCKS].count_documents({}) == 0


# ---------------------------------------------------------------------- lost mid-run

LOSE_LOCK = """
def up(ctx):
    locks = ctx.db["_migronaut_locks"]
    {action}
    # wait (bounded) until the heartbeat notices and the run cancels us
    cancelled = ctx.cancellation.wait(20)
    ctx.db["observed"].insert_one({{"cancelled": cancelled,
                                   "reason": getattr(ctx.cancellation.reason, "code", None)}})

def down(ctx):
    pass
"""
DELETE = 'locks.delete_one({"_id": "migronaut_lock"})'
REPLACE = (
    'locks.replace_one({"_id": "migronaut_lock"}, {"owner": "usurper", "nonce": "n2", '
    '"pid": 1, "host": "elsewhere", "executedBy": "x", "lockedAt": __import__("datetime")'
    '.datetime.now(__import__("datetime").UTC), "ttlMs": 600000})'
)


@pytest.mark.parametrize("action", ["delete", "replace"])
def test_lock_lost_mid_run_stops_before_the_next_migration(
    project: Any, db: Any, action: str
) -> None:
    project.write_migration(
        "0001_loses_lock", LOSE_LOCK.format(action=DELETE if action == "delete" else REPLACE)
    )
    write_simple(project, "0002_b")
    with (
        captured_logger() as (logger, handler),
        make_migrator(project, lock_ttl_seconds=2, logger=logger) as migrator,
    ):
        events = Events(migrator)
        with pytest.raises(LockLostError) as info:
            migrator.up()
    error = info.value
    assert error.exit_code == 10
    assert error.context["reason"] == "another run reclaimed it"
    assert error.context["aborted"] is True
    assert [(r["file"], r["status"]) for r in error.context["results"]] == [
        ("0001_loses_lock.py", "applied")
    ]
    observed = db["observed"].find_one()
    assert observed["cancelled"] is True and observed["reason"] == "LOCK_LOST"
    assert applied(db) == ["0001_loses_lock.py"]  # the one in flight finished and is recorded
    assert calls(db) == []  # 0002 never started
    assert events.of("lock:lost")[0]["reason"] == "another run reclaimed it"
    assert events.of("run:end")[0]["success"] is False
    assert handler.has("Lost the migration lock mid-run")
    if action == "replace":  # the usurper's lock is never deleted by the loser
        assert db[LOCKS].find_one({"_id": LOCK_ID})["owner"] == "usurper"
    else:
        assert db[LOCKS].count_documents({}) == 0


def test_failing_renewals_lose_the_lock_at_the_deadline(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(self: MigrationLock) -> bool:
        raise AutoReconnect("connection reset by peer")

    monkeypatch.setattr(lock_module.MigrationLock, "renew", unreachable)
    project.write_migration("0001_waits", LOSE_LOCK.format(action="pass"))
    write_simple(project, "0002_b")
    with (
        captured_logger() as (logger, handler),
        make_migrator(project, lock_ttl_seconds=2, logger=logger) as migrator,
        pytest.raises(LockLostError) as info,
    ):
        migrator.up()
    assert info.value.context["reason"] == "no successful renewal within the TTL"
    assert handler.has("Lock renewal failed (1 in a row)")
    assert calls(db) == []


def test_on_lock_lost_warn_keeps_going(project: Any, db: Any) -> None:
    project.write_migration("0001_loses_lock", LOSES_LOCK_AND_WAITS)
    write_simple(project, "0002_b")
    with (
        captured_logger() as (logger, handler),
        make_migrator(project, lock_ttl_seconds=2, on_lock_lost="warn", logger=logger) as migrator,
    ):
        migrator.on("lock:lost", lambda p: db["lost"].insert_one({"reason": p["reason"]}))
        results = migrator.up()
    assert [r.status for r in results] == ["applied", "applied"]
    assert db["lost"].find_one()["reason"] == "another run reclaimed it"
    assert handler.has("Lost the migration lock mid-run")
    assert calls(db) == ["0002_b"]
