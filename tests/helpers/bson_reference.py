"""A straightforward reference of mongod's BSON comparison, and Hypothesis strategies for the
values ``_id`` fields and unique keys hold in the dev server's property tests.

The reference is written the way the server manual describes the order, one rule at a time,
with no tuple tricks: the dev server's fast paths are checked against it.
"""

from __future__ import annotations

import datetime
import math
from fractions import Fraction
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from hypothesis import strategies as st

#: mongod's type order: the rank of each kind of value.
_RANK = {"minkey": 1, "null": 2, "number": 3, "string": 4, "object": 5, "array": 6,
         "binary": 7, "objectid": 8, "bool": 9, "date": 10, "maxkey": 99}


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float | Decimal128):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, ObjectId):
        return "objectid"
    if isinstance(value, datetime.datetime):
        return "date"
    raise TypeError(f"no reference order for {value!r}")


def _exact(value: Any) -> Fraction | None:
    """A number's exact value; ``None`` for NaN; infinities as very large fractions."""
    if isinstance(value, Decimal128):
        value = value.to_decimal()
        if value.is_nan():
            return None
        if value.is_infinite():
            return Fraction(10) ** 7000 * (1 if value > 0 else -1)
        return Fraction(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return Fraction(10) ** 7000 * (1 if value > 0 else -1)
    return Fraction(value)


def compare(left: Any, right: Any) -> int:
    """-1, 0 or 1 as mongod orders ``left`` and ``right``."""
    left_kind, right_kind = kind(left), kind(right)
    if left_kind != right_kind:
        return -1 if _RANK[left_kind] < _RANK[right_kind] else 1
    if left_kind == "null":
        return 0
    if left_kind == "number":
        a, b = _exact(left), _exact(right)
        if a is None or b is None:  # NaN equals NaN and sorts before every other number
            return 0 if a is b else (-1 if a is None else 1)
        return (a > b) - (a < b)
    if left_kind == "string":
        a, b = left.encode(), right.encode()  # mongod compares the UTF-8 bytes
        return (a > b) - (a < b)
    if left_kind == "objectid":
        a, b = left.binary, right.binary
        return (a > b) - (a < b)
    if left_kind == "bool":
        return (left > right) - (left < right)
    if left_kind == "date":
        a, b = _millis(left), _millis(right)
        return (a > b) - (a < b)
    if left_kind == "binary":
        a = (len(left), getattr(left, "subtype", 0), bytes(left))
        b = (len(right), getattr(right, "subtype", 0), bytes(right))
        return (a > b) - (a < b)
    if left_kind == "object":
        for (a_name, a_value), (b_name, b_value) in zip(left.items(), right.items(), strict=False):
            a_rank, b_rank = _RANK[kind(a_value)], _RANK[kind(b_value)]
            if a_rank != b_rank:
                return -1 if a_rank < b_rank else 1
            if a_name != b_name:
                return -1 if a_name.encode() < b_name.encode() else 1
            found = compare(a_value, b_value)
            if found:
                return found
        return (len(left) > len(right)) - (len(left) < len(right))
    for a, b in zip(left, right, strict=False):  # arrays
        found = compare(a, b)
        if found:
            return found
    return (len(left) > len(right)) - (len(left) < len(right))


def _millis(moment: datetime.datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


# -- strategies ------------------------------------------------------------------------------

#: Whole numbers in every numeric type, so ``1``, ``1.0``, ``Int64(1)`` and ``Decimal128("1")``
#: meet; halves (exact in binary and decimal) and ``0.1`` (exact only in decimal) too.
_small = st.integers(-3, 3)  # a small pool: stored values and query bounds meet often
numbers = st.one_of(
    _small,
    _small.map(float),
    _small.map(Int64),
    _small.map(lambda n: Decimal128(str(n))),
    _small.map(lambda n: Decimal128(f"{n}.0")),
    st.sampled_from([0.5, -0.5, 0.1, -0.0, math.inf, -math.inf]),
    st.sampled_from([Decimal128("0.5"), Decimal128("0.1"), Decimal128("-0"),
                     Decimal128("Infinity")]),
    st.integers(-(2**62), 2**62).map(Int64),
)
strings = st.sampled_from(["", "a", "ab", "b", "Z", "é", "€", "😀"])
_OIDS = [ObjectId(f"{n:024x}") for n in (1, 2, 3, 0xFFFF, 2**90)]
object_ids = st.sampled_from(_OIDS)
dates = st.sampled_from([datetime.datetime(2026, 1, d) for d in (1, 2, 3)])  # naive: UTC
#: Values an ``_id`` may hold (no arrays), mixed across types.
ids = st.one_of(numbers, strings, object_ids, dates, st.booleans(), st.none(),
                st.dictionaries(st.sampled_from("ab"), numbers | strings, max_size=2),
                st.binary(max_size=3))
#: Values whose order the dev server serves ranges and sorts in.
ordered_ids = st.one_of(numbers, strings, object_ids, dates)
