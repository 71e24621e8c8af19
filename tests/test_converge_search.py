"""Search indexes in ``converge`` over the wire (collections.md §7): against the dev server in
``--search`` mode (builds take ``2 * SEARCH_DELAY``) and, for "Search unavailable", against the
plain dev server, which answers 31082 like a mongod without mongot."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from conftest import SEARCH_DELAY, project_on, search_server
from helpers.engine import captured_logger, make_migrator
from helpers.wire_audit import AUDIT
from migronaut import ConvergeFailedError
from migronaut.observability.events import EVENTS

MOVIES: dict[str, Any] = {"name": "movies", "search_indexes": [
    {"definition": {"mappings": {"fields": {"title": {"type": "string"}}}}},
    {"name": "vec", "type": "vectorSearch", "definition": {"fields": [
        {"type": "vector", "path": "embedding", "numDimensions": 3, "similarity": "cosine"}]}},
]}
#: Atlas accepts it, then fails to build it (the analyzer does not exist).
BROKEN: dict[str, Any] = {"name": "movies", "search_indexes": [
    {"definition": {"analyzer": "klingon", "mappings": {"dynamic": True}}}]}


@pytest.fixture
def sproject(tmp_path: Path, search_uri: str, db_name: str,
             monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "search").mkdir()
    return project_on(tmp_path / "search", search_uri, db_name, monkeypatch)


def converge(project: Any, collections: list[dict[str, Any]], config: dict[str, Any] | None = None,
             **options: Any) -> Any:
    with make_migrator(project, collections=collections, **(config or {})) as migrator:
        return migrator.converge(**options)


def rows(result: Any) -> dict[str, tuple[str, str]]:
    return {row.name: (row.action, row.status) for plan in result.collections
            for row in plan.actions if row.target == "searchIndex"}


def test_create_then_fixed_point_then_update(sproject: Any) -> None:
    planned = converge(sproject, [MOVIES], dry_run=True)
    assert rows(planned) == {"default": ("create", "planned"), "vec": ("create", "planned")}
    assert planned.search["available"] is True

    result = converge(sproject, [MOVIES], wait_for_search_indexes=True)
    assert rows(result) == {"default": ("create", "applied"), "vec": ("create", "applied")}
    assert result.search["wait"]["outcome"] == "ready"
    assert result.search["notReady"] == []
    assert result.unstable is None

    again = converge(sproject, [MOVIES], dry_run=True)  # Atlas's defaults filled: no diff
    assert again.in_sync and again.changed == 0
    assert {action for action, _ in rows(again).values()} == {"unchanged"}

    changed = {**MOVIES, "search_indexes": [
        {"definition": {"mappings": {"fields": {"title": {"type": "token"}}}}},
        MOVIES["search_indexes"][1]]}
    plan = converge(sproject, [changed], dry_run=True)
    assert rows(plan)["default"] == ("modify", "planned")
    assert "mappings.fields.title.type" in (plan.collections[0].row("searchIndex",
                                                                    "default").reason or "")
    updated = converge(sproject, [changed], wait_for_search_indexes=True)
    assert rows(updated)["default"] == ("modify", "applied")
    assert updated.search["wait"]["outcome"] == "ready"
    assert converge(sproject, [changed], dry_run=True).in_sync


def test_builds_are_reported_without_a_wait_and_never_count_against_in_sync(
        sproject: Any) -> None:
    result = converge(sproject, [MOVIES])
    assert result.in_sync
    assert {entry["name"] for entry in result.search["notReady"]} == {"default", "vec"}
    assert "wait" not in result.search


def test_prune_drops_an_undeclared_search_index(sproject: Any) -> None:
    converge(sproject, [MOVIES])
    only_default = {**MOVIES, "search_indexes": MOVIES["search_indexes"][:1]}
    kept = converge(sproject, [only_default], dry_run=True)
    assert rows(kept)["vec"] == ("keep", "planned")
    pruned = converge(sproject, [only_default], prune=True)
    assert rows(pruned)["vec"] == ("drop", "applied")
    after = converge(sproject, [only_default], dry_run=True, prune=True)
    assert "vec" not in rows(after) or rows(after)["vec"][0] == "keep"  # DELETING, then gone


def test_a_failed_build_fails_the_wait_and_is_unchanged_afterwards(sproject: Any) -> None:
    with pytest.raises(ConvergeFailedError) as caught:
        converge(sproject, [BROKEN], wait_for_search_indexes=True)
    context = caught.value.context
    assert context["phase"] == "wait" and context["reason"] == "failed"
    assert "FAILED" in caught.value.message and "klingon" in caught.value.message
    assert context["converge"]["search"]["wait"]["outcome"] == "failed"

    again = converge(sproject, [BROKEN], dry_run=True)
    assert rows(again) == {"default": ("unchanged", "planned")}  # resubmitting changes nothing
    assert again.search["notReady"][0]["status"] == "FAILED"


def test_wait_times_out_with_its_budget(sproject: Any) -> None:
    with pytest.raises(ConvergeFailedError) as caught:
        converge(sproject, [MOVIES], {"search_index_wait_timeout_ms": 100},
                 wait_for_search_indexes=True)
    context = caught.value.context
    assert context["phase"] == "wait" and context["reason"] == "timeout"
    assert context["timeoutMs"] == 100
    assert {entry["name"] for entry in context["notReady"]} == {"default", "vec"}
    # everything was applied anyway
    assert rows(converge(sproject, [MOVIES], dry_run=True)) == {
        "default": ("unchanged", "planned"), "vec": ("unchanged", "planned")}


def test_wait_releases_the_lock_early_and_reports_events(sproject: Any) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with make_migrator(sproject, collections=[MOVIES]) as migrator:
        for name in ("converge:wait", "lock:released", "converge:end"):
            migrator.on(name, lambda payload, name=name: events.append((name, payload)))
        migrator.converge(wait_for_search_indexes=True)
    names = [name for name, _ in events]
    assert names[0] == "lock:released" and events[0][1].get("early") is True
    assert events[1][1]["status"] == "started" and events[1][1]["lockReleased"] is True
    assert events[-2][1]["status"] == "ready" and names[-1] == "converge:end"
    assert names.count("lock:released") == 1


def test_search_unavailable_fails_before_any_write(project: Any, db: Any) -> None:
    with pytest.raises(ConvergeFailedError) as caught:
        converge(project, [MOVIES])
    context = caught.value.context
    assert context["phase"] == "plan"
    assert "mongodb-atlas-local" in context["hint"]
    assert context["converge"]["search"] == {"available": False, "evidence": "error",
                                             "notReady": []}
    assert "movies" not in db.list_collection_names()


def test_search_unavailable_skip_converges_the_rest(project: Any, db: Any) -> None:
    declared = {**MOVIES, "indexes": [{"key": {"year": 1}}]}
    result = converge(project, [declared], {"on_search_unavailable": "skip"})
    assert rows(result) == {"default": ("skip", "skipped"), "vec": ("skip", "skipped")}
    assert result.in_sync and result.search["available"] is False
    assert "year_1" in {index["name"] for index in db.movies.list_indexes()}


def search_check(project: Any, collections: list[dict[str, Any]],
                 config: dict[str, Any] | None = None) -> Any:
    with make_migrator(project, collections=collections, **(config or {})) as migrator:
        report = migrator.audit()
    return {check.name: check for check in report.checks}.get("search")


def test_audit_search_check(sproject: Any, project: Any) -> None:
    assert search_check(sproject, [{"name": "plain", "indexes": []}]) is None
    converge(sproject, [MOVIES], wait_for_search_indexes=True)
    available = search_check(sproject, [MOVIES])
    assert (available.status, available.detail) == (
        "pass", "Atlas Search available; 2 declared search index(es)")
    broken = {"name": "shows", "search_indexes": BROKEN["search_indexes"]}
    with pytest.raises(ConvergeFailedError):
        converge(sproject, [broken], wait_for_search_indexes=True)
    failed = search_check(sproject, [broken])
    assert failed.status == "warn" and 'shows "default" FAILED' in failed.detail
    unavailable = search_check(project, [MOVIES])
    assert unavailable.status == "fail" and "mongodb-atlas-local" in unavailable.detail
    skipped = search_check(project, [MOVIES], {"on_search_unavailable": "skip"})
    assert skipped.status == "warn" and "2 declared search index(es) skipped" in skipped.detail


# ------------------------------------------------- the fixed-point check and a lagging list


def project_on_server(tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch,
                      request: pytest.FixtureRequest) -> Any:
    """A project on another ``--search`` server; its database is dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    request.addfinalizer(client.close)
    request.addfinalizer(lambda: client.drop_database(name))
    (tmp_path / "lagged").mkdir()
    return project_on(tmp_path / "lagged", uri, name, monkeypatch)


@pytest.fixture
def lproject(tmp_path: Path, lagged_search_uri: str, monkeypatch: pytest.MonkeyPatch,
             request: pytest.FixtureRequest) -> Any:
    """On a server that lists a search-index change ``SEARCH_LAG`` (0.6) seconds late."""
    return project_on_server(tmp_path, lagged_search_uri, monkeypatch, request)


@pytest.fixture(scope="module")
def slow_list_uri() -> Iterator[str]:
    """A ``--search`` server whose list lags longer than the check's retries (1.75 s)."""
    yield from search_server(search_delay=SEARCH_DELAY, search_lag=5.0)


def lists_after_submit(sent: list[Any], submit: str) -> int:
    """``$listSearchIndexes`` reads of ``movies`` sent after the ``submit`` command: the
    fixed-point check's reads."""
    names = [s.command for s in sent if s.target == "movies"]
    return names[names.index(submit):].count("aggregate")


def test_the_fixed_point_check_reads_a_lagging_search_list_again(lproject: Any) -> None:
    """§2.6.3: search rows were applied and the list still shows them to do — read again after
    250, 500, 1000 ms; here the list catches up within them: no ``unstable``."""
    with AUDIT.recording() as sent:
        created = converge(lproject, [MOVIES])
    assert rows(created) == {"default": ("create", "applied"), "vec": ("create", "applied")}
    assert created.unstable is None and created.in_sync
    assert lists_after_submit(sent, "createSearchIndexes") >= 2  # read again, at least once

    changed = {**MOVIES, "search_indexes": [
        {"definition": {"mappings": {"fields": {"title": {"type": "token"}}}}},
        MOVIES["search_indexes"][1]]}
    with AUDIT.recording() as sent:
        updated = converge(lproject, [changed])
    assert rows(updated)["default"] == ("modify", "applied")
    assert updated.unstable is None and updated.in_sync
    assert lists_after_submit(sent, "updateSearchIndex") >= 2


def test_a_search_list_still_behind_after_the_retries_is_unstable(
        tmp_path: Path, slow_list_uri: str, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    project = project_on_server(tmp_path, slow_list_uri, monkeypatch, request)
    with captured_logger() as (logger, handler), AUDIT.recording() as sent:
        result = converge(project, [MOVIES], {"logger": logger})
    assert rows(result) == {"default": ("create", "applied"), "vec": ("create", "applied")}
    assert result.unstable == tuple(
        {"collection": "movies", "target": "searchIndex", "name": name, "action": "create"}
        for name in ("default", "vec"))
    assert result.in_sync is False
    assert lists_after_submit(sent, "createSearchIndexes") == 4  # at 0, 0.25, 0.75, 1.75 s
    warned = [r.getMessage() for r in handler.records if "still shows create" in r.getMessage()]
    assert len(warned) == 2
    assert all("every update makes the server rebuild the index" in line for line in warned)


def test_every_event_converge_emits_is_declared_and_documented(sproject: Any) -> None:
    """``EVENTS`` lists every ``converge:*`` event — those a converge with a wait emits, and
    every one the converge modules name — and ``docs/observability.md`` documents each."""
    seen: list[str] = []
    with make_migrator(sproject, collections=[MOVIES]) as migrator:
        migrator.on("*", lambda event: seen.append(event["event"]))
        migrator.converge(wait_for_search_indexes=True)
    emitted = {name for name in seen if name.startswith("converge:")}
    assert emitted == {"converge:start", "converge:action", "converge:wait", "converge:end"}
    assert emitted <= set(EVENTS)

    import migronaut.commands as commands

    source = "".join(path.read_text() for path in
                     Path(commands.__file__).parent.glob("*converge*.py"))
    named = set(re.findall(r'"(converge:[a-z]+)"', source))
    assert emitted <= named <= set(EVENTS)
    documented = (Path(__file__).parent.parent / "docs" / "observability.md").read_text()
    assert [name for name in EVENTS if f"| `{name}` |" not in documented] == []
