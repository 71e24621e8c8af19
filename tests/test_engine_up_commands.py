"""The commands ``up`` sends, counted exactly: what a run of five trivial migrations, a run with
nothing pending and a fleet tenant cost in round trips, so that a cut never silently comes back.

Each scenario records every command a pymongo client sends (``endSessions`` aside) as
``name:collection`` and compares the whole sequence.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.monitoring import (
    CommandFailedEvent,
    CommandListener,
    CommandStartedEvent,
    CommandSucceededEvent,
)

from helpers.engine import CHANGELOG, LOCKS, make_migrator

RUNS = "_migronaut_runs"
BODY = """
def up(ctx):
    ctx.db.things.update_one({"_id": 1}, {"$inc": {"n": 1}}, upsert=True)

def down(ctx):
    ctx.db.things.update_one({"_id": 1}, {"$inc": {"n": -1}})
"""
#: per migration: the final write of the previous one with this one's claim, then the body
STEP = [f"update:{CHANGELOG}", "update:things"]
#: a run of five migrations: the first claim, five bodies each followed by its final write
#: (carrying the next claim), the last final write alone
FIVE = [f"update:{CHANGELOG}"] + ["update:things", f"update:{CHANGELOG}"] * 5
ACQUIRE, RELEASE = f"update:{LOCKS}", f"delete:{LOCKS}"
RUN_START = RUN_END = f"update:{RUNS}"
READ = f"find:{CHANGELOG}"


class Commands(CommandListener):
    """Every command sent, as ``name:collection``, per database (``endSessions`` left out)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def started(self, event: CommandStartedEvent) -> None:
        if event.command_name == "endSessions":
            return
        target = event.command.get(event.command_name)
        with self._lock:
            self.sent.append((event.database_name,
                              f"{event.command_name}:{target if isinstance(target, str) else ''}"))

    def succeeded(self, event: CommandSucceededEvent) -> None:
        pass

    def failed(self, event: CommandFailedEvent) -> None:
        pass

    def take_all(self) -> list[tuple[str, str]]:
        """The (database, command) pairs sent since the last take."""
        with self._lock:
            sent, self.sent = self.sent, []
        return sent

    def take(self, db: str | None = None) -> list[str]:
        """The commands sent (to ``db`` only, when given) since the last take."""
        return [f"{name}:{command}" if db is None else command
                for name, command in self.take_all() if db is None or name == db]


@pytest.fixture
def commands(mongo_uri: str) -> Iterator[tuple[Commands, MongoClient[dict[str, Any]]]]:
    listener = Commands()
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, event_listeners=[listener])
    try:
        yield listener, client
    finally:
        client.close()


def write_five(project: Any) -> None:
    for i in range(1, 6):
        project.write_migration(f"2026010100000{i}_m{i}", BODY)


def test_a_first_up_of_five_reads_the_changelog_twice_and_ensures_each_index_once(
    project: Any, db: Any, commands: tuple[Commands, MongoClient[dict[str, Any]]],
) -> None:
    listener, client = commands
    write_five(project)
    with make_migrator(project, client=client) as migrator:
        migrator.up()
        assert listener.take() == [
            "admin:ping:", f"{project.db_name}:{READ}",  # connect; the check before the lock
        ] + [f"{project.db_name}:{c}" for c in [
            ACQUIRE, f"createIndexes:{RUNS}", RUN_START, f"createIndexes:{CHANGELOG}",
            READ,  # the one read under the lock: in-doubt check, plan and batch
            *FIVE, RELEASE, RUN_END]]
        assert len([c for c in FIVE if c == "update:things"]) == 5
        migrator.up()  # nothing pending, same migrator: no index, no ping
        assert listener.take(project.db_name) == [READ, ACQUIRE, RUN_START, READ, RELEASE,
                                                  RUN_END]
    assert db["things"].find_one({"_id": 1}) == {"_id": 1, "n": 5}
    # the run logged nothing: the log lines' index waits for the first line
    assert f"{RUNS}_logs" not in db.list_collection_names()


def applied_five(project: Any, commands: tuple[Commands, MongoClient[dict[str, Any]]],
                 ) -> tuple[Commands, MongoClient[dict[str, Any]]]:
    """Five migrations applied by a migrator now closed; what it sent is taken (forgotten)."""
    listener, client = commands
    write_five(project)
    with make_migrator(project, client=client) as migrator:
        migrator.up()
    listener.take()
    return listener, client

def test_a_second_migrator_on_the_same_client_sends_no_index_again(
    project: Any, commands: tuple[Commands, MongoClient[dict[str, Any]]],
) -> None:
    listener, client = applied_five(project, commands)
    with make_migrator(project, client=client) as migrator:
        migrator.up()
    assert listener.take(project.db_name) == [READ, ACQUIRE, RUN_START, READ, RELEASE, RUN_END]


def test_a_dropped_database_gets_its_indexes_again(
    project: Any, db: Any, commands: tuple[Commands, MongoClient[dict[str, Any]]],
) -> None:
    listener, client = commands
    write_five(project)
    with make_migrator(project, client=client) as migrator:
        migrator.up()
        client.drop_database(project.db_name)
        listener.take()
        migrator.up()  # the read under the lock finds no record: ensure again, then apply
        sent = listener.take(project.db_name)
    assert sent[:6] == [READ, ACQUIRE, RUN_START, READ, f"createIndexes:{CHANGELOG}",
                        f"createIndexes:{RUNS}"]
    assert sent[6:] == [*FIVE, RELEASE, RUN_END]
    assert db[CHANGELOG].index_information()["name_unique"]["unique"] is True
    assert "startedAt" in db[RUNS].index_information()


def test_a_command_that_does_not_read_the_changelog_checks_for_a_dropped_database(
    project: Any, db: Any, commands: tuple[Commands, MongoClient[dict[str, Any]]],
) -> None:
    listener, client = applied_five(project, commands)
    client.drop_database(project.db_name)
    listener.take()
    with make_migrator(project, client=client) as migrator:  # indexes ensured by another one
        migrator.baseline()
    sent = listener.take(project.db_name)
    assert f"createIndexes:{CHANGELOG}" in sent
    assert db[CHANGELOG].index_information()["name_unique"]["unique"] is True
    assert db[CHANGELOG].count_documents({"status": "applied"}) == 5


def test_up_right_after_status_skips_its_check_before_the_lock(
    project: Any, commands: tuple[Commands, MongoClient[dict[str, Any]]],
) -> None:
    listener, client = commands
    write_five(project)
    with make_migrator(project, client=client) as migrator:
        migrator.up()
        project.write_migration("20260101000006_m6", BODY)
        listener.take()
        migrator.status()
        migrator.up()
        assert listener.take(project.db_name) == [READ, ACQUIRE, RUN_START, READ, *STEP,
                                                  f"update:{CHANGELOG}", RELEASE, RUN_END]
        migrator.up()  # no status just before: the check before the lock is back
        assert listener.take(project.db_name)[:2] == [READ, ACQUIRE]


def test_a_fleet_tenant_costs_its_status_read_and_one_read_under_the_lock(
    project: Any, tenant_prefix: str, commands: tuple[Commands, MongoClient[dict[str, Any]]],
) -> None:
    from migronaut import Fleet

    listener, client = commands
    write_five(project)
    names = [f"{tenant_prefix}a", f"{tenant_prefix}b"]
    project.write("migronaut.toml",
                  f'[fleet]\nnames = {names!r}\nadmin_db = "{tenant_prefix}admin"\n')
    with Fleet(cwd=project.path, client=client, env_file=False, tenant_logger=None) as fleet:
        fleet.tenants()
        listener.take()
        assert fleet.up(concurrency=1).ok
        sent = listener.take_all()
        for name in names:
            assert [command for db_name, command in sent if db_name == name] == [
                READ,  # the status read: its check serves up's, before the lock
                ACQUIRE, f"createIndexes:{RUNS}", RUN_START, f"createIndexes:{CHANGELOG}",
                READ, *FIVE, RELEASE, RUN_END]
        # one ping for the cluster's shared client, none per tenant
        assert [db_name for db_name, command in sent if command == "ping:"] == ["admin"]
        fleet.status()
        assert listener.take(names[0]) == [READ]
        assert fleet.up(concurrency=1).ok  # nothing pending: the status read alone
        assert listener.take(names[0]) == [READ]
