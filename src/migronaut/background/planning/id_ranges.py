"""Cutting a background migration's documents into ``_id`` ranges (the ``'id'`` partitioner).

Invariant: a range never spans two BSON type brackets (``$gt``/``$lt`` compare only within a
bracket), and nothing depends on exactness — gaps are caught by the final count, overlaps are
harmless because every write is guarded by the version filter. So the planner samples, rounds and
may degrade freely. Sorting happens on the server, never in Python (mixed BSON types).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = [
    "BRACKETS",
    "RANDOM_CURSOR_SHARE",
    "Plan",
    "bracket_of",
    "bracket_of_value",
    "index_named",
    "plan_id_ranges",
    "sample_first_draw",
    "scope_filter",
    "target_count",
]

#: (name, $type aliases, splittable) in server sort order (reference background §3.2).
BRACKETS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("minKey", ("minKey",), False),
    ("null", ("null",), False),
    ("number", ("int", "long", "double", "decimal"), True),
    ("string", ("string", "symbol"), True),
    ("object", ("object",), False),
    ("binData", ("binData",), True),
    ("objectId", ("objectId",), True),
    ("bool", ("bool",), False),
    ("date", ("date",), True),
    ("timestamp", ("timestamp",), True),
    ("exotic", ("regex", "dbPointer", "javascript", "javascriptWithScope"), False),
    ("maxKey", ("maxKey",), False),
)
_BY_ALIAS = {alias: name for name, aliases, _ in BRACKETS for alias in aliases}
_TYPES = {name: aliases for name, aliases, _ in BRACKETS}
_SPLITTABLE = {name: split for name, _, split in BRACKETS}
SAMPLE_TIMEOUT_MS = 30_000
MAX_SAMPLE = 100_000
#: A sample-first ``$sample`` draws under this share of the collection, so the server uses its
#: random cursor (above ~5 % it sorts the whole collection instead).
RANDOM_CURSOR_SHARE = 0.049


@dataclass
class Plan:
    """A computed plan: partitions (largest first) and what the plan document records."""

    partitions: list[dict[str, Any]] = field(default_factory=list)
    method: str = "empty"
    estimate: int = 0
    at_least: bool = False
    degraded: str | None = None
    #: ``'id'`` or ``'shard'`` (reference §5)
    partitioner: str = "id"
    #: ``{uuid, key}`` of a sharded collection whose key is known (stale after a reshard)
    epoch: dict[str, Any] | None = None
    #: ``{mode, shardKey?, hashed, groups?, index?}`` on a sharded collection
    sharding: dict[str, Any] | None = None

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "estimate": self.estimate,
                               "partitioner": self.partitioner, "epoch": self.epoch}
        if self.at_least:
            out["atLeast"] = True
        if self.degraded:
            out["degraded"] = self.degraded
        if self.sharding is not None:
            out["sharding"] = self.sharding
        return out


def index_named(
    index_information: Mapping[str, Any], keys: Sequence[tuple[str, Any]]
) -> str | None:
    """The name of the index whose key is exactly ``keys`` (``1`` and ``1.0`` are the same)."""
    wanted = [(name, _direction(value)) for name, value in keys]
    for index_name, info in index_information.items():
        if [(name, _direction(value)) for name, value in info.get("key", [])] == wanted:
            return str(index_name)
    return None


def _direction(value: Any) -> Any:
    return int(value) if isinstance(value, (int, float)) else value


def sample_first_draw(size: int, matched: float, total: int) -> int:
    """How many documents a sample-first ``$sample`` draws so about ``size`` of them match.

    ``matched`` of the collection's ``total`` documents match; the draw stays within
    :data:`MAX_SAMPLE` and :data:`RANDOM_CURSOR_SHARE` of the collection.
    """
    draw = min(MAX_SAMPLE, math.ceil(size * total / max(matched, 1.0)))
    return max(1, min(draw, max(1, int(total * RANDOM_CURSOR_SHARE))))


def bracket_of(type_alias: str) -> str:
    return _BY_ALIAS.get(type_alias, "exotic")


def scope_filter(scope: Mapping[str, Any]) -> dict[str, Any]:
    """The ``_id`` condition of an ``id-range`` partition scope."""
    condition: dict[str, Any] = {"$type": list(scope.get("types") or _TYPES[scope["bracket"]])}
    if "gte" in scope:
        condition["$gte"] = scope["gte"]
    if "lt" in scope:
        condition["$lt"] = scope["lt"]
    return {"_id": condition}


def target_count(spec: Mapping[str, Any]) -> int:
    max_parallel = int(spec.get("maxParallel", 1))
    if max_parallel == 1:
        return 1
    partitions = spec.get("partitions") or {}
    over = int(partitions.get("overPartition", 4))
    return max(1, min(over * max_parallel, int(partitions.get("maxPartitions", 256))))


def _scope(bracket: str, gte: Any = None, lt: Any = None, *, has_gte: bool = False,
           has_lt: bool = False) -> dict[str, Any]:
    scope: dict[str, Any] = {"kind": "id-range", "bracket": bracket, "types": list(_TYPES[bracket])}
    if has_gte:
        scope["gte"] = gte
    if has_lt:
        scope["lt"] = lt
    return scope


def bracket_of_value(value: Any) -> str | None:
    """The bracket of an ``_id`` as pymongo decoded it; ``None`` when unsure."""
    from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp

    if isinstance(value, bool):
        return "bool"
    if value is None:
        return "null"
    for kinds, name in (
        ((int, float, Int64, Decimal128), "number"), ((str,), "string"),
        ((ObjectId,), "objectId"), ((dt.datetime,), "date"),
        ((bytes, Binary, uuid.UUID), "binData"),
        ((dict,), "object"), ((Timestamp,), "timestamp"), ((MinKey,), "minKey"),
        ((MaxKey,), "maxKey"),
    ):
        if isinstance(value, kinds):
            return name
    return None


def _count_brackets(
    collection: Collection[dict[str, Any]], match: Mapping[str, Any], cap: int, hint: Any
) -> tuple[int, list[str]]:
    """How many documents match, up to ``cap``, and the brackets of those counted (server
    order) — one round trip, the work of ``count_documents(match, limit=cap)``: it groups by
    ``_id`` type instead of all in one."""
    pipeline: list[dict[str, Any]] = [
        {"$match": dict(match)}, {"$limit": cap},
        {"$group": {"_id": {"$type": "$_id"}, "n": {"$sum": 1}}},
    ]
    options: dict[str, Any] = {}
    if hint is not None:  # (aggregate, unlike count_documents, sends the hint as given)
        options["hint"] = hint if isinstance(hint, str) else dict(hint)
    count, found = 0, set()
    for row in collection.aggregate(pipeline, **options):
        count += int(row["n"])
        found.add(bracket_of(str(row["_id"])))
    return count, [name for name, _, _ in BRACKETS if name in found]


def _present_brackets(
    collection: Collection[dict[str, Any]], match: Mapping[str, Any]
) -> list[str]:
    """The BSON brackets the matching ``_id``s fall in, in server order.

    The lowest and the highest matching ``_id`` bound the brackets in between (``_id`` order is
    bracket order), so only those in between are probed one by one: two reads for a collection
    of one ``_id`` type instead of one per bracket.
    """
    from pymongo.errors import OperationFailure

    names = [name for name, _, _ in BRACKETS]
    lowest = collection.find_one(dict(match), {"_id": 1}, sort=[("_id", 1)])
    highest = collection.find_one(dict(match), {"_id": 1}, sort=[("_id", -1)])
    if lowest is None or highest is None:
        return []
    low, high = bracket_of_value(lowest["_id"]), bracket_of_value(highest["_id"])
    first = names.index(low) if low is not None else 0
    last = names.index(high) if high is not None else len(names) - 1
    present = []
    for index in range(first, last + 1):
        name, aliases, _ = BRACKETS[index]
        if index in (first, last) and name in (low, high):
            present.append(name)
            continue
        query = {"$and": [dict(match), {"_id": {"$type": list(aliases)}}]}
        try:
            found = collection.find_one(query, {"_id": 1})
        except OperationFailure:
            found = None  # an alias this server does not know: nothing of that type
        if found is not None:
            present.append(name)
    return present


def _bson_key(bracket: str) -> Callable[[Any], Any] | None:
    """The sort key of one splittable bracket's ``_id``s, in mongod's comparison order."""
    import decimal

    from bson import Binary, Decimal128, ObjectId, Timestamp

    def number(value: Any) -> tuple[int, decimal.Decimal]:
        exact = value.to_decimal() if isinstance(value, Decimal128) else decimal.Decimal(value)
        return (0, decimal.Decimal(0)) if exact.is_nan() else (1, exact)  # NaN sorts lowest

    def binary(value: Any) -> tuple[int, int, bytes]:
        subtype = value.subtype if isinstance(value, Binary) else 0
        return (len(value), subtype, bytes(value))  # length, then subtype, then bytes

    keys: dict[str, Callable[[Any], Any]] = {
        "number": number,
        "string": lambda value: str(value).encode("utf-8"),  # simple collation: binary
        "binData": binary,
        "objectId": lambda value: ObjectId(value).binary,
        "date": lambda value: value,
        "timestamp": lambda value: (value.time, value.inc) if isinstance(value, Timestamp)
        else value,
    }
    return keys.get(bracket)


def in_bson_order(bracket: str, ids: list[Any]) -> list[Any]:
    """``ids`` of one bracket sorted as mongod compares them.

    The sample comes back sorted by the server already; sorting again here (linear on sorted
    input) keeps the ranges' invariant — each document in exactly one partition — from resting
    on the server's sort of mixed types, which the dev server gets wrong for ``Int64`` and
    ``Decimal128`` beside other types. Values a key cannot read keep the server's order.
    """
    key = _bson_key(bracket)
    if key is None or len(ids) < 2:
        return ids
    try:
        return sorted(ids, key=key)
    except (TypeError, ValueError, ArithmeticError):
        return ids


def _sample(collection: Collection[Any], pipeline: list[dict[str, Any]]) -> list[Any] | None:
    """The sample's documents, or ``None`` when the server did not serve it in time."""
    from pymongo.errors import ExecutionTimeout, OperationFailure

    try:
        return list(collection.aggregate(pipeline, maxTimeMS=SAMPLE_TIMEOUT_MS,
                                         allowDiskUse=True))
    except (ExecutionTimeout, OperationFailure) as error:
        if isinstance(error, OperationFailure) and error.code not in (50, None):
            raise
        return None


def plan_id_ranges(
    collection: Collection[dict[str, Any]],
    match: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    hint: Any = None,
) -> Plan:
    """Sample ``_id``s of the matching documents and cut them into ranges (reference §3.2).

    A sample-first draw that times out is drawn again at the sample size before the plan falls
    back to one partition per bracket (``degraded: sample-timeout``)."""
    partitions_cfg = spec.get("partitions") or {}
    batch_size = int(spec.get("batchSize", 500))
    min_docs = int(partitions_cfg.get("minPartitionDocs") or 4 * batch_size)
    target = target_count(spec)
    cap = target * min_docs
    # one more than the cap: a count within the cap saw every matching document, and so
    # every bracket they fall in
    count, counted = _count_brackets(collection, match, cap + 1, hint)
    if count == 0:
        return Plan(method="empty")
    present = counted if count <= cap else _present_brackets(collection, match)
    count = min(count, cap)
    parts = max(1, min(target, math.ceil(count / min_docs)))
    if not present:
        return Plan(method="empty")

    large = count >= cap
    if parts == 1:
        share = count // len(present)
        return Plan(
            partitions=[
                {"scope": _scope(b), "estimate": share + (1 if i < count % len(present) else 0)}
                for i, b in enumerate(present)
            ],
            method="single" if len(present) == 1 else "brackets",
            estimate=count,
            at_least=large,
        )

    sample_size = int(partitions_cfg.get("sampleSize") or min(10_000, 100 * parts))
    sample_n = min(sample_size, 100 * parts)
    projection = {"$project": {"_id": 1, "t": {"$type": "$_id"}}}
    requested = sample_n
    if large:
        total = max(count, collection.estimated_document_count())
        # at most 100× the sample: a match under 1 % of the collection counts as 1 %
        draw = sample_first_draw(sample_n, max(count, 0.01 * total), total) if total else 1
        requested = draw
        pipeline: list[dict[str, Any]] = [
            {"$sample": {"size": draw}}, {"$match": dict(match)}, projection, {"$sort": {"_id": 1}}
        ]
    else:
        total = count
        pipeline = [{"$match": dict(match)}, {"$sample": {"size": sample_n}}, projection,
                    {"$sort": {"_id": 1}}]
    sampled = _sample(collection, pipeline)
    if sampled is None and large and requested > sample_n:
        # A broad match counted only up to its cap draws up to 100× the sample (the count is a
        # lower bound of the match), which a slow server may not serve within the time limit:
        # a draw of the sample size alone still cuts fair ranges where most documents match.
        requested = sample_n
        sampled = _sample(collection, [{"$sample": {"size": sample_n}}, *pipeline[1:]])
    if sampled is None:
        return Plan(
            partitions=[{"scope": _scope(b), "estimate": 0} for b in present],
            method="brackets",
            estimate=count,
            at_least=large,
            degraded="sample-timeout",
        )
    # the share of the documents drawn that matched: divided by the draw, not by the sample
    # size it aimed at (the draw is capped, so fewer may come back although all match)
    estimate = count if not large else max(count, round(total * min(1.0, len(sampled) /
                                                                         max(1, requested))))
    by_bracket: dict[str, list[Any]] = {}
    for row in sampled:
        by_bracket.setdefault(bracket_of(row.get("t", "")), []).append(row["_id"])
    for bracket, ids in by_bracket.items():
        by_bracket[bracket] = in_bson_order(bracket, ids)
    n = max(1, len(sampled))
    partitions: list[dict[str, Any]] = []
    for bracket in present:
        ids = by_bracket.get(bracket, [])
        if not ids:
            partitions.append({"scope": _scope(bracket), "estimate": 0})
            continue
        share = max(1, round(parts * len(ids) / n)) if _SPLITTABLE[bracket] else 1
        bounds: list[Any] = []
        cuts = [0]
        for i in range(1, share):
            position = (i * len(ids)) // share
            candidate = ids[position]
            if candidate == ids[0] or (bounds and candidate == bounds[-1]):
                continue
            while position > 0 and ids[position - 1] == candidate:
                position -= 1  # equal ids are adjacent in server order: cut before the first
            bounds.append(candidate)
            cuts.append(position)
        cuts.append(len(ids))
        counts = [cuts[i + 1] - cuts[i] for i in range(len(cuts) - 1)]
        edges = [None, *bounds, None]
        for index in range(len(edges) - 1):
            low, high = edges[index], edges[index + 1]
            partitions.append({
                "scope": _scope(bracket, low, high, has_gte=low is not None,
                                has_lt=high is not None),
                "estimate": round(estimate * counts[index] / n),
            })
    partitions.sort(key=lambda p: -p["estimate"])
    # the reference's names: which came first, the match or the $sample
    method = "sample-first" if large else "match-first"
    return Plan(partitions=partitions, method=method, estimate=estimate, at_least=large)

