"""A fleet run fanned out on the Celery migration queue, on a real worker and the test's own
Redis database: ``fleet enqueue up`` over four tenants, a redelivered tenant task, junk payloads,
the canary stage and the failure budget — each checked against what every tenant's database and
the fleet run record hold. The scheduling rules themselves are checked without a worker."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pymongo import MongoClient

from conftest import Project
from helpers.celery_worker import CeleryWorker, workers
from helpers.fleet import counters, fleet_project
from helpers.queue_migrations import until
from migronaut import Fleet
from migronaut.celery import enqueue_fleet
from migronaut.errors import EXIT_CODES, StateInvalidError
from migronaut.executors.celery.fleet_tasks import Plan, decide, read_plan
from migronaut.fleet.runner import FAILED, SKIPPED_BUDGET, SKIPPED_CANARY, STARTED, SUCCEEDED
from migronaut.fleet.runs import TenantEntry
from migronaut.fleet.schedule import FleetPolicy
from migronaut.fleet.tenants import Tenant


def finished(project: Project, run_id: str, timeout: float = 90.0) -> Any:
    """The run's record once the coordinating steps ended it."""
    with Fleet(cwd=project.path) as fleet:
        until(lambda: fleet.logs(run_id).outcome != "running", timeout, "the fleet run to end")
        return fleet.logs(run_id)


def enqueue(cli: Any, *args: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    result = cli("fleet", "enqueue", "up", "--json", *args, env=env)
    assert result.exit_code == 0, result.stderr
    sent: dict[str, Any] = result.json
    return sent


def test_enqueue_up_runs_each_tenant_once_and_refuses_junk(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, cli: Any) -> None:
    names = fleet_project(project, tenant_prefix, tenants=4)
    with workers(celery_project.worker(concurrency=4)):
        sent = enqueue(cli, "--canary", "1", "--concurrency", "2",
                       "--tenants", f"{tenant_prefix}[abc]")
        assert sent["total"] == 3 and sent["canary"] == [names[0]]
        record = finished(project, sent["runId"])
        assert (record.outcome, record.counts()[SUCCEEDED]) == ("succeeded", 3)
        assert all(counters(client, n) == {"m1": 1, "m2": 1} for n in names[:3])
        assert {e.changed for e in record.tenants} == {2}
        with Fleet(cwd=project.path) as fleet:
            counts = fleet.status().counts()
            assert (counts["up-to-date"], counts["pending"]) == (3, 1)
        app, _ = celery_project.app()
        payload = {"v": 1, "kind": "fleet-tenant", "runId": sent["runId"], "tenant": names[2],
                   "cluster": "default", "command": "up"}
        # a redelivered tenant task returns the recorded outcome and touches nothing
        again = app.send_task("migronaut.fleet-tenant", args=(payload,),
                              queue=celery_project.queue).get(timeout=60)
        assert (again["state"], again["redelivered"]) == (SUCCEEDED, True)
        assert counters(client, names[2]) == {"m1": 1, "m2": 1}
        for junk, field in (({**payload, "tenant": "no/slash"}, "tenant"),
                            ({**payload, "tenant": f"{tenant_prefix}zz"}, "tenant"),
                            ({**payload, "tenant": names[3]}, "never sent"),
                            ({**payload, "command": "drop"}, "command"),
                            ({**payload, "runId": "nobody"}, "runId"),
                            ({**payload, "extra": 1}, "extra")):
            refused = app.send_task("migronaut.fleet-tenant", args=(junk,),
                                    queue=celery_project.queue)
            with pytest.raises(Exception) as error:
                refused.get(timeout=60)
            assert getattr(error.value, "code", None) == "QUEUE_JOB_INVALID", error.value
            assert field in str(error.value)
            assert refused.state == "FAILURE"  # failed once, never retried
        assert client[f"{tenant_prefix}zz"].list_collection_names() == []
        assert client[names[3]].list_collection_names() == []  # outside the run: untouched
    assert finished(project, sent["runId"]).counts()[SUCCEEDED] == 3


def test_a_failed_canary_leaves_the_other_tenants_untouched(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, cli: Any) -> None:
    names = fleet_project(project, tenant_prefix, tenants=4, fail="_a")
    # a fleet project's workers and producer need no database of their own
    env = {k: v for k, v in celery_project.env().items() if k != "MIGRONAUT_DB"}
    worker = CeleryWorker(celery_project.path, env, (celery_project.queue,)).start()
    with workers(worker):
        sent = enqueue(cli, "--canary", "1", env={"MIGRONAUT_DB": None})
        record = finished(project, sent["runId"])
    states = {e.name: e.state for e in record.tenants}
    assert states == {names[0]: FAILED, **dict.fromkeys(names[1:], SKIPPED_CANARY)}
    assert record.outcome == "partial"
    assert all(client[n].list_collection_names() == [] for n in names[1:])


def test_the_failure_budget_stops_new_tenants_then_a_larger_one_lets_the_rest_run(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, cli: Any) -> None:
    names = fleet_project(project, tenant_prefix, tenants=4, fail="_b")
    with workers(celery_project.worker(concurrency=2)):
        first = finished(project, enqueue(cli, "--max-failures", "0",
                                          "--concurrency", "1")["runId"])
        assert {e.name: e.state for e in first.tenants} == {
            names[0]: SUCCEEDED, names[1]: FAILED, names[2]: SKIPPED_BUDGET,
            names[3]: SKIPPED_BUDGET}
        assert first.tenants[1].error is not None
        assert client[names[2]].list_collection_names() == []
        app, _ = celery_project.app()
        with Fleet(cwd=project.path) as fleet:  # the API: the app itself, no result backend
            sent = enqueue_fleet(app, fleet, max_failures=1, reason="second try")
        assert sent.to_json()["total"] == 4
        second = finished(project, sent.run_id)
    assert second.counts()[SUCCEEDED] == 2 and second.counts()[FAILED] == 1
    assert all(counters(client, n) == {"m1": 1, "m2": 1} for n in (names[0], *names[2:]))


# -- the rules, without a worker ----------------------------------------------------------------
def _plan(count: int, **policy: Any) -> Plan:
    tenants = [Tenant(f"t{i}", "default" if i % 2 else "east") for i in range(count)]
    return Plan("up", tenants, FleetPolicy(**policy), None, 0, {})


def _entries(**states: str) -> dict[str, TenantEntry]:
    now = dt.datetime.now(dt.UTC)
    return {name: TenantEntry(name, "default", state, now) for name, state in states.items()}


def test_a_step_sends_the_canary_first_then_the_rest_within_the_concurrency() -> None:
    plan = _plan(6, canary=2, concurrency=3)
    assert [t.name for t in decide(plan, {}).send] == ["t0", "t1"]
    assert decide(plan, _entries(t0=SUCCEEDED, t1=STARTED)).send == []
    after = decide(plan, _entries(t0=SUCCEEDED, t1=SUCCEEDED))
    assert [t.name for t in after.send] == ["t2", "t3", "t4"] and after.final is None
    capped = decide(_plan(6, per_cluster_concurrency=1, concurrency=4), {})
    assert [t.name for t in capped.send] == ["t0", "t1"]  # one per cluster


def test_a_step_ends_the_run_once_nothing_runs_and_the_budget_is_spent() -> None:
    plan = _plan(4, max_failures=0, concurrency=2)
    waiting = decide(plan, _entries(t0=FAILED, t1=STARTED))
    assert waiting.send == [] and waiting.final is None  # t1 finishes first
    over = decide(plan, _entries(t0=FAILED, t1=SUCCEEDED))
    assert over.final is not None
    assert [o.state for o in over.final] == [FAILED, SUCCEEDED, SKIPPED_BUDGET, SKIPPED_BUDGET]


def test_a_plan_the_step_does_not_understand_is_state_invalid() -> None:
    good = {"_id": "r1", "queue": _plan(2).to_document()}
    assert [t.name for t in read_plan(good).tenants] == ["t0", "t1"]
    for path, value in (("tenants", [["default"]]), ("concurrency", 0), ("command", "drop"),
                        ("v", 2), ("onLock", "maybe")):
        with pytest.raises(StateInvalidError) as error:
            read_plan({"_id": "r1", "queue": {**good["queue"], path: value}})
        assert error.value.code == "STATE_INVALID" and f"queue.{path}" in error.value.message
        assert error.value.exit_code == EXIT_CODES["STATE_INVALID"]


def test_bad_enqueue_flags_are_refused_before_anything_is_written(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str,
        cli: Any) -> None:
    from migronaut.errors import EXIT_CODES

    fleet_project(project, tenant_prefix, tenants=4)
    for args, named in ((("up", "--canary", "x"), "--canary"),
                        (("up", "--steps", "2"), "--steps"),
                        (("up", "--concurrency", "0"), "--concurrency"),
                        (("up", "--max-failures", "-1"), "--max-failures"),
                        (("up", "--tenants", "nobody_*"), "nobody_*")):
        result = cli("fleet", "enqueue", *args, "--json")
        error = result.json["error"]
        assert result.exit_code == EXIT_CODES[error["code"]] != 0, result.stdout
        assert error["code"] in ("CONFIG_INVALID", "FLEET_INVALID")
        assert named.lstrip("-").replace("-", "_") in error["message"].replace("-", "_")
    project.write("migronaut.toml", "")
    result = cli("fleet", "enqueue", "up", "--json")
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert "no fleet" in result.json["error"]["message"]
    assert f"{tenant_prefix}admin" not in client.list_database_names()  # no run recorded
