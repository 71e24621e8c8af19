"""A rebuild never loses the index it drops: the CLI (a real process) rebuilds a unique index
whose declared collation the data now violates, through a TCP proxy that applies one command of
the rebuild and cuts the connection before its reply — at every step — or while the process is
killed (``kill -9``) right after the drop. Whatever happened, the old index is live or its full
spec is recorded; the next converge puts it back first, so duplicates stay refused.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from pymongo.errors import DuplicateKeyError

from helpers.proxy import TcpProxy

JOURNAL = "_migronaut_converge_rebuilds"
#: Case-insensitive uniqueness: "a@x" and "A@x" collide, so the new index can never be built.
DECLARED = {"name": "users", "indexes": [{"key": {"email": 1}, "name": "by_email", "unique": True,
                                          "collation": {"locale": "en", "strength": 2}}]}
OLD_STRENGTH = 3


def _command_on(command: str, collection: str) -> bytes:
    """The bytes that open ``{<command>: "<collection>"}`` in a request."""
    name = collection.encode() + b"\x00"
    return b"\x02" + command.encode() + b"\x00" + len(name).to_bytes(4, "little") + name


#: One request of each step of the rebuild, in the order it sends them: the journal entry, the
#: drop, the new index (refused: duplicates), the restore (the listed spec: its collation has
#: every field filled in) and the journal entry's removal.
STEPS: dict[str, tuple[bytes, ...]] = {
    "record": (_command_on("insert", JOURNAL),),
    "drop": (_command_on("dropIndexes", "users"),),
    "create": (_command_on("createIndexes", "users"),),
    "restore": (_command_on("createIndexes", "users"), b"caseFirst\x00"),
    "settle": (_command_on("delete", JOURNAL),),
}


@pytest.fixture
def proxy(mongo_uri: str) -> Iterator[TcpProxy]:
    with TcpProxy.in_front_of(mongo_uri) as proxy:
        yield proxy


@pytest.fixture
def users(project: Any, db: Any) -> Any:
    """The old index — unique, case-sensitive — over two emails that differ only by case."""
    db.users.insert_many([{"email": "a@x"}, {"email": "A@x"}])
    db.users.create_index("email", name="by_email", unique=True,
                          collation={"locale": "en", "strength": OLD_STRENGTH})
    (project.path / "collections").mkdir()
    (project.path / "collections" / "users.json").write_text(json.dumps(DECLARED))
    project.write("migronaut.toml", 'collections_dir = "collections"\n')
    return db.users


def _old_index_or_its_record(db: Any) -> None:
    """The invariant after any fault: the old index is live, or the journal holds its spec."""
    live = {index["name"]: index for index in db.users.list_indexes()}
    if "by_email" in live:
        return
    recorded = [json_util.loads(text) for entry in db[JOURNAL].find() for text in entry["dropped"]]
    assert [(spec["name"], spec["unique"], spec["collation"]["strength"])
            for spec in recorded] == [("by_email", True, OLD_STRENGTH)]


def _converged_again_keeps_the_old_index(cli_process: Any, db: Any) -> None:
    again = cli_process("converge", "-y", "--rebuild-unique", "--json")
    assert again.exit_code == 27, again.stderr  # the new index still cannot be built
    context = again.json["error"]["context"]
    assert (context["phase"], context["mongoCode"], context["restored"]) == ("apply", 11000, True)
    live = {index["name"]: index for index in db.users.list_indexes()}
    assert live["by_email"]["unique"] is True
    assert live["by_email"]["collation"]["strength"] == OLD_STRENGTH
    assert db[JOURNAL].count_documents({}) == 0
    with pytest.raises(DuplicateKeyError):
        db.users.insert_one({"email": "a@x"})


@pytest.mark.parametrize("step", list(STEPS))
def test_a_cut_at_any_step_of_a_rebuild_loses_no_index(
    step: str, users: Any, db: Any, proxy: TcpProxy, cli_process: Any,
) -> None:
    proxy.drop_reply_after(*STEPS[step])
    cut = cli_process("converge", "-y", "--rebuild-unique", "--json",
                      env={"MIGRONAUT_URI": proxy.uri})
    assert proxy.dropped.is_set(), f"the {step} request was never sent"
    assert cut.exit_code == 27, cut.stderr
    assert cut.json["error"]["code"] == "CONVERGE_FAILED"
    if step in ("drop", "create"):  # the server may have done it: nothing restored at once
        context = cut.json["error"]["context"]
        assert (context["uncertain"], context["dropped"]) == (True, ["by_email"])
    (entry,) = db["_migronaut_converge"].find()  # the failed run is in the history
    assert entry["success"] is False
    assert [(row["name"], row["status"]) for row in entry["actions"]] == [("by_email", "failed")]
    _old_index_or_its_record(db)

    _converged_again_keeps_the_old_index(cli_process, db)


def test_a_converge_killed_right_after_the_drop_restores_the_index_next_time(
    users: Any, db: Any, proxy: TcpProxy, cli_process: Any,
) -> None:
    proxy.delay_replies(STEPS["drop"][0], 600.0)  # the drop is applied; its reply never comes
    process = cli_process.start("converge", "-y", "--rebuild-unique",
                                env={"MIGRONAUT_URI": proxy.uri})
    while "by_email" in {index["name"] for index in db.users.list_indexes()}:
        assert process.poll() is None, cli_process.wait(process).stderr
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    assert cli_process.wait(process).exit_code == -signal.SIGKILL
    proxy.delay_replies(None)
    # the killed run's lock: its heartbeat is still young, so releasing it takes --force
    assert cli_process("unlock", "-y", "--force").exit_code == 0

    _old_index_or_its_record(db)
    assert db[JOURNAL].count_documents({}) == 1  # dropped: only the record is left
    _converged_again_keeps_the_old_index(cli_process, db)


def _record(db: Any, **entry: Any) -> None:
    db[JOURNAL].insert_one({"collection": "users", "runId": "r1", "created": ["by_email"],
                            "dropped": [json_util.dumps(
                                {"key": {"email": 1}, "name": "by_email", "unique": True},
                                json_options=CANONICAL_JSON_OPTIONS)], **entry})


def test_a_restore_the_data_now_refuses_stops_the_converge_and_keeps_the_record(
    project: Any, db: Any, cli: Any,
) -> None:
    (project.path / "collections").mkdir()
    (project.path / "collections" / "users.json").write_text(json.dumps(DECLARED))
    (project.path / "collections" / "later.json").write_text(
        json.dumps({"indexes": [{"key": {"at": 1}}]}))
    project.write("migronaut.toml", 'collections_dir = "collections"\n')
    db.users.insert_many([{"email": "a@x"}, {"email": "a@x"}])  # let in while it was gone
    _record(db)

    failed = cli("converge", "-y", "--rebuild-unique", "--json")
    assert failed.exit_code == 27, failed.stderr
    error = failed.json["error"]
    context = error["context"]
    assert (error["code"], context["phase"], context["collection"], context["name"],
            context["action"], context["mongoCode"]) == (
        "CONVERGE_FAILED", "restore", "users", "by_email", "restore", 11000)
    assert error["message"].startswith(
        'Could not restore index "by_email" on users, dropped by an interrupted rebuild: ')
    assert error["message"].endswith(
        'users has no index "by_email" now; fix the cause and converge again, or create it by '
        "hand and converge again")
    assert db[JOURNAL].count_documents({}) == 1  # kept: the next converge tries again
    assert "later" not in db.list_collection_names()  # nothing else was done
    assert {index["name"] for index in db.users.list_indexes()} == {"_id_"}

    db.users.delete_one({"email": "a@x"})
    again = cli("converge", "-y", "--rebuild-unique", "--json")  # restores, then rebuilds
    assert again.exit_code == 0, again.stderr
    assert "restored: an interrupted rebuild had dropped it" in again.stderr
    assert [(row["name"], row["action"], row["status"])
            for row in again.json["collections"][1]["actions"]] == [
        ("by_email", "recreate", "applied")]
    assert db[JOURNAL].count_documents({}) == 0
    assert db.users.index_information()["by_email"]["collation"]["strength"] == 2
    (entry, *_) = db["_migronaut_converge"].find().sort("startedAt", -1)
    assert entry["actions"][0] == {"collection": "users", "target": "index", "name": "by_email",
                                   "action": "restore", "status": "applied"}


@pytest.mark.parametrize(("junk", "field"), [
    ({"collection": 5}, "collection"),
    ({"created": "by_email"}, "created"),
    ({"dropped": []}, "dropped"),
    ({"dropped": ["{not json"]}, "dropped[0]"),
    ({"dropped": ['{"name": "by_email"}']}, "dropped[0]"),
])
def test_a_record_we_cannot_read_stops_the_converge(
    junk: dict[str, Any], field: str, project: Any, db: Any, cli: Any,
) -> None:
    (project.path / "collections").mkdir()
    (project.path / "collections" / "users.json").write_text(json.dumps(DECLARED))
    project.write("migronaut.toml", 'collections_dir = "collections"\n')
    _record(db, **junk)

    refused = cli("converge", "-y", "--json")
    assert refused.exit_code == 35, refused.stderr
    error = refused.json["error"]
    assert error["code"] == "STATE_INVALID"
    assert error["context"]["collection"] == JOURNAL and error["context"]["field"] == field
    assert f"in {JOURNAL} is unreadable: {field} " in error["message"]
    assert "users" not in db.list_collection_names()  # nothing converged
    assert db[JOURNAL].count_documents({}) == 1
