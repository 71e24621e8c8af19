"""A run confirms its lock before each changelog write and at its release (API level).

The bodies below take the lock away themselves (as ``migronaut unlock`` would) and the heartbeat
is 30 s away (TTL 60 s), so only the run's own confirmation can notice: a renewal before the
record of a step that took 100 ms or more, and the release that finds no lock of its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, Events, applied, calls, make_migrator, write_simple
from migronaut import LockLostError

#: Takes the lock away (the first time it runs), writes its data, then works ``{work}`` s more.
UNLOCKS = """
import time
{header}

{prefix}def up(ctx):
    if {wait}ctx.db["unlocked"].count_documents({{}}) == 0:
        {wait}ctx.db["unlocked"].insert_one({{}})
        {wait}ctx.db["_migronaut_locks"].delete_one({{"_id": "migronaut_lock"}})
    {wait}ctx.db["data"].insert_one({{"by": "body"}}, session=ctx.session)
    time.sleep({work})

def down(ctx):
    pass
"""


def unlocks(*, transaction: bool, work: float, colour: str = "sync") -> str:
    prefix, wait = ("async ", "await ") if colour == "async" else ("", "")
    return UNLOCKS.format(header="use_transaction = True" if transaction else "", work=work,
                          prefix=prefix, wait=wait)


@pytest.mark.parametrize("colour", ["sync", "async"])
def test_a_transaction_whose_lock_was_lost_before_its_record_rolls_back(
    project: Any, db: Any, colour: str
) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_unlocks", unlocks(transaction=True, work=0.15, colour=colour))
    write_simple(project, "0003_c")
    with make_migrator(project) as migrator, pytest.raises(LockLostError) as info:
        events = Events(migrator)
        migrator.up()
    error = info.value
    assert error.exit_code == 10 and error.context["reason"] == "another run reclaimed it"
    assert [(r["file"], r["status"]) for r in error.context["results"]] == [
        ("0001_a.py", "applied"), ("0002_unlocks.py", "error")
    ]
    assert db["data"].count_documents({}) == 0  # rolled back with its record
    assert "0002_unlocks.py" not in {d["name"] for d in db[CHANGELOG].find()}  # no write at all
    assert calls(db) == ["0001_a"]
    assert [e["reason"] for e in events.of("lock:lost")] == ["another run reclaimed it"]
    run = db["_migronaut_runs"].find_one()
    assert run["outcome"] == "lock-lost" and run["lockLost"] == "another run reclaimed it"

    with make_migrator(project) as migrator:  # the next run applies it, once
        assert [r.file for r in migrator.up()] == ["0002_unlocks.py", "0003_c.py"]
    assert db["data"].count_documents({}) == 1


def test_outside_a_transaction_the_done_work_is_recorded_and_the_run_stops(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_unlocks", unlocks(transaction=False, work=0.15))
    write_simple(project, "0002_b")
    with make_migrator(project) as migrator, pytest.raises(LockLostError) as info:
        migrator.up()
    assert [(r["file"], r["status"]) for r in info.value.context["results"]] == [
        ("0001_unlocks.py", "applied")
    ]
    assert applied(db) == ["0001_unlocks.py"]  # its writes are done: a later up must not redo it
    assert calls(db) == []  # 0002 never started
    with make_migrator(project) as migrator:
        assert [r.file for r in migrator.up() if r.status == "applied"] == ["0002_b.py"]
    assert db["data"].count_documents({}) == 1


def test_a_lock_found_gone_at_release_ends_the_run_with_lock_lost(project: Any, db: Any) -> None:
    """A quick last migration gets no renewal of its own; the release is the confirmation."""
    write_simple(project, "0001_a")
    project.write_migration("0002_unlocks", unlocks(transaction=False, work=0))
    with make_migrator(project) as migrator, pytest.raises(LockLostError) as info:
        events = Events(migrator)
        migrator.up()
    assert info.value.context["reason"] == "it was gone at release: force-released or reclaimed"
    assert [r["status"] for r in info.value.context["results"]] == ["applied", "applied"]
    assert events.names[-3:] == ["lock:lost", "lock:released", "run:end"]
    assert events.of("run:end")[0]["success"] is False
    assert db["_migronaut_runs"].find_one()["outcome"] == "lock-lost"
    assert db[LOCKS].count_documents({}) == 0


def test_under_warn_a_lost_lock_only_warns(project: Any, db: Any) -> None:
    project.write_migration("0001_unlocks", unlocks(transaction=True, work=0.15))
    write_simple(project, "0002_b")
    with make_migrator(project, on_lock_lost="warn") as migrator:
        results = migrator.up()
    assert [r.status for r in results] == ["applied", "applied"]
    assert db["data"].count_documents({}) == 1
    assert db["_migronaut_runs"].find_one()["lockLost"] == "another run reclaimed it"


def test_quick_migrations_share_one_confirmation_a_second(project: Any, db: Any) -> None:
    """The cost side: ``up`` of trivial migrations sends one changelog command per migration
    plus one (the first claim; then each outcome travels with the next claim) and no renewal
    while the run lasts under a second."""
    from pymongo import MongoClient
    from pymongo.monitoring import CommandListener

    sent: list[tuple[str, Any]] = []

    class Commands(CommandListener):
        def started(self, event: Any) -> None:
            sent.append((event.command_name, event.command.get(event.command_name)))

        def succeeded(self, event: Any) -> None: ...
        def failed(self, event: Any) -> None: ...

    write_simple(project, *(f"{i:04d}_m" for i in range(1, 21)))
    with MongoClient(project.uri, event_listeners=[Commands()]) as client, \
            make_migrator(project, client=client) as migrator:
        migrator.connect()
        sent.clear()
        migrator.up()
    to_locks = [name for name, target in sent if target == LOCKS]
    assert to_locks in (["update", "delete"], ["update", "update", "delete"])  # ≤ 1 renewal
    assert sum(1 for name, target in sent if (name, target) == ("update", CHANGELOG)) == 21
