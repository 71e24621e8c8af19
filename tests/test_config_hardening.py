"""Every declared-collection and converge key is applied now: none warns "Not supported yet"
(they did while converge was missing). A ``telemetry`` value of the wrong type is refused by
every command that loads the configuration — not only by ``up``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from helpers.engine import ListHandler, make_migrator, write_simple

#: The keys that once warned "Not supported yet" (converge and Atlas Search).
CONVERGE_KEYS = ("collections", "collections_dir", "converge_after_up", "on_search_unavailable",
                 "wait_for_search_indexes", "search_index_wait_timeout_ms")

DOCS = Path(__file__).resolve().parent.parent / "docs"


# ---------------------------------------------------------- converge keys: applied, not warned


def test_converge_keys_set_everywhere_warn_nothing(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    project.write("migronaut.toml", 'collections_dir = "collections"\n'
                                    "wait_for_search_indexes = true\n"
                                    'on_search_unavailable = "skip"\n'
                                    "search_index_wait_timeout_ms = 1000\n")
    (project.path / "collections").mkdir()
    for args in (("status",), ("up",), ("status", "--json"), ("create", "next one")):
        result = cli(*args, env={"MIGRONAUT_CONVERGE_AFTER_UP": "false"})
        assert result.exit_code == 0, (args, result.stderr)
        assert "Not supported yet" not in result.stderr + result.stdout, args


def test_the_api_warns_nothing_for_them(project: Any) -> None:
    handler = ListHandler()
    logger = logging.getLogger("test.converge-keys")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    write_simple(project, "0001_a")
    with make_migrator(project, logger=logger, collections=[{"name": "users", "indexes": []}],
                       on_search_unavailable="skip", converge_after_up=False) as migrator:
        migrator.status()
        migrator.up()
    assert not [r for r in handler.records if "Not supported" in r.getMessage()]


def test_the_docs_list_them_as_working_keys() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "## Not supported yet" not in text
    keys_table = text.split("## Keys", 1)[1].split("\n## ", 1)[0]
    for key in CONVERGE_KEYS:
        rows = [line for line in keys_table.splitlines() if line.startswith(f"| `{key}` |")]
        assert len(rows) == 1, f"{key} is not in the keys table"


# ---------------------------------------------------------- telemetry of the wrong type


@pytest.mark.parametrize(("value", "path"), [
    ("5", "telemetry"),
    ('"jaeger"', "telemetry"),
    ('{"tracer": "jaeger"}', "telemetry.tracer"),
    ('{"attributes": ["team"]}', "telemetry.attributes"),
    ('{"exporter": 1}', "telemetry.exporter"),
])
@pytest.mark.parametrize("args", [
    ("status",), ("list",), ("lock",), ("logs",), ("dry-run", "up"), ("background", "status"),
    ("create", "x"), ("up",), ("status", "--json"),
])
def test_a_telemetry_value_of_the_wrong_type_is_refused_by_every_command(
    cli: Any, project: Any, db: Any, value: str, path: str, args: tuple[str, ...]
) -> None:
    write_simple(project, "0001_a")
    project.write("migronaut_config.py", f"config = {{'telemetry': {value}}}\n")
    result = cli(*args)
    assert result.exit_code == 6, (args, result.stdout + result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.startswith("✖")]
    assert len(lines) == 1
    assert lines[0].startswith(f"✖ CONFIG_INVALID: Invalid configuration: {path}: ")
    if "--json" in args:
        assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert not list(project.migrations.glob("*_x.py"))  # create wrote nothing
    assert db.list_collection_names() == []  # nothing connected or written


def test_audit_reports_a_bad_telemetry_value_as_a_failed_config_check(
    cli: Any, project: Any
) -> None:
    project.write("migronaut_config.py", "config = {'telemetry': 5}\n")
    result = cli("audit", "--json")
    assert result.exit_code == 22
    (config,) = [c for c in result.json["checks"] if c["name"] == "config"]
    assert config["status"] == "fail" and "telemetry" in config["detail"]


def test_a_good_telemetry_value_loads_without_opentelemetry_being_imported(
    project: Any,
) -> None:
    import sys

    from migronaut.core.config import load_config

    project.write("migronaut_config.py", "config = {'telemetry': True}\n")
    before = {name for name in sys.modules if name.startswith("opentelemetry")}
    config = load_config(cwd=project.path)
    assert config.telemetry is True
    assert {name for name in sys.modules if name.startswith("opentelemetry")} == before
