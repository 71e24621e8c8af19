"""The lanes' data commands (migronaut.background.lanes.wire) against the server, over the wire.

The retry is exercised through a real TCP proxy in front of the server (``tests/helpers/proxy.py``)
that forwards the first ``update`` command and then cuts the connection instead of passing its
reply back — the server applied it, the client cannot know — which is what a dropped connection
looks like to the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient, WriteConcern
from pymongo.database import Database
from pymongo.errors import DocumentTooLarge, OperationFailure
from pymongo.monitoring import CommandListener, CommandStartedEvent

from helpers.proxy import TcpProxy
from migronaut.background.lanes.diff import guard_filter, stamped_diff
from migronaut.background.lanes.wire import guarded_updates, read_batch
from migronaut.core.retry import is_outage


def _statement(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    result = {**doc, **changes}
    update = stamped_diff(doc, result, version_field="__v", revision_field="__rev",
                          target_version=1)
    assert isinstance(update, dict)
    return {"q": guard_filter(doc, "__v", "__rev", "revision"), "u": update}


def test_read_batch_returns_the_first_documents_by_id_decoded_with_the_collections_codec(
    db: Database[dict[str, Any]],
) -> None:
    db.docs.insert_many([{"_id": i, "x": i, "__v": 1 if i % 3 == 0 else 0} for i in range(30)])
    got = read_batch(db.docs, {"__v": 0, "_id": {"$gt": 4}}, 5)
    assert [d["_id"] for d in got] == [5, 7, 8, 10, 11]
    assert all(type(d) is dict for d in got)
    raw = read_batch(db.docs.with_options(
        codec_options=db.codec_options.with_options(document_class=RawBSONDocument)), {}, 3)
    assert [type(d) for d in raw] == [RawBSONDocument] * 3 and raw[2]["_id"] == 2
    db.docs.create_index([("__v", 1), ("_id", 1)], name="by_version")
    assert [d["_id"] for d in read_batch(db.docs, {"__v": 1}, 3, hint="by_version")] == [0, 3, 6]


def test_guarded_updates_count_matches_and_report_write_errors_by_statement_index(
    db: Database[dict[str, Any]],
) -> None:
    db.docs.insert_many([{"_id": i, "x": i} for i in range(6)])
    db.docs.create_index("email", unique=True, sparse=True)
    docs = list(db.docs.find().sort("_id", 1))
    statements = [_statement(d, x2=d["x"] * 2) for d in docs]
    statements[2] = _statement(docs[2], email="same@example.com")
    statements[4] = _statement(docs[4], email="same@example.com")  # duplicate key
    db.docs.update_one({"_id": 5}, {"$set": {"__rev": 7}})  # an application write: no match
    outcome = guarded_updates(db.docs, statements)
    assert outcome.matched == 4
    assert [(e["index"], e["code"]) for e in outcome.write_errors] == [(4, 11000)]
    after = {d["_id"]: d for d in db.docs.find()}
    assert [after[i].get("__v") for i in range(6)] == [1, 1, 1, 1, None, None]
    assert after[0]["x2"] == 0 and after[3]["__rev"] == 1 and after[5]["__rev"] == 7


def test_a_command_over_the_size_limit_is_split_and_error_indexes_stay_those_of_the_input(
    db: Database[dict[str, Any]],
) -> None:
    big = "x" * (1024 * 1024)
    db.docs.insert_many([{"_id": i} for i in range(20)])
    db.docs.create_index("tag", unique=True, sparse=True)
    statements = [_statement({"_id": i}, blob=big) for i in range(20)]
    statements[3] = _statement({"_id": 3}, tag="t")
    statements[17] = _statement({"_id": 17}, tag="t")  # in the second half: index kept
    with pytest.raises(DocumentTooLarge):  # what the driver refuses, sent whole
        db.command({"update": "docs", "updates": statements, "ordered": False})
    outcome = guarded_updates(db.docs, statements)
    assert outcome.matched == 19
    assert [(e["index"], e["code"]) for e in outcome.write_errors] == [(17, 11000)]
    assert db.docs.count_documents({"__v": 1}) == 19
    assert db.docs.count_documents({"blob": big}) == 18


def test_one_statement_that_is_too_large_by_itself_is_the_drivers_error(
    db: Database[dict[str, Any]],
) -> None:
    db.docs.insert_one({"_id": 1})
    with pytest.raises(DocumentTooLarge):
        guarded_updates(db.docs, [_statement({"_id": 1}, blob="y" * (17 * 1024 * 1024))])
    assert db.docs.find_one({"_id": 1}) == {"_id": 1}


def test_a_write_concern_the_server_cannot_satisfy_is_raised_not_counted(
    db: Database[dict[str, Any]], server_hello: dict[str, Any],
) -> None:
    db.docs.insert_one({"_id": 1})
    unsatisfiable = db.docs.with_options(write_concern=WriteConcern(w=50, wtimeout=200))
    with pytest.raises(OperationFailure) as raised:  # WriteConcernError or the command's error
        guarded_updates(unsatisfiable, [_statement({"_id": 1}, x=1)])
    assert raised.value.code in {100, 9, 2, 64}


@pytest.fixture
def proxied(mongo_uri: str, db_name: str) -> Iterator[tuple[TcpProxy, Database[Any]]]:
    with TcpProxy.in_front_of(mongo_uri) as proxy:
        client: MongoClient[dict[str, Any]] = MongoClient(
            proxy.uri, retryWrites=False, serverSelectionTimeoutMS=5000)
        try:
            yield proxy, client[db_name]
        finally:
            client.close()


def test_a_connection_cut_after_the_update_is_retried_once_and_the_replay_matches_nothing(
    db: Database[dict[str, Any]], proxied: tuple[TcpProxy, Database[Any]],
) -> None:
    proxy, through = proxied
    db.docs.insert_many([{"_id": i, "x": i} for i in range(10)])
    statements = [_statement({"_id": i, "x": i}, x2=i * 2) for i in range(10)]
    through.command("ping")  # connected before the fault is armed
    proxy.drop_reply_after(b"update\x00")
    confirmed: list[bool] = []
    outcome = guarded_updates(through.docs, statements, confirm=lambda: confirmed.append(True))
    # the first attempt's reply was dropped; the retry was confirmed by the caller first
    assert proxy.dropped.is_set() and confirmed == [True]
    # the first attempt applied everything; the replay is guarded by version and revision, so
    # it matches nothing and nothing is applied twice (the lane re-reads unmatched documents)
    assert outcome.matched == 0 and outcome.write_errors == []
    assert [d["__rev"] for d in db.docs.find().sort("_id", 1)] == [1] * 10


def test_a_batch_that_does_not_fit_the_first_reply_is_read_to_its_limit_by_get_more(
    db: Database[dict[str, Any]], mongo_uri: str,
) -> None:
    # a real server cuts a reply at 16 MiB; a small first batch takes the same path here
    db.items.insert_many([{"_id": i, "x": i} for i in range(30)])
    commands: list[tuple[str, Any]] = []

    class Commands(CommandListener):
        def started(self, event: CommandStartedEvent) -> None:
            commands.append((event.command_name, event.command.get("lsid")))

        def succeeded(self, event: Any) -> None: ...
        def failed(self, event: Any) -> None: ...

    with MongoClient(mongo_uri, event_listeners=[Commands()]) as watched:
        got = read_batch(watched[db.name].items, {"x": {"$gte": 3}}, 20, first_batch=6)
    assert [d["_id"] for d in got] == list(range(3, 23))
    names = [name for name, _ in commands]
    assert names[0] == "find" and "getMore" in names and "killCursors" not in names
    sessions = {str(lsid) for name, lsid in commands if name in ("find", "getMore")}
    assert len(sessions) == 1  # a cursor belongs to the session that opened it


def test_outages_are_told_from_faults() -> None:
    from pymongo.errors import (
        AutoReconnect,
        NetworkTimeout,
        NotPrimaryError,
        OperationFailure,
        ServerSelectionTimeoutError,
        WriteConcernError,
    )

    from migronaut.errors import ConnectionFailedError

    labelled = OperationFailure("retry me", 1, {"errorLabels": ["RetryableWriteError"]})
    transient = OperationFailure("again", 1, {"errorLabels": ["TransientTransactionError"]})
    for outage in (AutoReconnect("cut"), NetworkTimeout("slow"), NotPrimaryError("stepped"),
                   ServerSelectionTimeoutError("none"), OperationFailure("election", 11602),
                   OperationFailure("not primary", 10107), labelled, transient,
                   WriteConcernError("shutting down", 91)):
        assert is_outage(outage), outage
    wrapped = ConnectionFailedError("lost the connection")
    wrapped.__cause__ = AutoReconnect("cut")
    assert is_outage(wrapped)
    for fault in (OperationFailure("duplicate", 11000), OperationFailure("bad", 2),
                  WriteConcernError("timeout", 64), ValueError("x"), None):
        assert not is_outage(fault), fault
