"""One measured scenario in a fresh process; ``bench/run.py`` starts it and reads its JSON.

    python bench/_driver.py SPEC.json RESULT.json
    python bench/_driver.py --background-process SPEC.json RESULT.json   # see _processes_pass

``SPEC`` names a scenario (``migronaut-up``, ``migronaut-status``, ``mongomig-up``,
``mongomig-status``, ``mongodb-migrations-up``, ``pymongo-up``, ``background``,
``converge``), the server URI,
a fresh database name, the number of migrations and a scratch directory. The driver writes the
migration files in that tool's own format, does the unmeasured set-up, then times only the tool's
own entry point while a pymongo listener counts every command sent (by name and collection),
every connection opened and every connection pool created (one per ``MongoClient`` on one
server). ``background`` (migronaut's background engine or a hand-written loop over a collection
``bench/run.py`` seeded) is described above ``background_run`` below.

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
import itertools
import json
import os
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
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
    """Count and time the block; yields a dict filled with ``seconds`` (wall) and
    ``cpu_seconds`` (this process's CPU: the client's, never the server's) on exit."""
    out: dict[str, Any] = {}
    counter.reset()
    counter.active = True
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - started
        out["cpu_seconds"] = time.process_time() - cpu_started
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


def warm_code_cache(directory: Path) -> None:
    """Load every file of ``directory`` once in another process (unmeasured), as any earlier
    migronaut command on the same files does: their compiled code is then in the cache."""
    import subprocess

    subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from migronaut.core.files import load_module\n"
         "for p in sorted(Path(sys.argv[1]).glob('*.py')): load_module(p)", str(directory)],
        check=True)


def migronaut_up(spec: dict[str, Any]) -> dict[str, Any]:
    """``up`` of ``n`` trivial migrations on files never loaded before (nothing cached)."""
    return _migronaut_up(spec, warm=False)


def migronaut_up_warm(spec: dict[str, Any]) -> dict[str, Any]:
    """``up`` of the same files after an earlier command loaded them (their code cached)."""
    return _migronaut_up(spec, warm=True)


def _migronaut_up(spec: dict[str, Any], *, warm: bool) -> dict[str, Any]:
    from migronaut.api import Migrator

    work = Path(spec["workdir"])
    n = spec["n"]
    write_migronaut(work / "migrations", n)
    if warm:
        warm_code_cache(work / "migrations")
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


def migronaut_up_own(spec: dict[str, Any]) -> dict[str, Any]:
    """migronaut's own client CPU per migration, split: ``up`` of ``n // 5`` then ``n`` files
    whose bodies do nothing, with the changelog's claim and final writes stubbed out (no round
    trip per migration). The slope between the two sizes is the per-migration cost (the fixed
    part cancels out); ``loading`` is the share of loading the files before the first runs."""
    import migronaut.core.changelog as changelog
    import migronaut.core.run_loop as run_loop
    from migronaut.api import Migrator

    changelog.Changelog.finish_and_claim = lambda self, final, claim, run_id: (True, True)
    changelog.Changelog.claim = lambda self, change, run_id: True
    changelog.Changelog.finish = lambda self, change, status: True
    loading = [0.0]
    preflight = run_loop._preflight

    def timed_preflight(*args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return preflight(*args, **kwargs)
        finally:
            loading[0] += time.process_time() - started

    run_loop._preflight = timed_preflight  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for label, n in (("small", max(1, spec["n"] // 5)), ("large", spec["n"])):
        work = Path(spec["workdir"]) / label
        directory = work / "migrations"
        directory.mkdir(parents=True)
        for i in range(n):
            (directory / f"{stamp(i)}_own_{i:05d}.py").write_text(
                f'"""Trivial migration {i}."""\n\n\ndef up(ctx):\n    pass\n\n\n'
                "def down(ctx):\n    pass\n", encoding="utf-8")
        if spec.get("warm"):
            warm_code_cache(directory)
        migrator = Migrator(uri=spec["uri"], db_name=f"{spec['db']}_{label}",
                            migrations_dir=str(directory), env_file=False, cwd=str(work))
        with migrator:
            migrator.connect()
            loading[0] = 0.0
            started = time.process_time()
            migrator.up()
            out[label] = {"n": n, "cpu_seconds": time.process_time() - started,
                          "loading_seconds": loading[0]}
        with MongoClient(spec["uri"]) as client:
            client.drop_database(f"{spec['db']}_{label}")
    small, large = out["small"], out["large"]
    span = large["n"] - small["n"]
    out["own_ms"] = (large["cpu_seconds"] - small["cpu_seconds"]) / span * 1000
    out["loading_ms"] = (large["loading_seconds"] - small["loading_seconds"]) / span * 1000
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


def pymongo_up_record(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor again, writing migronaut's records the way migronaut must.

    Same body update; the changelog writes are migronaut's own into a collection with its five
    indexes: the claim of a migration (``intent_write``: ``running``, with its intent) before
    its body, and its final write (``applied_update``, matching that claim) sent with the next
    migration's claim as two ordered statements of one ``update`` command — N + 1 changelog
    commands for N migrations, each reply checked. What this loop costs above
    :func:`pymongo_up` is the server's work for the richer records; what ``migronaut-up``
    costs above this loop is migronaut's own per-migration work (files, checksums, lock,
    events, hooks, results).
    """
    from pymongo import IndexModel

    from migronaut.core.changelog import (
        INDEXES,
        applied_write,
        finished_write,
        intent_write,
    )

    counter = Counter(timed_collection=TARGET)
    n = spec["n"]
    changelog = "_migronaut_migrations"
    setup: MongoClient[dict[str, Any]]
    with MongoClient(spec["uri"]) as setup:  # set-up, not measured
        setup[spec["db"]][changelog].create_indexes(
            [IndexModel(keys, name=name, **options) for name, keys, options in INDEXES])
    run_id = "00000000-0000-4000-8000-000000000000"
    intent = {"runId": run_id, "lockOwner": run_id, "host": "bench", "pid": os.getpid(),
              "direction": "up"}

    def record(i: int) -> dict[str, Any]:
        return {"name": f"{stamp(i)}_bench_{i:05d}.py", "batch": 1, "status": "applied",
                "checksum": "0" * 64, "environment": "production", "executedBy": "bench",
                "duration": 0, "runId": run_id, "description": f"Trivial migration {i}."}

    def claim(i: int) -> dict[str, Any]:
        mine = record(i)
        return intent_write(mine["name"], direction="up", planned=None, intent=intent,
                            record=mine).statement()

    client: MongoClient[dict[str, Any]]
    with measured(counter) as out, MongoClient(spec["uri"], event_listeners=[counter]) as client:
        db = client[spec["db"]]
        sent = db.command("update", changelog, updates=[claim(0)], ordered=True)
        for i in range(n):
            assert sent.get("n") == (1 if i == 0 else 2), sent
            db[TARGET].update_one({"_id": 1}, {"$inc": {"n": 1}}, upsert=True)
            final = finished_write(applied_write(record(i)), run_id).statement()
            updates = [final, claim(i + 1)] if i + 1 < n else [final]
            sent = db.command("update", changelog, updates=updates, ordered=True)
        assert sent.get("n") == 1, sent
    out["applied"] = n
    out.update(verify(spec["uri"], spec["db"], changelog, n))
    return out


# ------------------------------------------------------------------------------------ scaling


def run_measured(argv: list[str], cwd: Path) -> dict[str, Any]:
    """One subprocess: wall seconds and its own peak RSS (``wait4``'s ``ru_maxrss``, KiB).

    Its output goes to files (a 10,000-row table would fill a pipe) and it is reaped with
    ``os.wait4`` so the memory figure is this child's alone."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                                   stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        size = stdout.tell()
        stderr.seek(0)
        stdout.seek(0)
        text = (stderr.read() or stdout.read()).decode(errors="replace")
    out: dict[str, Any] = {"seconds": wall, "bytes_out": size, "maxrss_kib": usage.ru_maxrss}
    if process.returncode:
        lines = text.strip().splitlines()
        out["error"] = f"exit {process.returncode}: {lines[-1] if lines else ''}"[:160]
    return out


def migronaut_scale(spec: dict[str, Any]) -> dict[str, Any]:
    """``up`` of N files, then ``status`` (table and ``--json``) over them, through the CLI.

    Each command is its own process, timed whole (wall) with its peak resident memory; the
    ``status`` figures are the median (wall) and maximum (memory) of ``repeats`` runs. Growth
    with N shows in the per-file columns ``bench/run.py --scale`` prints.
    """
    work = Path(spec["workdir"])
    n = spec["n"]
    write_migronaut(work / "migrations", n)
    base = [console_script("migronaut"), "--uri", spec["uri"], "--db", spec["db"],
            "--dir", str(work / "migrations"), "--no-env"]
    run_measured([*base, "status"], work)  # warm-up, not measured: the bytecode cache is written
    out: dict[str, Any] = {"up": run_measured([*base, "up"], work)}
    for label, argv in (("status", [*base, "status"]),
                        ("status --json", [*base, "--json", "status"])):
        runs = [run_measured(argv, work) for _ in range(spec["repeats"])]
        failed = [r for r in runs if "error" in r]
        out[label] = failed[0] if failed else {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "all_seconds": [r["seconds"] for r in runs],
            "maxrss_kib": max(r.get("maxrss_kib", 0) for r in runs),
            "bytes_out": runs[0]["bytes_out"],
        }
    out.update(verify(spec["uri"], spec["db"], "_migronaut_migrations", n))
    out["shown"] = shown([*base, "status"], spec, work)
    return out


# ------------------------------------------------------------------------- background migrations
#
# The collection is seeded by ``bench/run.py`` (in its own process, so the seeding's memory is not
# in this process's ``ru_maxrss``): N documents ``{_id: ObjectId, x: i}`` and the version index
# ``{__v: 1, _id: 1}``. Every variant migrates those N documents from version 0 to 1 with
# ``x2 = x * 2``, in batches of ``batch_size``, twice: a timed pass (wall, client CPU, commands,
# ``ru_maxrss``) and, after the collection is reset, a memory pass under ``tracemalloc`` (which
# slows allocation-heavy code down, so it never overlaps the timed pass).

BG_COLLECTION = "docs"
BG_FILE = "20240101000000_bench_background.py"
BG_BOOKKEEPING_PREFIX = "_migronaut"


def write_background(directory: Path, batch_size: int, max_parallel: int) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / BG_FILE).write_text(
        '"""Bench: x2 = x * 2 for every document of docs, version 0 -> 1."""\n\n\n'
        "def migrate(doc, ctx):\n"
        '    doc["x2"] = doc["x"] * 2\n'
        "    return doc\n\n\n"
        "background = {\n"
        f'    "collection": {BG_COLLECTION!r}, "from": 0, "to": 1, "migrate": migrate,\n'
        f'    "batch_size": {batch_size}, "max_parallel": {max_parallel}, "adaptive": False,\n'
        '    "pause_ms": 0,\n'
        "}\n",
        encoding="utf-8",
    )
    return BG_FILE


class Trace(monitoring.CommandListener):
    """Every command sent while ``active``, in order, with the thread that sent it.

    A *batch read* is a ``find`` on the migrated collection sorted by ``_id`` with
    ``limit == batch_size`` (the engine's ``_read`` and the loop's read; the planner's sampling
    and probes have other shapes). On each thread, a batch *window* runs from one batch read to
    the next batch read on that thread (or the thread's last command): the commands of one batch.
    Threads that never send a batch read (the caller's thread: registration, planning,
    coordination; the timers: each lease keeper's renewals, the store's control reader) are
    counted apart.
    """

    def __init__(self, collection: str, batch_size: int) -> None:
        self.collection = collection
        self.batch_size = batch_size
        self.active = False
        self.events: list[tuple[threading.Thread, str, str, bool, tuple[float, float]]] = []
        self.pending: dict[tuple[Any, int], int] = {}
        self.durations: dict[int, float] = {}
        self._lock = threading.Lock()

    def started(self, event: Any) -> None:
        if not self.active:
            return
        command = event.command
        name = event.command_name
        target = command.get(name)
        collection = target if isinstance(target, str) else ""
        if name == "getMore":
            collection = str(command.get("collection", ""))
        batch_read = (name == "find" and collection == self.collection
                      and dict(command.get("sort") or {}) == {"_id": 1}
                      and command.get("limit") == self.batch_size)
        # time.thread_time() is this thread's own CPU: a lane's or the loop's, nobody else's
        stamp = (time.perf_counter(), time.thread_time())
        with self._lock:
            self.pending[(event.connection_id, event.request_id)] = len(self.events)
            self.events.append((threading.current_thread(), name, collection, batch_read, stamp))

    def succeeded(self, event: Any) -> None:
        self._finished(event)

    def failed(self, event: Any) -> None:
        self._finished(event)

    def _finished(self, event: Any) -> None:
        """The command's round trip as pymongo measured it (send → reply decoded)."""
        with self._lock:
            index = self.pending.pop((event.connection_id, event.request_id), None)
            if index is not None:
                self.durations[index] = event.duration_micros / 1e6

    def reset(self) -> None:
        self.events = []
        self.pending = {}
        self.durations = {}

    def summary(self) -> dict[str, Any]:
        """Windows per batch, plus everything outside the windows by thread role."""
        by_thread: dict[threading.Thread, list[tuple[str, str, bool, tuple[float, float],
                                                     float | None]]] = {}
        for index, (thread, name, collection, batch_read, stamp) in enumerate(self.events):
            by_thread.setdefault(thread, []).append(
                (name, collection, batch_read, stamp, self.durations.get(index)))
        windows: list[list[tuple[str, str]]] = []
        # (wall, thread CPU) from one batch read to the next on the same thread: complete
        # batches only (a thread's last window has no end stamp)
        spans: list[tuple[float, float]] = []
        lead_in: collections.Counter[tuple[str, str]] = collections.Counter()
        other: dict[str, collections.Counter[tuple[str, str]]] = {}
        steps: dict[tuple[tuple[str, str], ...], list[list[float]]] = {}
        waits: dict[tuple[tuple[str, str], ...], list[list[float]]] = {}
        lanes = 0
        caller_trips = 0.0
        for thread, events in by_thread.items():
            if not any(batch_read for _, _, batch_read, _, _ in events):
                role = ("timers: lease keepers, control reader"
                        if thread.name.startswith(("migronaut-lease", "migronaut-control"))
                        else "caller: registration, planning, coordination")
                other.setdefault(role, collections.Counter()).update(
                    (name, collection) for name, collection, _, _, _ in events)
                if role.startswith("caller"):
                    caller_trips += sum(trip or 0.0 for *_, trip in events)
                continue
            lanes += 1
            current: list[tuple[str, str]] | None = None
            opened: tuple[float, float] | None = None
            cpu_marks: list[float] = []
            trips: list[float] = []
            for name, collection, batch_read, stamp, duration in events:
                if batch_read:
                    if opened is not None and current is not None:
                        spans.append((stamp[0] - opened[0], stamp[1] - opened[1]))
                        # thread CPU from each command's start to the next one's, in order
                        steps.setdefault(tuple(current), []).append(
                            [b - a for a, b in itertools.pairwise([*cpu_marks, stamp[1]])])
                        waits.setdefault(tuple(current), []).append(trips)
                    opened = stamp
                    current = []
                    cpu_marks = []
                    trips = []
                    windows.append(current)
                if current is None:
                    lead_in[(name, collection)] += 1  # the lane's first claim, before a read
                else:
                    current.append((name, collection))
                    cpu_marks.append(stamp[1])
                    trips.append(duration if duration is not None else float("nan"))
        if lead_in:
            other.setdefault("lanes, before their first batch (first claim)",
                             collections.Counter()).update(lead_in)
        sizes = [len(window) for window in windows]
        shapes = collections.Counter(tuple(window) for window in windows)
        typical = shapes.most_common(1)[0] if shapes else ((), 0)
        in_windows: collections.Counter[tuple[str, str]] = collections.Counter()
        for window in windows:
            in_windows.update(window)
        return {
            "batches": len(windows),
            "lanes_used": lanes,
            "window_sizes": sizes,
            "median_per_batch": statistics.median(sizes) if sizes else None,
            "max_per_batch": max(sizes) if sizes else None,
            "typical_window": [list(item) for item in typical[0]],
            "typical_window_share": typical[1],
            "in_windows": [[n, c, k] for (n, c), k in sorted(in_windows.items())],
            "outside": {role: [[n, c, k] for (n, c), k in sorted(counter.items())]
                        for role, counter in other.items()},
            "total": len(self.events),
            # the round trips of the calling thread (planning, coordination), summed: mostly the
            # server's work
            "caller_trip_seconds": caller_trips,
            "batch_wall": [wall for wall, _ in spans],
            "batch_cpu": [cpu for _, cpu in spans],
            # for the typical batch: median thread CPU from each command's start to the next
            # command's start (the last one: to the next batch's read)
            "typical_step_cpu": [statistics.median(column) for column in
                                 zip(*steps.get(typical[0], []), strict=True)],
            # ... and the median round trip of each of its commands (pymongo's duration: send
            # to reply decoded, mostly the server)
            "typical_step_trip": [statistics.median(column) for column in
                                  zip(*waits.get(typical[0], []), strict=True)],
        }


def maxrss_kib() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def background_check(uri: str, db_name: str, n: int) -> dict[str, Any]:
    """Every document at version 1 with x2 == 2x and __rev 1 (read by a separate client)."""
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        # in batches of 10,000: the dev server sends the rest of a cursor in one reply when
        # getMore names no batch size (mongod caps a batch at 16 MiB), which at 1,000,000
        # documents is larger than a wire message may be
        docs = list(client[db_name][BG_COLLECTION].find(
            {}, {"x": 1, "x2": 1, "__v": 1, "__rev": 1}, batch_size=10_000))
    good = sum(1 for d in docs if d.get("__v") == 1 and d.get("x2") == d.get("x", 0) * 2
               and d.get("__rev") == 1)
    return {"verified": good == n == len(docs), "documents": len(docs), "migrated_ok": good}


def background_reset(uri: str, db_name: str) -> float:
    """Back to version 0: drop migronaut's collections, unset the migrated fields."""
    started = time.perf_counter()
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        db = client[db_name]
        for name in db.list_collection_names():
            if name.startswith(BG_BOOKKEEPING_PREFIX):
                db.drop_collection(name)
        db[BG_COLLECTION].update_many({}, {"$unset": {"x2": "", "__v": "", "__rev": ""}})
    return time.perf_counter() - started


def _migrator(spec: dict[str, Any], trace: Trace | None) -> Any:
    from migronaut.api import Migrator

    work = Path(spec["workdir"])
    options = {"event_listeners": [trace]} if trace is not None else {}
    return Migrator(uri=spec["uri"], db_name=spec["db"],
                    migrations_dir=str(work / "migrations"), env_file=False, cwd=str(work),
                    client_options=options)


def _register(spec: dict[str, Any], migrator: Any, trace: Trace | None,
              out: dict[str, Any]) -> str:
    """Write the migration file and `up` (registration: one-off, reported apart)."""
    lanes = int(spec["lanes"]) * int(spec.get("processes", 1))  # max_parallel
    name = write_background(Path(spec["workdir"]) / "migrations", int(spec["batch_size"]),
                            lanes)
    if trace is not None:
        trace.active = True
    started, cpu = time.perf_counter(), time.process_time()
    results = migrator.up()
    out["register_seconds"] = time.perf_counter() - started
    out["register_cpu"] = time.process_time() - cpu
    if trace is not None:
        out["register"] = trace.summary()
        trace.reset()
    return next((r.file for r in results if r.file == name), name)



@dataclass(frozen=True)
class _Mark:
    """Where a measured pass started: traced memory, peak RSS, wall and process CPU."""

    base: int
    rss: int
    started: float
    cpu: float


def _start_measuring(trace: Trace | None, memory: bool) -> _Mark:
    """Start a measured pass (the engine's and the loop's alike): traced memory when asked,
    the command trace on."""
    base = 0
    if memory:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    rss = maxrss_kib()
    if trace is not None:
        trace.active = True
    return _Mark(base, rss, time.perf_counter(), time.process_time())


def _stop_measuring(mark: _Mark, trace: Trace | None, memory: bool,
                    out: dict[str, Any]) -> None:
    """End a pass started by :func:`_start_measuring`, its figures into ``out``."""
    out["seconds"] = time.perf_counter() - mark.started
    out["cpu"] = time.process_time() - mark.cpu
    out["maxrss_delta_kib"] = maxrss_kib() - mark.rss
    if memory:
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["tracemalloc_peak"] = peak - mark.base
        out["tracemalloc_left"] = current - mark.base
    if trace is not None:
        trace.active = False
        out["drive"] = trace.summary()


def _drive(migrator: Any, name: str, lanes: int, trace: Trace | None, memory: bool,
           out: dict[str, Any]) -> None:
    """`drive(name, concurrency=lanes)`, measured: wall, process CPU, the caller's CPU, memory,
    and planning: from the start of `drive` to its ``background:partitioned`` event (the
    coordinator's first step: the lock, the state, the count, the sample, the partitions'
    insert and the commit), wall and the calling thread's CPU — only in the process that
    planned."""
    engine = migrator.background
    planned: dict[str, float] = {}

    def on_partitioned(payload: dict[str, Any]) -> None:
        planned.setdefault("seconds", time.perf_counter() - started)
        planned.setdefault("cpu", time.thread_time() - caller)

    migrator.on("background:partitioned", on_partitioned)
    mark = _start_measuring(trace, memory)
    caller = time.thread_time()  # this thread plans and coordinates; lanes are threads
    started = mark.started
    view = engine.drive(name, concurrency=lanes)
    out["caller_cpu"] = time.thread_time() - caller
    _stop_measuring(mark, trace, memory, out)
    out["status"] = view.get("status")
    out["totals"] = view.get("totals")
    out["plan"] = view.get("plan")
    out["partitions"] = (view.get("partitions") or {}).get("total")
    if planned:
        out["planning"] = planned


def _views(migrator: Any, name: str, trace: Trace | None, out: dict[str, Any]) -> None:
    """What `background status`, `progress --json` and the dashboard's migration page read at
    the end, and what each costs: its round trips (the server's work plus the wire), its
    commands and the client's wall time. `status --json` is ``engine.status``; `progress`
    adds the partitions (``partitions_view``); the page is the dashboard's ``Board.migration``."""
    if trace is None:
        return
    from migronaut.dashboard.board import Board

    engine = migrator.background
    surfaces: dict[str, Callable[[], Any]] = {
        "status": lambda: engine.status(name),
        "progress": lambda: (engine.status(name), engine.partitions_view(name)),
        "dashboard": lambda: Board(migrator).migration(name),
    }
    views: dict[str, Any] = {}
    for surface, read in surfaces.items():
        trace.reset()
        trace.active = True
        started = time.perf_counter()
        read()
        seconds = time.perf_counter() - started
        trace.active = False
        views[surface] = {"seconds": seconds, "trip_seconds": sum(trace.durations.values()),
                          "commands": [[event[1], event[2]] for event in trace.events]}
    trace.reset()
    out["views"] = views
    # the earlier keys: status + progress's partitions, as `bench/run.py`'s row reads them
    out["views_seconds"] = views["progress"]["seconds"]
    out["views_trip_seconds"] = views["progress"]["trip_seconds"]
    out["views_commands"] = views["progress"]["commands"]


def _engine_pass(spec: dict[str, Any], trace: Trace | None, memory: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _migrator(spec, trace) as migrator:
        name = _register(spec, migrator, trace, out)
        _drive(migrator, name, int(spec["lanes"]), trace, memory, out)
        _views(migrator, name, trace, out)
    return out


def _processes_pass(spec: dict[str, Any], trace: Trace | None, memory: bool) -> dict[str, Any]:
    """``processes`` engines in as many processes, ``lanes`` lanes each, on one migration.

    This process registers the migration (`up`, reported apart) and reads the views at the end;
    each child connects, says it is ready, and on the word drives the migration with its lanes
    (`drive` coordinates through the lock and the stored state, so any number of processes can).
    The figures add up: process CPU, batches, commands, memory; wall is from the word to the last
    child's end."""
    import subprocess

    out: dict[str, Any] = {}
    with _migrator(spec, trace) as migrator:
        name = _register(spec, migrator, trace, out)
        work = Path(spec["workdir"])
        children = []
        for index in range(int(spec["processes"])):
            child_spec = work / f"child-{index}.json"
            child_spec.write_text(json.dumps({**spec, "name": name, "memory": memory,
                                              "trace": trace is not None}), encoding="utf-8")
            children.append((subprocess.Popen(
                [sys.executable, __file__, "--background-process", str(child_spec),
                 str(work / f"child-{index}.out.json")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True), index))
        for child, _ in children:
            assert child.stdout is not None
            for line in child.stdout:  # (anything else a child prints before it is ignored)
                if line.strip() == "ready":
                    break
        started = time.perf_counter()
        for child, _ in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.close()
        for child, _ in children:
            if child.wait() != 0:
                raise RuntimeError(f"a background process exited with {child.returncode}")
        out["seconds"] = time.perf_counter() - started
        parts = [json.loads((work / f"child-{index}.out.json").read_text(encoding="utf-8"))
                 for _, index in children]
        for key in ("cpu", "caller_cpu", "maxrss_delta_kib", "tracemalloc_peak",
                    "tracemalloc_left"):
            if all(key in part for part in parts):
                out[key] = sum(part[key] for part in parts)
        out["cpu_per_process"] = [part["cpu"] for part in parts]
        if trace is not None:
            out["drive"] = merge_summaries([part["drive"] for part in parts])
        out["plan"] = next((part["plan"] for part in parts if part.get("plan")), None)
        out["planning"] = next((part["planning"] for part in parts if part.get("planning")),
                               None)
        final = migrator.background.view(migrator.background.require(name))
        out["status"] = final.get("status")
        out["totals"] = final.get("totals")
        out["partitions"] = (final.get("partitions") or {}).get("total")
        _views(migrator, name, trace, out)
    return out


def background_process(spec_path: str, result_path: str) -> int:
    """A child of :func:`_processes_pass`: connect, say ``ready``, drive on the word."""
    import migronaut.background.lanes.slices  # noqa: F401  (imports are not per-document)

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    trace = Trace(BG_COLLECTION, int(spec["batch_size"])) if spec["trace"] else None
    out: dict[str, Any] = {}
    with _migrator(spec, trace) as migrator:
        engine = migrator.background
        engine.ready()  # connected before measuring, as `up` connects the other variants
        print("ready", flush=True)
        sys.stdin.readline()
        _drive(migrator, spec["name"], int(spec["lanes"]), trace, bool(spec["memory"]), out)
    Path(result_path).write_text(json.dumps(out), encoding="utf-8")
    return 0


def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The :meth:`Trace.summary` of several processes as one: counts added, lists joined."""
    def counts(key: str, role: str | None = None) -> list[list[Any]]:
        total: collections.Counter[tuple[str, str]] = collections.Counter()
        for part in parts:
            items = part.get(key, []) if role is None else part.get(key, {}).get(role, [])
            for name, coll, k in items:
                total[(name, coll)] += k
        return [[n, c, k] for (n, c), k in sorted(total.items())]

    sizes = [size for part in parts for size in part["window_sizes"]]
    typical = max(parts, key=lambda part: part.get("typical_window_share") or 0)
    roles = {role for part in parts for role in part.get("outside", {})}
    return {
        "batches": sum(part["batches"] for part in parts),
        "lanes_used": sum(part["lanes_used"] for part in parts),
        "window_sizes": sizes,
        "median_per_batch": statistics.median(sizes) if sizes else None,
        "max_per_batch": max(sizes) if sizes else None,
        "typical_window": typical["typical_window"],
        "typical_window_share": sum(part.get("typical_window_share") or 0 for part in parts
                                    if part["typical_window"] == typical["typical_window"]),
        "in_windows": counts("in_windows"),
        "outside": {role: counts("outside", role) for role in sorted(roles)},
        "total": sum(part["total"] for part in parts),
        "caller_trip_seconds": sum(part["caller_trip_seconds"] for part in parts),
        "batch_wall": [x for part in parts for x in part["batch_wall"]],
        "batch_cpu": [x for part in parts for x in part["batch_cpu"]],
        "typical_step_cpu": typical["typical_step_cpu"],
        "typical_step_trip": typical["typical_step_trip"],
    }


def _loop_pass(spec: dict[str, Any], trace: Trace | None, memory: bool) -> dict[str, Any]:
    """The floor: a hand-written find + bulk_write loop over _id, same batch size."""
    from bson.min_key import MinKey
    from pymongo import UpdateOne

    limit = int(spec["batch_size"])
    options = {"event_listeners": [trace]} if trace is not None else {}
    out: dict[str, Any] = {}
    with MongoClient(spec["uri"], **options) as client:
        client.admin.command("ping")  # connect before measuring (the engine connects in `up`)
        coll = client[spec["db"]][BG_COLLECTION]
        mark = _start_measuring(trace, memory)
        last: Any = MinKey()
        migrated = batches = 0
        while True:
            docs = list(coll.find({"__v": {"$in": [None, 0]}, "_id": {"$gt": last}})
                        .sort("_id", 1).limit(limit).batch_size(limit))
            batches += 1
            ops = []
            for doc in docs:
                x2 = doc["x"] * 2
                if doc.get("x2") == x2 and doc.get("__v") == 1:
                    continue  # unchanged: no write
                version = doc.get("__v")
                ops.append(UpdateOne(
                    {"_id": doc["_id"], "__v": version if version else {"$in": [None, 0]}},
                    {"$set": {"x2": x2, "__v": 1}, "$inc": {"__rev": 1}},
                ))
            if ops:
                migrated += coll.bulk_write(ops, ordered=False).matched_count
            if len(docs) < limit:
                break
            last = docs[-1]["_id"]
        _stop_measuring(mark, trace, memory, out)
        out["totals"] = {"migrated": migrated, "batches": batches}
    return out


def median_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The pass of median process CPU, with every pass's batches and CPU (noise: see its use).

    On a shared machine one pass can be slowed by a neighbour; timed passes are repeated and the
    median one reported, its per-batch lists extended with every pass's batches (so the steady
    state median is taken over all of them) and a pass that failed its check marks the result.
    """
    ordered = sorted(passes, key=lambda p: p["cpu"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    drive = dict(chosen.get("drive") or {})
    for key in ("batch_cpu", "batch_wall"):
        if key in drive:
            drive[key] = [x for p in passes for x in (p.get("drive") or {}).get(key, [])]
    chosen["drive"] = drive
    chosen["cpu_passes"] = [p["cpu"] for p in passes]
    chosen["verified"] = all(p.get("verified") for p in passes)
    return chosen


def background_run(spec: dict[str, Any]) -> dict[str, Any]:
    """Timed passes (``rounds``; each checked and reset), then a memory pass and its check."""
    variant = spec["variant"]
    run_pass = {"loop": _loop_pass, "processes": _processes_pass}.get(variant, _engine_pass)
    if variant != "loop":  # import the engine before measuring: imports are not per-document
        import migronaut.api
        import migronaut.background.engine
        import migronaut.background.lanes.slices  # noqa: F401
    n = int(spec["n"])
    passes = []
    rounds = max(1, int(spec.get("rounds", 1)))
    more = bool(spec.get("memory_pass", True) or spec.get("profile"))
    reset_seconds = None
    for round_ in range(rounds):
        trace = Trace(BG_COLLECTION, int(spec["batch_size"]))
        timed = run_pass(spec, trace, memory=False)
        timed.update(background_check(spec["uri"], spec["db"], n))
        if round_ < rounds - 1 or more:  # (a last reset with no pass after it: skipped)
            reset_seconds = background_reset(spec["uri"], spec["db"])
        passes.append(timed)
    timed = median_pass(passes)
    memory: dict[str, Any] = {"verified": True}  # --no-memory-pass: the timed passes' checks
    if spec.get("memory_pass", True):
        memory = run_pass(spec, None, memory=True)
        memory.update(background_check(spec["uri"], spec["db"], n))
    profile = None
    if spec.get("profile"):  # --profile: one more pass under cProfile (not timed)
        import cProfile
        import pstats

        background_reset(spec["uri"], spec["db"])
        # On Python >= 3.12 cProfile is built on sys.monitoring and sees every thread (lanes,
        # lease keepers, pymongo's monitors). Its clock is the process's CPU time, so the
        # figures are client CPU, not time spent waiting for the server; with several lanes
        # their calls interleave, so profile the 1-lane variant to attribute CPU.
        profiler = cProfile.Profile(time.process_time)
        profiler.runcall(run_pass, spec, None, False)
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        profile = stream.getvalue()
    return {"timed": timed, "memory": memory, "reset_seconds": reset_seconds,
            "profile": profile}


def converge_run(spec: dict[str, Any]) -> dict[str, Any]:
    """``converge``: one tool's index passes over ``n`` collections (``_converge_scenarios``)."""
    import _converge_scenarios

    return _converge_scenarios.run(spec, Counter, measured)


SCENARIOS = {
    "migronaut-up": migronaut_up,
    "migronaut-up-warm": migronaut_up_warm,
    "migronaut-up-own": migronaut_up_own,
    "migronaut-status": migronaut_status,
    "mongomig-up": mongomig_up,
    "mongomig-status": mongomig_status,
    "mongodb-migrations-up": mongodb_migrations_up,
    "pymongo-up": pymongo_up,
    "pymongo-up-record": pymongo_up_record,
    "migronaut-scale": migronaut_scale,
    "background": background_run,
    "converge": converge_run,
}


def main() -> int:
    if sys.argv[1] == "--background-process":
        return background_process(sys.argv[2], sys.argv[3])
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    result = SCENARIOS[spec["scenario"]](spec)
    result["python"] = sys.version.split()[0]
    Path(sys.argv[2]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
