"""The CLI's shape: version, help, parse errors, global flags anywhere, colour, the error envelope.

Pure presentation checks (colour decision, option merging, number parsing) run without a server;
the rest drive ``migronaut.cli.main`` in-process against the test database.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, write_simple
from migronaut import __version__
from migronaut.cli import main
from migronaut.cli.output import Output, Spinner, SpinnerProgress, colour_enabled
from migronaut.cli.session import GlobalOptions, parse_int
from migronaut.errors import ConfigInvalidError

ANSI = re.compile(r"\x1b\[")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def state(db: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The changelog and lock documents, to assert that a refused command wrote nothing."""
    return (
        list(db[CHANGELOG].find({}, {"_id": 0}).sort("name", 1)),
        list(db[LOCKS].find({})),
    )


# ------------------------------------------------------------------------- without a server


@pytest.mark.parametrize(
    ("environ", "tty", "expected"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"TERM": "dumb"}, True, False),
        ({"NO_COLOR": "1"}, True, False),
        ({"NO_COLOR": ""}, True, True),  # set but empty does not decide
        ({"FORCE_COLOR": "1"}, False, True),
        ({"FORCE_COLOR": "0"}, True, False),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, True),
        ({"MIGRONAUT_NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False),
        ({"MIGRONAUT_FORCE_COLOR": "1", "MIGRONAUT_NO_COLOR": "1"}, False, True),
        ({"MIGRONAUT_FORCE_COLOR": "0", "FORCE_COLOR": "1"}, True, False),
        ({"FORCE_COLOR": "1", "TERM": "dumb"}, False, True),
    ],
)
def test_colour_precedence(environ: dict[str, str], tty: bool, expected: bool) -> None:
    stream = FakeTTY() if tty else io.StringIO()
    assert colour_enabled(stream, environ=environ) is expected


def test_no_color_flag_beats_every_variable() -> None:
    environ = {"MIGRONAUT_FORCE_COLOR": "1", "FORCE_COLOR": "1"}
    assert colour_enabled(FakeTTY(), no_color_flag=True, environ=environ) is False


def test_options_after_the_command_override_the_ones_before() -> None:
    before = GlobalOptions(uri="mongodb://a", db="one", json=True)
    after = GlobalOptions(db="two", verbose=True)
    merged = before.merge(after)
    assert (merged.uri, merged.db) == ("mongodb://a", "two")
    assert merged.json and merged.verbose
    assert GlobalOptions(no_env=True, dir="m").config_flags() == {
        "migrations_dir": "m", "env_file": False
    }


@pytest.mark.parametrize("text", ["abc", "1.5", "", "0x10"])
def test_non_numbers_are_config_invalid(text: str) -> None:
    with pytest.raises(ConfigInvalidError, match="--steps must be a positive integer"):
        parse_int(text, "--steps")


def test_numbers_parse_and_range_is_left_to_the_engine() -> None:
    assert parse_int(" 3 ", "--steps") == 3
    assert parse_int("-1", "--steps") == -1
    assert parse_int(None, "--steps") is None


def test_spinner_draws_on_a_tty_and_log_lines_clear_it(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = FakeTTY()
    monkeypatch.setattr(sys, "stderr", stderr)
    output = Output(no_color_flag=True)
    output.spinner.enable()
    progress = SpinnerProgress(output.spinner)
    progress.on_start("0001_a.py", "up")
    time.sleep(0.2)
    output.warn("⚠ something")
    progress.on_stop("success")
    output.spinner.stop()
    text = stderr.getvalue()
    assert "Applying 0001_a.py…" in text
    # the warning starts on a cleared line, never spliced into a frame
    assert "\r\x1b[2K⚠ something\n" in text
    # and the spinner leaves no frame behind
    assert "Applying" not in text.rsplit("\r\x1b[2K", 1)[1]


def test_spinner_is_a_no_op_unless_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    spinner = Spinner(Output())
    spinner.show("Connecting to MongoDB…")
    spinner.stop()
    assert stderr.getvalue() == ""


def test_version_and_help_need_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert main(["-V"]) == 0
    assert main(["status", "--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"migronaut {__version__}\n" * 3
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    for name in ("init", "create", "up", "down", "redo", "status", "list", "dry-run", "lock",
                 "unlock", "dev-server", "--json", "--no-color", "--env-file"):
        assert name in help_text
    assert main(["down", "-h"]) == 0
    assert "--steps" in capsys.readouterr().out


def _loaded(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``code``."""
    probe = (f"{code}; import sys; "
             f"sys.stderr.write(repr([m for m in {modules!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    return ast.literal_eval(done.stderr)


def test_version_is_fast_and_does_not_import_pymongo() -> None:
    assert _loaded("from migronaut.cli import main; main(['--help'])",
                   ("pymongo", "migronaut.api", "rich")) == []


def test_importing_the_api_does_not_import_pymongo_or_converge() -> None:
    """``from migronaut import Migrator`` stays light: the driver and converge's machinery
    load when a command needs them (converge pulled pymongo in at import: 70 → 220 ms)."""
    assert _loaded("from migronaut import Migrator, AsyncMigrator; import migronaut.aio",
                   ("pymongo", "migronaut.commands.converge", "migronaut.declared.planner")) == []
    assert _loaded("import migronaut.api", ("migronaut.api",)) == ["migronaut.api"]  # can fail


# ---------------------------------------------------------------------------- parse errors


def test_unknown_command_exits_1_with_one_line(cli: Any) -> None:
    result = cli("frobnicate")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "✖ No such command 'frobnicate'. (see 'migronaut --help')"
    ]
    assert result.stdout == ""


def test_unknown_option_in_json_mode_is_still_one_json_document(cli: Any) -> None:
    result = cli("status", "--json", "--bogus")
    assert result.exit_code == 1
    assert result.json == {"error": {"message": "No such option '--bogus'. Did you mean "
                                                "'--verbose'?"}}
    assert "✖ No such option '--bogus'" in result.stderr


def test_missing_argument_is_a_parse_error(cli: Any) -> None:
    result = cli("create")
    assert result.exit_code == 1
    assert "Missing argument 'NAME'" in result.stderr


def test_no_command_shows_help_and_exits_1(cli: Any) -> None:
    result = cli()
    assert result.exit_code == 1
    assert "Usage: migronaut" in result.stderr
    assert "✖ missing command" in result.stderr


def test_verbose_and_quiet_together_are_refused(cli: Any) -> None:
    result = cli("--verbose", "status", "--quiet")
    assert result.exit_code == 6
    assert "✖ CONFIG_INVALID: --verbose and --quiet cannot be combined" in result.stderr


# ----------------------------------------------------------------- global flags, with a server


def test_global_flags_work_before_and_after_the_command(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    before = cli("--json", "status")
    after = cli("status", "--json")
    assert before.exit_code == after.exit_code == 0
    assert before.stdout == after.stdout
    assert [row["file"] for row in before.json] == ["0001_a.py"]


def test_uri_db_and_dir_flags_override_the_environment(
    cli: Any, project: Any, mongo_uri: str, db_name: str, client: Any
) -> None:
    other_dir = project.path / "elsewhere"
    other_dir.mkdir()
    (other_dir / "0001_other.py").write_text("def up(ctx): pass\ndef down(ctx): pass\n")
    other_db = db_name + "_x"
    try:
        result = cli(
            "up", "--json", "--dir", "elsewhere", "--db", other_db, "--uri", mongo_uri,
            env={"MIGRONAUT_URI": "mongodb://nowhere.invalid:1", "MIGRONAUT_DB": "wrong"},
        )
        assert result.exit_code == 0, result.stderr
        assert [r["file"] for r in result.json] == ["0001_other.py"]
        assert client[other_db][CHANGELOG].count_documents({"status": "applied"}) == 1
    finally:
        client.drop_database(other_db)


def test_env_file_and_no_env(cli: Any, project: Any, db_name: str) -> None:
    write_simple(project, "0001_a")
    project.write("custom.env", f"MIGRONAUT_DB={db_name}\n")
    # with the variable unset, the named .env file provides it
    loaded = cli("status", "--json", "--env-file", "custom.env", env={"MIGRONAUT_DB": None})
    assert loaded.exit_code == 0, loaded.stderr
    project.write(".env", f"MIGRONAUT_DB={db_name}\n")
    skipped = cli("status", "--json", "--no-env", env={"MIGRONAUT_DB": None})
    assert skipped.exit_code == 6
    assert skipped.json["error"]["code"] == "CONFIG_INVALID"
    assert "db_name is required" in skipped.json["error"]["message"]
    both = cli("status", "--env-file", "custom.env", "--no-env")
    assert both.exit_code == 6
    assert "--env-file and --no-env cannot be combined" in both.stderr


def test_config_flag_names_the_config_file(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    project.write("conf/seed.toml", 'migrations_collection = "_seeds"\n')
    result = cli("up", "--config", "conf/seed.toml", "--json")
    assert result.exit_code == 0, result.stderr
    assert [d["name"] for d in db["_seeds"].find()] == ["0001_a.py"]
    assert db[CHANGELOG].count_documents({}) == 0
    missing = cli("status", "--config", "nope.toml")
    assert missing.exit_code == 6
    assert "✖ CONFIG_INVALID: Config file not found: nope.toml" in missing.stderr


def test_no_color_and_no_color_variables_leave_no_ansi(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    forced = cli("status", env={"FORCE_COLOR": "1"})
    assert ANSI.search(forced.stdout)
    for args, env in (
        (("status", "--no-color"), {"FORCE_COLOR": "1"}),
        (("status",), {"NO_COLOR": "1"}),
        (("status",), {"MIGRONAUT_NO_COLOR": "1", "FORCE_COLOR": "1"}),
        (("status",), {}),  # not a TTY
    ):
        result = cli(*args, env=env)
        assert result.exit_code == 0
        assert not ANSI.search(result.stdout + result.stderr), (args, env)
        assert "0001_a.py" in result.stdout


def test_quiet_shows_errors_only_and_verbose_adds_debug(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    quiet = cli("up", "--quiet")
    assert quiet.exit_code == 0
    assert quiet.stdout == quiet.stderr == ""
    project.write_migration("0002_b", "def up(ctx):\n    raise ValueError('nope')\n"
                            "def down(ctx): pass\n")
    failed = cli("up", "--quiet")
    assert failed.exit_code == 7
    assert failed.stdout == ""
    assert "✖ MIGRATION_EXECUTION_FAILED:" in failed.stderr
    verbose = cli("status", "--verbose")
    assert "Connected to MongoDB" in verbose.stdout


def test_json_mode_sends_human_lines_to_stderr(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("up", "--json")
    assert result.exit_code == 0
    assert result.json == [{"file": "0001_a.py", "status": "applied", "duration": result.json[0][
        "duration"], "batch": 1}]
    assert "✔ Applied  0001_a.py" in result.stderr
    assert "✔ Done     1 applied" in result.stderr
    assert result.stdout.endswith("]\n") and result.stdout.startswith("[\n  {")


def test_connection_failure_exits_5_and_never_prints_the_password(cli: Any, db: Any) -> None:
    uri = "mongodb://alice:hunter2@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    for args in (("status",), ("status", "--json"), ("up", "--verbose")):
        result = cli(*args, "--uri", uri)
        assert result.exit_code == 5, result.stderr
        assert "hunter2" not in result.stdout + result.stderr
        assert "✖ CONNECTION_FAILED:" in result.stderr
    assert "caused by:" in result.stderr  # --verbose shows the wrapped cause, on stderr


def test_foreign_errors_exit_1_without_traceback(
    cli: Any, project: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from migronaut.api import Migrator

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Migrator, "status", broken)
    result = cli("status")
    assert result.exit_code == 1
    assert result.stderr.strip() == "✖ disk on fire"
    as_json = cli("status", "--json")
    assert as_json.json == {"error": {"message": "disk on fire"}}
    verbose = cli("status", "--verbose")
    assert "Traceback" in verbose.stdout + verbose.stderr


def test_closed_stdout_is_success(cli_process: Any, project: Any) -> None:
    # more than a pipe buffer of table, so the writer is still writing when the reader leaves
    for name in [f"{i:04d}_a_migration_with_a_long_descriptive_name" for i in range(1, 900)]:
        project.write_migration(name, "def up(ctx): pass\ndef down(ctx): pass\n")
    process = cli_process.start("status")
    assert process.stdout is not None
    process.stdout.readline()
    process.stdout.close()  # the consumer went away (`| head -1`)
    assert process.wait(timeout=60) == 0
    assert process.stderr is not None
    assert "Traceback" not in process.stderr.read()
