"""``migronaut fleet …`` through the CLI: JSON shapes, exit codes, bad input (nothing started),
and the real-process cases — two racing ``fleet up`` and a ``kill -9`` mid-run — checked against
what every tenant's database holds."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from pymongo import MongoClient

from conftest import CliProcess, CliRunner, Project
from helpers.engine import wait_until
from helpers.fleet import COUNTING, counters, fleet_project


def test_status_json_and_the_check_gate(
        cli: CliRunner, project: Project, client: MongoClient[dict[str, Any]],
        tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=3)
    result = cli("fleet", "status", "--json", "--check")
    assert result.exit_code == 38, result.stderr
    assert result.json["counts"]["pending"] == 3 and result.json["upToDate"] is False
    assert [t["tenant"] for t in result.json["tenants"]] == names
    assert cli("fleet", "up", "--json").exit_code == 0
    ok = cli("fleet", "status", "--check", "--all")
    assert ok.exit_code == 0, ok.stderr
    assert "3 up-to-date (100%)" in ok.stdout and names[2] in ok.stdout
    narrowed = cli("fleet", "status", "--json", "--tenants", f"{tenant_prefix}[ab]")
    assert [t["tenant"] for t in narrowed.json["tenants"]] == names[:2]


def test_a_failed_tenant_exits_38_and_the_json_names_it(
        cli: CliRunner, project: Project, client: MongoClient[dict[str, Any]],
        tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, fail="_c")
    result = cli("fleet", "up", "--json", "--max-failures", "0", "--concurrency", "1")
    assert result.exit_code == 38, result.stderr
    doc = result.json
    assert doc["ok"] is False and doc["failed"] == names[2:]
    failed = doc["tenants"][2]
    assert failed["state"] == "failed"
    assert failed["error"]["code"] == "MIGRATION_EXECUTION_FAILED"
    assert [t["state"] for t in doc["tenants"][3:]] == ["skipped-budget"] * 3
    assert all(client[n].list_collection_names() == [] for n in names[3:])
    logs = cli("fleet", "logs", doc["runId"], "--json")
    assert logs.exit_code == 0 and logs.json["outcome"] == "partial"
    assert logs.json["counts"]["skipped-budget"] == 3
    human = cli("fleet", "up", "--max-failures", "5")
    assert human.exit_code == 38
    assert f"{names[2]} (failed): MIGRATION_EXECUTION_FAILED" in human.stderr
    assert "✔ [" in human.stdout  # a plain line per tenant off a terminal
    listed = cli("fleet", "logs", "--json")
    assert [r["outcome"] for r in listed.json] == ["partial", "partial"]


BAD_INPUT = [
    ('names = ["ok", "bad.name"]', [], 37, "bad.name"),
    ('pattern = "nothing_*"', [], 37, "matched no database"),
    ('names = ["ok"]', ["--tenants", "zz*"], 37, "--tenants 'zz*' matched no tenant"),
    ('names = ["ok"]\nconcurrency = 0', [], 6, "fleet.concurrency"),
    ('names = ["ok"]', ["--concurrency", "x"], 6, "--concurrency"),
    ('names = ["ok"]', ["--order", "alpha"], 6, "order"),
    ('names = ["ok"]', ["--on-lock", "forever"], 6, "on_lock"),
]


@pytest.mark.parametrize(("fleet", "flags", "code", "says"), BAD_INPUT,
                         ids=[f"{b[0]} {b[1]}" for b in BAD_INPUT])
def test_bad_input_is_a_typed_error_and_nothing_starts(
        cli: CliRunner, project: Project, client: MongoClient[dict[str, Any]], tenant_prefix: str,
        fleet: str, flags: list[str], code: int, says: str) -> None:
    project.write_migration("20260101000001_m1", COUNTING.format(name="m1", fail="-"))
    project.write("migronaut.toml", f'[fleet]\n{fleet}\nadmin_db = "{tenant_prefix}admin"\n')
    result = cli("fleet", "up", "--json", *flags)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert says in result.json["error"]["message"]
    assert "ok" not in client.list_database_names()
    assert f"{tenant_prefix}admin" not in client.list_database_names()  # no run record either


def test_fleet_down_and_converge_need_yes_with_json(
        cli: CliRunner, project: Project, client: MongoClient[dict[str, Any]],
        tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, tenants=2)
    assert cli("fleet", "up").exit_code == 0
    assert cli("fleet", "down", "--steps", "2", "--json").json["counts"]["succeeded"] == 2
    assert all(counters(client, n) == {"m1": 0, "m2": 0} for n in names)
    refused = cli("fleet", "converge", "--json")
    assert refused.exit_code == 6 and "--yes" in refused.json["error"]["message"]
    assert cli("fleet", "converge", "--yes", "--json").exit_code == 0


@pytest.mark.slow
def test_two_racing_fleet_ups_never_migrate_a_tenant_twice(
        cli_process: CliProcess, project: Project, client: MongoClient[dict[str, Any]],
        tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix)
    first = cli_process.start("fleet", "up", "--json", "--concurrency", "2")
    second = cli_process.start("fleet", "up", "--json", "--concurrency", "3",
                               "--order", "random")
    results = [cli_process.wait(first), cli_process.wait(second)]
    for name in names:
        assert counters(client, name) == {"m1": 1, "m2": 1}, name
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        assert result.exit_code in (0, 38), result.stderr
        doc = result.json
        assert doc["ok"] == (result.exit_code == 0)
        for tenant in doc["tenants"]:
            by_tenant.setdefault(tenant["tenant"], []).append(tenant)
    for name, reports in by_tenant.items():
        assert sum(r["changed"] for r in reports) == 2, (name, reports)  # honest: one did it
        assert [r["state"] for r in reports].count("succeeded") == 1, reports
        assert all(r["state"] in ("succeeded", "up-to-date", "skipped-locked")
                   for r in reports), reports


@pytest.mark.slow
def test_kill_9_mid_run_then_the_same_command_applies_everything_once(
        cli_process: CliProcess, project: Project, client: MongoClient[dict[str, Any]],
        tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix)
    # the third tenant's run holds in its after_all hook (its migrations recorded, its lock
    # held) until the process is killed there
    (project.path / "migronaut.toml").unlink()
    project.write("migronaut_config.py", f"""
        import time

        def after_all(ctx, summary):
            if ctx.db.name != "{names[2]}" or ctx.db.reached.find_one({{"_id": 1}}):
                return
            ctx.db.reached.insert_one({{"_id": 1}})
            for _ in range(1200):
                time.sleep(0.05)

        config = {{"fleet": {{"names": {names!r}, "admin_db": "{tenant_prefix}admin"}},
                  "hooks": {{"after_all": after_all}}}}
        """)
    killed = cli_process.start("fleet", "up", "--json", "--concurrency", "1")
    wait_until(lambda: client[names[2]].reached.find_one({"_id": 1}), timeout=60,
               interval=0.05, what="the third tenant's after_all hook")
    # the record is written at most four times a second: the third tenant's start reaches it
    # within a quarter of a second of the hook's start, while the hook holds for a minute
    wait_until(lambda: client[f"{tenant_prefix}admin"].fleet_runs.find_one(
        {f"tenants.{names[2]}.state": "started"}), timeout=30, interval=0.05,
        what="the third tenant's start in the run record")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert counters(client, names[3]) == {}  # never started
    rerun = cli_process("fleet", "up", "--json", "--concurrency", "2", "--on-lock", "wait")
    assert rerun.exit_code == 0, rerun.stderr
    states = {t["tenant"]: t["state"] for t in rerun.json["tenants"]}
    assert states == {**{n: "up-to-date" for n in names[:3]},
                      **{n: "succeeded" for n in names[3:]}}
    for name in names:
        assert counters(client, name) == {"m1": 1, "m2": 1}, name
    runs = cli_process("fleet", "logs", "--json").json
    assert [r["outcome"] for r in runs] == ["succeeded", "incomplete"]
    old = cli_process("fleet", "logs", runs[1]["runId"], "--json").json
    assert {t["tenant"]: t["state"] for t in old["tenants"]} == {
        names[0]: "succeeded", names[1]: "succeeded", names[2]: "started"}
    assert old["counts"]["not-started"] == 3
    assert json.dumps(old)  # plain JSON


def test_a_config_without_a_fleet_is_config_invalid(cli: CliRunner, project: Project) -> None:
    project.write("migronaut.toml", 'migrations_dir = "migrations"\n')
    result = cli("fleet", "status", "--json")
    assert result.exit_code == 6
    assert "no fleet is configured" in result.json["error"]["message"]


def test_fleet_status_shows_the_failed_migration_and_its_message(
        cli: CliRunner, project: Project, client: MongoClient[dict[str, Any]],
        tenant_prefix: str) -> None:
    names = fleet_project(project, tenant_prefix, fail="_c")
    assert cli("fleet", "up", "--json", "--concurrency", "1").exit_code == 38
    failed = next(t for t in cli("fleet", "status", "--json").json["tenants"]
                  if t["state"] == "failed")
    assert failed["tenant"] == names[2]
    status = cli("--db", names[2], "status", "--json")
    row = next(r for r in status.json if r["status"] == "failed")
    assert failed["error"] == {"file": row["file"], "message": row["error"],
                               "failedAt": row["failedAt"]}
    table = cli("fleet", "status")
    line = next(x for x in table.stdout.splitlines() if names[2] in x)
    assert f"{row['file']}: " in line and "failed" in line
