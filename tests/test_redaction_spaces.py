"""A password with a literal space (pymongo accepts ``mongodb://user:pa ss@host``) is masked
everywhere: error lines, JSON documents, ``ctx.logger`` lines as printed and as stored
(``_migronaut_runs_logs``), and the user's own OpenTelemetry attributes."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine import make_migrator
from migronaut._redact import redact

SPACED = "mongodb://app:pa ss w0rd@db1.internal,db2.internal/?replicaSet=rs0"
SECRET_PARTS = ("pa ss", "ss w0rd", "w0rd")


def leaks(text: str) -> list[str]:
    return [part for part in SECRET_PARTS if part in text]


@pytest.mark.parametrize(("text", "expected"), [
    ("mongodb://user:pa ss@host/db", "mongodb://user:****@host/db"),
    ("mongodb://user:a b\tc@h1,h2/?x=1", "mongodb://user:****@h1,h2/?x=1"),
    ("mongodb+srv://:pa ss@cluster.example.net", "mongodb+srv://:****@cluster.example.net"),
    (f"connect to {SPACED} then mail ops@example.com",
     "connect to mongodb://app:****@db1.internal,db2.internal/?replicaSet=rs0 then mail "
     "ops@example.com"),
    ("mongodb://u:pa ss@h\nnext line x@y", "mongodb://u:****@h\nnext line x@y"),
    # '@' and a space unescaped: masked up to the last '@' before the host, as drivers split it
    ("mongodb://adm:p@ss w:rd@host/", "mongodb://adm:****@host/"),
    ("mongodb://adm:p@ss w:rd@h1,h2", "mongodb://adm:****@h1,h2"),
    ("uri=mongodb://adm:p@ss w:rd@host/db?x=1 then ops@example.com",
     "uri=mongodb://adm:****@host/db?x=1 then ops@example.com"),
])
def test_a_password_with_spaces_is_masked(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_uris_without_a_password_are_left_alone() -> None:
    for text in ("mongodb://localhost:27017/?directConnection=true tail a@b",
                 "mongodb://db1,db2/?replicaSet=rs0 and ops@example.com"):
        assert redact(text) == text


LOGGING = f'''
def up(ctx):
    ctx.logger.info("connecting to %s", "{SPACED}", extra={{"userland": True, "uri": "{SPACED}"}})
    ctx.logger.warning("retrying {SPACED}")

def down(ctx):
    pass
'''


def test_ctx_logger_lines_are_masked_as_printed_and_as_stored(
    cli: Any, project: Any, db: Any
) -> None:
    project.write_migration("0001_logs", LOGGING)
    result = cli("up", "--verbose")
    assert result.exit_code == 0, result.stderr
    assert "app:****@db1.internal" in result.stdout + result.stderr
    assert leaks(result.stdout + result.stderr) == []
    stored = list(db["_migronaut_runs_logs"].find({}, {"_id": 0}))
    assert len(stored) == 2
    assert leaks(repr(stored)) == []
    assert stored[0]["msg"] == "connecting to mongodb://app:****@db1.internal,db2.internal/" \
        "?replicaSet=rs0"
    logs = cli("logs", "--last", "--json")
    assert logs.exit_code == 0 and leaks(logs.stdout) == []


def test_a_connection_error_never_shows_a_spaced_password(cli: Any) -> None:
    uri = "mongodb://alice:hunter 2@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    for args in (("status",), ("status", "--json"), ("up", "--verbose")):
        result = cli(*args, "--uri", uri)
        assert result.exit_code == 5, result.stderr
        assert "hunter" not in result.stdout + result.stderr
        assert "alice:****@127.0.0.1:1" in result.stdout + result.stderr


def test_user_telemetry_attributes_are_redacted(project: Any) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    project.write_migration("0001_a", "def up(ctx): pass\ndef down(ctx): pass\n")
    telemetry = {"tracer": provider.get_tracer("test"),
                 "attributes": {"peer.uri": SPACED, "legacy.uri": "mongodb://u:s3cret@h/",
                                "team": "billing"}}
    with make_migrator(project, telemetry=telemetry) as migrator:
        migrator.up()
    spans = exporter.get_finished_spans()
    assert {span.name for span in spans} == {"migronaut.run", "migronaut.migration"}
    for span in spans:
        attributes = dict(span.attributes or {})
        assert attributes["peer.uri"] == (
            "mongodb://app:****@db1.internal,db2.internal/?replicaSet=rs0")
        assert attributes["legacy.uri"] == "mongodb://u:****@h/"
        assert attributes["team"] == "billing"
        assert leaks(repr(attributes)) == [] and "s3cret" not in repr(attributes)


def test_a_password_with_at_and_a_space_never_shows(cli: Any) -> None:
    uri = "mongodb://adm:p@ss w:rd@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    for args in (("status",), ("status", "--json")):
        result = cli(*args, "--uri", uri)
        assert result.exit_code == 5, result.stderr
        shown = result.stdout + result.stderr
        assert "p@ss" not in shown and "ss w:rd" not in shown
        assert "adm:****@127.0.0.1:1" in shown
    error = cli("status", "--json", "--uri", uri).json["error"]
    assert error["code"] == "CONNECTION_FAILED"
    assert error["context"]["uri"] == "mongodb://adm:****@127.0.0.1:1/?serverSelectionTimeoutMS=200"
