"""The ``converge`` scenario of ``bench/_driver.py``: the same index work on the same collections
by migronaut's ``converge``, Beanie's ``init_beanie`` and MongoEngine's ``ensure_indexes``.

Each tool, in its own fresh process against its own fresh database, makes two timed passes over
``n`` collections declaring the same three indexes (``{a: 1}``, ``{b: 1, c: -1}``, ``{d: 1}``
unique): the first run creates them, the second finds them in sync. migronaut also runs
``converge --check`` (``Migrator.converge(dry_run=True)``) on the in-sync database. Every pass
builds its own client or entry point inside the timed block (connection set-up is measured, as
a fresh process would pay it); imports and model classes are made before timing.

Beanie and MongoEngine come from migronaut's ``dev`` extra, so this runs in migronaut's
environment (``.venv-3.13``), not the peers' venv.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pymongo import MongoClient

#: the indexes every collection declares, as (keys, unique)
INDEXES: tuple[tuple[tuple[tuple[str, int], ...], bool], ...] = (
    ((("a", 1),), False),
    ((("b", 1), ("c", -1)), False),
    ((("d", 1),), True),
)


def names(n: int) -> list[str]:
    return [f"c{i:03d}" for i in range(n)]


def listed_indexes(uri: str, db_name: str, n: int) -> int:
    """Indexes other than ``_id_`` on the ``n`` collections afterwards (unmeasured check)."""
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        db = client[db_name]
        return sum(1 for name in names(n) for index in db[name].list_indexes()
                   if index["name"] != "_id_")


# ------------------------------------------------------------------------------ migronaut


def migronaut_passes(spec: dict[str, Any], counter: Any, measured: Callable[..., Any]
                     ) -> dict[str, Any]:
    from migronaut.api import Migrator

    declared = [{"name": name, "indexes": [
        {"key": dict(keys), **({"unique": True} if unique else {})} for keys, unique in INDEXES]}
        for name in names(spec["n"])]
    work = Path(spec["workdir"])

    def converge(dry_run: bool) -> Any:
        migrator = Migrator(uri=spec["uri"], db_name=spec["db"], collections=declared,
                            env_file=False, cwd=str(work),
                            client_options={"event_listeners": [counter]})
        with migrator:
            return migrator.converge(dry_run=dry_run)

    out: dict[str, Any] = {}
    for label, dry_run in (("first run", False), ("in-sync run", False),
                           ("in-sync --check", True)):
        with measured(counter) as figure:
            result = converge(dry_run)
        figure["changed"], figure["in_sync"] = result.changed, result.in_sync
        out[label] = figure
    return out


# ------------------------------------------------------------------------------ Beanie


def beanie_models(n: int) -> list[Any]:
    """``n`` Document classes, one per collection, declaring :data:`INDEXES`."""
    from beanie import Document
    from pymongo import IndexModel

    models = []
    for i, name in enumerate(names(n)):
        model = f"Bench{i:03d}"
        settings = type("Settings", (), {  # nested, as pydantic recognizes it by __qualname__
            "__qualname__": f"{model}.Settings", "name": name,
            "indexes": [IndexModel(list(keys), unique=unique) for keys, unique in INDEXES]})
        models.append(type(model, (Document,), {
            "__qualname__": model,
            "__annotations__": {"a": int, "b": int, "c": int, "d": int},
            "__module__": __name__, "a": 0, "b": 0, "c": 0, "d": 0, "Settings": settings}))
    return models


def beanie_passes(spec: dict[str, Any], counter: Any, measured: Callable[..., Any]
                  ) -> dict[str, Any]:
    from beanie import init_beanie
    from pymongo import AsyncMongoClient

    models = beanie_models(spec["n"])

    async def init() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            spec["uri"], event_listeners=[counter])
        try:
            await init_beanie(database=client[spec["db"]], document_models=models)
        finally:
            await client.close()

    out: dict[str, Any] = {}
    for label in ("first run", "in-sync run"):
        with measured(counter) as figure:
            asyncio.run(init())
        out[label] = figure
    return out


# ------------------------------------------------------------------------------ MongoEngine


def mongoengine_classes(n: int) -> list[Any]:
    """``n`` Document classes, one per collection, declaring :data:`INDEXES` (no automatic
    index creation: ``ensure_indexes`` is called explicitly, as the timed work)."""
    import mongoengine

    classes = []
    for i, name in enumerate(names(n)):
        indexes = [{"fields": [("-" if order < 0 else "") + field for field, order in keys],
                    **({"unique": True} if unique else {})} for keys, unique in INDEXES]
        classes.append(type(f"Bench{i:03d}", (mongoengine.Document,), {
            "a": mongoengine.IntField(), "b": mongoengine.IntField(),
            "c": mongoengine.IntField(), "d": mongoengine.IntField(),
            "meta": {"collection": name, "indexes": indexes, "auto_create_index": False,
                     "index_background": False}}))
    return classes


def mongoengine_passes(spec: dict[str, Any], counter: Any, measured: Callable[..., Any]
                       ) -> dict[str, Any]:
    import mongoengine
    from mongoengine.connection import disconnect

    classes = mongoengine_classes(spec["n"])

    def ensure() -> None:
        mongoengine.connect(db=spec["db"], host=spec["uri"], event_listeners=[counter])
        try:
            for cls in classes:
                cls._collection = None  # a fresh collection handle on the new connection
                cls.ensure_indexes()
        finally:
            disconnect()

    out: dict[str, Any] = {}
    for label in ("first run", "in-sync run"):
        with measured(counter) as figure:
            ensure()
        out[label] = figure
    return out


TOOLS: dict[str, Callable[[dict[str, Any], Any, Callable[..., Any]], dict[str, Any]]] = {
    "migronaut": migronaut_passes,
    "beanie": beanie_passes,
    "mongoengine": mongoengine_passes,
}


def run(spec: dict[str, Any], counter_class: Any, measured: Callable[..., Any]
        ) -> dict[str, Any]:
    """One tool's passes (``spec["tool"]``), then the indexes found afterwards."""
    out = TOOLS[spec["tool"]](spec, counter_class(), measured)
    out["indexes_after"] = listed_indexes(spec["uri"], spec["db"], spec["n"])
    return out
