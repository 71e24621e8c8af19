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
  chunks of a group + groups), never O(entries).

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


class _Group:
    """One stretch of an index's entries: its chunks (``keys[i]`` and ``values[i]``, tuples
    never changed in place), ``maxes[i]`` the last key of chunk ``i``, ``size`` entries in all.
    Only the index whose token is ``owner`` changes the three lists in place; any other copies
    the group first."""

    __slots__ = ("keys", "maxes", "owner", "size", "values")

    def __init__(self, keys: list[tuple[Any, ...]], values: list[tuple[Any, ...]],
                 maxes: list[Any], size: int, owner: object) -> None:
        self.keys, self.values, self.maxes, self.size, self.owner = (
            keys, values, maxes, size, owner)

    def copy_for(self, owner: object) -> _Group:
        return _Group(list(self.keys), list(self.values), list(self.maxes), self.size, owner)


class OrderedIds:
    """``(key, value)`` entries in key order, at most one per key: the collection's ``_id``
    sort keys, each with its document's insertion ordinal, or (``bracketed=False``) those
    ordinals, each with the document's storage key.

    Two levels, so that a write after a copy copies little: entries live in chunks of up to
    ``2 * load``, as two tuples side by side (a pair of tuples costs 16 bytes an entry, a tuple
    per entry would cost 56 more); chunks live in groups of up to ``2 * group_load``
    (:class:`_Group`); the index holds the list of groups and each group's last key. :meth:`copy`
    shares everything: the first write afterwards, to either copy, copies the list of groups
    (pointers, a few dozen at a million entries), then the one group it changes (its lists of
    chunks, pointers), then the one chunk. Ascending inserts (ObjectIds, ordinals) fill chunks
    and groups before starting new ones. :meth:`scan` reads the groups it started with, so a
    write during a scan does not disturb it.
    """

    __slots__ = ("_bracketed", "_group_load", "_groups", "_len", "_load", "_maxes", "_shared",
                 "_token", "_unordered")

    def __init__(self, *, load: int = 128, group_load: int = 32, bracketed: bool = True,
                 shared: tuple[list[_Group], list[Any], int, int] | None = None) -> None:
        self._load = load  # a chunk splits past twice this many entries
        self._group_load = group_load  # a group splits past twice this many chunks
        self._bracketed = bracketed  # keys are sort keys: count those outside ORDERED
        # ``shared``: another index's groups, maxes, length and unordered count (see copy)
        groups, maxes, length, unordered = shared or ([], [], 0, 0)
        self._groups: list[_Group] = groups
        self._maxes: list[Any] = maxes  # each group's last key
        self._len = length
        self._unordered = unordered  # entries outside ORDERED brackets
        # the two lists above are shared with a copy or a scan
        self._shared = shared is not None
        self._token = object()  # the groups whose owner this is are this index's alone

    def __len__(self) -> int:
        return self._len

    def copy(self) -> OrderedIds:
        """A copy that shares everything until either side is written."""
        self._release()
        return OrderedIds(load=self._load, group_load=self._group_load,
                          bracketed=self._bracketed,
                          shared=(self._groups, self._maxes, self._len, self._unordered))

    @property
    def all_ordered(self) -> bool:
        """Whether every key falls in an :data:`ORDERED` bracket (a sort can be served)."""
        return self._unordered == 0

    def find(self, key: Any) -> Any | None:
        """The value of the entry whose key equals ``key``, or ``None``."""
        group, at, position = self._locate(key)
        return None if group < 0 else self._groups[group].values[at][position]

    def add(self, key: Any, value: Any) -> None:
        """Add an entry; the caller has made sure no entry has an equal key."""
        self._len += 1
        if self._bracketed and key[0] not in ORDERED:
            self._unordered += 1
        if not self._groups:
            self._own_top()
            self._groups.append(_Group([(key,)], [(value,)], [key], 1, self._token))
            self._maxes.append(key)
            return
        index = min(bisect_left(self._maxes, key), len(self._maxes) - 1)
        group = self._own_group(index)
        group.size += 1
        at = min(bisect_left(group.maxes, key), len(group.maxes) - 1)
        keys, values = group.keys[at], group.values[at]
        position = bisect_left(keys, key)
        keys = (*keys[:position], key, *keys[position:])
        values = (*values[:position], value, *values[position:])
        if len(keys) > 2 * self._load:
            appended = position == len(keys) - 1
            cut = len(keys) - 1 if appended else len(keys) // 2  # ascending: keep chunks full
            group.keys[at:at + 1] = [keys[:cut], keys[cut:]]
            group.values[at:at + 1] = [values[:cut], values[cut:]]
            group.maxes[at:at + 1] = [keys[cut - 1], keys[-1]]
            if len(group.keys) > 2 * self._group_load:
                self._split(index, group, appended and at + 1 == len(group.keys) - 1)
                return
        else:
            group.keys[at] = keys
            group.values[at] = values
            group.maxes[at] = keys[-1]
        self._maxes[index] = group.maxes[-1]

    def remove(self, key: Any) -> None:
        """Remove the entry of ``key`` (nothing when there is none)."""
        index, at, position = self._locate(key)
        if index < 0:
            return
        group = self._own_group(index)
        group.size -= 1
        self._len -= 1
        if self._bracketed and key[0] not in ORDERED:
            self._unordered -= 1
        keys, values = group.keys[at], group.values[at]
        if len(keys) > 1:
            group.keys[at] = keys = (*keys[:position], *keys[position + 1:])
            group.values[at] = (*values[:position], *values[position + 1:])
            group.maxes[at] = keys[-1]
        else:
            del group.keys[at], group.values[at], group.maxes[at]
        if group.keys:
            self._maxes[index] = group.maxes[-1]
        else:
            del self._groups[index], self._maxes[index]

    def repoint(self, key: Any, value: Any) -> None:
        """Give the entry of ``key`` another value (the same ``_id``, retyped)."""
        index, at, position = self._locate(key)
        if index < 0:
            return
        group = self._own_group(index)
        values = group.values[at]
        group.values[at] = (*values[:position], value, *values[position + 1:])

    def scan(self, low: Any | None = None, low_inclusive: bool = True,
             high: Any | None = None, high_inclusive: bool = True, *,
             reverse: bool = False) -> Iterator[Any]:
        """The values of the entries between the bounds (``None``: unbounded), in key order
        or, with ``reverse``, backwards; lazily, over the entries as they were when the scan
        started."""
        self._release()  # the scan keeps reading these: a write copies them first
        if reverse:
            return _backwards(self._groups, self._maxes, low, low_inclusive, high,
                              high_inclusive)
        return _forwards(self._groups, self._maxes, low, low_inclusive, high, high_inclusive)

    def at_positions(self, positions: Iterable[int]) -> list[Any]:
        """The values of the entries at these positions (0 is the first in key order), in
        the order given: one pass over the groups' and chunks' sizes, not over the entries."""
        wanted = sorted(set(positions))
        found: dict[int, Any] = {}
        groups = self._groups
        index, group_start, at, start = 0, 0, 0, 0
        for position in wanted:
            if not 0 <= position < self._len:
                raise IndexError(position)
            while position >= group_start + groups[index].size:
                group_start += groups[index].size
                index, at, start = index + 1, 0, group_start
            group = groups[index]
            while position >= start + len(group.keys[at]):
                start += len(group.keys[at])
                at += 1
            found[position] = group.values[at][position - start]
        return [found[position] for position in positions]

    def _locate(self, key: Any) -> tuple[int, int, int]:
        index = bisect_left(self._maxes, key)
        if index == len(self._maxes):
            return -1, -1, -1
        group = self._groups[index]
        at = bisect_left(group.maxes, key)
        keys = group.keys[at]
        position = bisect_left(keys, key)
        if position >= len(keys) or keys[position] != key:
            return -1, -1, -1
        return index, at, position

    def _release(self) -> None:
        """Share everything built so far (with a copy or a scan): nothing is changed in place
        any more, a write copies what it changes."""
        self._shared = True
        self._token = object()

    def _own_top(self) -> None:
        if self._shared:
            self._groups = list(self._groups)
            self._maxes = list(self._maxes)
            self._shared = False

    def _own_group(self, index: int) -> _Group:
        self._own_top()
        group = self._groups[index]
        if group.owner is not self._token:
            group = self._groups[index] = group.copy_for(self._token)
        return group

    def _split(self, index: int, group: _Group, appended: bool) -> None:
        """Split an overfull group in two (after all but its last chunk when the entry that
        overfilled it was appended at its end, so ascending inserts leave full groups)."""
        cut = len(group.keys) - 1 if appended else len(group.keys) // 2
        left_size = sum(len(chunk) for chunk in group.keys[:cut])
        left = _Group(group.keys[:cut], group.values[:cut], group.maxes[:cut], left_size,
                      self._token)
        right = _Group(group.keys[cut:], group.values[cut:], group.maxes[cut:],
                       group.size - left_size, self._token)
        self._groups[index:index + 1] = [left, right]
        self._maxes[index:index + 1] = [left.maxes[-1], right.maxes[-1]]


def _forwards(groups: list[_Group], maxes: list[Any], low: Any | None, low_inclusive: bool,
              high: Any | None, high_inclusive: bool) -> Iterator[Any]:
    index, at, position = 0, 0, 0
    if low is not None:
        find = bisect_left if low_inclusive else bisect_right
        index = find(maxes, low)
        if index < len(groups):
            at = find(groups[index].maxes, low)
            position = find(groups[index].keys[at], low)
    while index < len(groups):
        group = groups[index]
        chunks, values, last_keys = group.keys, group.values, group.maxes
        while at < len(chunks):
            chunk = chunks[at]
            stop, last = len(chunk), False
            if high is not None and (last_keys[at] > high
                                     or (last_keys[at] == high and not high_inclusive)):
                stop = (bisect_right if high_inclusive else bisect_left)(chunk, high)
                last = True
            yield from values[at][position:stop]
            if last:
                return
            at, position = at + 1, 0
        index, at = index + 1, 0


def _backwards(groups: list[_Group], maxes: list[Any], low: Any | None, low_inclusive: bool,
               high: Any | None, high_inclusive: bool) -> Iterator[Any]:
    if not groups:
        return
    index = len(groups) - 1
    at = len(groups[index].keys) - 1
    stop = len(groups[index].keys[at])
    if high is not None:
        index = min(bisect_left(maxes, high), len(groups) - 1)
        group = groups[index]
        at = min(bisect_left(group.maxes, high), len(group.maxes) - 1)
        stop = (bisect_right if high_inclusive else bisect_left)(group.keys[at], high)
    while index >= 0:
        group = groups[index]
        while at >= 0:
            chunk = group.keys[at]
            start, last = 0, False
            if low is not None and (chunk[0] < low or (chunk[0] == low and not low_inclusive)):
                start = (bisect_left if low_inclusive else bisect_right)(chunk, low)
                last = True
            yield from reversed(group.values[at][start:stop])
            if last:
                return
            at -= 1
            if at >= 0:
                stop = len(group.keys[at])
        index -= 1
        if index >= 0:
            at = len(groups[index].keys) - 1
            stop = len(groups[index].keys[at])
