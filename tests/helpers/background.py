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
