"""The dashboard's fleet page over HTTP (Starlette's TestClient) against the dev server: the
summary cards and the tenant table matching ``fleet status --json``, the server-side filters,
a tenant's own pages under ``/t/<tenant>/`` (only for a tenant the fleet lists), the token,
escaping, and no fleet page without a ``[fleet]``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from conftest import Project
from helpers.fleet import fleet_project
from migronaut import Fleet, Migrator
from migronaut.dashboard import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

@pytest.fixture
def tenants(project: Project, tenant_prefix: str) -> list[str]:
    """Four tenants: a and b up to date, c failed, d pending (the fleet run stopped after c)."""
    names = fleet_project(project, tenant_prefix, tenants=4, fail="_c")
    with Fleet(cwd=project.path) as fleet:
        result = fleet.up(concurrency=1, max_failures=0)
    assert [o.state for o in result.outcomes] == ["succeeded", "succeeded", "failed",
                                                 "skipped-budget"]
    return names


@pytest.fixture
def dashboard(project: Project, tenants: list[str]) -> Iterator[TestClient]:
    with Migrator(cwd=project.path) as migrator, TestClient(
            create_app(migrator, allow_controls=True, token="t0ken"),
            follow_redirects=False) as client:
        assert client.get("/fleet", params={"token": "t0ken"}).status_code == 303
        yield client


def test_the_fleet_page_counts_every_state_and_links_each_tenant(
        dashboard: TestClient, tenants: list[str], project: Project) -> None:
    served = dashboard.get("/api/fleet")
    assert served.status_code == 200, served.text
    document = served.json()
    with Fleet(cwd=project.path) as fleet:  # the same document as the API's
        assert document["counts"] == fleet.status().to_json()["counts"]
    assert document["counts"]["up-to-date"] == 2 and document["counts"]["failed"] == 1
    assert document["counts"]["pending"] == 1 and document["total"] == 4
    assert document["percent"]["up-to-date"] == 50.0
    page = dashboard.get("/fleet")
    assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"
    html = page.text
    assert 'aria-current="page">Fleet</a>' in html
    assert "50.0%" in html and "25.0%" in html
    for name in tenants:
        assert f'href="/t/{name}/"' in html
    echoed = dashboard.get("/fleet", params={"name": '"><b>x'}).text
    assert "&#34;&gt;&lt;b&gt;x" in echoed and "<b>x" not in echoed  # escaped
    overview = dashboard.get("/")
    assert 'href="/fleet"' in overview.text  # the nav shows the fleet


def test_the_filters_narrow_the_table_on_the_server(dashboard: TestClient,
                                                    tenants: list[str]) -> None:
    failed = dashboard.get("/fleet", params={"state": "failed"}).text
    assert f'data-tenant="{tenants[2]}"' in failed
    assert f'data-tenant="{tenants[0]}"' not in failed and "1 of 4 tenant(s) shown" in failed
    named = dashboard.get("/api/fleet", params={"name": tenants[3][-3:].upper()}).json()
    assert [row["tenant"] for row in named["tenants"]] == [tenants[3]]
    assert named["counts"]["up-to-date"] == 2  # the cards still count every tenant
    for query in ({"state": "bogus"}, {"name": "x" * 65}):
        refused = dashboard.get("/api/fleet", params=query)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "CONFIG_INVALID"
        assert next(iter(query)) in refused.json()["error"]["message"]
    assert dashboard.get("/fleet", params={"state": "bogus"}).status_code == 400


def test_a_tenant_has_its_own_pages_and_nothing_else_is_served(
        dashboard: TestClient, tenants: list[str], client: MongoClient[dict[str, Any]],
        project: Project) -> None:
    own = dashboard.get(f"/t/{tenants[2]}/")
    assert own.status_code == 200, own.text[:500]
    assert f"tenant <strong>{tenants[2]}</strong>" in own.text
    assert f'href="/t/{tenants[2]}/runs"' in own.text and 'href="/fleet"' in own.text
    status = dashboard.get(f"/t/{tenants[2]}/api/status").json()
    with Migrator(cwd=project.path, db_name=tenants[2]) as migrator:
        assert [row["status"] for row in status] == [
            row.status for row in migrator.status("all")] == ["failed", "pending"]
    assert dashboard.get(f"/t/{tenants[0]}/runs").status_code == 200
    before = set(client.list_database_names())
    for outsider in ("admin", f"{tenants[0]}x", "local"):
        refused = dashboard.get(f"/t/{outsider}/")
        assert refused.status_code == 404 and "No tenant" in refused.text
        assert 'href="/fleet"' in refused.text and "/t/" not in refused.text
    assert set(client.list_database_names()) == before  # nothing created
    anonymous = TestClient(dashboard.app, follow_redirects=False)
    assert anonymous.get(f"/t/{tenants[0]}/").status_code == 403
    assert anonymous.get("/fleet").status_code == 403


def test_without_a_fleet_there_is_no_fleet_page(project: Project) -> None:
    with Migrator(cwd=project.path) as migrator:
        client = TestClient(create_app(migrator), follow_redirects=False)
        assert client.get("/fleet").status_code == 404
        assert client.get("/t/anything/").status_code == 404
        assert "/fleet" not in client.get("/runs").text


def test_a_fleet_without_a_database_of_its_own_serves_the_fleet_as_home(
        tenants: list[str], cli_process: Any) -> None:
    """``migronaut dashboard`` on a config with a ``[fleet]`` and no ``db``: the fleet page is
    the home page, each tenant's pages are there, no other database's pages are."""
    import httpx

    process = cli_process.start("dashboard", "--port", "0", env={"MIGRONAUT_DB": None})
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        base, token = url.split("/?token=")
        with httpx.Client(headers={"X-Migronaut-Token": token}) as http:
            home = http.get(f"{base}/")
            assert (home.status_code, home.headers["location"]) == (303, "/fleet")
            fleet = http.get(f"{base}/fleet")
            assert fleet.status_code == 200 and f'href="/t/{tenants[1]}/"' in fleet.text
            assert ">Overview<" not in fleet.text and ">Runs<" not in fleet.text
            assert http.get(f"{base}/runs").status_code == 404
            assert http.get(f"{base}/api/status").status_code == 404
            assert http.get(f"{base}/t/{tenants[1]}/runs").status_code == 200
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
