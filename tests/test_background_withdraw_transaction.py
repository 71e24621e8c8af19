"""Withdrawing a background registration on ``down`` belongs to the ``down`` migration's
transaction: when that transaction aborts (here its commit fails, through mongod's
``failCommand`` failpoint on the dev server started with ``--enable-test-commands``), the
registration stays, consistent with the changelog that still says ``applied``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Project, project_on
from helpers.background import background_file, seed
from helpers.engine import make_migrator, records
from helpers.failpoints import fail_command

NAME = "0001_users_v1.py"
STATES = "_migronaut_background"
PARTITIONS = "_migronaut_background_partitions"


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


@pytest.mark.parametrize("planned", [False, True], ids=["registered", "planned"])
def test_an_aborted_down_transaction_keeps_the_registration(
    project: Any, cli: Any, db: Any, failpoint_client: Any, planned: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(revert=False))
    monkeypatch.setenv("MIGRONAUT_USE_TRANSACTION", "true")
    assert cli("up").exit_code == 0
    if planned:  # a plan committed, no lane wrote: the withdrawal of a planned migration
        with make_migrator(project) as migrator:
            assert migrator.background.coordinate(NAME).next == "process"
    before = db[STATES].find_one({"_id": NAME})
    partitions = db[PARTITIONS].count_documents({"background": NAME})
    assert before is not None and (partitions > 0) == planned

    with fail_command(failpoint_client, ["commitTransaction"], times=1, error_code=8):
        failed = cli("down", "--json")

    assert failed.exit_code == 7, failed.stdout
    assert failed.json["error"]["code"] == "MIGRATION_EXECUTION_FAILED"
    assert records(db)[NAME]["status"] == "applied"
    kept = db[STATES].find_one({"_id": NAME})
    assert kept is not None, "the aborted down removed the registration"
    assert kept["registration"] == before["registration"]
    assert db[PARTITIONS].count_documents({"background": NAME}) == partitions

