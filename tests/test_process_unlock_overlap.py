"""A forced ``unlock`` under a live run, then more ``up`` runs: no migration body runs twice
(real processes; waits on the changelog, never on a timer).

The holder confirms its lock (owner + nonce) before each migration and each changelog write —
amortised: a renewal when the step just finished was slow or the last renewal is a second old —
so it notices the unlock at the end of the migration in flight instead of at its next heartbeat
(TTL/2 = 30 s), and ends with ``LOCK_LOST``. The migration in flight was claimed in the changelog
before its body started: a run started meanwhile finds it ``running`` under a lock that is no
longer its run's and refuses (``MIGRATION_IN_DOUBT``) instead of running it a second time; once
the holder has recorded its outcome, the next run applies the rest.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, wait_until

pytestmark = pytest.mark.slow

COUNT = 8

#: 0.3 s of work, then a marker: one marker per execution of the body. The fourth waits for a
#: gate document (bounded: 60 s), so the unlock lands while it is in flight.
SLOW_MARKING = """
import os
import time

def up(ctx):
    time.sleep(0.3)
    ctx.db["markers"].insert_one({{"name": {name!r}, "pid": os.getpid()}})
    if {name!r} == "0004_slow":
        for _ in range(1200):
            if ctx.db["gate"].find_one({{"_id": "go"}}):
                break
            time.sleep(0.05)

def down(ctx):
    pass
"""


def test_a_forced_unlock_mid_run_never_runs_a_migration_twice(
    project: Any, db: Any, cli_process: Any
) -> None:
    names = [f"{i:04d}_slow" for i in range(1, COUNT + 1)]
    for name in names:
        project.write_migration(name, SLOW_MARKING.format(name=name))
    first = cli_process.start("up", "--json")
    wait_until(lambda: db["markers"].find_one({"name": "0004_slow"}), timeout=60,
               interval=0.01, what="the first run to start its fourth migration")

    unlocked = cli_process("unlock", "--yes", "--force", "--json", timeout=60)
    assert unlocked.exit_code == 0, unlocked.stderr
    assert unlocked.json["holder"]["pid"] == first.pid
    # the run that takes the lock finds the migration in flight claimed by a run that lost its
    # lock: in doubt, not run a second time
    second = cli_process("up", "--json", timeout=120)
    assert second.exit_code == 36, second.stderr
    assert second.json["error"]["code"] == "MIGRATION_IN_DOUBT"
    assert second.json["error"]["context"]["name"] == "0004_slow.py"
    assert second.json["error"]["context"]["pid"] == first.pid
    db["gate"].insert_one({"_id": "go"})
    one = cli_process.wait(first, timeout=120)

    # the first run noticed at its next step: LOCK_LOST, recorded as such, its migration in
    # flight recorded applied (its body finished)
    assert one.exit_code == 10, one.stderr
    assert one.json["error"]["code"] == "LOCK_LOST"
    assert "Lost the migration lock mid-run" in one.stderr
    record = db["_migronaut_runs"].find_one({"pid": first.pid})
    assert record["outcome"] == "lock-lost"
    assert record["error"]["code"] == "LOCK_LOST" and record["lockLost"]
    first_applied = [r["file"] for r in one.json["partial"] if r["status"] == "applied"]
    assert first_applied == [f"{n}.py" for n in names[:4]]  # it stopped after the one in flight

    # the next run applies the rest
    third = cli_process("up", "--json", timeout=120)
    assert third.exit_code == 0, third.stderr
    rest = [r["file"] for r in third.json if r["status"] == "applied"]
    assert rest == [f"{n}.py" for n in names[4:]]

    # every body ran exactly once
    runs = Counter(d["name"] for d in db["markers"].find())
    assert runs == dict.fromkeys(names, 1), runs
    for name in names:
        assert db[CHANGELOG].count_documents({"name": f"{name}.py"}) == 1
        assert db[CHANGELOG].count_documents({"name": f"{name}.py", "status": "applied"}) == 1
    assert db[LOCKS].count_documents({}) == 0
