"""The web dashboard over HTTP (Starlette's TestClient) against the dev server: every page and
endpoint, the CLI's ``--json`` shapes, escaping and redaction, the token and CSRF guard of the
controls, the live poll's command count, ``/metrics`` and ``migronaut dashboard`` itself."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

with warnings.catch_warnings():  # Starlette 1.x suggests httpx2; httpx is what it still uses
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from helpers.background import NAME, PARTITIONS, STATES, register
from helpers.engine import write_simple
from helpers.wire_audit import AUDIT
from migronaut import Migrator
from migronaut.dashboard import create_app
from migronaut.errors import ConfigInvalidError

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from prometheus_client.parser import text_string_to_metric_families

SECRET = "S3cretPw"
EVIL = "<script>alert(\"x'\")</script>"
CHATTY = f"""
def up(ctx):
    ctx.logger.info({EVIL!r} + " copied")
    ctx.logger.warning("slow: mongodb://admin:{SECRET}@db.example/app")

def down(ctx):
    pass
"""
ORIGIN = "http://testserver"


@pytest.fixture
def settled(project: Any, cli: Any, db: Any) -> str:
    """A chatty plain migration applied, and a background migration registered by ``up`` and
    driven one round (``run --once``: some partitions done, leases released)."""
    project.write_migration("0000_chatty", CHATTY)
    name = register(project, cli, db, docs=300)
    assert cli("background", "run", name, "--once").exit_code == 0
    return name


@pytest.fixture
def migrator(project: Any) -> Iterator[Migrator]:
    with Migrator(cwd=project.path) as migrator:
        yield migrator


def client_of(migrator: Migrator, **options: Any) -> TestClient:
    return TestClient(create_app(migrator, **options), follow_redirects=False)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    """``/metrics`` parsed by prometheus_client's own parser: ``(name, labels) → value``."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def at(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


# ------------------------------------------------------------------------- pages, endpoints


PAGES = ("/", f"/background/{NAME}", "/runs", "/audit", "/drift")


def test_every_page_renders(settled: str, migrator: Migrator, db: Any) -> None:
    client = client_of(migrator)
    for path in PAGES:
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["x-frame-options"] == "DENY"
        assert "script-src 'self'" in page.headers["content-security-policy"]
    overview = client.get("/").text
    assert NAME in overview and "<progress" in overview
    assert 'data-live="/api/live"' in overview
    run_id = migrator.runs(1)[0].run_id
    run = client.get(f"/runs/{run_id}")
    assert run.status_code == 200 and run_id in run.text
    one = client.get(f"/background/{NAME}").text
    cells = re.findall(r'class="cell s-(\w+)"', one)
    stored = [p["status"] for p in db[PARTITIONS].find({"background": NAME}).sort("seq", 1)]
    assert cells == stored and "done" in cells
    assert "Throughput" in one and "<rect" in one  # one round read documents
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.get("/static/dashboard.css").status_code == 200


def test_json_endpoints_serve_the_cli_shapes(settled: str, migrator: Migrator, cli: Any) -> None:
    client = client_of(migrator)
    run_id = migrator.runs(1)[0].run_id
    same = {
        "/api/status": ("status", "--json"),
        "/api/lock": ("lock", "--json"),
        "/api/runs": ("logs", "--json"),
        f"/api/runs/{run_id}": ("logs", run_id, "--json"),
        "/api/background": ("background", "status", "--json"),
        f"/api/background/{NAME}": ("background", "status", NAME, "--json"),
        f"/api/background/{NAME}/partitions": ("background", "status", NAME, "--partitions",
                                               "--json"),
        "/api/drift": ("converge", "--dry-run", "--json"),
        "/api/converge/history": ("converge", "--history", "--json"),
        "/api/audit": ("audit", "--json"),
    }
    for path, args in same.items():
        served = client.get(path)
        assert served.status_code == 200, (path, served.text)
        assert served.headers["content-type"] == "application/json"
        expected = cli(*args).json
        if path == "/api/audit":  # the runtime check names the process's interpreter
            served_checks = {c["name"]: c["status"] for c in served.json()["checks"]}
            assert served_checks == {c["name"]: c["status"] for c in expected["checks"]}
            continue
        assert served.json() == expected, path
    live = client.get(f"/api/live/{NAME}").json()
    assert set(live) == {"at", "background", "done"}
    view = live["background"][0]
    assert view["progress"]["done"] == view["totals"]["scanned"] > 0
    assert view["controls"] == ["pause", "cancel"]


def test_bad_requests_say_what_is_wrong(settled: str, migrator: Migrator) -> None:
    client = client_of(migrator)
    missing = client.get("/api/background/0009_nope.py")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "NOT_APPLIED"
    page = client.get("/background/0009_nope.py")
    assert page.status_code == 404 and "NOT_APPLIED" in page.text
    for bad in ("abc", "0", "1001"):
        limited = client.get(f"/api/runs?limit={bad}")
        assert limited.status_code == 400
        assert limited.json()["error"] == {
            "code": "CONFIG_INVALID", "context": {"option": "limit"},
            "message": f"limit must be an integer from 1 to 1000 (got {bad!r})"}
    unknown = client.get("/runs/nope")
    assert unknown.status_code == 400 and "No recorded run with id &#39;nope&#39;" in unknown.text
    assert client.get("/api/runs/nope").json()["error"] == {
        "code": "CONFIG_INVALID", "message": "No recorded run with id 'nope'",
        "context": {"runId": "nope"}}  # what `migronaut logs nope --json` prints
    assert client.post(f"/background/{NAME}/pause").status_code == 403  # controls off


def test_create_app_takes_a_migrator_or_a_config(migrator: Migrator) -> None:
    with pytest.raises(ConfigInvalidError) as caught:
        create_app(migrator, config={"db_name": "x"})
    assert caught.value.code == "CONFIG_INVALID" and caught.value.exit_code == 6
    assert "not both" in caught.value.message


def test_mounted_under_a_prefix_links_follow_it(settled: str, migrator: Migrator) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops/migrations", create_app(migrator))])
    client = TestClient(host)
    page = client.get("/ops/migrations/")
    assert page.status_code == 200
    assert 'href="/ops/migrations/static/dashboard.css"' in page.text
    assert 'data-live="/ops/migrations/api/live"' in page.text
    assert client.get("/ops/migrations/api/live").status_code == 200


# -------------------------------------------------------------------- escaping, redaction


def test_names_logs_and_errors_render_escaped_and_credentials_never_show(
        settled: str, migrator: Migrator, db: Any) -> None:
    stored_error = f"write failed on mongodb://app:{SECRET}@db.internal/app {EVIL}"
    db[STATES].update_one({"_id": NAME}, {"$set": {
        "lastError": stored_error, "description": EVIL,
        "docErrors": [{"error": stored_error, "reason": EVIL}]}})
    db[PARTITIONS].update_one({"background": NAME}, {"$set": {"lastError": stored_error}})
    db["_migronaut_migrations"].insert_one({
        "name": f"0005_{EVIL}.py", "status": "applied", "batch": 9,
        "appliedAt": db[STATES].find_one({"_id": NAME})["registeredAt"]})
    client = client_of(migrator)
    run_id = next(run.run_id for run in migrator.runs(5) if run.applied == ["0000_chatty.py"]
                  or "0000_chatty.py" in run.applied)
    everything = [*PAGES, f"/runs/{run_id}", "/metrics",
                  *(route.path for route in client.app.routes  # type: ignore[attr-defined]
                    if route.path.startswith("/api/") and "{" not in route.path),
                  f"/api/background/{NAME}", f"/api/background/{NAME}/partitions",
                  f"/api/live/{NAME}", f"/api/runs/{run_id}"]
    for path in everything:
        body = client.get(path).text
        assert SECRET not in body, path
        assert "<script>alert" not in body, path
    shown = client.get(f"/background/{NAME}").text
    assert "&lt;script&gt;alert(&#34;x&#39;&#34;)&lt;/script&gt;" in shown
    assert "mongodb://app:****@db.internal" in shown
    assert "&lt;script&gt;alert" in client.get("/").text  # the changelog record's name
    log = client.get(f"/runs/{run_id}").text
    assert "&lt;script&gt;alert(&#34;x&#39;&#34;)&lt;/script&gt; copied" in log
    assert "mongodb://admin:****@db.example" in log


def test_a_password_with_at_and_space_and_dup_key_values_never_show(
        settled: str, migrator: Migrator, db: Any) -> None:
    stored_error = ('write failed on mongodb://adm:p@ss w:rd@db.internal/app: '
                    'dup key: { email: "eve@example.com" }')
    db[STATES].update_one({"_id": NAME}, {"$set": {
        "lastError": stored_error, "docErrors": [{"error": stored_error, "reason": "write"}]}})
    db[PARTITIONS].update_one({"background": NAME}, {"$set": {"lastError": stored_error}})
    client = client_of(migrator)
    everything = [*PAGES, "/metrics",
                  *(route.path for route in client.app.routes  # type: ignore[attr-defined]
                    if route.path.startswith("/api/") and "{" not in route.path),
                  f"/api/background/{NAME}", f"/api/background/{NAME}/partitions",
                  f"/api/live/{NAME}"]
    for path in everything:
        body = client.get(path).text
        assert "ss w:rd" not in body and "p@ss" not in body, path
        assert "eve@example.com" not in body, path
    shown = client.get(f"/api/background/{NAME}").text
    assert "mongodb://adm:****@db.internal/app" in shown and "dup key: { **** }" in shown


# ------------------------------------------------------------------------------- controls


def _status(db: Any) -> str:
    return str(db[STATES].find_one({"_id": NAME})["status"])


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def test_controls_need_the_token_same_origin_and_the_csrf_value(
        settled: str, migrator: Migrator, db: Any) -> None:
    app = create_app(migrator, allow_controls=True)
    token = app.state.token
    assert isinstance(token, str) and len(token) >= 40
    before = db[STATES].find_one({"_id": NAME})

    anonymous = TestClient(app, follow_redirects=False)
    assert anonymous.get("/").status_code == 403  # a token protects the reads too
    assert anonymous.get("/api/live").status_code == 403
    refused = anonymous.post(f"/background/{NAME}/pause", headers={"Origin": ORIGIN})
    assert refused.status_code == 403
    assert anonymous.post(f"/background/{NAME}/pause?token={token}").status_code == 403

    browser = TestClient(app, follow_redirects=False)
    handed = browser.get(f"/background/{NAME}?token={token}")
    assert handed.status_code == 303 and handed.headers["location"] == f"/background/{NAME}"
    cookie = handed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    page = browser.get(f"/background/{NAME}")
    assert page.status_code == 200 and token not in page.text
    csrf = _csrf(page.text)
    form = {"csrf": csrf, "requested_by": "alice", "reason": "OPS-9 load"}
    for headers, data in (
        ({}, form),  # no Origin nor Referer
        ({"Origin": "http://evil.example"}, form),
        ({"Referer": "http://evil.example/x"}, form),
        ({"Origin": ORIGIN}, {**form, "csrf": "forged"}),
        ({"Origin": ORIGIN}, {k: v for k, v in form.items() if k != "csrf"}),
    ):
        attempt = browser.post(f"/background/{NAME}/pause", headers=headers, data=data)
        assert attempt.status_code == 403, (headers, data)
    after = db[STATES].find_one({"_id": NAME})
    assert after == before  # nothing changed, not even a history entry

    done = browser.post(f"/background/{NAME}/pause", headers={"Origin": ORIGIN}, data=form)
    assert done.status_code == 303, done.text
    assert _status(db) == "paused"
    entry = db[STATES].find_one({"_id": NAME})["history"][-1]
    assert (entry["action"], entry["by"], entry["reason"]) == ("pause", "alice", "OPS-9 load")

    api = TestClient(app, follow_redirects=False)
    resumed = api.post(f"/background/{NAME}/resume", headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json"})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["applied"] == "changed"
    assert resumed.json()["status"] == _status(db) in ("running", "pending")
    assert db[STATES].find_one({"_id": NAME})["history"][-1]["by"] == "dashboard"
    conflict = api.post(f"/background/{NAME}/retry", headers={
        "X-Migronaut-Token": token, "Accept": "application/json"})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "BACKGROUND_CONFLICT"
    unknown = api.post(f"/background/{NAME}/drop", headers={"X-Migronaut-Token": token})
    assert unknown.status_code == 404


def test_controls_off_refuse_even_with_the_token(settled: str, migrator: Migrator,
                                                 db: Any) -> None:
    app = create_app(migrator, token="t0ken-for-reads")
    client = TestClient(app, follow_redirects=False)
    assert client.get("/", headers={"X-Migronaut-Token": "t0ken-for-reads"}).status_code == 200
    refused = client.post(f"/background/{NAME}/pause", headers={
        "X-Migronaut-Token": "t0ken-for-reads", "Accept": "application/json"})
    assert refused.status_code == 403
    assert "--allow-controls" in refused.json()["error"]["message"]
    assert _status(db) == "running"


# ----------------------------------------------------------------------------------- live


def test_a_poll_is_one_small_query_round_whatever_the_partitions(
        settled: str, migrator: Migrator, db: Any) -> None:
    client = client_of(migrator)
    client.get(f"/api/live/{NAME}")  # connect, indexes
    with AUDIT.recording() as sent:
        assert client.get(f"/api/live/{NAME}").status_code == 200
    few = [(s.command, s.target) for s in sent]
    assert ("find", PARTITIONS) not in few  # no partition documents are read
    assert len(few) == 2, few  # the state, then one aggregate over its partitions
    db[PARTITIONS].insert_many([
        {"background": NAME, "generation": 1, "plan": "x", "seq": 1000 + i,
         "status": "pending", "counters": {"scanned": 0}} for i in range(40)])
    with AUDIT.recording() as sent:
        assert client.get(f"/api/live/{NAME}").status_code == 200
    assert [(s.command, s.target) for s in sent] == few


# -------------------------------------------------------------------------------- metrics


def test_metrics_expose_documents_lanes_failures_and_pending(settled: str, migrator: Migrator,
                                                           cli: Any) -> None:
    client = TestClient(create_app(migrator))
    samples = scrape(client)
    view = cli("background", "status", NAME, "--json").json["background"][0]
    assert at(samples, "migronaut_background_documents_total", migration=NAME,
              counter="migrated") == view["totals"]["migrated"] > 0
    assert at(samples, "migronaut_background_lanes", migration=NAME) == 0
    assert at(samples, "migronaut_background_max_parallel", migration=NAME) == 2
    assert at(samples, "migronaut_background_status", migration=NAME, status="running") == 1
    assert at(samples, "migronaut_background_failed_documents", migration=NAME) == 0
    assert at(samples, "migronaut_migrations_pending") == 0
    assert at(samples, "migronaut_migrations", status="applied") == 2
    text = client.get("/metrics").text
    assert "# TYPE migronaut_background_documents_total counter" in text
    # OpenMetrics for a scraper that asks for it, with its terminator
    open_metrics = client.get("/metrics", headers={
        "Accept": "application/openmetrics-text; version=1.0.0"})
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.endswith("# EOF\n")
    assert "# TYPE migronaut_background_documents counter" in open_metrics.text


def test_two_applications_keep_their_metrics_apart(settled: str, project: Any, db_name: str,
                                                    db: Any, migrator: Migrator) -> None:
    """Each application scrapes its own database: no collector lands in a registry shared by
    the process (the second would be refused, or both would report the first's figures)."""
    other_db = f"{db_name}_other"
    first = scrape(TestClient(create_app(migrator)))
    with Migrator(cwd=project.path, db_name=other_db) as elsewhere:
        second = scrape(TestClient(create_app(elsewhere)))
    db.client.drop_database(other_db)
    assert at(first, "migronaut_background_status", migration=NAME, status="running") == 1
    assert not any(labels and dict(labels).get("migration") == NAME for _, labels in second)
    assert at(second, "migronaut_migrations", status="applied") == 0


@pytest.mark.parametrize(("path", "field", "junk"), [
    ("spec", "spec", "junk"), ("plan", "plan", "x"), ("spec.maxParallel", "spec.maxParallel", "2"),
])
def test_one_junk_state_shows_as_invalid_and_the_rest_normally(
    settled: str, project: Any, cli: Any, db: Any, path: str, field: str, junk: Any
) -> None:
    """One state document migronaut cannot read used to turn ``/``, ``/api/background``,
    ``/api/live`` and ``/metrics`` into a plain-text 500: that migration is a row saying
    ``STATE_INVALID`` with the field, every other one is served as before; its own page and
    endpoint answer the typed error."""
    other = register(project, cli, db, docs=30, name="0002_orders_v1", collection="orders")
    expected = cli("background", "status", other, "--json").json["background"][0]
    db[STATES].update_one({"_id": NAME}, {"$set": {path: junk}})
    message = f"Background migration {NAME} has a {field} migronaut does not understand"
    with Migrator(cwd=project.path) as migrator:
        client = client_of(migrator)
        served = client.get("/api/background")
        assert served.status_code == 200, served.text
        bad, good = served.json()["background"]
        assert bad["migration"] == NAME and bad["status"] == "invalid"
        assert bad["error"]["code"] == "STATE_INVALID"
        assert bad["error"]["message"].startswith(message)
        assert bad["error"]["context"]["problems"][0]["field"] == field
        assert good == expected
        live = client.get("/api/live")
        assert live.status_code == 200, live.text
        views = {v["migration"]: v for v in live.json()["background"]}
        assert views[NAME]["status"] == "invalid" and views[NAME]["controls"] == []
        assert views[other]["status"] == "pending" and views[other]["controls"]
        page = client.get("/")
        assert page.status_code == 200, page.text[:500]
        assert "STATE_INVALID: " + message in page.text
        assert f'data-migration="{other}"' in page.text
        samples = scrape(client)
        status = "migronaut_background_status"
        assert at(samples, status, migration=NAME, status="invalid") == 1
        assert at(samples, status, migration=other, status="pending") == 1
        assert at(samples, status, migration=other, status="invalid") == 0
        for url in (f"/api/background/{NAME}", f"/background/{NAME}"):
            one = client.get(url)
            assert one.status_code == 500 and "STATE_INVALID" in one.text, (url, one.text)
        assert client.get(f"/api/background/{NAME}").json()["error"]["message"].startswith(
            message)
    assert db[STATES].find_one({"_id": NAME})[path.split(".")[0]] is not None


# ------------------------------------------------------------------------------------ CLI


def _stop(process: subprocess.Popen[str]) -> str:
    process.terminate()
    _, err = process.communicate(timeout=30)
    return err


def test_the_cli_prints_the_url_with_the_token_and_serves(settled: str, cli_process: Any,
                                                          ) -> None:
    process = cli_process.start("dashboard", "--port", "0")
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", url), url
        base, token = url.split("/?token=")
        assert httpx.get(f"{base}/api/live").status_code == 403
        live = httpx.get(f"{base}/api/live", headers={"X-Migronaut-Token": token})
        assert live.status_code == 200 and live.json()["background"][0]["migration"] == NAME
        handed = httpx.get(url)
        assert handed.status_code == 303  # into a cookie, out of the address bar
        refused = httpx.post(f"{base}/background/{NAME}/pause",
                             headers={"X-Migronaut-Token": token})
        assert refused.status_code == 403  # no --allow-controls
    finally:
        err = _stop(process)
    assert process.returncode == 0, err
    assert "not on loopback" not in err


def test_the_cli_warns_off_loopback_and_refuses_bad_flags(cli_process: Any, cli: Any) -> None:
    process = cli_process.start("dashboard", "--host", "0.0.0.0", "--port", "0")
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url  # a browser cannot open 0.0.0.0
        assert httpx.get(url).status_code == 303
    finally:
        err = _stop(process)
    assert process.returncode == 0, err
    assert "⚠ Listening on 0.0.0.0, not on loopback" in err
    assert "Listening on all interfaces (0.0.0.0): from another machine use http://" in err
    bad = cli("dashboard", "--port", "70000")
    assert bad.exit_code == 6
    assert "--port must be between 0 and 65535 (got '70000')" in bad.stderr
    bad_json = cli("dashboard", "--port", "x", "--json")
    assert bad_json.exit_code == 6 and bad_json.json["error"]["code"] == "CONFIG_INVALID"


def test_the_one_aggregate_view_equals_the_per_migration_reads(settled: str, migrator: Migrator,
                                                               db: Any) -> None:
    """``background status`` reads every migration's partitions in one aggregate; its views are
    the ones the separate reads (``count_by_status``, ``live_leases``, live totals) give —
    with a live lease, an expired one and a generation not rolled up yet."""
    import datetime as dt

    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    first, second = db[PARTITIONS].find({"background": NAME}).sort("seq", 1).limit(2)
    db[PARTITIONS].update_one({"_id": first["_id"]}, {"$set": {"lease": {
        "slot": 0, "token": "t1", "owner": "w1", "host": "h", "pid": 1, "ttlMs": 60_000,
        "renewedAt": now, "claimedAt": now}}})
    db[PARTITIONS].update_one({"_id": second["_id"]}, {"$set": {"lease": {
        "slot": 1, "token": "t2", "owner": "w2", "host": "h", "pid": 2, "ttlMs": 1_000,
        "renewedAt": now - dt.timedelta(minutes=5), "claimedAt": now}}})
    engine = migrator.background
    state = engine.state(NAME)
    assert state is not None and state["rolledGeneration"] < state["generation"]
    with AUDIT.recording() as sent:
        summarised = engine.status(NAME)[0]
    assert len(sent) == 2  # the state, one aggregate
    separate = engine.view(state)
    assert summarised == separate
    assert summarised["liveLeases"] == 1 and summarised["partitions"]["leased"] == 2
    assert summarised["totals"]["scanned"] > 0


@pytest.mark.parametrize("missing", ["uvicorn", "starlette.applications"])
def test_without_the_extra_the_command_says_how_to_install_it(
        project: Any, cli: Any, db: Any, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    for loaded in [m for m in sys.modules if m.startswith("migronaut.dashboard")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, missing, None)  # an import of it now fails
    result = cli("dashboard", "--port", "0", "--json")
    assert result.exit_code == 6, result.stderr
    error = result.json["error"]
    assert error["code"] == "CONFIG_INVALID" and error["context"]["extra"] == "dashboard"
    assert error["context"]["missing"] == missing
    assert "pip install 'migronaut[dashboard]'" in error["message"]
    assert missing.split(".")[0] in error["message"]


def test_help_and_import_do_not_load_the_dashboard() -> None:
    probe = ("import migronaut; from migronaut.cli import main\n"
             "try:\n    main(['dashboard', '--help'])\nexcept SystemExit:\n    pass\n"
             "import sys; print([m for m in ('starlette', 'jinja2', 'uvicorn', "
             "'migronaut.dashboard') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_overview_lists_fifty_outstanding_migrations_and_counts_the_rest(
        project: Any, migrator: Migrator) -> None:
    write_simple(project, *(f"{n:04d}_step" for n in range(60)))
    page = TestClient(create_app(migrator)).get("/")
    assert page.status_code == 200
    assert page.text.count('class="status s-pending"') == 50
    assert "… 10 more" in page.text and "0049_step.py" in page.text
    assert "0050_step.py" not in page.text
    assert re.search(r"<h2>Pending</h2><p class=\"big warn\">60</p>", page.text)


def test_a_migration_in_doubt_shows_on_the_overview_and_in_the_metrics(
        project: Any, db: Any, migrator: Migrator) -> None:
    write_simple(project, "0001_a", "0002_b")
    db["_migronaut_migrations"].insert_one({
        "name": "0001_a.py", "status": "running",
        "intent": {"runId": "gone", "lockOwner": "gone", "host": "h", "pid": 1}})
    client = TestClient(create_app(migrator))
    page = client.get("/")
    assert page.status_code == 200
    assert '<span class="status s-in-doubt" data-field="status">in-doubt</span> 0001_a.py' \
        in page.text
    assert re.search(r"<h2>In doubt</h2><p class=\"big bad\">1</p>", page.text)
    assert "migronaut resolve FILE" in page.text
    rows = {row["file"]: row for row in client.get("/api/status").json()}
    assert rows["0001_a.py"]["status"] == "in-doubt" and rows["0001_a.py"]["runId"] == "gone"
    samples = scrape(client)
    assert at(samples, "migronaut_migrations_in_doubt") == 1
    assert at(samples, "migronaut_migrations", status="in-doubt") == 1
    assert at(samples, "migronaut_migrations_pending") == 1


def test_an_unreachable_database_fails_at_start_not_on_every_page(cli: Any) -> None:
    uri = "mongodb://alice:hunter2@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    result = cli("dashboard", "--port", "0", "--uri", uri)
    assert result.exit_code == 5, result.stderr  # CONNECTION_FAILED
    assert "✖ CONNECTION_FAILED:" in result.stderr
    assert "Dashboard ready" not in result.stderr and result.stdout == ""
    assert "hunter2" not in result.stderr


def test_a_page_answers_database_unreachable_within_its_own_timeout(project: Any) -> None:
    """The client waits 10 minutes to select a server; a page gives up after PAGE_TIMEOUT_S
    (without it this test runs into pytest's timeout) and says the database is unreachable."""
    uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=600000"
    with Migrator(cwd=project.path, uri=uri) as unreachable:
        client = client_of(unreachable)
        page = client.get("/")
        assert page.status_code == 503
        assert "Database unreachable" in page.text and 'role="alert"' in page.text
        live = client.get("/api/live")
        assert live.status_code == 503
        assert live.json()["error"]["code"] == "CONNECTION_FAILED"


def test_two_dashboards_on_one_host_keep_their_cookies_apart(settled: str,
                                                             migrator: Migrator) -> None:
    """Cookies are per host, not per port: the same cookie name would let one dashboard's
    token overwrite the other's, and each would then refuse the other's pages."""
    jar = httpx.Cookies()
    clients = []
    for token in ("first-token-" + "a" * 30, "second-token-" + "b" * 30):
        client = client_of(migrator, allow_controls=True, token=token)
        handed = client.get(f"/?token={token}")
        assert handed.status_code == 303
        jar.update(handed.cookies)
        client.cookies = dict(handed.cookies)
        jar.update(client.get("/").cookies)  # the session cookie of the controls
        clients.append(client)
    names = sorted(jar.keys())
    assert len(names) == 4, names  # a token and a session cookie per dashboard
    assert all(n.startswith(("migronaut_token_", "migronaut_session_")) for n in names)
    for client in clients:  # a browser sends both dashboards' cookies to each
        client.cookies = dict(jar)
        assert client.get("/api/live").status_code == 200


def _set_plan(db: Any, **fields: Any) -> None:
    db[STATES].update_one({"_id": NAME}, {"$set": {f"plan.{k}": v for k, v in fields.items()}})


def test_a_lower_bound_estimate_shows_at_least_and_no_percentage_or_eta(
        settled: str, migrator: Migrator, db: Any) -> None:
    """``background progress`` prints ``done/≥N`` for such a plan; the page said 42 % and an
    ETA against N, then 100 % while still running."""
    _set_plan(db, estimate=100, atLeast=True)
    client = client_of(migrator)
    view = client.get(f"/api/live/{NAME}").json()["background"][0]
    progress = view["progress"]
    assert progress["atLeast"] is True and progress["estimate"] == 100
    assert progress["percent"] is None and progress["etaSeconds"] is None
    assert progress["partitionPercent"] is not None  # the share it does know, labelled
    for page in ("/", f"/background/{NAME}"):
        text = client.get(page).text
        assert '<span data-field="estimate" title="a lower bound' in text
        assert "≥100</span>" in text and "% of partitions" in text
    _set_plan(db, estimate=10, atLeast=False)  # an estimate the reads went past
    progress = client.get(f"/api/live/{NAME}").json()["background"][0]["progress"]
    assert progress["done"] > 10 and progress["percent"] is None
    assert progress["etaSeconds"] is None


def test_failed_documents_show_live_and_metrics_agree(settled: str, migrator: Migrator,
                                                      db: Any) -> None:
    """Before the generation is rolled up its failures sit on the partitions: the page, the
    live poll and both metrics show them, not 0 and "No errors"."""
    generation = db[STATES].find_one({"_id": NAME})["generation"]
    db[PARTITIONS].update_one(
        {"background": NAME, "generation": generation},
        {"$set": {"counters.failed": 3, "badIds": ["id-1", "id-2", "id-3"],
                  "lastDocErrors": [{"reason": "transform", "error": "cannot migrate this one"}]}})
    client = client_of(migrator)
    assert client.get(f"/api/live/{NAME}").json()["background"][0]["failedDocuments"] == 3
    overview = client.get("/").text
    assert '<td class="num" data-field="failed">3</td>' in overview
    page = client.get(f"/background/{NAME}").text
    assert "cannot migrate this one" in page and "No errors." not in page
    assert "<code>id-2</code>" in page
    samples = scrape(client)
    assert at(samples, "migronaut_background_failed_documents", migration=NAME) == 3
    assert at(samples, "migronaut_background_documents_total", migration=NAME,
              counter="failed") == 3


def test_the_favicon_is_an_svg_and_pages_link_it(settled: str, migrator: Migrator) -> None:
    client = client_of(migrator)
    icon = client.get("/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg")
    assert 'rel="icon" type="image/svg+xml"' in client.get("/").text


def test_the_throughput_chart_has_axes_times_and_units(settled: str, migrator: Migrator) -> None:
    page = client_of(migrator).get(f"/background/{NAME}").text
    chart = page[page.index('<figure class="chart-box">'):page.index("</figure>")]
    assert chart.count('class="axis"') == 2 and ">docs/s</text>" in chart
    assert re.search(r">\d\d:\d\d:\d\d UTC</text>", chart)
    assert "Documents read per second" in chart and "average since the start" in chart
    cells = re.findall(r'<div class="cell [^"]*"[^>]*>', page)
    assert cells and all('tabindex="0"' in c and 'aria-label="Partition ' in c for c in cells)
