"""The async API: the SAME scenarios run against ``Migrator`` and ``AsyncMigrator``.

The ``driver`` fixture is parametrized over both migrators and gives them one call style
(``driver.up()`` returns the result; for ``AsyncMigrator`` each call is ``asyncio.run`` of the
coroutine). Scenarios that only make sense on a running loop (responsiveness, cancellation, the
body running on the caller's loop, ``arun_migrations``) are written once, for ``AsyncMigrator``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from helpers.engine import (
    CHANGELOG,
    LOCKS,
    Events,
    applied,
    calls,
    hold_lock,
    recording_body,
    records,
    write_simple,
)
from migronaut import (
    AsyncMigrator,
    ConfigInvalidError,
    LockAlreadyHeldError,
    MigrationExecutionFailedError,
    Migrator,
    RunAbortedError,
    arun_migrations,
)
from migronaut.core import changelog as changelog_module

KINDS = ["sync", "async"]

ASYNC_BODY = """
import threading
from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
{header}

async def up(ctx):
    assert isinstance(ctx.db, AsyncDatabase), type(ctx.db)
    assert isinstance(ctx.client, AsyncMongoClient), type(ctx.client)
    assert ctx.session is None or isinstance(ctx.session, AsyncClientSession), type(ctx.session)
    await ctx.db["things"].insert_one({{"m": {tag!r}, "session": ctx.session is not None}},
                                      session=ctx.session)
    await ctx.db["calls"].insert_one({{"m": {tag!r}, "dir": "up",
                                       "thread": threading.get_ident()}}, session=ctx.session)
    {extra}

async def down(ctx):
    await ctx.db["things"].delete_many({{"m": {tag!r}}}, session=ctx.session)
    await ctx.db["calls"].insert_one({{"m": {tag!r}, "dir": "down"}}, session=ctx.session)
"""

#: A sync body that blocks its thread until the test inserts ``{"go": true}`` (bounded).
GATED_BODY = """
import time

def up(ctx):
    ctx.db["gate"].insert_one({"started": True})
    deadline = time.monotonic() + 20
    while not ctx.db["gate"].find_one({"go": True}):
        if time.monotonic() > deadline:
            raise RuntimeError("never released: the event loop was blocked")
        time.sleep(0.01)
    ctx.db["calls"].insert_one({"m": "0001_gated", "dir": "up"})

def down(ctx):
    pass
"""


def write_async(project: Any, name: str, *, header: str = "", extra: str = "") -> str:
    project.write_migration(name, ASYNC_BODY.format(header=header, tag=name, extra=extra))
    return f"{name}.py"


class Driver:
    """``Migrator`` or ``AsyncMigrator`` behind one synchronous call style."""

    def __init__(self, migrator: Migrator | AsyncMigrator) -> None:
        self.migrator = migrator
        self.is_async = isinstance(migrator, AsyncMigrator)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.migrator, name)
        if self.is_async and inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: asyncio.run(attr(*args, **kwargs))
        return attr

    def close(self) -> None:
        if isinstance(self.migrator, AsyncMigrator):
            asyncio.run(self.migrator.aclose())
        else:
            self.migrator.close()


def build(kind: str, project: Any, **overrides: Any) -> Migrator | AsyncMigrator:
    settings: dict[str, Any] = {"uri": project.uri, "db_name": project.db_name,
                                "env_file": False, **overrides}
    cls = AsyncMigrator if kind == "async" else Migrator
    return cls(cwd=project.path, **settings)


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest, project: Any) -> Iterator[Callable[..., Driver]]:
    """``make(**config)``: a driver on the test project, for each kind of migrator."""
    made: list[Driver] = []

    def factory(**overrides: Any) -> Driver:
        driver = Driver(build(request.param, project, **overrides))
        made.append(driver)
        return driver

    yield factory
    for driver in made:
        driver.close()


# ------------------------------------------------------------------- shared scenarios


def test_up_status_pending_dry_run_down_redo(make: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    driver = make()
    assert [r.file for r in driver.pending()] == ["0001_a.py", "0002_b.py"]
    assert [r.file for r in driver.dry_run("up")] == ["0001_a.py", "0002_b.py"]
    assert calls(db) == []  # a dry run writes nothing
    assert [(r.file, r.status) for r in driver.up()] == [
        ("0001_a.py", "applied"), ("0002_b.py", "applied")]
    assert [r.status for r in driver.status()] == ["applied", "applied"]
    assert driver.pending() == [] and driver.next_batch() == 2
    assert [(r.file, r.status) for r in driver.redo()] == [
        ("0002_b.py", "reverted"), ("0002_b.py", "applied")]
    assert [r.file for r in driver.dry_run("down")] == ["0002_b.py"]
    assert [(r.file, r.status) for r in driver.down()] == [("0002_b.py", "reverted")]
    assert applied(db) == ["0001_a.py"]
    assert calls(db, "up") == ["0001_a", "0002_b", "0002_b"]
    assert calls(db, "down") == ["0002_b", "0002_b"]
    assert driver.lock_info() is None and db[LOCKS].count_documents({}) == 0


def test_a_held_lock_is_refused_and_can_be_forced_open(make: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db, owner="peer")
    driver = make()
    with pytest.raises(LockAlreadyHeldError) as info:
        driver.up()
    assert info.value.code == "LOCK_ALREADY_HELD"
    assert applied(db) == [] and calls(db) == []
    holder = driver.lock_info()
    assert holder is not None and holder.host == "other-host"
    assert driver.unlock() is not None and driver.lock_info() is None
    driver.up()
    assert applied(db) == ["0001_a.py"]


def test_a_failing_migration_stops_the_run_and_leaves_a_failed_record(
    make: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_bad", "def up(ctx):\n    raise ValueError('boom')\n"
                                        "def down(ctx):\n    pass\n")
    write_simple(project, "0003_c")
    driver = make()
    events = Events(driver.migrator)  # type: ignore[arg-type]
    with pytest.raises(MigrationExecutionFailedError) as info:
        driver.up()
    assert info.value.code == "MIGRATION_EXECUTION_FAILED" and "boom" in info.value.message
    assert records(db)["0002_bad.py"]["status"] == "failed"
    assert applied(db) == ["0001_a.py"] and calls(db) == ["0001_a"]
    assert events.names == [
        "run:start", "lock:acquired",
        "migration:start", "migration:success",
        "migration:start", "migration:error",
        "lock:released", "run:end",
    ]
    assert events.of("run:end")[0]["success"] is False
    assert db[LOCKS].count_documents({}) == 0


def test_async_bodies_get_the_async_colour(make: Any, project: Any, db: Any) -> None:
    files = [write_async(project, "0001_async"), "0002_sync.py"]
    project.write_migration("0002_sync", recording_body("0002_sync"))
    driver = make()
    assert [r.status for r in driver.up()] == ["applied", "applied"]
    assert calls(db) == ["0001_async", "0002_sync"]
    assert db["things"].count_documents({}) == 2
    driver.down(batch=1)  # both, in reverse
    assert calls(db, "down") == ["0002_sync", "0001_async"]
    assert db["things"].count_documents({}) == 0
    assert [records(db)[f]["status"] for f in files] == ["reverted", "reverted"]


def test_async_hooks_get_the_async_colour_and_sync_hooks_the_sync_one(
    make: Any, project: Any, db: Any
) -> None:
    write_simple(project, "0001_a")
    seen: list[str] = []

    async def before_all(ctx: Any) -> None:
        seen.append(type(ctx.db).__name__)
        await ctx.db["hooked"].insert_one({"hook": "before_all"})

    def after_all(ctx: Any, summary: Any) -> None:
        seen.append(type(ctx.db).__name__)

    make(hooks={"before_all": before_all, "after_all": after_all}).up()
    assert seen == ["AsyncDatabase", "Database"]
    assert db["hooked"].count_documents({}) == 1


def test_an_async_body_in_a_transaction_commits_with_its_record(
    make: Any, project: Any, db: Any
) -> None:
    write_async(project, "0001_txn", header="use_transaction = True")
    make().up()
    thing = db["things"].find_one({"m": "0001_txn"})
    assert thing is not None and thing["session"] is True
    assert records(db)["0001_txn.py"]["status"] == "applied"


def test_an_async_transaction_rolls_back_body_and_record_together(
    make: Any, project: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is written inside the async transaction: if the step after it fails, the
    body's write and the record both roll back."""
    original = changelog_module.ChangelogWrite.apply_async

    async def write_then_fail(self: Any, collection: Any, session: Any) -> Any:
        await original(self, collection, session)
        raise RuntimeError("network blip after the changelog write")

    monkeypatch.setattr(changelog_module.ChangelogWrite, "apply_async", write_then_fail)
    write_async(project, "0001_txn", header="use_transaction = True")
    with pytest.raises(MigrationExecutionFailedError) as info:
        make().up()
    assert "network blip" in info.value.message
    assert db["things"].count_documents({}) == 0
    assert records(db)["0001_txn.py"]["status"] == "failed"


def test_a_failing_async_body_in_a_transaction_writes_nothing(
    make: Any, project: Any, db: Any
) -> None:
    write_async(project, "0001_txn", header="use_transaction = True",
                extra="raise ValueError('async boom')")
    with pytest.raises(MigrationExecutionFailedError) as info:
        make().up()
    assert "async boom" in info.value.message
    assert db["things"].count_documents({}) == 0
    assert records(db)["0001_txn.py"]["status"] == "failed"


def test_the_wrong_client_type_is_a_config_error(make: Any, project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    probe = make()
    wrong: Any = MongoClient(project.uri) if probe.is_async else AsyncMongoClient(project.uri)
    try:
        driver = make(uri=None, client=wrong)
        with pytest.raises(ConfigInvalidError) as info:
            driver.up()
        expected = "AsyncMongoClient for AsyncMigrator" if probe.is_async else \
            "must be a pymongo MongoClient, got AsyncMongoClient (use AsyncMigrator"
        assert expected in info.value.message
        assert info.value.code == "CONFIG_INVALID" and info.value.exit_code == 6
        assert calls(db) == [] and CHANGELOG not in db.list_collection_names()
    finally:
        if probe.is_async:
            wrong.close()  # (the AsyncMongoClient of the other case never connected)


# ------------------------------------------------------------- AsyncMigrator on a loop


def migrator_for(project: Any, **overrides: Any) -> AsyncMigrator:
    migrator = build("async", project, **overrides)
    assert isinstance(migrator, AsyncMigrator)
    return migrator


def test_async_bodies_run_on_the_callers_loop(project: Any, db: Any) -> None:
    write_async(project, "0001_async")

    async def main() -> int:
        async with migrator_for(project) as migrator:
            await migrator.up()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert db["calls"].find_one({"m": "0001_async"})["thread"] == loop_thread  # type: ignore[index]


def test_an_injected_async_client_is_used_and_left_open(project: Any, db: Any) -> None:
    write_async(project, "0001_async")

    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(project.uri)
        async with migrator_for(project, uri=None, client=client) as migrator:
            await migrator.up()
        assert await client[project.db_name]["things"].count_documents({}) == 1  # still open
        await client.close()

    asyncio.run(main())
    assert applied(db) == ["0001_async.py"]


def test_the_event_loop_keeps_running_during_a_slow_sync_migration(
    project: Any, db: Any
) -> None:
    project.write_migration("0001_gated", GATED_BODY)

    async def main() -> int:
        ticks = 0
        async with migrator_for(project) as migrator:
            run = asyncio.create_task(migrator.up())
            while not db["gate"].find_one({"started": True}):
                await asyncio.sleep(0.01)
            for _ in range(5):  # the loop ticks while the body blocks its thread
                await asyncio.sleep(0.01)
                ticks += 1
            db["gate"].insert_one({"go": True})
            await run
        return ticks

    assert asyncio.run(main()) == 5
    assert applied(db) == ["0001_gated.py"]


def test_cancelling_the_task_stops_at_the_next_safe_point(project: Any, db: Any) -> None:
    project.write_migration("0001_gated", GATED_BODY)
    write_simple(project, "0002_b")

    async def main() -> Events:
        async with migrator_for(project) as migrator:
            events = Events(migrator.engine)
            run = asyncio.create_task(migrator.up())
            while not db["gate"].find_one({"started": True}):
                await asyncio.sleep(0.01)
            run.cancel()
            await asyncio.sleep(0)  # let the cancellation reach the task (it calls stop())
            db["gate"].insert_one({"go": True})
            with pytest.raises(asyncio.CancelledError):
                await run
        return events

    events = asyncio.run(main())
    assert applied(db) == ["0001_gated.py"]  # the migration in flight finished…
    assert calls(db) == ["0001_gated"]  # …and 0002 never ran
    end = events.of("run:end")[0]
    assert end["success"] is False and "cancelled" in end["error"]
    assert db[LOCKS].count_documents({}) == 0  # the lock was released before CancelledError


def test_arun_migrations_for_a_lifespan(project: Any, db: Any) -> None:
    write_async(project, "0001_async")
    write_simple(project, "0002_b")

    async def main() -> Any:
        return await arun_migrations(uri=project.uri, db_name=project.db_name,
                                     cwd=project.path, env_file=False)

    summary = asyncio.run(main())
    assert [r.file for r in summary.applied] == ["0001_async.py", "0002_b.py"]
    assert summary.up_to_date is False
    again = asyncio.run(main())
    assert again.applied == [] and again.up_to_date is True


def test_arun_migrations_propagates_typed_errors(project: Any, db: Any) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    with pytest.raises(LockAlreadyHeldError):
        asyncio.run(arun_migrations(uri=project.uri, db_name=project.db_name,
                                    cwd=project.path, env_file=False))
    assert applied(db) == []


def test_stop_from_another_task_aborts_the_run(project: Any, db: Any) -> None:
    project.write_migration("0001_gated", GATED_BODY)
    write_simple(project, "0002_b")

    async def main() -> None:
        async with migrator_for(project) as migrator:
            run = asyncio.create_task(migrator.up())
            while not db["gate"].find_one({"started": True}):
                await asyncio.sleep(0.01)
            migrator.stop("maintenance window over")
            db["gate"].insert_one({"go": True})
            with pytest.raises(RunAbortedError) as info:
                await run
            assert info.value.message == "maintenance window over"

    asyncio.run(main())
    assert applied(db) == ["0001_gated.py"]


def test_migrator_twins_an_injected_client_for_async_bodies(
    project: Any, db: Any, client: Any
) -> None:
    write_async(project, "0001_async")
    with Migrator(client=client, db_name=project.db_name, cwd=project.path,
                  env_file=False) as migrator:
        migrator.up()
    assert applied(db) == ["0001_async.py"]
    assert client.admin.command("ping")["ok"] == 1  # the injected client stays open
