"""A fleet project for the fleet tests: tenant databases under a prefix unique to the test, two
migrations that count their runs per tenant (``$inc``), and the counters read back."""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient

#: A migration that counts its runs in the tenant's ``counter`` collection; it raises in a tenant
#: whose name ends with ``fail``.
COUNTING = """
def up(ctx):
    if ctx.db.name.endswith("{fail}"):
        raise RuntimeError("this tenant refuses")
    ctx.db.counter.update_one({{"_id": "{name}"}}, {{"$inc": {{"n": 1}}}}, upsert=True)

def down(ctx):
    ctx.db.counter.update_one({{"_id": "{name}"}}, {{"$inc": {{"n": -1}}}}, upsert=True)
"""


def fleet_project(project: Any, prefix: str, *, tenants: int = 6, fail: str = "-none-",
                  extra: str = "") -> list[str]:
    """Two counting migrations and a ``[fleet]`` of ``tenants`` names (``<prefix>a`` …) whose
    run records go to ``<prefix>admin``; returns the names."""
    names = [f"{prefix}{chr(ord('a') + i)}" for i in range(tenants)]
    for i in (1, 2):
        project.write_migration(f"2026010100000{i}_m{i}", COUNTING.format(name=f"m{i}",
                                                                          fail=fail))
    project.write("migronaut.toml",
                  f'[fleet]\nnames = {names!r}\nadmin_db = "{prefix}admin"\n{extra}\n')
    return names


def counters(client: MongoClient[dict[str, Any]], name: str) -> dict[str, int]:
    """How often each migration ran in tenant ``name`` (net of reverts)."""
    return {doc["_id"]: doc["n"] for doc in client[name].counter.find()}
