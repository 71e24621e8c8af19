"""The dashboard in headless Chromium (Debian's ``chromium`` + ``chromium-driver``; selenium):
progress advances without a reload while lanes work, a pause from the migration's page (with
the token, confirmed) lands in MongoDB, and without the token the control is refused.

Every screenshot is checked (the page shows the expected text, the image is not blank) and
saved to ``$MIGRONAUT_TEST_ARTIFACTS`` (default ``.artifacts/`` at the repo root).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.background import NAME, STATES, register
from helpers.tools import require_tool
from migronaut import Migrator
from migronaut.core.context import Cancellation
from migronaut.dashboard import create_app
from migronaut.errors import RunAbortedError

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30.0


def artifacts() -> Path:
    where = Path(os.environ.get("MIGRONAUT_TEST_ARTIFACTS") or ROOT / ".artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def _varied(png: bytes) -> bool:
    """Whether a PNG shows something: its filtered scanlines hold more than a handful of byte
    values (a blank or single-colour page filters down to almost nothing)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    data, at = b"", 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at:at + 4])
        kind = png[at + 4:at + 8]
        if kind == b"IDAT":
            data += png[at + 8:at + 8 + length]
        at += 12 + length
    return len(set(zlib.decompress(data))) > 32


def shoot(browser: Any, name: str, *expected: str) -> None:
    """Check the page (its text holds ``expected``; the screenshot is not blank), then save the
    screenshot under :func:`artifacts`."""
    shown = browser.find_element("tag name", "body").text
    for text in expected:
        assert text in shown, (text, shown[:500])
    png = browser.get_screenshot_as_png()
    assert _varied(png), f"{name}: the screenshot is blank"
    (artifacts() / f"{name}.png").write_bytes(png)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Served:
    """The dashboard app on a real port (uvicorn in a thread)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=WAIT_S)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium = require_tool("chromium", "apt-get install -y chromium chromium-driver")
    driver_path = require_tool("chromedriver", "apt-get install -y chromium chromium-driver")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def running(project: Any, cli: Any, db: Any) -> Iterator[tuple[Migrator, str]]:
    """A background migration that lasts a few seconds (10 ms a document, one lane, batches
    of 10), driven from a thread until the test ends or it is paused."""
    name = register(project, cli, db, docs=600, sleep=0.01, max_parallel=1, batch_size=10)
    stop = Cancellation()
    with Migrator(cwd=project.path) as migrator:

        def drive() -> None:
            with contextlib.suppress(RunAbortedError):  # the test's own stop
                migrator.background.drive(name, concurrency=1, cancellation=stop, driver="test")

        lane = threading.Thread(target=drive, daemon=True)
        lane.start()
        try:
            yield migrator, name
        finally:
            stop.cancel(RunAbortedError("test over"))
            lane.join(timeout=WAIT_S)


def _until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _done(browser: Any) -> int:
    text = browser.find_element("css selector", f'tr[data-migration="{NAME}"] '
                                "[data-field=done]").text
    return int(text or 0)


def test_progress_advances_without_a_reload_and_pause_lands_in_mongodb(
        browser: Any, running: tuple[Migrator, str], db: Any) -> None:
    migrator, name = running
    _until(lambda: (db[STATES].find_one({"_id": name}) or {}).get("status") == "running",
           "the migration to run")
    app = create_app(migrator, allow_controls=True)
    with Served(app) as served:
        browser.get(f"{served.base}/?token={app.state.token}")
        assert "?token" not in browser.current_url  # handed over to the cookie
        browser.execute_script("window.__sameDocument = true;")
        first = _done(browser)
        _until(lambda: _done(browser) > first, "the progress to advance")
        assert browser.execute_script("return window.__sameDocument === true;")
        bar = browser.find_element("css selector", f'tr[data-migration="{NAME}"] progress')
        # a single-partition plan of 600 documents estimates a lower bound (≥50): the bar is
        # indeterminate and the estimate says ≥ — no percentage the dashboard cannot know
        row = f'tr[data-migration="{NAME}"] '
        estimate = browser.find_element("css selector", row + "[data-field=estimate]").text
        if estimate.startswith("≥"):
            assert browser.execute_script("return arguments[0].matches(':indeterminate');", bar)
            assert browser.find_element("css selector", row + "[data-field=eta]").text == "—"
        else:
            assert float(bar.get_attribute("value") or 0) > 0
        assert "documents read" in (bar.get_attribute("aria-label") or "")
        shoot(browser, "dashboard-overview", "Background migrations", NAME, "running")

        browser.find_element("link text", NAME).click()
        _until(lambda: browser.find_elements("css selector", "#partition-map .cell"),
               "the partition map")
        browser.find_element("css selector", "#actor").send_keys("browser-test")
        shoot(browser, "dashboard-migration", "Partitions", "Throughput", "Pause")
        browser.find_element("css selector", 'form[data-action="pause"] button').click()
        alert = browser.switch_to.alert
        assert alert.text == f"Pause {NAME}?"
        alert.accept()
        state = _until(lambda: (s := db[STATES].find_one({"_id": name}))
                       and s["status"] == "paused" and s, "paused in MongoDB")
        assert state["history"][-1]["by"] == "browser-test"
        _until(lambda: browser.find_element(
            "css selector", f'tr[data-migration="{NAME}"] [data-field=status]').text == "paused",
            "the page to show paused")
        shoot(browser, "dashboard-paused", "paused")


def test_without_the_token_the_control_is_refused_and_nothing_changes(
        browser: Any, running: tuple[Migrator, str], db: Any) -> None:
    migrator, name = running
    _until(lambda: (db[STATES].find_one({"_id": name}) or {}).get("status") == "running",
           "the migration to run")
    app = create_app(migrator, allow_controls=True)
    with Served(app) as served:
        browser.get(f"{served.base}/background/{NAME}")
        assert "FORBIDDEN" in browser.page_source and "needs its token" in browser.page_source
        history = len(db[STATES].find_one({"_id": name})["history"])
        status = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            f"fetch('/background/{NAME}/pause', {{method: 'POST', headers: "
            "{'Content-Type': 'application/x-www-form-urlencoded'}, body: 'csrf=x'})"
            ".then(r => done(r.status));")
        assert status == 403
        shoot(browser, "dashboard-refused", "FORBIDDEN")
        state = db[STATES].find_one({"_id": name})
        assert state["status"] == "running" and len(state["history"]) == history


def test_at_phone_width_the_page_does_not_scroll_sideways(
        browser: Any, project: Any, cli: Any, db: Any) -> None:
    """At 390 px the page was 823 px wide with its tables cut: tables now scroll inside their
    own box and the cards wrap. Dark mode follows ``prefers-color-scheme``."""
    name = register(project, cli, db, docs=300)
    assert cli("background", "run", name, "--once").exit_code == 0
    browser.set_window_size(390, 844)
    with Migrator(cwd=project.path) as migrator, Served(create_app(migrator)) as served:
        for path, shot, text in (("/", "dashboard-narrow-overview", "Background migrations"),
                                 (f"/background/{NAME}", "dashboard-narrow-migration",
                                  "Throughput")):
            browser.get(served.base + path)
            width, viewport = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth];")
            assert viewport <= 420, viewport  # the window really is phone-sized
            assert width <= viewport, (path, width, viewport)
            shoot(browser, shot, text, NAME)
        # the system's dark mode: dark page, light text
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        browser.get(f"{served.base}/background/{NAME}")
        background, colour = browser.execute_script(
            "const s = getComputedStyle(document.body); return [s.backgroundColor, s.color];")
        assert background == "rgb(13, 17, 23)" and colour == "rgb(216, 222, 233)", \
            (background, colour)
        shoot(browser, "dashboard-narrow-dark", "Throughput", NAME)


def test_the_fleet_page_at_phone_width(browser: Any, project: Any, client: Any) -> None:
    """The fleet page's cards wrap and its table scrolls in its own box at 390 px."""
    from migronaut import Fleet

    prefix = f"b{os.getpid()}x{int(time.time() * 1000) % 10**6}"
    names = [f"{prefix}_tenant_with_a_long_name_{i}" for i in range(3)]
    project.write_migration("20260101000001_m1",
                            "def up(ctx):\n    pass\n\n\ndef down(ctx):\n    pass\n")
    project.write("migronaut.toml", f'[fleet]\nnames = {names!r}\nadmin_db = "{prefix}_a"\n')
    try:
        with Fleet(cwd=project.path) as fleet:
            result = fleet.up(concurrency=1, max_failures=0)
            assert result.ok, result.to_json()
        browser.set_window_size(390, 844)
        with Migrator(cwd=project.path) as migrator, Served(create_app(migrator)) as served:
            browser.get(served.base + "/fleet")
            width, viewport = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth];")
            assert viewport <= 420 and width <= viewport, (width, viewport)
            shoot(browser, "dashboard-narrow-fleet", "3 of 3 tenant(s) shown", names[0])
    finally:
        for name in client.list_database_names():
            if name.startswith(prefix):
                client.drop_database(name)
