"""migronaut's benchmark: the "Speed and size" figures of PRODUCT.md beside the peers', in one run.

    .venv-3.13/bin/python bench/run.py [--quick] [--markdown] [--peers-venv DIR] [--no-peers]
        [--background-only] [--background-batch B] [--background-sizes N ...] [--rounds R]
        [--profile]
    .venv-3.13/bin/python bench/run.py --up-only [--rounds R] [--quick] [--markdown]
    .venv-3.13/bin/python bench/run.py --scale [--scale-sizes N,N,...]
    .venv-3.13/bin/python bench/run.py --converge [--converge-collections N] [--markdown]
    .venv-3.13/bin/python bench/run.py --dashboard [--markdown]
    .venv-3.13/bin/python bench/run.py --devserver [--quick] [--markdown]

Run it with the interpreter of an environment where migronaut is installed (``.venv-3.13``, the
one ``bash scripts/test.sh`` creates, also has the dev server's ``mongoeco``). It

1. starts the embedded dev server (``migronaut.devserver.start_subprocess``), or uses
   ``MIGRONAUT_BENCH_URI`` when that is set (then nothing is started);
2. creates ``bench/.venv-peers`` if missing (same base interpreter; ``pip install`` of the pinned
   peers and of the pymongo version migronaut uses), so migronaut's environment is not touched;
3. times ``--version``/``--help`` of each CLI (median of several subprocess runs), ``status``
   over 1,000 applied migrations and ``up`` of 500 trivial migrations, each in a fresh process
   (``bench/_driver.py``) against a fresh database, counting every command sent;
4. migrates the same N documents (1,500 and 4,500; batch size 500, the engine's default) with
   the background engine (1 lane, 4 lanes, two processes of 2 lanes) and with a hand-written
   ``find`` +
   ``bulk_write`` loop, each in a fresh process against a freshly seeded database, ``--rounds``
   timed passes each (the median reported): wall, client CPU per document, round trips per
   batch and peak memory;
5. prints machine facts, the exact command, ONE side-by-side table and the background table, and
   writes ``bench/results/latest.json`` and ``bench/results/latest.md`` (git-ignored).

``--quick`` shrinks the workloads (200 files for status, 100 migrations for up, 500 and 1,500
documents, fewer repeats): a smoke run, not the figures the targets are judged on.
``--background-only`` runs step 4 alone; ``--background-batch B`` changes its batch size and
``--background-sizes N ...`` its document counts;
``--up-only`` runs only ``up`` of 500 trivial migrations (``--quick``: 100): migronaut, the loop
writing migronaut's records the way migronaut must (a claim, then the final write sent with the
next claim) and the plain loop, ``--rounds`` rounds in turns; medians of client CPU and wall, and
migronaut's own CPU per migration (bodies that do nothing, changelog writes stubbed) split into
loading the files and the rest.
``--converge`` runs only the converge section: migronaut's ``converge`` beside Beanie's
``init_beanie`` and MongoEngine's ``ensure_indexes`` over 50 collections (``_converge_report.py``,
``_converge_scenarios.py``).
``--dashboard`` runs only the dashboard section: the overview's server time over
1,000 applied and 20 background migrations (``_dashboard_report.py``; needs the ``dashboard``
extra).
``--devserver`` runs only the dev server section: seeding 1,000,000 documents (``--quick``:
100,000) in ``insert_many`` batches of 10,000, per-operation costs at 10,000 and at N, the server's
resident memory, and the ``--path`` (SQLite) mode at small sizes (``_devserver_report.py``; it
starts its own servers).
``--profile`` adds one cProfile pass (CPU clock) per background variant, written to
``bench/results/profile-*.txt``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DRIVER = BENCH / "_driver.py"
RESULTS = BENCH / "results"
URI_VARIABLE = "MIGRONAUT_BENCH_URI"

PEER_PACKAGES = ("mongodb-migrations==1.3.1", "mongomig==0.4.2")
TOOLS = ("migronaut", "mongodb-migrations", "mongomig", "pymongo loop")

CHANGELOG = {
    "migronaut": "_migronaut_migrations",
    "mongodb-migrations": "database_migrations",
    "mongomig": "__mongomig_migrations",
    "pymongo loop": "changelog",
}
LOCKS = {"migronaut": "_migronaut_locks", "mongomig": "__mongomig_lock"}
WRITES = frozenset({"insert", "update", "delete", "findAndModify"})


@dataclass
class Sizes:
    status_files: int
    up_migrations: int
    status_repeats: int
    cli_runs: int
    background_docs: tuple[int, ...]  # N for the background section: a small and a large one
    background_batch: int


FULL = Sizes(status_files=1000, up_migrations=500, status_repeats=5, cli_runs=15,
             background_docs=(1500, 4500), background_batch=500)
QUICK = Sizes(status_files=200, up_migrations=100, status_repeats=3, cli_runs=5,
              background_docs=(500, 1500), background_batch=500)

#: background variants: (label, --background-variants name, driver variant, lanes per process
#: = drive concurrency, processes); max_parallel = lanes × processes
BACKGROUND_VARIANTS = (
    ("engine, 1 lane", "engine-1", "engine", 1, 1),
    ("engine, 4 lanes", "engine-4", "engine", 4, 1),
    ("engine, 2 processes × 2 lanes", "engine-2x2", "processes", 2, 2),
    ("hand-written loop", "loop", "loop", 1, 1),
)
SEED_CHUNK = 10_000


def log(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------------ environments


def base_python() -> str:
    """The interpreter behind this venv: the peers' venv is made from the same one."""
    return getattr(sys, "_base_executable", None) or sys.executable


def venv_bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def ensure_peers(venv: Path) -> tuple[Path | None, str | None]:
    """Create/refresh the peers' venv; returns (its python, None) or (None, why not)."""
    import pymongo

    packages = [*PEER_PACKAGES, f"pymongo=={pymongo.version}"]
    base = base_python()
    want = json.dumps({"packages": packages, "python": platform.python_version(), "base": base})
    stamp = venv / ".bench-stamp"
    python = venv_bin(venv, "python")
    if python.exists() and stamp.exists() and stamp.read_text(encoding="utf-8") == want:
        return python, None
    try:
        if not python.exists():
            log(f"creating {venv} with {base}")
            subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True)
        log(f"installing {' '.join(packages)} into {venv}")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             *packages],
            check=True, capture_output=True, text=True,
        )
    except subprocess.CalledProcessError as error:
        detail = last_line((error.stderr or "") if isinstance(error.stderr, str) else "")
        return None, f"peers venv set-up failed: {detail or error}"
    stamp.write_text(want, encoding="utf-8")
    return python, None


def python_version(python: Path | str) -> str:
    out = subprocess.run([str(python), "-c", "import sys; print(sys.version.split()[0])"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


def package_version(python: Path | str, name: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


# ------------------------------------------------------------------------------ server


@dataclass
class Server:
    uri: str
    description: str
    process: Any = None

    def close(self) -> None:
        if self.process is not None:
            self.process.close()


def start_server() -> Server:
    configured = os.environ.get(URI_VARIABLE, "").strip()
    if configured:
        return Server(configured, f"{URI_VARIABLE} (not started by the bench)")
    from migronaut.devserver import default_python, start_subprocess

    python = default_python()
    log(f"starting the dev server with {python}")
    process = start_subprocess(python)
    mongoeco = package_version(python, "mongoeco")
    return Server(process.uri, f"migronaut dev server (mongoeco {mongoeco}, in memory)", process)


def server_version(uri: str) -> str:
    from pymongo import MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        info = client.admin.command("buildInfo")
        hello = client.admin.command("hello")
    topology = "replica set" if hello.get("setName") else "standalone"
    return f"reports MongoDB {info.get('version', '?')}, {topology}"


def drop_database(uri: str, name: str) -> None:
    from pymongo import MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        client.drop_database(name)


# ------------------------------------------------------------------------------ measurements


def measured_env(*dropped_prefixes: str) -> dict[str, str]:
    """The environment of every measured process: without the tools' own variables, and with
    a bytecode cache as an installed package has one (``PYTHONDONTWRITEBYTECODE``, set in some
    shells, would make every process compile every module it imports; the cache goes to
    ``bench/results/pycache``, never next to the sources)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(dropped_prefixes) and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(RESULTS / "pycache")
    return env


def time_clis(commands: dict[str, list[str]], runs: int, cwd: Path) -> dict[str, Any]:
    """Median wall time of ``runs`` subprocess runs of each command, after one unmeasured
    warm-up round; the commands take turns (round-robin) so machine load hits all alike."""
    env = measured_env("MIGRONAUT_", "MONGOMIG_")
    times: dict[str, list[float]] = {key: [] for key in commands}
    failed: dict[str, dict[str, Any]] = {}
    for index in range(runs + 1):
        for key, argv in commands.items():
            if key in failed:
                continue
            started = time.perf_counter()
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                  check=False, stdin=subprocess.DEVNULL)
            elapsed = time.perf_counter() - started
            if done.returncode != 0:
                why = last_line(done.stderr) or last_line(done.stdout) or "no output"
                failed[key] = {"error": f"exit {done.returncode}: {why[:120]}", "argv": argv}
            elif index:
                times[key].append(elapsed)
    results: dict[str, Any] = dict(failed)
    for key, values in times.items():
        if key not in failed:
            results[key] = {"seconds": statistics.median(values), "min": min(values),
                            "max": max(values), "runs": runs, "argv": commands[key]}
    return results


def cli_command(python: Path, script: str, module: str | None = None) -> list[str] | None:
    """The console script next to ``python``; else ``python -m module``; else None."""
    candidate = python.parent / script
    if candidate.exists():
        return [str(candidate)]
    return [str(python), "-m", module] if module else None


def run_driver(python: Path | str, scenario: str, uri: str, n: int, repeats: int,
               timeout: float, extra: dict[str, Any] | None = None,
               seed: Any = None) -> dict[str, Any]:
    """One scenario in a fresh process against a fresh database (dropped afterwards).

    ``extra`` is merged into the driver's spec; ``seed(uri, db_name)``, when given, fills the
    fresh database from this process before the driver starts and returns what it reports.
    """
    db_name = f"bench_{scenario.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="migronaut-bench-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec = {"scenario": scenario, "uri": uri, "db": db_name, "n": n, "repeats": repeats,
                "workdir": str(work), **(extra or {})}
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        env = measured_env("MIGRONAUT_", "MONGOMIG_", "MONGODB_MIGRATIONS")
        env["MONGOMIG_GIT_COMMIT"] = "bench"  # mongomig shells out to git otherwise (once/run)
        shown_extra = "".join(f", {k}={v}" for k, v in (extra or {}).items())
        log(f"{scenario}: n={n}{shown_extra}")
        seeded: Any = None
        try:
            if seed is not None:
                seeded = seed(uri, db_name)
            done = subprocess.run([str(python), str(DRIVER), str(spec_path), str(result_path)],
                                  cwd=work, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        except Exception as error:  # a failed seed: report it in the table, go on
            return {"error": f"seeding failed: {type(error).__name__}: {error}"[:200]}
        finally:
            try:
                drop_database(uri, db_name)
            except Exception as error:  # a failed clean-up must not hide the figures
                log(f"could not drop {db_name}: {error}")
            # the compiled code of the scratch directory's files, kept under the pycache prefix
            shutil.rmtree(Path(env["PYTHONPYCACHEPREFIX"], *Path(tmp).resolve().parts[1:]),
                          ignore_errors=True)
        if done.returncode != 0 or not result_path.exists():
            return {"error": last_line(done.stderr)[:200] or f"exit {done.returncode}"}
        result = json.loads(result_path.read_text(encoding="utf-8"))
        if seeded is not None:
            result["seed"] = seeded
        return result


def seed_background(n: int) -> Any:
    """A seeder for ``run_driver``: ``n`` documents ``{_id: ObjectId, x: i}`` + the version index.

    ``insert_many`` in chunks of ``SEED_CHUNK`` (about 1 s each on the dev server, whatever the
    collection's size). Not measured; its time is reported.
    """

    def seed(uri: str, db_name: str) -> dict[str, Any]:
        from pymongo import ASCENDING, MongoClient

        started = time.perf_counter()
        with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
            coll = client[db_name]["docs"]
            for first in range(0, n, SEED_CHUNK):
                coll.insert_many([{"x": i} for i in range(first, min(n, first + SEED_CHUNK))],
                                 ordered=False)
            # the index the engine asks for ({version: 1, _id: 1}); the loop's query can use
            # it too, so both read the same way
            coll.create_index([("__v", ASCENDING), ("_id", ASCENDING)])
            count = coll.count_documents({})
        return {"documents": count, "seconds": time.perf_counter() - started}

    return seed


# ------------------------------------------------------------------------------ figures


def commands(result: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(name, coll, n) for name, coll, n in result.get("commands", [])]


def total_commands(result: dict[str, Any]) -> int:
    return sum(n for _, _, n in commands(result))


def writes_on(result: dict[str, Any], collection: str) -> int:
    return sum(n for name, coll, n in commands(result) if coll == collection and name in WRITES)


def on_collection(result: dict[str, Any], collection: str) -> int:
    return sum(n for _, coll, n in commands(result) if coll == collection)


def breakdown(result: dict[str, Any], per: int = 1) -> str:
    parts = sorted(commands(result), key=lambda item: (-item[2], item[0]))
    shown = []
    for name, coll, n in parts:
        where = f" {coll}" if coll else ""
        count = f"{n / per:g}/migr" if per > 1 and n >= per else str(n)
        shown.append(f"{name}{where} ×{count}")
    return ", ".join(shown)


def growth(result: dict[str, Any]) -> str:
    """Median interval between consecutive migration bodies: first 10 % → last 10 %."""
    stamps = result.get("stamps") or []
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    if len(gaps) < 20:
        return "—"
    tenth = max(1, len(gaps) // 10)
    first = statistics.median(gaps[:tenth]) * 1000
    last = statistics.median(gaps[-tenth:]) * 1000
    return f"{first:.1f} → {last:.1f}"


def seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


@dataclass
class Row:
    metric: str
    target: str
    cells: dict[str, str] = field(default_factory=dict)
    met: str = ""
    section: bool = False


def cell_error(result: dict[str, Any] | None, cannot: str | None = None) -> str | None:
    if cannot:
        return f"cannot ({cannot})"
    if result is None:
        return "not run"
    if "error" in result:
        error = str(result["error"])
        return error if error.startswith("skipped") else f"failed: {error}"
    return None


def build_rows(figures: dict[str, Any], sizes: Sizes) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = ["up timed call: migronaut `Migrator(...).up()` + `close()`; "
                        "mongodb-migrations `MigrationManager(Configuration({...})).run()`; "
                        "mongomig `mongomig.api.upgrade('head', yes=True)`; pymongo loop: one "
                        "client, per migration one `update_one` body + one upsert by a "
                        "uniquely indexed name into a changelog (no lock, no checksum, no file "
                        "loading: the floor)."]
    cli = figures["cli"]

    def cli_cell(key: str) -> str:
        result = cli.get(key)
        if result is None:
            return "—"
        if isinstance(result, str):
            return result
        if "error" in result:
            notes.append(f"`{key}` failed: {result['error']}")
            return f"fails ({result['error'].split(':')[0]})"
        return f"{seconds(result['seconds'])} (min {result['min']:.3f})"

    def under(result: Any, limit: float) -> str:
        if not isinstance(result, dict) or "seconds" not in result:
            return "no (not measurable)"
        return "yes" if result["seconds"] < limit else "NO"

    n_cli = sizes.cli_runs
    rows.append(Row(f"CLI start-up (median, and min, of {n_cli} subprocess runs, wall)", "",
                    section=True))
    rows.append(Row("`--version`", "< 0.25 s", {
        "migronaut": cli_cell("migronaut --version"),
        "mongodb-migrations": "cannot (no --version flag)",
        "mongomig": cli_cell("mongomig --version"),
    }, under(cli.get("migronaut --version"), 0.25)))
    rows.append(Row("`--help`", "< 0.25 s", {
        "migronaut": cli_cell("migronaut --help"),
        "mongodb-migrations": cli_cell("mongodb-migrate --help"),
        "mongomig": cli_cell("mongomig --help"),
    }, under(cli.get("migronaut --help"), 0.25)))
    rows.append(Row("bare `python -c pass` (floor)", "", {
        "migronaut": cli_cell("python (migronaut env)"),
        "mongodb-migrations": cli_cell("python (peers env)"),
        "mongomig": cli_cell("python (peers env)"),
    }))

    # -- status
    n = sizes.status_files
    status = figures["status"]
    rows.append(Row(f"`status` with {n:,} applied migrations ({n:,} files + {n:,} records)", "",
                    section=True))
    time_cells: dict[str, str] = {}
    trip_cells: dict[str, str] = {}
    cli_cells: dict[str, str] = {}
    met_time = met_trips = met_cli = "no (not measurable)"
    for tool in ("migronaut", "mongodb-migrations", "mongomig"):
        result = status.get(tool)
        problem = cell_error(result, "no status command" if tool == "mongodb-migrations"
                             else None)
        if problem:
            time_cells[tool] = trip_cells[tool] = cli_cells[tool] = problem[:60]
            if result is not None and "error" in result:
                notes.append(f"status, {tool}: {problem}")
            continue
        assert result is not None
        time_cells[tool] = seconds(result["seconds"])
        via_cli = result.get("cli") or {"error": "not run"}
        if "seconds" in via_cli:
            cli_cells[tool] = seconds(via_cli["seconds"])
            notes.append(f"status CLI, {tool}: `{shlex.join(via_cli.get('shown', []))}`; "
                         "timings " + ", ".join(f"{s:.3f}" for s in via_cli["all_seconds"])
                         + " s")
        else:
            cli_cells[tool] = f"failed ({via_cli['error'][:40]})"
            notes.append(f"status CLI, {tool}: `{shlex.join(via_cli.get('shown', []))}` "
                         f"{via_cli['error']}")
        trips = total_commands(result)
        trip_cells[tool] = f"{trips}"
        notes.append(f"status round trips, {tool}: {breakdown(result)}; "
                     f"{result.get('connections', 0)} connection(s) opened. "
                     f"Records written before timing by {result.get('seed')} "
                     f"({result.get('seed_seconds', 0):.1f} s, not timed). "
                     f"All {len(result.get('all_seconds', []))} timings: "
                     + ", ".join(f"{s:.3f}" for s in result.get("all_seconds", [])) + " s")
        if tool == "migronaut":
            met_time = "yes" if result["seconds"] < 1 else "NO"
            if "seconds" in via_cli:
                met_cli = "yes" if via_cli["seconds"] < 1 else "NO"
            met_trips = "yes" if trips < n else "NO"
            if result.get("applied_rows") != n:
                notes.append(f"WARNING: migronaut status listed {result.get('applied_rows')} "
                             f"applied rows, expected {n}")
    label = f"wall, median of {sizes.status_repeats}, new client each"
    rows.append(Row(label, "< 1 s", time_cells, met_time))
    notes.append("status timed call: migronaut `Migrator(...).status()` then `close()` "
                 "(connect + ping + ensure indexes + read + checksum every file); mongomig "
                 "`mongomig.api.current_state()` (what `mongomig current` runs: config + parse "
                 "every revision file + connect + read); mongodb-migrations has no status, "
                 "history or list command at all.")
    rows.append(Row("same through the CLI (`status --json` / `current --json`), subprocess wall",
                    "< 1 s", cli_cells, met_cli))
    rows.append(Row("round trips (commands sent, API call)", f"< {n:,}", trip_cells, met_trips))

    # -- up
    n = sizes.up_migrations
    up = figures["up"]
    rows.append(Row(f"`up` of {n} trivial migrations (each: one `update_one`)", "",
                    section=True))
    lines: dict[str, dict[str, str]] = {key: {} for key in (
        "total", "per", "cpu", "growth", "trips", "changelog", "lock", "clients", "verified")}
    met: dict[str, str] = {}
    for tool in TOOLS:
        result = up.get(tool)
        problem = cell_error(result)
        if problem:
            for key in lines:
                lines[key][tool] = problem[:60] if key == "total" else "—"
            notes.append(f"up, {tool}: {problem}")
            continue
        assert result is not None
        trips = total_commands(result)
        changelog_writes = writes_on(result, CHANGELOG[tool])
        lines["total"][tool] = seconds(result["seconds"])
        lines["per"][tool] = f"{result['seconds'] / n * 1000:.1f} ms"
        if "cpu_seconds" in result:
            lines["cpu"][tool] = f"{result['cpu_seconds'] / n * 1000:.2f} ms"
        lines["growth"][tool] = growth(result)
        lines["trips"][tool] = f"{trips / n:.2f}"
        lines["changelog"][tool] = f"{changelog_writes / n:.2f}"
        lock = LOCKS.get(tool)
        lines["lock"][tool] = str(on_collection(result, lock)) if lock else "none (no lock)"
        lines["clients"][tool] = f"{result.get('clients', 0)} / {result.get('connections', 0)}"
        lines["verified"][tool] = ("yes" if result.get("verified") else
                                   f"NO (n={result.get('target_n')}, "
                                   f"records={result.get('changelog_records')})")
        notes.append(f"up round trips, {tool}: {breakdown(result, per=n)}")
        if tool == "migronaut":
            met["changelog"] = "yes" if changelog_writes <= n else "NO"
            lock_commands = on_collection(result, LOCKS["migronaut"])
            # acquire is one update (a second read only when the upsert did not insert),
            # release one delete; heartbeats every ttl/2 come on top for long runs
            met["lock"] = "yes" if lock_commands <= 3 else f"check ({lock_commands})"
    ratio_cells, record_cells, ratio_met = up_ratios(up, n)
    rows += [
        Row("total wall", "", lines["total"]),
        Row("ms per migration", "", lines["per"]),
        Row("the loop doing the same body and changelog writes (migronaut's claim and record, "
            "the final write sent with the next claim, its 5 indexes): client CPU per "
            "migration, and migronaut ÷ that loop (PRODUCT.md's measure)",
            f"≤ {UP_RATIO_TARGET}×", record_cells, ratio_met),
        Row("migronaut ÷ the plain pymongo loop (a two-field record, one index), client CPU",
            "", ratio_cells),
        Row("client CPU per migration (process CPU of the timed call)", "", lines["cpu"]),
        Row("ms per migration, first 10 % → last 10 % (changelog grows)", "",
            lines["growth"]),
        Row("round trips per migration (all commands / N)", "", lines["trips"]),
        Row("changelog writes per migration", "≤ 1", lines["changelog"],
            met.get("changelog", "no (not measurable)")),
        Row("lock commands per run", "1 acquire + 1 release", lines["lock"],
            met.get("lock", "no (not measurable)")),
        Row("MongoClients / connections opened", "", lines["clients"]),
        Row("body ran N times and N records written", "", lines["verified"]),
    ]
    return rows, notes


UP_RATIO_TARGET = 1.3
RECORD_LOOP = "pymongo loop, migronaut's record"


def up_ratios(up: dict[str, Any], n: int) -> tuple[dict[str, str], dict[str, str], str]:
    """migronaut's client CPU per migration over the loop that does the same body and
    changelog writes (the target: PRODUCT.md's "client CPU per migration within 1.3× of a
    hand-written pymongo loop doing the same body and changelog write") and over the plain loop
    (a smaller record: the gap between the two loops is the server storing migronaut's
    records, not migronaut's work). Wall ratios move with the server's speed and the machine's
    load; ``--up-only`` gives them beside the CPU ones, over several rounds."""
    ours, loop, record = up.get("migronaut"), up.get("pymongo loop"), up.get(RECORD_LOOP)
    key = "cpu_seconds"
    ratios: dict[str, str] = {}
    if isinstance(ours, dict) and key in ours and isinstance(loop, dict) and key in loop:
        ratios["migronaut"] = f"{ours[key] / loop[key]:.2f}×"
    if not (isinstance(ours, dict) and key in ours):
        return ratios, {}, "no (not measurable)"
    record_cells: dict[str, str] = {}
    met = "no (not measurable)"
    if isinstance(record, dict) and key in record:
        ratio = ours[key] / record[key]
        record_cells["pymongo loop"] = f"CPU {record[key] / n * 1000:.2f} ms"
        record_cells["migronaut"] = f"{ratio:.2f}×"
        met = "yes" if ratio <= UP_RATIO_TARGET else "NO"
    elif isinstance(record, dict):
        record_cells["pymongo loop"] = cell_error(record) or "—"
    return ratios, record_cells, met


# ------------------------------------------------------------------------------ scaling


def measure_scale(me: Path, server: Server, sizes: tuple[int, ...],
                  repeats: int) -> dict[str, Any]:
    """``up`` then ``status`` (table, ``--json``) through the CLI at each N: a fresh process
    per command, against a fresh database per N."""
    return {str(n): run_driver(me, "migronaut-scale", server.uri, n, repeats, 3600.0)
            for n in sizes}


SCALE_HEADERS = ("Files", "`up` wall", "per file", "peak RSS", "`status` (table) wall",
                 "per file", "peak RSS", "`status --json` wall", "per file", "peak RSS")


def scale_table(figures: dict[str, Any], repeats: int) -> tuple[str, str, list[str]]:
    """The scaling table as plain text and Markdown, and its notes."""
    lines: list[list[str]] = []
    notes = [f"each command is one `migronaut` process (wall from start to exit, peak resident "
             f"memory from `wait4`); `status` rows are the median wall and the largest peak of "
             f"{repeats} runs; `up` runs once (it seeds the records `status` reads)"]
    for n, result in figures.items():
        count = int(n)
        if "error" in result:
            lines.append([f"{count:,}", f"failed: {result['error']}"[:60]] + [""] * 8)
            continue
        row = [f"{count:,}"]
        for key in ("up", "status", "status --json"):
            figure = result.get(key, {})
            if "error" in figure:
                row += [f"failed: {figure['error']}"[:40], "", ""]
                continue
            row += [seconds(figure["seconds"]), f"{figure['seconds'] / count * 1000:.2f} ms",
                     f"{figure.get('maxrss_kib', 0) / 1024:.0f} MiB"]
        lines.append(row)
        if not result.get("verified"):
            notes.append(f"WARNING: at {count:,} files the changelog held "
                         f"{result.get('changelog_records')} records")
        if result.get("shown"):
            notes.append(f"{count:,} files: `{shlex.join(result['shown'])}` (and `--json`)")
    plain, markdown = grid(SCALE_HEADERS, lines)
    return plain, markdown, notes


def grid(headers: tuple[str, ...], lines: list[list[str]]) -> tuple[str, str]:
    """A table as aligned plain text and as Markdown."""
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    plain = "\n".join(["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
                       "  ".join("-" * w for w in widths)]
                      + ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                         for line in lines])
    markdown = "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                         + ["| " + " | ".join(line) + " |" for line in lines])
    return plain, markdown


# ------------------------------------------------------------------------------ background

BACKGROUND_COLUMNS = tuple(label for label, *_ in BACKGROUND_VARIANTS)
LOOP = "hand-written loop"
CPU_RATIO_TARGET = 1.3
TRIPS_TARGET = 3
#: What `background status` and `progress --json` may cost the server, whatever N (they read
#: the migration's state and partitions, never its documents).
VIEWS_TARGET_S = 0.1
#: "flat": the peak at the largest N at most this many times the peak at the smallest N (a
#: collection held in memory would grow with N, here 4x)
MEMORY_FLAT_TARGET = 1.5


def short_collection(name: str) -> str:
    return {"_migronaut_background_partitions": "partitions",
            "_migronaut_background": "state"}.get(name, name)


def shape(window: list[list[str]]) -> str:
    return ", ".join(f"{name} {short_collection(coll)}".strip() for name, coll in window)


def counted(items: list[list[Any]]) -> str:
    parts = sorted(items, key=lambda item: (-item[2], item[0], item[1]))
    return ", ".join(f"{n} {short_collection(c)} ×{k}".replace("  ", " ") for n, c, k in parts)


def kib(value: float) -> str:
    return f"{value / 1024:,.0f} KiB"


def background_rows(figures: dict[str, Any], sizes: Sizes,
                    batch: int) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    peaks: dict[str, dict[int, float]] = {label: {} for label in BACKGROUND_COLUMNS}
    lanes_read: dict[str, dict[int, int]] = {label: {} for label in BACKGROUND_COLUMNS}
    process_cpu: dict[str, dict[int, float]] = {label: {} for label in BACKGROUND_COLUMNS}
    for n in sizes.background_docs:
        results = figures.get(str(n), {})
        seeds = [r["seed"]["seconds"] for r in results.values()
                 if isinstance(r, dict) and "seed" in r]
        seeded = (f"; seeded by insert_many in chunks of {SEED_CHUNK}, "
                  f"{min(seeds):.1f}–{max(seeds):.1f} s each, not timed" if seeds else "")
        rows.append(Row(f"{n:,} documents, batch size {batch}{seeded}", "", section=True))
        cells: dict[str, dict[str, str]] = collections.defaultdict(dict)
        met: dict[str, list[str]] = collections.defaultdict(list)
        loop = results.get(LOOP) or {}
        loop_timed = loop.get("timed") or {}
        loop_cpu = loop_timed.get("cpu")
        loop_steady = None
        if loop_timed.get("drive", {}).get("batch_cpu"):
            loop_steady = statistics.median(loop_timed["drive"]["batch_cpu"]) / batch
        for label in BACKGROUND_COLUMNS:
            result = results.get(label)
            problem = cell_error(result)
            if problem:
                cells["wall"][label] = problem[:60]
                notes.append(f"background {n:,}, {label}: {problem}")
                continue
            assert result is not None
            timed, memory = result["timed"], result["memory"]
            drive = timed.get("drive") or {}
            cpu_doc = timed["cpu"] / n
            steady_cpu = (statistics.median(drive["batch_cpu"]) / batch
                          if drive.get("batch_cpu") else None)
            engine = label != LOOP
            cells["wall"][label] = seconds(timed["seconds"])
            cells["batch_wall"][label] = (f"{statistics.median(drive['batch_wall']) * 1000:.0f} ms"
                                          if drive.get("batch_wall") else "—")
            ratio = f" ({cpu_doc / (loop_cpu / n):.2f}×)" if engine and loop_cpu else ""
            cells["cpu"][label] = f"{cpu_doc * 1e6:.0f} µs{ratio}"
            if engine and loop_cpu:
                met["cpu"].append(f"{label.split(', ')[1]}: "
                                  + ("yes" if cpu_doc <= CPU_RATIO_TARGET * loop_cpu / n
                                     else "NO"))
            if steady_cpu is not None:
                ratio = (f" ({steady_cpu / loop_steady:.2f}×)" if engine and loop_steady
                         else "")
                cells["steady_cpu"][label] = f"{steady_cpu * 1e6:.0f} µs{ratio}"
                if engine and loop_steady:
                    met["steady_cpu"].append(
                        f"{label.split(', ')[1]}: "
                        + ("yes" if steady_cpu <= CPU_RATIO_TARGET * loop_steady else "NO"))
            batches = drive.get("batches") or 0
            median = drive.get("median_per_batch")
            cells["trips"][label] = (f"{median:g}" if median is not None else "—")
            if engine and median is not None:
                met["trips"].append(f"{label.split(', ')[1]}: "
                                    + ("yes" if median <= TRIPS_TARGET else "NO"))
            in_windows = sum(k for *_, k in drive.get("in_windows", []))
            cells["trips_all"][label] = f"{in_windows / batches:.2f}" if batches else "—"
            outside = drive.get("outside") or {}
            register = sum(k for *_, k in (timed.get("register") or {}).get("outside", {}).get(
                "caller: registration, planning, coordination", []))
            caller = sum(k for *_, k in outside.get(
                "caller: registration, planning, coordination", []))
            keeper = sum(k for *_, k in outside.get("timers: lease keepers, control reader", []))
            first = sum(k for *_, k in outside.get(
                "lanes, before their first batch (first claim)", []))
            cells["oneoff"][label] = (f"{register} + {caller} + {first} + {keeper}" if engine
                                      else "0")
            caller_cpu = timed.get("caller_cpu")
            cells["caller_cpu"][label] = (f"{caller_cpu * 1000:.0f} ms" if caller_cpu is not None
                                          else "—" if engine else "0 ms")
            planning = drive.get("caller_trip_seconds")
            cells["caller_trips"][label] = (f"{planning * 1000:,.0f} ms" if planning is not None
                                            and engine else "—")
            if engine and "views_trip_seconds" in timed:
                surfaces = timed.get("views") or {"status + progress": {
                    "trip_seconds": timed["views_trip_seconds"],
                    "commands": timed["views_commands"]}}
                texts, fine = [], True
                for surface, view in surfaces.items():
                    on_docs = sum(1 for _, coll in view["commands"] if coll == "docs")
                    texts.append(f"{surface} {view['trip_seconds'] * 1000:.1f} ms, "
                                 f"{len(view['commands'])} commands, {on_docs} on the documents")
                    fine = fine and view["trip_seconds"] < VIEWS_TARGET_S and not on_docs
                cells["views"][label] = "; ".join(texts)
                met["views"].append(f"{label.split(', ')[1]}: " + ("yes" if fine else "NO"))
            planning, plan = timed.get("planning"), timed.get("plan") or {}
            cells["planning"][label] = (
                f"{planning['seconds'] * 1000:,.0f} ms, {planning['cpu'] * 1000:.0f} ms CPU; "
                f"{plan.get('partitions')} partitions ({plan.get('method')})"
                if engine and planning else "—")
            partitions = timed.get("partitions")
            cells["batches"][label] = (f"{batches} / {partitions} / {drive.get('lanes_used')}"
                                       if engine else f"{batches} / — / 1")
            process_cpu[label][n] = timed["cpu"]
            lanes_read[label][n] = int(drive.get("lanes_used") or 1)
            peak = memory.get("tracemalloc_peak")
            if peak is not None:
                peaks[label][n] = peak
                cells["peak"][label] = kib(peak)
            cells["rss"][label] = f"{timed.get('maxrss_delta_kib', 0):,} KiB"
            cells["verified"][label] = "yes" if timed.get("verified") and memory.get(
                "verified") else (f"NO ({timed.get('migrated_ok')}/{n})")
            typical = drive.get("typical_window") or []
            steps = drive.get("typical_step_cpu") or []
            step_text = ", ".join(f"{name} {short_collection(coll)} → {cpu * 1000:.2f} ms"
                                  for (name, coll), cpu in zip(typical, steps, strict=False))
            trips = drive.get("typical_step_trip") or []
            trip_text = ", ".join(f"{name} {short_collection(coll)} {trip * 1000:.0f} ms"
                                  for (name, coll), trip in zip(typical, trips, strict=False))
            registration = (timed.get("register") or {}).get("outside", {}).get(
                "caller: registration, planning, coordination", [])
            note = (f"background {n:,}, {label}: typical batch "
                    f"({drive.get('typical_window_share')} of {batches}) = {shape(typical)}; "
                    f"thread CPU from each command's start to the next: {step_text or '—'}; "
                    f"round trip of each (median): {trip_text or '—'}; "
                    f"commands inside batch windows: {counted(drive.get('in_windows', []))}")
            if engine:
                note += f"; registration (`up`): {counted(registration)}"
                note += "".join(f"; {role}: {counted(items)}" for role, items in outside.items())
                note += (f"; plan: {timed.get('plan')}; `up` took "
                         f"{timed.get('register_seconds', 0):.3f} s, "
                         f"{timed.get('register_cpu', 0) * 1000:.0f} ms CPU (not in the rows)")
            notes.append(note)
        rows += [
            Row("wall, whole migration (`drive` / the loop)", "", cells["wall"]),
            Row("wall per batch, steady state (median)", "", cells["batch_wall"]),
            Row("client CPU per document, whole migration (process CPU / N)",
                f"≤ {CPU_RATIO_TARGET}× loop", cells["cpu"], "; ".join(met["cpu"])),
            Row("client CPU per document, steady state (median batch: lane thread CPU / "
                "batch size)", f"≤ {CPU_RATIO_TARGET}× loop", cells["steady_cpu"],
                "; ".join(met["steady_cpu"])),
            Row("round trips per batch, steady state (median batch)", f"≤ {TRIPS_TARGET}",
                cells["trips"], "; ".join(met["trips"])),
            Row("round trips per batch, every lane command / batches", "", cells["trips_all"]),
            Row("one-off commands: `up` + caller (plan, coordinate) + lanes' first claims + "
                "timers (renewals, control reads)", "", cells["oneoff"]),
            Row("client CPU of the calling thread in `drive` (planning, coordination; "
                "fixed, whatever N)", "", cells["caller_cpu"]),
            Row("round trips of the calling thread in `drive`, summed (planning, "
                "coordination: mostly the server's work)", "", cells["caller_trips"]),
            Row("planning: `drive` to the plan's commit (wall, the calling thread's CPU); "
                "partitions (method)", "", cells["planning"]),
            Row("batches / partitions / lanes that read", "", cells["batches"]),
            Row("`background status`, `progress --json` and the dashboard's migration page at "
                "the end: their round trips (server), commands, reads of the documents",
                f"< {VIEWS_TARGET_S * 1000:.0f} ms, none", cells["views"],
                "; ".join(met["views"])),
            Row("peak traced memory (tracemalloc, a second pass)", "flat in N", cells["peak"]),
            Row("ru_maxrss growth during the timed pass", "", cells["rss"]),
            Row("every document migrated (x2 = 2x, version 1, revision 1), both passes", "",
                cells["verified"]),
        ]
    if len(sizes.background_docs) >= 2:
        small, large = sizes.background_docs[0], sizes.background_docs[-1]
        rows.append(Row(f"as N grows {large / small:g}× ({small:,} → {large:,})", "",
                        section=True))
        raw_cells: dict[str, str] = {}
        lane_cells: dict[str, str] = {}
        slope_cells: dict[str, str] = {}
        verdicts = []
        slope_verdicts = []
        slopes: dict[str, float] = {}
        for label in BACKGROUND_COLUMNS:
            cpu = process_cpu[label]
            if small in cpu and large in cpu:
                slopes[label] = (cpu[large] - cpu[small]) / (large - small)
        for label in BACKGROUND_COLUMNS:
            got, lanes = peaks[label], lanes_read[label]
            if small in got and large in got and got[small]:
                ratio = got[large] / got[small]
                raw_cells[label] = f"{kib(got[small])} → {kib(got[large])} ({ratio:.2f}×)"
                per_small, per_large = got[small] / lanes[small], got[large] / lanes[large]
                per_ratio = per_large / per_small
                lane_cells[label] = (f"{kib(per_small)} → {kib(per_large)} ({per_ratio:.2f}×; "
                                     f"{lanes[small]} → {lanes[large]} lanes)")
                if label != LOOP:
                    verdicts.append(f"{label.split(', ')[1]}: "
                                    + ("yes" if per_ratio <= MEMORY_FLAT_TARGET else "NO"))
            else:
                raw_cells[label] = lane_cells[label] = "—"
            if label in slopes:
                slope = slopes[label]
                ratio_text = ""
                if label != LOOP and slopes.get(LOOP):
                    ratio = slope / slopes[LOOP]
                    ratio_text = f" ({ratio:.2f}×)"
                    slope_verdicts.append(f"{label.split(', ')[1]}: "
                                          + ("yes" if ratio <= CPU_RATIO_TARGET else "NO"))
                slope_cells[label] = f"{slope * 1e6:.0f} µs{ratio_text}"
            else:
                slope_cells[label] = "—"
        rows += [
            Row("client CPU per extra document (slope of process CPU between the two N; a "
                "two-point estimate, as noisy as its two runs)",
                f"≤ {CPU_RATIO_TARGET}× loop", slope_cells, "; ".join(slope_verdicts)),
            Row("peak traced memory, small N → large N", "", raw_cells),
            Row("… per lane that read (batches in flight at once)",
                f"≤ {MEMORY_FLAT_TARGET}× (flat)", lane_cells, "; ".join(verdicts)),
        ]
    return rows, notes


# ------------------------------------------------------------------------------ rendering


def render_plain(rows: list[Row], columns: tuple[str, ...] = TOOLS) -> str:
    headers = ["Metric", "Target", *columns, "Target met"]
    table = [[r.metric, r.target, *(r.cells.get(t, "") for t in columns), r.met] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line, r in zip(table, rows, strict=True)
                            if not r.section)) for i, h in enumerate(headers)]
    sep = "  "
    out = [sep.join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
           sep.join("-" * w for w in widths)]
    for line, row in zip(table, rows, strict=True):
        if row.section:
            out.append(f"[{row.metric}]")
        else:
            out.append(sep.join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return "\n".join(out)


def render_markdown(rows: list[Row], columns: tuple[str, ...] = TOOLS) -> str:
    headers = ["Metric", "Target", *columns, "Target met"]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if row.section:
            out.append(f"| **{row.metric}** |" + " |" * (len(headers) - 1))
        else:
            cells = [row.metric, row.target, *(row.cells.get(t, "") for t in columns), row.met]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)


def machine_facts(peers_python: Path | None, server: Server) -> list[str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "?"
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    import pymongo

    from migronaut import __version__

    facts = [
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs ({cpu}), {memory} RAM",
        f"migronaut {__version__} on Python {platform.python_version()} ({sys.executable}), "
        f"pymongo {pymongo.version}",
    ]
    if peers_python is not None:
        facts.append(
            f"peers on Python {python_version(peers_python)} ({peers_python}): "
            f"mongodb-migrations {package_version(peers_python, 'mongodb-migrations')}, "
            f"mongomig {package_version(peers_python, 'mongomig')}, "
            f"pymongo {package_version(peers_python, 'pymongo')}"
        )
    facts.append(f"server: {server.description}, {server_version(server.uri)}")
    facts.append(f"source: {source_revision()}")
    return facts


def source_revision() -> str:
    """The commit measured, and whether src/ had uncommitted changes (work in progress)."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "not a git checkout"
    dirty = git("status", "--porcelain", "--", "src")
    return f"git {commit}" + (" + uncommitted changes in src/" if dirty else "")


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# ------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/run.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small workloads (200/100 migrations, 500/1,500 documents): a "
                             "smoke run")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as Markdown instead of plain text")
    parser.add_argument("--peers-venv", type=Path, default=BENCH / ".venv-peers",
                        help="the peers' virtualenv (created when missing)")
    parser.add_argument("--no-peers", action="store_true", help="measure migronaut only")
    parser.add_argument("--background-only", action="store_true",
                        help="run only the background-migration section (no peers needed)")
    parser.add_argument("--background-batch", type=int, default=None, metavar="B",
                        help="batch size of the background section (default: 500, the "
                             "engine's default)")
    parser.add_argument("--rounds", type=int, default=3, metavar="R",
                        help="timed passes per background variant; the median is reported "
                             "(default: 3)")
    parser.add_argument("--background-sizes", type=int, nargs="+", default=None, metavar="N",
                        help="document counts of the background section (default: 1,500 and "
                             "4,500; --quick: 500 and 1,500), e.g. --background-sizes 2000")
    parser.add_argument("--background-variants", nargs="+", metavar="V",
                        choices=[key for _, key, *_ in BACKGROUND_VARIANTS], default=None,
                        help="run only these background variants: engine-1, engine-4, "
                             "engine-2x2 (two processes of 2 lanes), loop (default: all four)")
    parser.add_argument("--no-memory-pass", action="store_true",
                        help="skip the background variants' pass under tracemalloc (at "
                             "1,000,000 documents it doubles the run; ru_maxrss growth is "
                             "still reported)")
    parser.add_argument("--profile", action="store_true",
                        help="also run each background variant once more under cProfile "
                             "(CPU clock) and write bench/results/profile-*.txt")
    parser.add_argument("--no-background", action="store_true",
                        help="skip the background-migration section (about 7 of the 10 "
                             "minutes)")
    parser.add_argument("--scale", action="store_true",
                        help="run only the scaling section: `up`, `status` and `status --json` "
                             "through the CLI at each --scale-sizes N, with peak memory")
    parser.add_argument("--scale-sizes", default="100,1000,10000", metavar="N,N,...",
                        help="file counts of the scaling section (default: 100,1000,10000)")
    parser.add_argument("--up-only", action="store_true",
                        help="only `up` of N trivial migrations (N=500, --quick 100): migronaut, "
                             "the loop writing migronaut's records and the plain loop, --rounds "
                             "rounds in turns, medians (written to results/latest-up.*)")
    parser.add_argument("--converge", action="store_true",
                        help="run only the converge section: migronaut's `converge` (first run, "
                             "in-sync run, in-sync --check) beside Beanie's `init_beanie` and "
                             "MongoEngine's `ensure_indexes` over --converge-collections")
    parser.add_argument("--converge-collections", type=int, default=50, metavar="N",
                        help="collections of the converge section (default: 50)")
    parser.add_argument("--dashboard", action="store_true",
                        help="run only the dashboard section: server time of the overview over "
                             "1,000 applied and 20 background migrations")
    parser.add_argument("--devserver", action="store_true",
                        help="run only the dev server section: seeding 1,000,000 documents "
                             "(--quick: 100,000), per-operation costs at 10,000 and at N, "
                             "resident memory, and the --path (SQLite) mode at small sizes")
    args = parser.parse_args(argv)
    missing = [name for name in ("migronaut", "pymongo") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"error: {missing[0]} is not importable by {sys.executable}: run the bench with "
              "the python of an environment where migronaut is installed, e.g. "
              ".venv-3.13/bin/python bench/run.py (see docs/benchmarks.md)", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])

    if args.background_sizes:
        if min(args.background_sizes) < 1:
            parser.error("--background-sizes must be at least 1")
        sizes = replace(sizes, background_docs=tuple(args.background_sizes))
    batch = args.background_batch or sizes.background_batch
    if batch < 1:
        parser.error("--background-batch must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    if args.scale:
        try:
            scale_sizes = tuple(int(part) for part in args.scale_sizes.split(","))
        except ValueError:
            parser.error("--scale-sizes must be comma-separated integers")
        return run_scale(command, scale_sizes, 1 if args.quick else 3, args.markdown)
    if args.up_only:
        return run_up(command, sizes.up_migrations, args.rounds, args.markdown)
    if args.dashboard:
        return run_dashboard(command, args.markdown)
    if args.devserver:
        return run_devserver(command, args.quick, args.markdown)
    if args.converge:
        if args.converge_collections < 1:
            parser.error("--converge-collections must be at least 1")
        return run_converge(command, args.converge_collections, args.markdown)

    peers_python: Path | None = None
    peers_problem = "skipped (--no-peers)"
    if args.background_only:
        peers_problem = "skipped (--background-only)"
    elif not args.no_peers:
        peers_python, peers_problem = ensure_peers(args.peers_venv.resolve())
        if peers_problem:
            log(peers_problem)

    load_before = load_average()
    figures: dict[str, Any] = {"cli": {}, "status": {}, "up": {}, "background": {}}
    me = Path(sys.executable)
    if not args.background_only:
        figures["cli"] = measure_clis(me, peers_python, peers_problem, sizes)

    server = start_server()
    try:
        facts = machine_facts(peers_python, server)
        if not args.background_only:
            measure_workloads(figures, me, peers_python, peers_problem, server, sizes)
        if not args.no_background:
            figures["background"] = measure_background(me, server, sizes, batch,
                                                       args.profile, args.rounds,
                                                       memory=not args.no_memory_pass,
                                                       only=args.background_variants)
    finally:
        server.close()

    facts.append(f"load average (1/5/15 min) before: {load_before}, after: {load_average()} "
                 f"on {os.cpu_count()} CPUs (other work on the machine skews wall times)")
    rows: list[Row] = []
    notes: list[str] = []
    if not args.background_only:
        rows, notes = build_rows(figures, sizes)
    bg_rows, bg_notes = background_rows(figures["background"], sizes, batch) \
        if not args.no_background else ([], ["skipped (--no-background)"])
    plain = render_plain(rows) if rows else ""
    markdown = render_markdown(rows) if rows else ""
    bg_plain = render_plain(bg_rows, BACKGROUND_COLUMNS) if bg_rows else ""
    bg_markdown = render_markdown(bg_rows, BACKGROUND_COLUMNS) if bg_rows else ""
    print(f"command: {command}" + ("   (--quick: smoke sizes, not the judged figures)"
                                   if args.quick else ""))
    for fact in facts:
        print(fact)
    if rows:
        print()
        print(markdown if args.markdown else plain)
    if bg_rows:
        print()
        print(f"background migrations: the same N documents migrated (x2 = x * 2, version 0 → "
              f"1) by migronaut's engine (`Migrator.up()` registers, `background.drive(name, "
              f"concurrency=P)` runs P lanes in this process) and by a hand-written find + "
              f"bulk_write loop, batch size {batch}")
        print()
        print(bg_markdown if args.markdown else bg_plain)
    print()
    print("notes:")
    print("- round trips = commands sent (pymongo CommandListener `started` events); connection "
          "handshakes and server monitoring are not commands and are counted only as "
          "'connections opened'.")
    print("- the dev server (mongoeco behind migronaut's layer) is not a real mongod: it runs "
          "in Python, about 1 ms a round trip (`--devserver` measures its costs). Its inserts, "
          "`_id` lookups and updates by `_id` no longer cost more as a collection grows, so the "
          "'first 10 % → last 10 %' row no longer reflects inserts into a growing changelog; "
          "the body's collection holds a single document. Wall times also move with the "
          "machine's load (line above).")
    for note in notes:
        print(f"- {note}")
    print("- background: " + BACKGROUND_METHOD)
    for note in bg_notes:
        print(f"- {note}")

    RESULTS.mkdir(exist_ok=True)
    profiles = {}
    for n, variants in figures["background"].items():
        for label, result in variants.items():
            text = result.pop("profile", None) if isinstance(result, dict) else None
            if text:
                slug = label.replace(", ", "-").replace(" ", "-")
                path = RESULTS / f"profile-{slug}-{n}.txt"
                path.write_text(text, encoding="utf-8")
                profiles[f"{label} {n}"] = str(path.relative_to(ROOT))
    if profiles:
        print("- cProfile (CPU clock) of each background variant: "
              + ", ".join(profiles.values()))
    all_notes = [*notes, "background: " + BACKGROUND_METHOD, *bg_notes]
    (RESULTS / "latest.json").write_text(json.dumps(
        {"command": command, "facts": facts, "sizes": sizes.__dict__,
         "background_batch": batch, "figures": figures, "notes": all_notes},
        indent=2, default=str), encoding="utf-8")
    (RESULTS / "latest.md").write_text(
        f"`{command}`\n\n" + "\n".join(f"- {f}" for f in facts) + "\n\n"
        + (markdown + "\n\n" if markdown else "") + bg_markdown + "\n\n"
        + "\n".join(f"- {n}" for n in all_notes) + "\n", encoding="utf-8")
    return 0


def run_scale(command: str, sizes: tuple[int, ...], repeats: int, markdown: bool) -> int:
    """``--scale``: the scaling table alone (printed, and written to ``results/``)."""

    def measure(server: Server) -> tuple[str, str, list[str], dict[str, Any]]:
        figures = measure_scale(Path(sys.executable), server, sizes, repeats)
        return (*scale_table(figures, repeats),
                {"sizes": list(sizes), "repeats": repeats, "figures": figures})

    return run_section("scale", command, markdown, measure)


#: "migronaut": the files loaded before by an earlier command (their code cached, the usual
#: case); "migronaut, first load": files never loaded before, each compiled and its code cached.
UP_VARIANTS = (("migronaut", "migronaut-up-warm"), ("migronaut, first load", "migronaut-up"),
               (RECORD_LOOP, "pymongo-up-record"), ("pymongo loop", "pymongo-up"))


def run_up(command: str, n: int, rounds: int, markdown: bool) -> int:
    """``--up-only``: ``up`` of ``n`` trivial migrations, ``rounds`` rounds; in each round
    migronaut and the two loops run in turns, each in a fresh process on a fresh database."""

    def measure(server: Server) -> tuple[str, str, list[str], dict[str, Any]]:
        me = Path(sys.executable)
        figures: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in UP_VARIANTS}
        own: list[dict[str, Any]] = []
        for _ in range(rounds):
            for label, scenario in UP_VARIANTS:
                figures[label].append(run_driver(me, scenario, server.uri, n, 1, 900.0))
            own.append(run_driver(me, "migronaut-up-own", server.uri, n, 1, 900.0,
                                  extra={"warm": True}))
        lines, notes = up_rounds_table(figures, n)
        measured = [o for o in own if "own_ms" in o]
        notes += [f"migronaut's own work: {o.get('error')}" for o in own if o not in measured]
        if measured:
            notes.append(
                "migronaut's own client CPU per migration (bodies that do nothing, changelog "
                "writes stubbed, files loaded before, slope between n/5 and n files, median "
                "of the rounds): "
                f"{statistics.median(o['own_ms'] for o in measured):.3f} ms, of which loading "
                f"the files {statistics.median(o['loading_ms'] for o in measured):.3f} ms")
        headers = ("variant", "client CPU per migration", "wall per migration",
                   "changelog writes per migration", "all commands per migration",
                   "CPU ÷ record loop", "CPU ÷ plain loop", "wall ÷ record loop")
        return (*grid(headers, lines), notes,
                {"n": n, "rounds": rounds, "figures": figures, "own": own})

    return run_section("up", command, markdown, measure)


def up_rounds_table(figures: dict[str, list[dict[str, Any]]], n: int
                    ) -> tuple[list[list[str]], list[str]]:
    """Medians over the rounds (each round's client CPU in brackets); ratios of medians. The
    target (PRODUCT.md) is client CPU ÷ the loop writing migronaut's records ≤ 1.3×."""
    notes: list[str] = []
    cpu: dict[str, float] = {}
    wall: dict[str, float] = {}
    lines: list[list[str]] = []
    for label, _ in UP_VARIANTS:
        results = figures.get(label, [])
        good = [r for r in results if "seconds" in r and r.get("verified")]
        notes += [f"{label}: {r.get('error') or 'not verified'}" for r in results
                  if r not in good]
        if not good:
            lines.append([label] + ["—"] * 7)
            continue
        cpu[label] = statistics.median(r["cpu_seconds"] for r in good)
        wall[label] = statistics.median(r["seconds"] for r in good)
        changelog = "changelog" if label == "pymongo loop" else CHANGELOG["migronaut"]
        rounds = ", ".join(f"{r['cpu_seconds'] / n * 1000:.2f}"
                           for r in sorted(good, key=lambda r: r["cpu_seconds"]))
        lines.append([label, f"{cpu[label] / n * 1000:.3f} ms ({rounds})",
                      f"{wall[label] / n * 1000:.2f} ms",
                      f"{writes_on(good[0], changelog) / n:.3f}",
                      f"{total_commands(good[0]) / n:.3f}"])
        notes.append(f"{label} commands: {breakdown(good[0], per=n)}")
    for line in lines:
        label = line[0]
        if label not in cpu:
            continue
        line += [f"{cpu[label] / cpu[base]:.2f}×" if base in cpu else "—"
                 for base in (RECORD_LOOP, "pymongo loop")]
        line.append(f"{wall[label] / wall[RECORD_LOOP]:.2f}×" if RECORD_LOOP in wall else "—")
    return lines, notes


def run_converge(command: str, n: int, markdown: bool) -> int:
    """``--converge``: migronaut's ``converge`` beside Beanie and MongoEngine."""
    import _converge_report as report

    def measure(server: Server) -> tuple[str, str, list[str], dict[str, Any]]:
        figures = report.measure_converge(run_driver, Path(sys.executable), server.uri, n)
        lines, notes = report.converge_table(figures, n)
        return (*grid(report.HEADERS, lines), notes, {"collections": n, "figures": figures})

    return run_section("converge", command, markdown, measure)


def run_dashboard(command: str, markdown: bool) -> int:
    """``--dashboard``: the overview's server time."""
    import _dashboard_report as report

    def measure(server: Server) -> tuple[str, str, list[str], dict[str, Any]]:
        figures = report.measure_dashboard(server.uri)
        lines, notes = report.dashboard_table(figures)
        return (*grid(report.HEADERS, lines), notes, {"figures": figures})

    return run_section("dashboard", command, markdown, measure)


def run_devserver(command: str, quick: bool, markdown: bool) -> int:
    """``--devserver``: the dev server's own costs as its collection grows (several tables,
    printed, and written to ``results/latest-devserver.json`` and ``.md``). Always starts its
    own servers: one in memory for the seeding, operations and memory, then a fresh one with
    ``--path`` (it reads their resident memory, so ``MIGRONAUT_BENCH_URI`` is not used)."""
    import _devserver_report as report

    from migronaut.devserver import default_python, start_subprocess

    n = report.QUICK_N if quick else report.FULL_N
    load_before = load_average()
    started = time.perf_counter()
    python = default_python()
    log(f"starting the dev server with {python}")
    process = start_subprocess(python)
    mongoeco = package_version(python, "mongoeco")
    server = Server(process.uri, f"migronaut dev server (mongoeco {mongoeco}, in memory; "
                    f"started for this section)", process)
    try:
        facts = machine_facts(None, server)
        figures: dict[str, Any] = {"memory": report.measure_memory_server(process, n, log)}
    finally:
        server.close()
    figures["sqlite"] = report.measure_sqlite(
        lambda **options: start_subprocess(python, **options), log)
    took = time.perf_counter() - started
    facts.append(f"load average (1/5/15 min) before: {load_before}, after: {load_average()} "
                 f"on {os.cpu_count()} CPUs (other work on the machine skews wall times)")
    facts.append(f"the section took {took:.0f} s")
    found, notes = report.tables(figures, quick)
    print(f"command: {command}" + (f"   (--quick: N = {n:,}, not the judged 1,000,000)"
                                   if quick else ""))
    for fact in facts:
        print(fact)
    shown = [report.render(title, headers, lines, markdown, grid)
             for title, headers, lines in found]
    as_markdown = [report.render(title, headers, lines, True, grid)
                   for title, headers, lines in found]
    for text in shown:
        print()
        print(text)
    print()
    print("notes:")
    for note in notes:
        print(f"- {note}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest-devserver.json").write_text(json.dumps(
        {"command": command, "facts": facts, "figures": figures, "notes": notes}, indent=2,
        default=str), encoding="utf-8")
    (RESULTS / "latest-devserver.md").write_text(
        f"`{command}`\n\n" + "\n".join(f"- {f}" for f in facts) + "\n\n"
        + "\n\n".join(as_markdown) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n",
        encoding="utf-8")
    return 0


def run_section(name: str, command: str, markdown: bool,
                measure: Callable[[Server], tuple[str, str, list[str], dict[str, Any]]]) -> int:
    """One section alone against its own server: ``measure`` gives the table as plain text
    and Markdown, its notes and the raw figures; printed, and written to
    ``results/latest-NAME.json`` and ``.md``."""
    load_before = load_average()
    server = start_server()
    try:
        facts = machine_facts(None, server)
        plain, table_md, notes, raw = measure(server)
    finally:
        server.close()
    facts.append(f"load average (1/5/15 min) before: {load_before}, after: {load_average()} "
                 f"on {os.cpu_count()} CPUs (other work on the machine skews wall times)")
    print(f"command: {command}")
    for fact in facts:
        print(fact)
    print()
    print(table_md if markdown else plain)
    print()
    print("notes:")
    for note in notes:
        print(f"- {note}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"latest-{name}.json").write_text(json.dumps(
        {"command": command, "facts": facts, **raw, "notes": notes}, indent=2, default=str),
        encoding="utf-8")
    (RESULTS / f"latest-{name}.md").write_text(
        f"`{command}`\n\n" + "\n".join(f"- {f}" for f in facts) + "\n\n" + table_md
        + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n", encoding="utf-8")
    return 0


BACKGROUND_METHOD = (
    "each variant runs in a fresh process against a fresh database seeded from the bench process "
    "(N documents {_id: ObjectId, x: i} + the version index {__v: 1, _id: 1}). The driver imports "
    "migronaut before measuring, then makes --rounds timed passes (wall, time.process_time() of "
    "the driver process = client CPU only: the dev server is another process; every command "
    "counted with its thread), each followed by a reset of the collection (migronaut's collections"
    " dropped, x2/__v/__rev unset); the pass of median process CPU is reported (the machine is "
    "shared: one pass can be slowed by a neighbour) and the steady-state median is taken over the "
    "batches of every pass. Then a last pass under tracemalloc gives the peak memory. A batch = "
    "the commands a lane (or the loop) sends from one batch read (find sorted by _id, limit = "
    "batch size) to its next; 'steady state' is the median batch, and its CPU is that thread's own"
    " time.thread_time(). One-off commands are those of `up` (registration), of the calling thread"
    " in `drive` (planning, coordination), of a lane before its first read (first claim), and of "
    "the timers (the store's control reader: one read every 1 s; each lease keeper: a renewal "
    "once ttl/2 passed without a checkpoint).")


def measure_clis(me: Path, peers_python: Path | None, peers_problem: str | None,
                 sizes: Sizes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="migronaut-bench-cli-") as cwd:
        log("CLI start-up")
        migronaut = cli_command(me, "migronaut", "migronaut") or []
        commands = {
            "migronaut --version": [*migronaut, "--version"],
            "migronaut --help": [*migronaut, "--help"],
            "python (migronaut env)": [str(me), "-c", "pass"],
        }
        unavailable: dict[str, str] = {}
        for script, flag in (("mongodb-migrate", "--help"), ("mongomig", "--help"),
                             ("mongomig", "--version")):
            argv = cli_command(peers_python, script) if peers_python is not None else None
            if argv:
                commands[f"{script} {flag}"] = [*argv, flag]
            else:
                unavailable[f"{script} {flag}"] = peers_problem or "not installed"
        if peers_python is not None:
            commands["python (peers env)"] = [str(peers_python), "-c", "pass"]
        else:
            unavailable["python (peers env)"] = peers_problem or "—"
        return {**time_clis(commands, sizes.cli_runs, Path(cwd)), **unavailable}


def measure_workloads(figures: dict[str, Any], me: Path, peers_python: Path | None,
                      peers_problem: str | None, server: Server, sizes: Sizes) -> None:
    status_timeout, up_timeout = 900.0, 900.0
    figures["status"]["migronaut"] = run_driver(
        me, "migronaut-status", server.uri, sizes.status_files, sizes.status_repeats,
        status_timeout)
    figures["up"]["migronaut"] = run_driver(
        me, "migronaut-up", server.uri, sizes.up_migrations, 1, up_timeout)
    figures["up"]["pymongo loop"] = run_driver(
        me, "pymongo-up", server.uri, sizes.up_migrations, 1, up_timeout)
    figures["up"][RECORD_LOOP] = run_driver(
        me, "pymongo-up-record", server.uri, sizes.up_migrations, 1, up_timeout)
    if peers_python is not None:
        figures["status"]["mongomig"] = run_driver(
            peers_python, "mongomig-status", server.uri, sizes.status_files,
            sizes.status_repeats, status_timeout)
        figures["up"]["mongomig"] = run_driver(
            peers_python, "mongomig-up", server.uri, sizes.up_migrations, 1, up_timeout)
        figures["up"]["mongodb-migrations"] = run_driver(
            peers_python, "mongodb-migrations-up", server.uri, sizes.up_migrations, 1,
            up_timeout)
    else:
        for section, tool in (("status", "mongomig"), ("up", "mongomig"),
                              ("up", "mongodb-migrations")):
            figures[section][tool] = {"error": peers_problem}


def measure_background(me: Path, server: Server, sizes: Sizes, batch: int,
                       profile: bool, rounds: int = 3, *, memory: bool = True,
                       only: list[str] | None = None) -> dict[str, Any]:
    """Each size, each variant: a fresh process on a freshly seeded database."""
    if importlib.util.find_spec("migronaut.background.lanes.slices") is None:
        why = "skipped (migronaut.background.lanes.slices is not importable: engine not built yet)"
        return {str(n): {label: {"error": why} for label in BACKGROUND_COLUMNS}
                for n in sizes.background_docs}
    out: dict[str, Any] = {}
    for n in sizes.background_docs:
        out[str(n)] = {}
        for label, key, variant, lanes, processes in BACKGROUND_VARIANTS:
            if only and key not in only:
                out[str(n)][label] = {"error": "not run (--background-variants)"}
                continue
            out[str(n)][label] = run_driver(
                me, "background", server.uri, n, 1, max(900.0, n * 0.006),
                extra={"variant": variant, "lanes": lanes, "processes": processes,
                       "batch_size": batch,
                       "profile": profile, "rounds": rounds, "memory_pass": memory},
                seed=seed_background(n))
            # one line per variant as it ends: a long run that is cut short keeps its figures
            log(f"background {n:,}, {label}: "
                + json.dumps({k: v for k, v in out[str(n)][label].items() if k != "commands"},
                             default=str)[:4000])
    return out


if __name__ == "__main__":
    sys.exit(main())
