"""The values a duplicate-key error quotes from a user's document (``dup key: {…}``, the
driver's ``keyValue`` and a bulk write's ``op``) never leave the database's own error: not in the
CLI's line, its ``--json`` (``error.message``, ``context.cause``, ``partial[].error``),
``status --json``, the changelog record's ``error`` (stored for good), the ``migration:error`` /
``run:end`` events or the logger's lines. The index name stays: it says what clashed."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from helpers.engine import CHANGELOG, Events, make_migrator
from migronaut import MigrationExecutionFailedError

SECRET = "secret@x.io"
NAME = "Bobby Secretname"

BODIES = {
    # DuplicateKeyError: the server's `dup key: {…}` and the driver's `keyValue`
    "insert_one": f'''
def up(ctx):
    ctx.db["users"].create_index("email", unique=True)
    ctx.db["users"].insert_one({{"email": "{SECRET}", "name": "{NAME}"}})
    ctx.db["users"].insert_one({{"email": "{SECRET}", "name": "{NAME}"}})

def down(ctx):
    pass
''',
    # BulkWriteError: every write error also repeats the whole statement as `op`
    "insert_many": f'''
def up(ctx):
    ctx.db["users"].create_index("email", unique=True)
    ctx.db["users"].insert_many([{{"email": "{SECRET}", "name": "{NAME}"}},
                                 {{"email": "{SECRET}", "name": "{NAME}"}}])

def down(ctx):
    pass
''',
}
OK = "def up(ctx):\n    pass\n\ndef down(ctx):\n    pass\n"


def leaks(text: str) -> list[str]:
    return [value for value in (SECRET, "secret@", NAME) if value in text]


@pytest.fixture(params=sorted(BODIES))
def clashing(request: Any, project: Any) -> Any:
    project.write_migration("0001_ok", OK)
    project.write_migration("0002_users", BODIES[request.param])
    return project


def test_cli_line_json_status_and_stored_record_mask_the_key_values(
    clashing: Any, cli: Any, db: Any
) -> None:
    text = cli("up")
    assert text.exit_code == 7, text.stderr
    assert "Migration up failed: 0002_users.py" in text.stderr
    assert "email_1" in text.stderr  # the index that clashed is named
    assert leaks(text.stdout + text.stderr) == []

    db["users"].drop()
    as_json = cli("up", "--json")
    assert as_json.exit_code == 7, as_json.stderr
    document = as_json.json
    error = document["error"]
    assert error["code"] == "MIGRATION_EXECUTION_FAILED"
    assert "email_1" in error["message"] and leaks(error["message"]) == []
    assert error["context"]["name"] == "0002_users.py"
    assert "Error" in error["context"]["cause"] and leaks(error["context"]["cause"]) == []
    failed = [row for row in document["partial"] if row.get("status") == "error"]
    assert [row["file"] for row in failed] == ["0002_users.py"]
    assert "email_1" in failed[0]["error"]
    assert leaks(as_json.stdout + as_json.stderr) == []

    status = cli("status", "--json")
    assert status.exit_code == 0, status.stderr
    row = next(r for r in status.json if r["file"] == "0002_users.py")
    assert row["status"] == "failed" and "email_1" in row["error"]
    assert leaks(status.stdout) == []

    record = db[CHANGELOG].find_one({"name": "0002_users.py"})
    assert record is not None and record["status"] == "failed"
    assert "email_1" in record["error"] and "{ **** }" in record["error"]
    assert leaks(json.dumps(record, default=str)) == []
    # nothing half-written: the first migration is applied, the failing one is not
    assert db[CHANGELOG].find_one({"name": "0001_ok.py"})["status"] == "applied"


def test_events_and_logger_lines_mask_the_key_values(clashing: Any, db: Any) -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage() + " " + json.dumps(record.__dict__, default=str))

    logger = logging.getLogger(f"test.dupkeys.{id(lines)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(Keep())
    with make_migrator(clashing, logger=logger) as migrator:
        events = Events(migrator)
        with pytest.raises(MigrationExecutionFailedError) as info:
            migrator.up()
    assert leaks(str(info.value)) == [] and leaks(json.dumps(info.value.to_dict())) == []
    (failed,) = events.of("migration:error")
    assert failed["migration"] == "0002_users.py" and "email_1" in failed["error"]
    (end,) = events.of("run:end")
    assert end["success"] is False and "email_1" in end["error"]
    assert leaks(json.dumps(events.items, default=str)) == []
    assert any("0002_users.py" in line for line in lines)
    assert leaks("\n".join(lines)) == []
