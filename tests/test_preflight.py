"""Pre-flight: every file a command will run is loaded and validated before the first one runs.

Also: a symlink that resolves outside the migrations directory is refused (``status`` and every
run), a migrations directory that does not exist is ``CONFIG_INVALID`` (never "Nothing to
migrate"), ``status`` keeps working with a broken file, and a failing migration's error points at
the file and line of the user's code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, applied, calls, make_migrator, records, write_simple

BROKEN_SYNTAX = "def up(ctx):\n    return (\n\ndef down(ctx):\n    pass\n"
NO_DOWN = "def up(ctx):\n    pass\n"


def untouched(db: Any) -> None:
    """Nothing was run or recorded, and the lock is free."""
    assert calls(db) == []
    assert db[CHANGELOG].count_documents({}) == 0
    assert db[LOCKS].count_documents({}) == 0


def one_error_line(stderr: str, code: str) -> str:
    """The one ``✖ CODE: message`` line (the engine's own ``✖ Error <file>`` lines aside)."""
    lines = [line for line in stderr.splitlines()
             if line.startswith("✖") and not line.startswith("✖ Error ")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"✖ {code}: "), stderr
    return lines[0]


# ------------------------------------------------------------------------------ pre-flight


@pytest.mark.parametrize(("body", "fragment"), [
    (BROKEN_SYNTAX, "SyntaxError"),
    (NO_DOWN, "must define up(ctx) and down(ctx)"),
])
def test_a_broken_third_file_refuses_the_run_before_the_first_is_applied(
    cli: Any, project: Any, db: Any, body: str, fragment: str
) -> None:
    write_simple(project, "0001_a", "0002_b")
    project.write_migration("0003_c", body)
    result = cli("up")
    assert result.exit_code == 20, result.stdout + result.stderr
    line = one_error_line(result.stderr, "MIGRATION_INVALID_EXPORT")
    assert "0003_c.py" in line and fragment in line
    untouched(db)

    as_json = cli("up", "--json")
    assert as_json.exit_code == 20
    assert as_json.json["error"]["code"] == "MIGRATION_INVALID_EXPORT"
    assert as_json.json.get("partial", []) == []
    untouched(db)


def test_api_up_and_run_migrations_refuse_before_any_hook_or_body(project: Any, db: Any) -> None:
    from migronaut import run_migrations
    from migronaut.errors import MigrationInvalidExportError

    write_simple(project, "0001_a")
    project.write_migration("0002_b", BROKEN_SYNTAX)
    seen: list[str] = []
    hooks = {"before_all": lambda ctx: seen.append("before_all")}
    with make_migrator(project, hooks=hooks) as migrator, \
            pytest.raises(MigrationInvalidExportError, match=r"0002_b\.py"):
        migrator.up()
    with pytest.raises(MigrationInvalidExportError):
        run_migrations(uri=project.uri, db_name=project.db_name, env_file=False,
                       cwd=project.path)
    assert seen == []
    untouched(db)


def test_down_loads_every_file_it_will_revert_before_reverting_any(
    cli: Any, cli_process: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    project.write_migration("0001_a", BROKEN_SYNTAX)  # reverted second: must stop the first
    before = records(db)
    result = cli_process("down")  # a fresh process: nothing cached from the `up`
    assert result.exit_code == 20, result.stderr
    assert "0001_a.py" in one_error_line(result.stderr, "MIGRATION_INVALID_EXPORT")
    assert calls(db, "down") == []
    assert records(db) == before
    assert applied(db) == ["0001_a.py", "0002_b.py"]


def test_a_missing_file_among_the_reverts_refuses_before_reverting_any(
    cli: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    (project.migrations / "0001_a.py").unlink()
    result = cli("down")
    assert result.exit_code == 8, result.stderr
    assert calls(db, "down") == []
    assert applied(db) == ["0001_a.py", "0002_b.py"]


def test_status_keeps_working_with_a_broken_file(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_b", BROKEN_SYNTAX)
    project.write_migration("0003_c", "raise SystemExit('imported by status')\n")
    result = cli("status", "--json")
    assert result.exit_code == 0, result.stderr
    assert [(row["file"], row["status"]) for row in result.json] == [
        ("0001_a.py", "pending"), ("0002_b.py", "pending"), ("0003_c.py", "pending")]


# --------------------------------------------------------------------------------- symlinks


@pytest.fixture
def escaping_link(project: Any, tmp_path: Path) -> Path:
    """``migrations/0002_b.py`` → a migration file outside the migrations directory."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / "0002_b.py"
    target.write_text("def up(ctx):\n    ctx.db.calls.insert_one({'m': 'outside'})\n\n"
                      "def down(ctx):\n    pass\n")
    link = project.migrations / "0002_b.py"
    os.symlink(target, link)
    return link


def test_a_symlink_resolving_outside_the_directory_is_refused_by_status_and_up(
    cli: Any, project: Any, db: Any, escaping_link: Path
) -> None:
    write_simple(project, "0001_a")
    for args in (("status",), ("up",), ("dry-run", "up"), ("up", "0002_b.py")):
        result = cli(*args)
        assert result.exit_code == 19, (args, result.stderr)
        line = one_error_line(result.stderr, "MIGRATION_INVALID_NAME")
        assert "0002_b.py" in line and "outside the migrations directory" in line
        as_json = cli(*args, "--json")
        assert as_json.exit_code == 19
        assert as_json.json["error"]["code"] == "MIGRATION_INVALID_NAME"
    untouched(db)


def test_a_symlink_inside_the_directory_is_a_migration(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    os.symlink(project.migrations / "0001_a.py", project.migrations / "0002_alias.py")
    result = cli("status", "--json")
    assert result.exit_code == 0, result.stderr
    assert [row["file"] for row in result.json] == ["0001_a.py", "0002_alias.py"]


# ----------------------------------------------------------------------- the directory itself


@pytest.mark.parametrize("command", [("status",), ("up",), ("list",), ("dry-run", "up"),
                                     ("baseline", "--yes"), ("import",)])
def test_a_migrations_dir_that_does_not_exist_is_config_invalid(
    cli: Any, project: Any, db: Any, command: tuple[str, ...]
) -> None:
    result = cli(*command, "--dir", "migratoins")
    assert result.exit_code == 6, result.stdout + result.stderr
    line = one_error_line(result.stderr, "CONFIG_INVALID")
    assert "migrations_dir" in line and "migratoins" in line and "does not exist" in line
    assert "the --dir flag" in line
    assert "Nothing to migrate" not in result.stdout + result.stderr
    as_json = cli(*command, "--dir", "migratoins", "--json")
    assert as_json.exit_code == 6
    assert as_json.json["error"]["code"] == "CONFIG_INVALID"
    untouched(db)


def test_the_error_names_the_setting_that_chose_the_directory(cli: Any, project: Any) -> None:
    from_env = cli("status", env={"MIGRONAUT_MIGRATIONS_DIR": "nope"})
    assert from_env.exit_code == 6
    assert "the MIGRONAUT_MIGRATIONS_DIR environment variable" in from_env.stderr
    project.write("migronaut.toml", 'migrations_dir = "db/migrations"\n')
    from_file = cli("status")
    assert from_file.exit_code == 6
    assert "migronaut.toml" in from_file.stderr and "db/migrations" in from_file.stderr


def test_a_migrations_dir_that_is_a_file_is_config_invalid(cli: Any, project: Any) -> None:
    project.write("not-a-dir.txt", "x")
    result = cli("status", "--dir", "not-a-dir.txt")
    assert result.exit_code == 6
    assert "is not a directory" in one_error_line(result.stderr, "CONFIG_INVALID")


def test_the_api_refuses_a_missing_directory_too(project: Any) -> None:
    from migronaut.errors import ConfigInvalidError

    with make_migrator(project, migrations_dir="does-not-exist") as migrator:
        with pytest.raises(ConfigInvalidError, match="the migrations_dir argument"):
            migrator.up()
        with pytest.raises(ConfigInvalidError, match="does not exist"):
            migrator.status()


# ------------------------------------------------------------------ where a migration failed


def test_a_failing_migration_names_its_file_and_line_and_the_verbose_flag(
    cli: Any, project: Any, db: Any
) -> None:
    project.write_migration("0001_a", (
        '"""Fails on line 6."""\n'
        "\n"
        "def helper():\n"
        "    return {}\n"
        "\n"
        "def up(ctx):\n"
        "    ctx.db.calls.insert_one({'m': 'a'})\n"
        "    return helper()['missing']\n"
        "\n"
        "def down(ctx):\n"
        "    pass\n"
    ))
    result = cli("up")
    assert result.exit_code == 7
    line = one_error_line(result.stderr, "MIGRATION_EXECUTION_FAILED")
    assert "0001_a.py, line 8" in line and "KeyError" in line
    assert line.endswith("(--verbose shows the traceback)")
    assert "Traceback" not in result.stderr

    verbose = cli("up", "--verbose")
    assert verbose.exit_code == 7
    assert "--verbose shows" not in verbose.stderr
    assert "Traceback" in verbose.stderr and "0001_a.py\", line 8" in verbose.stderr

    as_json = cli("up", "--json")
    error = as_json.json["error"]
    assert error["context"]["line"] == 8
    assert error["context"]["file"].endswith("0001_a.py")
    assert json.loads(as_json.stdout) == as_json.json
    assert records(db)["0001_a.py"]["status"] == "failed"
    assert "line 8" in records(db)["0001_a.py"]["error"]


def test_a_missing_default_directory_says_how_to_choose_one(cli: Any, project: Any) -> None:
    project.migrations.rmdir()
    result = cli("up")
    assert result.exit_code == 6
    line = one_error_line(result.stderr, "CONFIG_INVALID")
    directory = project.migrations.resolve()
    assert line.endswith(f"migrations does not exist (the default) — create it: `migronaut create "
                         f"NAME` writes the first migration there, or `mkdir -p {directory}`; or "
                         "set --dir, MIGRONAUT_MIGRATIONS_DIR or migrations_dir")
    created = cli("create", "first")  # create makes the directory
    assert created.exit_code == 0 and cli("status").exit_code == 0
