"""Background migrations on sharded clusters (reference background §5), on the simulated mongos
(``dev-server --sharded``: answers like a mongos, shard metadata is what the test puts in its
``config`` database, data lives on one node). Tests that need real shards are marked
``sharded_cluster`` and skip unless ``MIGRONAUT_TEST_URI`` is a mongos."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Project
from helpers.background import NAME, STATES, migration

pytestmark = []


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture
def db_name(sharded_client: Any) -> Iterator[str]:
    """The test's database lives on the simulated mongos (overrides the session server's)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    sharded_client.drop_database(name)
    sharded_client.config.collections.delete_many({"_id": {"$regex": f"^{name}\\."}})


@pytest.fixture
def db(sharded_client: Any, db_name: str) -> Any:
    return sharded_client[db_name]


@pytest.fixture
def project(tmp_path: Path, sharded_uri: str, db_name: str,
            monkeypatch: pytest.MonkeyPatch) -> Project:
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.setenv("MIGRONAUT_URI", sharded_uri)
    monkeypatch.setenv("MIGRONAUT_DB", db_name)
    return Project(path=root, uri=sharded_uri, db_name=db_name)


# ------------------------------------------------------------------------ the simulated mongos


def test_dev_server_answers_like_a_mongos(sharded_client: Any, db: Any) -> None:
    from migronaut.core.topology import read_topology

    hello = sharded_client.admin.command("hello")
    assert hello["msg"] == "isdbgrid"
    assert "setName" not in hello and "hosts" not in hello
    assert sharded_client.topology_description.topology_type_name == "Sharded"
    assert read_topology(sharded_client, db["probe"]).kind == "sharded"
    legacy = sharded_client.admin.command("isMaster")
    assert legacy["msg"] == "isdbgrid"


def test_config_database_keeps_shard_metadata(sharded_client: Any, db: Any, db_name: str) -> None:
    from bson import Binary, Int64, MaxKey, MinKey

    from helpers.sharding import hashed_chunks, seed_shard_metadata

    key = {"k": "hashed"}
    chunks = hashed_chunks(key, 4)
    value = seed_shard_metadata(sharded_client, f"{db_name}.c", key, chunks)
    found = sharded_client.config.collections.find_one({"_id": f"{db_name}.c"})
    assert found["key"] == key and found["uuid"] == value
    assert isinstance(value, Binary) and value.subtype == 4
    stored = list(sharded_client.config.chunks.find({"uuid": value}).sort("min", 1))
    assert [c["shard"] for c in stored] == ["shard-a", "shard-b", "shard-a", "shard-b"]
    assert isinstance(stored[0]["min"]["k"], MinKey) and isinstance(stored[-1]["max"]["k"], MaxKey)
    assert all(type(c["max"]["k"]) is Int64 for c in stored[:-1])


def test_min_max_bounds_are_applied(db: Any) -> None:
    """mongoeco ignores ``min``/``max``; the simulated mongos applies them (exclusive max)."""
    from bson import MaxKey, MinKey

    db.c.insert_many([{"_id": i, "k": i % 10, "v": None if i % 2 else 0} for i in range(40)])
    index = [("v", 1), ("k", 1), ("_id", 1)]
    db.c.create_index(index)
    found = db.c.find({}).sort(index).hint(index).min(
        [("v", 0), ("k", 2), ("_id", MinKey())]).max([("v", 0), ("k", 6), ("_id", MinKey())])
    assert [(d["k"], d["_id"]) for d in found] == [
        (2, 2), (2, 12), (2, 22), (2, 32), (4, 4), (4, 14), (4, 24), (4, 34)]
    resumed = db.c.find({"_id": {"$ne": 12}}).sort(index).hint(index).min(
        [("v", 0), ("k", 2), ("_id", 12)]).max([("v", 0), ("k", MaxKey()), ("_id", MinKey())])
    assert [d["_id"] for d in resumed][:3] == [22, 32, 4]


def test_core_runner_lock_changelog_and_transactions_work(project: Project, cli: Any,
                                                          db: Any) -> None:
    project.write_migration("0001_seed", '''
def up(ctx):
    ctx.db.things.insert_one({"n": 1}, session=ctx.session)

def down(ctx):
    ctx.db.things.delete_many({}, session=ctx.session)
''')
    result = cli("up")
    assert result.exit_code == 0, result.stderr
    assert db.things.count_documents({}) == 1
    assert db["_migronaut_migrations"].count_documents({"status": "applied"}) == 1
    assert db["_migronaut_locks"].count_documents({"_id": "migration"}) == 0
    audit = cli("audit")
    assert "Sharded" in audit.stdout, audit.stdout
    down = cli("down")
    assert down.exit_code == 0, down.stderr
    assert db.things.count_documents({}) == 0


def test_unsharded_collection_runs_on_id_ranges(project: Project, cli: Any, db: Any) -> None:
    db.users.insert_many([{"n": i} for i in range(200)])
    db.users.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_users_v1", migration(max_parallel=2))
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME)
    assert result.exit_code == 0, result.stderr
    assert db.users.count_documents({"__v": 1, "active": True}) == 200
    state = db[STATES].find_one({"_id": NAME})
    assert state["status"] == "completed"
    assert state["plan"]["partitioner"] == "id"


def test_sharded_and_standalone_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    from migronaut.devserver import main

    assert main(["--sharded", "--standalone", "--port", "0"]) == 6
    error = capsys.readouterr().err
    assert "--standalone and --sharded exclude each other" in error
