"""``bench/run.py --dashboard``: server time of the dashboard's overview (the target:
under 200 ms on the dev server for 1,000 applied migrations and 20 background migrations).

One project in a temporary directory: 1,000 trivial migration files marked applied by
``baseline`` (one batch, as ``up`` would leave them), then 20 background migrations registered
by ``up`` over 20 collections of 200 documents and driven one round each (so each has a plan,
partitions and totals). The app runs in this process (Starlette's TestClient, no network): each
render is timed around the request, median of ``rounds``, with the MongoDB commands it sent.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from pymongo import monitoring

APPLIED = 1000
BACKGROUND = 20
DOCS = 200
TARGET_MS = 200.0
HEADERS = ("Request", "Median server time", "Min", "Commands per request", "Target")

BACKGROUND_FILE = """
def migrate(doc, ctx):
    doc["active"] = True
    return doc

background = {{"collection": "c{index}", "from": 0, "to": 1, "migrate": migrate,
               "batch_size": 50, "max_parallel": 2, "partitions": {{"min_partition_docs": 50}}}}
"""


class _Counter(monitoring.CommandListener):
    """A pymongo command listener counting what one request sends."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: Any) -> None:
        self.count += 1

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


def seed(root: Path, uri: str, db_name: str) -> None:
    from pymongo import MongoClient

    from migronaut import Migrator

    migrations = root / "migrations"
    migrations.mkdir()
    for i in range(APPLIED):
        (migrations / f"2024{i:010d}_step.py").write_text(
            "def up(ctx):\n    pass\n\ndef down(ctx):\n    pass\n", encoding="utf-8")
    with Migrator(uri=uri, db_name=db_name, cwd=root) as migrator:
        migrator.baseline()
    with MongoClient(uri) as client:
        for index in range(BACKGROUND):
            collection = client[db_name][f"c{index}"]
            collection.insert_many([{"n": n} for n in range(DOCS)])
            collection.create_index([("__v", 1), ("_id", 1)])
    for index in range(BACKGROUND):
        (migrations / f"2025{index:010d}_background.py").write_text(
            BACKGROUND_FILE.format(index=index), encoding="utf-8")
    with Migrator(uri=uri, db_name=db_name, cwd=root) as migrator:
        migrator.up()
        for state in migrator.background.states():
            migrator.background.drive(str(state["_id"]), until_done=False)


def measure_dashboard(uri: str, rounds: int = 15) -> dict[str, Any]:
    from migronaut import Migrator
    from migronaut.dashboard import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    counter = _Counter()
    monitoring.register(counter)
    db_name = f"bench_dashboard_{uuid.uuid4().hex[:8]}"
    figures: dict[str, Any] = {"applied": APPLIED, "background": BACKGROUND}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seed(root, uri, db_name)
        with Migrator(uri=uri, db_name=db_name, cwd=root) as migrator:
            client = TestClient(create_app(migrator))
            name = str(migrator.background.states()[0]["_id"])
            for path in ("/", "/api/live", f"/background/{name}", "/metrics"):
                client.get(path)  # warm: connection, templates
                times, commands = [], []
                for _ in range(rounds):
                    before = counter.count
                    started = time.perf_counter()
                    response = client.get(path)
                    times.append((time.perf_counter() - started) * 1000)
                    commands.append(counter.count - before)
                    assert response.status_code == 200, (path, response.text[:300])
                label = "/background/NAME" if path.startswith("/background/") else path
                figures[label] = {"median_ms": statistics.median(times), "min_ms": min(times),
                                  "commands": statistics.median(commands)}
            parts = {
                "status": lambda: migrator.status("all", checksums=False),
                "background": lambda: migrator.background.status(),
                "changelog find": lambda: list(migrator.changelog.collection.find({})),
            }
            for label, call in parts.items():
                times = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    call()
                    times.append((time.perf_counter() - started) * 1000)
                figures.setdefault("parts", {})[label] = statistics.median(times)
            migrator.client.drop_database(db_name)
    return figures


def dashboard_table(figures: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    lines = []
    for path in ("/", "/api/live", "/background/NAME", "/metrics"):
        row = figures[path]
        target = (f"< {TARGET_MS:g} ms: {'met' if row['median_ms'] < TARGET_MS else 'MISSED'}"
                  if path == "/" else "")
        lines.append([path, f"{row['median_ms']:.1f} ms", f"{row['min_ms']:.1f} ms",
                      f"{row['commands']:g}", target])
    notes = [
        f"{figures['applied']} applied migrations (baseline) and {figures['background']} "
        f"background migrations ({DOCS} documents each, driven one round) on the dev server",
        "server time: the request through Starlette's TestClient in this process (no network), "
        "median of the rounds; commands: MongoDB commands the request sent",
        "the overview reads the changelog once (no file hashing), the lock, the last runs, the "
        "background states and one aggregate over all their partitions: 6 commands",
        "of the overview's time, medians measured alone: `Migrator.status()` "
        f"{figures['parts']['status']:.1f} ms (its one `find` of the 1,000 changelog records: "
        f"{figures['parts']['changelog find']:.1f} ms), `background.status()` "
        f"{figures['parts']['background']:.1f} ms",
    ]
    return lines, notes
