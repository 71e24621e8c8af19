"""Working a ``key-range`` partition: batch reads, the cursor, targeted writes, the key guard.

Reference background §5 (batch reads, writes) for partitions of the shard partitioner:

* reads use the sharded version index ``{<version>: 1, …shardKey, _id: 1}`` with exact
  ``min``/``max`` index bounds per *version region* (version 0 is read as ``null`` first, then
  ``0``), plus a targeting predicate on the first key field when that is safe;
* ranged keys keep a keyset cursor ``{region, tuple: {_id, …key values}}`` and resume inclusive
  from the tuple, excluding that ``_id``;
* a hashed first field has no usable order: partitions *drain* — every batch restarts at the
  range start (rewritten documents leave the version region by themselves) and the documents
  read but not rewritten are excluded through ``cursor.stuck`` (more than :data:`STUCK_MAX`
  moves on, leaving them to the next pass).

Writes add the shard-key fields to the guarded filter (so a mongos targets one shard and never
an orphan), and a transform may not change a shard-key value (:func:`changed_key_field`).
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson import Decimal128, MaxKey, MinKey

from migronaut.background.planning.id_ranges import bracket_of_value
from migronaut.background.planning.shard_facts import key_values

__all__ = ["STUCK_MAX", "KeyRanges", "KeyRead", "changed_key_field", "shard_key_message"]

#: Stuck documents a draining partition tolerates before moving on.
STUCK_MAX = 100
_MIN_KEY = MinKey()


@dataclass(frozen=True)
class KeyRead:
    """One batch read: the filter and the cursor options of ``find``."""

    filter: dict[str, Any]
    hint: list[tuple[str, Any]]
    min: list[tuple[str, Any]]
    max: list[tuple[str, Any]]
    sort: list[tuple[str, int]] | None


class KeyRanges:
    """Reads and cursor moves of key-range partitions for one migration's lanes."""

    def __init__(self, key: Mapping[str, Any], index: Mapping[str, Any], version_field: str,
                 source_version: int, match: Mapping[str, Any]) -> None:
        self.fields = list(key)
        self.hashed = next(iter(key.values())) == "hashed"
        self.index = list(index.items())
        self.version_field = version_field
        self.regions: list[Any] = [None, 0] if source_version == 0 else [source_version]
        self.match = dict(match)
        self._with_id = "_id" not in key

    def _bound(self, region: Any, values: Mapping[str, Any], default: Any,
               last_id: Any = _MIN_KEY) -> list[tuple[str, Any]]:
        bound = [(self.version_field, region)]
        bound += [(name, values.get(name, default)) for name in self.fields]
        if self._with_id:
            bound.append(("_id", last_id))
        return bound

    def read(self, scope: Mapping[str, Any], cursor: Mapping[str, Any]) -> KeyRead:
        """The read of the next batch of ``scope`` from ``cursor``."""
        region = self.regions[int(cursor.get("region", 0))]
        low_values, high_values = scope.get("min") or {}, scope.get("max") or {}
        excluded = list(cursor.get("stuck") or ())
        position = cursor.get("tuple")
        if position is not None:
            low = self._bound(region, position, None, position.get("_id"))
            excluded.append(position.get("_id"))
        else:
            low = self._bound(region, low_values, MinKey())
        high = self._bound(region, high_values, MaxKey())
        conditions: list[dict[str, Any]] = [self.match]
        targeting = self._targeting(low_values, high_values)
        if targeting:
            conditions.append(targeting)
        if excluded:
            conditions.append({"_id": {"$nin": excluded}})
        query = conditions[0] if len(conditions) == 1 else {"$and": conditions}
        sort = None if self.hashed else [(name, 1) for name, _ in self.index]
        return KeyRead(query, self.index, low, high, sort)

    def _targeting(self, low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
        """``{first: {$gte: lo, $lt|$lte: hi}}`` when both ends are finite values of one class
        and the field is not hashed (a mongos treats ``$lt`` as inclusive when it picks shards,
        so ``$lte`` is used unless the rest of ``max`` is MinKey — then ``$lt`` is exact)."""
        first = self.fields[0]
        lo, hi = low.get(first), high.get(first)
        if self.hashed or lo is None or hi is None or isinstance(lo, (MinKey, MaxKey)) or \
                isinstance(hi, (MinKey, MaxKey)) or bracket_of_value(lo) != bracket_of_value(hi):
            return {}
        rest_min = all(isinstance(high.get(name), MinKey) for name in self.fields[1:])
        return {first: {"$gte": lo, "$lt" if rest_min else "$lte": hi}}

    def advance(self, cursor: Mapping[str, Any], *, last: Mapping[str, Any] | None,
                full: bool, stuck: Sequence[Any] = ()) -> dict[str, Any] | None:
        """The cursor after a batch (``None``: the partition is done).

        ``full``: the batch may have more behind it; ``last``: the last document read (ranged
        keys resume after it); ``stuck``: documents read but not rewritten.
        """
        region = int(cursor.get("region", 0))
        kept = [*(cursor.get("stuck") or ()), *stuck]
        if self.hashed:
            if full and len(kept) <= STUCK_MAX:
                return {"region": region, "stuck": kept}
        elif full and last is not None:
            out: dict[str, Any] = {
                "region": region,
                "tuple": {"_id": last["_id"], **key_values(last, self.fields)},
            }
            if kept:
                out["stuck"] = kept
            return out
        elif full:
            return {**cursor, "stuck": kept} if kept else dict(cursor)
        if region + 1 < len(self.regions):
            return {"region": region + 1}
        return None


def shard_key_message(field: str) -> str:
    return (
        f"the transform changed the shard key field {field!r} — a background migration never "
        "moves a document to another shard; use an ordinary (transactional) migration or "
        "reshardCollection to change shard-key values"
    )


def changed_key_field(before: Mapping[str, Any], after: Mapping[str, Any],
                      fields: Sequence[str]) -> str | None:
    """The first shard-key field whose value the transform changed, if any.

    Numbers are equal by value across numeric types (``Int64(5) == 5 == 5.0``); a missing field
    and ``null`` are the same key (both index as null); anything not provably equal changed.
    """
    old, new = key_values(before, fields), key_values(after, fields)
    for name in fields:
        if not _same(old[name], new[name]):
            return name
    return None


def _number(value: Any) -> decimal.Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, (int, float)):
        try:
            return decimal.Decimal(value)
        except (ValueError, decimal.InvalidOperation):
            return None
    return None


def _same(left: Any, right: Any) -> bool:
    a, b = _number(left), _number(right)
    if a is not None and b is not None:
        return not (a.is_nan() or b.is_nan()) and a == b
    if type(left) is not type(right):
        return False
    if isinstance(left, Mapping):
        return list(left) == list(right) and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(_same(x, y) for x, y in zip(left, right,
                                                                            strict=True))
    try:
        return bool(left == right)
    except Exception:
        return False
