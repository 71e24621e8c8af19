"""A background migration worked through Celery beside the same migration worked by
``migronaut background work``, on the same data (PRODUCT.md: "Through Celery: within 10 % of
``background work``" in client CPU per document).

    .venv-3.13/bin/python bench/celery_background.py [--docs N] [--rounds R] [--lanes L]
        [--poll-ms MS] [--slice-ms MS] [--seeded-db NAME] [--markdown]

One database is seeded with ``--docs`` documents once (not measured). Each round runs both
executors in turn; for each the documents are reset to v0 and migronaut's collections dropped
(the same data), and ONE process is started with nothing to do:
``python -m migronaut background work --lanes L``, or
``python -m celery -A migronaut.celery worker -P threads -c L+1`` on the background queue (Redis
broker and result backend on a Redis database claimed like the tests claim theirs). Once
it is ready, its CPU so far is its start-up. It first works a small warm-up migration (500
documents, not measured: imports, connection pools and threads as a worker that has been up a
while has them), then sits idle for ``IDLE_S`` seconds: its idle CPU rate. Then the measured
declarative v0 → v1 migration is registered with ``migronaut up`` (and, for Celery, ``migronaut
background enqueue``, as the queue's ``up`` task does; ``work`` finds it at its next poll).

The window: from the moment the executor picks the migration up (:class:`Sampler`: the last
look, every 20 ms, that saw neither its coordinator lock nor its state past ``pending``) until
MongoDB says ``completed`` — for Celery, until the coordinator chain has written its result
(its last re-check and heal count). CPU is the process's CPU clock (``clock_getcpuclockid``: every
thread, in nanoseconds). Client CPU only: the dev server, Redis and the ``up``/``enqueue``
commands are other processes.

Figures: the window's CPU; its main thread's (``/proc/PID/task/PID/schedstat``: Celery's consumer
loop, ``work``'s idle main thread) and the rest; the idle rate, and the CPU the migration
*caused* = the window's CPU − idle rate × the window's length (what a worker that is up anyway
spends on the migration: a Celery consumer polls its broker every second whatever it runs);
Celery / ``work`` per round (median printed) and over all rounds pooled, for each; the queue's
overhead per slice.
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from run import drop_database, log, measured_env, start_server  # noqa: E402

NAME = "0001_bench.py"
#: Worked first, not measured: the executor's code paths, connections and threads warmed up.
WARM_UP = "0000_warm_up.py"
WARM_UP_DOCS = 500
#: Seconds the idle process is watched (after the warm-up) for its idle CPU rate.
IDLE_S = 5.0
CLAIM = "migronaut-test:redis-db:{}"  # the tests' claims: a bench never takes their database
MIGRATION = '''
def migrate(doc, ctx):
    doc["y"] = doc["x"] * 2
    return doc


background = {
    "collection": "%(collection)s",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 500,
    "pause_ms": 0,
    "slice_ms": %(slice_ms)d,
    "max_parallel": %(lanes)d,
    "adaptive": False,%(extra)s
}
'''
#: The warm-up's plan has a partition per lane at least (100 documents each), so every lane
#: thread — not only the first — has its connections (MongoDB's pool, and for Celery the
#: broker's and the result backend's) before the measured migration.
WARM_UP_EXTRA = '\n    "partitions": {"min_partition_docs": 100},'



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


def cpu_now(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, every thread: its process CPU clock
    (``clock_getcpuclockid``, nanoseconds) where the kernel gives it, else ``/proc/PID/stat``
    (10 ms clock ticks)."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        pass
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main_thread_cpu(pid: int) -> float:
    """CPU seconds of process ``pid``'s main thread so far (``/proc/PID/task/PID/schedstat``,
    nanoseconds): Celery's consumer loop — it receives the tasks and polls the broker — or
    ``work``'s main thread, which waits for a stop."""
    with open(f"/proc/{pid}/task/{pid}/schedstat", encoding="ascii") as stat:
        return int(stat.read().split()[0]) / 1e9


def stop(process: subprocess.Popen[bytes]) -> float:
    """SIGTERM ``process`` (a clean stop), wait for it, its whole user + system CPU seconds."""
    process.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def ready(executor: str, log_path: Path) -> bool:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return ("Worker started" in text) if executor == "work" else (" ready." in text)


def seed(uri: str, db_name: str, docs: int) -> None:
    """``docs`` documents ``{x: i}`` and the version index, 10,000 at a time."""
    from pymongo import ASCENDING, MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000, socketTimeoutMS=600_000) as client:
        for name, count in (("docs", docs), ("warm", WARM_UP_DOCS)):
            coll = client[db_name][name]
            for first in range(0, count, 10_000):
                coll.insert_many([{"x": i} for i in range(first, min(count, first + 10_000))])
            coll.create_index([("__v", ASCENDING), ("_id", ASCENDING)])


def seeded(uri: str, db_name: str, docs: int) -> bool:
    """Whether ``--seeded-db`` names a database :func:`seed` filled with ``--docs`` documents
    (``False``: an empty one, to seed now and keep); anything else would measure another
    migration — an empty ``docs`` collection reported ratios of nothing."""
    from pymongo import MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        counts = {name: client[db_name][name].count_documents({})
                  for name in ("docs", "warm")}
    if counts == {"docs": 0, "warm": 0}:
        return False
    if counts != {"docs": docs, "warm": WARM_UP_DOCS}:
        raise SystemExit(f"--seeded-db {db_name}: it holds {counts['docs']} documents in docs "
                         f"and {counts['warm']} in warm, not {docs} and {WARM_UP_DOCS}: name "
                         "an empty database (seeded now, then kept) or the same --docs")
    return True


def reset(uri: str, db_name: str) -> None:
    """The same documents back to v0 and no migronaut state: the next executor starts from
    exactly the data the previous one started from."""
    from pymongo import MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=10_000, socketTimeoutMS=600_000) as client:
        db = client[db_name]
        for name in ("docs", "warm"):
            db[name].update_many({}, {"$unset": {"__v": "", "y": ""}})
        for name in db.list_collection_names():
            if name.startswith("_migronaut"):
                db.drop_collection(name)


class Sampler(threading.Thread):
    """Every 20 ms: the process's CPU so far, then whether the measured migration is being
    worked yet (its coordinator lock taken, or its state past ``pending``). The CPU of the last
    sample that saw no work is where the measured window starts: it excludes how long an
    executor took to *notice* the migration (``work`` polls every ``--poll-ms``, idling
    meanwhile; ``enqueue`` starts a Celery coordinator at once) and nothing else — the CPU was
    read before the look that saw no work, so every command of the migration is after it."""

    def __init__(self, pid: int, uri: str, db_name: str) -> None:
        super().__init__(daemon=True)
        self.pid, self.uri, self.db_name = pid, uri, db_name
        self.start_cpu: float | None = None
        self.start_main = self.start_at = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        from pymongo import MongoClient

        with MongoClient(self.uri, serverSelectionTimeoutMS=10_000) as client:
            db = client[self.db_name]
            while not self.done.is_set():
                cpu, main = cpu_now(self.pid), main_thread_cpu(self.pid)
                locked = db["_migronaut_locks"].find_one({"_id": f"background:{NAME}"},
                                                         {"_id": 1})
                state = db["_migronaut_background"].find_one({"_id": NAME}, {"status": 1})
                if locked is not None or (state or {}).get("status", "pending") != "pending":
                    return
                self.start_cpu, self.start_main, self.start_at = cpu, main, time.perf_counter()
                time.sleep(0.02)


def chain_ended(redis_url: str, queue: str, migration: str = NAME) -> bool:
    """Whether ``migration``'s Celery coordinator chain has written its result (its last run —
    the re-check that finds the migration completed, and its heal — is done)."""
    import redis

    from migronaut.executors.celery.background_producer import coordinator_id

    key = f"celery-task-meta-{coordinator_id(queue + '-background', migration)}"
    raw = redis.Redis.from_url(redis_url).get(key)
    return raw is not None and json.loads(raw).get("status") == "SUCCESS"


def run_one(executor: str, uri: str, db_name: str, lanes: int, redis_url: str,
            poll_ms: int, slice_ms: int) -> dict[str, Any]:
    from pymongo import MongoClient

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = project(root, uri, db_name, lanes, redis_url, poll_ms)
        reset(uri, db_name)
        log_path = root / "worker.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(command(executor, lanes, env, poll_ms), cwd=root,
                                       env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
                states = client[db_name]["_migronaut_background"]
                wait_for(process, log_path, executor, lambda: ready(executor, log_path))
                time.sleep(1.0)  # let start-up settle (connections, the heal on ready)
                startup = cpu_now(process.pid)

                def finished(file: str) -> bool:
                    found = states.find_one({"_id": file})
                    return found is not None and found["status"] in ("completed", "failed")

                def register(file: str, collection: str) -> None:
                    (root / "migrations" / file).write_text(
                        MIGRATION % {"lanes": lanes, "collection": collection,
                                     "slice_ms": slice_ms,
                                     "extra": WARM_UP_EXTRA if file == WARM_UP else ""},
                        encoding="utf-8")
                    steps = [["up"]] + ([["background", "enqueue"]] if executor == "celery"
                                        else [])
                    for step in steps:
                        done = subprocess.run([sys.executable, "-m", "migronaut", *step],
                                              cwd=root, env=env, capture_output=True,
                                              text=True, check=False)
                        if done.returncode:
                            raise SystemExit(f"{' '.join(step)} failed: {done.stderr}")

                register(WARM_UP, "warm")
                wait_for(process, log_path, executor, lambda: finished(WARM_UP))
                if executor == "celery":  # its chain's last re-check is not idle time
                    wait_for(process, log_path, executor, lambda: chain_ended(
                        redis_url, env["MIGRONAUT_CELERY_QUEUE"], WARM_UP))
                time.sleep(1.0)
                idle_from = cpu_now(process.pid)
                time.sleep(IDLE_S)
                idle_rate = (cpu_now(process.pid) - idle_from) / IDLE_S
                sampler = Sampler(process.pid, uri, db_name)
                sampler.start()
                logged = len(log_path.read_bytes())
                started = time.perf_counter()
                register(NAME, "docs")
                wait_for(process, log_path, executor, lambda: finished(NAME))
                wall = time.perf_counter() - started
                if executor == "celery":  # the chain's last re-check and its heal count too
                    wait_for(process, log_path, executor, lambda: chain_ended(
                        redis_url, env["MIGRONAUT_CELERY_QUEUE"]))
                end_cpu, end_at = cpu_now(process.pid), time.perf_counter()
                end_main = main_thread_cpu(process.pid)
                sampler.done.set()
                sampler.join()
                if sampler.start_cpu is None:
                    raise SystemExit(f"{executor}: the migration was worked before the first "
                                     "sample")
                running = end_cpu - sampler.start_cpu
                window = end_at - sampler.start_at
                main = end_main - sampler.start_main
                stop(process)
                final = states.find_one({"_id": NAME}) or {}
                slices = slices_of(executor, log_path.read_bytes()[logged:].decode(
                    "utf-8", errors="replace"))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if final.get("status") != "completed":
        raise SystemExit(f"{executor}: the migration ended {final.get('status')}: "
                         f"{final.get('lastError')}")
    totals = final.get("totals") or {}
    return {"executor": executor, "wall": wall, "cpu": running, "window": window,
            "idle_rate": idle_rate, "caused": running - idle_rate * window, "main": main,
            "off_main": running - main, "startup": startup,
            "total": startup + running, "migrated": totals.get("migrated", 0), "slices": slices,
            "batches": totals.get("batches", 0)}


def wait_for(process: subprocess.Popen[bytes], log_path: Path, executor: str,
             condition: Any, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise SystemExit(f"{executor} exited:\n{log_path.read_text()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{executor}: not done after {timeout:.0f} s:\n"
                             f"{log_path.read_text()[-4000:]}")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--poll-ms", type=int, default=5000,
                        help="celery.poll_interval_ms and `work --poll` (default 5000, both "
                        "defaults)")
    parser.add_argument("--slice-ms", type=int, default=20_000,
                        help="the migration's slice_ms (default 20000: celery.slice_ms's default, "
                        "the longest slice a Celery lane task runs); shorter slices show the "
                        "queue's overhead per slice")
    parser.add_argument("--seeded-db", metavar="NAME",
                        help="use this database and keep it: seeded now when empty, reused "
                        "when an earlier run seeded it with the same --docs (with "
                        "MIGRONAUT_BENCH_URI naming its server)")
    parser.add_argument("--markdown", action="store_true")
    options = parser.parse_args(argv)
    server = start_server()
    claims, number, token = claim_redis()
    redis_url = f"redis://127.0.0.1:6379/{number}"
    runs: dict[str, list[dict[str, Any]]] = {"work": [], "celery": []}
    db_name = options.seeded_db or f"bench_celery_{uuid.uuid4().hex[:8]}"
    try:
        if options.seeded_db is None or not seeded(server.uri, db_name, options.docs):
            started = time.perf_counter()
            seed(server.uri, db_name, options.docs)
            log(f"seeded {options.docs} documents in {time.perf_counter() - started:.0f} s "
                "(not measured; every run resets them to v0)")
        for round_ in range(options.rounds):
            for executor in ("work", "celery"):
                result = run_one(executor, server.uri, db_name, options.lanes, redis_url,
                                 options.poll_ms, options.slice_ms)
                log(f"round {round_ + 1} {executor}: {json.dumps(result)}")
                runs[executor].append(result)
    finally:
        if options.seeded_db is None:
            drop_database(server.uri, db_name)
        if claims.get(CLAIM.format(number)) == token.encode():
            claims.delete(CLAIM.format(number))
        server.close()
    print(report(runs, options.docs, options.lanes, options.poll_ms, options.slice_ms,
                 options.markdown))
    return 0


def report(runs: dict[str, list[dict[str, Any]]], docs: int, lanes: int, poll_ms: int,
           slice_ms: int, markdown: bool) -> str:
    """The table and the summary. Ratios are taken per round (the two executors of a round ran
    back to back) and their median printed, and over all rounds' CPU pooled: the machine's load
    moves between rounds."""
    def median(executor: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[executor])

    def ratios(key: str) -> tuple[float, float, str]:
        pairs = list(zip(runs["work"], runs["celery"], strict=True))
        per_round = [c[key] / w[key] for w, c in pairs]
        pooled = sum(c[key] for _, c in pairs) / sum(w[key] for w, _ in pairs)
        return statistics.median(per_round), pooled, ", ".join(f"{r:.2f}×" for r in per_round)

    headers = ["executor", "wall", "window", "CPU in the window", "main thread", "other threads",
               "idle CPU", "CPU caused", "caused/doc", "start-up CPU", "slices", "batches"]
    rows = [[
        "migronaut background work" if executor == "work" else "Celery worker (threads)",
        f"{median(executor, 'wall'):.2f} s", f"{median(executor, 'window'):.2f} s",
        f"{median(executor, 'cpu') * 1000:.0f} ms", f"{median(executor, 'main') * 1000:.0f} ms",
        f"{median(executor, 'off_main') * 1000:.0f} ms",
        f"{median(executor, 'idle_rate') * 1000:.2f} ms/s",
        f"{median(executor, 'caused') * 1000:.0f} ms",
        f"{median(executor, 'caused') / docs * 1e6:.1f} µs",
        f"{median(executor, 'startup'):.2f} s",
        f"{median(executor, 'slices'):.0f}", f"{median(executor, 'batches'):.0f}",
    ] for executor in ("work", "celery")]
    lines = []
    if markdown:
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + "---|" * len(headers))
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                  for row in rows]
    caused, caused_pooled, caused_rounds = ratios("caused")
    raw, raw_pooled, raw_rounds = ratios("cpu")
    off, off_pooled, off_rounds = ratios("off_main")
    slices = median("celery", "slices") or 1
    per_slice = (median("celery", "caused") - median("work", "caused")) / slices * 1000
    lines.append(
        f"\n{docs} documents, {lanes} lanes, slice {slice_ms} ms, poll {poll_ms} ms, "
        f"{len(runs['work'])} round(s). Celery / work, client CPU the migration caused (the "
        f"window's CPU above the process's own idle rate): {caused:.2f}× median of the rounds "
        f"({caused_rounds}), {caused_pooled:.2f}× pooled. The window's whole CPU, idle "
        f"included: {raw:.2f}× median ({raw_rounds}), {raw_pooled:.2f}× pooled. Off the main "
        f"thread (Celery's consumer loop; work's idle main thread): {off:.2f}× median "
        f"({off_rounds}), {off_pooled:.2f}× pooled. The queue's "
        f"overhead per slice: {per_slice:.1f} ms CPU")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
