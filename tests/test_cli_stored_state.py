"""Stored state migronaut did not write, or does not understand, met through the CLI.

A migration tool fails closed: a changelog record with a missing or unknown ``status``, a batch
that is not a positive integer, a name that is not a string or an ``appliedAt`` that is not a
date stops ``status``, ``up``, ``down`` and ``dry-run`` with ``STATE_INVALID`` (exit 35) naming
the record and the field, and fails the ``changelog`` check of ``audit`` — it never counts as
"pending". Two records for one migration (the unique index on ``name`` gone) leave the
read-only views working and naming them, while every command that writes the changelog refuses.
A lock document that cannot be read is held until ``unlock`` removes it, and ``lock``, ``audit``
and ``up`` judge every lock document by one rule. Each bad document is arranged with pymongo;
each refusal is checked for its message, code and exit code, and for leaving the database as it
was (no record written, no lock left behind, no index built).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCK_ID, LOCKS, calls, hold_lock, server_now, write_simple
from helpers.wire_audit import AUDIT

STATE_INVALID = 35


HISTORY = ("_migronaut_runs", "_migronaut_runs_logs")


def snapshot(db: Any, *, history: bool = True) -> dict[str, Any]:
    """Every collection of the test database with its documents and index names; without the
    run history (a refusal inside a run is recorded there, like any failed run) when
    ``history`` is false."""
    return {
        name: (list(db[name].find().sort("_id", 1)), sorted(db[name].index_information()))
        for name in sorted(db.list_collection_names())
        if history or name not in HISTORY
    }


def applied_two(cli: Any, project: Any) -> None:
    """``0001_a.py`` and ``0002_b.py`` applied in batch 1 (the changelog as migronaut wrote it)."""
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in report["checks"] if c["name"] == name]
    return found


def refused(result: Any, code: str, exit_code: int) -> str:
    """The error message of a ``--json`` run that must have failed with ``code``."""
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    assert result.json is not None, f"not one JSON document: {result.stdout!r}"
    assert result.json["error"]["code"] == code, result.json
    message: str = result.json["error"]["message"]
    return message


# ------------------------------------------------------------------- changelog records (3)

#: (id, update of 0002_b.py's record, the field named, a phrase of the message)
BAD_RECORDS = [
    ("status-missing", {"$unset": {"status": ""}}, "status", "has no status"),
    ("status-unknown", {"$set": {"status": "done"}}, "status",
     "status 'done' is not one of applied, reverted, failed"),
    ("status-not-a-string", {"$set": {"status": 1}}, "status", "status 1 is not one of"),
    ("batch-string", {"$set": {"batch": "1"}}, "batch", "batch '1' is not a positive integer"),
    ("batch-fraction", {"$set": {"batch": 1.5}}, "batch", "batch 1.5 is not a positive integer"),
    ("batch-zero", {"$set": {"batch": 0}}, "batch", "batch 0 is not a positive integer"),
    ("appliedAt-string", {"$set": {"appliedAt": "2024-01-01"}}, "appliedAt",
     "appliedAt '2024-01-01' is not a date"),
    ("appliedAt-missing", {"$unset": {"appliedAt": ""}}, "appliedAt",
     "is applied but has no appliedAt"),
]


def corrupt(db: Any, update: dict[str, Any]) -> None:
    assert db[CHANGELOG].update_one({"name": "0002_b.py"}, update).matched_count == 1


@pytest.mark.parametrize(("update", "field", "phrase"), [c[1:] for c in BAD_RECORDS],
                         ids=[c[0] for c in BAD_RECORDS])
def test_a_record_we_do_not_understand_stops_status_up_down_and_dry_run(
    cli: Any, project: Any, db: Any, update: dict[str, Any], field: str, phrase: str
) -> None:
    applied_two(cli, project)
    write_simple(project, "0003_c")  # pending: an `up` that ran would apply it
    corrupt(db, update)
    before = snapshot(db)

    for args in (("status",), ("list",), ("up",), ("down",), ("redo",), ("dry-run", "up"),
                 ("dry-run", "down")):
        message = refused(cli(*args, "--json"), "STATE_INVALID", STATE_INVALID)
        assert "0002_b.py" in message and phrase in message, (args, message)
        assert f"({CHANGELOG})" in message
        assert snapshot(db) == before, args  # nothing written, no lock, no index

    human = cli("status")
    assert human.exit_code == STATE_INVALID and human.stdout == ""
    assert f"✖ STATE_INVALID: Changelog record 0002_b.py ({CHANGELOG}): {phrase}" in human.stderr
    details = cli("up", "--json").json["error"]["context"]
    assert details["collection"] == CHANGELOG
    assert details["problems"][0]["record"] == "0002_b.py"
    assert details["problems"][0]["field"] == field
    assert calls(db, "up") == ["0001_a", "0002_b"]  # never re-run, 0003_c never run
    assert snapshot(db) == before


@pytest.mark.parametrize(("update", "field", "phrase"), [c[1:] for c in BAD_RECORDS],
                         ids=[c[0] for c in BAD_RECORDS])
def test_audit_fails_the_changelog_check_for_a_record_we_do_not_understand(
    cli: Any, project: Any, db: Any, update: dict[str, Any], field: str, phrase: str
) -> None:
    applied_two(cli, project)
    corrupt(db, update)
    before = snapshot(db)

    result = cli("audit", "--json")

    assert result.exit_code == 22, result.stderr
    changelog = check(result.json, "changelog")
    assert changelog["status"] == "fail"
    assert changelog["detail"].startswith("1 record(s) migronaut cannot read: 0002_b.py: ")
    assert phrase in changelog["detail"]
    for name in ("checksums", "pending", "ordering"):  # what they would say is not known
        assert check(result.json, name) == {
            "name": name, "status": "warn",
            "detail": "Not checked: the changelog has records migronaut cannot read"}
    assert snapshot(db) == before


def test_a_record_whose_name_is_not_a_string_is_named_by_its_id(
    cli: Any, project: Any, db: Any
) -> None:
    applied_two(cli, project)
    stray = db[CHANGELOG].insert_one({"name": 42, "status": "applied", "batch": 1,
                                      "appliedAt": server_now(db)}).inserted_id
    before = snapshot(db)

    message = refused(cli("status", "--json"), "STATE_INVALID", STATE_INVALID)
    assert message == (f"Changelog record _id {stray} ({CHANGELOG}): name 42 is not a string — "
                       "fix or remove it; migronaut does not guess what it means")
    refused(cli("up", "--json"), "STATE_INVALID", STATE_INVALID)
    audit = cli("audit", "--json")
    assert audit.exit_code == 22
    assert f"_id {stray}: name 42 is not a string" in check(audit.json, "changelog")["detail"]
    assert snapshot(db) == before


def test_several_bad_records_are_counted_and_the_first_ones_named(
    cli: Any, project: Any, db: Any
) -> None:
    applied_two(cli, project)
    db[CHANGELOG].update_many({}, {"$set": {"status": "done"}})

    error = cli("status", "--json").json["error"]
    assert error["message"].startswith(
        f"2 changelog records ({CHANGELOG}) migronaut cannot read: 0001_a.py: status 'done' is "
        "not one of applied, reverted, failed, running, reverting; 0002_b.py: status 'done'")
    assert [p["record"] for p in error["context"]["problems"]] == ["0001_a.py", "0002_b.py"]


def test_an_applied_record_without_a_batch_is_named_by_down_and_audit(
    cli: Any, project: Any, db: Any
) -> None:
    applied_two(cli, project)
    db[CHANGELOG].update_one({"name": "0002_b.py"}, {"$unset": {"batch": ""}})
    before = snapshot(db, history=False)

    message = refused(cli("down", "--json"), "STATE_INVALID", STATE_INVALID)
    assert message == (
        "Cannot tell which batch to revert: the applied record of 0002_b.py "
        f"({CHANGELOG}) has no batch — revert it by name (migronaut down 0002_b.py) or give it "
        "its batch")
    refused(cli("down", "--batch", "1", "--json"), "STATE_INVALID", STATE_INVALID)
    refused(cli("dry-run", "down", "--json"), "STATE_INVALID", STATE_INVALID)
    assert snapshot(db, history=False) == before

    status = cli("status", "--json")  # a view: it shows the record as it is
    assert status.exit_code == 0
    assert [(r["file"], r["status"], r["batch"]) for r in status.json] == [
        ("0001_a.py", "applied", 1), ("0002_b.py", "applied", None)]
    audit = cli("audit", "--json")
    assert audit.exit_code == 22
    assert check(audit.json, "changelog") == {
        "name": "changelog", "status": "fail",
        "detail": "Applied without a batch (down cannot revert them by batch): 0002_b.py"}
    assert snapshot(db, history=False) == before

    by_name = cli("down", "0002_b.py", "--json")  # naming it is the way out
    assert by_name.exit_code == 0, by_name.stderr
    assert [r["file"] for r in by_name.json] == ["0002_b.py"]
    assert cli("down", "--json").exit_code == 0  # batch 1 again: its last applied record


# ------------------------------------------------------------ duplicate changelog names (4)


def duplicate(db: Any, name: str = "0001_a.py") -> None:
    """A second record for ``name``: what a changelog without its unique index can hold."""
    db[CHANGELOG].drop_index("name_unique")
    copy = db[CHANGELOG].find_one({"name": name}, {"_id": 0})
    db[CHANGELOG].insert_one(copy)


READ_ONLY = [("status",), ("list",), ("lock",), ("unlock", "--yes"), ("audit",)]


@pytest.mark.parametrize("args", READ_ONLY, ids=[a[0] for a in READ_ONLY])
def test_read_only_commands_work_with_duplicate_records_and_create_no_index(
    cli: Any, project: Any, db: Any, args: tuple[str, ...]
) -> None:
    applied_two(cli, project)
    duplicate(db)
    before = snapshot(db)

    with AUDIT.recording() as sent:
        result = cli(*args, "--json")

    assert result.exit_code == (22 if args[0] == "audit" else 0), (result.stdout, result.stderr)
    assert result.json is not None
    assert "CONNECTION_FAILED" not in result.stdout + result.stderr
    assert not [s for s in sent if s.command == "createIndexes"]
    assert snapshot(db) == before


def test_status_and_list_name_the_duplicates(cli: Any, project: Any, db: Any) -> None:
    applied_two(cli, project)
    duplicate(db)

    result = cli("status", "--json")
    assert result.exit_code == 0
    rows = {r["file"]: r for r in result.json}
    assert rows["0001_a.py"]["duplicate"] is True and rows["0001_a.py"]["status"] == "applied"
    assert "duplicate" not in rows["0002_b.py"]
    warning = (f"⚠ Several changelog records for one migration ({CHANGELOG}): 0001_a.py (2) — "
               "the unique index on name is missing; up, down, redo, baseline and import refuse "
               "to run until one record per migration is left")
    assert warning in result.stderr
    human = cli("list")
    assert human.exit_code == 0 and warning in human.stderr and "0001_a.py" in human.stdout

    audit = cli("audit", "--json")
    assert check(audit.json, "changelog") == {
        "name": "changelog", "status": "fail",
        "detail": "Several records for one migration (the unique index on name is missing): "
                  "0001_a.py (2)"}
    assert check(audit.json, "indexes")["detail"].startswith("Missing: name_unique")


MUTATING = [("up",), ("down",), ("redo",), ("baseline", "--yes"), ("import", "--force"),
            ("dry-run", "up"), ("baseline", "--dry-run"), ("import", "--dry-run")]


@pytest.mark.parametrize("ensure_indexes", ["true", "false"])
@pytest.mark.parametrize("args", MUTATING, ids=["-".join(a) for a in MUTATING])
def test_commands_that_write_the_changelog_refuse_duplicate_records(
    cli: Any, project: Any, db: Any, args: tuple[str, ...], ensure_indexes: str
) -> None:
    applied_two(cli, project)
    write_simple(project, "0003_c")
    db["changelog"].insert_one({"fileName": "0003_c.py", "appliedAt": server_now(db)})
    duplicate(db)
    before = snapshot(db)

    result = cli(*args, "--json", env={"MIGRONAUT_ENSURE_INDEXES": ensure_indexes})

    message = refused(result, "STATE_INVALID", STATE_INVALID)
    assert message == (
        f"Several changelog records for one migration ({CHANGELOG}): 0001_a.py (2) — the "
        "unique index on name is missing; remove the extra records, then run again")
    assert result.json["error"]["context"]["duplicates"] == {"0001_a.py": 2}
    assert snapshot(db) == before
    assert calls(db, "up") == ["0001_a", "0002_b"]


def test_a_duplicate_the_index_build_meets_is_named_too(
    cli: Any, project: Any, db: Any
) -> None:
    """The unique index build itself meets the duplicates (a peer without the index wrote one
    after our read): the refusal still names them, never ``CONNECTION_FAILED``."""
    from migronaut.core.changelog import Changelog
    from migronaut.errors import StateInvalidError

    applied_two(cli, project)
    duplicate(db)
    with pytest.raises(StateInvalidError) as info:
        Changelog(db[CHANGELOG]).ensure_indexes()
    assert info.value.exit_code == STATE_INVALID
    assert info.value.context["duplicates"] == {"0001_a.py": 2}
    assert "0001_a.py (2)" in info.value.message
    assert "name_unique" not in db[CHANGELOG].index_information()


def test_read_only_commands_on_a_fresh_database_send_no_create_indexes(
    cli: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    with AUDIT.recording() as sent:
        for args in (("status",), ("list",), ("lock",), ("unlock", "--yes"), ("audit",),
                     ("dry-run", "up"), ("logs",)):
            result = cli(*args, "--json")
            assert result.exit_code in (0, 22), (args, result.stdout, result.stderr)
    assert [s.command for s in sent if s.command == "createIndexes"] == []
    assert db.list_collection_names() == []
    assert cli("up").exit_code == 0  # the first run that writes creates them
    assert "name_unique" in db[CHANGELOG].index_information()


# ----------------------------------------------------------------------- lock documents (5)


def future(db: Any) -> None:
    tomorrow = {"$add": ["$$NOW", 86_400_000]}
    db[LOCKS].update_one({"_id": LOCK_ID}, [{"$set": {"lockedAt": tomorrow}}])


#: (id, arrange the held lock document, the field named, a phrase of the problem)
BAD_LOCKS = [
    ("lockedAt-string", {"$set": {"lockedAt": "yesterday"}}, "lockedAt",
     "lockedAt 'yesterday' is not a date"),
    ("lockedAt-missing", {"$unset": {"lockedAt": ""}}, "lockedAt", "lockedAt is missing"),
    ("ttlMs-negative", {"$set": {"ttlMs": -5}}, "ttlMs", "ttlMs -5 is not a positive number"),
    ("ttlMs-string", {"$set": {"ttlMs": "60s"}}, "ttlMs", "ttlMs '60s' is not a positive number"),
    ("owner-missing", {"$unset": {"owner": ""}}, "owner", "owner is missing"),
    ("lockedAt-future", None, "lockedAt", "lockedAt is in the future (server time)"),
]


def bad_lock(db: Any, update: dict[str, Any] | None) -> None:
    hold_lock(db)
    if update is None:
        future(db)
    else:
        db[LOCKS].update_one({"_id": LOCK_ID}, update)


@pytest.mark.parametrize(("update", "field", "phrase"), [c[1:] for c in BAD_LOCKS],
                         ids=[c[0] for c in BAD_LOCKS])
def test_a_lock_document_we_cannot_read_is_held_and_reported(
    cli: Any, project: Any, db: Any, update: dict[str, Any] | None, field: str, phrase: str
) -> None:
    write_simple(project, "0001_a")
    bad_lock(db, update)
    before = snapshot(db)

    message = refused(cli("up", "--json"), "LOCK_ALREADY_HELD", 3)
    assert message.startswith("Migration lock is held by a lock document migronaut cannot read")
    assert phrase in message and "migronaut unlock" in message

    audit = cli("audit", "--json")
    assert audit.exit_code == 22
    lock = check(audit.json, "lock")
    assert lock["status"] == "fail"
    assert lock["detail"].startswith(f"The lock document cannot be read: {phrase}")
    assert snapshot(db) == before  # not reclaimed, not rewritten
    assert calls(db) == []

    shown = cli("lock")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.startswith("Lock held by pid 4242 on other-host (other-user) since ")
    assert f"✖ The lock document cannot be read: {phrase}" in shown.stderr
    assert "runs treat it as held until it is removed (migronaut unlock)" in shown.stderr
    as_json = cli("lock", "--json").json
    assert as_json["held"] is True and as_json["state"] == "invalid"
    assert [p["field"] for p in as_json["problems"]] == [field]
    assert phrase in as_json["problems"][0]["message"]

    released = cli("unlock", input="y\n")  # the operator's way out, with the prompt
    assert released.exit_code == 0, released.stderr
    assert phrase in released.stderr and released.stdout == "✔ Lock released\n"
    assert db[LOCKS].count_documents({}) == 0
    assert cli("up").exit_code == 0 and calls(db) == ["0001_a"]


def test_unlock_json_removes_a_lock_document_we_cannot_read(
    cli: Any, project: Any, db: Any
) -> None:
    bad_lock(db, {"$set": {"lockedAt": "yesterday", "ttlMs": "60s"}})
    result = cli("unlock", "--yes", "--json")
    assert result.exit_code == 0
    assert result.json["released"] is True and result.json["holder"]["host"] == "other-host"
    assert [p["field"] for p in result.json["problems"]] == ["lockedAt", "ttlMs"]
    assert db[LOCKS].count_documents({}) == 0


#: (id, lock document arranged, its state, does `up` get it)
JUDGED = [
    ("live-by-its-own-long-ttl", {"age_ms": 120_000, "ttl_ms": 600_000}, "held", False),
    ("expired-by-its-own-short-ttl", {"age_ms": 5_000, "ttl_ms": 1_000}, "expired", True),
    ("no-ttl-judged-by-ours-live", {"age_ms": 5_000, "ttl_ms": None}, "held", False),
    ("no-ttl-judged-by-ours-expired", {"age_ms": 120_000, "ttl_ms": None}, "expired", True),
    ("an-empty-document", {"empty": True}, "free", True),
]


@pytest.mark.parametrize(("arrange", "state", "up_gets_it"), [c[1:] for c in JUDGED],
                         ids=[c[0] for c in JUDGED])
def test_lock_audit_and_up_judge_a_lock_document_by_one_rule(
    cli: Any, project: Any, db: Any, arrange: dict[str, Any], state: str, up_gets_it: bool
) -> None:
    """Our TTL is 60 s; a holder is judged by the TTL it wrote (``ttlMs``), else by ours."""
    write_simple(project, "0001_a")
    if arrange.get("empty"):
        db[LOCKS].insert_one({"_id": LOCK_ID})
    else:
        hold_lock(db, age_ms=arrange["age_ms"], ttl_ms=arrange["ttl_ms"] or 1)
        if arrange["ttl_ms"] is None:
            db[LOCKS].update_one({"_id": LOCK_ID}, {"$unset": {"ttlMs": ""}})

    shown = cli("lock", "--json").json
    audit = check(cli("audit", "--json").json, "lock")
    up = cli("up", "--json")

    if up_gets_it:
        assert up.exit_code == 0, up.stdout
        assert calls(db) == ["0001_a"] and db[LOCKS].count_documents({}) == 0
    else:
        refused(up, "LOCK_ALREADY_HELD", 3)
        assert calls(db) == [] and db[LOCKS].find_one()["owner"] == "someone-else"
    expected_audit = {"held": "pass", "expired": "warn", "free": "pass"}[state]
    assert audit["status"] == expected_audit, audit
    if state == "expired":
        assert re.search(r"past its TTL of \d+s", audit["detail"])
    assert shown["state"] == state and shown["held"] is (state != "free")
    assert "problems" not in shown


def test_an_expired_lock_is_shown_as_expired(cli: Any, project: Any, db: Any) -> None:
    hold_lock(db, age_ms=120_000, ttl_ms=60_000)
    result = cli("lock")
    assert result.exit_code == 0
    assert result.stdout.startswith("Lock held by pid 4242 on other-host (other-user) since ")
    assert ("⚠ Past its TTL of 60s (likely a crashed run): the next run reclaims it"
            in result.stderr)


def test_a_lock_document_in_the_near_future_is_within_clock_skew(
    cli: Any, project: Any, db: Any
) -> None:
    """A fresh lock stamped by a primary whose clock is a little ahead is an ordinary lock."""
    hold_lock(db)
    db[LOCKS].update_one({"_id": LOCK_ID}, [{"$set": {"lockedAt": {"$add": ["$$NOW", 1_000]}}}])
    shown = cli("lock", "--json").json
    assert shown["state"] == "held" and "problems" not in shown


# ---------------------------------------------------------- applied records without a file (12)


def test_audit_names_applied_records_whose_file_is_missing(
    cli: Any, project: Any, db: Any
) -> None:
    applied_two(cli, project)
    (project.migrations / "0001_a.py").unlink()
    before = snapshot(db)

    result = cli("audit", "--json")

    assert result.exit_code == 0, result.stderr  # a warning: imported records may have no file
    assert check(result.json, "files") == {
        "name": "files", "status": "warn",
        "detail": "Applied but not on disk (down cannot revert them): 0001_a.py"}
    assert snapshot(db) == before


def test_audit_files_passes_when_every_applied_record_has_its_file(
    cli: Any, project: Any, db: Any
) -> None:
    applied_two(cli, project)
    (project.migrations / "0002_b.py").rename(project.migrations / "0003_b.py")  # now pending
    db[CHANGELOG].update_one({"name": "0002_b.py"}, {"$set": {"status": "reverted"}})
    result = cli("audit", "--json")
    assert check(result.json, "files") == {
        "name": "files", "status": "pass", "detail": "Every applied migration has its file"}

