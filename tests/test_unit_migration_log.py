"""Migration log lines and machine log lines: limits, redaction, shapes (no database)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import uuid
from typing import Any

import pytest
from bson import Binary, ObjectId
from pymongo.errors import OperationFailure

from migronaut.observability.jsonlog import JsonFormatter, json_log_line
from migronaut.observability.migration_log import (
    MAX_BYTES,
    MAX_ENTRIES,
    MigrationLogger,
    log_line,
    sanitize_data,
)


def test_strings_are_redacted_and_clipped() -> None:
    data, cut = sanitize_data({"uri": "mongodb://u:Secret1@h/db", "long": "y" * 5000})
    assert data["uri"] == "mongodb://u:****@h/db"
    assert data["long"] == "y" * 4096 + "…" and cut is True


def test_depth_is_bounded() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(12):
        node["next"] = {}
        node = node["next"]
    data, cut = sanitize_data(deep)
    depth = 0
    while isinstance(data, dict):
        data = data["next"]
        depth += 1
    assert data == "[depth limit]" and depth == 8 and cut is True


def test_entries_are_bounded_across_the_structure() -> None:
    data, cut = sanitize_data({"a": list(range(800)), "b": list(range(800))})
    assert len(data["a"]) + len(data["b"]) + 2 == MAX_ENTRIES and cut is True


def test_types_are_kept_or_converted_for_storage() -> None:
    oid = ObjectId()
    when = dt.datetime(2024, 5, 6, tzinfo=dt.UTC)
    failure = OperationFailure("E11000 dup key: { email: \"a@b.c\" }", 11000,
                               {"codeName": "DuplicateKey"})
    data, cut = sanitize_data({
        "oid": oid, "when": when, "day": dt.date(2024, 5, 6), "id": uuid.UUID(int=1),
        "pattern": re.compile("^a"), "blob": b"x" * (MAX_BYTES + 10), "set": {3, 1},
        "error": failure, "huge": 2**70, 7: "int key", "obj": object,
    })
    assert data["oid"] is oid and data["when"] is when and data["day"] == "2024-05-06"
    assert data["id"] == "00000000-0000-0000-0000-000000000001"
    assert data["pattern"].pattern == "^a"
    assert isinstance(data["blob"], Binary) and len(data["blob"]) == MAX_BYTES
    assert data["set"] == [1, 3] and data["huge"] == str(2**70) and data["7"] == "int key"
    error = data["error"]
    assert (error["name"], error["code"], error["codeName"]) == (
        "OperationFailure", 11000, "DuplicateKey")
    assert error["message"].startswith("E11000 dup key: { **** }") and "a@b.c" not in str(error)
    assert data["obj"] == "<class 'object'>"
    assert cut is True


def test_a_line_has_its_correlation_and_a_bad_format_does_not_raise() -> None:
    line = log_line(kind="migration", level=logging.WARNING, msg="%d of %d", args=("x",),
                    fields={}, correlation={"runId": "r1", "migration": "m.py", "batch": None},
                    seq=4)
    assert line["msg"] == "%d of %d" and line["level"] == "warning" and line["seq"] == 4
    assert line["runId"] == "r1" and "batch" not in line and "truncated" not in line


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


def test_ctx_logger_merges_fields_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.ctxlogger")
    sink = Sink()
    ctx_logger = MigrationLogger(logger, {"runId": "r1", "direction": "up"}, sink=sink)
    bound = ctx_logger.bind(migration="m.py", batch=None)
    with caplog.at_level(logging.INFO, logger="test.ctxlogger"):
        bound.info("hello %s", "you", extra={"n": 1, "msg": "reserved", "userland": True})
        bound.info("%d", "not a number")  # a bad format is logging's problem, not ours
        bound.debug("filtered by level, still handed to the sink")
    record = caplog.records[0]
    assert (record.runId, record.migration, record.n, record.userland) == (  # type: ignore[attr-defined]
        "r1", "m.py", 1, True)
    assert record.getMessage() == "hello you"
    assert len(sink.calls) == 3
    level, msg, args, fields, correlation, userland = sink.calls[0]
    assert (level, msg, args, userland) == (logging.INFO, "hello %s", ("you",), True)
    assert fields == {"n": 1, "msg": "reserved"}
    assert correlation == {"runId": "r1", "direction": "up", "migration": "m.py"}

    def broken(*args: Any) -> None:
        raise RuntimeError("sink bug")

    MigrationLogger(logger, {}, sink=broken).error("still fine")


def test_json_log_lines_parse_and_are_redacted() -> None:
    text = json_log_line(level=logging.INFO, logger="migronaut", msg="to mongodb://u:pw@h",
                         fields={"runId": "r1", "msg": "cannot replace", "uri": "mongodb://a:b@c",
                                 "when": dt.datetime(2024, 1, 1)})
    line = json.loads(text)
    assert "\n" not in text
    assert line["msg"] == "to mongodb://u:****@h" and line["logger"] == "migronaut"
    assert line["level"] == "info" and line["timestamp"].endswith("Z")
    assert line["runId"] == "r1" and line["uri"] == "mongodb://a:****@c"
    assert line["when"] == "2024-01-01T00:00:00.000Z"


def test_json_formatter_on_an_application_handler() -> None:
    record = logging.LogRecord("migronaut", logging.ERROR, __file__, 1, "✖ Error    %s",
                               ("m.py",), None)
    record.migration = "m.py"
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["msg"], line["migration"]) == ("error", "✖ Error    m.py", "m.py")
