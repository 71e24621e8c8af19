"""A background migration worked through Celery beside the same migration worked by
``migronaut background work``, on the same data (PRODUCT.md: "Through Celery: within 10 % of
``background work``" in client CPU per document).

    .venv-3.13/bin/python bench/celery_background.py [--docs N] [--rounds R] [--lanes L]
        [--poll-ms MS] [--markdown]

Each round seeds a fresh database with ``--docs`` documents once (not measured); for each
executor the documents are reset to v0 and migronaut's collections dropped (the same data), a
declarative v0 → v1 migration is registered with ``migronaut up`` (not measured), and then ONE
process works it to completion: ``python -m migronaut background work --lanes L``,
or ``python -m celery -A migronaut.celery worker -P threads -c L+1`` on the background queue
(Redis broker and result backend on a Redis database claimed like the tests claim theirs). The
bench polls MongoDB until the state is ``completed``, stops the process (SIGTERM, a clean stop
for both) and reads its CPU time (user + system, ``os.wait4``). The same process started and
stopped with nothing to do gives its start-up cost, reported and subtracted. Client CPU only:
the dev server and Redis are other processes.

Figures: client CPU per document (with and without start-up), the ratio Celery / ``work``, and
the queue's overhead per slice = (Celery's CPU − ``work``'s CPU) / Celery's slices.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from run import drop_database, log, measured_env, start_server  # noqa: E402

NAME = "0001_bench.py"
CLAIM = "migronaut-test:redis-db:{}"  # the tests' claims: a bench never takes their database
MIGRATION = '''
def migrate(doc, ctx):
    doc["y"] = doc["x"] * 2
    return doc


background = {
    "collection": "docs",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 500,
    "pause_ms": 0,
    "slice_ms": 2000,
    "max_parallel": %(lanes)d,
    "adaptive": False,
}
'''


def claim_redis() -> tuple[Any, int, str]:
    import redis

    claims = redis.Redis(host="127.0.0.1", port=6379, db=0)
    token = f"bench-{os.getpid()}-{uuid.uuid4().hex}"
    for number in range(15, 0, -1):
        if claims.set(CLAIM.format(number), token, nx=True, ex=3600):
            redis.Redis(host="127.0.0.1", port=6379, db=number).flushdb()
            return claims, number, token
    raise SystemExit("every Redis database 1-15 is claimed")


def project(root: Path, uri: str, db_name: str, lanes: int, redis_url: str,
            poll_ms: int) -> dict[str, str]:
    (root / "migrations").mkdir(parents=True, exist_ok=True)
    (root / "migrations" / NAME).write_text(MIGRATION % {"lanes": lanes}, encoding="utf-8")
    (root / "migronaut.toml").write_text(
        f"[celery]\npoll_interval_ms = {poll_ms}\nverify_interval_ms = false\n",
        encoding="utf-8")
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = measured_env("MIGRONAUT_")
    env.update({"MIGRONAUT_URI": uri, "MIGRONAUT_DB": db_name,
                "MIGRONAUT_CELERY_BROKER_URL": redis_url,
                "MIGRONAUT_CELERY_RESULT_BACKEND": redis_url,
                "MIGRONAUT_CELERY_QUEUE": queue})
    return env


def command(executor: str, lanes: int, env: dict[str, str], poll_ms: int) -> list[str]:
    if executor == "work":
        return [sys.executable, "-m", "migronaut", "background", "work", "--lanes", str(lanes),
                "--poll", str(poll_ms / 1000)]
    return [sys.executable, "-m", "celery", "-A", "migronaut.celery", "worker", "-P", "threads",
            "-c", str(lanes + 1), "-Q", env["MIGRONAUT_CELERY_QUEUE"] + "-background",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]


def slices_of(executor: str, text: str) -> int:
    """Lane slices the process ran: ``work``'s stop line, or the lane tasks a worker received
    (one task run is one slice)."""
    if executor == "work":
        found = re.search(r"Worker stopped — (\d+) slice", text)
        return int(found.group(1)) if found else 0
    return len(re.findall(r"migronaut\.background-lane\[[^\]]+\] received", text))


def cpu_of(process: subprocess.Popen[bytes]) -> float:
    """SIGTERM ``process`` (a clean stop), wait for it, its user + system CPU seconds."""
    process.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def ready(executor: str, log_path: Path) -> bool:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return ("Worker started" in text) if executor == "work" else (" ready." in text or
                                                                  "celery@" in text)


def seed(uri: str, db_name: str, docs: int) -> None:
    """``docs`` documents ``{x: i}`` and the version index, in small chunks (the dev server's
    inserts slow down with the collection's size; a loaded machine can time a large one out)."""
    from pymongo import ASCENDING, MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000, socketTimeoutMS=600_000) as client:
        coll = client[db_name]["docs"]
        for first in range(0, docs, 100):
            coll.insert_many([{"x": i} for i in range(first, min(docs, first + 100))])
        coll.create_index([("__v", ASCENDING), ("_id", ASCENDING)])


def reset(uri: str, db_name: str) -> None:
    """The same documents back to v0 and no migronaut state: the next executor starts from
    exactly the data the previous one started from."""
    from pymongo import MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000, socketTimeoutMS=600_000) as client:
        db = client[db_name]
        db["docs"].update_many({}, {"$unset": {"__v": "", "y": ""}})
        for name in db.list_collection_names():
            if name.startswith("_migronaut"):
                db.drop_collection(name)


def run_one(executor: str, uri: str, db_name: str, lanes: int, redis_url: str, poll_ms: int,
            idle: bool = False) -> dict[str, Any]:
    from pymongo import MongoClient

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = project(root, uri, db_name, lanes, redis_url, poll_ms)
        if not idle:
            reset(uri, db_name)
            up = subprocess.run([sys.executable, "-m", "migronaut", "up"], cwd=root, env=env,
                                capture_output=True, text=True, check=False)
            if up.returncode:
                raise SystemExit(f"up failed: {up.stderr}")
        log_path = root / "worker.log"
        args = command(executor, lanes, env, poll_ms)
        with open(log_path, "wb") as out:
            started = time.perf_counter()
            process = subprocess.Popen(args, cwd=root, env=env, stdout=out,
                                       stderr=subprocess.STDOUT)
        try:
            with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
                states = client[db_name]["_migronaut_background"]
                deadline = time.monotonic() + 900
                while True:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{executor}: not done after 900 s:\n"
                                         f"{log_path.read_text()[-4000:]}")
                    if process.poll() is not None:
                        raise SystemExit(f"{executor} exited:\n{log_path.read_text()}")
                    if idle and ready(executor, log_path):
                        break
                    found = None if idle else states.find_one({"_id": NAME})
                    if found is not None and found["status"] in ("completed", "failed"):
                        break
                    time.sleep(0.05)
                wall = time.perf_counter() - started
                cpu = cpu_of(process)
                final = states.find_one({"_id": NAME}) or {}
                slices = slices_of(executor, log_path.read_text(encoding="utf-8",
                                                                errors="replace"))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if not idle and final.get("status") != "completed":
        raise SystemExit(f"{executor}: the migration ended {final.get('status')}: "
                         f"{final.get('lastError')}")
    totals = final.get("totals") or {}
    return {"executor": executor, "wall": wall, "cpu": cpu,
            "migrated": totals.get("migrated", 0), "slices": slices,
            "batches": totals.get("batches", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--poll-ms", type=int, default=5000,
                        help="celery.poll_interval_ms and `work --poll` (default 5000, both "
                        "defaults)")
    parser.add_argument("--markdown", action="store_true")
    options = parser.parse_args(argv)
    server = start_server()
    claims, number, token = claim_redis()
    redis_url = f"redis://127.0.0.1:6379/{number}"
    runs: dict[str, list[dict[str, Any]]] = {"work": [], "celery": []}
    idle: dict[str, list[float]] = {"work": [], "celery": []}
    try:
        for round_ in range(options.rounds):
            db_name = f"bench_celery_{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            seed(server.uri, db_name, options.docs)
            log(f"round {round_ + 1}: seeded {options.docs} documents in "
                f"{time.perf_counter() - started:.0f} s (not measured)")
            try:
                for executor in ("work", "celery"):
                    idle_db = f"bench_idle_{uuid.uuid4().hex[:8]}"
                    idle[executor].append(run_one(executor, server.uri, idle_db, options.lanes,
                                                  redis_url, options.poll_ms, idle=True)["cpu"])
                    drop_database(server.uri, idle_db)
                    result = run_one(executor, server.uri, db_name, options.lanes, redis_url,
                                     options.poll_ms)
                    log(f"round {round_ + 1} {executor}: {json.dumps(result)}")
                    runs[executor].append(result)
            finally:
                drop_database(server.uri, db_name)
    finally:
        if claims.get(CLAIM.format(number)) == token.encode():
            claims.delete(CLAIM.format(number))
        server.close()

    def median(executor: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[executor])

    docs = options.docs
    rows = []
    net: dict[str, float] = {}
    for executor in ("work", "celery"):
        cpu, start = median(executor, "cpu"), statistics.median(idle[executor])
        net[executor] = cpu - start
        rows.append([
            "migronaut background work" if executor == "work" else "Celery worker (threads)",
            f"{median(executor, 'wall'):.2f} s", f"{cpu:.2f} s", f"{start:.2f} s",
            f"{cpu / docs * 1e6:.0f} µs", f"{net[executor] / docs * 1e6:.0f} µs",
            f"{median(executor, 'slices'):.0f}", f"{median(executor, 'batches'):.0f}",
        ])
    slices = median("celery", "slices") or 1
    ratio = median("celery", "cpu") / median("work", "cpu")
    summary = (f"Celery / work, client CPU per document: {ratio:.2f}× "
               f"with start-up, {net['celery'] / net['work']:.2f}× without; the queue's overhead "
               f"per slice: {(net['celery'] - net['work']) / slices * 1000:.1f} ms CPU")
    headers = ["executor", "wall", "client CPU", "start-up CPU", "CPU/doc", "CPU/doc w/o start-up",
               "slices", "batches"]
    if options.markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "---|" * len(headers))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print(f"\n{docs} documents, {options.lanes} lanes, poll {options.poll_ms} ms, median of "
          f"{options.rounds} round(s). "
          + summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
