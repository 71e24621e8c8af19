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
    assert cli_process("unlock", "-y").exit_code == 0  # the killed run's lock

    _old_index_or_its_record(db)
    assert db[JOURNAL].count_documents({}) == 1  # dropped: only the record is left
    _converged_again_keeps_the_old_index(cli_process, db)
