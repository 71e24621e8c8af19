"""``migronaut converge`` with search indexes through the CLI: ``--wait-search`` /
``--no-wait-search`` and ``--check`` failing (28) on a FAILED build (collections.md §7.7–§7.8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import Project, project_on


@pytest.fixture
def project(tmp_path: Path, search_uri: str, db_name: str,
            monkeypatch: pytest.MonkeyPatch) -> Project:
    return project_on(tmp_path, search_uri, db_name, monkeypatch)


def declare(project: Any, definition: dict[str, Any], extra: str = "") -> None:
    (project.path / "collections").mkdir(exist_ok=True)
    (project.path / "collections" / "movies.json").write_text(json.dumps(definition))
    project.write("migronaut.toml", 'collections_dir = "collections"\n' + extra)


def test_wait_search_flag_waits_and_reports(cli: Any, project: Any) -> None:
    declare(project, {"name": "movies", "searchIndexes": [
        {"definition": {"mappings": {"dynamic": True}}}]})
    waited = cli("converge", "--wait-search", "--json")
    assert waited.exit_code == 0, waited.stderr
    assert waited.json["search"]["wait"]["outcome"] == "ready"
    assert cli("converge", "--check").exit_code == 0
    assert cli("converge", "--dry-run", "--wait-search").exit_code != 0  # plan only: refused


def test_no_wait_search_overrides_the_config_and_check_fails_on_failed(
        cli: Any, project: Any) -> None:
    declare(project, {"name": "movies", "searchIndexes": [
        {"definition": {"analyzer": "klingon", "mappings": {"dynamic": True}}}]},
        "wait_for_search_indexes = true\n")
    applied = cli("converge", "--no-wait-search", "--json")
    assert applied.exit_code == 0, applied.stderr
    assert "wait" not in applied.json["search"]
    # untouched by this run, a FAILED build is reported and never holds (nor fails) the wait
    again = cli("converge", "--wait-search")
    assert again.exit_code == 0 and "FAILED" in again.stderr
    checked = cli("converge", "--check", "--json")
    assert checked.json["inSync"] is True  # builds never count against inSync …
    assert checked.exit_code == 28  # … but --check fails on a FAILED one
