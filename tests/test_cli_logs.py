"""``migronaut logs`` and ``--log-format json`` through the CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.engine import CHANGELOG, write_simple

RUNS = "_migronaut_runs"

CHATTY = """
def up(ctx):
    ctx.logger.info("copied %d users", 3, extra={"userland": True, "count": 3})
    ctx.logger.warning("slow: mongodb://admin:S3cretPw@db.example/app")
    ctx.logger.debug("only under --verbose")

def down(ctx):
    pass
"""


def test_logs_with_no_runs(cli: Any, project: Any) -> None:
    result = cli("logs")
    assert (result.exit_code, result.stdout.strip()) == (0, "No runs recorded"), result.stderr
    assert cli("logs", "--json").json == []
    last = cli("logs", "--last", "--json")
    assert last.exit_code == 0 and last.json == {"run": None, "lines": []}


def test_logs_lists_recent_runs(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up", "--reason", "OPS-7 backfill", "--requested-by", "alice").exit_code == 0
    assert cli("down").exit_code == 0
    result = cli("logs")
    assert result.exit_code == 0, result.stderr
    header, *rows = [ln for ln in result.stdout.splitlines() if "│" in ln]
    for column in ("Run", "Command", "Outcome", "By", "Reason", "Started", "Duration",
                   "Applied", "Reverted"):
        assert column in header
    assert len(rows) == 2
    down_row, up_row = rows  # newest first
    assert "down" in down_row and "success" in down_row
    assert "alice" in up_row and "OPS-7 backfill" in up_row
    listed = cli("logs", "--json").json
    assert [r["command"] for r in listed] == ["down", "up"]
    up_run = listed[1]
    assert up_run["runId"] == db[CHANGELOG].find_one({"name": "0001_a.py"})["runId"]
    assert (up_run["outcome"], up_run["requestedBy"], up_run["reason"]) == (
        "success", "alice", "OPS-7 backfill")
    assert up_run["applied"] == ["0001_a.py", "0002_b.py"]
    assert up_run["startedAt"].endswith("Z")
    assert [r["command"] for r in cli("logs", "--limit", "1", "--json").json] == ["down"]


def test_logs_of_one_run_shows_its_record_and_lines(cli: Any, project: Any, db: Any) -> None:
    project.write_migration("0001_chatty", CHATTY)
    write_simple(project, "0002_b")
    assert cli("up", "--reason", "release 4.2").exit_code == 0
    run_id = db[RUNS].find_one()["_id"]
    result = cli("logs", "--last")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert run_id in out and "release 4.2" in out and "success" in out
    assert "0001_chatty.py, 0002_b.py" in out
    assert "copied 3 users" in out and '{"count": 3}' in out
    assert "admin:****@db.example" in out and "S3cretPw" not in out
    assert "only under --verbose" not in out
    document = cli("logs", run_id[:8], "--json").json
    assert document["run"]["runId"] == run_id
    assert [(ln["seq"], ln["level"], ln["msg"]) for ln in document["lines"]] == [
        (1, "info", "copied 3 users"),
        (2, "warning", "slow: mongodb://admin:****@db.example/app"),
    ]
    assert document["lines"][0]["at"].endswith("Z")
    warnings = cli("logs", run_id, "--level", "WARNING", "--json").json["lines"]
    assert [ln["seq"] for ln in warnings] == [2]
    other = cli("logs", "--last", "--migration", "0002_b.py", "--json").json
    assert other["lines"] == []


def test_verbose_runs_keep_their_debug_lines(cli: Any, project: Any) -> None:
    project.write_migration("0001_chatty", CHATTY)
    assert cli("up", "--verbose").exit_code == 0
    lines = cli("logs", "--last", "--json").json["lines"]
    assert [ln["level"] for ln in lines] == ["info", "warning", "debug"]


def test_logs_shows_a_failed_run(cli: Any, project: Any) -> None:
    project.write_migration(
        "0001_fail",
        "def up(ctx):\n    raise ValueError('bad row at mongodb://u:Leak9@h')\n\n"
        "def down(ctx):\n    pass\n",
    )
    assert cli("up").exit_code == 7
    result = cli("logs", "--last")
    assert "failed — MIGRATION_EXECUTION_FAILED" in result.stdout
    assert "Leak9" not in result.stdout
    assert cli("logs", "--last", "--json").json["run"]["error"]["code"] == \
        "MIGRATION_EXECUTION_FAILED"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("logs", "no-such-run"), "No recorded run with id 'no-such-run'"),
        (("logs", "abc", "--last"), "RUN_ID and --last cannot be combined"),
        (("logs", "--level", "warning"), "--level needs a run: pass RUN_ID or --last"),
        (("logs", "--migration", "x.py"), "--migration needs a run: pass RUN_ID or --last"),
        (("logs", "--last", "--level", "loud"), "level must be one of debug, info, warning"),
        (("logs", "--last", "--limit", "3"), "--limit lists runs"),
        (("logs", "--limit", "0"), "--limit must be a positive integer"),
        (("logs", "--limit", "many"), "--limit must be a positive integer"),
    ],
)
def test_logs_bad_input(cli: Any, project: Any, args: tuple[str, ...], message: str) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    result = cli(*args, "--json")
    assert result.exit_code == 6, result.stderr
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert message in result.json["error"]["message"]
    assert f"✖ CONFIG_INVALID: {message}" in result.stderr


def test_an_ambiguous_prefix_is_refused(cli: Any, project: Any, db: Any) -> None:
    for run_id in ("abc-1", "abc-2"):
        db[RUNS].insert_one({"_id": run_id, "command": "up", "outcome": "success"})
    result = cli("logs", "abc", "--json")
    assert result.exit_code == 6
    assert "ambiguous" in result.json["error"]["message"]
    assert sorted(result.json["error"]["context"]["matches"]) == ["abc-1", "abc-2"]


def test_a_run_whose_process_died_shows_as_interrupted(cli: Any, project: Any, db: Any) -> None:
    db[RUNS].insert_one({"_id": "dead-run", "command": "up", "outcome": "running",
                         "locked": True})
    db[RUNS].insert_one({"_id": "unlocked-run", "command": "up", "outcome": "running",
                         "locked": False})
    outcomes = {r["runId"]: r["outcome"] for r in cli("logs", "--json").json}
    assert outcomes == {"dead-run": "interrupted", "unlocked-run": "running"}


# ---------------------------------------------------------------------------- --requested-by


def test_requested_by_flag_is_validated_before_connecting(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("up", "--requested-by", "x" * 129, "--json")
    assert result.exit_code == 6
    assert "requested_by must be a non-empty string of at most 128" in \
        result.json["error"]["message"]


def test_requested_by_from_the_environment_in_the_cli(
    cli: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    assert cli("up", env={"MIGRONAUT_REQUESTED_BY": "deploy-bot", "GITHUB_ACTOR": "gh"}
               ).exit_code == 0
    run = cli("logs", "--last", "--json").json["run"]
    assert (run["requestedBy"], run["requestedBySource"]) == ("deploy-bot",
                                                             "MIGRONAUT_REQUESTED_BY")


# ----------------------------------------------------------------------------- --log-format


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_log_format_json_writes_one_object_per_line_on_stderr(
    cli: Any, project: Any, db: Any
) -> None:
    project.write_migration("0001_chatty", CHATTY)
    result = cli("up", "--log-format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    lines = json_lines(result.stderr)
    run_id = db[RUNS].find_one()["_id"]
    for line in lines:
        assert {"timestamp", "level", "logger", "msg"} <= set(line)
    by_msg = {line["msg"]: line for line in lines}
    applied = next(ln for ln in lines if ln["msg"].startswith("✔ Applied  0001_chatty.py"))
    assert (applied["runId"], applied["migration"], applied["level"]) == (
        run_id, "0001_chatty.py", "info")
    copied = by_msg["copied 3 users"]
    assert (copied["count"], copied["userland"], copied["runId"]) == (3, True, run_id)
    assert "S3cretPw" not in result.stderr
    assert by_msg["slow: mongodb://admin:****@db.example/app"]["level"] == "warning"


def test_log_format_json_with_json_output_keeps_stdout_one_document(
    cli: Any, project: Any
) -> None:
    write_simple(project, "0001_a")
    result = cli("--log-format", "json", "up", "--json")
    assert result.exit_code == 0
    assert [row["file"] for row in result.json] == ["0001_a.py"]
    assert all(line["logger"].startswith("migronaut") for line in json_lines(result.stderr))


def test_log_format_json_errors_are_json_lines_too(cli: Any, project: Any) -> None:
    project.write_migration(
        "0001_fail", "def up(ctx):\n    raise ValueError('boom')\n\ndef down(ctx):\n    pass\n"
    )
    result = cli("up", "--log-format", "json")
    assert result.exit_code == 7
    errors = [ln for ln in json_lines(result.stderr) if ln["level"] == "error"]
    assert any(ln["msg"].startswith("✖ MIGRATION_EXECUTION_FAILED") for ln in errors)


@pytest.mark.parametrize("source", ["env", "file"])
def test_log_format_from_the_environment_or_the_config_file(
    cli: Any, project: Any, source: str
) -> None:
    write_simple(project, "0001_a")
    env = {"MIGRONAUT_LOG_FORMAT": "json"} if source == "env" else {}
    if source == "file":
        project.write("migronaut.toml", 'log_format = "json"\n')
    result = cli("up", env=env)
    assert result.exit_code == 0 and result.stdout == ""
    assert any(ln["msg"].startswith("✔ Applied") for ln in json_lines(result.stderr))
    # the flag beats both
    write_simple(project, "0002_b")
    text = cli("up", "--log-format", "text", env=env)
    assert text.stdout.startswith("✔ Applied  0002_b.py")


def test_tables_stay_on_stdout_with_json_logs(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("status", "--log-format", "json")
    assert result.exit_code == 0
    assert "0001_a.py" in result.stdout and "│" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "env", "file", "message"),
    [
        (("--log-format", "xml"), {}, None, "--log-format must be 'text' or 'json' (got 'xml')"),
        ((), {"MIGRONAUT_LOG_FORMAT": "xml"}, None, "MIGRONAUT_LOG_FORMAT: must be one of"),
        ((), {"MIGRONAUT_RECORD_RUNS": "maybe"}, None, "MIGRONAUT_RECORD_RUNS: must be a boolean"),
        ((), {"MIGRONAUT_RUNS_COLLECTION": "system.runs"}, None,
         "MIGRONAUT_RUNS_COLLECTION: must be a valid collection name"),
        ((), {}, 'record_runs = "yes"\n', "record_runs (migronaut.toml): must be a boolean"),
        ((), {}, 'runs_collection = "a$b"\n', "runs_collection (migronaut.toml): must be a valid"),
        ((), {}, 'log_format = "yaml"\n', "log_format (migronaut.toml): must be one of"),
    ],
)
def test_bad_observability_settings_exit_6_and_change_nothing(
    cli: Any, project: Any, db: Any, args: tuple[str, ...], env: dict[str, str],
    file: str | None, message: str,
) -> None:
    write_simple(project, "0001_a")
    if file is not None:
        project.write("migronaut.toml", file)
    result = cli("up", "--json", *args, env=env)
    assert result.exit_code == 6, result.stderr
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert message in result.json["error"]["message"]
    assert db[CHANGELOG].count_documents({}) == 0
    assert db[RUNS].count_documents({}) == 0


SLOW = """
import time

def up(ctx):
    ctx.db["progress"].insert_one({"at": "start"})
    time.sleep(1)
    ctx.logger.info("finished after the signal")

def down(ctx):
    pass
"""


@pytest.mark.slow
def test_a_run_stopped_by_sigint_is_recorded_as_stopped(
    cli_process: Any, project: Any, db: Any
) -> None:
    import signal

    from helpers.engine import wait_until

    project.write_migration("0001_slow", SLOW)
    write_simple(project, "0002_b")
    process = cli_process.start("up", "--reason", "hotfix")
    wait_until(lambda: db["progress"].find_one(), timeout=60, what="the migration to start")
    process.send_signal(signal.SIGINT)
    assert cli_process.wait(process).exit_code == 11
    shown = cli_process("logs", "--last", "--json").json
    run = shown["run"]
    assert (run["outcome"], run["reason"], run["applied"]) == ("stopped", "hotfix",
                                                               ["0001_slow.py"])
    assert run["error"] == {"code": "RUN_ABORTED", "message": "Received SIGINT"}
    assert [ln["msg"] for ln in shown["lines"]] == ["finished after the signal"]
