"""``_id`` values in mongod's order: the sort key of a BSON value, and the ordered index of a
collection's ``_id`` values that the dev server serves lookups, duplicate checks and ``_id``
ranges from.

Invariants:

* :func:`sort_key` orders values as ``mongod`` compares them: first by type bracket (MinKey,
  null, numbers, strings, objects, arrays, binary data, ObjectId, booleans, dates, timestamps,
  regular expressions, MaxKey), then by value; two values have equal keys exactly when BSON
  equality holds — numbers by their exact value (``1 == 1.0 == Int64(1) == Decimal128("1")``,
  but the double ``0.1`` is not ``Decimal128("0.1")``), documents field by field in order.
  Within the brackets of :data:`ORDERED` the order is ``mongod``'s exactly; the others (objects,
  binary data, …) are ordered consistently, so equality and uniqueness hold for them too, but
  ranges and sorts over them are left to mongoeco.
* :class:`OrderedIds` holds at most one entry per key, in key order. A copy costs O(1) and
  shares everything with its original until either is written; a write costs O(chunk +
  chunks), never O(entries).

Nothing here imports mongoeco: the module knows BSON values (pymongo's ``bson``), not storage.
"""

from __future__ import annotations

import datetime
import math
import re
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any, Final

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

__all__ = [
    "NUMBER",
    "OBJECT_ID",
    "ORDERED",
    "OrderedIds",
    "SortKey",
    "sort_key",
]

#: A value's place in mongod's order: ``(bracket, ...)``, compared as a tuple.
SortKey = tuple[Any, ...]

(MIN_KEY, NULL, NUMBER, STRING, OBJECT, ARRAY, BINARY, OBJECT_ID, BOOLEAN, DATE, TIMESTAMP,
 REGEX, OTHER, MAX_KEY) = range(14)
#: The brackets whose order here is mongod's to the letter: ranges and sorts are served in them.
ORDERED: Final = frozenset({NUMBER, STRING, OBJECT_ID, DATE})


def sort_key(value: Any) -> SortKey:
    """``value``'s key in mongod's order (see the module's invariants)."""
    kind = type(value)
    if isinstance(value, ObjectId):  # and subclasses (mongoeco's)
        return (OBJECT_ID, bytes(value.binary))
    if kind is str:
        return (STRING, value)
    if kind is bool:
        return (BOOLEAN, value)
    if isinstance(value, int):  # int and Int64
        return (NUMBER, 1, int(value))
    if isinstance(value, float | Decimal):
        return _number(value)
    if isinstance(value, Decimal128):
        return _number(value.to_decimal())
    if value is None:
        return (NULL,)
    if isinstance(value, dict):
        return (OBJECT, tuple((key[0], name, key) for name, key in
                              ((str(name), sort_key(item)) for name, item in value.items())))
    if isinstance(value, list | tuple):
        return (ARRAY, tuple(sort_key(item) for item in value))
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return (DATE, value)
    if isinstance(value, bytes):  # bytes and Binary
        data = bytes(value)
        return (BINARY, len(data), value.subtype if isinstance(value, Binary) else 0, data)
    if isinstance(value, uuid.UUID):
        return (BINARY, 16, 4, value.bytes)
    if isinstance(value, Timestamp):
        return (TIMESTAMP, value.time, value.inc)
    if isinstance(value, Regex):
        return (REGEX, str(value.pattern), str(value.flags))
    if isinstance(value, re.Pattern):
        return (REGEX, str(value.pattern), str(value.flags))
    if isinstance(value, MinKey):
        return (MIN_KEY,)
    if isinstance(value, MaxKey):
        return (MAX_KEY,)
    return (OTHER, kind.__name__, repr(value))


def _number(value: float | Decimal) -> SortKey:
    """Numbers compare by exact value (Python compares int, float and Decimal exactly); NaN,
    which equals itself in BSON, comes before every other number."""
    nan = value.is_nan() if isinstance(value, Decimal) else math.isnan(value)
    return (NUMBER, 0) if nan else (NUMBER, 1, value)


class OrderedIds:
    """``(key, value)`` entries in key order, at most one per key: the collection's ``_id``
    sort keys, each with its document's insertion ordinal, or (``bracketed=False``) those
    ordinals, each with the document's storage key.

    Entries live in chunks of up to ``2 * load``, as two tuples side by side (``_keys[i]`` and
    ``_values[i]``, never changed in place: a pair of tuples costs 16 bytes an entry, a tuple
    per entry would cost 56 more); ``_maxes`` holds each chunk's last key. :meth:`copy` shares
    the lists and marks them shared: the first write afterwards, to either copy, copies the
    three lists (pointers only) and then the one chunk it changes. :meth:`scan` reads the lists
    it started with, so a write during a scan does not disturb it.
    """

    __slots__ = ("_bracketed", "_keys", "_len", "_load", "_maxes", "_shared", "_unordered",
                 "_values")

    def __init__(self, state: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[Any],
                                    int, int] | None = None,
                 *, load: int = 256, bracketed: bool = True) -> None:
        self._load = load  # a chunk splits past twice this many entries
        self._bracketed = bracketed  # keys are sort keys: count those outside ORDERED
        if state is None:
            self._keys: list[tuple[Any, ...]] = []
            self._values: list[tuple[Any, ...]] = []
            self._maxes: list[Any] = []
            self._len = 0
            self._unordered = 0  # entries outside ORDERED brackets
            self._shared = False
        else:
            self._keys, self._values, self._maxes, self._len, self._unordered = state
            self._shared = True

    def __len__(self) -> int:
        return self._len

    def copy(self) -> OrderedIds:
        """A copy that shares everything until either side is written."""
        self._shared = True
        return OrderedIds((self._keys, self._values, self._maxes, self._len, self._unordered),
                          load=self._load, bracketed=self._bracketed)

    @property
    def all_ordered(self) -> bool:
        """Whether every key falls in an :data:`ORDERED` bracket (a sort can be served)."""
        return self._unordered == 0

    def find(self, key: Any) -> Any | None:
        """The value of the entry whose key equals ``key``, or ``None``."""
        at, position = self._locate(key)
        return None if at < 0 else self._values[at][position]

    def add(self, key: Any, value: Any) -> None:
        """Add an entry; the caller has made sure no entry has an equal key."""
        self._own()
        self._len += 1
        if self._bracketed and key[0] not in ORDERED:
            self._unordered += 1
        if not self._keys:
            self._keys.append((key,))
            self._values.append((value,))
            self._maxes.append(key)
            return
        at = min(bisect_left(self._maxes, key), len(self._maxes) - 1)
        keys, values = self._keys[at], self._values[at]
        position = bisect_left(keys, key)
        keys = (*keys[:position], key, *keys[position:])
        values = (*values[:position], value, *values[position:])
        if len(keys) > 2 * self._load:
            half = len(keys) // 2
            self._keys[at:at + 1] = [keys[:half], keys[half:]]
            self._values[at:at + 1] = [values[:half], values[half:]]
            self._maxes[at:at + 1] = [keys[half - 1], keys[-1]]
        else:
            self._keys[at] = keys
            self._values[at] = values
            self._maxes[at] = keys[-1]

    def remove(self, key: Any) -> None:
        """Remove the entry of ``key`` (nothing when there is none)."""
        at, position = self._locate(key)
        if at < 0:
            return
        self._own()
        self._len -= 1
        if self._bracketed and key[0] not in ORDERED:
            self._unordered -= 1
        keys, values = self._keys[at], self._values[at]
        if len(keys) > 1:
            self._keys[at] = (*keys[:position], *keys[position + 1:])
            self._values[at] = (*values[:position], *values[position + 1:])
            self._maxes[at] = self._keys[at][-1]
        else:
            del self._keys[at]
            del self._values[at]
            del self._maxes[at]

    def repoint(self, key: Any, value: Any) -> None:
        """Give the entry of ``key`` another value (the same ``_id``, retyped)."""
        at, position = self._locate(key)
        if at < 0:
            return
        self._own()
        values = self._values[at]
        self._values[at] = (*values[:position], value, *values[position + 1:])

    def scan(self, low: Any | None = None, low_inclusive: bool = True,
             high: Any | None = None, high_inclusive: bool = True, *,
             reverse: bool = False) -> Iterator[Any]:
        """The values of the entries between the bounds (``None``: unbounded), in key order
        or, with ``reverse``, backwards; lazily, over the entries as they were when the scan
        started."""
        self._shared = True  # the scan keeps reading these lists: a write copies them first
        if reverse:
            return _backwards(self._keys, self._values, self._maxes, low, low_inclusive, high,
                              high_inclusive)
        return _forwards(self._keys, self._values, self._maxes, low, low_inclusive, high,
                         high_inclusive)

    def at_positions(self, positions: Iterable[int]) -> list[Any]:
        """The values of the entries at these positions (0 is the first in key order), in
        the order given: one pass over the chunks' lengths, not over the entries."""
        wanted = sorted(set(positions))
        found: dict[int, Any] = {}
        chunk, start = 0, 0
        for position in wanted:
            if not 0 <= position < self._len:
                raise IndexError(position)
            while position >= start + len(self._keys[chunk]):
                start += len(self._keys[chunk])
                chunk += 1
            found[position] = self._values[chunk][position - start]
        return [found[position] for position in positions]

    def _locate(self, key: Any) -> tuple[int, int]:
        at = bisect_left(self._maxes, key)
        if at == len(self._maxes):
            return -1, -1
        keys = self._keys[at]
        position = bisect_left(keys, key)
        if position >= len(keys) or keys[position] != key:
            return -1, -1
        return at, position

    def _own(self) -> None:
        if self._shared:
            self._keys = list(self._keys)
            self._values = list(self._values)
            self._maxes = list(self._maxes)
            self._shared = False


def _forwards(chunks: list[tuple[Any, ...]], values: list[tuple[Any, ...]], maxes: list[Any],
              low: Any | None, low_inclusive: bool, high: Any | None, high_inclusive: bool
              ) -> Iterator[Any]:
    at, position = 0, 0
    if low is not None:
        at = (bisect_left if low_inclusive else bisect_right)(maxes, low)
        if at < len(chunks):
            position = (bisect_left if low_inclusive else bisect_right)(chunks[at], low)
    while at < len(chunks):
        chunk = chunks[at]
        stop, last = len(chunk), False
        if high is not None and (maxes[at] > high or (maxes[at] == high and not high_inclusive)):
            stop = (bisect_right if high_inclusive else bisect_left)(chunk, high)
            last = True
        yield from values[at][position:stop]
        if last:
            return
        at, position = at + 1, 0


def _backwards(chunks: list[tuple[Any, ...]], values: list[tuple[Any, ...]], maxes: list[Any],
               low: Any | None, low_inclusive: bool, high: Any | None, high_inclusive: bool
               ) -> Iterator[Any]:
    if not chunks:
        return
    at = len(chunks) - 1
    stop = len(chunks[at])
    if high is not None:
        at = min(bisect_left(maxes, high), len(chunks) - 1)
        stop = (bisect_right if high_inclusive else bisect_left)(chunks[at], high)
    while at >= 0:
        chunk = chunks[at]
        start, last = 0, False
        if low is not None and (chunk[0] < low or (chunk[0] == low and not low_inclusive)):
            start = (bisect_left if low_inclusive else bisect_right)(chunk, low)
            last = True
        yield from reversed(values[at][start:stop])
        if last:
            return
        at -= 1
        if at >= 0:
            stop = len(chunks[at])
