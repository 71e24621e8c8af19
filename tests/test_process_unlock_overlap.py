"""A forced ``unlock`` under a live run, then a second ``up``: no migration applies twice beyond
the one in flight (real processes; waits on the changelog, never on a timer).

The holder confirms its lock (owner + nonce) before each migration and each changelog write —
amortised: a renewal when the step just finished was slow or the last renewal is a second old —
so it notices the unlock at the end of the migration in flight instead of at its next heartbeat
(TTL/2 = 30 s), and ends with ``LOCK_LOST``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, wait_until

pytestmark = pytest.mark.slow

COUNT = 8

#: 0.3 s of work, then a marker: one marker per execution of the body.
SLOW_MARKING = """
import os
import time

def up(ctx):
    time.sleep(0.3)
    ctx.db["markers"].insert_one({{"name": {name!r}, "pid": os.getpid()}})

def down(ctx):
    pass
"""


def test_a_forced_unlock_mid_run_lets_at_most_the_migration_in_flight_run_twice(
    project: Any, db: Any, cli_process: Any
) -> None:
    names = [f"{i:04d}_slow" for i in range(1, COUNT + 1)]
    for name in names:
        project.write_migration(name, SLOW_MARKING.format(name=name))
    first = cli_process.start("up", "--json")
    wait_until(lambda: db[CHANGELOG].count_documents({"status": "applied"}) >= 3, timeout=60,
               interval=0.01, what="the first run to apply three migrations")

    unlocked = cli_process("unlock", "--yes", "--json", timeout=60)
    assert unlocked.exit_code == 0, unlocked.stderr
    assert unlocked.json["holder"]["pid"] == first.pid
    second = cli_process("up", "--json", timeout=120)
    one = cli_process.wait(first, timeout=120)

    # the first run noticed at its next step: LOCK_LOST, recorded as such
    assert one.exit_code == 10, one.stderr
    assert one.json["error"]["code"] == "LOCK_LOST"
    assert "Lost the migration lock mid-run" in one.stderr
    record = db["_migronaut_runs"].find_one({"pid": first.pid})
    assert record["outcome"] == "lock-lost"
    assert record["error"]["code"] == "LOCK_LOST" and record["lockLost"]
    first_applied = [r["file"] for r in one.json["partial"] if r["status"] == "applied"]
    assert 3 <= len(first_applied) < COUNT  # it stopped early…

    # …and the second run applied the rest
    assert second.exit_code == 0, second.stderr
    second_applied = [r["file"] for r in second.json if r["status"] == "applied"]
    assert {*first_applied, *second_applied} == {f"{n}.py" for n in names}
    both = set(first_applied) & set(second_applied)
    assert both <= {first_applied[-1]}  # only the one in flight can have been applied by both

    # every body ran once, except at most that one, which ran once in each process
    runs = Counter(d["name"] for d in db["markers"].find())
    assert set(runs) == set(names)
    twice = {f"{name}.py" for name, n in runs.items() if n > 1}
    assert twice == both and max(runs.values()) <= 2, runs
    for name in twice:
        assert len(db["markers"].distinct("pid", {"name": name.removesuffix(".py")})) == 2
    for name in names:
        assert db[CHANGELOG].count_documents({"name": f"{name}.py"}) == 1
        assert db[CHANGELOG].count_documents({"name": f"{name}.py", "status": "applied"}) == 1
    assert db[LOCKS].count_documents({}) == 0
