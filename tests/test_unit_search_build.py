"""Search build states, the wait's classification (collections.md §7.7–§7.8), and the
recognition of "Search unavailable", transient reads and search-step hints (§7.4, §7.6)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import AutoReconnect, OperationFailure

from migronaut.commands.converge_search import is_search_unavailable, search_hint
from migronaut.commands.converge_wait import is_transient
from migronaut.declared.search_build import WaitTarget, build_state, classify_wait


@pytest.mark.parametrize(("build", "state"), [
    ({"status": "FAILED", "queryable": False}, "failed"),
    ({"status": "STALE", "queryable": True}, "stale"),
    ({"status": "DELETING", "queryable": False}, "removing"),
    ({"status": "DOES_NOT_EXIST", "queryable": False}, "removing"),
    ({"status": "PENDING", "queryable": False}, "building"),
    ({"status": "READY", "queryable": False}, "building"),
    ({"status": "BUILDING", "queryable": True}, "building"),
    ({"status": "READY", "queryable": True, "updating": True}, "updating"),
    ({"status": "READY", "queryable": True}, "serving"),
    ({"status": "UNKNOWN", "queryable": True}, "serving"),
    ({}, "building"),
    (None, "building"),
])
def test_build_state(build: Any, state: str) -> None:
    assert build_state(build) == state


READY = ({"status": "READY", "queryable": True}, 3)


def test_classify_ready_failed_preexisting_and_versions() -> None:
    touched = WaitTarget("c", "a", touched=True, since_version=2)
    untouched = WaitTarget("c", "b", touched=False)
    assert classify_wait([touched, untouched], {("c", "a"): READY, ("c", "b"): READY})[0] \
        == "ready"
    # an update is ready only once a newer definition version is reported
    old = ({"status": "READY", "queryable": True}, 2)
    assert classify_wait([touched], {("c", "a"): old})[0] is None
    # not listed yet: keep waiting
    assert classify_wait([touched], {})[0] is None
    failed = ({"status": "FAILED", "queryable": False}, 3)
    assert classify_wait([touched], {("c", "a"): failed})[0] == "failed"
    outcome, waiting, preexisting = classify_wait(
        [untouched, touched], {("c", "b"): failed, ("c", "a"): READY})
    assert (outcome, waiting, preexisting) == ("ready", [], [untouched])
    stale = ({"status": "STALE", "queryable": True}, 3)
    assert classify_wait([touched], {("c", "a"): stale})[0] is None  # touched STALE: waits


def failure(code: int | None, message: str, code_name: str | None = None) -> OperationFailure:
    details: dict[str, Any] = {"errmsg": message, "code": code}
    if code_name:
        details["codeName"] = code_name
    return OperationFailure(message, code, details)


@pytest.mark.parametrize("error", [
    failure(31082, "requires additional configuration"),
    failure(1, "x", "SearchNotEnabled"),
    failure(40324, "Unrecognized pipeline stage name: '$listSearchIndexes'"),
    failure(None, "$listSearchIndexes stage is only allowed on MongoDB Atlas"),
    failure(None, "no such command: 'createSearchIndexes'"),
])
def test_search_unavailable_is_recognised(error: OperationFailure) -> None:
    assert is_search_unavailable(error)
    assert "mongodb-atlas-local" in (search_hint(error) or "")


def test_other_errors_are_not_search_unavailable() -> None:
    assert not is_search_unavailable(failure(13, "not authorized"))
    assert "readWrite" in (search_hint(failure(13, "not authorized")) or "")
    assert "retry shortly" in (search_hint(failure(68, "Index already exists")) or "")
    assert "limit" in (search_hint(failure(8, "exceeded the maximum search index count")) or "")
    assert "new name" in (search_hint(failure(8, "mappings field is required")) or "")


def test_transient_reads() -> None:
    assert is_transient(AutoReconnect("reset"))
    assert is_transient(failure(91, "shutting down"))
    wrapped = RuntimeError("listing failed")
    wrapped.__cause__ = AutoReconnect("reset")
    assert is_transient(wrapped)
    assert not is_transient(failure(13, "not authorized"))
    assert not is_transient(None)
