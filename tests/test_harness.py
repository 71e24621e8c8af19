"""The harness in tests/conftest.py keeps its promises: isolation, markers, the CLI runners."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from conftest import TOPOLOGY_VARIABLE, CliProcess, CliResult, CliRunner, Project
from helpers.node_clients import NODE_HINT, ensure_node_clients
from helpers.tools import REQUIRE_TOOLS_VARIABLE, require_tool

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")
INNER_INI = """
[pytest]
addopts = -p no:cacheprovider --strict-markers
markers =
    replica_set: needs a replica set
    real_mongodb: needs a real MongoDB
    standalone: needs a server without change streams
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A scratch pytest project using this very conftest (without CI's server promise: the
    scratch tests set ``MIGRONAUT_TEST_TOPOLOGY`` themselves where they test it)."""
    monkeypatch.delenv(TOPOLOGY_VARIABLE, raising=False)
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makeini(INNER_INI)
    return pytester


def replace_cli_main(monkeypatch: pytest.MonkeyPatch, main: Callable[..., int]) -> None:
    """Stand ``main`` in for ``migronaut.cli.main`` (the CLI itself need not exist)."""
    try:
        import migronaut.cli as cli_module
    except ImportError:
        cli_module = types.ModuleType("migronaut.cli")
        monkeypatch.setitem(sys.modules, "migronaut.cli", cli_module)
    monkeypatch.setattr(cli_module, "main", main, raising=False)


# -------------------------------------------------------------------------- database fixtures


def test_db_is_a_fresh_database_dropped_after_the_test(
    db: Database[dict[str, Any]], db_name: str, client: MongoClient[dict[str, Any]]
) -> None:
    assert db.name == db_name
    assert db_name.startswith("t_") and len(db_name) == 14
    assert db.list_collection_names() == []

    db.books.insert_one({"title": "Dune"})

    assert db_name in client.list_database_names()


def test_databases_of_finished_tests_are_dropped(
    inner: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    mongo_uri: str,
    client: MongoClient[dict[str, Any]],
) -> None:
    monkeypatch.setenv("MIGRONAUT_TEST_URI", mongo_uri)  # the inner run reuses our server
    inner.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("n", [1, 2])
        def test_writes(db, db_name, n, pytestconfig):
            db.books.insert_one({"n": n})
            with open(pytestconfig.rootpath / "names.txt", "a") as names:
                names.write(db_name + "\\n")
        """
    )

    inner.runpytest().assert_outcomes(passed=2)

    names = (inner.path / "names.txt").read_text().split()
    assert len(set(names)) == 2
    assert not set(names) & set(client.list_database_names())


# ---------------------------------------------------------------------- isolation and markers


def test_developer_environment_does_not_leak_into_a_test(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mongo_uri: str
) -> None:
    monkeypatch.setenv("MIGRONAUT_TEST_URI", mongo_uri)  # the inner run reuses our server
    monkeypatch.setenv("MIGRONAUT_LOCK_TTL", "5")
    monkeypatch.setenv("MIGRONAUT_URI", "mongodb://developer:secret@prod.example/")
    inner.makepyfile(
        """
        import os

        def test_isolated(project):
            assert "MIGRONAUT_LOCK_TTL" not in os.environ
            assert os.environ["MIGRONAUT_URI"] == project.uri
            assert "developer" not in project.uri
            assert os.environ["MIGRONAUT_DB"] == project.db_name
            env = project.env(MIGRONAUT_STRICT="true", MIGRONAUT_DB=None)
            assert env["MIGRONAUT_URI"] == project.uri
            assert env["MIGRONAUT_STRICT"] == "true"
            assert "MIGRONAUT_DB" not in env and "MIGRONAUT_LOCK_TTL" not in env
        """
    )

    inner.runpytest().assert_outcomes(passed=1)


def test_real_mongodb_tests_skip_without_a_test_uri(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MIGRONAUT_TEST_URI", raising=False)
    inner.makepyfile(
        """
        import pytest

        @pytest.mark.real_mongodb
        def test_needs_mongodb(db):
            raise AssertionError("must not run")
        """
    )

    result = inner.runpytest("-rs")

    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a real MongoDB: set MIGRONAUT_TEST_URI*"])


def test_replica_set_tests_skip_when_hello_has_no_set_name(
    inner: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    mongo_uri: str,
    server_hello: dict[str, Any],
) -> None:
    monkeypatch.setenv("MIGRONAUT_TEST_URI", mongo_uri)
    inner.makepyfile(
        """
        import pytest

        @pytest.mark.replica_set
        def test_needs_a_replica_set(db):
            pass
        """
    )

    result = inner.runpytest("-rs")

    if server_hello.get("setName"):
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(
            ["*needs a replica set: the server's hello reports no setName*"]
        )


def test_a_server_that_must_run_a_marker_fails_its_tests_instead_of_skipping_them(
    inner: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    mongo_uri: str,
    server_hello: dict[str, Any],
) -> None:
    """CI names each job's server in ``MIGRONAUT_TEST_TOPOLOGY``: a test marked for it that would
    skip there fails, so a job on the wrong server cannot pass by skipping."""
    monkeypatch.setenv("MIGRONAUT_TEST_URI", mongo_uri)
    monkeypatch.setenv(TOPOLOGY_VARIABLE, "replica_set")
    inner.makepyfile(
        """
        import pytest

        @pytest.mark.replica_set
        def test_needs_a_replica_set(db):
            pass

        @pytest.mark.standalone
        def test_needs_no_change_streams(db):
            pass
        """
    )

    result = inner.runpytest("-rEs")

    if server_hello.get("setName"):
        result.assert_outcomes(passed=1, skipped=1)  # replica_set runs no standalone test
    else:
        result.assert_outcomes(errors=1, passed=1)  # failed in the fixture that decides
        result.stdout.fnmatch_lines(["*needs a replica set*MIGRONAUT_TEST_TOPOLOGY=replica_set "
                                     "promises this server runs every 'replica_set' test*"])


def test_an_unknown_topology_fails_every_test_it_would_judge(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOPOLOGY_VARIABLE, "replicaset")
    inner.makepyfile("def test_anything():\n    pass\n")

    result = inner.runpytest()

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*MIGRONAUT_TEST_TOPOLOGY='replicaset' is none of*"])


# ------------------------------------------------------------------------------ project, CLI


def test_project_writes_migrations_dedented(project: Project) -> None:
    path = project.write_migration(
        "20240101000000_add_index",
        """
        def up(ctx):
            pass
        """,
    )

    assert path == project.migrations / "20240101000000_add_index.py"
    assert path.read_text(encoding="utf-8") == "\ndef up(ctx):\n    pass\n"


def test_cli_runs_main_in_the_project_with_input_env_and_capture(
    cli: CliRunner, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_main(argv: Sequence[str] | None = None) -> int:
        print(
            json.dumps(
                {
                    "argv": list(argv or []),
                    "cwd": os.getcwd(),
                    "stdin": sys.stdin.read(),
                    "db": os.environ.get("MIGRONAUT_DB"),
                    "extra": os.environ.get("EXTRA"),
                }
            )
        )
        print("a warning", file=sys.stderr)
        return 3

    replace_cli_main(monkeypatch, fake_main)

    result = cli("status", "--json", input="yes\n", env={"EXTRA": "1", "MIGRONAUT_DB": None})

    assert result.exit_code == 3
    assert result.stderr == "a warning\n"
    assert result.json == {
        "argv": ["status", "--json"],
        "cwd": str(project.path),
        "stdin": "yes\n",
        "db": None,
        "extra": "1",
    }
    assert os.getcwd() != str(project.path)  # restored after the call
    assert "EXTRA" not in os.environ
    assert os.environ["MIGRONAUT_DB"] == project.db_name


def test_cli_reports_a_main_that_calls_sys_exit(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    def exiting_main(argv: Sequence[str] | None = None) -> int:
        sys.exit(2)

    replace_cli_main(monkeypatch, exiting_main)

    with pytest.raises(AssertionError, match=r"called sys.exit\(2\)"):
        cli("up")


def test_cli_result_json_is_none_for_plain_text() -> None:
    assert CliResult.of(0, "Applied 1 migration\n", "").json is None
    assert CliResult.of(0, '{"ok": true}\n', "").json == {"ok": True}


_ECHO = (
    "import json, os, sys; "
    "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'stdin': sys.stdin.read(), "
    "'uri': os.environ.get('MIGRONAUT_URI'), 'db': os.environ.get('MIGRONAUT_DB'), "
    "'extra': os.environ.get('EXTRA')})); "
    "sys.exit(int(os.environ.get('EXIT', '0')))"
)


def test_cli_process_runs_a_subprocess_in_the_project(
    cli_process: CliProcess, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_process, "argv", lambda *args: [sys.executable, "-c", _ECHO, *args])

    result = cli_process("up", "--json", input="y\n", env={"EXTRA": "x", "EXIT": "7"})

    assert result.exit_code == 7
    assert result.json == {
        "argv": ["up", "--json"],
        "cwd": str(project.path),
        "stdin": "y\n",
        "uri": project.uri,
        "db": project.db_name,
        "extra": "x",
    }


def test_cli_process_start_returns_a_running_process(
    cli_process: CliProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        cli_process, "argv", lambda *args: [sys.executable, "-c", "import time; time.sleep(60)"]
    )

    process = cli_process.start("background", "work")

    assert process.poll() is None
    process.kill()
    assert cli_process.wait(process, timeout=10).exit_code == -9


@pytest.mark.skipif(
    importlib.util.find_spec("migronaut.cli") is None, reason="migronaut.cli is not written yet"
)
def test_cli_and_cli_process_agree_on_version(cli: CliRunner, cli_process: CliProcess) -> None:
    in_process = cli("--version")
    subprocess_run = cli_process("--version")

    assert in_process.exit_code == subprocess_run.exit_code == 0
    assert in_process.stdout == subprocess_run.stdout != ""


# --------------------------------------------------------------------------- external tools


def test_a_missing_tool_skips_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_TOOLS_VARIABLE, raising=False)

    with pytest.raises(pytest.skip.Exception, match="needs 'no-such-tool-x' on PATH: get it"):
        require_tool("no-such-tool-x", "get it")


def test_a_missing_tool_fails_when_tools_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS_VARIABLE, "1")

    with pytest.raises(pytest.fail.Exception, match="needs 'no-such-tool-x' on PATH: get it"):
        require_tool("no-such-tool-x", "get it")


def test_the_require_tools_variable_survives_the_isolation(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS_VARIABLE, "1")  # as .ci/run exports it
    inner.makepyfile(
        f"""
        import os

        def test_sees_it():
            assert os.environ[{REQUIRE_TOOLS_VARIABLE!r}] == "1"
        """
    )

    inner.runpytest().assert_outcomes(passed=1)


@pytest.mark.parametrize("required", [False, True], ids=["skips", "fails-when-required"])
def test_a_failed_npm_install_reports_npm_s_message(
    required: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if required:
        monkeypatch.setenv(REQUIRE_TOOLS_VARIABLE, "1")
    else:
        monkeypatch.delenv(REQUIRE_TOOLS_VARIABLE, raising=False)
    require_tool("npm", NODE_HINT)  # this scenario needs npm itself
    # a registry that refuses connections (a closed port on this machine): npm fails at once
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    outcome = pytest.fail.Exception if required else pytest.skip.Exception

    with pytest.raises(outcome) as raised:
        ensure_node_clients(tmp_path / "cache")

    message = str(raised.value)
    assert "npm install mongodb@" in message and "failed (exit" in message
    assert "ECONNREFUSED" in message  # npm's own words
    assert not (tmp_path / "cache" / "installed.json").exists()  # the next run tries again
