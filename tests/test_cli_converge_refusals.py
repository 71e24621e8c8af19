"""Declarations and flags ``converge`` refuses before anything is written (collections.md
§2.1, §2.10): migronaut's own collections, names MongoDB cannot hold, nesting deeper than MongoDB
stores (or than Python can read), a JSON file holding ``null``, more indexes than a collection
holds, and ``--wait-search`` where nothing waits. Each is ``CONFIG_INVALID`` (exit 6) naming the
file, for ``converge``, ``--dry-run`` and ``--check`` alike.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from migronaut.declared import indexes as declared_indexes
from migronaut.declared.indexes import MAX_DECLARED, validate_indexes
from migronaut.declared.issues import Issues


def declare(project: Any, files: dict[str, str]) -> None:
    for name, text in files.items():
        project.write(f"collections/{name}", text)
    project.write("migronaut.toml", 'collections_dir = "collections"\n')


def refused_everywhere(cli: Any, db: Any, path: str, message: str) -> None:
    """``converge``, ``--dry-run`` and ``--check`` all exit 6 with the one issue, and nothing
    of the user's is written."""
    before = sorted(db.list_collection_names())
    for args in (("converge", "-y", "--json"), ("converge", "--dry-run", "--json"),
                 ("converge", "--check", "--json")):
        refused = cli(*args)
        assert refused.exit_code == 6, (args, refused.stderr)
        error = refused.json["error"]
        assert error["code"] == "CONFIG_INVALID"
        assert error["context"]["issues"] == [{"path": path, "message": message}]
        assert error["message"] == f"Invalid collection definition(s): {path}: {message}"
    assert sorted(db.list_collection_names()) == before


@pytest.mark.parametrize("name", ["abc.", "a..b", ".abc"])
def test_a_name_with_an_empty_dot_segment_is_refused(
    name: str, cli: Any, project: Any, db: Any,
) -> None:
    declare(project, {"bad.json": json.dumps({"name": name, "indexes": [{"key": {"a": 1}}]})})
    refused_everywhere(cli, db, "bad.json: name", "must not start or end with '.' or contain '..'")


@pytest.mark.parametrize("name", ["_migronaut_runs", "_migronaut_runs_logs",
                                  "_migronaut_converge_rebuilds", "_migronaut_anything"])
def test_own_collections_cannot_be_declared_nor_pruned(
    name: str, cli: Any, project: Any, db: Any,
) -> None:
    # a migration that logs a line: the run history and its log lines exist, with their indexes
    project.write_migration("0001_a", 'def up(ctx):\n    ctx.logger.info("one line")\n\n\n'
                            'def down(ctx):\n    pass\n')
    project.write("migronaut.toml", "")
    assert cli("up").exit_code == 0
    runs = {index["name"] for index in db["_migronaut_runs"].list_indexes()}
    logs = {index["name"] for index in db["_migronaut_runs_logs"].list_indexes()}
    assert "startedAt" in runs and "runId_seq" in logs

    declare(project, {"own.json": json.dumps({"name": name, "indexes": [], "prune": True})})
    refused_everywhere(cli, db, "own.json: name",
                       f'"{name}" is one of migronaut\'s own collections and cannot be declared')
    assert {index["name"] for index in db["_migronaut_runs"].list_indexes()} == runs
    assert {index["name"] for index in db["_migronaut_runs_logs"].list_indexes()} == logs


def test_json_nested_past_what_python_reads_is_refused(cli: Any, project: Any, db: Any) -> None:
    depth = 200_000
    declare(project, {"deep.json": '{"indexes": [{"key": {"a": 1}, "partialFilterExpression": '
                      + '{"a": ' * depth + "1" + "}" * depth + "}]}"})
    refused_everywhere(cli, db, "deep.json", "is nested too deeply to read (MongoDB stores at "
                       "most 100 levels of nesting)")


def test_a_definition_nested_past_what_mongodb_stores_is_refused(
    cli: Any, project: Any, db: Any,
) -> None:
    declare(project, {"deep.py": "_filter = 1\nfor _ in range(200_000):\n"
                                 "    _filter = {'a': _filter}\n"
                                 "indexes = [{'key': {'a': 1}, "
                                 "'partialFilterExpression': _filter}]\n"})
    path = "deep.py: indexes[0].partialFilterExpression" + ".a" * 97
    refused_everywhere(cli, db, path,
                       "is nested too deeply (MongoDB stores at most 100 levels of nesting)")


def test_a_json_file_holding_null_is_refused(cli: Any, project: Any, db: Any) -> None:
    declare(project, {"nothing.json": "null",
                      "orders.json": json.dumps({"indexes": [{"key": {"a": 1}}]})})
    refused_everywhere(cli, db, "nothing.json", "must be a mapping (got null)")


def test_more_indexes_than_a_collection_holds_are_refused(
    cli: Any, project: Any, db: Any,
) -> None:
    many = [{"key": {f"f{i}": 1}} for i in range(MAX_DECLARED + 1)]
    declare(project, {"wide.json": json.dumps({"indexes": many})})
    refused_everywhere(cli, db, "wide.json: indexes",
                       "declares 64 indexes; a collection holds at most 64, _id_ included "
                       "(63 declared at most)")

    declare(project, {"wide.json": json.dumps({"indexes": many[:-1],
                                               "versioning": {"current": 1}})})
    refused_everywhere(cli, db, "wide.json: indexes",
                       "declares 63 indexes and versioning one more; a collection holds at "
                       "most 64, _id_ included")

    declare(project, {"wide.json": json.dumps({"indexes": many[:-1]})})
    planned = cli("converge", "--dry-run", "--json")
    assert planned.exit_code == 0, planned.stderr
    assert len(planned.json["collections"][0]["actions"]) == MAX_DECLARED + 1  # + collection


def test_the_clash_check_compares_each_index_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each index's signature is computed once — not once per pair, which made 1,000 declared
    indexes take seconds — and every clash is still found against the earliest index."""
    calls = []
    real = declared_indexes.DeclaredIndex.signature

    def counted(self: Any) -> str:
        calls.append(self.name)
        return real(self)

    monkeypatch.setattr(declared_indexes.DeclaredIndex, "signature", counted)
    raw: list[dict[str, Any]] = [{"key": {f"f{i}": 1}} for i in range(59)]
    raw += [{"key": {"f3": 1}, "name": "again"}, {"key": {"f9": 1}, "name": "f5_1"},
            {"key": {"t": "text"}}, {"key": {"u": "text"}}]
    issues = Issues()
    validate_indexes(raw, "indexes", issues)
    assert len(calls) <= len(raw) + 2 * len(issues.found)  # once each; a clash names it
    assert issues.found == [
        {"path": "indexes[59]", "message": "declares the same index as indexes[3] (same key, "
                                           "partial filter and collation)"},
        {"path": "indexes[60]", "message": 'has the same name "f5_1" as indexes[5]'},
        {"path": "indexes[62]", "message": "is a second text index (indexes[61] is one; a "
                                           "collection holds at most one)"}]


@pytest.mark.parametrize("flags", [
    ("--history", "--wait-search"), ("--history", "--no-wait-search"),
    ("--dry-run", "--no-wait-search"), ("--check", "--wait-search"),
    ("--check", "--no-wait-search")])
def test_wait_search_where_nothing_waits_is_refused(
    flags: tuple[str, ...], cli: Any, project: Any, db: Any,
) -> None:
    declare(project, {"orders.json": json.dumps({"indexes": [{"key": {"a": 1}}]})})
    refused = cli("converge", *flags, "--json")
    assert refused.exit_code == 6, refused.stderr
    error = refused.json["error"]
    assert error["code"] == "CONFIG_INVALID" and error["context"] == {"option": "wait-search"}
    assert error["message"] == (f"{flags[1]} cannot be combined with {flags[0]}: only a "
                                "converge that applies waits for search indexes")
    assert db.list_collection_names() == []
