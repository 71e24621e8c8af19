"""A run whose final changelog write or transaction commit fails ends with its typed error and
releases the lock — going ``down`` exactly as going ``up`` (through the API, on the server that
serves ``failCommand``; the body arms the failpoint on migronaut's own client, so only the
writes after it fail).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import project_on
from helpers.engine import LOCKS, make_migrator, records
from helpers.failpoints import configure
from migronaut import MigronautError


@pytest.fixture
def db(failpoint_client: Any, db_name: str) -> Iterator[Any]:
    yield failpoint_client[db_name]
    failpoint_client.drop_database(db_name)


@pytest.fixture
def project(tmp_path: Path, failpoint_uri: str, db_name: str,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    return project_on(tmp_path, failpoint_uri, db_name, monkeypatch)


#: The body of ``%s`` arms ``failCommand`` for the next ``%d`` ``%s`` commands (``%s``) of
#: migronaut's client; the other direction does nothing.
ARMS = """
use_transaction = %s

def %s(ctx):
    ctx.client.admin.command({
        "configureFailPoint": "failCommand", "mode": {"times": %d},
        "data": {"failCommands": ["%s"], "appName": "migronaut", %s},
    })

def %s(ctx):
    pass
"""

CUT = '"closeConnection": True'
REFUSED = '"errorCode": 2'

#: case: (transactional, failed command, times, failure, the run's error code, in doubt)
CASES = {
    "record-cut": (False, "update", 12, CUT, "CONNECTION_FAILED", True),
    "record-refused": (False, "update", 1, REFUSED, "MIGRATION_EXECUTION_FAILED", True),
    "commit-refused": (True, "commitTransaction", 1, REFUSED, "MIGRATION_EXECUTION_FAILED",
                       False),
}


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_final_write_ends_with_its_error_and_releases_the_lock(
    project: Any, db: Any, failpoint_client: Any, case: str, direction: str
) -> None:
    transactional, command, times, failure, code, in_doubt = CASES[case]
    other = "down" if direction == "up" else "up"
    project.write_migration("0001_x", ARMS % (transactional, direction, times, command,
                                              failure, other))
    if direction == "down":
        with make_migrator(project) as migrator:
            migrator.up()
    before = records(db).get("0001_x.py")
    try:
        with make_migrator(project) as migrator, pytest.raises(MigronautError) as info:
            getattr(migrator, direction)()
    finally:
        configure(failpoint_client, "off")
    assert info.value.code == code
    assert info.value.context["name"] == "0001_x.py"
    assert info.value.context["direction"] == direction
    assert bool(info.value.context.get("inDoubt")) is in_doubt
    assert db[LOCKS].count_documents({}) == 0  # released on the way out, as after any run
    record = records(db).get("0001_x.py")
    if in_doubt:
        assert record is not None
        assert record["status"] == ("running" if direction == "up" else "reverting")
    elif direction == "up":  # rolled back, then recorded as failed
        assert record is not None and record["status"] == "failed"
    else:  # the transaction rolled back: the record is as before the run
        assert record == before
    with make_migrator(project) as migrator, pytest.raises(MigronautError) as again:
        getattr(migrator, direction)()  # the lock is free: the next run is not kept waiting
    assert again.value.code == ("MIGRATION_IN_DOUBT" if in_doubt else code)


def test_a_commit_cut_off_is_retried_and_the_revert_is_recorded_once(
    project: Any, db: Any, failpoint_client: Any
) -> None:
    project.write_migration("0001_x", ARMS % (True, "down", 3, "commitTransaction", CUT, "up"))
    with make_migrator(project) as migrator:
        migrator.up()
    try:
        with make_migrator(project) as migrator:
            results = migrator.down()
    finally:
        configure(failpoint_client, "off")
    assert [(r.file, r.status) for r in results] == [("0001_x.py", "reverted")]
    assert db[LOCKS].count_documents({}) == 0
    assert records(db).get("0001_x.py", {}).get("status") in (None, "reverted")
