"""Background migrations on a real sharded cluster (``MIGRONAUT_TEST_URI`` = a mongos with two
shards or more; skipped otherwise). What the simulated mongos cannot show: hashed shard keys
(compound hashed indexes, ``$toHashedIndexKey``, hashed ``min``/``max`` bounds) and reads and
writes that really go to one shard."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Project
from helpers.background import NAME, STATES

pytestmark = pytest.mark.sharded_cluster


def shard(client: Any, db_name: str, key: dict[str, Any], docs: int = 2000) -> None:
    from migronaut.background.planning.sharding import sharded_version_index

    client.admin.command("enableSharding", db_name)
    client.admin.command("shardCollection", f"{db_name}.c", key=key)
    client[db_name].c.create_index(sharded_version_index("__v", key))
    client[db_name].c.insert_many([{"k": i, "g": i % 13, "n": i} for i in range(docs)])


FILE = '''
def migrate(doc, ctx):
    doc["active"] = True
    return doc


background = {
    "collection": "c",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 100,
    "pause_ms": 0,
    "max_parallel": 4,
    "shard_concurrency": 2,
    "adaptive": False,
    "partitions": {"min_partition_docs": 100},
}
'''


@pytest.mark.parametrize("key", [{"k": "hashed"}, {"g": 1, "k": "hashed"}, {"k": 1}])
def test_migration_on_a_real_cluster(key: dict[str, Any], project: Project, cli: Any,
                                     client: Any, db: Any, db_name: str) -> None:
    shard(client, db_name, key)
    project.write_migration("0001_users_v1", FILE)
    assert cli("up").exit_code == 0
    result = cli("background", "run", NAME, "--concurrency", "4")
    assert result.exit_code == 0, result.stderr
    assert db.c.count_documents({"__v": 1, "active": True, "__rev": 1}) == 2000
    state = db[STATES].find_one({"_id": NAME})
    assert state["plan"]["partitioner"] == "shard"
    assert state["plan"]["sharding"]["hashed"] is ("hashed" in key.values())
    assert state["plan"]["epoch"]["key"] == key
