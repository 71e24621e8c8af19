"""One changelog round trip per migration: the final write of a migration and the claim of the
next one travel as two ordered statements of one ``update`` command, and the next body starts
only once the reply (or, failing that, the two records) confirms both. Counted over the wire
with a command listener on a real server; the killed-process case is in
test_process_in_doubt.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import monitoring

from conftest import project_on
from helpers.engine import CHANGELOG, calls, make_migrator, records, write_simple
from helpers.failpoints import configure
from migronaut import MigronautError
from migronaut.core.changelog import (
    Changelog,
    applied_write,
    finished_write,
    intent_write,
)

RUN = "run-ours"


class ChangelogUpdates(monitoring.CommandListener):
    """The ``update`` commands sent to the changelog: the names their statements filter on."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "update" and event.command.get("update") == CHANGELOG:
            self.sent.append([s["q"]["name"][:4] for s in event.command["updates"]])

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def up_counted(project: Any, **overrides: Any) -> ChangelogUpdates:
    listener = ChangelogUpdates()
    with make_migrator(project, client_options={"event_listeners": [listener]},
                       **overrides) as migrator:
        migrator.up()
    return listener


def test_up_of_five_sends_n_plus_one_changelog_updates(project: Any, db: Any) -> None:
    names = ["0001_a", "0002_b", "0003_c", "0004_d", "0005_e"]
    write_simple(project, *names)
    listener = up_counted(project)
    assert listener.sent == [["0001"], ["0001", "0002"], ["0002", "0003"], ["0003", "0004"],
                             ["0004", "0005"], ["0005"]]
    assert calls(db) == names
    stored = records(db)
    assert sorted(stored) == [f"{name}.py" for name in names]
    for record in stored.values():
        assert record["status"] == "applied" and "intent" not in record
        assert record["firstAppliedAt"] and record["checksum"]


def test_a_before_each_or_after_each_hook_keeps_two_writes_per_migration(
    project: Any, db: Any
) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c")
    seen: list[str] = []

    def before_each(name: str, ctx: Any, info: Any) -> None:
        # what a hook reads of the changelog is as it was: the next one is not claimed yet
        seen.append(str((records(db).get(name) or {}).get("status")))

    listener = up_counted(project, hooks={"before_each": before_each})
    assert listener.sent == [["0001"], ["0001"], ["0002"], ["0002"], ["0003"], ["0003"]]
    assert seen == ["None", "None", "None"]
    assert calls(db) == ["0001_a", "0002_b", "0003_c"]


TRANSACTIONAL = """
use_transaction = True

def up(ctx):
    ctx.db["calls"].insert_one({"m": "0002_txn", "dir": "up"}, session=ctx.session)

def down(ctx):
    pass
"""


def test_a_transactional_migration_gets_no_claim(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0003_c")
    project.write_migration("0002_txn", TRANSACTIONAL)
    listener = up_counted(project)
    # 0001's final write alone (0002 writes its record in its transaction), 0003 claims itself
    assert listener.sent == [["0001"], ["0001"], ["0002"], ["0003"], ["0003"]]
    assert calls(db) == ["0001_a", "0002_txn", "0003_c"]
    assert all(r["status"] == "applied" for r in records(db).values())


def test_a_stop_between_two_migrations_gives_the_claim_back(project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c")
    db[CHANGELOG].insert_one({"name": "0002_b.py", "status": "failed", "error": "earlier"})
    listener = ChangelogUpdates()
    with make_migrator(project, client_options={"event_listeners": [listener]}) as migrator:
        def stop_after_first(event: dict[str, Any]) -> None:
            if event["migration"] == "0001_a.py":
                migrator.stop("stop after the first")

        migrator.on("migration:success", stop_after_first)
        with pytest.raises(MigronautError):
            migrator.up()
    assert listener.sent[:2] == [["0001"], ["0001", "0002"]]  # claimed with 0001's record
    assert calls(db) == ["0001_a"]
    stored = records(db)
    assert stored["0002_b.py"]["status"] == "failed" and "intent" not in stored["0002_b.py"]
    assert stored["0002_b.py"]["error"] == "earlier"
    assert "0003_c.py" not in stored
    with make_migrator(project) as migrator:
        migrator.up()
    assert calls(db) == ["0001_a", "0002_b", "0003_c"]


# -- the combined command, statement by statement ---------------------------------------------


def claim(changelog: Changelog, name: str, run_id: str = RUN) -> None:
    change = intent_write(name, direction="up", planned=None,
                          intent={"runId": run_id, "lockOwner": run_id, "direction": "up"},
                          record={"batch": 1, "checksum": "c" * 64})
    assert changelog.claim(change, run_id)


def final(name: str) -> Any:
    record = {"name": name, "batch": 1, "checksum": "c" * 64, "runId": RUN}
    return finished_write(applied_write(record), RUN)


def next_claim(name: str) -> Any:
    return intent_write(name, direction="up", planned=None,
                        intent={"runId": RUN, "lockOwner": RUN, "direction": "up"})


def test_a_resent_combined_command_is_recognised_from_the_records(db: Any) -> None:
    changelog = Changelog(db[CHANGELOG])
    changelog.ensure_indexes()
    claim(changelog, "a.py")
    assert changelog.finish_and_claim(final("a.py"), next_claim("b.py"), RUN) == (True, True)
    # the same command again, as after a reply lost on the way back: the final write matches
    # nothing, the claim collides on the unique index — both read back as this run's
    assert changelog.finish_and_claim(final("a.py"), next_claim("b.py"), RUN) == (True, True)
    stored = records(db)
    assert len(stored) == 2
    assert stored["a.py"]["status"] == "applied" and "intent" not in stored["a.py"]
    assert stored["b.py"]["status"] == "running" and stored["b.py"]["intent"]["runId"] == RUN


def test_a_combined_command_confirms_neither_statement_that_is_not_ours(db: Any) -> None:
    changelog = Changelog(db[CHANGELOG])
    changelog.ensure_indexes()
    claim(changelog, "a.py")
    claim(changelog, "b.py", run_id="another-run")
    # the next one was claimed by another run: this record is confirmed, the claim is not
    assert changelog.finish_and_claim(final("a.py"), next_claim("b.py"), RUN) == (True, False)
    assert records(db)["b.py"]["intent"]["runId"] == "another-run"
    # this record was resolved meanwhile: not confirmed, while the next claim is
    claim(changelog, "c.py")
    db[CHANGELOG].update_one({"name": "c.py"}, {"$set": {"status": "failed"},
                                                 "$unset": {"intent": ""}})
    assert changelog.finish_and_claim(final("c.py"), next_claim("d.py"), RUN) == (False, True)
    assert records(db)["c.py"]["status"] == "failed"


def test_give_back_restores_the_status_or_removes_the_record_the_claim_made(db: Any) -> None:
    changelog = Changelog(db[CHANGELOG])
    changelog.ensure_indexes()
    db[CHANGELOG].insert_one({"name": "old.py", "status": "reverted", "batch": 2})
    claim(changelog, "old.py")
    claim(changelog, "new.py")
    claim(changelog, "theirs.py", run_id="another-run")
    for name in ("old.py", "new.py", "theirs.py"):
        changelog.give_back(name, "running", RUN)
    stored = records(db)
    assert stored["old.py"] == {"name": "old.py", "status": "reverted", "batch": 2}
    assert "new.py" not in stored
    assert stored["theirs.py"]["status"] == "running"  # not ours: untouched


# -- a cut connection ---------------------------------------------------------------------------

#: Counts its execution, then cuts the connection of the next ``%d`` updates of migronaut's
#: client: the command carrying its record and the next migration's claim comes first.
CUTS_ITS_RECORD = '''
def up(ctx):
    ctx.db["counters"].update_one({"_id": "%s"}, {"$inc": {"n": 1}}, upsert=True)
    ctx.client.admin.command({
        "configureFailPoint": "failCommand", "mode": {"times": %d},
        "data": {"failCommands": ["update"], "closeConnection": True, "appName": "migronaut"},
    })

def down(ctx):
    pass
'''

COUNTS = '''
def up(ctx):
    ctx.db["counters"].update_one({"_id": "%s"}, {"$inc": {"n": 1}}, upsert=True)

def down(ctx):
    pass
'''


@pytest.fixture
def fp_db(failpoint_client: Any, db_name: str) -> Iterator[Any]:
    yield failpoint_client[db_name]
    failpoint_client.drop_database(db_name)


@pytest.fixture
def fp_project(tmp_path: Path, failpoint_uri: str, db_name: str,
               monkeypatch: pytest.MonkeyPatch) -> Any:
    return project_on(tmp_path, failpoint_uri, db_name, monkeypatch)


def counted(db: Any) -> dict[str, int]:
    return {doc["_id"]: doc["n"] for doc in db["counters"].find()}


def test_a_combined_command_cut_once_is_sent_again_and_nothing_runs_twice(
    fp_project: Any, fp_db: Any, failpoint_client: Any
) -> None:
    fp_project.write_migration("0001_a", COUNTS % "a")
    fp_project.write_migration("0002_cut", CUTS_ITS_RECORD % ("cut", 1))
    fp_project.write_migration("0003_c", COUNTS % "c")
    listener = ChangelogUpdates()
    try:
        with make_migrator(fp_project,
                           client_options={"event_listeners": [listener]}) as migrator:
            migrator.up()
    finally:
        configure(failpoint_client, "off")
    assert counted(fp_db) == {"a": 1, "cut": 1, "c": 1}
    assert ["0002", "0003"] in listener.sent
    assert listener.sent.count(["0002", "0003"]) == 2  # cut, then sent again
    assert all(r["status"] == "applied" and "intent" not in r for r in records(fp_db).values())


def test_a_combined_command_never_answered_leaves_the_migration_in_doubt_and_the_next_unrun(
    fp_project: Any, fp_db: Any, failpoint_client: Any
) -> None:
    fp_project.write_migration("0001_cut", CUTS_ITS_RECORD % ("cut", 12))
    fp_project.write_migration("0002_c", COUNTS % "c")
    try:
        with make_migrator(fp_project) as migrator, pytest.raises(MigronautError) as info:
            migrator.up()
    finally:
        configure(failpoint_client, "off")
    assert info.value.code == "CONNECTION_FAILED"
    assert info.value.context["phase"] == "changelog-write"
    assert info.value.context["inDoubt"] is True
    assert counted(fp_db) == {"cut": 1}
    stored = records(fp_db)
    assert stored["0001_cut.py"]["status"] == "running"
    assert "0002_c.py" not in stored  # neither its claim nor the give-back got through
    with make_migrator(fp_project) as migrator, pytest.raises(MigronautError) as again:
        migrator.up()
    assert again.value.code == "MIGRATION_IN_DOUBT" and again.value.context["name"] == "0001_cut.py"
    assert counted(fp_db) == {"cut": 1}
