"""One changelog round trip per migration: the final write of a migration and the claim of the
next one travel as two ordered statements of one ``update`` command, and the next body starts
only once the reply (or, failing that, the two records) confirms both. Counted over the wire
with a command listener on a real server; the cut connection and the killed process are in
test_process_in_doubt.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import (
    CHANGELOG,
    ChangelogUpdates,
    calls,
    make_migrator,
    records,
    write_simple,
)
from migronaut import MigronautError
from migronaut.core.changelog import (
    Changelog,
    applied_write,
    finished_write,
    intent_write,
)

RUN = "run-ours"


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
