"""The in-process :class:`BackgroundRunner` and :func:`work`, against the server: it serves
every runnable migration to completion (coordinator duties included), caps lanes per migration at
``maxParallel``, backs off failing migrations, stops cooperatively (leases released, nothing
counted as a failure) and leaves no thread behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from helpers.background import NAME, PARTITIONS, STATES, leases, register
from helpers.engine import Events, make_migrator, wait_until
from migronaut import Migrator
from migronaut.background.lanes import slices as lanes_module
from migronaut.background.lanes.slices import SliceResult
from migronaut.background.runner import BackgroundRunner, work
from migronaut.core.context import Cancellation
from migronaut.errors import ConfigInvalidError, MigronautError, RunAbortedError


def status(db: Any, name: str = NAME) -> str | None:
    state = db[STATES].find_one({"_id": name}, {"status": 1})
    return None if state is None else str(state["status"])


def ours() -> set[threading.Thread]:
    """Threads this feature starts (lanes, verifier, the engine's drive lanes)."""
    return {t for t in threading.enumerate()
            if t.name.startswith(("migronaut-runner", "migronaut-lane"))}


@pytest.fixture
def migrator(project: Any) -> Iterator[Migrator]:
    with make_migrator(project) as m:
        yield m


def test_options_are_checked_when_built(migrator: Migrator) -> None:
    for kwargs in ({"lanes": 0}, {"lanes": 65}, {"lanes": True}, {"poll_interval_s": 0},
                   {"slice_ms": 0}, {"verify_interval_s": 0.0}, {"names": [""]}):
        with pytest.raises(ConfigInvalidError):
            BackgroundRunner(migrator, **kwargs)


def test_start_stop_with_nothing_to_do_leaks_no_thread(migrator: Migrator) -> None:
    before = set(threading.enumerate())
    runner = BackgroundRunner(migrator, lanes=3, poll_interval_s=0.05)
    assert not runner.running
    runner.start()
    assert runner.running
    assert sorted(t.name for t in ours()) == [
        "migronaut-runner-lane-0", "migronaut-runner-lane-1", "migronaut-runner-lane-2",
        "migronaut-runner-verify"]
    assert runner.start() is runner  # already running: a no-op
    time.sleep(0.2)
    assert runner.stop() is True
    assert not runner.running and not ours()
    assert runner.stop() is True  # idempotent
    assert not {t for t in set(threading.enumerate()) - before if t.name.startswith("migronaut")}


def test_serves_a_migration_to_completion_and_emits_events(project: Any, cli: Any, db: Any,
                                                           migrator: Migrator) -> None:
    register(project, cli, db, docs=300)
    events = Events(migrator)
    with BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05) as runner:
        assert runner.running
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert not runner.running and not ours()
    assert db.users.count_documents({"__v": 1, "__rev": 1, "active": True}) == 300
    stored = db[STATES].find_one({"_id": NAME})
    assert stored is not None and stored["coordinator"]["kind"] == "runner"
    assert stored["totals"]["migrated"] == 300
    names = set(events.names)
    assert {"background:partitioned", "background:slice:start", "background:batch",
            "background:slice:end", "background:completed"} <= names
    stats = runner.stats
    assert stats.slices >= 2 and stats.coordinator_steps >= 2 and stats.failures == 0
    assert stats.counters.get("migrated") == 300
    assert leases(db) == 0


def test_lanes_per_migration_never_exceed_max_parallel(project: Any, cli: Any, db: Any,
                                                       migrator: Migrator,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    register(project, cli, db, docs=200, max_parallel=1, batch_size=20, sleep=0.001)
    active = peak = 0
    guard = threading.Lock()
    real = lanes_module.run_slice

    def counting(**kwargs: Any) -> SliceResult:
        nonlocal active, peak
        with guard:
            active += 1
            peak = max(peak, active)
        try:
            return real(**kwargs)
        finally:
            with guard:
                active -= 1

    monkeypatch.setattr(lanes_module, "run_slice", counting)
    with BackgroundRunner(migrator, lanes=4, poll_interval_s=0.05):
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert peak == 1
    assert db.users.count_documents({"__v": 1, "__rev": 1}) == 200


def test_serves_several_migrations_and_honours_names(project: Any, cli: Any, db: Any,
                                                     migrator: Migrator) -> None:
    register(project, cli, db, docs=60)
    other = register(project, cli, db, docs=60, name="0002_orders_v1", collection="orders")
    with BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05, names=[other]):
        wait_until(lambda: status(db, other) == "completed", timeout=60, what="orders")
        time.sleep(0.3)
        assert status(db) == "pending"  # not ours to serve
    with BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05):
        wait_until(lambda: status(db) == "completed", timeout=60, what="users")
    assert db.users.count_documents({"__v": 1}) == 60
    assert db.orders.count_documents({"__v": 1}) == 60


def test_stop_is_cooperative_mid_work(project: Any, cli: Any, db: Any,
                                      migrator: Migrator) -> None:
    register(project, cli, db, docs=300, batch_size=10, sleep=0.01)
    runner = BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05).start()
    wait_until(lambda: leases(db) > 0, timeout=60, what="a lease")
    wait_until(lambda: db.users.count_documents({"__v": 1}) >= 10, timeout=60, what="a batch")
    assert runner.stop(timeout=30) is True
    assert not runner.running and not ours()
    assert leases(db) == 0
    assert status(db) == "running"
    partitions = list(db[PARTITIONS].find({"background": NAME}))
    assert all(p.get("failures", 0) == 0 and p["status"] != "failed" for p in partitions)
    assert runner.stats.failures == 0
    # what was written was checkpointed: a restart finishes it, each document once
    with BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05):
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert db.users.count_documents({"__v": 1, "__rev": 1}) == 300


def test_failing_turns_back_off_and_reach_on_error(project: Any, cli: Any, db: Any,
                                                   migrator: Migrator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    register(project, cli, db, docs=40)
    real = lanes_module.run_slice
    calls: list[float] = []

    def flaky(**kwargs: Any) -> SliceResult:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise MigronautError("the network blinked")
        return real(**kwargs)

    def broken_listener(error: BaseException, name: str | None) -> None:
        seen.append((error, name))
        raise RuntimeError("on_error must not break the runner")

    seen: list[tuple[BaseException, str | None]] = []
    monkeypatch.setattr(lanes_module, "run_slice", flaky)
    with BackgroundRunner(migrator, lanes=1, poll_interval_s=0.05, on_error=broken_listener):
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert [name for _, name in seen] == [NAME, NAME]
    assert all(isinstance(error, MigronautError) for error, _ in seen)
    # 1 s then 2 s (±20 %) between the failed attempts and the next ones
    assert calls[1] - calls[0] >= 0.75
    assert calls[2] - calls[1] >= 1.5


@pytest.mark.parametrize("planned", [False, True])
def test_a_status_it_does_not_know_is_refused_and_reported_not_passed_over(
    project: Any, cli: Any, db: Any, migrator: Migrator, planned: bool
) -> None:
    """Fail closed: ``background work`` serves a migration whose stored ``status`` migronaut does
    not know only to refuse it — ``STATE_INVALID`` naming the field reaches ``on_error`` (the
    worker's log), and nothing is claimed or written. Before, the runnable list left it out and
    the worker passed over it in silence."""
    register(project, cli, db, docs=40)
    if planned:  # planned and partitioned first: a lane would have something to claim
        assert migrator.background.coordinate(NAME, driver="runner").next == "process"
    db[STATES].update_one({"_id": NAME}, {"$set": {"status": "weird"}})
    before = db[STATES].find_one({"_id": NAME})
    seen: list[tuple[BaseException, str | None]] = []
    with BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05,
                          on_error=lambda error, name: seen.append((error, name))) as runner:
        wait_until(lambda: seen, timeout=30, what="the refusal")
    error, name = seen[0]
    assert name == NAME and isinstance(error, MigronautError), seen
    assert error.code == "STATE_INVALID" and error.exit_code == 35
    assert "has a status migronaut does not understand: 'weird'" in error.message
    assert runner.stats.slices == 0
    assert db[STATES].find_one({"_id": NAME}) == before
    assert leases(db) == 0


@pytest.mark.parametrize(("path", "field", "junk"), [
    ("spec.maxParallel", "spec.maxParallel", "x"), ("spec.maxParallel", "spec.maxParallel", -2),
    ("spec", "spec", "junk"),
])
def test_a_spec_it_cannot_read_is_refused_and_the_others_still_run(
    project: Any, cli: Any, db: Any, migrator: Migrator, path: str, field: str, junk: Any
) -> None:
    """The runnable list read ``spec.maxParallel`` unchecked (``'x'`` stopped every refresh of a
    worker's list with a raw ValueError): the migration is served only to be refused with
    ``STATE_INVALID`` naming the field, and the other migrations run to completion."""
    register(project, cli, db, docs=40)
    other = register(project, cli, db, docs=40, name="0002_orders_v1", collection="orders")
    db[STATES].update_one({"_id": NAME}, {"$set": {path: junk}})
    before = db[STATES].find_one({"_id": NAME})
    seen: list[tuple[BaseException, str | None]] = []
    with BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05,
                          on_error=lambda error, name: seen.append((error, name))):
        wait_until(lambda: seen and status(db, other) == "completed", timeout=60,
                   what="the refusal and the other migration's completion")
    error, name = seen[0]
    assert name == NAME and isinstance(error, MigronautError), seen
    assert error.code == "STATE_INVALID" and error.exit_code == 35
    assert f"has a {field} migronaut does not understand" in error.message
    assert all(n == NAME for _, n in seen), seen
    assert db[STATES].find_one({"_id": NAME}) == before
    assert leases(db) == 0


def test_busy_slices_back_off_without_failing(project: Any, cli: Any, db: Any,
                                              migrator: Migrator,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    register(project, cli, db, docs=40)
    real = lanes_module.run_slice
    calls: list[float] = []

    def busy_first(**kwargs: Any) -> SliceResult:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return SliceResult("busy", retry_after_ms=300)
        return real(**kwargs)

    monkeypatch.setattr(lanes_module, "run_slice", busy_first)
    with BackgroundRunner(migrator, lanes=1, poll_interval_s=0.5) as runner:
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert calls[1] - calls[0] >= 0.25
    assert runner.stats.failures == 0 and runner.stats.outcomes.get("busy") == 1


def test_a_runner_answered_busy_takes_the_work_when_the_holder_stops(
    project: Any, cli: Any, db: Any
) -> None:
    """Two runners on one migration: the first holds both slots of ``max_parallel`` 2, the
    second is answered ``busy`` and looks again within its poll interval (not the lease's
    ttl/2, five minutes here), so it takes the work over as soon as a slot is free."""
    register(project, cli, db, docs=200, max_parallel=2, batch_size=5, sleep=0.02)
    with make_migrator(project, lock_ttl_seconds=600) as first_host, \
            make_migrator(project, lock_ttl_seconds=600) as second_host:
        first = BackgroundRunner(first_host, lanes=2, poll_interval_s=0.05,
                                 slice_ms=600_000).start()
        second = BackgroundRunner(second_host, lanes=2, poll_interval_s=0.05)
        try:
            wait_until(lambda: leases(db) == 2, timeout=60, what="both slots held")
            wait_until(lambda: db.users.count_documents({"active": True}) >= 20, timeout=60,
                       what="the first runner's lanes past their first batches")
            second.start()
            wait_until(lambda: second.stats.outcomes.get("busy", 0) >= 1
                       or second.stats.counters.get("migrated", 0) > 0,
                       timeout=60, what="the second runner asking")
        finally:
            assert first.stop() is True
        try:
            wait_until(lambda: status(db) == "completed", timeout=60,
                       what="the second runner finishing")
        finally:
            assert second.stop() is True
    assert 0 < first.stats.counters.get("migrated", 0) < 200
    assert second.stats.counters.get("migrated", 0) > 0
    assert second.stats.failures == 0
    assert db.users.count_documents({"__v": 1, "__rev": 1, "active": True}) == 200
    stored = db[STATES].find_one({"_id": NAME})
    assert stored is not None and stored["totals"]["migrated"] == 200
    assert leases(db) == 0


def test_a_timed_out_state_read_is_a_typed_slice_failure_and_writes_nothing(
    tmp_path: Any, failpoint_uri: str, failpoint_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run_slice`` reads the state itself when not handed one: a server timeout there
    (``ExecutionTimeout``, code 50) is the slice's typed failure, not a raw driver error."""
    import uuid

    from conftest import project_on
    from helpers.background import migration
    from helpers.failpoints import fail_command

    db_name = f"t_{uuid.uuid4().hex[:12]}"
    db = failpoint_client[db_name]
    try:
        project = project_on(tmp_path, failpoint_uri, db_name, monkeypatch)
        db.users.insert_many([{"n": i} for i in range(20)])
        project.write_migration("0001_users_v1", migration())
        with make_migrator(project) as migrator:
            migrator.up()
            engine = migrator.background
            before = (db[STATES].find_one({"_id": NAME}),
                      list(db[PARTITIONS].find({}, sort=[("_id", 1)])))
            with fail_command(failpoint_client, ["find"], times=1, error_code=50), \
                    pytest.raises(MigronautError) as raised:
                engine.run_slice(NAME)
        error = raised.value
        assert error.code == "MIGRATION_EXECUTION_FAILED" and error.exit_code == 7
        assert error.context["migration"] == NAME
        assert "a slice failed" in error.message
        assert (db[STATES].find_one({"_id": NAME}),
                list(db[PARTITIONS].find({}, sort=[("_id", 1)]))) == before
        assert db.users.count_documents({"__v": 1}) == 0
    finally:
        failpoint_client.drop_database(db_name)


def test_a_lane_losing_every_slice_counts_backs_off_and_says_so(
    project: Any, cli: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One lost lease is ordinary (the next turn at once); from the third in a row each is a
    failing turn — counted, handed to ``on_error``, warned and backed off — never a silent spin."""
    from helpers.engine import captured_logger

    register(project, cli, db, docs=40)
    calls: list[float] = []

    def always_lost(**kwargs: Any) -> SliceResult:
        calls.append(time.monotonic())
        return SliceResult("lost")

    monkeypatch.setattr(lanes_module, "run_slice", always_lost)
    seen: list[tuple[BaseException, str | None]] = []
    with captured_logger() as (logger, handler), make_migrator(project, logger=logger) as m:
        with BackgroundRunner(m, lanes=1, poll_interval_s=0.01,
                              on_error=lambda error, name: seen.append((error, name))) as runner:
            wait_until(lambda: runner.stats.failures >= 2, timeout=30, what="two failed turns")
        stats = runner.stats
    assert stats.outcomes.get("lost", 0) == len(calls) >= 4
    assert len(calls) <= stats.failures + 3  # backed off: one slice per failed turn after two
    error, name = seen[0]
    assert name == NAME and isinstance(error, MigronautError) and error.code == "LOCK_LOST"
    assert "3 slices in a row lost their partition's lease" in error.message
    assert any("slices in a row lost" in r.getMessage() for r in handler.records)
    assert status(db) == "running"


def test_paused_migration_is_left_alone_until_resumed(project: Any, cli: Any, db: Any,
                                                      migrator: Migrator) -> None:
    register(project, cli, db, docs=40)
    migrator.background.control(NAME, "pause")
    with BackgroundRunner(migrator, lanes=1, poll_interval_s=0.05) as runner:
        time.sleep(0.4)
        assert status(db) == "paused" and runner.stats.slices == 0
        migrator.background.control(NAME, "resume")
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")


def test_work_serves_until_cancelled(project: Any, cli: Any, db: Any,
                                     migrator: Migrator) -> None:
    register(project, cli, db, docs=100)
    cancel = Cancellation()
    result: dict[str, Any] = {}

    def serve() -> None:
        result["stats"] = work(migrator, lanes=2, cancellation=cancel, poll_interval_s=0.05)

    thread = threading.Thread(target=serve, name="test-work")
    thread.start()
    wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert thread.is_alive()  # a worker keeps serving after the work is done
    cancel.cancel(RunAbortedError("test over"))
    thread.join(15)
    assert not thread.is_alive() and not ours()
    assert result["stats"].counters.get("migrated") == 100
    assert leases(db) == 0


def test_an_outside_cancellation_stops_the_runner(migrator: Migrator) -> None:
    cancel = Cancellation()
    runner = BackgroundRunner(migrator, lanes=2, poll_interval_s=0.05, cancellation=cancel)
    runner.start()
    assert runner.running
    cancel.cancel(RunAbortedError("shutting down"))
    wait_until(lambda: not any(t.is_alive() for t in ours()), timeout=5, what="lanes to end")
    assert not runner.running
    assert runner.stop() is True


def test_the_verifier_reopens_drift_and_the_lanes_finish_it(project: Any, cli: Any, db: Any,
                                                            migrator: Migrator) -> None:
    register(project, cli, db, docs=30)
    with BackgroundRunner(migrator, lanes=1, poll_interval_s=0.05, verify_interval_s=0.2):
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
        db.users.insert_one({"n": "late"})  # an old writer is still around
        wait_until(lambda: db.users.count_documents({"__v": 1}) == 31, timeout=60,
                   what="the late document to be migrated")
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion again")
    stored = db[STATES].find_one({"_id": NAME})
    assert stored is not None and stored["reopened"] == 1


# ------------------------------------------------------- the hosted live drift watcher (§6.3)


def test_the_drift_mode_stream_hosts_the_watcher_or_degrades_to_the_poll_without_streams(
    project: Any, cli: Any, db: Any, server_hello: dict[str, Any], caplog: Any
) -> None:
    """``background_drift = 'stream'`` makes the runner host the live watcher. Change streams
    need a replica set: on a server without them (the dev server) the runner warns, hands the
    ``CONFIG_INVALID`` refusal to ``on_error`` and serves on, drift left to the poll."""
    register(project, cli, db, docs=120)
    errors: list[tuple[BaseException, str | None]] = []
    with make_migrator(project, background_drift="stream") as streaming, BackgroundRunner(
        streaming, lanes=1, poll_interval_s=0.05,
        on_error=lambda error, name: errors.append((error, name)),
    ) as runner:
        if server_hello.get("setName"):
            assert runner.watcher is not None and runner.watcher.running
            assert runner.watch_error is None
        else:
            assert runner.watcher is None
            assert runner.watch_error is not None
            assert runner.watch_error.code == "CONFIG_INVALID"
            assert "change streams" in runner.watch_error.message
            assert [(e.code, name) for e, name in errors
                    if isinstance(e, MigronautError)] == [("CONFIG_INVALID", None)]
            assert any("drift is left to the poll" in r.getMessage() for r in caplog.records)
        wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    assert runner.watcher is None and not ours()
    assert not any(t.name.startswith("migronaut-watch") for t in threading.enumerate())


def test_the_poll_mode_hosts_no_watcher_and_an_explicit_watch_is_refused_without_streams(
    project: Any, server_hello: dict[str, Any], caplog: Any
) -> None:
    with make_migrator(project) as polling:  # background_drift defaults to 'poll'
        with BackgroundRunner(polling, poll_interval_s=0.05) as runner:
            assert runner.watcher is None and runner.watch_error is None
        assert not any("drift watcher" in r.getMessage() for r in caplog.records)
        with pytest.raises(ConfigInvalidError):
            BackgroundRunner(polling, watch="yes")  # type: ignore[arg-type]
        if not server_hello.get("setName"):
            explicit = BackgroundRunner(polling, watch=True, poll_interval_s=0.05)
            with pytest.raises(ConfigInvalidError, match="change streams"):
                explicit.start()
            explicit.stop()
    assert not ours()


@pytest.mark.standalone
def test_background_work_with_the_stream_drift_mode_says_the_watcher_degraded(
    project: Any, cli: Any, db: Any, cli_process: Any
) -> None:
    import signal

    register(project, cli, db, docs=60)
    worker = cli_process.start("background", "work", "--poll", "0.1",
                               env={"MIGRONAUT_BACKGROUND_DRIFT": "stream"})
    wait_until(lambda: status(db) == "completed", timeout=60, what="completion")
    worker.send_signal(signal.SIGTERM)
    result = cli_process.wait(worker, timeout=60)
    assert result.exit_code == 0, result.stderr
    assert "live drift watcher cannot start" in result.stderr
    assert "drift is left to the poll" in result.stderr
