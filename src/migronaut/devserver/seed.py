"""``--seed DB.COLLECTION:N``: a dev server filled with N small orders before it prints its URI.

:func:`parse_seeds` checks the flag's values (before any server starts); :func:`fill` inserts the
documents through the server's own endpoint, as any client would, in ``insert_many`` batches of
:data:`BATCH` (:data:`FILE_BATCH` into a ``--path`` file), reporting progress about every 10 %.

The documents are orders in the shape the background-migration example of ``docs/background.md``
rewrites (``total`` → ``total_cents``, ``from: 1``)::

    {"_id": ObjectId("677485809c65573cc3000000"), "__v": 1, "customer": "customer-03546",
     "status": "paid", "total": 226.61}

Invariants:

* Reproducible: the documents of ``DB.COLLECTION`` depend only on the namespace and their
  position (a random generator seeded with the namespace, per block of :data:`BATCH`), so the
  same flag gives the same documents, ``_id`` included, on every run and with or without
  ``--path``, and a smaller N gives the first N of a larger one. Each ``_id`` is an ObjectId
  whose timestamp is the order's time (one second apart from 2025-01-01 UTC), so ``_id`` order is
  insertion order, as with a driver's ObjectIds.
* Nothing is inserted before every seeded collection was found empty (a ``--path`` file may
  already hold one): a refusal writes nothing.

Importing this module imports neither pymongo nor bson; :func:`fill` and :func:`order_batches`
do.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from migronaut._names import validate_collection_name, validate_db_name
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

__all__ = [
    "BATCH",
    "FILE_BATCH",
    "MAX_DOCUMENTS",
    "MAX_FILE_DOCUMENTS",
    "Seed",
    "fill",
    "order_batches",
    "parse_seeds",
]

#: The flag the refusals name.
FLAG: Final = "--seed"
#: The most documents one dev server is seeded with, over all its ``--seed`` flags.
MAX_DOCUMENTS: Final = 10_000_000
#: The most documents seeded into one collection of a ``--path`` file: mongoeco's SQLite engine
#: reads every stored document of the collection on each insert, so seeding grows with N²
#: (1,000 documents took 33 s, 2,000 took 124 s on a 2-core machine).
MAX_FILE_DOCUMENTS: Final = 2_000
#: Documents per ``insert_many``.
BATCH: Final = 10_000
#: Documents per ``insert_many`` into a ``--path`` file, whose inserts are slow: a stop waits for
#: the batch in flight (a server closed while its SQLite engine was still writing failed to
#: close, "database is locked").
FILE_BATCH: Final = 10
#: MongoDB's limit on ``db.collection`` (bytes, UTF-8).
_MAX_NAMESPACE_BYTES: Final = 255
#: The first order's time (2025-01-01T00:00:00Z); order ``i`` is ``i`` seconds later.
_ORIGIN: Final = 1_735_689_600
#: Order statuses, each as often as it comes in orders (10 % pending, 20 % paid, 20 % shipped,
#: 45 % delivered, 5 % cancelled).
_STATUSES: Final = (("pending",) * 2 + ("paid",) * 4 + ("shipped",) * 4 + ("delivered",) * 9
                    + ("cancelled",))
_CUSTOMERS: Final = 10_000


@dataclass(frozen=True)
class Seed:
    """``count`` documents for ``db.collection``; ``str()`` gives the flag's value back."""

    db: str
    collection: str
    count: int

    @property
    def namespace(self) -> str:
        return f"{self.db}.{self.collection}"

    def __str__(self) -> str:
        return f"{self.namespace}:{self.count}"


def parse_seeds(values: Iterable[str | Seed] | str, *, path: str | None = None) -> tuple[Seed, ...]:
    """The ``--seed`` values checked: each ``DB.COLLECTION:N`` well formed, no namespace twice,
    at most :data:`MAX_DOCUMENTS` in all (:data:`MAX_FILE_DOCUMENTS` a collection with a
    ``path``); a :class:`ConfigInvalidError` naming the flag otherwise. A single string is one
    value; :class:`Seed` values are checked again."""
    items = [values] if isinstance(values, str) else list(values)
    seeds = tuple(_parse(item if isinstance(item, str) else str(item)) for item in items)
    seen: set[str] = set()
    for one in seeds:
        if one.namespace in seen:
            raise _refuse(f"{FLAG} names {one.namespace} twice (one {FLAG} per collection)")
        seen.add(one.namespace)
        if path is not None and one.count > MAX_FILE_DOCUMENTS:
            raise _refuse(
                f"{FLAG} '{one}' with --path: at most {MAX_FILE_DOCUMENTS:,} documents a "
                "collection (the SQLite engine reads the whole collection on each insert, so "
                "seeding a file grows with N²); the in-memory server seeds 100,000 in seconds"
            )
    total = sum(one.count for one in seeds)
    if len(seeds) > 1 and total > MAX_DOCUMENTS:
        raise _refuse(f"{FLAG} asks for {total:,} documents in all; at most {MAX_DOCUMENTS:,}")
    return seeds


def _parse(value: str) -> Seed:
    shown = f"{FLAG} {value!r}"
    namespace, colon, number = value.rpartition(":")
    if not colon:
        raise _refuse(f"{shown} must be DB.COLLECTION:N (no ':N' given)")
    db, dot, collection = namespace.partition(".")
    if not db or not dot or not collection:
        missing = "database" if not db else "collection"
        raise _refuse(f"{shown} must be DB.COLLECTION:N (no {missing} name given)")
    problem = validate_db_name(db)
    if problem is not None:
        raise _refuse(f"{shown}: database name {db!r} {problem}")
    problem = validate_collection_name(collection)
    if problem is None and len(namespace.encode("utf-8")) > _MAX_NAMESPACE_BYTES:
        problem = f"makes a namespace over {_MAX_NAMESPACE_BYTES} bytes"
    if problem is not None:
        raise _refuse(f"{shown}: collection name {collection!r} {problem}")
    if not re.fullmatch(r"[0-9]+", number) or int(number) == 0:
        raise _refuse(f"{shown}: N must be a positive integer (got {number!r})")
    count = int(number)
    if count > MAX_DOCUMENTS:
        raise _refuse(f"{shown}: N must be at most {MAX_DOCUMENTS:,}")
    return Seed(db, collection, count)


def _refuse(message: str) -> ConfigInvalidError:
    return ConfigInvalidError(message, {"flag": FLAG})


def order_batches(namespace: str, count: int) -> Iterator[list[dict[str, Any]]]:
    """The first ``count`` orders of ``namespace`` (see the module docstring), in lists of
    :data:`BATCH` (the last one shorter)."""
    from bson import ObjectId

    # an ObjectId's per-process bytes, fixed per namespace
    machine = random.Random(f"migronaut-seed:{namespace}").randbytes(5)
    for first in range(0, count, BATCH):
        rng = random.Random(f"migronaut-seed:{namespace}:{first}")
        yield [
            {
                "_id": ObjectId((_ORIGIN + i).to_bytes(4, "big") + machine
                                + (i & 0xFFFFFF).to_bytes(3, "big")),
                "__v": 1,
                "customer": f"customer-{rng.randrange(1, _CUSTOMERS + 1):05d}",
                "status": _STATUSES[rng.randrange(len(_STATUSES))],
                "total": round(rng.uniform(5.0, 500.0), 2),
            }
            for i in range(first, min(count, first + BATCH))
        ]


async def fill(
    uri: str,
    seeds: Iterable[Seed],
    *,
    path: str | None = None,
    on_progress: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> bool:
    """Insert each seed's documents through the server at ``uri`` (``path``: its ``--path``
    file, named when a collection there is not empty, and inserted into in :data:`FILE_BATCH`);
    ``True`` when all are in, ``False`` when ``stop`` was set first (checked between batches).

    Every collection is checked empty before the first insert; a batch the server refuses is a
    :class:`ConfigInvalidError` saying how many documents of that collection were inserted.
    ``on_progress`` gets a line about every 10 % of each collection, and one when it is done.
    """
    from pymongo import AsyncMongoClient

    report = on_progress or (lambda _line: None)
    seeds = tuple(seeds)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri, serverSelectionTimeoutMS=10_000)
    async with client:
        for one in seeds:
            held = await client[one.db][one.collection].estimated_document_count()
            if held:
                where = f" in {path}" if path else ""
                raise _refuse(
                    f"{FLAG} {one.namespace}: the collection already holds {held:,} "
                    f"documents{where}; seed only an empty collection (or drop it first)"
                )
        size = BATCH if path is None else FILE_BATCH
        for one in seeds:
            if not await _fill_one(client[one.db][one.collection], one, size, report, stop):
                return False
    return True


async def _fill_one(
    collection: AsyncCollection[dict[str, Any]],
    one: Seed,
    size: int,
    report: Callable[[str], None],
    stop: asyncio.Event | None,
) -> bool:
    """One seed's documents in batches of ``size`` (see :func:`fill`)."""
    from pymongo.errors import PyMongoError

    started = time.perf_counter()
    reported = inserted = 0
    for block in order_batches(one.namespace, one.count):
        for start in range(0, len(block), size):
            if stop is not None and stop.is_set():
                report(f"seeding {one.namespace} stopped: {inserted:,} of {one.count:,} "
                       "documents inserted")
                return False
            batch = block[start:start + size]
            try:
                await collection.insert_many(batch)
            except PyMongoError as error:
                raise _refuse(
                    f"{FLAG} {one.namespace}: the server refused a batch after {inserted:,} "
                    f"of {one.count:,} documents (those stay): {' '.join(str(error).split())}"
                ) from error
            inserted += len(batch)
            tenths = inserted * 10 // one.count
            if reported < tenths < 10:
                reported = tenths
                report(f"seeding {one.namespace}: {inserted:,} of {one.count:,} documents "
                       f"({inserted * 100 // one.count} %)")
    seconds = time.perf_counter() - started
    report(f"seeded {one.namespace}: {one.count:,} documents in {seconds:.1f} s")
    return True
