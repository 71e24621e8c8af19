"""Dropped connections in the core line, through a real TCP proxy (tests/helpers/proxy.py).

Our own writes are idempotent and retried over transient network errors — the changelog record,
the failed-attempt record, the lock's acquire, renewals and release — so a reply lost on a cut
never loses a record (which would let a later ``up`` apply the migration again) nor leaves the
lock held; any other connection error in a run is ``CONNECTION_FAILED`` (exit 5), never exit 1.

A cut can land after a command reached the server and before its reply came back, so "ran
exactly once" is asserted where it is honest: a body that *completed* (it appends its name to a
local file once its own write returned) is never run again, and every migration ends with one
applied record. A body whose own write was cut has failed (exit 7) and runs again — its write is
an upsert keyed by name, idempotent by design, as bodies that can meet a network must be.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from helpers.engine import CHANGELOG, LOCKS, applied, make_migrator
from helpers.proxy import TcpProxy, cutting_connections
from migronaut import ConnectionFailedError

#: The bytes of a command document naming a collection (BSON: type, key, length, value).
CHANGELOG_NAME = b"_migronaut_migrations\x00"
LOCKS_NAME = b"_migronaut_locks\x00"
UPDATE, DELETE = b"\x02update\x00", b"\x02delete\x00"

#: Upserts its marker (idempotent), notes locally that it completed, then works a little
#: longer (``{linger}`` s) — a cut landing meanwhile meets the changelog write that follows.
MARKING = """
import os
import time

def up(ctx):
    ctx.db["markers"].update_one({{"_id": {name!r}}}, {{"$inc": {{"writes": 1}}}}, upsert=True)
    with open(os.path.join({directory!r}, "completed.log"), "a", encoding="utf-8") as log:
        log.write({name!r} + "\\n")
    time.sleep({linger})

def down(ctx):
    pass
"""


def write_marking(project: Any, count: int, *, linger: float = 0.0) -> list[str]:
    names = [f"{i:04d}_m" for i in range(1, count + 1)]
    for name in names:
        project.write_migration(
            name, MARKING.format(name=name, directory=str(project.path), linger=linger))
    return names


def completed(project: Any) -> Counter[str]:
    log = project.path / "completed.log"
    return Counter(log.read_text("utf-8").split()) if log.exists() else Counter()


def through(proxy: Any) -> dict[str, Any]:
    """Migrator settings for the proxy; no driver-level retry, so every cut reaches us."""
    return {"uri": proxy.uri, "client_options": {"retryWrites": False, "retryReads": False}}


# ------------------------------------------------------------------------- one lost reply


def test_a_lost_reply_to_the_changelog_write_is_resent_and_never_reapplied(
    project: Any, db: Any, mongo_uri: str
) -> None:
    names = write_marking(project, 2)
    with TcpProxy.in_front_of(mongo_uri) as proxy:
        proxy.drop_reply_after(UPDATE, CHANGELOG_NAME)
        with make_migrator(project, **through(proxy)) as migrator:
            results = migrator.up()
    assert proxy.dropped.is_set()  # the first record reached the server, its reply did not
    assert [(r.file, r.status) for r in results] == [(f"{n}.py", "applied") for n in names]
    with make_migrator(project) as migrator:
        assert [r.status for r in migrator.up()] == []  # nothing left for a later up
    assert completed(project) == Counter(names)  # each body completed once
    assert applied(db) == [f"{n}.py" for n in names]
    assert db[CHANGELOG].count_documents({}) == 2
    assert db[LOCKS].count_documents({}) == 0


@pytest.mark.parametrize("command", ["acquire", "release"])
def test_a_lost_reply_to_the_lock_acquire_or_release_is_resent(
    cli: Any, project: Any, db: Any, mongo_uri: str, command: str
) -> None:
    write_marking(project, 1)
    marker = [UPDATE, LOCKS_NAME] if command == "acquire" else [DELETE, LOCKS_NAME]
    with TcpProxy.in_front_of(mongo_uri) as proxy:
        proxy.drop_reply_after(*marker)
        result = cli("up", "--json", env={
            "MIGRONAUT_URI": proxy.uri + "&retryWrites=false&retryReads=false"})
    assert proxy.dropped.is_set()
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert [r["status"] for r in result.json] == ["applied"]
    assert db[LOCKS].count_documents({}) == 0  # not left behind until its TTL


def test_a_connection_lost_between_migrations_is_connection_failed(
    project: Any, db: Any, mongo_uri: str
) -> None:
    """Not a raw driver error (exit 1): exit 5, with what was done so far."""
    names = write_marking(project, 2)
    with TcpProxy.in_front_of(mongo_uri) as proxy:
        settings = through(proxy)
        settings["uri"] += "&serverSelectionTimeoutMS=1000"
        with make_migrator(project, **settings) as migrator:
            migrator.on("run:start", lambda _: proxy.close())  # the network goes away
            with pytest.raises(ConnectionFailedError) as info:
                migrator.up()
    error = info.value
    assert error.exit_code == 5 and error.code == "CONNECTION_FAILED"
    assert error.message.startswith("Lost the connection to MongoDB: ")
    assert error.context["results"] == []
    assert completed(project) == Counter()
    assert names and applied(db) == []


# ----------------------------------------------------------------------- a flaky network


MIGRATIONS = 40
MAX_RUNS = 60


@pytest.mark.slow
def test_runs_through_a_proxy_cutting_every_connection_apply_each_migration_once(
    cli_process: Any, project: Any, db: Any, mongo_uri: str
) -> None:
    names = write_marking(project, MIGRATIONS, linger=0.05)
    exits: list[int] = []
    with TcpProxy.in_front_of(mongo_uri) as proxy, \
            cutting_connections(proxy, 0.05, 0.3, 600.0, seed=20250301):
        env = {"MIGRONAUT_URI": proxy.uri}
        while len(applied(db)) < MIGRATIONS:
            assert len(exits) < MAX_RUNS, f"not done after {MAX_RUNS} runs: {exits}"
            result = cli_process("up", "--json", env=env, timeout=120)
            exits.append(result.exit_code)
            # done, a connection lost outside a body, or a body's own write cut: never exit 1
            assert result.exit_code in (0, 5, 7), (exits, result.stdout, result.stderr)
            if result.exit_code:
                assert result.json["error"]["code"] in (
                    "CONNECTION_FAILED", "MIGRATION_EXECUTION_FAILED"), result.stdout
            assert db[LOCKS].count_documents({}) == 0, (exits, result.stderr)  # released
        assert proxy.cuts > 0

    final = cli_process("up", "--json", timeout=120)  # straight to the server
    assert final.exit_code == 0 and final.json == [], final.stderr
    assert completed(project) == Counter(names), exits  # no completed body ever ran again
    assert db["markers"].distinct("_id") == names
    for name in names:
        assert db[CHANGELOG].count_documents({"name": f"{name}.py"}) == 1
        assert db[CHANGELOG].count_documents({"name": f"{name}.py", "status": "applied"}) == 1
    assert db[LOCKS].count_documents({}) == 0
