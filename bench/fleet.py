"""The fleet benchmark: one command over many tenant databases, beside what teams run today.

    .venv-3.13/bin/python bench/fleet.py [--tenants 500] [--migrations 5] [--sample 50]
        [--concurrency 8] [--markdown]

Against the embedded dev server (or ``MIGRONAUT_BENCH_URI``), in one run, each side in a fresh
process over tenant databases of its own (never migrated before):

1. ``migronaut fleet up --concurrency 8`` over ``--tenants`` databases × ``--migrations``
   trivial migrations (bodies that do nothing): wall time and client CPU (user + system of the
   process, from ``wait4``);
2. the shell loop teams write today, ``for t in …; do migronaut --db $t up; done``, over
   ``--sample`` tenants, its wall time and CPU scaled linearly to ``--tenants`` (a process start
   and a connection per tenant: the per-tenant cost does not depend on how many there are);
3. a hand-written Python loop over :class:`~migronaut.Migrator` sharing one client, over
   ``--tenants`` databases: the client CPU the fleet is measured against;
4. ``migronaut fleet status`` over the migrated fleet, and ``fleet up`` again with nothing
   pending (median of three runs each).

Prints the table (``--markdown``: as docs/benchmarks.md shows it) and writes
``bench/results/fleet.json``. The databases are dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import RESULTS, log, measured_env, server_version, start_server

BODY = "def up(ctx):\n    pass\n\n\ndef down(ctx):\n    pass\n"
LOOP = """
import sys
from pymongo import MongoClient
from migronaut import Migrator

uri, names = sys.argv[1], sys.argv[2].split(",")
with MongoClient(uri) as client:
    for name in names:
        with Migrator({"uri": uri, "db_name": name, "client": client}) as migrator:
            migrator.up()
"""


def project(root: Path, names: list[str], migrations: int, admin: str) -> Path:
    """A project whose fleet lists ``names``; ``migrations`` trivial migrations."""
    root.mkdir(parents=True)
    (root / "migrations").mkdir()
    for i in range(migrations):
        (root / "migrations" / f"2026010100{i:04d}_m{i}.py").write_text(BODY)
    (root / "migronaut.toml").write_text(
        f'[fleet]\nnames = {json.dumps(names)}\nadmin_db = "{admin}"\n')
    return root


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Wall seconds and CPU seconds (user + system, children included) of one process; its
    output goes to files (a pipe nobody reads while it runs would fill and stall it)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        clock = time.perf_counter()
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - clock
        process.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if code != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {code}:\n{stderr[-2000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "stdout": stdout}


def migronaut_cli() -> list[str]:
    return [sys.executable, "-m", "migronaut"]


def drop(uri: str, prefix: str) -> None:
    from pymongo import MongoClient

    with MongoClient(uri) as client:
        for name in client.list_database_names():
            if name.startswith(prefix):
                client.drop_database(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/fleet.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=500)
    parser.add_argument("--migrations", type=int, default=5)
    parser.add_argument("--sample", type=int, default=50,
                        help="tenants the shell loop runs over (scaled to --tenants)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    server = start_server()
    prefix = f"fb{uuid.uuid4().hex[:6]}"
    env = measured_env("MIGRONAUT_")
    env["MIGRONAUT_URI"] = server.uri
    figures: dict[str, Any] = {"tenants": args.tenants, "migrations": args.migrations,
                               "sample": args.sample, "concurrency": args.concurrency,
                               "server": server_version(server.uri)}
    try:
        with tempfile.TemporaryDirectory(prefix="migronaut-fleet-bench-") as tmp:
            base = Path(tmp)

            def names(side: str, count: int) -> list[str]:
                return [f"{prefix}_{side}_{i:04d}" for i in range(count)]

            fleet_names = names("f", args.tenants)
            fleet_dir = project(base / "fleet", fleet_names, args.migrations, f"{prefix}_admin")
            log(f"fleet up --concurrency {args.concurrency} over {args.tenants} tenants")
            up = timed([*migronaut_cli(), "fleet", "up", "--concurrency",
                        str(args.concurrency), "--json"], fleet_dir, env)
            result = json.loads(up["stdout"])
            assert result["counts"]["succeeded"] == args.tenants, result["counts"]
            figures["fleet_up"] = {k: up[k] for k in ("wall", "cpu")}

            log("fleet status and the re-run with nothing pending (median of 3)")
            status = [timed([*migronaut_cli(), "fleet", "status", "--concurrency",
                             str(args.concurrency), "--json"], fleet_dir, env)
                      for _ in range(3)]
            assert json.loads(status[0]["stdout"])["counts"]["up-to-date"] == args.tenants
            again = [timed([*migronaut_cli(), "fleet", "up", "--concurrency",
                            str(args.concurrency), "--json"], fleet_dir, env)
                     for _ in range(3)]
            assert json.loads(again[0]["stdout"])["counts"]["up-to-date"] == args.tenants
            figures["fleet_status"] = statistics.median(s["wall"] for s in status)
            figures["fleet_rerun"] = statistics.median(s["wall"] for s in again)

            loop_names = names("l", args.tenants)
            loop_dir = project(base / "loop", loop_names, args.migrations, f"{prefix}_ladmin")
            log(f"a Python loop over Migrator sharing one client, {args.tenants} tenants")
            loop = timed([sys.executable, "-c", LOOP, server.uri, ",".join(loop_names)],
                         loop_dir, env)
            figures["python_loop"] = {k: loop[k] for k in ("wall", "cpu")}

            shell_names = names("s", args.sample)
            shell_dir = project(base / "shell", shell_names, args.migrations, f"{prefix}_sadmin")
            log(f"the shell loop over {args.sample} tenants")
            script = ("for t in " + " ".join(shell_names) + "; do "
                      + shlex.join(migronaut_cli()) + ' --db "$t" up >/dev/null; done')
            shell = timed(["bash", "-c", script], shell_dir, env)
            scale = args.tenants / args.sample
            figures["shell_loop"] = {"wall": shell["wall"] * scale, "cpu": shell["cpu"] * scale,
                                     "measured_wall": shell["wall"], "scale": scale}
    finally:
        drop(server.uri, prefix)
        server.close()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleet.json").write_text(json.dumps(figures, indent=2))
    print(render(figures, markdown=args.markdown))
    return 0


def render(figures: dict[str, Any], *, markdown: bool) -> str:
    n, m, c = figures["tenants"], figures["migrations"], figures["concurrency"]
    fleet, shell, loop = figures["fleet_up"], figures["shell_loop"], figures["python_loop"]
    rows = [
        (f"`fleet up --concurrency {c}`", f"{fleet['wall']:.1f} s", f"{fleet['cpu']:.1f} s",
         "—"),
        (f"shell loop `migronaut --db $t up` (×{shell['scale']:g} of {figures['sample']})",
         f"{shell['wall']:.1f} s", f"{shell['cpu']:.1f} s",
         f"fleet is {shell['wall'] / fleet['wall']:.1f}× faster (target ≥ 10×)"),
        ("Python loop over `Migrator`, one client", f"{loop['wall']:.1f} s",
         f"{loop['cpu']:.1f} s",
         f"fleet CPU {fleet['cpu'] / loop['cpu']:.2f}× the loop's (target ≤ 1.2×)"),
        (f"`fleet status` ({n} tenants)", f"{figures['fleet_status']:.2f} s", "—",
         "target < 2 s"),
        ("`fleet up` again, nothing pending", f"{figures['fleet_rerun']:.2f} s", "—",
         "target < 3 s"),
    ]
    head = (f"{n} tenants × {m} trivial migrations", "wall", "client CPU", "vs target")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    width = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, width, strict=True))
                     for row in (head, *rows))


if __name__ == "__main__":
    raise SystemExit(main())
