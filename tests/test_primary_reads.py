"""migronaut reads its own state from the primary, whatever read preference the user's URI has.

A user URI with ``readPreference=secondaryPreferred`` is common (reporting replicas); a stale
changelog read from a secondary would apply a migration twice, and a roll-up that read stale
partition counters would lose them for good. The driver only says where a read goes when it
talks to a mongos or a replica set (to a single server it sends no read preference at all), so
against the dev server these tests use its ``--sharded`` mode, a mongos; with
``MIGRONAUT_TEST_URI`` on a replica set, that server itself.

The whole line runs with such a URI — ``up`` (a plain migration and a background
registration), ``status``, ``background run``/``status``, ``lock``, ``logs``, ``audit``, ``down``
— and every command is recorded on the wire: no read of a ``_migronaut*`` collection may carry a
read preference other than primary, while the migration body's own read (``ctx.db``) keeps the
user's ``secondaryPreferred``, which shows the setting reached the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from conftest import Project, project_on
from helpers.background import background_file
from helpers.wire_audit import AUDIT, OWN_PREFIX, Sent

READS = {"find", "aggregate", "count", "distinct", "listIndexes"}
PLAIN = '''
def up(ctx):
    ctx.db.audit_trail.find_one({})   # the user's own read: the URI's read preference
    ctx.db.audit_trail.insert_one({"seen": True})

def down(ctx):
    ctx.db.audit_trail.delete_many({})
'''


@pytest.fixture
def secondary_uri(request: pytest.FixtureRequest, server_hello: dict[str, Any],
                  mongo_uri: str) -> str:
    """A URI with ``readPreference=secondaryPreferred`` on a server the driver routes reads on
    (a replica set or a mongos)."""
    if server_hello.get("setName") or server_hello.get("msg") == "isdbgrid":
        base = mongo_uri
    else:
        base = str(request.getfixturevalue("sharded_uri"))
    return f"{base}{'&' if '?' in base else '/?'}readPreference=secondaryPreferred"


@pytest.fixture
def primary(secondary_uri: str, db_name: str) -> Iterator[Any]:
    """The test's database on that server, read from the primary (for arranging and checks)."""
    client: MongoClient[dict[str, Any]] = MongoClient(
        secondary_uri.replace("secondaryPreferred", "primary"))
    try:
        yield client[db_name]
    finally:
        client.drop_database(db_name)
        client.close()


@pytest.fixture
def project(tmp_path: Path, secondary_uri: str, db_name: str,
            monkeypatch: pytest.MonkeyPatch) -> Project:
    return project_on(tmp_path, secondary_uri, db_name, monkeypatch)


def own_reads(sent: list[Sent]) -> list[Sent]:
    return [s for s in sent if s.command in READS and s.target.startswith(OWN_PREFIX)]


def test_every_read_of_our_state_goes_to_the_primary_under_a_secondary_preferred_uri(
    project: Project, cli: Any, primary: Any
) -> None:
    primary.users.insert_many([{"n": i} for i in range(200)])
    primary.users.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_plain", PLAIN)
    project.write_migration("0002_users_v1", background_file())

    with AUDIT.recording() as sent:
        for argv in (["up"], ["status"], ["background", "run", "0002_users_v1.py"],
                     ["background", "status"], ["lock"], ["logs"], ["audit"], ["status"]):
            result = cli(*argv)
            assert result.exit_code == 0, (argv, result.stderr)

    state = primary["_migronaut_background"].find_one({"_id": "0002_users_v1.py"})
    assert state is not None and state["status"] == "completed"
    assert state["totals"]["migrated"] == 200 and state["totals"]["scanned"] == 200
    assert primary.users.count_documents({"__v": 1, "active": True}) == 200

    reads = own_reads(sent)
    assert {s.target for s in reads} >= {"_migronaut_migrations", "_migronaut_background",
                                         "_migronaut_background_partitions", "_migronaut_locks",
                                         "_migronaut_runs"}
    assert [s for s in reads if s.read_preference != "primary"] == []
    # the migration body's own read kept the user's preference: the setting was in effect
    assert {s.read_preference for s in sent  # (a retried read shows twice)
            if s.command == "find" and s.target == "audit_trail"} == {"secondaryPreferred"}


def test_reverting_under_a_secondary_preferred_uri_reads_the_primary_too(
    project: Project, cli: Any, primary: Any
) -> None:
    project.write_migration("0001_plain", PLAIN)
    assert cli("up").exit_code == 0
    with AUDIT.recording() as sent:
        result = cli("down")
        assert result.exit_code == 0, result.stderr
    assert primary["_migronaut_migrations"].find_one({"name": "0001_plain.py"})["status"] == \
        "reverted"
    reads = own_reads(sent)
    assert reads and [s for s in reads if s.read_preference != "primary"] == []
