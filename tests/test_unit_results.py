"""JSON shapes of results (reference core §8.2): camelCase field names, omitted empties."""

from __future__ import annotations

import datetime as dt
import json

from migronaut._json import iso
from migronaut.core.lock import lock_info
from migronaut.core.results import LockInfo, MigrationSummary, RunResult, StatusRow
from migronaut.errors import EXIT_CODES, MigronautError


def test_run_result_fields() -> None:
    assert RunResult("a.py", "applied", duration=12, batch=3).to_dict() == {
        "file": "a.py",
        "status": "applied",
        "duration": 12,
        "batch": 3,
    }
    assert RunResult("a.py", "skipped", reason="Already applied").to_dict() == {
        "file": "a.py",
        "status": "skipped",
        "reason": "Already applied",
    }
    assert RunResult("a.py", "error", duration=1, batch=2, error="boom").to_dict() == {
        "file": "a.py",
        "status": "error",
        "duration": 1,
        "batch": 2,
        "error": "boom",
    }
    assert RunResult("a.py", "reverted", duration=0).to_dict() == {
        "file": "a.py",
        "status": "reverted",
        "duration": 0,
    }


def test_status_row_fields_and_camel_case() -> None:
    when = dt.datetime(2026, 3, 4, 5, 6, 7, 891000)
    row = StatusRow(
        file="a.py",
        status="applied",
        batch=2,
        applied_at=when,
        duration=7,
        checksum_ok=True,
        description="d",
        executed_by="alice",
        environment="prod",
        run_id="r1",
        reverted_at=None,
        origin="migronaut",
        requested_by="ci",
        reason="why",
        revert_requested_by="ops",
        revert_reason="undo",
        checksum="c" * 64,
    )
    d = row.to_dict()
    assert d == {
        "file": "a.py",
        "status": "applied",
        "batch": 2,
        "appliedAt": "2026-03-04T05:06:07.891Z",
        "duration": 7,
        "checksumOk": True,
        "description": "d",
        "executedBy": "alice",
        "environment": "prod",
        "runId": "r1",
        "origin": "migronaut",
        "checksum": "c" * 64,
        "requestedBy": "ci",
        "reason": "why",
        "revertRequestedBy": "ops",
        "revertReason": "undo",
    }
    json.dumps(d)


def test_pending_row_keeps_the_always_present_nulls() -> None:
    assert StatusRow("b.py", "pending").to_dict() == {
        "file": "b.py",
        "status": "pending",
        "batch": None,
        "appliedAt": None,
        "duration": None,
        "checksumOk": None,
    }


def test_failed_row_fields() -> None:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    d = StatusRow(
        "c.py",
        "failed",
        error="boom",
        failed_at=when,
        failed_checksum="x",
        out_of_order=True,
        invalid=True,
    ).to_dict()
    assert d["error"] == "boom"
    assert d["failedAt"] == "2025-12-31T22:00:00.000Z"  # aware datetimes are converted to UTC
    assert d["failedChecksum"] == "x"
    assert d["outOfOrder"] is True and d["invalid"] is True


def test_lock_info_fields_and_no_nonce() -> None:
    when = dt.datetime(2026, 1, 1, 12, 0, 0)
    doc = {
        "_id": "migronaut_lock",
        "lockedAt": when,
        "pid": 12,
        "host": "h",
        "executedBy": "u",
        "owner": "run-1",
        "nonce": "secret-nonce",
        "ttlMs": 60000,
    }
    info = lock_info(doc)
    assert info is not None
    d = info.to_dict()
    assert d == {
        "lockedAt": "2026-01-01T12:00:00.000Z",
        "pid": 12,
        "host": "h",
        "executedBy": "u",
        "runId": "run-1",
        "ttlMs": 60000,
    }
    assert "secret-nonce" not in json.dumps(d)
    assert info.describe() == "pid 12 on h (u) since 2026-01-01T12:00:00.000Z"
    assert lock_info(None) is None
    # an old holder without owner/ttl still renders the always-present fields
    assert LockInfo(None, None, None, None).to_dict() == {
        "lockedAt": None,
        "pid": None,
        "host": None,
        "executedBy": None,
    }


def test_migration_summary_fields() -> None:
    summary = MigrationSummary(
        applied=[RunResult("a.py", "applied", duration=1, batch=1)],
        up_to_date=False,
        waited=True,
        waited_ms=250,
        attempts=3,
    )
    assert summary.to_dict() == {
        "applied": [{"file": "a.py", "status": "applied", "duration": 1, "batch": 1}],
        "upToDate": False,
        "waited": True,
        "waitedMs": 250,
        "attempts": 3,
    }


def test_iso() -> None:
    assert iso(None) is None
    assert iso(dt.datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05.000Z"


def test_exit_codes_are_the_originals() -> None:
    expected = {
        "PENDING_MIGRATIONS": 2,
        "LOCK_ALREADY_HELD": 3,
        "CHECKSUM_MISMATCH": 4,
        "CONNECTION_FAILED": 5,
        "CONFIG_INVALID": 6,
        "MIGRATION_EXECUTION_FAILED": 7,
        "MIGRATION_FILE_NOT_FOUND": 8,
        "NOT_APPLIED": 9,
        "LOCK_LOST": 10,
        "RUN_ABORTED": 11,
        "HOOK_FAILED": 12,
        "MIGRATION_IRREVERSIBLE": 13,
        "MIGRATION_TIMEOUT": 14,
        "TRANSACTIONS_UNSUPPORTED": 15,
        "CONFIG_FILE_EXISTS": 16,
        "IMPORT_TARGET_NOT_EMPTY": 17,
        "MIGRATION_FILE_EXISTS": 18,
        "MIGRATION_INVALID_NAME": 19,
        "MIGRATION_INVALID_EXPORT": 20,
        "LOCK_RELEASE_FAILED": 21,
        "AUDIT_FAILED": 22,
        "MIGRATION_OUT_OF_ORDER": 23,
        "MIGRATION_BLOCKED": 24,
    }
    for code, exit_code in expected.items():
        assert EXIT_CODES[code] == exit_code
    assert EXIT_CODES["STATE_INVALID"] == 35  # ours: after the original's last code (34)
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)  # one exit code per error code
    import migronaut.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, MigronautError) and cls is not MigronautError:
            assert cls("x").exit_code == EXIT_CODES[cls.code], name
