"""``migronaut up``, ``down`` and ``redo`` through the CLI: selectors, prompts, errors, JSON."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, applied, calls, hold_lock, records, write_simple

FAILING = "def up(ctx):\n    raise ValueError('boom')\n\ndef down(ctx):\n    pass\n"


def snapshot(db: Any) -> tuple[Any, ...]:
    """Everything a refused command must leave alone: changelog, lock, migration side effects."""
    return (
        list(db[CHANGELOG].find({}, {"_id": 0}).sort("name", 1)),
        list(db[LOCKS].find({})),
        calls(db),
    )


# ----------------------------------------------------------------------------------------- up


def test_up_applies_in_order_with_human_lines(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    result = cli("up")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("✔ Applied  0001_a.py   [") and lines[0].endswith("ms]")
    assert lines[1].startswith("✔ Applied  0002_b.py   [")
    assert lines[2].startswith("✔ Done     2 applied in ")
    assert result.stderr == ""
    assert calls(db, "up") == ["0001_a", "0002_b"]
    assert {r["batch"] for r in records(db).values()} == {1}
    assert db[LOCKS].count_documents({}) == 0

    again = cli("up", "--json")
    assert again.exit_code == 0
    assert again.json == []
    assert "Nothing to migrate" in again.stderr


def test_up_json_results(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("up", "--json")
    assert result.exit_code == 0
    (row,) = result.json
    assert row["file"] == "0001_a.py" and row["status"] == "applied" and row["batch"] == 1
    assert isinstance(row["duration"], int)


def test_up_to_is_inclusive_and_a_file_runs_alone(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c", "0004_d")
    assert cli("up", "--to", "0002_b.py").exit_code == 0
    assert applied(db) == ["0001_a.py", "0002_b.py"]
    assert cli("up", "0004_d.py").exit_code == 0
    assert applied(db) == ["0001_a.py", "0002_b.py", "0004_d.py"]


def test_up_step_gives_each_migration_its_own_batch(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up", "--step").exit_code == 0
    assert {n: r["batch"] for n, r in records(db).items()} == {"0001_a.py": 1, "0002_b.py": 2}


def test_up_reason_is_recorded(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up", "--reason", "ticket OPS-7").exit_code == 0
    assert records(db)["0001_a.py"]["reason"] == "ticket OPS-7"


def test_up_strict_refuses_drift_with_exit_4(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    path = project.migrations / "0001_a.py"
    path.write_text(path.read_text() + "\n# edited after it ran\n")
    write_simple(project, "0002_b")
    before = snapshot(db)
    result = cli("up", "--strict", "--json")
    assert result.exit_code == 4
    assert result.json["error"]["code"] == "CHECKSUM_MISMATCH"
    assert result.json["error"]["context"]["name"] == "0001_a.py"
    assert result.json["partial"] == []
    assert snapshot(db) == before


def test_failed_migration_exits_7_with_partial_results(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_broken", FAILING)
    write_simple(project, "0003_c")
    result = cli("up", "--json")
    assert result.exit_code == 7
    error = result.json["error"]
    assert error["code"] == "MIGRATION_EXECUTION_FAILED"
    assert "results" not in error.get("context", {})
    assert [(r["file"], r["status"]) for r in result.json["partial"]] == [
        ("0001_a.py", "applied"), ("0002_broken.py", "error")
    ]
    assert "✖ MIGRATION_EXECUTION_FAILED:" in result.stderr
    assert "Traceback" not in result.stderr
    assert records(db)["0002_broken.py"]["status"] == "failed"
    assert "0003_c.py" not in records(db)
    assert db[LOCKS].count_documents({}) == 0

    human = cli("up")
    assert human.exit_code == 7
    assert "✖ Error    0002_broken.py" in human.stderr
    assert "✖ MIGRATION_EXECUTION_FAILED:" in human.stderr


def test_up_with_a_held_lock_exits_3_and_leaves_it(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    before = snapshot(db)
    result = cli("up", "--json")
    assert result.exit_code == 3
    assert result.json["error"]["code"] == "LOCK_ALREADY_HELD"
    assert result.json["error"]["context"]["holder"]["host"] == "other-host"
    assert snapshot(db) == before

    unlocked = cli("up", "--no-lock")
    assert unlocked.exit_code == 0
    assert "⚠ Running without a lock (--no-lock)" in unlocked.stderr
    assert applied(db) == ["0001_a.py"]


@pytest.mark.parametrize(
    ("args", "code", "exit_code", "message"),
    [
        (("up", "../etc/passwd"), "MIGRATION_INVALID_NAME", 19, "must be a bare filename"),
        (("up", "--to", "../x.py"), "MIGRATION_INVALID_NAME", 19, "must be a bare filename"),
        (("up", "0009_missing.py"), "MIGRATION_FILE_NOT_FOUND", 8,
         "Migration file not found: 0009_missing.py"),
        (("up", "--to", "0009_missing.py"), "MIGRATION_FILE_NOT_FOUND", 8,
         "Migration file not found: 0009_missing.py"),
        (("up", "0001_a.py", "--to", "0001_a.py"), "CONFIG_INVALID", 6,
         "--to cannot be combined with a migration file"),
        (("up", "--force"), "CONFIG_INVALID", 6, "--force requires a specific migration file"),
        (("up", "--force", "--yes"), "CONFIG_INVALID", 6,
         "--force requires a specific migration file"),
        (("up", "0001_a.py", "--force", "--json"), "CONFIG_INVALID", 6,
         "--json is non-interactive: pass --yes"),
        (("up", "--reason", ""), "CONFIG_INVALID", 6, "reason must be a non-empty string"),
    ],
)
def test_up_bad_input(
    cli: Any, project: Any, db: Any, args: tuple[str, ...], code: str, exit_code: int,
    message: str,
) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    write_simple(project, "0002_b")
    before = snapshot(db)
    for mode in ((), ("--json",)):
        result = cli(*args, *mode)
        assert result.exit_code == exit_code, result.stderr
        assert f"✖ {code}: " in result.stderr and message in result.stderr
        if "--json" in (*args, *mode):
            assert result.json["error"]["code"] == code
            assert message in result.json["error"]["message"]
        else:
            assert result.stdout == ""
    assert snapshot(db) == before


def test_force_prompt_with_closed_stdin_exits_6(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    before = snapshot(db)
    result = cli("up", "0001_a.py", "--force")  # stdin is empty: EOF
    assert result.exit_code == 6
    assert 'are you sure you want to re-run "0001_a.py"? [y/N] ' in result.stderr
    assert ("✖ CONFIG_INVALID: stdin closed before the confirmation was answered — pass --yes"
            in result.stderr)
    assert snapshot(db) == before


@pytest.mark.parametrize("answer", ["n\n", "\n", "nope\n", "yess\n"])
def test_force_prompt_declined_changes_nothing(
    cli: Any, project: Any, db: Any, answer: str
) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    before = snapshot(db)
    result = cli("up", "0001_a.py", "--force", input=answer)
    assert result.exit_code == 0
    assert result.stdout == "Aborted\n"
    assert snapshot(db) == before


@pytest.mark.parametrize("answer", ["y\n", "YES\n", "  Yes  \n"])
def test_force_prompt_accepted_reruns(cli: Any, project: Any, db: Any, answer: str) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    result = cli("up", "0001_a.py", "--force", input=answer)
    assert result.exit_code == 0, result.stderr
    assert "⚠ Forcing   re-run of already-applied 0001_a.py" in result.stderr
    assert calls(db, "up") == ["0001_a", "0001_a"]
    assert records(db)["0001_a.py"]["batch"] == 2


def test_force_with_yes_needs_no_prompt(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    result = cli("up", "0001_a.py", "-f", "-y", "--json")
    assert result.exit_code == 0
    assert [r["status"] for r in result.json] == ["applied"]
    assert "are you sure" not in result.stderr
    assert calls(db, "up") == ["0001_a", "0001_a"]


# --------------------------------------------------------------------------------------- down


def applied_in_batches(cli: Any, project: Any) -> None:
    """0001+0002 in batch 1, 0003+0004 in batch 2."""
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    write_simple(project, "0003_c", "0004_d")
    assert cli("up").exit_code == 0


def test_down_reverts_the_last_batch(cli: Any, project: Any, db: Any) -> None:
    applied_in_batches(cli, project)
    result = cli("down")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("↩ Reverted 0004_d.py   [")
    assert lines[1].startswith("↩ Reverted 0003_c.py   [")
    assert lines[2].startswith("✔ Done     2 reverted in ")
    assert applied(db) == ["0001_a.py", "0002_b.py"]
    assert records(db)["0004_d.py"]["status"] == "reverted"  # never deleted


@pytest.mark.parametrize(
    ("args", "reverted"),
    [
        (("--steps", "1"), ["0004_d.py"]),
        (("--steps", "3"), ["0004_d.py", "0003_c.py", "0002_b.py"]),
        (("--batch", "1"), ["0002_b.py", "0001_a.py"]),
        (("--to", "0002_b.py"), ["0004_d.py", "0003_c.py"]),
        (("0002_b.py",), ["0002_b.py"]),
    ],
)
def test_down_selectors(
    cli: Any, project: Any, db: Any, args: tuple[str, ...], reverted: list[str]
) -> None:
    applied_in_batches(cli, project)
    result = cli("down", *args, "--json")
    assert result.exit_code == 0, result.stderr
    assert [(r["file"], r["status"]) for r in result.json] == [(n, "reverted") for n in reverted]
    assert set(applied(db)) == {"0001_a.py", "0002_b.py", "0003_c.py", "0004_d.py"} - set(
        reverted
    )


def test_down_with_nothing_applied(cli: Any, project: Any) -> None:
    result = cli("down")
    assert result.exit_code == 0
    assert result.stdout == "Nothing to rollback\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--steps", "-1"), "--steps must be a positive integer (got -1)"),
        (("--steps", "0"), "--steps must be a positive integer (got 0)"),
        (("--steps", "abc"), "--steps must be a positive integer (got 'abc')"),
        (("--batch", "abc"), "--batch must be a positive integer (got 'abc')"),
        (("--batch", "0"), "--batch must be a positive integer (got 0)"),
        (("--batch", "1.5"), "--batch must be a positive integer (got '1.5')"),
        (("--batch", "1", "--steps", "1"), "--steps and --batch cannot be combined"),
        (("0001_a.py", "--steps", "1"), "file and --steps cannot be combined"),
        (("0001_a.py", "--to", "0001_a.py"), "file and --to cannot be combined"),
        (("--batch", "1", "--to", "0001_a.py"), "--batch and --to cannot be combined"),
    ],
)
def test_down_bad_selectors_exit_6_before_connecting(
    cli: Any, project: Any, db: Any, args: tuple[str, ...], message: str
) -> None:
    applied_in_batches(cli, project)
    before = snapshot(db)
    result = cli("down", *args, "--json")
    assert result.exit_code == 6, result.stderr
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert message in result.json["error"]["message"]
    # before connecting: an unreachable server changes nothing about the answer
    offline = cli("down", *args, "--uri", "mongodb://nowhere.invalid:1")
    assert offline.exit_code == 6
    assert f"✖ CONFIG_INVALID: {message}" in offline.stderr
    assert snapshot(db) == before


def test_down_of_a_file_that_is_not_applied_exits_9(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    before = snapshot(db)
    result = cli("down", "0001_a.py", "--json")
    assert result.exit_code == 9
    assert result.json["error"] == {
        "code": "NOT_APPLIED", "message": "Migration is not applied: 0001_a.py",
        "context": {"filename": "0001_a.py"},
    }
    assert result.json["partial"] == []
    assert snapshot(db) == before


def test_down_path_traversal_exits_19(cli: Any, project: Any) -> None:
    result = cli("down", "../../etc/passwd")
    assert result.exit_code == 19
    assert "✖ MIGRATION_INVALID_NAME:" in result.stderr


# --------------------------------------------------------------------------------------- redo


def test_redo_reverts_and_reapplies_the_newest(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    result = cli("redo", "--json")
    assert result.exit_code == 0, result.stderr
    assert [(r["file"], r["status"]) for r in result.json] == [
        ("0002_b.py", "reverted"), ("0002_b.py", "applied")
    ]
    assert calls(db) == ["0001_a", "0002_b", "0002_b", "0002_b"]
    assert records(db)["0002_b.py"]["batch"] == 2
    human = cli("redo", "0001_a.py")
    assert human.exit_code == 0
    assert "↩ Reverted 0001_a.py" in human.stdout and "✔ Applied  0001_a.py" in human.stdout


def test_redo_with_nothing_applied(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("redo")
    assert result.exit_code == 0
    assert result.stdout == "Nothing to redo\n"
    not_applied = cli("redo", "0001_a.py")
    assert not_applied.exit_code == 9
