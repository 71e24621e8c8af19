"""Pure planning logic: option validation (before any connection) and status rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from migronaut.core.plan import (
    build_status_rows,
    check_forward_only,
    validate_down_options,
    validate_up_options,
)
from migronaut.errors import (
    ConfigInvalidError,
    IrreversibleMigrationError,
    MigrationInvalidNameError,
)

# ------------------------------------------------------------------------ up option rules


def test_valid_up_options_pass() -> None:
    validate_up_options(None)
    validate_up_options("0001_a.py", force=True)
    validate_up_options(None, to="0002_b.py")
    validate_up_options(None, step=True)
    validate_up_options("0001_a.py", batch=3)
    validate_up_options(None, requested_by="ci", reason="x" * 512)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"file": {"$ne": None}},
        {"file": 42},
        {"file": "../etc/passwd"},
        {"file": "a/b.py"},
        {"file": "$where.py"},
        {"file": None, "to": ["x"]},
        {"file": None, "to": "../x.py"},
    ],
)
def test_up_names_must_be_bare_strings(kwargs: dict[str, Any]) -> None:
    file = kwargs.pop("file")
    with pytest.raises(MigrationInvalidNameError) as info:
        validate_up_options(file, **kwargs)
    assert info.value.exit_code == 19


@pytest.mark.parametrize(
    ("file", "kwargs", "fragment"),
    [
        ("a.py", {"to": "b.py"}, "--to"),
        (None, {"force": True}, "--force requires a specific migration file"),
        (None, {"batch": 2, "step": True}, "--step"),
        ("a.py", {"batch": 0}, "batch"),
        ("a.py", {"batch": -1}, "batch"),
        ("a.py", {"batch": True}, "batch"),
        ("a.py", {"batch": "3"}, "batch"),
        ("a.py", {"batch": 1.5}, "batch"),
        (None, {"requested_by": ""}, "requested_by"),
        (None, {"requested_by": "x" * 129}, "requested_by"),
        (None, {"requested_by": 7}, "requested_by"),
        (None, {"reason": "x" * 513}, "reason"),
        (None, {"reason": "   "}, "reason"),
    ],
)
def test_up_option_rules(file: str | None, kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigInvalidError) as info:
        validate_up_options(file, **kwargs)
    assert fragment in info.value.message
    assert info.value.exit_code == 6


# ---------------------------------------------------------------------- down option rules


def test_valid_down_options_pass() -> None:
    validate_down_options(None)
    validate_down_options("a.py")
    validate_down_options(None, steps=2)
    validate_down_options(None, batch=1)
    validate_down_options(None, to="a.py")


@pytest.mark.parametrize(
    "selectors",
    [
        {"file": "a.py", "steps": 1},
        {"file": "a.py", "batch": 1},
        {"file": "a.py", "to": "b.py"},
        {"steps": 1, "batch": 1},
        {"steps": 1, "to": "b.py"},
        {"batch": 1, "to": "b.py"},
        {"file": "a.py", "steps": 1, "batch": 1, "to": "b.py"},
    ],
)
def test_down_selectors_are_mutually_exclusive(selectors: dict[str, Any]) -> None:
    file = selectors.pop("file", None)
    with pytest.raises(ConfigInvalidError) as info:
        validate_down_options(file, **selectors)
    assert "cannot be combined" in info.value.message


@pytest.mark.parametrize("option", ["steps", "batch"])
@pytest.mark.parametrize("value", [0, -3, True, "2", 2.0, float("nan")])
def test_down_counts_must_be_positive_integers(option: str, value: Any) -> None:
    with pytest.raises(ConfigInvalidError) as info:
        validate_down_options(None, **{option: value})
    assert option in info.value.message
    assert info.value.context["option"] == f"--{option}"


@pytest.mark.parametrize("kwargs", [{"file": {"$gt": ""}}, {"file": None, "to": 5}])
def test_down_names_must_be_strings(kwargs: dict[str, Any]) -> None:
    file = kwargs.pop("file")
    with pytest.raises(MigrationInvalidNameError):
        validate_down_options(file, **kwargs)


def test_forward_only_records_are_refused_together() -> None:
    records = [
        {"name": "c.py", "origin": "migronaut"},
        {"name": "b.py", "origin": "baseline"},
        {"name": "a.py", "origin": "migrate-mongo"},
        {"name": "n.py"},
    ]
    with pytest.raises(IrreversibleMigrationError) as info:
        check_forward_only(records)
    assert info.value.context["names"] == ["b.py", "a.py"]
    assert info.value.exit_code == 13
    check_forward_only([records[0], records[3]])


# ------------------------------------------------------------------------------ status rows

T1 = dt.datetime(2026, 1, 1, 10, 0, 0)
T2 = dt.datetime(2026, 1, 2, 10, 0, 0)


def rec(name: Any, status: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "status": status,
        "batch": 1,
        "appliedAt": T1,
        "duration": 5,
        "checksum": f"sum-{name}",
        "executedBy": "alice",
        "environment": "prod",
        "runId": "r1",
    }
    base.update(extra)
    return base


def rows_by_file(rows: list[Any]) -> dict[str, Any]:
    return {r.file: r for r in rows}


def test_rows_are_the_name_sorted_union_of_files_and_records() -> None:
    rows = build_status_rows(
        [rec("c.py", "applied"), rec("gone.py", "applied")],
        ["b.py", "c.py", "a.py"],
        checksum=lambda n: f"sum-{n}",
    )
    assert [r.file for r in rows] == ["a.py", "b.py", "c.py", "gone.py"]
    by = rows_by_file(rows)
    assert by["a.py"].status == "pending" and by["a.py"].batch is None
    assert by["c.py"].status == "applied" and by["c.py"].checksum_ok is True
    assert by["gone.py"].status == "applied" and by["gone.py"].checksum_ok is None  # file missing


def test_checksum_ok_is_true_false_or_null() -> None:
    records = [rec("same.py", "applied"), rec("edited.py", "applied"), rec("unread.py", "applied")]
    files = ["same.py", "edited.py", "unread.py", "pending.py"]
    sums = {"same.py": "sum-same.py", "edited.py": "different", "unread.py": None}
    by = rows_by_file(build_status_rows(records, files, checksum=sums.get))
    assert by["same.py"].checksum_ok is True
    assert by["edited.py"].checksum_ok is False
    assert by["unread.py"].checksum_ok is None
    assert by["pending.py"].checksum_ok is None
    # checksums off: never hashes, always null
    by = rows_by_file(build_status_rows(records, files, checksum=None))
    assert {r.checksum_ok for r in by.values()} == {None}


def test_reverted_records_show_as_pending_with_their_history() -> None:
    by = rows_by_file(
        build_status_rows(
            [rec("a.py", "reverted", revertedAt=T2)], ["a.py"], checksum=lambda n: "x"
        )
    )
    row = by["a.py"]
    assert row.status == "pending"
    assert row.reverted_at == T2
    assert row.batch is None and row.applied_at is None and row.duration is None
    assert row.checksum_ok is None


def test_failed_records_show_as_failed_with_the_error() -> None:
    failed = rec("a.py", "failed", error="boom", failedAt=T2, checksum="bad-sum")
    row = build_status_rows([failed], ["a.py"], checksum=lambda n: "x")[0]
    assert row.status == "failed"
    assert row.error == "boom" and row.failed_at == T2 and row.failed_checksum == "bad-sum"
    assert row.batch is None and row.applied_at is None
    d = row.to_dict()
    assert d["status"] == "failed" and d["error"] == "boom" and d["failedChecksum"] == "bad-sum"


def test_out_of_order_marks_unapplied_names_before_the_newest_applied_one() -> None:
    rows = build_status_rows(
        [rec("0002.py", "applied"), rec("0001.py", "reverted"), rec("0000.py", "failed")],
        ["0000.py", "0001.py", "0002.py", "0003.py", "0001b.py"],
        checksum=None,
    )
    by = rows_by_file(rows)
    assert by["0000.py"].out_of_order and by["0001.py"].out_of_order
    assert by["0001b.py"].out_of_order
    assert not by["0002.py"].out_of_order  # applied
    assert not by["0003.py"].out_of_order  # after the newest applied
    assert "outOfOrder" not in by["0003.py"].to_dict()
    assert by["0001.py"].to_dict()["outOfOrder"] is True


def test_nothing_is_out_of_order_without_applied_records() -> None:
    rows = build_status_rows([rec("b.py", "reverted")], ["a.py", "b.py"], checksum=None)
    assert not any(r.out_of_order for r in rows)


def test_invalid_record_names_do_not_crash_status() -> None:
    rows = build_status_rows(
        [
            rec("../../etc/passwd", "applied"),
            rec("$where", "reverted"),
            rec(12345, "applied"),
            rec("ok.py", "applied"),
        ],
        ["ok.py"],
        checksum=lambda n: f"sum-{n}",
    )
    by = rows_by_file(rows)
    assert by["../../etc/passwd"].invalid is True
    assert by["../../etc/passwd"].checksum_ok is False
    assert by["$where"].invalid is True and by["$where"].status == "pending"
    assert by["ok.py"].invalid is False and by["ok.py"].checksum_ok is True
    assert by["../../etc/passwd"].to_dict()["invalid"] is True
    assert "invalid" not in by["ok.py"].to_dict()


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        ("all", ["a.py", "b.py", "c.py", "d.py"]),
        ("pending", ["b.py", "c.py", "d.py"]),  # reverted and failed are outstanding work
        ("applied", ["a.py"]),
    ],
)
def test_filters(filter_: str, expected: list[str]) -> None:
    records = [rec("a.py", "applied"), rec("b.py", "reverted"), rec("c.py", "failed")]
    rows = build_status_rows(
        records, ["a.py", "b.py", "c.py", "d.py"], checksum=None, filter=filter_
    )
    assert [r.file for r in rows] == expected


def test_pending_filter_never_hashes() -> None:
    def explode(name: str) -> str:
        raise AssertionError(f"hashed {name}")

    rows = build_status_rows(
        [rec("a.py", "applied")], ["a.py", "b.py"], checksum=None, filter="pending"
    )
    assert [r.file for r in rows] == ["b.py"]
    # and with a checksum function, only applied rows are hashed
    build_status_rows([rec("a.py", "reverted")], ["a.py"], checksum=explode)


def test_actor_fields_are_carried() -> None:
    record = rec(
        "a.py",
        "applied",
        requestedBy="ci-bot",
        reason="release 42",
        revertRequestedBy="ops",
        revertReason="rollback",
        origin="baseline",
    )
    d = build_status_rows([record], ["a.py"], checksum=None)[0].to_dict()
    assert d["requestedBy"] == "ci-bot" and d["reason"] == "release 42"
    assert d["revertRequestedBy"] == "ops" and d["revertReason"] == "rollback"
    assert d["origin"] == "baseline"
