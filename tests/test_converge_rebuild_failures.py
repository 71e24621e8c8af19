"""The two rebuild failures of collections.md §2.5 (the ``rebuild`` row) reached over the wire,
with mongod's ``failCommand`` failpoint making the server fail the ``createIndexes`` a rebuild
sends after its drop: on the dev server started with ``--enable-test-commands``, or on a real
mongod with ``enableTestCommands`` (``MIGRONAUT_TEST_URI``; skipped where the server refuses
``configureFailPoint``).

(a) the connection drops during the create: nothing is restored — the server may still be
building — ``restored: false, uncertain: true, dropped``; (b) the create fails and so does the
restore: ``restored: false`` with ``restoreError``, the message naming the index now missing and
what to do. Both exit 27 in phase ``apply``. The runs use ``ensure_indexes = false``: the only
``createIndexes`` they send is then the rebuild's (the failpoint counts every one). A read the
server refuses (``listCollections``, ``listIndexes``) is exit 27 too, never the driver's error.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Project, project_on
from helpers.engine import make_migrator, write_simple
from helpers.failpoints import fail_command
from migronaut import ConvergeFailedError, MigronautError

#: ``by_shop`` exists without ``sparse``: making it sparse is a rebuild (drop, then create).
SPARSE: list[dict[str, Any]] = [
    {"name": "orders", "indexes": [{"key": {"shop": 1}, "name": "by_shop", "sparse": True}]}]


@pytest.fixture
def db_name(failpoint_client: Any) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    failpoint_client.drop_database(name)


@pytest.fixture
def db(failpoint_client: Any, db_name: str) -> Any:
    return failpoint_client[db_name]


@pytest.fixture
def project(tmp_path: Path, failpoint_uri: str, db_name: str,
            monkeypatch: pytest.MonkeyPatch) -> Project:
    return project_on(tmp_path, failpoint_uri, db_name, monkeypatch)


def indexes(db: Any) -> dict[str, dict[str, Any]]:
    return {index["name"]: dict(index) for index in db.orders.list_indexes()}


def converge(project: Any, **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    with make_migrator(project, collections=SPARSE, ensure_indexes=False) as migrator:
        migrator.on("*", events.append)
        try:
            return migrator.converge(**options), events
        except MigronautError as error:
            return error, events


def test_the_change_is_a_rebuild(project: Any, db: Any) -> None:
    db.orders.create_index([("shop", 1)], name="by_shop")
    planned, _ = converge(project, dry_run=True)
    row = planned.collections[0].row("index", "by_shop")
    assert row.action == "recreate"


def test_a_connection_lost_during_the_create_restores_nothing(
    project: Any, db: Any, failpoint_client: Any,
) -> None:
    db.orders.create_index([("shop", 1)], name="by_shop")
    with fail_command(failpoint_client, ["createIndexes"], times=1, close_connection=True):
        error, events = converge(project)

    assert isinstance(error, ConvergeFailedError), error
    assert error.code == "CONVERGE_FAILED" and error.exit_code == 27
    context = error.context
    assert (context["phase"], context["collection"], context["target"], context["name"],
            context["action"]) == ("apply", "orders", "index", "by_shop", "recreate")
    assert context["restored"] is False and context["uncertain"] is True
    assert context["dropped"] == ["by_shop"]
    assert "restoreError" not in context and "mongoCode" not in context
    assert error.message.startswith('Could not rebuild index "by_shop" on orders: ')
    assert error.message.endswith(
        ' — the connection failed mid-build, after dropping "by_shop"; nothing was restored '
        "(the server may still be building): converge again once it answers — it restores "
        "what the rebuild dropped unless the new index was built")
    # the failpoint fired once: a restore would have succeeded, so its absence shows none ran
    assert "by_shop" not in indexes(db)
    result = context["converge"]
    assert result["changed"] == 0 and result["inSync"] is False
    assert [row["status"] for row in result["collections"][0]["actions"]
            if row["name"] == "by_shop"] == ["failed"]
    end = next(event for event in events if event["event"] == "converge:end")
    assert end["success"] is False
    entry = db["_migronaut_converge"].find_one()
    assert entry is not None and entry["success"] is False


def declare(project: Any) -> None:
    (project.path / "collections").mkdir()
    (project.path / "collections" / "orders.json").write_text(json.dumps(SPARSE[0]))
    project.write("migronaut.toml", 'collections_dir = "collections"\nensure_indexes = false\n')


def test_a_failed_restore_is_exit_27_naming_the_index_now_missing(
    cli: Any, project: Any, db: Any, failpoint_client: Any,
) -> None:
    db.orders.create_index([("shop", 1)], name="by_shop")
    declare(project)
    with fail_command(failpoint_client, ["createIndexes"], times=2, error_code=67):
        failed = cli("converge", "-y", "--json")

    assert failed.exit_code == 27, failed.stderr
    error = failed.json["error"]
    assert error["code"] == "CONVERGE_FAILED"
    context = error["context"]
    assert (context["phase"], context["name"], context["action"], context["mongoCode"]) == (
        "apply", "by_shop", "recreate", 67)
    assert context["restored"] is False and context["dropped"] == ["by_shop"]
    assert "uncertain" not in context
    cause = context["cause"]
    assert cause.startswith("OperationFailure: ")
    assert context["restoreError"].startswith("by_shop: OperationFailure: ")
    assert error["message"] == (
        f'Could not rebuild index "by_shop" on orders: {cause} — restoring the dropped index '
        f'failed ({context["restoreError"]}): orders has no index "by_shop" now; fix the '
        "cause and converge again, or create it by hand")
    assert f"✖ CONVERGE_FAILED: {error['message']}" in failed.stderr
    assert "by_shop" not in indexes(db)  # dropped, and neither created nor restored

    again = cli("converge", "-y", "--json")  # what the message says to do
    assert again.exit_code == 0, again.stderr
    assert indexes(db)["by_shop"].get("sparse") is True


@pytest.mark.parametrize("command", ["listCollections", "listIndexes"])
def test_a_read_the_server_refuses_after_up_is_converge_failed_with_the_applied_rows(
    command: str, project: Any, db: Any, failpoint_client: Any,
) -> None:
    """Not the driver's error: ``CONVERGE_FAILED`` (phase ``plan``) with ``mongoCode``, and
    ``context.results`` listing the migrations the ``up`` applied before it."""
    write_simple(project, "0001_a")
    db.orders.insert_one({"shop": 1})
    with make_migrator(project, collections=SPARSE, ensure_indexes=False) as migrator, \
            fail_command(failpoint_client, [command], times=1, error_code=13), \
            pytest.raises(ConvergeFailedError) as raised:
        migrator.up(converge=True)
    context = raised.value.context
    assert (context["phase"], context["mongoCode"]) == ("plan", 13)
    assert [(row["file"], row["status"]) for row in context["results"]] == [
        ("0001_a.py", "applied")]
    assert context["hint"] == ("not authorized; converge needs listCollections and listIndexes "
                               "on the database (the read role)")
    what = "the declared collections" if command == "listCollections" else "the indexes of orders"
    assert raised.value.message == (f"Could not read {what}: {context['cause']} — "
                                    f"{context['hint']}")
    assert db["_migronaut_migrations"].find_one()["status"] == "applied"
    assert indexes(db).keys() == {"_id_"}  # nothing converged


def test_a_refused_read_is_exit_27_not_exit_1(
    cli: Any, project: Any, db: Any, failpoint_client: Any,
) -> None:
    declare(project)
    db.orders.insert_one({"shop": 1})
    for args in (("converge", "-y", "--json"), ("converge", "--check", "--json")):
        with fail_command(failpoint_client, ["listIndexes"], times=1, error_code=13):
            failed = cli(*args)
        assert failed.exit_code == 27, failed.stderr
        error = failed.json["error"]
        assert (error["code"], error["context"]["collection"],
                error["context"]["mongoCode"]) == ("CONVERGE_FAILED", "orders", 13)
    assert indexes(db).keys() == {"_id_"}
