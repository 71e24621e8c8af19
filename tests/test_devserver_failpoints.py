"""The dev server's test failpoint (``--enable-test-commands``): mongod's ``configureFailPoint``
``failCommand``, answered with mongod's reply shapes, and refused as an unknown command without
the flag (``migronaut/devserver/failpoints.py``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, OperationFailure

from helpers.failpoints import configure, fail_command

pytestmark = pytest.mark.skipif(bool(os.environ.get("MIGRONAUT_TEST_URI", "").strip()),
                                reason="pins the dev server's own answers")


@pytest.fixture
def fp(failpoint_client: Any) -> Any:
    """The failpoint server's client; the failpoint is off after each test."""
    yield failpoint_client
    configure(failpoint_client, "off")


def refused(call: Any) -> OperationFailure:
    with pytest.raises(OperationFailure) as caught:
        call()
    return caught.value


def test_without_the_flag_configure_fail_point_is_an_unknown_command(client: Any) -> None:
    error = refused(lambda: configure(client, {"times": 1}, {
        "failCommands": ["find"], "errorCode": 2}))
    assert error.code == 59 and error.details is not None
    assert error.details["codeName"] == "CommandNotFound"
    client.t_failpoints.x.find_one()  # and nothing fails afterwards


def test_times_fails_the_next_n_matching_commands_then_turns_off(fp: Any) -> None:
    coll = fp.t_failpoints.x
    assert configure(fp, {"times": 2}, {"failCommands": ["find"], "errorCode": 67}) == {
        "count": 0, "ok": 1.0}
    for _ in range(2):
        error = refused(lambda: coll.find_one())
        assert error.code == 67 and error.details is not None
        assert error.details["codeName"] == "CannotCreateIndex"
        assert error.details["errmsg"] == "Failing command via 'failCommand' failpoint"
    coll.find_one()
    assert configure(fp, "off") == {"count": 2, "ok": 1.0}


def test_always_on_until_off_with_a_custom_message(fp: Any) -> None:
    coll = fp.t_failpoints.x
    configure(fp, "alwaysOn", {"failCommands": ["insert", "find"], "errorCode": 8,
                               "errmsg": "disk on fire"})
    for call in (lambda: coll.insert_one({}), lambda: coll.find_one(), lambda: coll.find_one()):
        assert str(refused(call).details["errmsg"]) == "disk on fire"  # type: ignore[index]
    coll.count_documents({})  # not listed: served
    assert configure(fp, "off")["count"] == 3
    coll.find_one()


def test_close_connection_drops_the_connection_without_a_reply(fp: Any) -> None:
    coll = fp.t_failpoints.x
    with fail_command(fp, ["createIndexes"], times=1, close_connection=True):
        with pytest.raises(AutoReconnect):
            coll.create_index("a")
        assert coll.create_index("a") == "a_1"  # a new connection, served again


def test_only_the_client_commands_fail_not_the_layers_own_reads(fp: Any) -> None:
    """``createIndexes`` reads ``listCollections`` inside the dev server: the failpoint set on
    ``listCollections`` fires on the client's next one, not on that internal read."""
    db = fp.t_failpoints
    configure(fp, {"times": 1}, {"failCommands": ["listCollections"], "errorCode": 2})
    assert db.x.create_index("b") == "b_1"
    assert refused(lambda: db.list_collection_names()).code == 2


def test_app_name_limits_the_failpoint_to_one_client(fp: Any, failpoint_uri: str) -> None:
    configure(fp, "alwaysOn", {"failCommands": ["find"], "errorCode": 2, "appName": "victim"})
    victim: MongoClient[dict[str, Any]] = MongoClient(failpoint_uri, appname="victim")
    try:
        assert refused(lambda: victim.t_failpoints.x.find_one()).code == 2
        fp.t_failpoints.x.find_one()  # another application: served
    finally:
        victim.close()


@pytest.mark.parametrize(("command", "code", "message"), [
    ({"configureFailPoint": "failCommand", "mode": "off"}, 13,
     "configureFailPoint may only be run against the admin database."),
], ids=["not-admin"])
def test_it_must_be_sent_to_admin(fp: Any, command: dict[str, Any], code: int,
                                  message: str) -> None:
    error = refused(lambda: fp.t_failpoints.command(command))
    assert (error.code, error.details["errmsg"]) == (code, message)  # type: ignore[index]


@pytest.mark.parametrize(("mode", "data", "fragment"), [
    ({"times": 0}, {"failCommands": ["find"], "errorCode": 2}, "positive integer"),
    ({"skip": 1}, {"failCommands": ["find"], "errorCode": 2}, "'mode' must be"),
    ({"times": 1}, {"failCommands": [], "errorCode": 2}, "'failCommands' must be"),
    ({"times": 1}, {"failCommands": ["find"]}, "needs 'errorCode' or 'closeConnection"),
    ({"times": 1}, {"failCommands": ["find"], "errorCode": 2, "blockTimeMS": 5},
     "does not serve: blockTimeMS"),
], ids=["times-0", "skip", "no-commands", "no-failure", "unserved-key"])
def test_bad_settings_are_refused_and_leave_it_off(fp: Any, mode: Any, data: dict[str, Any],
                                                   fragment: str) -> None:
    error = refused(lambda: configure(fp, mode, data))
    assert error.code == 2 and fragment in str(error.details["errmsg"])  # type: ignore[index]
    fp.t_failpoints.x.find_one()


def test_an_unknown_failpoint_name_is_refused(fp: Any) -> None:
    error = refused(lambda: fp.admin.command({"configureFailPoint": "hangBeforeCommit",
                                              "mode": "alwaysOn"}))
    assert error.code == 2 and "Unknown fail point name: hangBeforeCommit" in str(error)


def test_a_command_after_a_failed_commit_runs_outside_the_transaction(
        fp: Any, db_name: str) -> None:
    """The commit fails and leaves the transaction open; the session's next command, not part
    of it, aborts it (as mongod does) and is itself committed."""
    coll = fp[db_name]["after_commit"]
    coll.insert_one({"_id": "seed"})
    try:
        with fp.start_session() as session:
            session.start_transaction()
            coll.insert_one({"_id": "in-txn"}, session=session)
            with fail_command(fp, ["commitTransaction"], times=1, error_code=2):
                assert refused(session.commit_transaction).code == 2
            coll.delete_one({"_id": "seed"}, session=session)
        assert list(coll.find()) == []  # the delete committed, the transaction's insert not
    finally:
        fp.drop_database(db_name)
