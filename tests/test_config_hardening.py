"""Config keys that do nothing yet warn instead of pretending to work, and a ``telemetry`` value
of the wrong type is refused by every command that loads the configuration — not only by ``up``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from helpers.engine import ListHandler, make_migrator, write_simple

#: Converge keys accepted (a config shared with the Node original loads) but not implemented yet:
#: converge after up.
NOT_YET_SUPPORTED = ("converge_after_up",)

DOCS = Path(__file__).resolve().parent.parent / "docs"


# ------------------------------------------------------------------ not supported yet: warned


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Not supported yet" in line]


def test_a_key_that_does_nothing_yet_warns_once_on_stderr_and_is_not_an_error(
    cli: Any, project: Any
) -> None:
    write_simple(project, "0001_a")
    project.write("migronaut.toml", 'collections_dir = "collections"\n'
                                    "wait_for_search_indexes = true\n")
    for args in (("status",), ("up",), ("status", "--json"), ("create", "next one")):
        result = cli(*args, env={"MIGRONAUT_CONVERGE_AFTER_UP": "false"})
        assert result.exit_code == 0, (args, result.stderr)
        (line,) = warnings_in(result.stderr)
        assert "collections_dir" not in line  # converge applies it now
        assert "wait_for_search_indexes" not in line  # and waits for search index builds
        assert "converge_after_up (the MIGRONAUT_CONVERGE_AFTER_UP environment variable)" in line
        assert warnings_in(result.stdout) == []
    as_json = cli("status", "--json")
    assert isinstance(as_json.json, list)


def test_no_warning_when_none_is_set(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("status")
    assert result.exit_code == 0 and warnings_in(result.stderr) == []


def test_the_api_warns_once_per_migrator_through_its_logger(project: Any) -> None:
    handler = ListHandler()
    logger = logging.getLogger("test.unsupported")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    write_simple(project, "0001_a")
    with make_migrator(project, logger=logger, collections=[{"name": "users", "indexes": []}],
                       on_search_unavailable="skip", converge_after_up=False) as migrator:
        migrator.status()
        migrator.up()
        migrator.status()
    warned = [r.getMessage() for r in handler.records if "Not supported yet" in r.getMessage()]
    assert len(warned) == 1
    assert "collections (the collections argument)" not in warned[0]
    assert "on_search_unavailable" not in warned[0]  # converge applies it now
    assert "converge_after_up (the converge_after_up argument)" in warned[0]


def test_the_keys_are_the_ones_the_config_warns_about() -> None:
    from migronaut.core import config

    assert config.NOT_YET_SUPPORTED == NOT_YET_SUPPORTED


def test_the_docs_do_not_present_them_as_working() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    keys_table = text.split("## Keys", 1)[1].split("\n## ", 1)[0]
    for key in NOT_YET_SUPPORTED:
        rows = [line for line in keys_table.splitlines() if line.startswith(f"| `{key}` |")]
        assert rows == [], f"{key} is documented in the keys table as if it worked"
        assert re.search(rf"`{key}`", text.split("## Not supported yet", 1)[1]), key


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
