"""``migronaut status``, ``list``, ``dry-run``, ``lock`` and ``unlock`` through the CLI."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCK_ID, LOCKS, applied, calls, hold_lock, write_simple

FAILING = "def up(ctx):\n    raise ValueError('boom')\n\ndef down(ctx):\n    pass\n"
HEADER = re.compile(
    r"│ Migration\s+│ Status\s+│ Batch │ Applied At\s+│ Duration │ Checksum │ Description\s+│"
)


def snapshot(db: Any) -> tuple[Any, ...]:
    return (
        list(db[CHANGELOG].find({}, {"_id": 0}).sort("name", 1)),
        list(db[LOCKS].find({})),
        calls(db),
    )


def table_rows(stdout: str) -> list[list[str]]:
    """The body rows of a box-drawn table, as lists of stripped cells."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith("│") and not HEADER.match(line):
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


# ------------------------------------------------------------------------------------ status


def test_status_table(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    write_simple(project, "0002_b")
    result = cli("status")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("┌─") and lines[-1].startswith("└─")
    assert HEADER.match(lines[1])
    (first, second) = table_rows(result.stdout)
    record = db[CHANGELOG].find_one({"name": "0001_a.py"})
    local = record["appliedAt"].replace(tzinfo=dt.UTC).astimezone()
    assert first[:3] == ["0001_a.py", "applied", "1"]
    assert first[3] == local.strftime("%Y-%m-%d %H:%M:%S")
    assert re.fullmatch(r"\d+ms", first[4])
    assert first[5] == "ok"
    assert first[6] == record["description"]
    assert second == ["0002_b.py", "pending", "", "", "", "—", ""]


def test_status_shows_a_checksum_mismatch(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0
    path = project.migrations / "0001_a.py"
    path.write_text(path.read_text() + "# changed\n")
    (row,) = table_rows(cli("status").stdout)
    assert row[5] == "MISMATCH"
    assert cli("status", "--json").json[0]["checksumOk"] is False


def test_status_empty(cli: Any, project: Any) -> None:
    result = cli("status")
    assert (result.exit_code, result.stdout) == (0, "No migrations found\n")
    assert cli("status", "--json").json == []


def test_status_sanitises_database_text(cli: Any, project: Any, db: Any) -> None:
    db[CHANGELOG].insert_one({
        "name": "0001_\x1b]0;pwned\x07evil\x1b[31m.py", "status": "applied", "batch": 1,
        "appliedAt": dt.datetime(2026, 1, 1), "checksum": "x",
    })
    result = cli("status", env={"FORCE_COLOR": "1"})
    assert result.exit_code == 0
    assert "\x1b]" not in result.stdout and "\x07" not in result.stdout
    assert "0001_evil.py" in result.stdout
    assert "\x1b[31m" not in result.stdout  # colours are ours only (status cells use 32/33)


def test_status_json_rows(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up", "--to", "0001_a.py").exit_code == 0
    result = cli("status", "--json")
    assert result.exit_code == 0
    first, second = result.json
    assert first["file"] == "0001_a.py" and first["status"] == "applied"
    assert first["appliedAt"].endswith("Z") and first["checksumOk"] is True
    assert second == {"file": "0002_b.py", "status": "pending", "batch": None,
                      "appliedAt": None, "duration": None, "checksumOk": None}


def test_status_check(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    pending = cli("status", "--check")
    assert pending.exit_code == 2
    assert pending.stderr.strip() == "✖ 2 pending migration(s)"
    assert "0002_b.py" in pending.stdout  # the table is still shown
    as_json = cli("status", "--check", "--json")
    assert as_json.exit_code == 2
    assert len(as_json.json) == 2  # stdout stays one document
    assert "✖ 2 pending migration(s)" in as_json.stderr
    assert cli("up").exit_code == 0
    clean = cli("status", "--check")
    assert (clean.exit_code, clean.stderr) == (0, "")


def test_status_check_counts_failed_migrations(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_broken", FAILING)
    assert cli("up").exit_code == 7
    result = cli("status", "--check", "--json")
    assert result.exit_code == 2
    assert [r["status"] for r in result.json] == ["applied", "failed"]
    assert "✖ 1 pending migration(s)" in result.stderr


def test_status_pending_and_limit(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c", "0004_d")
    assert cli("up", "--to", "0002_b.py").exit_code == 0
    pending = cli("status", "--pending", "--json")
    assert [r["file"] for r in pending.json] == ["0003_c.py", "0004_d.py"]
    limited = cli("status", "--limit", "3", "--json")
    assert [r["file"] for r in limited.json] == ["0002_b.py", "0003_c.py", "0004_d.py"]
    assert [r[0] for r in table_rows(cli("status", "--limit", "1").stdout)] == ["0004_d.py"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--limit", "2", "--check"), "--limit cannot be combined with --check"),
        (("--limit", "0"), "--limit must be a positive integer (got '0')"),
        (("--limit", "-3"), "--limit must be a positive integer (got '-3')"),
        (("--limit", "many"), "--limit must be a positive integer (got 'many')"),
    ],
)
def test_status_bad_limit_exits_6(cli: Any, project: Any, args: tuple[str, ...],
                                  message: str) -> None:
    result = cli("status", *args, "--json", "--uri", "mongodb://nowhere.invalid:1")
    assert result.exit_code == 6
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert message in result.json["error"]["message"]


# -------------------------------------------------------------------------------------- list


def test_list_filters(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up", "--to", "0001_a.py").exit_code == 0
    assert [r["file"] for r in cli("list", "--json").json] == ["0001_a.py", "0002_b.py"]
    assert [r["file"] for r in cli("list", "--pending", "--json").json] == ["0002_b.py"]
    assert [r["file"] for r in cli("list", "--applied", "--json").json] == ["0001_a.py"]
    assert [r[0] for r in table_rows(cli("list", "--applied").stdout)] == ["0001_a.py"]
    both = cli("list", "--pending", "--applied")
    assert both.exit_code == 6
    assert "✖ CONFIG_INVALID: --pending and --applied cannot be combined" in both.stderr


# ----------------------------------------------------------------------------------- dry-run


def test_dry_run_up_previews_without_writing(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c")
    before = snapshot(db)
    result = cli("dry-run", "up")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "◎ Dry-run  Would apply: 3"
    assert [r[0] for r in table_rows(result.stdout)] == ["0001_a.py", "0002_b.py", "0003_c.py"]
    to = cli("dry-run", "up", "--to", "0002_b.py", "--json")
    assert [r["file"] for r in to.json] == ["0001_a.py", "0002_b.py"]
    assert all(len(r["checksum"]) == 64 for r in to.json)
    assert "◎ Dry-run  Would apply: 2" in to.stderr
    assert snapshot(db) == before
    assert db.list_collection_names() == [] or db[LOCKS].count_documents({}) == 0


def test_dry_run_down_selectors(cli: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    write_simple(project, "0003_c")
    assert cli("up").exit_code == 0
    before = snapshot(db)
    assert [r["file"] for r in cli("dry-run", "down", "--json").json] == ["0003_c.py"]
    assert [r["file"] for r in cli("dry-run", "down", "--batch", "1", "--json").json] == [
        "0002_b.py", "0001_a.py"
    ]
    assert [r["file"] for r in cli("dry-run", "down", "--steps", "2", "--json").json] == [
        "0003_c.py", "0002_b.py"
    ]
    assert [r["file"] for r in cli("dry-run", "down", "--to", "0001_a.py", "--json").json] == [
        "0003_c.py", "0002_b.py"
    ]
    human = cli("dry-run", "down", "0001_a.py")
    assert human.stdout.splitlines()[0] == "◎ Dry-run  Would revert: 1"
    assert snapshot(db) == before


def test_dry_run_with_nothing_to_do_prints_no_table(cli: Any, project: Any) -> None:
    result = cli("dry-run", "up")
    assert (result.exit_code, result.stdout) == (0, "◎ Dry-run  Would apply: 0\n")


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (("sideways",), 6, "dry-run direction must be 'up' or 'down' (got 'sideways')"),
        (("down", "--steps", "0"), 6, "--steps must be a positive integer (got 0)"),
        (("down", "--batch", "abc"), 6, "--batch must be a positive integer (got 'abc')"),
        (("down", "--steps", "1", "--batch", "1"), 6, "cannot be combined"),
        (("up", "--steps", "1"), 6, "--steps and --batch apply to dry-run down only"),
        (("up", "../x.py"), 19, "must be a bare filename"),
        (("up", "--to", "0009_missing.py"), 8, "Migration file not found: 0009_missing.py"),
        (("down", "0009_missing.py"), 9, "Migration is not applied: 0009_missing.py"),
    ],
)
def test_dry_run_bad_input(cli: Any, project: Any, db: Any, args: tuple[str, ...],
                           exit_code: int, message: str) -> None:
    write_simple(project, "0001_a")
    before = snapshot(db)
    result = cli("dry-run", *args, "--json")
    assert result.exit_code == exit_code, result.stderr
    assert message in result.json["error"]["message"]
    assert snapshot(db) == before


# ------------------------------------------------------------------------------ lock, unlock


def test_lock_when_free_and_when_held(cli: Any, project: Any, db: Any) -> None:
    free = cli("lock")
    assert (free.exit_code, free.stdout) == (0, "No migration lock is currently held\n")
    assert cli("lock", "--json").json == {"held": False, "holder": None, "state": "free"}
    hold_lock(db)
    held = cli("lock")
    assert held.exit_code == 0
    assert re.fullmatch(
        r"Lock held by pid 4242 on other-host \(other-user\) since "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\n",
        held.stdout,
    )
    doc = cli("lock", "--json").json
    assert doc["held"] is True and doc["state"] == "held" and "problems" not in doc
    assert doc["holder"]["pid"] == 4242 and doc["holder"]["host"] == "other-host"
    assert doc["holder"]["executedBy"] == "other-user"
    assert "nonce" not in doc["holder"]
    assert db[LOCKS].count_documents({}) == 1  # read-only


def test_lock_holder_text_is_sanitised(cli: Any, project: Any, db: Any) -> None:
    hold_lock(db)
    db[LOCKS].update_one({"_id": LOCK_ID}, {"$set": {"host": "evil\x1b[2J\x1b]0;t\x07host"}})
    result = cli("lock")
    assert "evilhost" in result.stdout and "\x1b" not in result.stdout


def test_unlock_when_free(cli: Any, project: Any) -> None:
    result = cli("unlock")
    assert (result.exit_code, result.stdout) == (0, "No migration lock is currently held\n")
    as_json = cli("unlock", "--yes", "--json")
    assert as_json.exit_code == 0
    assert as_json.json == {"released": False, "holder": None}


def test_unlock_json_without_yes_exits_6_before_connecting(cli: Any, project: Any,
                                                           db: Any) -> None:
    hold_lock(db)
    before = snapshot(db)
    result = cli("unlock", "--json")
    assert result.exit_code == 6
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert "pass --yes" in result.json["error"]["message"]
    offline = cli("unlock", "--json", "--uri", "mongodb://nowhere.invalid:1")
    assert offline.exit_code == 6
    assert snapshot(db) == before


def test_unlock_refuses_a_holder_that_looks_alive_without_force(
    cli: Any, project: Any, db: Any
) -> None:
    hold_lock(db)  # a heartbeat younger than its TTL
    before = snapshot(db)
    for args in (("unlock", "-y", "--json"), ("unlock", "--json", "-y", "--yes")):
        result = cli(*args)
        assert result.exit_code == 3, result.stderr
        error = result.json["error"]
        assert error["code"] == "LOCK_ALREADY_HELD"
        assert error["message"].startswith(
            "The lock holder looks alive (its heartbeat is younger than its TTL): pid 4242 on "
            "other-host (other-user) since ")
        assert "pass --force" in error["message"]
        assert error["context"]["holder"]["host"] == "other-host"
    human = cli("unlock", input="y\n")
    assert human.exit_code == 3
    assert "Force-release this lock?" not in human.stderr  # refused before the prompt
    assert snapshot(db) == before


def test_unlock_prompt_declined_keeps_the_lock(cli: Any, project: Any, db: Any) -> None:
    hold_lock(db)
    before = snapshot(db)
    result = cli("unlock", "--force", input="n\n")
    assert result.exit_code == 0
    assert "⚠ Lock held by pid 4242 on other-host (other-user) since " in result.stderr
    assert "⚠ The holder looks alive (its heartbeat is younger than its TTL): the migration " \
        "it is running will be left in doubt" in result.stderr
    assert "Force-release this lock? [y/N] " in result.stderr
    assert result.stdout == "Aborted\n"
    assert snapshot(db) == before


def test_unlock_prompt_with_closed_stdin_exits_6(cli: Any, project: Any, db: Any) -> None:
    hold_lock(db)
    before = snapshot(db)
    result = cli("unlock", "--force")
    assert result.exit_code == 6
    assert "✖ CONFIG_INVALID: stdin closed before the confirmation was answered" in result.stderr
    assert snapshot(db) == before


def test_unlock_prompt_accepted_releases(cli: Any, project: Any, db: Any) -> None:
    hold_lock(db)
    result = cli("unlock", "--force", input="y\n")
    assert result.exit_code == 0
    assert result.stdout == "✔ Lock released\n"
    assert db[LOCKS].count_documents({}) == 0


def test_unlock_yes_json_reports_the_holder(cli: Any, project: Any, db: Any) -> None:
    hold_lock(db)
    result = cli("unlock", "-y", "--force", "--json")
    assert result.exit_code == 0
    assert result.json["released"] is True
    assert result.json["holder"]["host"] == "other-host"
    assert db[LOCKS].count_documents({}) == 0
    write_simple(project, "0001_a")
    assert cli("up").exit_code == 0  # the lock is free again
    assert applied(db) == ["0001_a.py"]
