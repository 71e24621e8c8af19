"""A fleet's background migrations worked through Celery: ``fleet enqueue up`` over three
tenants, each registering a background migration, on a real worker and the test's own Redis
database — every tenant's migration completes with every document migrated exactly once, in its
own database; with ``--no-background`` none is started. Then the tenant jobs' payloads and ids,
without a worker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pymongo import MongoClient

from conftest import Project
from helpers.background import PARTITIONS, STATES
from helpers.celery_worker import redis_client, workers
from helpers.queue_migrations import until
from migronaut import Fleet, QueueJobInvalidError
from migronaut.executors.celery.background_producer import (
    coordinator_id,
    lane_id,
    takeover_id,
    tenant_of,
)
from migronaut.executors.celery.fleet_tasks import Plan, read_plan
from migronaut.executors.celery.payloads import validate
from migronaut.fleet.runner import SUCCEEDED
from migronaut.fleet.schedule import FleetPolicy
from migronaut.fleet.tenants import Tenant
from test_celery_background import COLLECTION, NAME, hits_migration

DOCS = 120  # per tenant: a few partitions of min_partition_docs = 50


def fleet_with_background(project: Project, client: MongoClient[dict[str, Any]],
                          prefix: str, tenants: int = 3, sleep: float = 0.0) -> list[str]:
    """``tenants`` tenant databases of ``DOCS`` documents each, a migration that registers the
    counting background migration, and a ``[fleet]`` plus a ``[celery]`` table tuned to react
    quickly."""
    names = [f"{prefix}{chr(ord('a') + i)}" for i in range(tenants)]
    for name in names:
        client[name][COLLECTION].insert_many([{"n": i} for i in range(DOCS)])
        client[name][COLLECTION].create_index([("__v", 1), ("_id", 1)])
    project.write_migration(NAME, hits_migration(max_parallel=2, sleep=sleep))
    celery = {"poll_interval_ms": 300, "stall_ms": 3000, "slice_ms": 1000,
              "chain_ttl_ms": 3000, "verify_interval_ms": False}
    table = "\n".join(f"{key} = {json.dumps(value)}" for key, value in celery.items())
    project.write("migronaut.toml",
                  f"lock_ttl_seconds = 5\n\n[fleet]\nnames = {names!r}\n"
                  f'admin_db = "{prefix}admin"\n\n[celery]\n{table}\n')
    return names


def finish(project: Project, cli: Any, *args: str) -> tuple[dict[str, Any], Any]:
    """``fleet enqueue up``: its ``--json`` answer, and its run record once the coordinating
    steps ended it."""
    result = cli("fleet", "enqueue", "up", "--json", *args)
    assert result.exit_code == 0, result.stderr
    sent: dict[str, Any] = result.json
    with Fleet(cwd=project.path) as fleet:
        until(lambda: fleet.logs(sent["runId"]).outcome != "running", 120.0,
              "the fleet run to end")
        return sent, fleet.logs(sent["runId"])


def run_to_the_end(project: Project, cli: Any, *args: str) -> dict[str, Any]:
    sent, record = finish(project, cli, *args)
    assert (record.outcome, record.counts()[SUCCEEDED]) == ("succeeded", len(record.tenants))
    return sent


def background_state(client: MongoClient[dict[str, Any]], tenant: str) -> dict[str, Any]:
    found = client[tenant][STATES].find_one({"_id": NAME})
    assert found is not None, f"{NAME} is not registered in {tenant}"
    return dict(found)


def test_fleet_enqueue_up_works_every_tenants_background_migration_exactly_once(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, db: Any, cli: Any) -> None:
    names = fleet_with_background(project, client, tenant_prefix)
    with workers(celery_project.worker(concurrency=4)):
        sent = run_to_the_end(project, cli)
        assert sent["background"] is True
        until(lambda: all(background_state(client, n)["status"] == "completed" for n in names),
              180.0, "every tenant's background migration to complete")
    assert_migrated_once(client, names)
    # the worker's own database was never the target of a tenant's job
    assert NAME not in {doc["_id"] for doc in db[STATES].find()}


CONTRACT = f"""
requires = [{NAME!r}]


def up(ctx):
    ctx.db.contract.update_one({{"_id": "ran"}}, {{"$inc": {{"n": 1}}}}, upsert=True)


def down(ctx):
    ctx.db.contract.delete_many({{}})
"""


def assert_migrated_once(client: MongoClient[dict[str, Any]], names: list[str]) -> None:
    for name in names:
        final = background_state(client, name)
        items = client[name][COLLECTION]
        assert items.count_documents({"__v": 1, "hits": 1}) == DOCS
        assert items.count_documents({"hits": {"$ne": 1}}) == 0
        assert final["totals"]["migrated"] == DOCS and final["totals"].get("failed", 0) == 0
        assert client[name][PARTITIONS].count_documents(
            {"background": NAME, "lease": {"$exists": True}}) == 0


@pytest.mark.one_interpreter
def test_a_killed_worker_s_tenant_chains_are_taken_over_by_a_surviving_worker(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, cli: Any) -> None:
    """kill -9 of the worker running the tenants' coordinator chains and lanes: the tenants
    are listed in the fleet's background registry, so the surviving worker's heals (start-up,
    chain watch) reach their chains — nobody runs ``fleet enqueue up`` again — and every
    tenant's documents are migrated exactly once; the registry empties once nothing is left."""
    names = fleet_with_background(project, client, tenant_prefix, tenants=2, sleep=0.05)
    registry = client[f"{tenant_prefix}admin"]["fleet_runs_background"]
    victim = celery_project.worker(concurrency=4)
    result = cli("fleet", "enqueue", "up", "--json")
    assert result.exit_code == 0, result.stderr

    def victim_lanes() -> bool:
        return any(client[name][PARTITIONS].count_documents(
            {"background": NAME, "lease.pid": victim.process.pid}) for name in names)

    until(lambda: registry.count_documents({}) == len(names), 120.0, "both tenants listed")
    assert {(e["cluster"], e["tenant"]) for e in registry.find()} == {
        ("default", name) for name in names}
    until(victim_lanes, 120.0, "the victim's tenant lanes")
    victim.kill()  # kill -9: its chains and lanes die; the ledger still calls them live
    with workers(celery_project.worker(concurrency=4)):
        until(lambda: all(background_state(client, n)["status"] == "completed" for n in names),
              180.0, "the surviving worker to take the tenants' chains over")
        until(lambda: registry.count_documents({}) == 0, 60.0, "the registry to empty")
    assert_migrated_once(client, names)
    assert all(background_state(client, n)["round"] >= 2 for n in names)  # taken over


def test_a_contract_waiting_for_the_background_migration_is_applied_by_the_next_run(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, cli: Any) -> None:
    names = fleet_with_background(project, client, tenant_prefix, tenants=2)
    project.write_migration("0002_contract.py", CONTRACT)
    with workers(celery_project.worker(concurrency=4)):
        _, first = finish(project, cli)
        # each tenant's up stops at the contract, but what it registered is handed over
        assert {(e.state, (e.error or {}).get("code")) for e in first.tenants} == {
            ("failed", "BACKGROUND_PENDING")}
        until(lambda: all(background_state(client, n)["status"] == "completed" for n in names),
              180.0, "every tenant's background migration to complete")
        _, second = finish(project, cli)
    assert {e.state for e in second.tenants} == {SUCCEEDED}
    for name in names:
        assert client[name][COLLECTION].count_documents({"__v": 1, "hits": 1}) == DOCS
        assert client[name].contract.find_one({"_id": "ran"}) == {"_id": "ran", "n": 1}


def test_fleet_enqueue_up_no_background_starts_none(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, redis_db: int, cli: Any) -> None:
    names = fleet_with_background(project, client, tenant_prefix, tenants=2)
    # a worker on the migration queue only: whatever reached the background queue stays there
    with workers(celery_project.worker(queues=(celery_project.queue,))):
        sent = run_to_the_end(project, cli, "--no-background")
    assert sent["background"] is False
    assert redis_client(redis_db).llen(celery_project.background_queue) == 0
    for name in names:
        state = background_state(client, name)
        assert state["status"] == "pending"  # registered by up, never started
        assert client[name][COLLECTION].count_documents({"__v": 1}) == 0
        assert client[name][PARTITIONS].count_documents({}) == 0


# -- payloads and ids, without a worker ---------------------------------------------------------
def test_a_background_payload_without_a_tenant_still_means_the_workers_own_database() -> None:
    old = {"v": 1, "kind": "background", "migration": NAME, "round": 2}
    assert tenant_of(validate("background", old)) is None
    lane = {"v": 1, "kind": "background-lane", "migration": NAME, "registration": "r1",
            "generation": 0, "lane": 3}
    assert tenant_of(validate("background-lane", lane)) is None
    named = validate("background-lane", {**lane, "tenant": "acme", "cluster": "east"})
    assert tenant_of(named) == Tenant("acme", "east")
    for junk, field in (({**old, "tenant": "acme"}, "cluster"),
                        ({**old, "cluster": "east"}, "tenant"),
                        ({**old, "tenant": "no/slash", "cluster": "east"}, "tenant"),
                        ({**old, "tenant": "acme", "cluster": ""}, "cluster")):
        with pytest.raises(QueueJobInvalidError) as error:
            validate("background", junk)
        assert error.value.context["field"] == field, error.value.message


def test_tenant_job_ids_never_collide_with_each_other_or_the_workers_own() -> None:
    queue = "mq-background"
    tenants = [None, Tenant("a", "east"), Tenant("b", "east"), Tenant("a", "west"),
               Tenant("a:b", "east"), Tenant("b", "east:a")]
    chains = [coordinator_id(queue, NAME, t) for t in tenants]
    assert chains[0] == f"{queue}:bg-{NAME}"  # the plain form is unchanged
    assert chains[1] == f"{queue}:east:a:bg-{NAME}"
    takeovers = [takeover_id(queue, NAME, 3, t) for t in tenants]
    lanes = [lane_id(queue, NAME, "r1", 0, 1, 2, t) for t in tenants]
    every = chains + takeovers + lanes
    assert len(set(every)) == len(every)


def test_a_plan_says_whether_tenants_enqueue_their_background_work() -> None:
    tenants = [Tenant("t0", "default")]
    plan = Plan("up", tenants, FleetPolicy(), None, 0, {}, background=True)
    document = {"_id": "r1", "queue": plan.to_document()}
    assert read_plan(document).background is True
    older = {k: v for k, v in document["queue"].items() if k != "background"}
    assert read_plan({"_id": "r1", "queue": older}).background is False  # planned before it
    from migronaut.errors import StateInvalidError

    with pytest.raises(StateInvalidError) as error:
        read_plan({"_id": "r1", "queue": {**document["queue"], "background": "yes"}})
    assert "queue.background" in error.value.message


def test_a_worker_keeps_a_bounded_set_of_tenant_engines_and_closes_them(
        project: Project, tenant_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers.fleet import fleet_project
    from migronaut.executors.celery import context
    from migronaut.fleet.api import Fleet as FleetApi

    a, b, c = fleet_project(project, tenant_prefix, tenants=3)
    closed: list[str] = []
    built: list[str] = []
    real = FleetApi.migrator

    def spying(self: FleetApi, tenant: Tenant) -> Any:
        migrator = real(self, tenant)
        close = migrator.close
        built.append(tenant.name)
        monkeypatch.setattr(migrator, "close", lambda: (closed.append(tenant.name), close()))
        return migrator

    monkeypatch.setattr(FleetApi, "migrator", spying)
    monkeypatch.setattr(context, "TENANT_ENGINES", 1)
    worker = context.FleetWorker(context.ConfigSource(cwd=str(project.path)))
    with worker.engine("default", a) as first:
        with worker.engine("default", b):
            pass
        assert closed == [b]  # past the bound: the idle one goes, never the one in use
    with worker.engine("default", a) as again:
        assert again is first and built == [a, b]  # kept for the next job
    with worker.engine("default", c):
        pass
    assert closed == [b, a]  # the least recently used idle one
    with pytest.raises(QueueJobInvalidError) as error, \
            worker.engine("default", f"{tenant_prefix}zz"):
        pass
    assert "not a tenant of the fleet" in error.value.message
    worker.close()
    assert closed == [b, a, c]


def test_the_background_registry_skips_what_it_did_not_write_and_drops_strangers(
        project: Project, celery_project: Any, client: MongoClient[dict[str, Any]],
        tenant_prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    from migronaut.executors.celery.tenant_heals import heal_tenants, remember_tenant

    names = fleet_with_background(project, client, tenant_prefix, tenants=1)
    _, installed = celery_project.app()
    registry = client[f"{tenant_prefix}admin"]["fleet_runs_background"]
    worker = installed.context.fleet()
    remember_tenant(worker, Tenant(names[0], "default"))  # listed, nothing registered there
    registry.insert_one({"_id": "junk", "cluster": 7, "tenant": None})
    registry.insert_one({"_id": {"cluster": "default", "tenant": f"{tenant_prefix}zz"},
                         "cluster": "default", "tenant": f"{tenant_prefix}zz", "mark": "m"})
    with caplog.at_level("WARNING", logger="migronaut"):
        assert heal_tenants(installed) == []
    # the listed tenant has nothing runnable, the stranger is not a tenant: both leave; the
    # entry it cannot read stays, named in a warning
    assert [doc["_id"] for doc in registry.find()] == ["junk"]
    assert "holds an entry it did not write (_id 'junk')" in caplog.text
    assert f"{tenant_prefix}zz" in caplog.text and "dropped" in caplog.text
    installed.context.close()
