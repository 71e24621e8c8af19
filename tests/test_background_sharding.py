"""Background migrations on sharded clusters (reference background §5), on the simulated mongos
(``dev-server --sharded``: answers like a mongos, shard metadata is what the test puts in its
``config`` database, data lives on one node). Tests that need real shards are marked
``sharded_cluster`` and skip unless ``MIGRONAUT_TEST_URI`` is a mongos."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bson import Int64, MaxKey, MinKey

from conftest import Project, project_on
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
    return project_on(tmp_path, sharded_uri, db_name, monkeypatch)


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


# ------------------------------------------------------------------------- planning (§5)

VERSION_MATCH = {"__v": {"$in": [None, 0]}}


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "mode": "declarative", "collection": "c", "field": "__v", "from": 0, "to": 1,
        "maxParallel": 4, "batchSize": 50, "shardConcurrency": 1,
        "partitions": {"overPartition": 4, "maxPartitions": 256, "minPartitionDocs": 50,
                       "sampleSize": 10_000},
    }
    base.update(overrides)
    return base


def populate(db: Any, key: dict[str, Any], docs: int = 400, *, index: bool = True,
             collection: str = "c") -> None:
    db[collection].insert_many([{"_id": i, "k": i, "g": i % 7} for i in range(docs)])
    if index:
        from migronaut.background.planning.sharding import sharded_version_index

        db[collection].create_index(sharded_version_index("__v", key))


def plan_for(db: Any, *, shard_aware: str = "auto", **overrides: Any) -> Any:
    import logging

    from migronaut.background.planning.sharding import plan_collection

    return plan_collection(db, VERSION_MATCH, spec(**overrides), hint=None,
                           shard_aware=shard_aware, logger=logging.getLogger("test.sharding"),
                           name="0001_x.py")


def covered(db: Any, plan: Any, key: dict[str, Any]) -> list[int]:
    """Which documents each partition's key range holds, checked to cover each exactly once."""
    from migronaut.background.planning.sharding import sharded_version_index

    index = sharded_version_index("__v", key)
    seen: list[int] = []
    for partition in plan.partitions:
        scope = partition["scope"]
        assert scope["kind"] == "key-range"
        low = [("__v", None), *scope["min"].items()] + ([("_id", MinKey())]
                                                         if "_id" not in key else [])
        high = [("__v", None), *scope["max"].items()] + ([("_id", MinKey())]
                                                          if "_id" not in key else [])
        seen += [d["_id"] for d in db.c.find({}).hint(index).min(low).max(high)]
    return sorted(seen)




def test_chunk_runs_become_groups_with_per_shard_targets(sharded_client: Any, db: Any,
                                                         db_name: str) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata

    key = {"k": 1}
    populate(db, key)
    # a, a, b, b, a, a, b, b: four runs, two per shard
    value = seed_shard_metadata(sharded_client, f"{db_name}.c", key,
                                ranged_chunks(key, [50, 100, 150, 200, 250, 300, 350], run=2))
    plan = plan_for(db)
    assert plan.partitioner == "shard" and plan.method == "chunks"
    assert plan.epoch == {"uuid": value, "key": key}
    assert plan.sharding["mode"] == "chunks" and plan.sharding["shardKey"] == key
    assert plan.sharding["key"] == key  # the Node original's field
    assert plan.sharding["hashed"] is False
    groups = [p["group"] for p in plan.partitions]
    assert set(groups) == {"shard-a", "shard-b"}
    # per shard min(8, 4 × 1, T=16) = 4 over two runs → 2 pieces a run, 8 partitions
    assert len(plan.partitions) == 8 and groups.count("shard-a") == 4
    assert plan.sharding["groupPartitions"] == {"shard-a": 4, "shard-b": 4}
    assert plan.sharding["groups"] == 2  # the Node original's field: how many groups
    assert covered(db, plan, key) == list(range(400))
    estimates = [p["estimate"] for p in plan.partitions]
    assert estimates == sorted(estimates, reverse=True)
    assert plan.estimate == 400 and not plan.at_least



def test_a_capped_count_is_at_least_and_one_lane_keeps_runs_whole(
        sharded_client: Any, db: Any, db_name: str) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata

    key = {"k": 1}
    populate(db, key)
    seed_shard_metadata(sharded_client, f"{db_name}.c", key,
                        ranged_chunks(key, [50, 100, 150, 200, 250, 300, 350], run=2))
    plan = plan_for(db, maxParallel=1)  # T = 1: the count stops at 1 × minPartitionDocs
    assert plan.at_least and plan.estimate == 50
    assert len(plan.partitions) == 4  # one per run
    assert [p["group"] for p in plan.partitions].count("shard-a") == 2
    assert covered(db, plan, key) == list(range(400))


def test_runs_beyond_max_partitions_merge_into_ungrouped_blocks(sharded_client: Any, db: Any,
                                                                db_name: str) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata

    key = {"k": 1}
    populate(db, key)
    seed_shard_metadata(sharded_client, f"{db_name}.c", key,
                        ranged_chunks(key, [50, 100, 150, 200, 250, 300, 350]))  # 8 runs
    plan = plan_for(db, partitions={"overPartition": 4, "maxPartitions": 3,
                                    "minPartitionDocs": 50})
    assert plan.degraded == "ungrouped"
    assert len(plan.partitions) == 3
    assert all("group" not in p for p in plan.partitions)
    assert covered(db, plan, key) == list(range(400))


def test_hashed_first_field_splits_the_hash_range_arithmetically() -> None:
    """The dev server cannot build a compound hashed index (so a hashed key plans untargeted
    there — see the ``sharded_cluster`` test); the slicing itself is pure arithmetic."""
    from helpers.sharding import HASH_MAX, HASH_MIN, hashed_chunks
    from migronaut.background.planning.shard_ranges import split_hashed

    key = {"k": "hashed", "g": 1}
    chunks = hashed_chunks(key, 2)
    pieces = [piece for low, high, _ in chunks for piece in split_hashed(key, low, high, 4, 100.0)]
    assert len(pieces) == 8 and all(estimate == 25.0 for _, _, estimate in pieces)
    assert isinstance(pieces[0][0]["k"], MinKey) and isinstance(pieces[-1][1]["k"], MaxKey)
    for (_, left_max, _), (right_min, _, _) in itertools.pairwise(pieces):
        assert left_max == right_min  # no gap, no overlap
        assert type(right_min["k"]) is Int64 and isinstance(right_min["g"], MinKey)
    span = HASH_MAX - HASH_MIN + 1
    assert [int(low["k"]) for low, _, _ in pieces[1:]] == [
        HASH_MIN + span * i // 8 for i in range(1, 8)]
    narrow = split_hashed(key, {"k": Int64(0), "g": MinKey()}, {"k": Int64(7), "g": MinKey()},
                          4, 10.0)
    assert len(narrow) == 1  # narrower than 2 × parts hash values: kept whole


def test_empty_collection_is_an_empty_plan(sharded_client: Any, db: Any, db_name: str) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata

    key = {"k": 1}
    db.c.create_index([("__v", 1), ("k", 1), ("_id", 1)])
    seed_shard_metadata(sharded_client, f"{db_name}.c", key, ranged_chunks(key, [10]))
    plan = plan_for(db)
    assert (plan.method, plan.partitions, plan.partitioner) == ("empty", [], "shard")
    assert plan.sharding["mode"] == "empty"


def test_unreadable_chunks_plan_one_sampled_run(sharded_client: Any, db: Any,
                                                db_name: str) -> None:
    from helpers.sharding import seed_shard_metadata

    key = {"k": 1}
    populate(db, key)
    seed_shard_metadata(sharded_client, f"{db_name}.c", key, None)
    plan = plan_for(db)
    assert plan.method == "sampled" and plan.sharding["mode"] == "sampled"
    assert len(plan.partitions) == 4  # min(8, 4 × 1, 16) pieces of the one run
    assert all("group" not in p for p in plan.partitions)
    def low(partition: dict[str, Any]) -> int:
        value = partition["scope"]["min"]["k"]
        return -1 if isinstance(value, MinKey) else int(value)

    bounds = sorted(plan.partitions, key=low)
    assert isinstance(bounds[0]["scope"]["min"]["k"], MinKey)
    assert isinstance(bounds[-1]["scope"]["max"]["k"], MaxKey)
    assert covered(db, plan, key) == list(range(400))


def test_chunks_by_ns_before_5_0(sharded_client: Any, db: Any, db_name: str) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata

    key = {"k": 1}
    populate(db, key)
    seed_shard_metadata(sharded_client, f"{db_name}.c", key, ranged_chunks(key, [200]),
                        by_ns=True)
    plan = plan_for(db)
    assert plan.method == "chunks"
    assert {p["group"] for p in plan.partitions} == {"shard-a", "shard-b"}


@pytest.mark.parametrize("situation", ["unsplittable", "unsharded", "off", "step"])
def test_selection_rows_that_use_id_ranges(situation: str, sharded_client: Any, db: Any,
                                           db_name: str) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata
    from migronaut.background.planning.sharding import select_partitioner

    key = {"_id": 1} if situation == "unsplittable" else {"k": 1}
    populate(db, key)
    if situation != "unsharded":
        seed_shard_metadata(sharded_client, f"{db_name}.c", key, ranged_chunks(key, [200]),
                            extra={"unsplittable": True} if situation == "unsplittable" else {})
    import logging

    chosen = select_partitioner(
        db, spec(mode="step") if situation == "step" else spec(),
        shard_aware="off" if situation == "off" else "auto",
        logger=logging.getLogger("test"), name="x")
    assert chosen.mode == "off"
    if situation != "step":
        plan = plan_for(db, shard_aware="off" if situation == "off" else "auto")
        assert plan.partitioner == "id" and plan.epoch is None and plan.sharding is None


def test_not_a_mongos_uses_id_ranges(client: Any) -> None:
    """The session's ordinary dev server: shard metadata is never consulted."""
    import logging

    from migronaut.background.planning.sharding import select_partitioner

    chosen = select_partitioner(client["t_not_sharded"], spec(), shard_aware="auto",
                                logger=logging.getLogger("test"), name="x")
    assert chosen.mode == "off"


def test_missing_sharded_version_index_runs_untargeted_with_key(
        sharded_client: Any, db: Any, db_name: str, caplog: pytest.LogCaptureFixture) -> None:
    from helpers.sharding import ranged_chunks, seed_shard_metadata

    key = {"k": 1}
    populate(db, key, index=False)
    db.c.create_index([("__v", 1), ("_id", 1)])
    value = seed_shard_metadata(sharded_client, f"{db_name}.c", key, ranged_chunks(key, [200]))
    with caplog.at_level("WARNING"):
        plan = plan_for(db)
        plan_for(db)
    assert plan.partitioner == "id"
    assert plan.sharding == {"mode": "untargeted", "hashed": False, "key": key, "shardKey": key}
    assert plan.epoch == {"uuid": value, "key": key}
    warnings = [r.getMessage() for r in caplog.records if "sharded version index" in
                r.getMessage()]
    assert len(warnings) == 1
    assert "{__v: 1, k: 1, _id: 1}" in warnings[0]


def test_unreadable_shard_metadata_runs_untargeted_without_key(
        sharded_client: Any, db: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Code 13 cannot be produced by the dev server (its users' roles are not enforced): the
    read's answer is stubbed, the selection and its warning are real."""
    from migronaut.background.planning import sharding

    populate(db, {"k": 1})
    monkeypatch.setattr(sharding, "read_shard_facts", lambda db, collection: "unauthorized")
    monkeypatch.setattr(sharding, "_warned", set())
    with caplog.at_level("WARNING"):
        plan = plan_for(db)
        plan_for(db)
    assert plan.partitioner == "id" and plan.epoch is None
    assert plan.sharding == {"mode": "untargeted", "hashed": False}
    warnings = [r.getMessage() for r in caplog.records if "clusterMonitor" in r.getMessage()]
    assert len(warnings) == 1


# ------------------------------------------------------------------- group slots (§4.2 step 5)


def grouped_plan(db: Any, groups: list[str | None]) -> Any:
    from migronaut.background.state.store import BackgroundStore

    store = BackgroundStore(db)
    store.ready()
    partitions = [{"scope": {"kind": "key-range", "min": {}, "max": {}}, "estimate": 1,
                   **({"group": g} if g else {})} for g in groups]
    store.insert_plan("m", 1, "tok", partitions)
    return store


def test_racing_claims_never_exceed_shard_concurrency(db: Any) -> None:
    """Eight threads claim at once, three rounds: each group (and the ungrouped ``#k`` slots)
    gets exactly ``shardConcurrency`` = 2 live leases, the other claimers end exhausted."""
    import threading

    store = grouped_plan(db, ["shard-a"] * 6 + ["shard-b"] * 6 + [None] * 3)
    start, claimed = threading.Barrier(9), threading.Barrier(9)
    results: list[Any] = []
    lock = threading.Lock()

    def lane() -> None:
        for _ in range(3):
            start.wait()
            got = store.claim("m", generation=1, plan="tok", max_parallel=8, ttl_ms=60_000,
                              owner="t", shard_concurrency=2)
            with lock:
                results.append(got)
            claimed.wait()

    threads = [threading.Thread(target=lane) for _ in range(8)]
    for thread in threads:
        thread.start()
    partitions = db["_migronaut_background_partitions"]
    for _ in range(3):
        results.clear()
        start.wait()
        claimed.wait()
        held: dict[str, int] = {}
        for doc in partitions.find({"background": "m", "lease": {"$exists": True}}):
            held[doc.get("group") or ""] = held.get(doc.get("group") or "", 0) + 1
        assert held == {"shard-a": 2, "shard-b": 2, "": 2}
        assert sorted(r for r in results if isinstance(r, str)) == ["exhausted"] * 2
        slots = sorted(r.group_slot for r in results if not isinstance(r, str))
        assert slots == ["#0", "#1", "shard-a#0", "shard-a#1", "shard-b#0", "shard-b#1"]
        for lease in results:
            if not isinstance(lease, str):
                store.release(lease)
    for thread in threads:
        thread.join()


def test_claims_on_a_full_shard_end_exhausted(db: Any) -> None:
    import threading

    store = grouped_plan(db, ["shard-a"] * 5)
    barrier = threading.Barrier(4)
    results: list[Any] = []

    def lane() -> None:
        barrier.wait()
        results.append(store.claim("m", generation=1, plan="tok", max_parallel=4,
                                   ttl_ms=60_000, owner="t", shard_concurrency=1))

    threads = [threading.Thread(target=lane) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    leases = [r for r in results if not isinstance(r, str)]
    assert len(leases) == 1 and leases[0].group_slot == "shard-a#0"
    assert sorted(r for r in results if isinstance(r, str)) == ["exhausted"] * 3
    stored = db["_migronaut_background_partitions"].find_one({"lease": {"$exists": True}})
    assert stored["lease"]["groupSlot"] == "shard-a#0" and stored["lease"]["slot"] in range(4)


def test_ungrouped_partitions_share_hash_slots_and_max_parallel_caps_the_total(db: Any) -> None:
    store = grouped_plan(db, [None, None, None, "shard-a", "shard-a"])
    claims = [store.claim("m", generation=1, plan="tok", max_parallel=3, ttl_ms=60_000,
                          owner="t", shard_concurrency=2) for _ in range(4)]
    leases = [c for c in claims[:3] if not isinstance(c, str)]
    assert sorted(lease.group_slot for lease in leases) == ["#0", "#1", "shard-a#0"]
    assert claims[3] == "busy"  # maxParallel 3: every slot held


# --------------------------------------------------------------- end to end (lanes, writes)


def sharded_users(sharded_client: Any, db: Any, db_name: str, *, docs: int = 400,
                  key: dict[str, Any] | None = None, index: bool = True) -> Any:
    """``c``: ``docs`` documents keyed ``k`` (and ``n`` for the transforms), sharded on ``key``
    over four chunk runs (a, a, b, b, a, a, b, b)."""
    from helpers.sharding import ranged_chunks, seed_shard_metadata
    from migronaut.background.planning.sharding import sharded_version_index

    key = key or {"k": 1}
    db.c.insert_many([{"_id": i, "k": (i * 37) % docs, "n": i} for i in range(docs)]
                     + [{"_id": docs, "n": docs}])  # one without a shard key: the null chunk
    if index:
        db.c.create_index(sharded_version_index("__v", key))
    step = docs // 8
    return seed_shard_metadata(sharded_client, f"{db_name}.c", key,
                               ranged_chunks(key, [step * i for i in range(1, 8)], run=2))


def sharded_file(*, transform: str = 'doc["active"] = True', extra: str = "",
                 functions: str = "") -> str:
    """The migration file: ``transform`` is the body of ``migrate`` (before ``return doc``),
    ``extra`` more spec entries, ``functions`` more top-level code."""
    return f'''
def migrate(doc, ctx):
    {transform}
    return doc
{functions}

background = {{
    "collection": "c",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 20,
    "pause_ms": 0,
    "slice_ms": 1000,
    "max_parallel": 4,
    "shard_concurrency": 2,
    "adaptive": False,
    "partitions": {{"min_partition_docs": 20}},
    {extra}
}}
'''


def test_sharded_migration_end_to_end(project: Project, cli: Any, db: Any,
                                      sharded_client: Any, db_name: str) -> None:
    value = sharded_users(sharded_client, db, db_name)
    project.write_migration("0001_users_v1", sharded_file())
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME, "--concurrency", "4")
    assert result.exit_code == 0, result.stderr
    assert db.c.count_documents({}) == 401
    assert db.c.count_documents({"__v": 1, "active": True, "__rev": 1}) == 401
    state = db[STATES].find_one({"_id": NAME})
    assert state["status"] == "completed" and state["pass"] == 1
    assert state["totals"]["migrated"] == 401
    plan = state["plan"]
    assert plan["partitioner"] == "shard" and plan["method"] == "chunks"
    assert plan["epoch"] == {"uuid": value, "key": {"k": 1}}
    # per shard min(8, overPartition 4 × shardConcurrency 2, T 16) = 8 over its two runs
    assert plan["sharding"]["groupPartitions"] == {"shard-a": 8, "shard-b": 8}
    assert plan["sharding"]["groups"] == 2 and plan["sharding"]["key"] == {"k": 1}
    partitions = list(db["_migronaut_background_partitions"].find({"background": NAME}))
    assert {p["group"] for p in partitions} == {"shard-a", "shard-b"}
    assert all(p["status"] == "done" and p["scope"]["kind"] == "key-range" for p in partitions)
    # each document read once: the key ranges do not overlap
    assert sum(p["counters"].get("scanned", 0) for p in partitions) == 401


def test_writes_carry_the_shard_key_and_reads_use_the_index_bounds(
        project: Project, db: Any, sharded_client: Any, sharded_uri: str, db_name: str) -> None:
    from pymongo import MongoClient, monitoring

    from helpers.engine import make_migrator

    class Commands(monitoring.CommandListener):
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def started(self, event: Any) -> None:
            self.seen.append(event)

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    sharded_users(sharded_client, db, db_name, docs=120)
    project.write_migration("0001_users_v1", sharded_file())
    listener = Commands()
    watched: MongoClient[dict[str, Any]] = MongoClient(sharded_uri, event_listeners=[listener])
    try:
        migrator = make_migrator(project, client=watched)
        migrator.up()
        migrator.background.drive(NAME, concurrency=2)
    finally:
        watched.close()
    events = [e for e in listener.seen if e.database_name == db_name]
    updates = [u for e in events if e.command_name == "update" and e.command["update"] == "c"
               for u in e.command["updates"]]
    assert len(updates) == 121
    assert all("k" in u["q"] and "_id" in u["q"] and "__v" in u["q"] for u in updates)
    keyless = [u for u in updates if u["q"]["_id"] == 120]
    assert keyless[0]["q"]["k"] is None  # missing shard key → null
    finds = [e.command for e in events if e.command_name == "find" and e.command["find"] == "c"
             and "min" in e.command]
    assert finds and all(f["hint"] == {"__v": 1, "k": 1, "_id": 1} for f in finds)
    assert all(list(f["sort"]) == ["__v", "k", "_id"] for f in finds)
    assert {f["min"]["__v"] for f in finds} == {None, 0}  # version 0: null region, then 0


def test_lanes_work_a_sharded_plan_the_node_original_committed(
        project: Project, cli: Any, db: Any, sharded_client: Any, sharded_uri: str,
        db_name: str) -> None:
    """The original stores ``sharding {mode, key, groups: <count>}`` (no ``shardKey``, no
    ``index``): Python lanes read the key from ``key``, hint the sharded version index and
    target every write, and status shows the key."""
    from pymongo import MongoClient, monitoring

    from helpers.engine import make_migrator

    class Commands(monitoring.CommandListener):
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def started(self, event: Any) -> None:
            self.seen.append(event)

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    sharded_users(sharded_client, db, db_name, docs=120)
    project.write_migration("0001_users_v1", sharded_file())
    with make_migrator(project) as migrator:
        migrator.up()
        assert migrator.background.coordinate(NAME).next == "process"  # plan committed
    node_sharding = {"mode": "chunks", "key": {"k": 1}, "groups": 2}
    assert db[STATES].update_one({"_id": NAME},
                                 {"$set": {"plan.sharding": node_sharding}}).modified_count == 1
    listener = Commands()
    watched: MongoClient[dict[str, Any]] = MongoClient(sharded_uri, event_listeners=[listener])
    try:
        make_migrator(project, client=watched).background.drive(NAME, concurrency=2)
    finally:
        watched.close()
    state = db[STATES].find_one({"_id": NAME})
    assert state["status"] == "completed" and state["totals"]["migrated"] == 121
    assert db.c.count_documents({"__v": 1, "active": True, "__rev": 1}) == 121
    events = [e for e in listener.seen if e.database_name == db_name]
    updates = [u for e in events if e.command_name == "update" and e.command["update"] == "c"
               for u in e.command["updates"]]
    assert len(updates) == 121 and all("k" in u["q"] for u in updates)
    finds = [e.command for e in events if e.command_name == "find" and e.command["find"] == "c"
             and "min" in e.command]
    assert finds and all(f["hint"] == {"__v": 1, "k": 1, "_id": 1} for f in finds)
    view = cli("background", "status", "--json").json["background"][0]
    assert view["sharding"] == {"mode": "chunks", "shardKey": {"k": 1}, "hashed": False}


def test_a_transform_changing_the_shard_key_is_a_document_error(
        project: Project, cli: Any, db: Any, sharded_client: Any, db_name: str) -> None:
    sharded_users(sharded_client, db, db_name, docs=80)
    project.write_migration("0001_users_v1", sharded_file(
        transform='''doc["active"] = True
    if doc["n"] == 7:
        doc["k"] = doc["k"] + 1
    if doc["n"] == 8:
        doc["k"] = float(doc["k"])  # the same number: not a change''',
        extra='"max_document_errors": 5,'))
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME)
    assert result.exit_code == 0, result.stderr
    assert "__v" not in db.c.find_one({"_id": 7})
    assert db.c.find_one({"_id": 8})["__v"] == 1
    state = db[STATES].find_one({"_id": NAME})
    assert state["badIds"] == [7]
    errors = [e for e in state["docErrors"] if e["reason"] == "shard-key-changed"]
    assert errors and errors[0]["error"] == (
        "the transform changed the shard key field 'k' — a background migration never moves a "
        "document to another shard; use an ordinary (transactional) migration or "
        "reshardCollection to change shard-key values")


def test_untargeted_with_key_guards_and_targets_writes(
        project: Project, cli: Any, db: Any, sharded_client: Any, db_name: str) -> None:
    """No sharded version index: ``_id`` ranges, but writes still carry the key and the
    shard-key guard still applies."""
    sharded_users(sharded_client, db, db_name, docs=60, index=False)
    db.c.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_users_v1", sharded_file(
        transform='''doc["active"] = True
    if doc["n"] == 3:
        doc["k"] = "moved"''', extra='"max_document_errors": 5,'))
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME)
    assert result.exit_code == 0, result.stderr
    assert "no sharded version index {__v: 1, k: 1, _id: 1}" in result.stderr
    state = db[STATES].find_one({"_id": NAME})
    assert state["plan"]["partitioner"] == "id"
    assert state["plan"]["sharding"] == {"mode": "untargeted", "hashed": False,
                                         "key": {"k": 1}, "shardKey": {"k": 1}}
    assert state["badIds"] == [3]
    assert state["docErrors"][-1]["reason"] == "shard-key-changed"
    assert db.c.count_documents({"__v": 1}) == 60
    status = cli("background", "status").stdout
    assert f"{NAME}: sharded — untargeted · key {{k: 1}}" in status


def test_transactional_batches_on_key_ranges(project: Project, cli: Any, db: Any,
                                            sharded_client: Any, db_name: str) -> None:
    sharded_users(sharded_client, db, db_name, docs=100)
    project.write_migration("0001_users_v1", sharded_file(extra='"transaction": True,'))
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME)
    assert result.exit_code == 0, result.stderr
    assert db.c.count_documents({"__v": 1, "__rev": 1}) == 101
    partitions = list(db["_migronaut_background_partitions"].find({"background": NAME}))
    assert sum(p["counters"].get("scanned", 0) for p in partitions) == 101


# ----------------------------------------------------------------- key-range reads (units)


def key_ranges(key: dict[str, Any], source: int = 0) -> Any:
    from migronaut.background.lanes.key_ranges import KeyRanges
    from migronaut.background.planning.sharding import sharded_version_index

    return KeyRanges(key, dict(sharded_version_index("__v", key)), "__v", source, VERSION_MATCH)


def test_ranged_reads_walk_null_then_zero_with_a_keyset_cursor() -> None:
    reader = key_ranges({"k": 1, "g": 1})
    scope = {"min": {"k": 10, "g": MinKey()}, "max": {"k": 20, "g": MinKey()}}
    first = reader.read(scope, {})
    assert first.min == [("__v", None), ("k", 10), ("g", MinKey()), ("_id", MinKey())]
    assert first.max == [("__v", None), ("k", 20), ("g", MinKey()), ("_id", MinKey())]
    assert first.sort == [("__v", 1), ("k", 1), ("g", 1), ("_id", 1)]
    assert first.filter == {"$and": [VERSION_MATCH, {"k": {"$gte": 10, "$lt": 20}}]}
    last = {"_id": 5, "k": 12, "n": 1}  # no g: indexed as null
    cursor = reader.advance({}, last=last, full=True)
    assert cursor == {"region": 0, "tuple": {"_id": 5, "k": 12, "g": None}}
    resumed = reader.read(scope, cursor)
    assert resumed.min == [("__v", None), ("k", 12), ("g", None), ("_id", 5)]
    assert {"_id": {"$nin": [5]}} in resumed.filter["$and"]
    assert reader.advance(cursor, last=None, full=False) == {"region": 1}
    assert reader.read(scope, {"region": 1}).min[0] == ("__v", 0)
    assert reader.advance({"region": 1}, last=None, full=False) is None
    assert key_ranges({"k": 1}, source=2).advance({}, last=None, full=False) is None


def test_targeting_predicate_rules() -> None:
    reader = key_ranges({"k": 1, "g": 1})

    def targeting(low: Any, high: Any, g: Any = None) -> Any:
        upper = {"k": high, "g": MinKey() if g is None else g}
        query = reader.read({"min": {"k": low, "g": MinKey()}, "max": upper}, {}).filter
        return query["$and"][1] if "$and" in query else None

    assert targeting(1, 5) == {"k": {"$gte": 1, "$lt": 5}}
    assert targeting(1, 5, g=7) == {"k": {"$gte": 1, "$lte": 5}}  # the next chunk may hold k=5
    assert targeting(MinKey(), 5) is None
    assert targeting(1, MaxKey()) is None
    assert targeting(1, "a") is None  # different value classes
    hashed = key_ranges({"k": "hashed"}).read(
        {"min": {"k": Int64(1)}, "max": {"k": Int64(9)}}, {})
    assert hashed.filter == VERSION_MATCH and hashed.sort is None


def test_hashed_partitions_drain_and_move_on_past_100_stuck() -> None:
    from migronaut.background.lanes.key_ranges import STUCK_MAX

    reader = key_ranges({"k": "hashed"})
    scope = {"min": {"k": Int64(-10)}, "max": {"k": Int64(10)}}
    cursor = reader.advance({}, last={"_id": 1, "k": 3}, full=True, stuck=[4, 5])
    assert cursor == {"region": 0, "stuck": [4, 5]}
    again = reader.read(scope, cursor)
    assert again.min[1] == ("k", Int64(-10))  # restarts at the range start
    assert {"_id": {"$nin": [4, 5]}} in again.filter["$and"]
    crowded = reader.advance(cursor, last={"_id": 9}, full=True,
                             stuck=list(range(100, 100 + STUCK_MAX)))
    assert crowded == {"region": 1}  # more than 100 stuck: the next region
    assert reader.advance({"region": 1, "stuck": [1]}, last=None, full=False) is None


def test_shard_key_guard_compares_numbers_by_value() -> None:
    from bson import Decimal128

    from migronaut.background.lanes.key_ranges import changed_key_field

    fields = ["k", "a.b"]
    before = {"k": Int64(5), "a": {"b": "x"}}
    assert changed_key_field(before, {"k": 5, "a": {"b": "x"}}, fields) is None
    assert changed_key_field(before, {"k": 5.0, "a": {"b": "x"}}, fields) is None
    assert changed_key_field(before, {"k": Decimal128("5"), "a": {"b": "x"}}, fields) is None
    assert changed_key_field(before, {"k": 6, "a": {"b": "x"}}, fields) == "k"
    assert changed_key_field(before, {"k": "5", "a": {"b": "x"}}, fields) == "k"
    assert changed_key_field(before, {"k": True, "a": {"b": "x"}}, fields) == "k"
    assert changed_key_field(before, {"k": 5, "a": {"b": "y"}}, fields) == "a.b"
    assert changed_key_field({"k": 1}, {"k": 1, "a": None}, fields) is None  # missing == null
    assert changed_key_field({"k": float("nan")}, {"k": float("nan")}, ["k"]) == "k"


# ------------------------------------------------------------------------------- reshard (§5)


def test_reshard_mid_run_replans_the_same_pass(project: Project, cli: Any, db: Any,
                                               sharded_client: Any, db_name: str) -> None:
    """The transform reshards the collection (a new uuid) at its 50th document and slows down:
    lanes answer stale, the coordinator replans the pass from its start with the new epoch."""
    old = sharded_users(sharded_client, db, db_name, docs=200)
    marker = project.path / "resharded"
    project.write_migration("0001_users_v1", sharded_file(transform=f'''doc["active"] = True
    import os, pathlib, time
    if not pathlib.Path({str(marker)!r}).exists():
        if doc["n"] % 4 == 1:
            from pymongo import MongoClient
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from helpers.sharding import reshard
            with MongoClient(os.environ["MIGRONAUT_URI"]) as client:
                reshard(client, os.environ["MIGRONAUT_DB"] + ".c")
            pathlib.Path({str(marker)!r}).write_text("x")
    else:
        time.sleep(0.02)''', extra='"max_parallel": 2,'))
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME, "--concurrency", "2")
    assert result.exit_code == 0, result.stderr
    assert marker.exists()
    state = db[STATES].find_one({"_id": NAME})
    assert state["status"] == "completed"
    assert state["pass"] == 1 and state["generation"] >= 2
    new = sharded_client.config.collections.find_one({"_id": f"{db_name}.c"})["uuid"]
    assert new != old and state["plan"]["epoch"]["uuid"] == new
    assert db.c.count_documents({"__v": 1, "active": True, "__rev": 1}) == 201
    # replanned while documents were left: the lanes stopped on the stale epoch
    assert state["plan"]["estimate"] > 0 and state["plan"]["method"] == "chunks"


def test_epoch_is_stale_when_the_uuid_or_the_key_changes(sharded_client: Any, db: Any,
                                                         db_name: str) -> None:
    from helpers.sharding import ranged_chunks, reshard, seed_shard_metadata
    from migronaut.background.planning.sharding import epoch_is_stale

    key = {"k": 1}
    value = seed_shard_metadata(sharded_client, f"{db_name}.c", key, ranged_chunks(key, [5]))
    epoch = {"uuid": value, "key": key}
    assert not epoch_is_stale(db, "c", epoch)
    assert not epoch_is_stale(db, "c", None)
    sharded_client.config.collections.update_one(
        {"_id": f"{db_name}.c"}, {"$set": {"key": {"k": 1, "g": 1}}})  # refineCollectionShardKey
    assert epoch_is_stale(db, "c", epoch)
    fresh = reshard(sharded_client, f"{db_name}.c", key=key)
    assert epoch_is_stale(db, "c", epoch)
    assert not epoch_is_stale(db, "c", {"uuid": fresh, "key": key})
    sharded_client.config.collections.delete_one({"_id": f"{db_name}.c"})
    assert epoch_is_stale(db, "c", {"uuid": fresh, "key": key})  # no longer sharded


# -------------------------------------------------------------------------------- status (§6.2)


def test_status_shows_the_sharding(project: Project, cli: Any, db: Any, sharded_client: Any,
                                   db_name: str) -> None:
    sharded_users(sharded_client, db, db_name, docs=80)
    project.write_migration("0001_users_v1", sharded_file())
    assert cli("up").exit_code == 0
    assert cli("background", "run", NAME, "--once").exit_code == 0
    human = cli("background", "status")
    assert human.exit_code == 0, human.stderr
    assert f"{NAME}: sharded — chunks · key {{k: 1}} · shard-a 8, shard-b 8" in human.stdout
    view = cli("background", "status", "--json").json["background"][0]
    assert view["sharding"] == {"mode": "chunks", "shardKey": {"k": 1}, "hashed": False,
                                "groups": {"shard-a": 8, "shard-b": 8}}
    rows = cli("background", "status", NAME, "--partitions", "--json").json["partitions"]
    assert {row["scope"]["group"] for row in rows} == {"shard-a", "shard-b"}
    assert all(row["scope"]["kind"] == "key-range" and row["group"] for row in rows)
    table = cli("background", "status", NAME, "--partitions")
    assert "key range @shard-a" in table.stdout


def test_status_of_an_unsharded_collection_has_no_sharding(project: Project, cli: Any,
                                                           db: Any) -> None:
    db.c.insert_many([{"n": i} for i in range(10)])
    project.write_migration("0001_users_v1", sharded_file())
    assert cli("up").exit_code == 0
    assert cli("background", "run", NAME).exit_code == 0
    assert "sharding" not in cli("background", "status", "--json").json["background"][0]
    assert "sharded —" not in cli("background", "status").stdout


def test_a_conflicting_application_write_is_retried_on_key_ranges(
        project: Project, cli: Any, db: Any, sharded_client: Any, db_name: str) -> None:
    """The application bumps document 5's revision while its batch is being transformed: the
    guarded write misses, the re-read (by ``_id`` and shard key) finds it still at the source
    version, and the next round migrates it."""
    sharded_users(sharded_client, db, db_name, docs=60)
    marker = project.path / "bumped"
    project.write_migration("0001_users_v1", sharded_file(transform=f'''doc["active"] = True
    import os, pathlib
    if doc["n"] == 5 and not pathlib.Path({str(marker)!r}).exists():
        from pymongo import MongoClient
        with MongoClient(os.environ["MIGRONAUT_URI"]) as client:
            client[os.environ["MIGRONAUT_DB"]].c.update_one(
                {{"_id": 5}}, {{"$set": {{"__rev": 7, "app": True}}}})
        pathlib.Path({str(marker)!r}).write_text("x")'''))
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME)
    assert result.exit_code == 0, result.stderr
    doc = db.c.find_one({"_id": 5})
    assert doc["__v"] == 1 and doc["__rev"] == 8 and doc["app"] is True and doc["active"]
    state = db[STATES].find_one({"_id": NAME})
    assert state["totals"]["retried"] == 1 and state["totals"]["migrated"] == 61


def test_revert_walks_the_version_1_region(project: Project, cli: Any, db: Any,
                                           sharded_client: Any, db_name: str) -> None:
    sharded_users(sharded_client, db, db_name, docs=100)
    project.write_migration("0001_users_v1", sharded_file(extra='"revert": revert,', functions='''
def revert(doc, ctx):
    doc.pop("active", None)
    return doc
'''))
    assert cli("up").exit_code == 0
    assert cli("background", "run", NAME).exit_code == 0
    assert db.c.count_documents({"__v": 1}) == 101
    assert cli("down").exit_code == 0
    run = cli("background", "run", NAME, "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json["background"][0]["totals"]["migrated"] == 101
    assert run.json["background"][0]["sharding"]["mode"] == "chunks"
    assert db.c.count_documents({"__v": {"$exists": True}}) == 0
    assert db.c.count_documents({"active": {"$exists": True}}) == 0
    assert db.c.count_documents({"__rev": 2}) == 101
