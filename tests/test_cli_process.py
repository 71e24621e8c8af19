"""The CLI as a real process: graceful SIGINT/SIGTERM during a run, and ``dev-server``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from pymongo import MongoClient

from helpers.engine import LOCKS, applied, hold_lock, records, wait_until, write_simple
from helpers.markers import needs_embedded

SLOW = '''"""Takes two seconds, marking its start and its end."""

import time


def up(ctx):
    ctx.db["progress"].insert_one({"at": "start"})
    time.sleep(2)
    ctx.db["progress"].insert_one({"at": "end"})


def down(ctx):
    pass
'''

STOP_LINE = (
    "⚠ {sig} received — finishing the current migration, then stopping. "
    "Press again to exit immediately."
)

def started(db: Any) -> Any:
    return db["progress"].find_one({"at": "start"})


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_first_signal_finishes_the_migration_then_stops(
    cli_process: Any, project: Any, db: Any, sig: signal.Signals
) -> None:
    project.write_migration("0001_slow", SLOW)
    write_simple(project, "0002_b", "0003_c")
    process = cli_process.start("up", "--json")
    wait_until(lambda: started(db), timeout=60, what="the slow migration to start")
    process.send_signal(sig)
    result = cli_process.wait(process)

    assert result.exit_code == 11, result.stderr
    assert STOP_LINE.format(sig=sig.name) in result.stderr
    assert result.json["error"]["code"] == "RUN_ABORTED"
    assert result.json["error"]["message"] == f"Received {sig.name}"
    assert [(r["file"], r["status"]) for r in result.json["partial"]] == [
        ("0001_slow.py", "applied")
    ]
    # the migration in flight finished and was recorded; the rest was skipped
    assert db["progress"].count_documents({"at": "end"}) == 1
    assert applied(db) == ["0001_slow.py"]
    assert set(records(db)) == {"0001_slow.py"}
    assert db[LOCKS].count_documents({}) == 0  # released


@pytest.mark.slow
def test_second_sigint_exits_130_immediately(cli_process: Any, project: Any, db: Any) -> None:
    project.write_migration("0001_slow", SLOW)
    process = cli_process.start("up")
    wait_until(lambda: started(db), timeout=60, what="the slow migration to start")
    process.send_signal(signal.SIGINT)
    assert process.stderr is not None
    assert process.stderr.readline().strip() == STOP_LINE.format(sig="SIGINT")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    assert db["progress"].count_documents({"at": "end"}) == 0  # did not wait for the body


@pytest.mark.slow
def test_second_sigterm_exits_143(cli_process: Any, project: Any, db: Any) -> None:
    project.write_migration("0001_slow", SLOW)
    process = cli_process.start("up")
    wait_until(lambda: started(db), timeout=60, what="the slow migration to start")
    process.send_signal(signal.SIGTERM)
    assert process.stderr is not None
    assert process.stderr.readline().strip() == STOP_LINE.format(sig="SIGTERM")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 143


@pytest.mark.slow
def test_ctrl_c_at_the_unlock_prompt_aborts_and_keeps_the_lock(
    cli_process: Any, project: Any, db: Any
) -> None:
    hold_lock(db)
    process = subprocess.Popen(
        cli_process.argv("unlock", "--force"), cwd=project.path, env=project.env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        seen = b""
        deadline = time.monotonic() + 60
        while b"Force-release this lock? [y/N] " not in seen:
            assert time.monotonic() < deadline, seen
            chunk = os.read(process.stderr.fileno(), 1024)
            assert chunk, seen
            seen += chunk
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert db[LOCKS].count_documents({}) == 1


def test_a_signal_during_config_load_aborts_before_any_migration(
    cli: Any, project: Any, db: Any
) -> None:
    """Latched: the stop applies when the run reaches its lock (in-process, main thread)."""
    project.write(
        "migronaut_config.py",
        """
        import signal
        import time

        def config():
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.3)
            return {}
        """,
    )
    write_simple(project, "0001_a")
    previous = signal.getsignal(signal.SIGINT)
    result = cli("up", "--json")
    assert signal.getsignal(signal.SIGINT) is previous  # handlers restored
    assert result.exit_code == 11, result.stderr
    assert result.json["error"]["code"] == "RUN_ABORTED"
    assert result.json["partial"] == []
    assert applied(db) == []
    assert db[LOCKS].count_documents({}) == 0


# ---------------------------------------------------------------------------------- dev-server


def connect(uri: str) -> MongoClient[dict[str, Any]]:
    return MongoClient(uri, serverSelectionTimeoutMS=10_000)


def read_uri(process: Any) -> str:
    assert process.stdout is not None
    line: str = process.stdout.readline()
    assert line, "dev-server printed nothing"
    return line.strip()


@pytest.mark.slow
@needs_embedded
def test_dev_server_prints_one_uri_line_and_stops_on_sigint(cli_process: Any) -> None:
    process = cli_process.start("dev-server", "--port", "0")
    uri = read_uri(process)
    assert uri.startswith("mongodb://127.0.0.1:") and "directConnection=true" in uri
    with connect(uri) as client:
        assert client.admin.command("ping")["ok"] == 1
    process.send_signal(signal.SIGINT)
    result = cli_process.wait(process, timeout=30)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""  # nothing after the URI line
    assert "Dev server ready (in memory)" in result.stderr


@pytest.mark.slow
@needs_embedded
def test_dev_server_redacts_the_password_and_stops_on_sigterm(
    cli_process: Any, tmp_path: Any
) -> None:
    data = tmp_path / "dev.sqlite"
    process = cli_process.start(
        "dev-server", "--port", "0", "--auth", "dev:pa55word", "--path", str(data), "--json"
    )
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "}":
        line = process.stdout.readline()
        assert line, "dev-server ended before its JSON document"
        lines.append(line.rstrip("\n"))
    uri = json.loads("\n".join(lines))["uri"]
    assert uri.startswith("mongodb://dev:****@127.0.0.1:")
    real = uri.replace("dev:****@", "dev:pa55word@")
    with connect(real) as client:
        client["x"]["y"].insert_one({"ok": 1})
    process.send_signal(signal.SIGTERM)
    result = cli_process.wait(process, timeout=30)
    assert result.exit_code == 0, result.stderr
    assert "pa55word" not in result.stdout + result.stderr
    assert data.exists()


@pytest.mark.slow
@needs_embedded
def test_dev_server_sharded_answers_like_a_mongos(cli_process: Any) -> None:
    process = cli_process.start("dev-server", "--port", "0", "--sharded")
    uri = read_uri(process)
    with connect(uri) as client:
        hello = client.admin.command("hello")
        assert hello["msg"] == "isdbgrid" and "setName" not in hello
    process.send_signal(signal.SIGTERM)
    assert cli_process.wait(process, timeout=30).exit_code == 0


def test_dev_server_without_the_extra_exits_6(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("mongoeco", "mongoeco.engines", "mongoeco.wire"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import mongoeco` fail
    result = cli("dev-server")
    assert result.exit_code == 6
    assert "✖ CONFIG_INVALID:" in result.stderr
    assert "pip install 'migronaut[embedded]'" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--port", "abc"), "--port must be a positive integer (got 'abc')"),
        (("--port", "70000"), "--port must be between 0 and 65535 (got '70000')"),
        (("--auth", "nopassword"), "--auth must be 'user:password'"),
        (("--standalone", "--sharded"), "--standalone and --sharded exclude each other"),
        (("--search-lag", "soon"), "--search-lag must be a number of seconds (got 'soon')"),
        (("--search-lag", "-1"), "--search-lag must be between 0 and 3600 seconds (got -1.0)"),
    ],
)
def test_dev_server_bad_flags_exit_6(cli: Any, args: tuple[str, ...], message: str) -> None:
    result = cli("dev-server", *args, "--json")
    assert result.exit_code == 6
    assert message in result.json["error"]["message"]
    assert result.json["error"]["code"] == "CONFIG_INVALID"
