"""``migronaut import``: adopting the changelog of migrate-mongo and the metastore of
mongodb-migrations (reference core §11.1), through the API and the CLI.

Each test builds the other tool's collection in the test database the way that tool writes it:

* migrate-mongo: ``changelog`` documents ``{fileName, appliedAt, fileHash?, migrationBlock?}``;
* mongodb-migrations 1.3 (``MigrationManager._create_migration``): ``database_migrations``
  documents ``{migration_datetime: "<leading digits of the file>", created_at: datetime.now()}``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    LOCKS,
    Events,
    applied,
    calls,
    hold_lock,
    make_migrator,
    records,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    ImportTargetNotEmptyError,
    IrreversibleMigrationError,
    RunAbortedError,
)
from migronaut.core.adopt import match_file
from migronaut.core.files import checksum_bytes

T1 = dt.datetime(2020, 1, 1, 12, 0, 5)
T2 = dt.datetime(2020, 1, 2, 12, 0, 7)
T3 = dt.datetime(2020, 1, 3, 9, 30, 0)
BLOCK1 = 1_577_880_005_000
BLOCK2 = 1_577_966_407_000

ADD_USERS = "20200101120000_add_users.py"
ADD_INDEX = "20200102120000_add_index.py"
NEW = "20200301000000_new_field.py"


def file_checksum(project: Any, name: str) -> str:
    return checksum_bytes((project.migrations / name).read_bytes())


def snapshot(db: Any) -> tuple[Any, ...]:
    """What a refused import must leave alone: the changelog, the lock, the bodies' traces."""
    return (
        list(db[CHANGELOG].find({}, {"_id": 0}).sort("name", 1)),
        list(db[LOCKS].find({})),
        calls(db),
    )


@pytest.fixture
def migrate_mongo(project: Any, db: Any) -> Any:
    """A migrate-mongo project rewritten in Python: two JS migrations ran, one new .py file."""
    write_simple(project, ADD_USERS[:-3], ADD_INDEX[:-3], NEW[:-3])
    db["changelog"].insert_many([
        # Inserted newest first: the import orders by migrationBlock, not by insertion.
        {"fileName": "20200102120000-add_index.js", "appliedAt": T2, "migrationBlock": BLOCK2,
         "fileHash": "1" * 64},
        {"fileName": "20200101120000-add-users.js", "appliedAt": T1, "migrationBlock": BLOCK1,
         "fileHash": "0" * 64},
    ])
    return project


@pytest.fixture
def mongodb_migrations(project: Any, db: Any) -> Any:
    """A mongodb-migrations project: two versions applied, one new file."""
    write_simple(project, ADD_USERS[:-3], ADD_INDEX[:-3], NEW[:-3])
    db["database_migrations"].insert_many([
        {"migration_datetime": "20200102120000", "created_at": T2},
        {"migration_datetime": "20200101120000", "created_at": T1},
    ])
    return project


# ---------------------------------------------------------------------- migrate-mongo (API)


def test_migrate_mongo_import_then_up_runs_only_the_new_file(
    migrate_mongo: Any, db: Any
) -> None:
    source_before = list(db["changelog"].find({}))
    with make_migrator(migrate_mongo) as migrator:
        result = migrator.import_changelog()
        assert (result.source, result.target, result.origin) == (
            "changelog", CHANGELOG, "migrate-mongo")
        assert (result.imported, result.skipped, result.dry_run) == (2, 0, False)
        assert [(r.file, r.source_name, r.batch, r.applied_at, r.checksum_source)
                for r in result.rows] == [
            (ADD_USERS, "20200101120000-add-users.js", 1, T1, "recomputed"),
            (ADD_INDEX, "20200102120000-add_index.js", 2, T2, "recomputed"),
        ]
        stored = records(db)
        for name, when, batch in ((ADD_USERS, T1, 1), (ADD_INDEX, T2, 2)):
            record = stored[name]
            assert record["status"] == "applied" and record["origin"] == "migrate-mongo"
            assert record["appliedAt"] == when and record["firstAppliedAt"] == when
            assert record["batch"] == batch and record["duration"] == 0
            assert record["environment"] == "imported"
            assert record["executedBy"] == "migronaut-import"
            assert record["checksum"] == file_checksum(migrate_mongo, name)
            assert isinstance(record["runId"], str) and record["runId"]
        assert list(db["changelog"].find({})) == source_before  # the source is only read

        assert [(r.file, r.status, r.batch) for r in migrator.up()] == [(NEW, "applied", 3)]
    assert calls(db, "up") == [NEW[:-3]]
    assert applied(db) == [ADD_USERS, ADD_INDEX, NEW]


def test_imported_records_are_forward_only(migrate_mongo: Any, db: Any) -> None:
    with make_migrator(migrate_mongo) as migrator:
        migrator.import_changelog()
        migrator.up()
        assert [r.file for r in migrator.down()] == [NEW]  # the native batch reverts
        before = snapshot(db)
        refusals = [
            lambda: migrator.down(),  # the highest applied batch is now an imported one
            lambda: migrator.down(ADD_USERS),
            lambda: migrator.down(steps=1),
            lambda: migrator.down(batch=1),
            lambda: migrator.redo(),
            lambda: migrator.redo(ADD_INDEX),
            lambda: migrator.dry_run("down"),
            lambda: migrator.dry_run("down", ADD_USERS),
        ]
        for refuse in refusals:
            with pytest.raises(IrreversibleMigrationError) as info:
                refuse()
            assert info.value.exit_code == 13 and info.value.code == "MIGRATION_IRREVERSIBLE"
            assert "imported from migrate-mongo" in info.value.message
            assert "without migronaut running them" in info.value.message
            assert set(info.value.context["names"]) <= {ADD_USERS, ADD_INDEX}
            assert snapshot(db) == before


def test_order_is_migration_block_then_applied_at_then_file_name(project: Any, db: Any) -> None:
    db["changelog"].insert_many([
        {"fileName": "c.js", "appliedAt": T1, "migrationBlock": BLOCK2},
        {"fileName": "b.js", "appliedAt": T3},  # no block: its appliedAt (epoch ms) ranks it
        {"fileName": "a.js", "appliedAt": T2, "migrationBlock": BLOCK2},
        {"fileName": "d.js", "appliedAt": T3, "migrationBlock": BLOCK1},
    ])
    with make_migrator(project) as migrator:
        result = migrator.import_changelog()
    assert [(r.file, r.batch) for r in result.rows] == [
        ("d.js", 1), ("a.js", 2), ("c.js", 3), ("b.js", 4)
    ]


def test_source_docs_without_a_usable_file_name_are_skipped_and_counted(
    project: Any, db: Any, cli: Any
) -> None:
    write_simple(project, "20200101120000_ok")
    db["changelog"].insert_many([
        {"fileName": "20200101120000-ok.js", "appliedAt": T1},
        {"appliedAt": T1},
        {"fileName": "", "appliedAt": T1},
        {"fileName": 42, "appliedAt": T1},
        {"fileName": "   ", "appliedAt": T1},
        {"fileName": {"$ne": None}, "appliedAt": T1},
    ])
    result = cli("import", "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.json["imported"], result.json["skipped"]) == (1, 5)
    assert result.stderr.count("⚠ Skipping source doc without a usable fileName") == 5
    assert [r["name"] for r in db[CHANGELOG].find({})] == ["20200101120000_ok.py"]


def test_missing_file_keeps_the_recorded_name_and_warns(project: Any, db: Any, cli: Any) -> None:
    db["changelog"].insert_many([
        {"fileName": "20190101000000-gone.js", "appliedAt": T1},
        {"fileName": "20190102000000-gone-too.js", "appliedAt": T2, "fileHash": "ab" * 32},
    ])
    result = cli("import", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["file"]: r for r in result.json["rows"]}
    assert rows["20190101000000-gone.js"]["checksumSource"] == "missing"
    assert rows["20190101000000-gone.js"]["checksum"] == ""
    assert rows["20190102000000-gone-too.js"]["checksumSource"] == "reused"
    assert rows["20190102000000-gone-too.js"]["checksum"] == "ab" * 32
    assert "⚠ File not found on disk: 20190101000000-gone.js — checksum unverifiable" in (
        result.stderr)
    stored = records(db)
    assert stored["20190101000000-gone.js"]["checksum"] == ""
    assert stored["20190102000000-gone-too.js"]["checksum"] == "ab" * 32


def test_a_source_hash_equal_to_the_file_is_reused_and_trust_hash_reuses_any(
    project: Any, db: Any
) -> None:
    write_simple(project, "20200101120000_same", "20200102120000_other")
    same = file_checksum(project, "20200101120000_same.py")
    db["changelog"].insert_many([
        {"fileName": "20200101120000_same.py", "appliedAt": T1, "fileHash": same},
        {"fileName": "20200102120000_other.py", "appliedAt": T2, "fileHash": "f" * 64},
        {"fileName": "20200103120000_nohash.py", "appliedAt": T3},
    ])
    with make_migrator(project) as migrator:
        plain = migrator.import_changelog(dry_run=True)
        trusted = migrator.import_changelog(dry_run=True, trust_hash=True)
    assert [(r.checksum, r.checksum_source) for r in plain.rows] == [
        (same, "reused"),
        (file_checksum(project, "20200102120000_other.py"), "recomputed"),
        ("", "missing"),
    ]
    assert [(r.checksum, r.checksum_source) for r in trusted.rows] == [
        (same, "reused"), ("f" * 64, "reused"), ("", "missing")
    ]


def test_non_empty_target_needs_force_and_a_forced_reimport_is_stable(
    migrate_mongo: Any, db: Any
) -> None:
    with make_migrator(migrate_mongo) as migrator:
        first = migrator.import_changelog()
        stored = records(db)
        before = snapshot(db)
        with pytest.raises(ImportTargetNotEmptyError) as info:
            migrator.import_changelog()
        assert info.value.exit_code == 17 and info.value.context["target"] == CHANGELOG
        assert snapshot(db) == before

        again = migrator.import_changelog(force=True)
    assert [(r.file, r.batch) for r in again.rows] == [(r.file, r.batch) for r in first.rows]
    for name, record in records(db).items():
        assert {k: v for k, v in record.items() if k != "runId"} == {
            k: v for k, v in stored[name].items() if k != "runId"}
    assert db[CHANGELOG].count_documents({}) == 2


def test_forced_import_numbers_batches_after_the_records_it_does_not_import(
    migrate_mongo: Any, db: Any
) -> None:
    write_simple(migrate_mongo, "20100101000000_native")
    with make_migrator(migrate_mongo) as migrator:
        migrator.up("20100101000000_native.py")
        migrator.up("20100101000000_native.py", force=True)  # batch 2: max batch counts all
        result = migrator.import_changelog(force=True)
    assert [r.batch for r in result.rows] == [3, 4]
    native = records(db)["20100101000000_native.py"]
    assert "origin" not in native and native["batch"] == 2


def test_dry_run_writes_nothing_takes_no_lock_and_emits_no_event(
    migrate_mongo: Any, db: Any
) -> None:
    with make_migrator(migrate_mongo) as migrator:
        events = Events(migrator)
        hold_lock(db)  # a dry run does not need the lock
        before = snapshot(db)
        result = migrator.import_changelog(dry_run=True)
    assert result.dry_run and result.imported == 0 and result.would_import == 2
    assert [r.batch for r in result.rows] == [1, 2]
    assert snapshot(db) == before
    assert events.items == []


def test_dry_run_into_a_non_empty_target_predicts_the_refusal(
    migrate_mongo: Any, db: Any, cli: Any
) -> None:
    """A dry run answers what the real import would: without --force a non-empty target is
    ``IMPORT_TARGET_NOT_EMPTY`` (exit 17) both ways, nothing written; with --force the preview."""
    assert cli("import").exit_code == 0
    before = snapshot(db)
    for mode in ((), ("--json",)):
        real = cli("import", *mode)
        dry = cli("import", "--dry-run", *mode)
        for result in (real, dry):
            assert result.exit_code == 17, result.stderr
            assert f'The target changelog "{CHANGELOG}" already has records — pass --force to ' \
                "merge the import into it" in result.stderr
            assert "Traceback" not in result.stderr
            if mode:
                assert result.json["error"]["code"] == "IMPORT_TARGET_NOT_EMPTY"
                assert result.json["error"]["context"]["target"] == CHANGELOG
        assert "Would import" not in dry.stdout + dry.stderr
        assert snapshot(db) == before
    forced = cli("import", "--dry-run", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert f'◎ Dry-run  Would import 2 record(s) from "changelog" → "{CHANGELOG}"' in (
        forced.stdout)
    assert snapshot(db) == before


def test_empty_or_missing_source(project: Any, db: Any, cli: Any) -> None:
    result = cli("import", "--from", "nothing_here", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json == {"source": "nothing_here", "target": CHANGELOG, "imported": 0,
                           "skipped": 0, "dryRun": False, "rows": [], "origin": "migrate-mongo"}
    assert 'Nothing to import from "nothing_here"' in result.stderr
    assert db[CHANGELOG].count_documents({}) == 0


def test_to_another_collection_gets_its_own_indexes(migrate_mongo: Any, db: Any) -> None:
    with make_migrator(migrate_mongo) as migrator:
        result = migrator.import_changelog(target="adopted")
    assert result.target == "adopted" and result.imported == 2
    assert db[CHANGELOG].count_documents({}) == 0
    assert sorted(d["name"] for d in db["adopted"].find({})) == [ADD_USERS, ADD_INDEX]
    assert {"name_unique", "status_batch", "batch", "status_name",
            "status_appliedAt_name"} <= set(db["adopted"].index_information())


def test_an_ambiguous_record_refuses_the_whole_import(project: Any, db: Any) -> None:
    write_simple(project, "20200101120000_one", "20200101120000_two", "20200102120000_fine")
    db["changelog"].insert_many([
        {"fileName": "20200102120000-fine.js", "appliedAt": T1},
        {"fileName": "20200101120000-something.js", "appliedAt": T2},
    ])
    with make_migrator(project) as migrator, pytest.raises(ConfigInvalidError) as info:
        migrator.import_changelog()
    assert info.value.exit_code == 6
    assert "Cannot tell which migration file '20200101120000-something.js' stands for: " \
        "20200101120000_one.py, 20200101120000_two.py" in info.value.message
    assert db[CHANGELOG].count_documents({}) == 0


def test_two_records_for_one_file_import_the_first_and_skip_the_rest(
    project: Any, db: Any
) -> None:
    write_simple(project, "20200101120000_users")
    db["changelog"].insert_many([
        {"fileName": "20200101120000-users.js", "appliedAt": T1},
        {"fileName": "20200101120000-users.ts", "appliedAt": T2},
    ])
    with make_migrator(project) as migrator:
        result = migrator.import_changelog()
    assert (result.imported, result.skipped) == (1, 1)
    assert [(r.file, r.source_name) for r in result.rows] == [
        ("20200101120000_users.py", "20200101120000-users.js")]


@pytest.mark.parametrize(
    ("recorded", "files", "expected"),
    [
        ("20200101120000-add-users.js", ["20200101120000-add-users.js"],
         "20200101120000-add-users.js"),
        ("20200101120000-add-users.js", ["20200101120000_add_users.py", "20200101120001_x.py"],
         "20200101120000_add_users.py"),
        ("20200101120000-Add Users.js", ["20200101120000_add_users.py"],
         "20200101120000_add_users.py"),
        ("20200101120000-renamed.js", ["20200101120000_add_users.py"],
         "20200101120000_add_users.py"),
        ("20200101120000", ["20200101120000_add_users.py", "2020010112000_x.py"],
         "20200101120000_add_users.py"),
        ("20200101120000", ["202001011200001_x.py"], None),
        ("add-users.js", ["add_users.py"], "add_users.py"),
        ("add-users.js", ["other.py"], None),
        ("0001-a.js", ["0001_a.py", "0001_b.py"], "0001_a.py"),  # the stem decides first
    ],
)
def test_match_file_rules(recorded: str, files: list[str], expected: str | None) -> None:
    assert match_file(recorded, files) == expected


# ----------------------------------------------------------------- mongodb-migrations (API)


def test_mongodb_migrations_import_then_up_runs_only_the_new_file(
    mongodb_migrations: Any, db: Any
) -> None:
    with make_migrator(mongodb_migrations) as migrator:
        result = migrator.import_changelog("mongodb-migrations")
        assert (result.source, result.origin, result.imported) == (
            "database_migrations", "mongodb-migrations", 2)
        assert [(r.file, r.source_name, r.batch, r.applied_at, r.checksum_source)
                for r in result.rows] == [
            (ADD_USERS, "20200101120000", 1, T1, "recomputed"),
            (ADD_INDEX, "20200102120000", 2, T2, "recomputed"),
        ]
        stored = records(db)
        assert {stored[n]["origin"] for n in (ADD_USERS, ADD_INDEX)} == {"mongodb-migrations"}
        assert stored[ADD_USERS]["checksum"] == file_checksum(mongodb_migrations, ADD_USERS)
        assert [r.file for r in migrator.up()] == [NEW]
        assert calls(db, "up") == [NEW[:-3]]
        migrator.down()
        before = snapshot(db)
        with pytest.raises(IrreversibleMigrationError) as info:
            migrator.down()
        assert "imported from mongodb-migrations" in info.value.message
        with pytest.raises(IrreversibleMigrationError):
            migrator.dry_run("down")
        assert snapshot(db) == before


def test_mongodb_migrations_docs_without_a_version_are_skipped(project: Any, db: Any) -> None:
    write_simple(project, "20200101120000_a")
    db["database_migrations"].insert_many([
        {"migration_datetime": "20200101120000", "created_at": T1},
        {"created_at": T1},
        {"migration_datetime": 20200101120000, "created_at": T1},
        {"migration_datetime": "2020-01-01", "created_at": T1},
        {"migration_datetime": "", "created_at": T1},
    ])
    with make_migrator(project) as migrator:
        result = migrator.import_changelog("mongodb-migrations")
    assert (result.imported, result.skipped) == (1, 4)
    assert applied(db) == ["20200101120000_a.py"]


def test_mongodb_migrations_custom_metastore(project: Any, db: Any) -> None:
    write_simple(project, "20200101120000_a")
    db["my_metastore"].insert_one({"migration_datetime": "20200101120000", "created_at": T1})
    with make_migrator(project) as migrator:
        result = migrator.import_changelog("mongodb-migrations", source="my_metastore")
    assert result.source == "my_metastore" and result.imported == 1


# ------------------------------------------------------------------------------ run, events


def test_events_and_lock_of_an_import_run(migrate_mongo: Any, db: Any) -> None:
    with make_migrator(migrate_mongo) as migrator:
        events = Events(migrator)
        migrator.import_changelog()
    assert events.names == ["run:start", "lock:acquired", "lock:released", "run:end"]
    start, end = events.of("run:start")[0], events.of("run:end")[0]
    assert start["command"] == "import" and start["direction"] is None
    assert end["command"] == "import" and end["success"] is True
    assert (end["imported"], end["skipped"], end["total"], end["applied"]) == (2, 0, 2, 0)
    assert start["runId"] == end["runId"] == records(db)[ADD_USERS]["runId"]
    assert db[LOCKS].count_documents({}) == 0


def test_a_failed_import_ends_its_run_unsuccessfully(migrate_mongo: Any, db: Any) -> None:
    db[CHANGELOG].insert_one({"name": "x.py", "status": "applied", "batch": 1,
                              "appliedAt": dt.datetime(2024, 1, 1)})
    with make_migrator(migrate_mongo) as migrator:
        events = Events(migrator)
        with pytest.raises(ImportTargetNotEmptyError):
            migrator.import_changelog()
    end = events.of("run:end")[0]
    assert end["command"] == "import" and end["success"] is False
    assert "already has records" in end["error"]
    assert db[LOCKS].count_documents({}) == 0


def test_stop_before_the_write_aborts_and_writes_nothing(migrate_mongo: Any, db: Any) -> None:
    with make_migrator(migrate_mongo) as migrator:
        migrator.on("lock:acquired", lambda _: migrator.stop("Received SIGINT"))
        with pytest.raises(RunAbortedError):
            migrator.import_changelog()
    assert db[CHANGELOG].count_documents({}) == 0
    assert db[LOCKS].count_documents({}) == 0


# ---------------------------------------------------------------------------------- the CLI


def test_cli_import_table_and_lines(migrate_mongo: Any, db: Any, cli: Any) -> None:
    result = cli("import", "--no-color")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for column in ("Migration", "Batch", "Applied At", "Checksum"):
        assert column in out
    assert f"{ADD_USERS} ← 20200101120000-add-users.js" in out
    assert out.count("recomputed") == 2
    assert f'✔ Imported 2 record(s) from "changelog" → "{CHANGELOG}"' in out
    assert out.index("✔ Imported") < out.index("Migration")
    assert result.stderr == ""
    assert cli("up").exit_code == 0
    assert calls(db, "up") == [NEW[:-3]]


def test_cli_import_json_shape(mongodb_migrations: Any, cli: Any) -> None:
    result = cli("import", "--tool", "mongodb-migrations", "--json")
    assert result.exit_code == 0, result.stderr
    document = result.json
    assert {k: v for k, v in document.items() if k != "rows"} == {
        "source": "database_migrations", "target": CHANGELOG, "imported": 2, "skipped": 0,
        "dryRun": False, "origin": "mongodb-migrations"}
    first = document["rows"][0]
    assert set(first) == {"file", "batch", "appliedAt", "checksum", "checksumSource",
                          "sourceName"}
    assert first["file"] == ADD_USERS and first["sourceName"] == "20200101120000"
    assert first["appliedAt"] == "2020-01-01T12:00:05.000Z"
    assert first["batch"] == 1 and first["checksumSource"] == "recomputed"


def test_cli_down_of_an_imported_record_exits_13(migrate_mongo: Any, db: Any, cli: Any) -> None:
    assert cli("import").exit_code == 0
    before = snapshot(db)
    for args in (("down",), ("down", ADD_USERS), ("redo",), ("dry-run", "down")):
        result = cli(*args, "--json")
        assert result.exit_code == 13, (args, result.stderr)
        assert result.json["error"]["code"] == "MIGRATION_IRREVERSIBLE"
        assert "forward-only" in result.json["error"]["message"]
        origins = result.json["error"]["context"]["origins"]
        assert len(origins) == 1 and set(origins.values()) == {"migrate-mongo"}
        human = cli(*args)
        assert human.exit_code == 13
        assert "✖ MIGRATION_IRREVERSIBLE: Cannot roll back 1 forward-only migration(s): " in (
            human.stderr)
        assert snapshot(db) == before


def test_cli_non_empty_target_exits_17(migrate_mongo: Any, db: Any, cli: Any) -> None:
    write_simple(migrate_mongo, "20100101000000_native")
    assert cli("up", "20100101000000_native.py").exit_code == 0
    before = snapshot(db)
    result = cli("import", "--json")
    assert result.exit_code == 17
    assert result.json["error"]["code"] == "IMPORT_TARGET_NOT_EMPTY"
    assert "pass --force" in result.json["error"]["message"]
    assert snapshot(db) == before
    human = cli("import")
    assert human.exit_code == 17 and "✖ IMPORT_TARGET_NOT_EMPTY: " in human.stderr
    assert snapshot(db) == before
    assert cli("import", "--force").exit_code == 0
    assert applied(db) == ["20100101000000_native.py", ADD_USERS, ADD_INDEX]


@pytest.mark.parametrize(
    ("tool", "source", "record", "field"),
    [
        ("migrate-mongo", "changelog",
         {"fileName": "20200101120000-add-users.js", "appliedAt": "yesterday"}, "appliedAt"),
        ("mongodb-migrations", "database_migrations",
         {"migration_datetime": "20200101120000", "created_at": 1577880000}, "created_at"),
    ],
)
def test_a_source_record_without_a_date_refuses_the_whole_import(
    project: Any, db: Any, cli: Any, tool: str, source: str, record: dict[str, Any], field: str
) -> None:
    """The date is kept verbatim as ``appliedAt``: a record every later command would refuse
    (``STATE_INVALID``) is refused by the import first, dry run included, nothing written."""
    write_simple(project, ADD_USERS[:-3], ADD_INDEX[:-3])
    db[source].insert_one(record)
    before = snapshot(db)
    for extra in ((), ("--dry-run",)):
        result = cli("import", "--tool", tool, "--json", *extra)
        assert result.exit_code == 35, result.stderr
        error = result.json["error"]
        assert error["code"] == "STATE_INVALID"
        assert f'Cannot import from "{source}": record ' in error["message"]
        assert f"{field} " in error["message"] and "is not a date" in error["message"]
        assert error["context"]["problems"][0]["field"] == field
        assert snapshot(db) == before  # no record imported, the lock released
    assert db[CHANGELOG].count_documents({}) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--from", "$bad"), "--from must be a valid collection name"),
        (("--from", "system.users"), "--from must be a valid collection name"),
        (("--from", ""), "--from must be a non-empty string"),
        (("--to", "a$b"), "--to must be a valid collection name"),
        (("--to", "system.profile"), "--to must be a valid collection name"),
        (("--from", "same", "--to", "same"), "--from and --to name the same collection"),
        (("--from", CHANGELOG), "--from and --to name the same collection"),
        (("--tool", "flyway"), "--tool must be one of 'migrate-mongo', 'mongodb-migrations'"),
        (("--reason", ""), "reason must be a non-empty string"),
    ],
)
def test_cli_bad_import_options_exit_6_and_write_nothing(
    migrate_mongo: Any, db: Any, cli: Any, args: tuple[str, ...], message: str
) -> None:
    before = snapshot(db)
    for mode in ((), ("--json",)):
        result = cli("import", *args, *mode)
        assert result.exit_code == 6, result.stderr
        assert "✖ CONFIG_INVALID: " in result.stderr and message in result.stderr
        if mode:
            assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert snapshot(db) == before


def test_cli_bad_options_are_refused_before_connecting(cli: Any) -> None:
    result = cli("import", "--from", "$x", "--uri", "mongodb://127.0.0.1:1/?"
                 "serverSelectionTimeoutMS=200")
    assert result.exit_code == 6


def test_cli_lock_held_exits_3_and_no_lock_works(migrate_mongo: Any, db: Any, cli: Any) -> None:
    hold_lock(db)
    before = snapshot(db)
    result = cli("import", "--json")
    assert result.exit_code == 3
    assert result.json["error"]["code"] == "LOCK_ALREADY_HELD"
    assert snapshot(db) == before
    unlocked = cli("import", "--no-lock")
    assert unlocked.exit_code == 0, unlocked.stderr
    assert "⚠ Running without a lock (--no-lock)" in unlocked.stderr
    assert applied(db) == [ADD_USERS, ADD_INDEX]


def test_cli_dry_run_shows_the_table_and_writes_nothing(
    migrate_mongo: Any, db: Any, cli: Any
) -> None:
    before = snapshot(db)
    result = cli("import", "--dry-run", "--no-color")
    assert result.exit_code == 0, result.stderr
    assert f'◎ Dry-run  Would import 2 record(s) from "changelog" → "{CHANGELOG}"' in (
        result.stdout)
    assert f"{ADD_INDEX} ← 20200102120000-add_index.js" in result.stdout
    assert snapshot(db) == before
    as_json = cli("import", "--dry-run", "--json")
    assert as_json.json["dryRun"] is True and as_json.json["imported"] == 0
    assert as_json.json["wouldImport"] == 2
    assert snapshot(db) == before


def test_cli_reason_is_recorded(migrate_mongo: Any, db: Any, cli: Any) -> None:
    assert cli("import", "--reason", "adopt OPS-12").exit_code == 0
    assert {r["reason"] for r in records(db).values()} == {"adopt OPS-12"}


# ------------------------------------------------------------- a dry run writes nothing at all


def collections_and_indexes(db: Any) -> dict[str, list[str]]:
    """Every collection of the database (``listCollections``) with its index names."""
    return {name: sorted(db[name].index_information()) for name in
            sorted(db.list_collection_names())}


@pytest.mark.parametrize("args", [("import", "--dry-run"), ("import", "--dry-run", "--json"),
                                  ("import", "--dry-run", "--to", "adopted"),
                                  ("baseline", "--dry-run")])
def test_a_dry_run_on_a_fresh_database_creates_no_collection_and_no_index(
    migrate_mongo: Any, db: Any, cli: Any, args: tuple[str, ...]
) -> None:
    before = collections_and_indexes(db)
    assert CHANGELOG not in before
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    assert collections_and_indexes(db) == before


def test_a_dry_run_reports_what_it_would_import_in_a_field_that_says_so(
    migrate_mongo: Any, db: Any, cli: Any
) -> None:
    result = cli("import", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    document = result.json
    assert (document["dryRun"], document["imported"], document["wouldImport"]) == (True, 0, 2)
    assert [row["file"] for row in document["rows"]] == [ADD_USERS, ADD_INDEX]
    real = cli("import", "--json")
    assert (real.json["dryRun"], real.json["imported"]) == (False, 2)
    assert "wouldImport" not in real.json


def test_a_dry_run_then_a_real_import_on_one_migrator_still_creates_the_indexes(
    migrate_mongo: Any, db: Any
) -> None:
    with make_migrator(migrate_mongo) as migrator:
        migrator.import_changelog(dry_run=True)
        assert CHANGELOG not in db.list_collection_names()
        migrator.import_changelog()
    assert "name_unique" in db[CHANGELOG].index_information()


# ------------------------------------------------------------------ unsafe recorded names


@pytest.mark.parametrize(("tool", "field", "collection", "extra"), [
    ("migrate-mongo", "fileName", "changelog", {"appliedAt": T1}),
    ("migronaut", "name", CHANGELOG, {"status": "applied", "appliedAt": T1, "batch": 1}),
])
@pytest.mark.parametrize("unsafe", ["../../etc/passwd", "..", "a/b.js", "a\\b.js", "$where.js"])
def test_a_path_like_recorded_name_refuses_the_whole_import_with_exit_19(
    project: Any, db: Any, cli: Any, tool: str, field: str, collection: str,
    extra: dict[str, Any], unsafe: str,
) -> None:
    write_simple(project, "20200101120000_ok")
    db[collection].insert_many([{field: "20200101120000-ok.js", **extra},
                                {field: unsafe, **extra}])
    before = collections_and_indexes(db), list(db[collection].find({}, {"_id": 0}))
    for args in (("import", "--tool", tool, "--dry-run"), ("import", "--tool", tool)):
        result = cli(*args)
        assert result.exit_code == 19, (args, result.stdout + result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.startswith("✖")]
        assert len(lines) == 1 and lines[0].startswith("✖ MIGRATION_INVALID_NAME: ")
        assert repr(unsafe) in lines[0]
        as_json = cli(*args, "--json")
        assert as_json.exit_code == 19
        assert as_json.json["error"]["code"] == "MIGRATION_INVALID_NAME"
        if "--dry-run" in args:  # not even a collection or an index
            assert (collections_and_indexes(db), list(db[collection].find({}, {"_id": 0}))) \
                == before
    # the real import was refused before its first write: no record, the lock released
    assert list(db[collection].find({}, {"_id": 0})) == before[1]
    if collection != CHANGELOG:
        assert db[CHANGELOG].count_documents({}) == 0
    assert db[LOCKS].count_documents({}) == 0


# --------------------------------------------------------------- from the Node.js migronaut


def node_record(name: str, batch: int, applied_at: dt.datetime, **extra: Any) -> dict[str, Any]:
    """A changelog record as the Node.js migronaut writes it."""
    return {"name": name, "batch": batch, "status": "applied", "appliedAt": applied_at,
            "checksum": "c" * 64, "duration": 12, "environment": "production",
            "executedBy": "node-ci", "runId": f"run-{batch}", **extra}


@pytest.fixture
def node_project(project: Any, db: Any) -> Any:
    """A Node.js migronaut project moving to Python: its records in `_migronaut_migrations`
    (``.js``, ``.ts``, ``.mjs``), the migrations rewritten as ``.py`` files, plus one new file."""
    write_simple(project, "20240101000000_create_users", "20240102000000_add_email_index",
                 "20240103000000_backfill_names", "20240201000000_new_in_python")
    db[CHANGELOG].insert_many([
        node_record("20240102000000-add-email-index.ts", 1, T2),
        node_record("20240101000000-create-users.js", 1, T1),
        node_record("20240103000000-backfill-names.mjs", 2, T3),
        # reverted in Node: not applied, so not imported (the .py file stays pending? no:)
        node_record("20231201000000-dropped.cjs", 1, T1, status="reverted"),
    ])
    return project


def test_node_migronaut_records_map_onto_the_py_files_by_stem(
    node_project: Any, db: Any, cli: Any
) -> None:
    node_before = list(db[CHANGELOG].find({"name": {"$regex": r"\.(js|ts|mjs|cjs)$"}}))
    preview = cli("import", "--tool", "migronaut", "--dry-run", "--json")
    assert preview.exit_code == 0, preview.stderr
    assert preview.json["wouldImport"] == 3 and preview.json["imported"] == 0
    assert db[CHANGELOG].count_documents({}) == 4  # nothing written

    result = cli("import", "--tool", "migronaut", "--json")
    assert result.exit_code == 0, result.stderr
    document = result.json
    assert (document["source"], document["target"], document["origin"]) == (
        CHANGELOG, CHANGELOG, "migronaut-node")
    assert [(r["file"], r["sourceName"]) for r in document["rows"]] == [
        ("20240101000000_create_users.py", "20240101000000-create-users.js"),
        ("20240102000000_add_email_index.py", "20240102000000-add-email-index.ts"),
        ("20240103000000_backfill_names.py", "20240103000000-backfill-names.mjs"),
    ]
    stored = records(db)
    for row in document["rows"]:
        record = stored[row["file"]]
        # not "migronaut": in the original's storage that marks a native record
        assert record["origin"] == "migronaut-node" and record["status"] == "applied"
        assert record["checksum"] == file_checksum(node_project, row["file"])
        assert record["batch"] > 2  # after the Node batches, which stay as they are
    # the Node records are left exactly as they were
    assert list(db[CHANGELOG].find({"name": {"$regex": r"\.(js|ts|mjs|cjs)$"}})) == node_before

    assert cli("up").exit_code == 0
    assert calls(db, "up") == ["20240201000000_new_in_python"]
    refused = cli("down", "20240101000000_create_users.py")
    assert refused.exit_code == 13  # imported records are forward-only


def test_node_import_in_place_needs_force_once_python_records_exist_and_is_stable(
    node_project: Any, db: Any, cli: Any
) -> None:
    assert cli("import", "--tool", "migronaut").exit_code == 0
    first = records(db)
    again = cli("import", "--tool", "migronaut", "--json")
    assert again.exit_code == 17, again.stdout
    forced = cli("import", "--tool", "migronaut", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert {n: (r["batch"], r["checksum"]) for n, r in records(db).items()} == {
        n: (r["batch"], r["checksum"]) for n, r in first.items()}


def test_a_node_record_without_a_py_file_is_left_as_it_is(
    node_project: Any, db: Any, cli: Any
) -> None:
    (node_project.migrations / "20240103000000_backfill_names.py").unlink()
    node_record_before = db[CHANGELOG].find_one({"name": "20240103000000-backfill-names.mjs"})
    result = cli("import", "--tool", "migronaut", "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.json["imported"], result.json["skipped"]) == (2, 1)
    assert "⚠ Skipping 20240103000000-backfill-names.mjs: no migration file stands for it" in (
        result.stderr)
    assert db[CHANGELOG].find_one({"name": "20240103000000-backfill-names.mjs"}) == (
        node_record_before)


def test_node_import_into_another_collection(node_project: Any, db: Any, cli: Any) -> None:
    result = cli("import", "--tool", "migronaut", "--to", "adopted", "--json")
    assert result.exit_code == 0, result.stderr
    assert sorted(d["name"] for d in db["adopted"].find({})) == [
        "20240101000000_create_users.py", "20240102000000_add_email_index.py",
        "20240103000000_backfill_names.py"]
