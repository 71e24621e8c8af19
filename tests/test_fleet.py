"""Fleets over the wire: tenant sources, status through the ordinary ``status``, one client per
cluster, and the refusals of a bad tenant list (``FLEET_INVALID`` naming it, nothing run)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymongo import MongoClient, monitoring

from conftest import Project
from helpers.fleet import COUNTING
from migronaut import AsyncFleet, Fleet, FleetStatus, Migrator
from migronaut.errors import FleetInvalidError
from migronaut.fleet.status import FAILED, IN_DOUBT, PENDING, UNREACHABLE, UP_TO_DATE

#: A URI nothing answers on (a closed port), failing fast.
DEAD_URI = "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=300&connectTimeoutMS=300"

def write_fleet(project: Project, fleet: str, migrations: int = 2) -> None:
    for i in range(1, migrations + 1):
        project.write_migration(f"2026010100000{i}_m{i}",
                                COUNTING.format(name=f"m{i}", fail="-none-"))
    project.write("migronaut.toml", f"[fleet]\n{fleet}\n")


def seed(client: MongoClient[dict[str, Any]], *names: str) -> None:
    for name in names:
        client[name].seed.insert_one({"x": 1})


def test_status_of_a_listed_fleet_counts_every_state(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = [f"{tenant_prefix}{i}" for i in range(3)]
    write_fleet(project, f"names = {names!r}")
    with Migrator(cwd=project.path, db_name=names[0]) as migrator:
        migrator.up()
    with Fleet(cwd=project.path) as fleet:
        status = fleet.status()
    assert isinstance(status, FleetStatus)
    assert [(s.tenant.name, s.state, s.applied, s.pending) for s in status.tenants] == [
        (names[0], UP_TO_DATE, 2, 0), (names[1], PENDING, 0, 2), (names[2], PENDING, 0, 2)]
    counts = status.counts()
    assert counts == {"up-to-date": 1, "pending": 2, "failed": 0, "in-doubt": 0, "locked": 0,
                      "unreachable": 0}
    assert status.to_json()["percent"]["pending"] == 66.7 and not status.up_to_date


def test_pattern_regex_registry_and_callable_sources(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    seed(client, f"{tenant_prefix}a1", f"{tenant_prefix}a2", f"{tenant_prefix}b1")
    write_fleet(project, f'pattern = "{tenant_prefix}a*"')
    with Fleet(cwd=project.path) as fleet:
        assert [t.name for t in fleet.tenants()] == [f"{tenant_prefix}a1", f"{tenant_prefix}a2"]
    write_fleet(project, f'regex = "^{tenant_prefix}[ab]1$"')
    with Fleet(cwd=project.path, tenants=f"{tenant_prefix}b*") as fleet:
        assert [t.name for t in fleet.tenants()] == [f"{tenant_prefix}b1"]
    client[f"{tenant_prefix}ctl"].tenants.insert_many([
        {"db": f"{tenant_prefix}a2", "active": True}, {"db": f"{tenant_prefix}b1", "active": True},
        {"db": f"{tenant_prefix}zz", "active": False}])
    write_fleet(project, f'registry = {{ db = "{tenant_prefix}ctl", collection = "tenants", '
                         'field = "db", filter = { active = true } }')
    with Fleet(cwd=project.path) as fleet:
        assert [t.name for t in fleet.tenants()] == [f"{tenant_prefix}a2", f"{tenant_prefix}b1"]
    project.write("tenant_source_ok.py", f"""
        import asyncio

        def sync_names():
            return ["{tenant_prefix}s2", "{tenant_prefix}s1"]

        async def async_names():
            await asyncio.sleep(0)
            return ("{tenant_prefix}x1",)
        """)
    write_fleet(project, 'callable = "tenant_source_ok:sync_names"')
    with Fleet(cwd=project.path) as fleet:
        assert [t.name for t in fleet.tenants()] == [f"{tenant_prefix}s1", f"{tenant_prefix}s2"]
    write_fleet(project, 'callable = "tenant_source_ok:async_names"')

    async def main() -> list[str]:
        async with AsyncFleet(cwd=project.path) as fleet:
            return [t.name for t in await fleet.tenants()]

    assert asyncio.run(main()) == [f"{tenant_prefix}x1"]


BAD_SOURCES = [
    ('names = ["ok", "bad.name"]', "tenant 'bad.name'", "'.'"),
    ('names = ["a", "a"]', "tenant 'a' is listed twice", ""),
    ('names = ["admin"]', "tenant 'admin'", "MongoDB's own database"),
    ('pattern = "nothing_matches_*"', "pattern 'nothing_matches_*'", "matched no database"),
    ('callable = "tenant_source:boom"', "callable 'tenant_source:boom'", "ValueError: boom"),
    ('callable = "tenant_source:junk"', "callable 'tenant_source:junk'", "returned 3 (int)"),
    ('callable = "tenant_source:not_a_list"', "callable 'tenant_source:not_a_list'",
     "must return a list"),
    ('callable = "no_such_module:f"', "callable 'no_such_module:f'", "ModuleNotFoundError"),
]


@pytest.mark.parametrize(("source", "names", "says"), BAD_SOURCES, ids=[b[0] for b in BAD_SOURCES])
def test_a_bad_tenant_source_is_fleet_invalid_naming_it_and_nothing_runs(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str, source: str,
        names: str, says: str, cli: Any) -> None:
    project.write("tenant_source.py", """
        def boom():
            raise ValueError("boom")

        def junk():
            return ["ok", 3]

        def not_a_list():
            return "tenant_1"
        """)
    write_fleet(project, source)
    with pytest.raises(FleetInvalidError) as raised, Fleet(cwd=project.path) as fleet:
        fleet.status()
    error = raised.value
    assert (error.code, error.exit_code) == ("FLEET_INVALID", 37)
    assert names in error.message and says in error.message, error.message
    assert not [db for db in client.list_database_names() if db.startswith(tenant_prefix)]


def test_registry_junk_is_fleet_invalid_naming_the_document(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    client[f"{tenant_prefix}ctl"].tenants.insert_many([{"_id": 1, "db": f"{tenant_prefix}a"},
                                                {"_id": 2, "db": 42}, {"_id": 3}])
    write_fleet(project, f'registry = {{ db = "{tenant_prefix}ctl", collection = "tenants", '
                         'field = "db" }')
    with pytest.raises(FleetInvalidError, match=r"registry document 2 .* no string 'db' "
                                                r"\(got a int\)"), Fleet(cwd=project.path) as f:
        f.tenants()


def test_tenants_narrowing_to_nothing_and_duplicates_across_clusters(
        project: Project, mongo_uri: str, tenant_prefix: str) -> None:
    name = f"{tenant_prefix}a"
    write_fleet(project, f'names = ["{name}"]\n[fleet.clusters.two]\nuri = "{mongo_uri}"\n'
                         f'names = ["{name}"]')
    with pytest.raises(FleetInvalidError, match="on clusters 'default' and 'two'"), \
            Fleet(cwd=project.path) as fleet:
        fleet.tenants()
    write_fleet(project, f'names = ["{tenant_prefix}a"]')
    with pytest.raises(FleetInvalidError, match=r"--tenants 'zz\*' matched no tenant"), \
            Fleet(cwd=project.path, tenants="zz*") as fleet:
        fleet.tenants()


def test_an_unreachable_cluster_fails_only_its_own_tenants(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    a, b, c, d = (f"{tenant_prefix}{x}" for x in "abcd")
    write_fleet(project, f'names = ["{a}", "{b}"]\n[fleet.clusters.dead]\n'
                         f'uri = "{DEAD_URI}"\nnames = ["{c}", "{d}"]\n'
                         f'[fleet.clusters.deadlisted]\nuri = "{DEAD_URI}"\n'
                         f'pattern = "{tenant_prefix}*"')
    with Fleet(cwd=project.path) as fleet:
        status = fleet.status()
    states = {(s.tenant.name, s.tenant.cluster): s.state for s in status.tenants}
    assert states == {(a, "default"): PENDING, (b, "default"): PENDING,
                      (c, "dead"): UNREACHABLE, (d, "dead"): UNREACHABLE}
    dead = next(s for s in status.tenants if s.state == UNREACHABLE)
    assert dead.error is not None and dead.error["code"] == "CONNECTION_FAILED"
    assert "127.0.0.1:9" in dead.error["message"]
    assert status.unreachable_clusters["deadlisted"]["code"] == "CONNECTION_FAILED"
    assert not status.up_to_date


class _Counter(monitoring.CommandListener):
    def __init__(self) -> None:
        self.commands: list[tuple[str, str]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append((event.command_name, event.database_name))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class _Pools(monitoring.ConnectionPoolListener):
    def __init__(self) -> None:
        self.created = 0

    def pool_created(self, event: monitoring.PoolCreatedEvent) -> None:
        self.created += 1

    def __getattr__(self, name: str) -> Any:
        return lambda event: None


def test_status_costs_a_few_commands_per_tenant_on_one_client(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = [f"{tenant_prefix}{i}" for i in range(6)]
    write_fleet(project, f"names = {names!r}")
    with Migrator(cwd=project.path, db_name=names[0]) as migrator:
        migrator.up()
    commands, pools = _Counter(), _Pools()
    with Fleet(cwd=project.path, client_options={"event_listeners": [commands, pools]}) as fleet:
        status = fleet.status()
    assert [s.state for s in status.tenants] == [UP_TO_DATE] + [PENDING] * 5
    assert pools.created == 1  # one pool for six tenants (one server)
    per_tenant: dict[str, list[str]] = {}
    for name, db in commands.commands:
        per_tenant.setdefault(db, []).append(name)
    # the changelog; a tenant with pending migrations also reads its lock (is it locked?)
    assert per_tenant[names[0]] == ["find"], per_tenant
    for tenant in names[1:]:
        assert per_tenant[tenant] == ["find", "aggregate"], per_tenant
    others = [c for c in commands.commands if c[1] not in names]
    # the cluster's ping, once, and endSessions when its client closes
    assert others == [("ping", "admin"), ("endSessions", "admin")], others


def test_a_failed_or_in_doubt_tenant_shows_so(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = [f"{tenant_prefix}ok", f"{tenant_prefix}failed", f"{tenant_prefix}doubt"]
    write_fleet(project, f"names = {names!r}")
    project.write_migration("20260101000003_m3", """
        import os

        def up(ctx):
            if ctx.db.name.endswith("failed"):
                raise RuntimeError("tenant refuses")

        def down(ctx):
            pass
        """)
    for name in names[:2]:
        with Migrator(cwd=project.path, db_name=name) as migrator, \
                pytest.raises(Exception) if name.endswith("failed") else _nothing():
            migrator.up()
    changelog = client[names[2]]["_migronaut_migrations"]
    changelog.insert_one({"name": "20260101000001_m1.py", "status": "running",
                          "intent": {"runId": "r", "lockOwner": "o", "host": "h", "pid": 1,
                                     "direction": "up", "previous": "pending"}})
    with Fleet(cwd=project.path) as fleet:
        states = {s.tenant.name: s.state for s in fleet.status().tenants}
    assert states == {names[0]: UP_TO_DATE, names[1]: FAILED, names[2]: IN_DOUBT}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


FAILS_WITH_A_SECRET = """
def up(ctx):
    if ctx.db.name.endswith("failed"):
        raise RuntimeError("cannot reach mongodb://admin:s3cret@replica.example/ for the copy")

def down(ctx):
    pass
"""


def test_a_failed_tenant_carries_what_status_shows_of_its_failed_migration(
        project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str) -> None:
    names = [f"{tenant_prefix}ok", f"{tenant_prefix}failed"]
    write_fleet(project, f"names = {names!r}")
    project.write_migration("20260101000003_m3", FAILS_WITH_A_SECRET)
    for name in names:
        with Migrator(cwd=project.path, db_name=name) as migrator, \
                pytest.raises(Exception) if name.endswith("failed") else _nothing():
            migrator.up()
    with Migrator(cwd=project.path, db_name=names[1]) as migrator:
        row = next(r for r in migrator.status() if r.status == "failed")
    with Fleet(cwd=project.path) as fleet:
        by_name = {s.tenant.name: s for s in fleet.status().tenants}
    ok, failed = by_name[names[0]], by_name[names[1]]
    assert ok.state == UP_TO_DATE and ok.error is None
    assert failed.state == FAILED and failed.error is not None
    assert failed.error["file"] == row.file == "20260101000003_m3.py"
    assert failed.error["message"] == row.to_dict()["error"]  # as status --json shows it
    assert "cannot reach mongodb://admin:****@replica.example/" in failed.error["message"]
    assert "s3cret" not in repr(failed.error)
    assert failed.error["failedAt"] == row.to_dict()["failedAt"]
    assert failed.to_json()["error"] == failed.error
