"""Real processes against one database: racing runs, a ``kill -9`` mid-migration, and a lock
force-released under a running process (PRODUCT.md "Process-level tests are real processes").

Synchronisation is always on observable state in the database or on process exits, each wait
bounded; no test sleeps to "let something happen".
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    LOCK_ID,
    LOCKS,
    records,
    server_now,
    wait_until,
)
from helpers.processes import BOOT_SCRIPT, python_processes, wait_for_exits

pytestmark = pytest.mark.slow

COUNT = 10

#: Every migration counts its executions; the first one blocks on a gate document so that the
#: run that won the lock is still holding it while every other process tries (and is refused).
GATED_BODY = """
import time

def up(ctx):
    if {gated}:
        for _ in range(1200):  # bounded: 60 s
            if ctx.db["gate"].find_one({{"_id": "go"}}):
                break
            time.sleep(0.05)
    ctx.db["counters"].update_one({{"_id": {name!r}}}, {{"$inc": {{"n": 1}}}}, upsert=True)
    time.sleep(0.02)

def down(ctx):
    pass
"""


def write_gated(project: Any, count: int = COUNT) -> list[str]:
    names = [f"{i:04d}_step" for i in range(1, count + 1)]
    for i, name in enumerate(names):
        project.write_migration(name, GATED_BODY.format(gated=i == 0, name=name))
    return [f"{n}.py" for n in names]


def assert_exactly_once(db: Any, names: list[str]) -> None:
    counters = {d["_id"]: d["n"] for d in db["counters"].find()}
    assert counters == {n.removesuffix(".py"): 1 for n in names}
    for name in names:
        assert db[CHANGELOG].count_documents({"name": name}) == 1, name
    assert sorted(d["name"] for d in db[CHANGELOG].find({"status": "applied"})) == names


def test_racing_cli_runs_apply_each_migration_exactly_once(
    project: Any, db: Any, cli_process: Any
) -> None:
    names = write_gated(project)
    processes = [cli_process.start("up", "--json") for _ in range(4)]
    losers = wait_for_exits(processes, 3)
    assert len(losers) == 3, "the winner must still be holding the lock at the gate"
    db["gate"].insert_one({"_id": "go"})
    results = {p: cli_process.wait(p, timeout=60) for p in processes}
    winners = [r for p, r in results.items() if p not in losers]
    assert len(winners) == 1
    winner = winners[0]
    assert winner.exit_code == 0, winner.stderr
    assert [(r["file"], r["status"], r["batch"]) for r in winner.json] == [
        (n, "applied", 1) for n in names
    ]
    for process in losers:
        result = results[process]
        assert result.exit_code == 3, result.stderr
        assert result.json["error"]["code"] == "LOCK_ALREADY_HELD", result.stdout
        assert result.json["error"]["context"]["holder"]["pid"] == winner_pid(processes, losers)
    assert_exactly_once(db, names)
    assert len({d["runId"] for d in db[CHANGELOG].find()}) == 1
    assert db[LOCKS].count_documents({}) == 0


def winner_pid(processes: list[Any], losers: list[Any]) -> int:
    return next(p.pid for p in processes if p not in losers)


def test_racing_boots_that_wait_all_succeed_exactly_once(project: Any, db: Any) -> None:
    names = write_gated(project)
    with python_processes(BOOT_SCRIPT, 4, cwd=project.path, env=project.env()) as processes:
        # three processes find the lock held and wait; only then is the winner let through
        wait_until(
            lambda: db["waiters"].count_documents({}) >= 3,
            timeout=60,
            what="three processes waiting for the lock",
        )
        assert all(p.poll() is None for p in processes)
        db["gate"].insert_one({"_id": "go"})
        outputs = []
        for process in processes:
            stdout, stderr = process.communicate(timeout=90)
            assert process.returncode == 0, stderr
            outputs.append(json.loads(stdout))
    applied_counts = sorted(len(o["applied"]) for o in outputs)
    assert applied_counts == [0, 0, 0, COUNT]
    assert sorted(o["upToDate"] for o in outputs) == [False, True, True, True]
    assert sum(o["waited"] for o in outputs) == 3
    assert_exactly_once(db, names)


# ------------------------------------------------------------------------------ kill -9

KILLABLE = """
import time

def up(ctx):
    first_attempt = ctx.db["started"].count_documents({}) == 0
    ctx.db["started"].insert_one({"at": time.time()})
    if first_attempt:
        for _ in range(2400):  # bounded: 120 s — the test kills us long before
            time.sleep(0.05)
    ctx.db["counters"].update_one({"_id": "0002_slow"}, {"$inc": {"n": 1}}, upsert=True)

def down(ctx):
    pass
"""
QUICK = """
def up(ctx):
    ctx.db["counters"].update_one({{"_id": {name!r}}}, {{"$inc": {{"n": 1}}}}, upsert=True)

def down(ctx):
    pass
"""


def test_kill_9_mid_migration_leaves_a_lock_that_expires(
    project: Any, db: Any, cli_process: Any
) -> None:
    project.write_migration("0001_quick", QUICK.format(name="0001_quick"))
    project.write_migration("0002_slow", KILLABLE)
    project.write_migration("0003_quick", QUICK.format(name="0003_quick"))
    env = {"MIGRONAUT_LOCK_TTL": "6"}  # long enough for a loaded machine to start a CLI
    victim = cli_process.start("up", "--json", env=env)
    wait_until(lambda: db["started"].find_one(), timeout=60, what="0002 to start")
    # kill right after a heartbeat renewal, so the lock is as fresh as it gets
    first = db[LOCKS].find_one({"_id": LOCK_ID})["lockedAt"]
    wait_until(
        lambda: db[LOCKS].find_one({"_id": LOCK_ID})["lockedAt"] > first,
        timeout=10,
        what="a heartbeat renewal",
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert victim.returncode == -signal.SIGKILL

    lock = db[LOCKS].find_one({"_id": LOCK_ID})
    assert lock is not None, "a killed process cannot release its lock"
    assert lock["pid"] == victim.pid
    assert lock["owner"] == records(db)["0001_quick.py"]["runId"]
    # the killed migration is claimed by the dead run: in doubt, never applied
    killed = records(db)["0002_slow.py"]
    assert set(records(db)) == {"0001_quick.py", "0002_slow.py"}
    assert killed["status"] == "running" and killed["intent"]["pid"] == victim.pid
    assert killed["intent"]["runId"] == lock["owner"]

    refused = cli_process("up", "--json", env=env, timeout=60)
    assert refused.exit_code == 3, refused.stderr
    assert refused.json["error"]["code"] == "LOCK_ALREADY_HELD"
    assert refused.json["error"]["context"]["holder"]["pid"] == victim.pid
    assert db["started"].count_documents({}) == 1  # the refused run executed nothing

    expiry = db[LOCKS].find_one({"_id": LOCK_ID})["lockedAt"]
    wait_until(
        lambda: (server_now(db) - expiry).total_seconds() > 6.2,
        timeout=20,
        interval=0.1,
        what="the killed run's lock to pass its TTL in server time",
    )
    # the lock is free again, but what the killed body did is unknown: refused until resolved
    doubt = cli_process("up", "--json", env=env, timeout=60)
    assert doubt.exit_code == 36, doubt.stderr
    assert doubt.json["error"]["code"] == "MIGRATION_IN_DOUBT"
    assert doubt.json["error"]["context"]["pid"] == victim.pid
    assert db["started"].count_documents({}) == 1  # the refused run executed nothing
    resolved = cli_process("resolve", "0002_slow.py", "--pending", "--yes", "--reason",
                           "killed before its counter moved", env=env, timeout=60)
    assert resolved.exit_code == 0, resolved.stderr
    rerun = cli_process("up", "--json", env=env, timeout=60)
    assert rerun.exit_code == 0, rerun.stderr
    assert [(r["file"], r["status"]) for r in rerun.json] == [
        ("0002_slow.py", "applied"),
        ("0003_quick.py", "applied"),
    ]
    assert db[LOCKS].count_documents({}) == 0
    for name in ("0001_quick.py", "0002_slow.py", "0003_quick.py"):
        assert db[CHANGELOG].count_documents({"name": name}) == 1
        assert records(db)[name]["status"] == "applied"
    assert {d["_id"]: d["n"] for d in db["counters"].find()} == {
        "0001_quick": 1,
        "0002_slow": 1,
        "0003_quick": 1,
    }
    assert db["started"].count_documents({}) == 2  # killed attempt + the re-run once resolved


# ---------------------------------------------------------------------- forced unlock

SLOW_COOPERATIVE = """
def up(ctx):
    ctx.db["started"].insert_one({{"name": {name!r}}})
    # a slow migration that checks for cancellation between its batches (bounded: 60 s); the
    # test opens the gate for the follow-up run
    for _ in range(600):
        if ctx.cancellation.wait(0.1) or ctx.db["gate"].find_one({{"_id": "go"}}):
            break
    ctx.db["counters"].update_one({{"_id": {name!r}}}, {{"$inc": {{"n": 1}}}}, upsert=True)

def down(ctx):
    pass
"""


def test_force_unlock_mid_run_stops_the_run_before_its_next_migration(
    project: Any, db: Any, cli_process: Any
) -> None:
    for name in ("0001_slow", "0002_slow", "0003_slow"):
        project.write_migration(name, SLOW_COOPERATIVE.format(name=name))
    env = {"MIGRONAUT_LOCK_TTL": "2"}
    runner = cli_process.start("up", "--json", env=env)
    wait_until(lambda: db["started"].find_one(), timeout=60, what="the first migration to start")

    unlocked = cli_process("unlock", "--yes", "--force", "--json", timeout=60)
    assert unlocked.exit_code == 0, unlocked.stderr
    assert unlocked.json["released"] is True
    assert unlocked.json["holder"]["pid"] == runner.pid

    result = cli_process.wait(runner, timeout=60)
    assert result.exit_code == 10, result.stderr
    assert result.json["error"]["code"] == "LOCK_LOST"
    assert "LOCK_LOST" in result.stderr
    assert [d["name"] for d in db["started"].find()] == ["0001_slow"]  # 0002 never started
    assert db[CHANGELOG].count_documents({"name": "0001_slow.py"}) <= 1  # recorded or not
    assert db[CHANGELOG].count_documents({"name": {"$in": ["0002_slow.py", "0003_slow.py"]}}) == 0
    recorded = records(db).get("0001_slow.py", {}).get("status") == "applied"
    partial = result.json.get("partial", [])
    assert [r["file"] for r in partial if r["status"] == "applied"] == (
        ["0001_slow.py"] if recorded else []
    )

    # the next run picks up exactly what is left
    db["gate"].insert_one({"_id": "go"})
    finish = cli_process("up", "--json", env=env, timeout=120)
    assert finish.exit_code == 0, finish.stderr
    for name in ("0001_slow.py", "0002_slow.py", "0003_slow.py"):
        assert db[CHANGELOG].count_documents({"name": name, "status": "applied"}) == 1
    counters = {d["_id"]: d["n"] for d in db["counters"].find()}
    assert counters == {"0001_slow": 1 if recorded else 2, "0002_slow": 1, "0003_slow": 1}
