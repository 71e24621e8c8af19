"""migronaut's benchmark: the "Speed and size" figures of PRODUCT.md beside the peers', in one run.

    .venv-3.13/bin/python bench/run.py [--quick] [--markdown] [--peers-venv DIR]

Run it with the interpreter of an environment where migronaut is installed (``.venv-3.13``, the
one ``bash scripts/test.sh`` creates, also has the dev server's ``mongoeco``). It

1. starts the embedded dev server (``migronaut.devserver.start_subprocess``), or uses
   ``MIGRONAUT_BENCH_URI`` when that is set (then nothing is started);
2. creates ``bench/.venv-peers`` if missing (same base interpreter; ``pip install`` of the pinned
   peers and of the pymongo version migronaut uses), so migronaut's environment is not touched;
3. times ``--version``/``--help`` of each CLI (median of several subprocess runs), ``status``
   over 1,000 applied migrations and ``up`` of 500 trivial migrations, each in a fresh process
   (``bench/_driver.py``) against a fresh database, counting every command sent;
4. prints machine facts, the exact command and ONE side-by-side table, and writes
   ``bench/results/latest.json`` and ``bench/results/latest.md`` (git-ignored).

``--quick`` shrinks the workloads (200 files for status, 100 migrations for up, fewer repeats):
a smoke run, not the figures the targets are judged on.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
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


FULL = Sizes(status_files=1000, up_migrations=500, status_repeats=5, cli_runs=15)
QUICK = Sizes(status_files=200, up_migrations=100, status_repeats=3, cli_runs=5)


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


def time_clis(commands: dict[str, list[str]], runs: int, cwd: Path) -> dict[str, Any]:
    """Median wall time of ``runs`` subprocess runs of each command, after one unmeasured
    warm-up round; the commands take turns (round-robin) so machine load hits all alike."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIGRONAUT_", "MONGOMIG_"))}
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
               timeout: float) -> dict[str, Any]:
    """One scenario in a fresh process against a fresh database (dropped afterwards)."""
    db_name = f"bench_{scenario.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="migronaut-bench-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec = {"scenario": scenario, "uri": uri, "db": db_name, "n": n, "repeats": repeats,
                "workdir": str(work)}
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MIGRONAUT_", "MONGOMIG_", "MONGODB_MIGRATIONS"))}
        env["MONGOMIG_GIT_COMMIT"] = "bench"  # mongomig shells out to git otherwise (once/run)
        log(f"{scenario}: n={n}")
        try:
            done = subprocess.run([str(python), str(DRIVER), str(spec_path), str(result_path)],
                                  cwd=work, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        finally:
            try:
                drop_database(uri, db_name)
            except Exception as error:  # a failed clean-up must not hide the figures
                log(f"could not drop {db_name}: {error}")
        if done.returncode != 0 or not result_path.exists():
            return {"error": last_line(done.stderr)[:200] or f"exit {done.returncode}"}
        return json.loads(result_path.read_text(encoding="utf-8"))


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
        "total", "per", "growth", "trips", "changelog", "lock", "clients", "verified")}
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
    rows += [
        Row("total wall", "", lines["total"]),
        Row("ms per migration", "", lines["per"]),
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


# ------------------------------------------------------------------------------ rendering


def render_plain(rows: list[Row]) -> str:
    headers = ["Metric", "Target", *TOOLS, "Target met"]
    table = [[r.metric, r.target, *(r.cells.get(t, "") for t in TOOLS), r.met] for r in rows]
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


def render_markdown(rows: list[Row]) -> str:
    headers = ["Metric", "Target", *TOOLS, "Target met"]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if row.section:
            out.append(f"| **{row.metric}** |" + " |" * (len(headers) - 1))
        else:
            cells = [row.metric, row.target, *(row.cells.get(t, "") for t in TOOLS), row.met]
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
    return facts


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
                        help="small workloads (200/100 migrations): a smoke run")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as Markdown instead of plain text")
    parser.add_argument("--peers-venv", type=Path, default=BENCH / ".venv-peers",
                        help="the peers' virtualenv (created when missing)")
    parser.add_argument("--no-peers", action="store_true", help="measure migronaut only")
    args = parser.parse_args(argv)
    missing = [name for name in ("migronaut", "pymongo") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"error: {missing[0]} is not importable by {sys.executable}: run the bench with "
              "the python of an environment where migronaut is installed, e.g. "
              ".venv-3.13/bin/python bench/run.py (see docs/benchmarks.md)", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])

    peers_python: Path | None = None
    peers_problem = "skipped (--no-peers)"
    if not args.no_peers:
        peers_python, peers_problem = ensure_peers(args.peers_venv.resolve())
        if peers_problem:
            log(peers_problem)

    load_before = load_average()
    figures: dict[str, Any] = {"cli": {}, "status": {}, "up": {}}
    me = Path(sys.executable)
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
        figures["cli"] = {**time_clis(commands, sizes.cli_runs, Path(cwd)), **unavailable}

    server = start_server()
    try:
        facts = machine_facts(peers_python, server)
        status_timeout, up_timeout = 900.0, 900.0
        figures["status"]["migronaut"] = run_driver(
            me, "migronaut-status", server.uri, sizes.status_files, sizes.status_repeats,
            status_timeout)
        figures["up"]["migronaut"] = run_driver(
            me, "migronaut-up", server.uri, sizes.up_migrations, 1, up_timeout)
        figures["up"]["pymongo loop"] = run_driver(
            me, "pymongo-up", server.uri, sizes.up_migrations, 1, up_timeout)
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
    finally:
        server.close()

    facts.append(f"load average (1/5/15 min) before: {load_before}, after: {load_average()} "
                 f"on {os.cpu_count()} CPUs (other work on the machine skews wall times)")
    rows, notes = build_rows(figures, sizes)
    plain, markdown = render_plain(rows), render_markdown(rows)
    print(f"command: {command}" + ("   (--quick: smoke sizes, not the judged figures)"
                                   if args.quick else ""))
    for fact in facts:
        print(fact)
    print()
    print(markdown if args.markdown else plain)
    print()
    print("notes:")
    print("- round trips = commands sent (pymongo CommandListener `started` events); connection "
          "handshakes and server monitoring are not commands and are counted only as "
          "'connections opened'.")
    print("- the dev server (mongoeco) is not a real mongod: an `insert` costs time roughly "
          "proportional to the collection's size (≈1.7 ms into 10 documents, ≈20-25 ms into "
          "2,000), an upsert matched through a unique index does not (≈2-3 ms either way). "
          "A tool whose changelog write is an insert (mongodb-migrations) slows down as its "
          "changelog grows (the 'first 10 % → last 10 %' row); the body's collection holds a "
          "single document. Wall times also move with the machine's load (line above).")
    for note in notes:
        print(f"- {note}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(
        {"command": command, "facts": facts, "sizes": sizes.__dict__, "figures": figures,
         "notes": notes}, indent=2, default=str), encoding="utf-8")
    (RESULTS / "latest.md").write_text(
        f"`{command}`\n\n" + "\n".join(f"- {f}" for f in facts) + "\n\n" + markdown + "\n\n"
        + "\n".join(f"- {n}" for n in notes) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
