"""One measured scenario in a fresh process; ``bench/run.py`` starts it and reads its JSON.

    python bench/_driver.py SPEC.json RESULT.json

``SPEC`` names a scenario (``migronaut-up``, ``migronaut-status``, ``mongomig-up``,
``mongomig-status``, ``mongodb-migrations-up``, ``pymongo-up``), the server URI, a fresh database
name, the number of migrations and a scratch directory. The driver writes the migration files in
that tool's own format, does the unmeasured set-up, then times only the tool's own entry point
while a pymongo listener counts every command sent (by name and collection), every connection
opened and every connection pool created (one per ``MongoClient`` on one server).

It imports only the standard library and pymongo at the top, so it runs unchanged in the
migronaut environment and in the peers' environment. For the peers the listener is registered
globally with ``pymongo.monitoring.register`` *before* the peer is imported, so the clients the
peer creates itself are counted too; migronaut gets the same listener through its documented
``client_options={"event_listeners": [...]}``.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pymongo import MongoClient, monitoring

# --------------------------------------------------------------------------------- counting


class Counter(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    """Counts commands (by name and collection), connections and connection pools.

    Not a ``TopologyListener`` on purpose: with one registered, pymongo publishes topology
    events through a background queue and ``MongoClient.close()`` then waits ~0.5 s for it,
    which would be measured. A client on one server has one pool: pools count clients.
    """

    def __init__(self, timed_collection: str | None = None) -> None:
        self.commands: collections.Counter[tuple[str, str]] = collections.Counter()
        self.connections = 0
        self.pools = 0
        self.timed_collection = timed_collection
        self.stamps: list[float] = []  # start time of each command on ``timed_collection``
        self.active = False

    def reset(self) -> None:
        self.commands.clear()
        self.connections = 0
        self.pools = 0
        self.stamps.clear()

    # CommandListener
    def started(self, event: Any) -> None:
        if not self.active:
            return
        target = event.command.get(event.command_name)
        collection = target if isinstance(target, str) else ""
        if event.command_name == "getMore":
            collection = str(event.command.get("collection", ""))
        self.commands[(event.command_name, collection)] += 1
        if collection and collection == self.timed_collection:
            self.stamps.append(time.perf_counter())

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass

    # ConnectionPoolListener
    def connection_created(self, event: Any) -> None:
        if self.active:
            self.connections += 1

    def pool_created(self, event: Any) -> None:
        if self.active:
            self.pools += 1

    def pool_ready(self, event: Any) -> None:
        pass

    def pool_cleared(self, event: Any) -> None:
        pass

    def pool_closed(self, event: Any) -> None:
        pass

    def connection_ready(self, event: Any) -> None:
        pass

    def connection_closed(self, event: Any) -> None:
        pass

    def connection_check_out_started(self, event: Any) -> None:
        pass

    def connection_check_out_failed(self, event: Any) -> None:
        pass

    def connection_checked_out(self, event: Any) -> None:
        pass

    def connection_checked_in(self, event: Any) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {
            "commands": [[name, coll, n] for (name, coll), n in sorted(self.commands.items())],
            "connections": self.connections,
            "clients": self.pools,
            "stamps": list(self.stamps),
        }


@contextlib.contextmanager
def measured(counter: Counter) -> Any:
    """Count and time the block; yields a dict filled with ``seconds`` on exit."""
    out: dict[str, Any] = {}
    counter.reset()
    counter.active = True
    started = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - started
        counter.active = False
        out.update(counter.snapshot())


# --------------------------------------------------------------------------------- fixtures

TARGET = "bench_target"  # the one small collection every trivial migration updates
BASE_TIME = dt.datetime(2024, 1, 1, 0, 0, 0)
UPDATE = "update_one({'_id': 1}, {'$inc': {'n': 1}}, upsert=True)"


def stamp(i: int) -> str:
    """A valid ``YYYYMMDDHHMMSS`` timestamp, one second apart per index."""
    return (BASE_TIME + dt.timedelta(seconds=i)).strftime("%Y%m%d%H%M%S")


def write_migronaut(directory: Path, n: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (directory / f"{stamp(i)}_bench_{i:05d}.py").write_text(
            f'"""Trivial migration {i}."""\n\n\n'
            f"def up(ctx):\n    ctx.db[{TARGET!r}].{UPDATE}\n\n\n"
            f"def down(ctx):\n    ctx.db[{TARGET!r}].update_one({{'_id': 1}}, "
            f"{{'$inc': {{'n': -1}}}})\n",
            encoding="utf-8",
        )


def write_mongodb_migrations(directory: Path, n: int) -> None:
    # its loader only accepts ^(\d+)[_a-z]*\.py$ : no digits after the timestamp
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (directory / f"{stamp(i)}_bench.py").write_text(
            "from mongodb_migrations.base import BaseMigration\n\n\n"
            "class Migration(BaseMigration):\n"
            f"    def upgrade(self):\n        self.db[{TARGET!r}].{UPDATE}\n\n"
            f"    def downgrade(self):\n        self.db[{TARGET!r}].update_one({{'_id': 1}}, "
            f"{{'$inc': {{'n': -1}}}})\n",
            encoding="utf-8",
        )


def write_mongomig(root: Path, uri: str, db_name: str, n: int) -> Path:
    """A mongomig project: ``mongomig.yaml`` + a linear chain of ``n`` revisions."""
    versions = root / "migrations" / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    config = root / "mongomig.yaml"
    # JSON is YAML; execution.confirm=never so no prompt logic differs from the others
    config.write_text(
        json.dumps(
            {
                "database": {"uri": uri, "name": db_name},
                "migrations": {"directory": "migrations"},
                "execution": {"confirm": "never"},
            }
        ),
        encoding="utf-8",
    )
    previous = None
    for i in range(n):
        rev = f"b{i:05d}"
        moment = BASE_TIME + dt.timedelta(minutes=i)
        (versions / f"{moment:%Y%m%d_%H%M}_{rev}_bench.py").write_text(
            f'"""Trivial migration {i}."""\n\n'
            f"revision = {rev!r}\n"
            f"down_revision = {previous!r}\n"
            "branch_labels = None\ndepends_on = None\nreversible = True\n"
            "snapshot_hash = None\nmongomig_format = 1\n\n\n"
            f"def upgrade(ctx):\n    ctx.collection({TARGET!r}).{UPDATE}\n\n\n"
            f"def downgrade(ctx):\n    ctx.collection({TARGET!r}).update_one({{'_id': 1}}, "
            f"{{'$inc': {{'n': -1}}}})\n",
            encoding="utf-8",
        )
        previous = rev
    return config


def uri_with_database(uri: str, db_name: str) -> str:
    """``uri`` with ``db_name`` as its path (mongodb-migrations reads the database from it).

    When the URI carries credentials and no ``authSource``, the database it authenticated
    against is kept as ``authSource`` so changing the path does not change the login.
    """
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if "@" in parts.netloc and not any(k.lower() == "authsource" for k, _ in query):
        query.append(("authSource", parts.path.strip("/") or "admin"))
    return urlunsplit((parts.scheme, parts.netloc, f"/{db_name}", urlencode(query), ""))


def verify(uri: str, db_name: str, changelog: str, n: int) -> dict[str, Any]:
    """After a run: the body ran ``n`` times and the changelog holds ``n`` records."""
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        db = client[db_name]
        doc = db[TARGET].find_one({"_id": 1}) or {}
        records = db[changelog].count_documents({})
    ok = doc.get("n") == n and records >= n
    return {"verified": ok, "target_n": doc.get("n"), "changelog_records": records}


def median_of(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["seconds"] for r in runs)


def time_command(argv: list[str], repeats: int, cwd: Path) -> dict[str, Any]:
    """The same status through the tool's own CLI: median wall of ``repeats`` subprocesses."""
    import subprocess

    if not Path(argv[0]).exists():
        return {"error": f"{Path(argv[0]).name} not installed"}
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return {"error": f"exit {done.returncode}: {lines[-1] if lines else ''}"[:160]}
    return {"seconds": statistics.median(times), "all_seconds": times}


def shown(argv: list[str], spec: dict[str, Any], work: Path) -> list[str]:
    """``argv`` for printing: no URI (it may carry a password), paths relative to ``work``."""
    out = [Path(argv[0]).name]
    for arg in argv[1:]:
        if arg == spec["uri"]:
            arg = "URI"
        elif arg == spec["db"]:
            arg = "DB"
        elif arg.startswith(str(work)):
            arg = os.path.relpath(arg, work)
        out.append(arg)
    return out


def console_script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


# --------------------------------------------------------------------------------- scenarios


def migronaut_up(spec: dict[str, Any]) -> dict[str, Any]:
    from migronaut.api import Migrator

    work = Path(spec["workdir"])
    n = spec["n"]
    write_migronaut(work / "migrations", n)
    counter = Counter(timed_collection=TARGET)
    options = {"event_listeners": [counter]}
    migrator = Migrator(uri=spec["uri"], db_name=spec["db"],
                        migrations_dir=str(work / "migrations"), env_file=False, cwd=str(work),
                        client_options=options)  # lazy: connects inside up(), measured
    with measured(counter) as out, migrator:
        results = migrator.up()
    out["applied"] = sum(1 for r in results if r.status == "applied")
    out.update(verify(spec["uri"], spec["db"], "_migronaut_migrations", n))
    return out


def migronaut_status(spec: dict[str, Any]) -> dict[str, Any]:
    from migronaut.api import Migrator

    work = Path(spec["workdir"])
    n = spec["n"]
    write_migronaut(work / "migrations", n)
    counter = Counter()
    options = {"event_listeners": [counter]}

    def migrator() -> Migrator:
        return Migrator(uri=spec["uri"], db_name=spec["db"],
                        migrations_dir=str(work / "migrations"), env_file=False, cwd=str(work),
                        client_options=options)

    # set-up, not measured: the 1,000 records are written by migronaut's own `up`
    seed_started = time.perf_counter()
    with migrator() as m:
        applied = sum(1 for r in m.up() if r.status == "applied")
    seed_seconds = time.perf_counter() - seed_started
    runs = []
    rows: list[Any] = []
    for _ in range(spec["repeats"]):
        with measured(counter) as out, migrator() as m:
            rows = m.status()
        runs.append(out)
    argv = [console_script("migronaut"), "--uri", spec["uri"], "--db", spec["db"],
            "--dir", str(work / "migrations"), "--no-env", "--json", "status"]
    cli = time_command(argv, spec["repeats"], work)
    cli["shown"] = shown(argv, spec, work)
    return {
        "seconds": median_of(runs),
        "all_seconds": [r["seconds"] for r in runs],
        "commands": runs[-1]["commands"],
        "connections": runs[-1]["connections"],
        "clients": runs[-1]["clients"],
        "cli": cli,
        "rows": len(rows),
        "applied_rows": sum(1 for r in rows if r.status == "applied"),
        "checksums_ok": sum(1 for r in rows if r.checksum_ok),
        "seed": f"migronaut Migrator.up() of {applied} files",
        "seed_seconds": seed_seconds,
    }


def mongomig_up(spec: dict[str, Any]) -> dict[str, Any]:
    counter = Counter(timed_collection=TARGET)
    monitoring.register(counter)
    from mongomig import api

    work = Path(spec["workdir"])
    n = spec["n"]
    config = write_mongomig(work, spec["uri"], spec["db"], n)
    os.chdir(work)
    with measured(counter) as out:
        result = api.upgrade("head", config=config, yes=True)
    out["applied"] = len(result.steps)
    out.update(verify(spec["uri"], spec["db"], "__mongomig_migrations", n))
    return out


def mongomig_status(spec: dict[str, Any]) -> dict[str, Any]:
    counter = Counter()
    monitoring.register(counter)
    from mongomig import api
    from mongomig.config.loader import load_config
    from mongomig.database.client import open_database
    from mongomig.migrations.executor import Executor
    from mongomig.migrations.graph import build_graph
    from mongomig.migrations.reporting import Reporter

    work = Path(spec["workdir"])
    n = spec["n"]
    config = write_mongomig(work, spec["uri"], spec["db"], n)
    os.chdir(work)
    # set-up, not measured: mongomig's own `stamp head` (one insert_many of its records)
    seed_started = time.perf_counter()
    loaded = load_config(config)
    graph = build_graph(loaded.versions_dir)
    with open_database(loaded) as db:
        stamped = Executor(loaded, graph, db, reporter=Reporter()).stamp(["head"])
    seed_seconds = time.perf_counter() - seed_started
    runs = []
    state = None
    for _ in range(spec["repeats"]):
        with measured(counter) as out:
            state = api.current_state(config=config)
        runs.append(out)
    assert state is not None
    argv = [console_script("mongomig"), "--config", str(config), "--json", "current"]
    cli = time_command(argv, spec["repeats"], work)
    cli["shown"] = shown(argv, spec, work)
    return {
        "seconds": median_of(runs),
        "all_seconds": [r["seconds"] for r in runs],
        "commands": runs[-1]["commands"],
        "connections": runs[-1]["connections"],
        "clients": runs[-1]["clients"],
        "cli": cli,
        "rows": len(state.applied) + len(state.pending),
        "applied_rows": len(state.applied),
        "seed": f"mongomig stamp head ({len(stamped)} records, one insert_many)",
        "seed_seconds": seed_seconds,
    }


def mongodb_migrations_up(spec: dict[str, Any]) -> dict[str, Any]:
    counter = Counter(timed_collection=TARGET)
    monitoring.register(counter)
    from mongodb_migrations.cli import MigrationManager
    from mongodb_migrations.config import Configuration

    work = Path(spec["workdir"])
    n = spec["n"]
    write_mongodb_migrations(work / "migrations", n)
    os.chdir(work)
    url = uri_with_database(spec["uri"], spec["db"])
    config = Configuration({
        "mongo_url": url,
        "mongo_database": "",
        "mongo_migrations_path": str(work / "migrations"),
        "metastore": "database_migrations",
    })
    with measured(counter) as out, contextlib.redirect_stdout(io.StringIO()):
        MigrationManager(config).run()
    out["applied"] = n
    out.update(verify(spec["uri"], spec["db"], "database_migrations", n))
    return out


def pymongo_up(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor: a hand-written loop, one body update + one changelog write per migration.

    The changelog write is an upsert by a uniquely indexed name (migronaut's shape), not an
    ``insert_one``: on the dev server an insert costs time proportional to the collection's
    size while an upsert found through a unique index does not, and a floor should be the
    cheapest way to do the same work.
    """
    counter = Counter(timed_collection=TARGET)
    n = spec["n"]
    with MongoClient(spec["uri"]) as setup:  # set-up, not measured
        setup[spec["db"]]["changelog"].create_index("name", unique=True)
    with measured(counter) as out, MongoClient(spec["uri"], event_listeners=[counter]) as client:
        db = client[spec["db"]]
        for i in range(n):
            db[TARGET].update_one({"_id": 1}, {"$inc": {"n": 1}}, upsert=True)
            db["changelog"].update_one(
                {"name": f"{stamp(i)}_bench_{i:05d}.py"},
                {"$set": {"status": "applied"}, "$currentDate": {"appliedAt": True}},
                upsert=True,
            )
    out["applied"] = n
    out.update(verify(spec["uri"], spec["db"], "changelog", n))
    return out


SCENARIOS = {
    "migronaut-up": migronaut_up,
    "migronaut-status": migronaut_status,
    "mongomig-up": mongomig_up,
    "mongomig-status": mongomig_status,
    "mongodb-migrations-up": mongodb_migrations_up,
    "pymongo-up": pymongo_up,
}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    result = SCENARIOS[spec["scenario"]](spec)
    result["python"] = sys.version.split()[0]
    Path(sys.argv[2]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
