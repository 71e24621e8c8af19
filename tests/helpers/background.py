"""Background migration files and collections for tests: a declarative v0 → v1 migration that
sets ``active: True`` (optionally failing on one document), and a seeded collection with its
version index."""

from __future__ import annotations

from typing import Any


def background_file(*, collection: str = "users", revert: bool = True, requires: str = "",
                    extra_spec: str = "", fail_on: int | None = None,
                    up_too: bool = False) -> str:
    """A declarative v0 → v1 migration setting ``active: True`` (``revert`` pops it again)."""
    revert_fn = '''
def revert(doc, ctx):
    doc.pop("active", None)
    return doc
''' if revert else ""
    up_fn = "\n\ndef up(ctx):\n    pass\n" if up_too else ""
    return f'''
{requires}
FAIL_ON = {fail_on!r}


def migrate(doc, ctx):
    if FAIL_ON is not None and doc.get("n") == FAIL_ON:
        raise ValueError("cannot migrate this one")
    doc["active"] = True
    return doc
{revert_fn}{up_fn}

background = {{
    "collection": {collection!r},
    "from": 0,
    "to": 1,
    "migrate": migrate,
    {'"revert": revert,' if revert else ""}
    "batch_size": 50,
    "pause_ms": 0,
    "slice_ms": 1000,
    "max_parallel": 2,
    "adaptive": False,
    "partitions": {{"min_partition_docs": 50}},
    {extra_spec}
}}
'''


def seed(db: Any, collection: str = "users", docs: int = 120) -> None:
    for start in range(0, docs, 200):
        db[collection].insert_many([{"n": i} for i in range(start, min(docs, start + 200))])
    db[collection].create_index([("__v", 1), ("_id", 1)])


NAME = "0001_users_v1.py"
STATES = "_migronaut_background"
PARTITIONS = "_migronaut_background_partitions"


def migration(*, max_parallel: int = 2, batch_size: int = 50, sleep: float = 0.0,
              fail: bool = False, extra: str = "", collection: str = "users") -> str:
    """A declarative background migration over ``collection`` (v0 → v1, ``active: True``)."""
    return f'''
import time


def migrate(doc, ctx):
    if {fail!r}:
        raise ValueError("cannot migrate this one")
    if {sleep!r}:
        time.sleep({sleep!r})
    doc["active"] = True
    return doc
{extra}

background = {{
    "collection": {collection!r},
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": {batch_size},
    "pause_ms": 0,
    "slice_ms": 1000,
    "max_parallel": {max_parallel},
    "adaptive": False,
    "partitions": {{"min_partition_docs": 50}},
}}
'''


def register(project: Any, cli: Any, db: Any, *, docs: int = 300, name: str = "0001_users_v1",
             collection: str = "users", **options: Any) -> str:
    """Seed ``docs`` documents, write the migration, ``up`` it; returns the registered name."""
    if docs:
        db[collection].insert_many([{"n": i} for i in range(docs)])
    db[collection].create_index([("__v", 1), ("_id", 1)])
    project.write_migration(name, migration(collection=collection, **options))
    result = cli("up")
    assert result.exit_code == 0, result.stderr
    return f"{name}.py"


def leases(db: Any, name: str = NAME) -> int:
    return int(db[PARTITIONS].count_documents({"background": name, "lease": {"$exists": True}}))


def hold_coordinator(db: Any, name: str = NAME) -> None:
    """Another process holds ``background:<name>`` (fresh, 60 s TTL)."""
    db["_migronaut_locks"].update_one(
        {"_id": f"background:{name}"},
        [{"$replaceWith": {"_id": f"background:{name}", "lockedAt": "$$NOW", "pid": 4242,
                           "host": "other-host", "executedBy": "other", "owner": "other",
                           "nonce": "other", "ttlMs": 60_000}}],
        upsert=True,
    )
