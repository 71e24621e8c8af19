"""Fleet runs through the API over the wire: up/down/converge/audit over six tenants, canary,
failure budget, held locks, the run record and the events, each checked against what every
tenant's database holds."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from conftest import Project
from helpers.fleet import counters, fleet_project
from migronaut import Fleet, Migrator
from migronaut.errors import ConfigInvalidError, FleetInvalidError, StateInvalidError
from migronaut.fleet.runner import (
    FAILED,
    SKIPPED_BUDGET,
    SKIPPED_CANARY,
    SKIPPED_LOCKED,
    SUCCEEDED,
    UP_TO_DATE,
)


def test_up_down_converge_and_audit_over_six_tenants(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix)
    seen: list[tuple[str, Any]] = []
    with Fleet(cwd=project.path) as fleet:
        fleet.on("*", lambda payload: seen.append((payload.get("runId"), payload)))
        result = fleet.up(concurrency=3)
        assert result.ok and result.counts()[SUCCEEDED] == 6, result.to_json()
        assert all(counters(client, n) == {"m1": 1, "m2": 1} for n in names)
        assert all(o.changed == 2 and [r["status"] for r in o.result] == ["applied"] * 2
                   for o in result.outcomes)
        again = fleet.up()
        assert again.counts()[UP_TO_DATE] == 6 and all(o.result == [] for o in again.outcomes)
        down = fleet.down(steps=1)
        assert down.ok and all(counters(client, n) == {"m1": 1, "m2": 0} for n in names)
        assert fleet.status().counts()["pending"] == 6
        assert fleet.converge().ok
        audit = fleet.audit()
        assert {o.state for o in audit.outcomes} <= {SUCCEEDED, FAILED}
        record = fleet.logs(result.run_id)
        assert (record.command, record.outcome, record.total) == ("up", "succeeded", 6)
        assert [(e.name, e.state, e.changed) for e in record.tenants] == \
            [(n, SUCCEEDED, 2) for n in names]
        assert fleet.logs(result.run_id[:8]).run_id == result.run_id
        assert [r.command for r in fleet.runs()] == ["audit", "converge", "down", "up", "up"]
    ids = {run_id for run_id, _ in seen}
    assert result.run_id in ids and len(ids) == 5  # one per run
    kinds = [p for rid, p in seen if rid == result.run_id]
    assert len(kinds) == 1 + 6 + 6 + 1  # fleet:start, 6 starts, 6 ends, fleet:end


def test_a_canary_failure_leaves_every_other_tenant_untouched(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, fail="_b")
    with Fleet(cwd=project.path) as fleet:
        result = fleet.up(canary=2, concurrency=4)
    states = {o.tenant.name: o.state for o in result.outcomes}
    assert states == {names[0]: SUCCEEDED, names[1]: FAILED,
                      **{n: SKIPPED_CANARY for n in names[2:]}}
    for name in names[2:]:
        assert client[name].list_collection_names() == []  # not even a changelog
    error = result.error()
    assert error is not None and (error.code, error.exit_code) == ("FLEET_PARTIAL", 38)
    assert names[1] in error.message
    failed = next(t for t in error.context["tenants"] if t["tenant"] == names[1])
    assert failed["error"]["code"] == "MIGRATION_EXECUTION_FAILED"


def test_max_failures_zero_stops_new_tenants_and_a_budget_lets_the_rest_complete(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, fail="_c")
    with Fleet(cwd=project.path) as fleet:
        stopped = fleet.up(max_failures=0, concurrency=1)
    assert [o.state for o in stopped.outcomes] == \
        [SUCCEEDED, SUCCEEDED, FAILED, SKIPPED_BUDGET, SKIPPED_BUDGET, SKIPPED_BUDGET]
    assert all(client[n].list_collection_names() == [] for n in names[3:])
    with Fleet(cwd=project.path) as fleet:
        budget = fleet.up(max_failures=1, concurrency=2)
    assert {o.tenant.name: o.state for o in budget.outcomes} == {
        names[0]: UP_TO_DATE, names[1]: UP_TO_DATE, names[2]: FAILED,
        **{n: SUCCEEDED for n in names[3:]}}
    assert budget.to_json()["failed"] == [names[2]]
    assert all(counters(client, n) == {"m1": 1, "m2": 1} for n in names if n != names[2])


def test_a_locked_tenant_is_skipped_and_never_run_twice(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=3)
    client[names[1]]["_migronaut_locks"].insert_one({
        "_id": "migronaut_lock", "lockedAt": __import__("datetime").datetime.now(),
        "owner": "someone-else", "host": "elsewhere", "pid": 1, "ttlMs": 600_000,
        "heartbeatAt": __import__("datetime").datetime.now()})
    with Fleet(cwd=project.path) as fleet:
        assert {s.tenant.name: s.state for s in fleet.status().tenants}[names[1]] == "locked"
        result = fleet.up()
    states = {o.tenant.name: o.state for o in result.outcomes}
    assert states == {names[0]: SUCCEEDED, names[1]: SKIPPED_LOCKED, names[2]: SUCCEEDED}
    assert counters(client, names[1]) == {}


def test_bad_policy_options_are_refused_before_anything_runs(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=2)
    with Fleet(cwd=project.path) as fleet:
        for options, says in (({"concurrency": 0}, "concurrency"), ({"order": "x"}, "order"),
                              ({"on_lock": "block"}, "on_lock"), ({"canary": -1}, "canary"),
                              ({"speed": 1}, "speed")):
            with pytest.raises(ConfigInvalidError, match=says):
                fleet.up(**options)
        with pytest.raises(ConfigInvalidError, match="steps"):
            fleet.down(steps=0)
        with pytest.raises(FleetInvalidError, match="No fleet run"):
            fleet.logs("nope")
    assert not any(client[n].list_collection_names() for n in names)


def test_a_record_we_did_not_write_is_state_invalid(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    fleet_project(project, tenant_prefix, tenants=1)
    runs = client[f"{tenant_prefix}admin"].fleet_runs
    runs.insert_one({"_id": "x1", "v": 2})
    with Fleet(cwd=project.path) as fleet, pytest.raises(StateInvalidError, match=r"'x1'.* v"):
        fleet.logs("x1")
    runs.replace_one({"_id": "x1"}, {"v": 1, "command": "up", "outcome": "running",
                                     "host": "h", "pid": 1, "startedAt": 3})
    with Fleet(cwd=project.path) as fleet, pytest.raises(StateInvalidError,
                                                         match="startedAt") as raised:
        fleet.logs("x1")
    assert (raised.value.code, raised.value.exit_code) == ("STATE_INVALID", 35)


def test_the_ordinary_migrator_and_the_fleet_see_the_same_truth(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=2)
    with Migrator(cwd=project.path, db_name=names[0]) as migrator:
        migrator.up()
    with Fleet(cwd=project.path) as fleet:
        result = fleet.up(order="size")
    assert {o.tenant.name: o.state for o in result.outcomes} == {
        names[0]: UP_TO_DATE, names[1]: SUCCEEDED}
    with Migrator(cwd=project.path, db_name=names[1]) as migrator:
        assert [r.status for r in migrator.status()] == ["applied", "applied"]


DEAD_URI = "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"


def test_an_unreachable_cluster_fails_its_tenants_and_the_rest_go_on(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=2,
                          extra=f'[fleet.clusters.dead]\nuri = "{DEAD_URI}"\n'
                                f'names = ["{tenant_prefix}x", "{tenant_prefix}y"]')
    with Fleet(cwd=project.path) as fleet:
        result = fleet.up()
    states = {o.tenant.name: (o.state, (o.error or {}).get("code")) for o in result.outcomes}
    assert states == {names[0]: (SUCCEEDED, None), names[1]: (SUCCEEDED, None),
                      f"{tenant_prefix}x": (FAILED, "CONNECTION_FAILED"),
                      f"{tenant_prefix}y": (FAILED, "CONNECTION_FAILED")}
    assert all(counters(client, n) == {"m1": 1, "m2": 1} for n in names)


def test_an_in_doubt_tenant_is_refused_and_reported(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=2)
    client[names[0]]["_migronaut_migrations"].insert_one({
        "name": "20260101000001_m1.py", "status": "running",
        "intent": {"runId": "r", "lockOwner": "o", "host": "h", "pid": 1, "direction": "up",
                   "previous": "pending"}})
    with Fleet(cwd=project.path) as fleet:
        assert fleet.status().counts()["in-doubt"] == 1
        result = fleet.up()
    first = result.outcomes[0]
    assert (first.state, first.error["code"]) == (FAILED, "MIGRATION_IN_DOUBT")
    assert counters(client, names[0]) == {} and result.outcomes[1].state == SUCCEEDED


def test_on_lock_wait_waits_a_bounded_time_then_reports_locked(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    import datetime as dt

    names = fleet_project(project, tenant_prefix, tenants=1)
    now = dt.datetime.now(dt.UTC)
    client[names[0]]["_migronaut_locks"].insert_one({
        "_id": "migronaut_lock", "lockedAt": now, "owner": "someone-else", "host": "elsewhere",
        "pid": 1, "ttlMs": 600_000, "heartbeatAt": now})
    commands: list[str] = []
    with Fleet(cwd=project.path) as fleet:
        fleet.on("fleet:tenant:end", lambda payload: commands.append(payload["state"]))
        result = fleet.up(on_lock="wait", lock_wait_ms=300)
    assert [o.state for o in result.outcomes] == [SKIPPED_LOCKED] == commands
    assert result.outcomes[0].error["code"] == "LOCK_ALREADY_HELD"
    assert counters(client, names[0]) == {}


def test_the_async_fleet_runs_and_each_tenant_gets_a_span(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    import asyncio

    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from migronaut import AsyncFleet

    names = fleet_project(project, tenant_prefix, tenants=3, fail="_b")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def main() -> Any:
        async with AsyncFleet(cwd=project.path,
                              telemetry={"tracer": provider.get_tracer("t")}) as fleet:
            return await fleet.up(concurrency=2)

    result = asyncio.run(main())
    assert [o.state for o in result.outcomes] == [SUCCEEDED, FAILED, SUCCEEDED]
    spans = {dict(s.attributes or {})["db.namespace"]: s
             for s in exporter.get_finished_spans() if s.name == "migronaut.fleet.tenant"}
    assert set(spans) == set(names)
    failed = spans[names[1]]
    assert dict(failed.attributes or {})["error.type"] == "MIGRATION_EXECUTION_FAILED"
    runs = [s for s in exporter.get_finished_spans() if s.name == "migronaut.run"]
    assert {s.parent.span_id for s in runs if s.parent} <= {
        s.context.span_id for s in spans.values()}
    assert len(runs) == 3


def test_stop_starts_no_more_tenants_and_the_next_run_goes_on(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=4)
    with Fleet(cwd=project.path) as fleet:
        fleet.on("fleet:tenant:end", lambda payload: fleet.stop("enough"))
        stopped = fleet.up(concurrency=1)
        assert [o.state for o in stopped.outcomes] == [SUCCEEDED] + ["skipped-stopped"] * 3
        assert stopped.outcome == "stopped" and fleet.logs().outcome == "stopped"
        assert all(client[n].list_collection_names() == [] for n in names[1:])
    with Fleet(cwd=project.path) as fleet:
        assert fleet.up().counts() == {**dict.fromkeys(
            ("succeeded", "up-to-date", "failed", "skipped-locked", "skipped-budget",
             "skipped-canary", "skipped-stopped"), 0), "succeeded": 3, "up-to-date": 1}


def test_the_run_record_is_written_in_a_few_batched_updates(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    from pymongo import monitoring

    class Writes(monitoring.CommandListener):
        def __init__(self) -> None:
            self.seen: list[str] = []

        def started(self, event: monitoring.CommandStartedEvent) -> None:
            if event.database_name == f"{tenant_prefix}admin":
                self.seen.append(event.command_name)

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            pass

    names = fleet_project(project, tenant_prefix)
    writes = Writes()
    with Fleet(cwd=project.path, client_options={"event_listeners": [writes]}) as fleet:
        result = fleet.up(concurrency=3)
        record = fleet.logs(result.run_id)
    # 12 state changes (6 starts, 6 ends) and the end of the run in at most 6 + 2 updates
    assert writes.seen.count("insert") == 1
    assert 2 <= writes.seen.count("update") <= len(names) + 2, writes.seen
    assert {e.state for e in record.tenants} == {SUCCEEDED} and record.outcome == "succeeded"


def test_per_cluster_concurrency_caps_each_cluster(
        project: Project, client: MongoClient[dict[str, Any]], mongo_uri: str,
        tenant_prefix: str) -> None:
    more = [f"{tenant_prefix}x{i}" for i in range(3)]
    names = fleet_project(project, tenant_prefix, tenants=3,
                          extra=f'[fleet.clusters.other]\nuri = "{mongo_uri}"\nnames = {more!r}')
    running: dict[str, int] = {}
    peaks: dict[str, int] = {}

    def started(payload: dict[str, Any]) -> None:
        running[payload["cluster"]] = running.get(payload["cluster"], 0) + 1
        peaks[payload["cluster"]] = max(peaks.get(payload["cluster"], 0),
                                        running[payload["cluster"]])

    def ended(payload: dict[str, Any]) -> None:
        running[payload["cluster"]] -= 1

    with Fleet(cwd=project.path) as fleet:
        fleet.on("fleet:tenant:start", started).on("fleet:tenant:end", ended)
        result = fleet.up(concurrency=4, per_cluster_concurrency=1)
    assert result.ok and len(result.outcomes) == 6
    assert peaks == {"default": 1, "other": 1}
    assert all(counters(client, n) == {"m1": 1, "m2": 1} for n in names + more)


def test_throttled_flushes_write_at_most_four_times_a_second_and_lose_no_entry(
        client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    """Between two throttled writes the entries wait (the next flush writes them all); the
    run's end writes whatever is left, so the record misses no tenant."""
    import datetime as dt

    from migronaut.fleet.runs import FLUSH_INTERVAL_S, FleetRunStore, TenantEntry

    collection = client[f"{tenant_prefix}admin"]["fleet_runs"]
    store = FleetRunStore(collection)
    store.start("r1", "up", {}, 3)
    assert store.due_in() is None  # nothing noted, nothing to wake up for
    now = dt.datetime.now(dt.UTC)
    store.note(TenantEntry("t1", "default", SUCCEEDED, now))
    store.flush(throttled=True)  # the first write goes at once
    store.note(TenantEntry("t2", "default", SUCCEEDED, now))
    store.flush(throttled=True)  # within the interval: kept for later
    assert set(collection.find_one({"_id": "r1"})["tenants"]) == {"t1"}
    due = store.due_in()
    assert due is not None and 0 < due <= FLUSH_INTERVAL_S
    store.note(TenantEntry("t3", "default", FAILED, now))
    store.end("partial")
    document = collection.find_one({"_id": "r1"})
    assert set(document["tenants"]) == {"t1", "t2", "t3"} and document["outcome"] == "partial"
    assert store.due_in() is None
