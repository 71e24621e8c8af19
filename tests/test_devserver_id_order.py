"""The dev server's ``_id`` order: sort keys against a reference of mongod's comparison, and the
ordered index against a sorted list, on random values and random sequences of writes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.bson_reference import compare, ids, numbers

from migronaut.devserver.id_order import ORDERED, OrderedIds, sort_key

with_nan = st.one_of(ids, st.sampled_from([math.nan, Decimal128("NaN")]))


def _sign(number: int) -> int:
    return (number > 0) - (number < 0)


@given(with_nan, with_nan)
def test_sort_keys_order_and_equate_values_as_mongod_does(left: Any, right: Any) -> None:
    a, b = sort_key(left), sort_key(right)
    expected = compare(left, right)
    assert (a == b) == (expected == 0)
    if (a[0] in ORDERED and b[0] in ORDERED) or a[0] != b[0]:
        assert _sign((a > b) - (a < b)) == expected


def test_numbers_meet_by_exact_value() -> None:
    one = {sort_key(value) for value in (1, 1.0, Int64(1), Decimal128("1"), Decimal128("1.00"))}
    assert len(one) == 1
    assert sort_key(0.1) != sort_key(Decimal128("0.1"))  # the double 0.1 is not exactly 1/10
    assert sort_key(-0.0) == sort_key(0) == sort_key(Decimal128("-0"))
    assert sort_key(math.nan) == sort_key(Decimal128("NaN")) < sort_key(-math.inf)
    assert sort_key(True) != sort_key(1)


def test_strings_order_by_their_utf8_bytes() -> None:
    assert sort_key("z") < sort_key("é") < sort_key("€") < sort_key("😀")
    assert sort_key(5) < sort_key("") < sort_key({}) < sort_key(b"") < sort_key(True)


# -- the ordered index -----------------------------------------------------------------------

_operations = st.lists(st.tuples(st.sampled_from(["add", "remove", "repoint", "copy", "scan",
                                                  "write the copy"]),
                                 numbers, numbers, st.booleans(), st.booleans()),
                       max_size=80)


class _Model:
    """A sorted list of (key, storage key): the obvious implementation."""

    def __init__(self) -> None:
        self.entries: list[tuple[Any, Any]] = []

    def add(self, key: Any, storage: Any) -> None:
        self.entries = sorted([*self.entries, (key, storage)], key=lambda entry: entry[0])

    def remove(self, key: Any) -> None:
        self.entries = [entry for entry in self.entries if entry[0] != key]

    def find(self, key: Any) -> Any:
        return next((storage for found, storage in self.entries if found == key), None)

    def scan(self, low: Any, low_in: bool, high: Any, high_in: bool, reverse: bool) -> list[Any]:
        kept = [storage for key, storage in self.entries
                if (low is None or key > low or (low_in and key == low))
                and (high is None or key < high or (high_in and key == high))]
        return kept[::-1] if reverse else kept


@settings(max_examples=150, deadline=None)
@given(_operations, st.integers(1, 4), st.integers(1, 3))
def test_the_ordered_index_behaves_as_a_sorted_list(
    operations: list[Any], load: int, group_load: int
) -> None:
    # tiny chunks and groups: a split every few writes, a group emptied by a few removes
    index, model = OrderedIds(load=load, group_load=group_load), _Model()
    snapshots: list[tuple[OrderedIds, list[Any]]] = []
    for step, (operation, value, other, flag, reverse) in enumerate(operations):
        key, bound = sort_key(value), sort_key(other)
        if operation == "add" and index.find(key) is None:
            index.add(key, ("storage", step))
            model.add(key, ("storage", step))
        elif operation == "remove":
            index.remove(key)
            model.remove(key)
        elif operation == "repoint" and index.find(key) is not None:
            index.repoint(key, ("repointed", step))
            model.remove(key)
            model.add(key, ("repointed", step))
        elif operation == "copy":
            snapshots.append((index.copy(), list(model.entries)))
        elif operation == "write the copy":  # the original must not see it
            twin = index.copy()
            twin.remove(key)
            twin.add(sort_key(f"twin {step}"), "twin")
            for entry_key, _ in model.entries[::3]:
                twin.repoint(entry_key, "twin")
            for number in range(4 * load):  # past a chunk: splits in the copy's groups
                twin.add(sort_key(f"twin {step} {number}"), "twin")
            twin_model = _Model()
            repointed = [entry[0] for entry in model.entries[::3]]
            twin_model.entries = [(k, "twin" if k in repointed else v)
                                  for k, v in model.entries if k != key]
            for number in range(-1, 4 * load):
                twin_model.add(sort_key(f"twin {step}" + ("" if number < 0 else f" {number}")),
                               "twin")
            assert list(twin.scan()) == [storage for _, storage in twin_model.entries]
        elif operation == "scan":
            low, high = (key, bound) if key <= bound else (bound, key)
            running = index.scan(low, flag, None, True, reverse=reverse)
            first = next(running, None)
            index.add(sort_key(f"later {step}"), "later")  # a write during the scan
            model.add(sort_key(f"later {step}"), "later")
            expected = _Model()
            expected.entries = [entry for entry in model.entries if entry[1] != "later"
                                or entry[0] != sort_key(f"later {step}")]
            assert [first, *running] == (expected.scan(low, flag, None, True, reverse) or [None])
            assert list(index.scan(low, flag, high, not flag)) == model.scan(
                low, flag, high, not flag, False)
        assert len(index) == len(model.entries)
        assert index.find(key) == model.find(key)
        assert list(index.scan()) == [storage for _, storage in model.entries]
        assert list(index.scan(reverse=True)) == [storage for _, storage in model.entries][::-1]
        if model.entries:  # positional reads, as a $sample draws them
            wanted = [len(model.entries) - 1, 0, step % len(model.entries)]
            assert index.at_positions(wanted) == [model.entries[at][1] for at in wanted]
    for copy, entries in snapshots:  # copies kept what they had when taken
        assert list(copy.scan()) == [storage for _, storage in entries]


def test_all_ordered_counts_keys_outside_the_served_brackets() -> None:
    index = OrderedIds()
    index.add(sort_key(1), "a")
    assert index.all_ordered
    index.add(sort_key({"a": 1}), "b")
    assert not index.all_ordered
    index.remove(sort_key({"a": 1}))
    assert index.all_ordered


def test_an_index_of_plain_keys_counts_no_brackets() -> None:
    """The natural order: insertion ordinals, each with its storage key."""
    index = OrderedIds(bracketed=False, load=1)
    for ordinal in (3, 1, 2, 5):
        index.add(ordinal, f"k{ordinal}")
    index.remove(2)
    assert index.all_ordered and list(index.scan()) == ["k1", "k3", "k5"]
    assert index.find(5) == "k5" and index.at_positions([2, 0]) == ["k5", "k1"]
    with pytest.raises(IndexError):
        index.at_positions([3])


@pytest.mark.parametrize(("load", "group_load"), [(1, 1), (2, 1), (1, 3), (128, 32)])
def test_chunks_and_groups_split_and_empty_in_key_order(load: int, group_load: int) -> None:
    """Keys in random order, then ascending (as ObjectIds and ordinals come), then most of
    them removed: every scan, positional read and lookup agrees with the sorted keys."""
    import random

    rng = random.Random(load * 10 + group_load)
    shuffled = rng.sample(range(0, 3000, 2), 1500)
    index = OrderedIds(load=load, group_load=group_load, bracketed=False)
    expected: list[int] = []
    for number in [*shuffled, *range(3001, 4000, 2)]:
        index.add(number, f"v{number}")
        expected.append(number)
    expected.sort()
    snapshot = index.copy()
    for number in rng.sample(expected, 1800):
        index.remove(number)
        expected.remove(number)
    assert list(index.scan()) == [f"v{n}" for n in expected]
    assert list(index.scan(reverse=True)) == [f"v{n}" for n in reversed(expected)]
    assert list(index.scan(101, False, 2501, True)) == [
        f"v{n}" for n in expected if 101 < n <= 2501]
    assert list(index.scan(101, True, 2501, False, reverse=True)) == [
        f"v{n}" for n in reversed(expected) if 101 <= n < 2501]
    positions = rng.sample(range(len(expected)), 50)
    assert index.at_positions(positions) == [f"v{expected[p]}" for p in positions]
    assert all(index.find(n) == f"v{n}" for n in expected[::7])
    assert len(snapshot) == 2000 and list(snapshot.scan())[:3] == ["v0", "v2", "v4"]
