"""The tool against dev-server variants: a standalone that refuses transactions, and auth on.

Each test starts its own dev server (real process), so these are skipped when the suite runs
against ``MIGRONAUT_TEST_URI``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from migronaut.devserver import DevServerProcess, start_subprocess

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MIGRONAUT_TEST_URI")), reason="starts its own dev server"
)

TRANSACTIONAL = '''
use_transaction = True

def up(ctx):
    ctx.db.items.insert_one({"_id": 1}, session=ctx.session)

def down(ctx):
    ctx.db.items.delete_one({"_id": 1}, session=ctx.session)
'''

PLAIN = '''
def up(ctx):
    ctx.db.items.insert_one({"_id": "plain"})

def down(ctx):
    ctx.db.items.delete_one({"_id": "plain"})
'''

USER, PASSWORD = "admin", "pa55-w0rd-xyz"


@pytest.fixture(scope="module")
def standalone() -> Iterator[DevServerProcess]:
    with start_subprocess(standalone=True) as server:
        yield server


@pytest.fixture(scope="module")
def secured() -> Iterator[DevServerProcess]:
    with start_subprocess(auth=(USER, PASSWORD)) as server:
        yield server


def test_a_transactional_migration_on_a_standalone_is_refused(
    standalone: DevServerProcess, cli: Any, project: Any
) -> None:
    project.write_migration("0001_plain", PLAIN)
    project.write_migration("0002_txn", TRANSACTIONAL)
    result = cli("--uri", standalone.uri, "up", "--json")

    assert result.exit_code == 15
    assert result.json["error"]["code"] == "TRANSACTIONS_UNSUPPORTED"
    assert "standalone" in result.json["error"]["message"]
    assert "0002_txn.py" in result.json["error"]["message"]
    assert [row["file"] for row in result.json["partial"] if row["status"] == "applied"] == [
        "0001_plain.py"
    ]
    with MongoClient(standalone.uri) as client:
        db = client[project.db_name]
        assert db.items.find_one({"_id": 1}) is None  # nothing of the refused migration
        records = {r["name"]: r["status"] for r in db["_migronaut_migrations"].find()}
        assert records == {"0001_plain.py": "applied", "0002_txn.py": "failed"}
        assert db["_migronaut_locks"].count_documents({}) == 0


def test_the_standalone_refuses_transactions_like_mongod(standalone: DevServerProcess) -> None:
    from pymongo.errors import OperationFailure

    with (
        MongoClient(standalone.uri) as client,
        client.start_session() as session,
        pytest.raises(OperationFailure) as info,
        session.start_transaction(),
    ):
        client.t.items.insert_one({"_id": 1}, session=session)
    assert info.value.code == 20


def test_the_tool_authenticates_with_the_uri_credentials(
    secured: DevServerProcess, cli: Any, project: Any
) -> None:
    assert f"{USER}:{PASSWORD}@" in secured.uri
    project.write_migration("0001_plain", PLAIN)
    result = cli("--uri", secured.uri, "up", "--json")

    assert result.exit_code == 0, result.stderr
    assert [row["status"] for row in result.json] == ["applied"]
    assert PASSWORD not in result.stdout + result.stderr
    status = cli("--uri", secured.uri, "status", "--verbose")
    assert status.exit_code == 0
    assert PASSWORD not in status.stdout + status.stderr


def test_a_wrong_password_is_connection_failed_and_never_printed(
    secured: DevServerProcess, cli: Any, project: Any
) -> None:
    wrong = secured.uri.replace(PASSWORD, "not-the-s3cret")
    result = cli("--uri", wrong, "status", "--json", "--verbose")

    assert result.exit_code == 5
    assert result.json["error"]["code"] == "CONNECTION_FAILED"
    assert "not-the-s3cret" not in result.stdout + result.stderr
    human = cli("--uri", wrong, "up", "--verbose")
    assert human.exit_code == 5
    assert "✖ CONNECTION_FAILED" in human.stderr
    assert "not-the-s3cret" not in human.stdout + human.stderr
