"""The changelog as stored (reference core §4): record shape, clocks, indexes, batches, failures."""

from __future__ import annotations

import datetime as dt
import json
import types
from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    LOCKS,
    applied,
    calls,
    make_migrator,
    recording_body,
    records,
    server_now,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    ConnectionFailedError,
    MigrationExecutionFailedError,
    MigrationInvalidExportError,
    Migrator,
)
from migronaut.core import changelog as changelog_module
from migronaut.core.files import checksum_bytes

APPLIED_FIELDS = {
    "_id",
    "name",
    "batch",
    "status",
    "appliedAt",
    "firstAppliedAt",
    "duration",
    "checksum",
    "environment",
    "executedBy",
    "runId",
    "description",
}


def test_applied_record_shape(project: Any, db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGRONAUT_USER", "deploy-bot")
    path = project.write_migration("0001_a", recording_body("0001_a"))
    with make_migrator(project, environment="staging") as migrator:
        results = migrator.up()
    doc = db[CHANGELOG].find_one({"name": "0001_a.py"})
    assert set(doc) == APPLIED_FIELDS
    assert doc["status"] == "applied" and doc["batch"] == 1
    assert doc["checksum"] == checksum_bytes(path.read_bytes())
    assert doc["environment"] == "staging"
    assert doc["executedBy"] == "deploy-bot"
    assert doc["description"] == "Migration 0001_a."
    assert isinstance(doc["duration"], int) and doc["duration"] >= results[0].duration
    assert isinstance(doc["runId"], str) and doc["runId"]
    assert isinstance(doc["appliedAt"], dt.datetime)


def test_environment_defaults_to_production_and_no_description_is_omitted(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_plain", "def up(ctx): pass\ndef down(ctx): pass\n")
    with make_migrator(project) as migrator:
        migrator.up()
    doc = db[CHANGELOG].find_one({"name": "0001_plain.py"})
    assert doc["environment"] == "production"
    assert set(doc) == APPLIED_FIELDS - {"description"}


def test_applied_at_is_server_time_and_first_applied_at_client_time(
    project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skew the client clock of the changelog module by decades: only firstAppliedAt follows."""
    skewed = dt.datetime(2001, 2, 3, 4, 5, 6, tzinfo=dt.UTC)

    class SkewedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> SkewedDatetime:  # type: ignore[override]
            return cls.fromtimestamp(skewed.timestamp(), tz)

    fake_dt = types.SimpleNamespace(datetime=SkewedDatetime, UTC=dt.UTC)
    monkeypatch.setattr(changelog_module, "dt", fake_dt)
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
    doc = records(db)["0001_a.py"]
    assert doc["firstAppliedAt"] == skewed.replace(tzinfo=None)
    assert abs(doc["appliedAt"] - server_now(db)) < dt.timedelta(hours=1)


def test_revert_and_reapply_keep_history(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()
        first = records(db)["0001_a.py"]
        migrator.down(requested_by="ops", reason="bad deploy")
        reverted = records(db)["0001_a.py"]
        assert reverted["status"] == "reverted"
        assert isinstance(reverted["revertedAt"], dt.datetime)
        assert reverted["revertRequestedBy"] == "ops" and reverted["revertReason"] == "bad deploy"
        assert reverted["appliedAt"] == first["appliedAt"]  # never deleted, history kept
        assert db[CHANGELOG].count_documents({}) == 1
        migrator.up(requested_by="ci", reason="again")
        again = records(db)["0001_a.py"]
    assert again["status"] == "applied"
    assert "revertedAt" not in again
    assert again["firstAppliedAt"] == first["firstAppliedAt"]
    assert again["appliedAt"] >= first["appliedAt"]
    assert again["batch"] == 2  # never reuses the reverted batch number
    assert again["requestedBy"] == "ci" and again["reason"] == "again"
    with make_migrator(project) as migrator:
        migrator.up("0001_a.py", force=True)  # a later apply without actor fields clears them
    assert "requestedBy" not in records(db)["0001_a.py"]
    assert "reason" not in records(db)["0001_a.py"]


def test_batch_numbers_count_reverted_and_failed_records(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project) as migrator:
        migrator.up()  # batch 1
        migrator.down()  # batch 1 reverted
        db[CHANGELOG].insert_one({"name": "0000_old.py", "status": "failed", "batch": 5})
        assert migrator.next_batch() == 6
        write_simple(project, "0002_b")
        results = migrator.up()
    assert {r.file: r.batch for r in results} == {"0001_a.py": 6, "0002_b.py": 6}


def test_the_five_indexes(project: Any, db: Any) -> None:
    with make_migrator(project) as migrator:
        migrator.connect()
        migrator.status()
        assert db.list_collection_names() == []  # connecting and reading create none
        migrator.up()  # the first run that may write the changelog creates them
    info = db[CHANGELOG].index_information()
    expected = {
        "name_unique": [("name", 1)],
        "status_batch": [("status", 1), ("batch", -1)],
        "batch": [("batch", 1)],
        "status_name": [("status", 1), ("name", 1)],
        "status_appliedAt_name": [("status", 1), ("appliedAt", -1), ("name", -1)],
    }
    for name, key in expected.items():
        assert [(k, int(v)) for k, v in info[name]["key"]] == key, name
    assert info["name_unique"].get("unique") is True
    assert not any(info[n].get("unique") for n in expected if n != "name_unique")


def test_ensure_indexes_false_creates_none(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, ensure_indexes=False) as migrator:
        migrator.up()
    assert set(db[CHANGELOG].index_information()) == {"_id_"}


# ---------------------------------------------------------------------------- failures

FAILING = """
def up(ctx):
    ctx.db["things"].insert_one({"m": "0002_fail"})
    raise ValueError("the data was not what we expected")

def down(ctx):
    pass
"""


def test_a_failing_migration(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0003_c")
    project.write_migration("0002_fail", FAILING)
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError) as info:
        migrator.up()
    error = info.value
    assert error.exit_code == 7
    assert "0002_fail.py" in error.message and "the data was not what we expected" in error.message
    assert error.context["name"] == "0002_fail.py" and error.context["direction"] == "up"
    assert error.context["batch"] == 1
    assert "ValueError" in error.context["cause"]
    assert isinstance(error.__cause__, ValueError)
    results = error.context["results"]
    assert [(r["file"], r["status"]) for r in results] == [
        ("0001_a.py", "applied"),
        ("0002_fail.py", "error"),
    ]
    assert "the data was not what we expected" in results[1]["error"]
    json.dumps(error.to_dict(include_results=True))
    assert applied(db) == ["0001_a.py"]  # earlier stays applied
    assert calls(db) == ["0001_a"]  # later never ran
    failed = records(db)["0002_fail.py"]
    assert failed["status"] == "failed"
    assert "the data was not what we expected" in failed["error"]
    assert isinstance(failed["failedAt"], dt.datetime)
    assert failed["batch"] == 1 and failed["runId"] == records(db)["0001_a.py"]["runId"]
    assert failed["checksum"] == migrator.checksum("0002_fail.py")
    assert {"environment", "executedBy", "duration"} <= set(failed)
    assert "appliedAt" not in failed and "firstAppliedAt" not in failed
    assert db[LOCKS].count_documents({}) == 0
    rows = {r.file: r for r in migrator.status()}
    assert rows["0002_fail.py"].status == "failed"


def test_a_failed_migration_is_retried_and_its_trace_cleared(project: Any, db: Any) -> None:
    project.write_migration("0001_flaky", FAILING)
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError):
        migrator.up()
    project.write_migration("0001_flaky", "def up(ctx): pass\ndef down(ctx): pass\n")
    with make_migrator(project, reload_migrations=True) as migrator:
        assert [r.status for r in migrator.up()] == ["applied"]
    doc = records(db)["0001_flaky.py"]
    assert doc["status"] == "applied" and doc["batch"] == 2
    assert not {"error", "failedAt"} & set(doc)


@pytest.mark.parametrize("ensure_indexes", [True, False])
def test_a_failed_forced_rerun_never_demotes_an_applied_record(
    project: Any, db: Any, ensure_indexes: bool
) -> None:
    """Also without the unique index (a restricted user with ``ensure_indexes = false``), the
    failed attempt must neither demote nor shadow the applied record."""
    write_simple(project, "0001_a")
    with make_migrator(project, ensure_indexes=ensure_indexes) as migrator:
        migrator.up()
    before = records(db)["0001_a.py"]
    project.write_migration("0001_a", FAILING)
    with (
        make_migrator(project, reload_migrations=True, ensure_indexes=ensure_indexes) as migrator,
        pytest.raises(MigrationExecutionFailedError),
    ):
        migrator.up("0001_a.py", force=True)
    assert db[CHANGELOG].count_documents({"name": "0001_a.py"}) == 1
    assert records(db)["0001_a.py"] == before
    with make_migrator(project, ensure_indexes=ensure_indexes) as migrator:
        assert [(r.file, r.status) for r in migrator.status()] == [("0001_a.py", "applied")]


def test_first_applied_at_is_set_when_a_failed_migration_is_applied_later(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_flaky", FAILING)
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError):
        migrator.up()
    project.write_migration("0001_flaky", "def up(ctx): pass\ndef down(ctx): pass\n")
    with make_migrator(project, reload_migrations=True) as migrator:
        migrator.up()
    assert isinstance(records(db)["0001_flaky.py"].get("firstAppliedAt"), dt.datetime)


def test_a_failing_down_keeps_the_record_applied(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_a",
        """
        def up(ctx):
            pass

        def down(ctx):
            raise RuntimeError("cannot undo")
    """,
    )
    with make_migrator(project) as migrator:
        migrator.up()
        with pytest.raises(MigrationExecutionFailedError) as info:
            migrator.down()
    assert info.value.context["direction"] == "down"
    assert records(db)["0001_a.py"]["status"] == "applied"
    assert "error" not in records(db)["0001_a.py"]


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("def up(ctx):\n    return (\n", "SyntaxError"),
        ("def down(ctx):\n    pass\n", "up"),
        ("def up(ctx):\n    pass\n", "down"),
        ("up = 'not a function'\ndef down(ctx): pass\n", "up"),
        ("use_transaction = 'yes'\ndef up(ctx): pass\ndef down(ctx): pass\n", "use_transaction"),
        ("timeout_ms = '5s'\ndef up(ctx): pass\ndef down(ctx): pass\n", "timeout_ms"),
    ],
)
def test_an_unusable_migration_file_writes_nothing(
    project: Any, db: Any, source: str, fragment: str
) -> None:
    project.write_migration("0001_bad", source)
    write_simple(project, "0002_b")
    with make_migrator(project) as migrator, pytest.raises(MigrationInvalidExportError) as info:
        migrator.up()
    assert info.value.exit_code == 20
    assert "0001_bad.py" in info.value.message and fragment in info.value.message
    assert db[CHANGELOG].count_documents({}) == 0
    assert calls(db) == []
    assert db[LOCKS].count_documents({}) == 0


def test_an_unusable_file_stops_the_run_before_any_runs(project: Any, db: Any) -> None:
    # every file is loaded before the first runs (tests/test_preflight.py)
    write_simple(project, "0001_a", "0003_c")
    project.write_migration("0002_bad", "def up(ctx): pass\n")
    with make_migrator(project) as migrator, pytest.raises(MigrationInvalidExportError) as info:
        migrator.up()
    assert info.value.context["results"] == []
    assert applied(db) == []
    assert "0002_bad.py" not in records(db)
    assert calls(db) == []


def test_connection_errors_never_show_the_password(project: Any) -> None:
    uri = "mongodb://admin:Sup3rS3cretPW@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    migrator = Migrator(uri=uri, db_name="x", cwd=project.path, env_file=False)
    with pytest.raises(ConnectionFailedError) as info:
        migrator.up()
    error = info.value
    assert error.exit_code == 5
    for text in (error.message, str(error), json.dumps(error.to_dict(include_results=True))):
        assert "Sup3rS3cretPW" not in text


@pytest.mark.parametrize(
    "uri",
    [
        "mongodb://admin:Sup3rS3cretPW@127.0.0.1:notaport/",
        "mongodb://admin:Sup3rS3cretPW@/",
        "notmongo://admin:Sup3rS3cretPW@host/",
    ],
)
def test_malformed_uri_errors_never_show_the_password(project: Any, uri: str) -> None:
    migrator = Migrator(uri=uri, db_name="x", cwd=project.path, env_file=False)
    # not a mongodb:// URI at all: CONFIG_INVALID when the config loads
    expected = ConfigInvalidError if uri.startswith("notmongo") else ConnectionFailedError
    with pytest.raises(expected) as info:
        migrator.connect()
    assert "Sup3rS3cretPW" not in json.dumps(info.value.to_dict())
    assert "Sup3rS3cretPW" not in str(info.value)


def test_errors_raised_by_a_body_are_redacted(project: Any, db: Any) -> None:
    project.write_migration(
        "0001_leaky",
        """
        def up(ctx):
            raise RuntimeError("cannot reach mongodb://app:L3akyPassw0rd@replica:27017")

        def down(ctx):
            pass
    """,
    )
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError) as info:
        migrator.up()
    assert "L3akyPassw0rd" not in json.dumps(info.value.to_dict(include_results=True))
    assert "L3akyPassw0rd" not in records(db)["0001_leaky.py"]["error"]
    assert "app:****@replica" in records(db)["0001_leaky.py"]["error"]


def with_query(uri: str, query: str) -> str:
    return uri + ("&" if "?" in uri else "?") + query


def test_uri_options_are_not_overridden_by_migronaut_defaults(project: Any) -> None:
    uri = with_query(project.uri, "serverSelectionTimeoutMS=4321&appName=myservice")
    with Migrator(uri=uri, db_name=project.db_name, cwd=project.path, env_file=False) as m:
        options = m.client.options
        assert options.server_selection_timeout == 4.321
        assert options.pool_options.metadata["application"]["name"] == "myservice"
    with Migrator(
        uri=project.uri,
        db_name=project.db_name,
        cwd=project.path,
        env_file=False,
        client_options={"appname": "from-options"},
    ) as m:
        options = m.client.options
        assert options.server_selection_timeout == 10.0  # migronaut's default
        assert options.pool_options.metadata["application"]["name"] == "from-options"


def test_an_injected_client_is_used_and_never_closed(project: Any, client: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    migrator = Migrator(client=client, db_name=project.db_name, cwd=project.path, env_file=False)
    migrator.up()
    assert migrator.client is client
    migrator.close()
    assert client[project.db_name][CHANGELOG].count_documents({}) == 1  # still usable
