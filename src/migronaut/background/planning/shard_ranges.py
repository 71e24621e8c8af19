"""The shard partitioner (id ``'shard'``): key-range partitions along the chunks of each shard.

Reference background §5, steps 1–5: chunks become *runs* (adjacent chunks on one shard), runs
are split into key ranges (hashed first field: equal slices of the 64-bit hash range; ranged: cut
at a server-side sample of shard-key tuples), and each partition's ``group`` is its shard, so
``shardConcurrency`` caps the lanes working one shard.

Like the ``_id`` partitioner, nothing depends on exactness: the final count catches gaps and the
guarded writes make overlaps harmless. Sorting of key values happens on the server; bounds are
compared in Python only through their BSON encoding (never across types).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import bson
from bson import Int64, MaxKey, MinKey

from migronaut._values import is_int
from migronaut.background.planning.id_ranges import (
    SAMPLE_TIMEOUT_MS,
    Plan,
    bracket_of_value,
    sample_first_draw,
    target_count,
)
from migronaut.background.planning.shard_facts import key_values

if TYPE_CHECKING:
    from pymongo.collection import Collection

    from migronaut.background.planning.shard_facts import Sharding

__all__ = ["HASH_RANGE", "plan_shard_ranges", "split_hashed"]

#: The 64-bit hash range, low inclusive, high exclusive (MinKey/MaxKey stand for its ends).
HASH_RANGE = (-(2**63), 2**63)
#: Per-shard partition target ceiling, sample limits and parallel sampling (reference §5).
PER_SHARD_MAX = 8
SAMPLE_MAX = 10_000
SAMPLE_FIRST_FACTOR = 20
SAMPLE_PARALLEL = 4


@dataclass
class _Run:
    """Adjacent chunks on one shard (``shard`` ``None``: a block spanning shards)."""

    min: dict[str, Any]
    max: dict[str, Any]
    shard: str | None
    chunks: int


def plan_shard_ranges(
    collection: Collection[dict[str, Any]],
    match: Mapping[str, Any],
    spec: Mapping[str, Any],
    sharding: Sharding,
) -> Plan:
    """Plan key-range partitions along the chunks (reference §5 steps 1–5)."""
    facts = sharding.facts
    assert facts is not None and sharding.index is not None
    key = facts.key
    cfg = spec.get("partitions") or {}
    min_docs = int(cfg.get("minPartitionDocs") or 4 * int(spec.get("batchSize", 500)))
    max_partitions = int(cfg.get("maxPartitions", 256))
    aim = target_count(spec)
    cap = aim * min_docs
    count = collection.count_documents(dict(match), limit=cap, hint=sharding.index)
    at_least = count >= cap

    def plan(partitions: list[dict[str, Any]], method: str, degraded: str | None = None) -> Plan:
        groups: dict[str, int] = {}
        for partition in partitions:
            if partition.get("group") is not None:
                groups[partition["group"]] = groups.get(partition["group"], 0) + 1
        partitions.sort(key=lambda p: -p["estimate"])
        return Plan(partitions=partitions, method=method, estimate=count, at_least=at_least,
                    degraded=degraded, partitioner="shard", epoch=facts.epoch,
                    sharding=sharding.record(method, groups))

    if count == 0:
        return plan([], "empty")

    method = "chunks"
    degraded: str | None = None
    if facts.chunks:
        runs = _runs(facts.chunks)
    else:
        method = "sampled"
        runs = [_Run({f: MinKey() for f in key}, {f: MaxKey() for f in key}, None, 1)]
    if len(runs) > max_partitions:
        runs = _blocks(runs, max_partitions)
        if any(run.shard is None for run in runs):
            degraded = "ungrouped"

    shard_concurrency = int(spec.get("shardConcurrency", 1) or 1)
    per_shard = min(PER_SHARD_MAX, int(cfg.get("overPartition", 4)) * shard_concurrency, aim)
    wanted = max(1, min(aim, math.ceil(count / min_docs)))
    on_shard: dict[str | None, int] = {}
    for run in runs:
        on_shard[run.shard] = on_shard.get(run.shard, 0) + 1
    spread = max(1, max(len(runs), max_partitions) // len(runs))
    total_chunks = sum(run.chunks for run in runs) or 1
    hashed_first = next(iter(key.values())) == "hashed"

    def split(run: _Run) -> tuple[list[tuple[dict[str, Any], dict[str, Any], float]], bool]:
        parts = min(math.ceil(per_shard / on_shard[run.shard]), spread, wanted)
        estimate = count * run.chunks / total_chunks
        if parts <= 1:
            return [(run.min, run.max, estimate)], False
        if hashed_first:
            return split_hashed(key, run.min, run.max, parts, estimate), False
        return _split_sampled(collection, match, key, run, parts, estimate, count)

    with ThreadPoolExecutor(max_workers=SAMPLE_PARALLEL) as pool:
        pieces = list(pool.map(split, runs))
    partitions: list[dict[str, Any]] = []
    for run, (ranges, timed_out) in zip(runs, pieces, strict=True):
        if timed_out:
            degraded = degraded or "sample-timeout"
        for low, high, estimate in ranges:
            partition: dict[str, Any] = {
                "scope": {"kind": "key-range", "min": low, "max": high},
                "estimate": round(estimate),
            }
            if run.shard is not None:
                partition["group"] = run.shard
            partitions.append(partition)
    return plan(partitions, method, degraded)


def _runs(chunks: Sequence[Mapping[str, Any]]) -> list[_Run]:
    """Maximal sequences of adjacent chunks (sorted by ``min``) on the same shard."""
    runs: list[_Run] = []
    for chunk in chunks:
        shard = str(chunk.get("shard"))
        if runs and runs[-1].shard == shard:
            runs[-1].max = dict(chunk["max"])
            runs[-1].chunks += 1
        else:
            runs.append(_Run(dict(chunk["min"]), dict(chunk["max"]), shard, 1))
    return runs


def _blocks(runs: list[_Run], most: int) -> list[_Run]:
    """Merge neighbouring runs into ``most`` even blocks; a block spanning shards has no group."""
    blocks = []
    for index in range(most):
        members = runs[index * len(runs) // most:(index + 1) * len(runs) // most]
        shards = {run.shard for run in members}
        blocks.append(_Run(members[0].min, members[-1].max,
                           members[0].shard if len(shards) == 1 else None,
                           sum(run.chunks for run in members)))
    return blocks


def _hash_value(bound: Any) -> int | None:
    if isinstance(bound, MinKey):
        return HASH_RANGE[0]
    if isinstance(bound, MaxKey):
        return HASH_RANGE[1]
    if is_int(bound):
        return int(bound)
    return None


def split_hashed(
    key: Mapping[str, Any], low: Mapping[str, Any], high: Mapping[str, Any], parts: int,
    estimate: float,
) -> list[tuple[dict[str, Any], dict[str, Any], float]]:
    """Equal slices of a run's hash range; boundaries carry MinKey for the other key fields.

    A run narrower than ``2 × parts`` hash values (or with unexpected bounds) stays whole.
    """
    fields = list(key)
    first = fields[0]
    lo, hi = _hash_value(low.get(first)), _hash_value(high.get(first))
    if lo is None or hi is None or hi - lo < 2 * parts:
        return [(dict(low), dict(high), estimate)]
    edges: list[dict[str, Any]] = [dict(low)]
    for index in range(1, parts):
        cut = lo + (hi - lo) * index // parts
        edges.append({first: Int64(cut), **{name: MinKey() for name in fields[1:]}})
    edges.append(dict(high))
    share = estimate / parts
    return [(edges[i], edges[i + 1], share) for i in range(parts)]


def _finite(value: Any) -> bool:
    return not isinstance(value, (MinKey, MaxKey))


def _split_sampled(
    collection: Collection[dict[str, Any]],
    match: Mapping[str, Any],
    key: Mapping[str, Any],
    run: _Run,
    parts: int,
    estimate: float,
    count: int,
) -> tuple[list[tuple[dict[str, Any], dict[str, Any], float]], bool]:
    """Cut a ranged run at sampled shard-key tuples strictly inside it; ``(ranges, timed_out)``.

    Not attempted when the run's first-field bounds are finite values of different BSON
    classes; too small a sample keeps the run whole.
    """
    from pymongo.errors import ExecutionTimeout, OperationFailure

    whole = [(run.min, run.max, estimate)]
    fields = list(key)
    first = fields[0]
    lo, hi = run.min.get(first), run.max.get(first)
    if _finite(lo) and _finite(hi) and bracket_of_value(lo) != bracket_of_value(hi):
        return whole, False
    inside: dict[str, Any] = {}
    if _finite(lo):
        inside["$gt"] = lo
    if _finite(hi):
        inside["$lt"] = hi
    query: dict[str, Any] = {"$and": [dict(match), {first: inside}]} if inside else dict(match)
    size = min(SAMPLE_MAX, 100 * parts)
    projection = {"$project": {"_id": 0, **{
        name: {"$toHashedIndexKey": "$" + name} if value == "hashed" else 1
        for name, value in key.items()}}}
    order = {"$sort": {name: 1 for name in fields}}
    if estimate > SAMPLE_FIRST_FACTOR * size:
        total = max(count, collection.estimated_document_count())
        draw = sample_first_draw(size, estimate, total)
        pipeline: list[dict[str, Any]] = [{"$sample": {"size": draw}}, {"$match": query},
                                          projection, order]
    else:
        pipeline = [{"$match": query}, {"$sample": {"size": size}}, projection, order]
    try:
        rows = list(collection.aggregate(pipeline, maxTimeMS=SAMPLE_TIMEOUT_MS,
                                         allowDiskUse=True))
    except ExecutionTimeout:
        return whole, True
    except OperationFailure as error:
        if error.code == 50:
            return whole, True
        return whole, False  # e.g. no $toHashedIndexKey on this server: keep the run whole
    if len(rows) < 2:
        return whole, False
    tuples = [key_values(row, fields) for row in rows]
    encoded = [bson.encode(t) for t in tuples]
    cuts: list[int] = []
    for index in range(1, parts):
        position = index * len(tuples) // parts
        while position > 0 and encoded[position - 1] == encoded[position]:
            position -= 1  # equal tuples are adjacent in server order: cut before the first
        if position == 0 or (cuts and cuts[-1] == position):
            continue
        cuts.append(position)
    if not cuts:
        return whole, False
    edges = [run.min, *(tuples[c] for c in cuts), run.max]
    bounds = [0, *cuts, len(tuples)]
    return [
        (edges[i], edges[i + 1], estimate * (bounds[i + 1] - bounds[i]) / len(tuples))
        for i in range(len(edges) - 1)
    ], False

