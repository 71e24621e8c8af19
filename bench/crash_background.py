"""A background migration whose worker is killed with SIGKILL mid-run, then finished by another
worker: every document transformed exactly once, and the totals exact.

    .venv-3.13/bin/python bench/crash_background.py [--docs N] [--lanes L] [--kill-at F]
        [--ttl S] [--markdown]

One database is seeded with ``--docs`` documents ``{x: i}`` and the version index (not timed). A
declarative v0 → v1 migration (``y = x * 2``) is registered with ``migronaut up``; a first
``migronaut background work --lanes L`` process works it until a fraction ``--kill-at`` of the
documents is migrated, and is then killed with SIGKILL: its leases stay behind, held by nobody,
its batches in flight are cut anywhere. A second worker starts at once; it takes the partitions
over as their leases expire (``--ttl`` seconds: ``MIGRONAUT_LOCK_TTL``) and finishes.

The checks, on every document read back: ``y == 2x`` and version 1 (transformed), and
``__rev == 1`` (written once: every write of the engine increments it under the version guard,
so a document written twice would read 2); the migration's stored totals (``migrated`` equal to
the number of documents, no failures) and its status ``completed``. The bench exits non-zero
when one fails.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from celery_background import MIGRATION, command, project, seed, wait_for  # noqa: E402
from run import drop_database, log, start_server  # noqa: E402

NAME = "0001_bench.py"


def migrated_now(db: Any) -> int:
    """Documents at version 1 so far, looked at once a second (the dev server reads every
    document to count them; a real server answers from the version index)."""
    time.sleep(1.0)
    return int(db["docs"].count_documents({"__v": 1}))


def start_worker(root: Path, env: dict[str, str], lanes: int, log_path: Path
                 ) -> subprocess.Popen[bytes]:
    """``migronaut background work --lanes L`` in ``root``, its output into ``log_path``."""
    with open(log_path, "wb") as out:
        return subprocess.Popen(command("work", lanes, env, 1000), cwd=root, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def check(db: Any, docs: int) -> dict[str, Any]:
    """Every document once and right, and the stored totals."""
    rows = list(db["docs"].find({}, {"x": 1, "y": 1, "__v": 1, "__rev": 1}))
    wrong = [row for row in rows if row.get("y") != row.get("x", 0) * 2 or row.get("__v") != 1]
    twice = [row for row in rows if row.get("__rev") != 1]
    state = db["_migronaut_background"].find_one({"_id": NAME}) or {}
    totals = state.get("totals") or {}
    return {"documents": len(rows), "wrong": len(wrong), "not_once": len(twice),
            "revisions": sorted({row.get("__rev") for row in rows}, key=str),
            "status": state.get("status"), "totals": totals,
            "ok": (len(rows) == docs and not wrong and not twice
                   and state.get("status") == "completed"
                   and totals.get("migrated") == docs and not totals.get("failed"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--kill-at", type=float, default=0.4, metavar="F",
                        help="kill the first worker once this fraction is migrated (0-1)")
    parser.add_argument("--ttl", type=int, default=10, metavar="S",
                        help="lease TTL in seconds (MIGRONAUT_LOCK_TTL; default 10)")
    parser.add_argument("--markdown", action="store_true")
    options = parser.parse_args(argv)
    if options.docs < 1 or not 0 < options.kill_at < 1 or options.lanes < 1:
        parser.error("--docs and --lanes must be at least 1, --kill-at between 0 and 1")
    from pymongo import MongoClient

    server = start_server()
    db_name = f"bench_crash_{uuid.uuid4().hex[:8]}"
    figures: dict[str, Any] = {}
    try:
        started = time.perf_counter()
        seed(server.uri, db_name, options.docs)
        log(f"seeded {options.docs:,} documents in {time.perf_counter() - started:.0f} s")
        with tempfile.TemporaryDirectory() as tmp, \
                MongoClient(server.uri, serverSelectionTimeoutMS=30_000) as client:
            root = Path(tmp)
            env = project(root, server.uri, db_name, options.lanes, "redis://unused", 1000)
            env["MIGRONAUT_LOCK_TTL"] = str(options.ttl)
            (root / "migrations" / NAME).write_text(
                MIGRATION % {"lanes": options.lanes, "collection": "docs", "slice_ms": 20_000,
                             "extra": ""}, encoding="utf-8")
            done = subprocess.run([sys.executable, "-m", "migronaut", "up"], cwd=root, env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"up failed: {done.stderr}")
            db = client[db_name]
            threshold = int(options.docs * options.kill_at)
            log_path = root / "first.log"
            started = time.perf_counter()
            first = start_worker(root, env, options.lanes, log_path)
            try:
                wait_for(first, log_path, "work", lambda: migrated_now(db) >= threshold)
                first.send_signal(signal.SIGKILL)
                first.wait()
            finally:
                if first.poll() is None:
                    first.kill()
                    first.wait()
            figures["killed_after_s"] = time.perf_counter() - started
            figures["migrated_at_kill"] = int(db["docs"].count_documents({"__v": 1}))
            figures["leases_left"] = db["_migronaut_background_partitions"].count_documents(
                {"background": NAME, "lease": {"$type": "object"}})
            log_path = root / "second.log"
            restarted = time.perf_counter()
            second = start_worker(root, env, options.lanes, log_path)
            try:
                states = db["_migronaut_background"]
                wait_for(second, log_path, "work", lambda: (states.find_one(
                    {"_id": NAME}, {"status": 1}) or {}).get("status") in ("completed",
                                                                           "failed"))
            finally:
                second.send_signal(signal.SIGTERM)
                try:
                    second.wait(60)
                except subprocess.TimeoutExpired:
                    second.kill()
                    second.wait()
            figures["second_worker_s"] = time.perf_counter() - restarted
            figures.update(check(db, options.docs))
    finally:
        try:
            drop_database(server.uri, db_name)
        finally:
            server.close()
    print(report(figures, options))
    return 0 if figures.get("ok") else 1


def report(figures: dict[str, Any], options: argparse.Namespace) -> str:
    rows = [
        ("documents", f"{options.docs:,}"),
        ("lanes per worker", str(options.lanes)),
        ("first worker killed (SIGKILL) after",
         f"{figures['killed_after_s']:.1f} s, {figures['migrated_at_kill']:,} documents "
         f"migrated, {figures['leases_left']} leases left held"),
        ("second worker: took over (leases expire after "
         f"{options.ttl} s) and finished in", f"{figures['second_worker_s']:.1f} s"),
        ("documents read back / wrong / written more than once",
         f"{figures['documents']:,} / {figures['wrong']} / {figures['not_once']} "
         f"(revisions seen: {figures['revisions']})"),
        ("migration status / stored totals", f"{figures['status']} / {figures['totals']}"),
        ("every document transformed exactly once, totals exact",
         "yes" if figures["ok"] else "NO"),
    ]
    if options.markdown:
        return "\n".join(["| | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])
    width = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


if __name__ == "__main__":
    sys.exit(main())
