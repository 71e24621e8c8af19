"""Credential redaction and terminal sanitisation (reference core §2.3) — pure, no server."""

from __future__ import annotations

import json

import pytest

from migronaut._redact import MASK, redact, redact_value, sanitize_terminal
from migronaut.errors import ConnectionFailedError, MigronautError, describe_exception


@pytest.mark.parametrize(
    ("text", "secret", "expected"),
    [
        ("mongodb://alice:hunter2@db1:27017/app", "hunter2", "mongodb://alice:****@db1:27017/app"),
        (
            "mongodb://alice:hunter2@h1:1,h2:2,h3:3/app?replicaSet=rs0",
            "hunter2",
            "mongodb://alice:****@h1:1,h2:2,h3:3/app?replicaSet=rs0",
        ),
        ("mongodb+srv://bob:s3cr%40t@cluster0.example.net/x", "s3cr%40t", None),
        # an unescaped '@' inside the password must not leak its tail
        ("mongodb://alice:p@ss@w0rd@host/app", "w0rd", "mongodb://alice:****@host/app"),
        # empty user name, password only
        ("mongodb://:onlysecret@host/app", "onlysecret", "mongodb://:****@host/app"),
    ],
)
def test_userinfo_password_is_masked(text: str, secret: str, expected: str | None) -> None:
    out = redact(text)
    assert secret not in out
    assert MASK in out
    if expected is not None:
        assert out == expected


def test_every_uri_in_a_sentence_is_masked() -> None:
    text = "primary mongodb://a:first@h1 failed, fallback mongodb://b:second@h2 too"
    out = redact(text)
    assert "first" not in out and "second" not in out
    assert out.count(MASK) == 2
    assert out.startswith("primary mongodb://a:****@h1 failed")


def test_uri_without_password_is_unchanged() -> None:
    for text in ("mongodb://user@host/db", "mongodb://host:27017/db?w=majority", "plain text"):
        assert redact(text) == text


@pytest.mark.parametrize(
    "param", ["tlsCertificateKeyFilePassword", "proxyPassword", "sslKeyPassword"]
)
def test_query_string_secrets_are_masked(param: str) -> None:
    text = f"mongodb://host/db?tls=true&{param}=TopSecret42&appName=x"
    out = redact(text)
    assert "TopSecret42" not in out
    assert f"{param}={MASK}" in out
    assert out.endswith("&appName=x")


def test_secret_auth_mechanism_properties_are_masked_but_not_the_others() -> None:
    text = (
        "mongodb://host/?authMechanism=MONGODB-AWS"
        "&authMechanismProperties=SERVICE_NAME:svc,AWS_SESSION_TOKEN:tok3n-value"
    )
    out = redact(text)
    assert "tok3n-value" not in out
    assert "AWS_SESSION_TOKEN:****" in out
    assert "SERVICE_NAME:svc" in out


def test_dup_key_values_are_masked_everywhere() -> None:
    text = (
        "E11000 duplicate key error collection: app.users index: email_1 "
        'dup key: { email: "eve@example.com" }'
    )
    out = redact(text)
    assert "eve@example.com" not in out
    assert "dup key: { **** }" in out
    assert "index: email_1 " in out  # the index, not a value: kept


def test_redact_value_walks_nested_structures() -> None:
    value = {"a": ["mongodb://u:pw1@h", {"b": ("mongodb://u:pw2@h",)}], "n": 3, "none": None}
    out = redact_value(value)
    dumped = json.dumps(out)
    assert "pw1" not in dumped and "pw2" not in dumped
    assert out["n"] == 3 and out["none"] is None


def test_errors_redact_message_context_and_cause() -> None:
    cause = RuntimeError("could not reach mongodb://root:rootpw@db:27017")
    error = ConnectionFailedError(
        "Failed to connect to mongodb://root:rootpw@db:27017",
        {"uri": "mongodb://root:rootpw@db:27017", "nested": {"list": ["mongodb://x:y@z"]}},
        cause=cause,
    )
    assert "rootpw" not in error.message
    assert "rootpw" not in str(error)
    assert "rootpw" not in json.dumps(error.context)
    assert "rootpw" not in json.dumps(error.to_dict())
    assert "rootpw" not in error.context["cause"]
    assert error.__cause__ is cause
    assert "rootpw" not in describe_exception(cause)


def test_error_to_dict_hides_results_unless_asked() -> None:
    error = MigronautError("boom", {"results": [{"file": "a.py"}], "name": "a.py"})
    assert "results" not in error.to_dict().get("context", {})
    assert error.to_dict(include_results=True)["context"]["results"] == [{"file": "a.py"}]


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("name\x1b[31mRED\x1b[0m", "nameRED"),  # CSI (colour) sequences
        ("a\x1b]0;evil title\x07b", "ab"),  # OSC set-title
        ("a\x1bP+q\x1b\\b", "ab"),  # DCS
        ("a\x9b2Jb", "ab"),  # 8-bit CSI
        ("bell\x07back\x08nul\x00del\x7f", "bellbacknuldel"),  # C0 + DEL
        ("c1\x85\x90x\x9cend", "c1end"),  # C1 controls / 8-bit DCS string
        ("tab\tand\nnewline", "tab\tand\nnewline"),  # layout whitespace survives
        ("plain ünïcødé ✔", "plain ünïcødé ✔"),
    ],
)
def test_sanitize_terminal_strips_control_sequences(raw: str, clean: str) -> None:
    assert sanitize_terminal(raw) == clean


def test_key_values_of_a_driver_error_document_are_masked() -> None:
    text = ("E11000 duplicate key error, full error: {'keyPattern': {'email': 1}, "
            "'keyValue': {'email': 'alice@example.com', 'tags': {'a': 'x'}}, 'code': 11000}")
    out = redact(text)
    assert "alice@example.com" not in out and "'a': 'x'" not in out
    assert "'keyValue': { **** }, 'code': 11000}" in out
    assert "'keyPattern': {'email': 1}" in out  # the index, not a value: kept
    assert redact('"keyValue": {"email": "a@b"') == '"keyValue": { **** }'


def test_the_statement_a_bulk_write_error_repeats_is_masked() -> None:
    text = ("batch op errors occurred, full error: {'writeErrors': [{'index': 0, 'code': 11000, "
            "'keyValue': {'email': 'bob@example.com'}, "
            "'op': {'_id': 7, 'email': 'bob@example.com', 'name': 'Bob Doe'}}], 'nInserted': 0}")
    out = redact(text)
    assert "bob@example.com" not in out and "Bob Doe" not in out
    assert "'op': { **** }}], 'nInserted': 0}" in out
