"""``bench/run.py --devserver``: the dev server's own costs as its collection grows.

The dev server keeps documents keyed by their ``_id`` with an ordered ``_id`` index beside each
collection, so inserts, ``_id`` lookups, ``_id`` ranges sorted on ``_id``, updates by ``_id`` and
plain counts should cost the same per document or per operation whatever the collection holds.
This section measures that, in one run:

1. **Seeding.** One in-memory dev server for the whole run (``start_subprocess()``, nothing
   else on it): ``insert_many`` of :data:`SEED_BATCH` documents ``{_id: ObjectId(), n, s (40
   characters), tag: n % 10}`` (86 bytes of BSON) per call into one collection, up to N
   (:data:`FULL_N`; ``--quick``: :data:`QUICK_N`). Each call is timed (wall, and the server
   process's CPU from ``/proc/PID/stat``); building the documents is not timed.
2. **Per-operation costs** at :data:`SMALL_N` documents (measured when the seeding reaches it,
   then the seeding goes on) and at N, best of :data:`REPEATS` rounds (the operations take turns
   within a round), with the server's CPU during each: see :data:`OPERATIONS`.
3. **Memory.** The server process's ``VmRSS`` (``/proc/PID/status``) before the first insert,
   at :data:`SMALL_N` and at N (each read right after the seeding reached that size).
4. **The ``--path`` (SQLite) mode**, on a fresh server with a data file in a temporary
   directory, at small sizes only: :data:`SQLITE_BATCH`-document batches up to
   :data:`SQLITE_SIZES`, the range read and the ``bulk_write`` at each size; stopped early (with
   a note) when a step would start after :data:`SQLITE_BUDGET` seconds or a batch took more
   than :data:`SQLITE_STEP_LIMIT`.

``--quick`` changes N and nothing else. The section always starts its own servers (it reads
their memory): ``MIGRONAUT_BENCH_URI`` is not used.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED_BATCH = 10_000
FULL_N = 1_000_000
QUICK_N = 100_000
SMALL_N = 10_000
REPEATS = 3
RANGE_LIMIT = 1_000
BULK_OPS = 1_000
POINT_OPS = 100
SAMPLE_SIZE = 100

#: the server CPU of an operation summed over its rounds must reach this (3 clock ticks) to be
#: shown: /proc counts CPU in ticks of 10 ms
CPU_RATIO_FLOOR = 0.03
SEED_TOTAL_TARGET_S = 90.0  # at FULL_N
FLAT_TARGET = 1.5  # last batch / first batch, and each operation at N / at SMALL_N
MEMORY_TARGET_BYTES = 1024 ** 3  # RSS at FULL_N

#: the SQLite mode's insert costs grow with the collection (≈ 30-40 ms a document into 250-500
#: documents, ≈ 70-80 ms into 1,250-1,500 on a shared 2-CPU machine), so seeding to 1,500 takes
#: 1-1.5 minutes
SQLITE_BATCH = 250
SQLITE_SIZES = (750, 1_500)
SQLITE_BUDGET = 120.0  # no step starts after this many seconds of the SQLite part
SQLITE_STEP_LIMIT = 45.0  # a batch slower than this ends the SQLite part

#: (key, label) of the per-operation table, in its order
OPERATIONS = (
    ("range", f"`_id` range read, {RANGE_LIMIT:,} documents sorted on `_id` "
              f"(`find({{_id: {{$gte: x}}}}).sort(_id).limit({RANGE_LIMIT})`, x in the middle)"),
    ("bulk", f"`bulk_write` of {BULK_OPS:,} `UpdateOne({{_id}}, {{$set}})` (random `_id`s)"),
    ("find_one", f"`find_one` by `_id` ×{POINT_OPS} (random `_id`s)"),
    ("count", "`count_documents({})` (an `aggregate`: `$match` + `$group`)"),
    ("estimated", "`estimated_document_count()` (the `count` command)"),
    ("unindexed", "unindexed `find({tag: 3}).limit(10)` (1 document in 10 matches)"),
    ("delete", f"`delete_one` by `_id` ×{POINT_OPS} (random `_id`s; put back, not timed)"),
    ("sample", f"`aggregate([{{$sample: {{size: {SAMPLE_SIZE}}}}}])` (the background planner's "
               f"draw)"),
    ("first_match", "`count_documents({tag: 3}, limit=1)` (the background planner's completion "
                    "check, when documents are left)"),
)
OPERATION_KEYS = tuple(key for key, _ in OPERATIONS)

Log = Callable[[str], None]


# ------------------------------------------------------------------------------ the documents


class Ids:
    """The ``_id``s inserted so far, in insertion order, 12 bytes each (a million ObjectIds as
    Python objects would cost the bench ~100 MB)."""

    def __init__(self) -> None:
        self._raw = bytearray()

    def __len__(self) -> int:
        return len(self._raw) // 12

    def add(self, oid: Any) -> None:
        self._raw += oid.binary

    def __getitem__(self, index: int) -> Any:
        from bson import ObjectId

        return ObjectId(bytes(self._raw[index * 12:index * 12 + 12]))


def make_batch(ids: Ids, start: int, count: int) -> list[dict[str, Any]]:
    from bson import ObjectId

    docs = []
    for n in range(start, start + count):
        oid = ObjectId()
        ids.add(oid)
        docs.append({"_id": oid, "n": n, "s": f"{n:010d}" * 4, "tag": n % 10})
    return docs


def bson_size(docs: list[dict[str, Any]]) -> float:
    import bson

    return statistics.fmean(len(bson.encode(doc)) for doc in docs)


# ------------------------------------------------------------------------------ the server process


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes (empty where /proc is not readable)."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (``/proc/PID/stat``), None when unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# ------------------------------------------------------------------------------ measuring


class Timer:
    """Times a call (wall) and the server process's CPU during it (``/proc/PID/stat``, in clock
    ticks of 10 ms: meaningful summed over several calls, not for one short call)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.last_cpu: float | None = None

    def __call__(self, call: Callable[..., Any], *args: Any) -> tuple[float, Any]:
        cpu_before = proc_cpu(self.pid) if self.pid is not None else None
        started = time.perf_counter()
        result = call(*args)
        elapsed = time.perf_counter() - started
        cpu_after = proc_cpu(self.pid) if self.pid is not None else None
        self.last_cpu = (cpu_after - cpu_before
                         if cpu_before is not None and cpu_after is not None else None)
        return elapsed, result


def _range(coll: Any, x: Any) -> list[Any]:
    return list(coll.find({"_id": {"$gte": x}}).sort("_id", 1).limit(RANGE_LIMIT))


def _find_each(coll: Any, wanted: list[Any]) -> list[Any]:
    return [coll.find_one({"_id": oid}) for oid in wanted]


def _delete_each(coll: Any, wanted: list[Any]) -> list[Any]:
    return [coll.delete_one({"_id": oid}) for oid in wanted]


def _unindexed(coll: Any) -> list[Any]:
    return list(coll.find({"tag": 3}).limit(10))


def _first_match(coll: Any) -> int:
    return int(coll.count_documents({"tag": 3}, limit=1))


def _sample(coll: Any) -> list[Any]:
    return list(coll.aggregate([{"$sample": {"size": SAMPLE_SIZE}}]))


def measure_operations(coll: Any, ids: Ids, rng: random.Random, serial: list[int],
                       pid: int | None,
                       keys: tuple[str, ...] = OPERATION_KEYS) -> dict[str, Any]:
    """Each operation of ``keys`` ``REPEATS`` times, taking turns; every timing (seconds) and
    the best, with what each returned (checked: a wrong answer is noted, not hidden). An
    operation the server refuses is reported as its error and not tried again."""
    timer = Timer(pid)
    times: dict[str, list[float]] = {key: [] for key in keys}
    cpus: dict[str, list[float | None]] = {key: [] for key in keys}
    problems: list[str] = []
    returned: dict[str, int] = {}
    errors: dict[str, str] = {}
    for _ in range(REPEATS):
        for key in keys:
            if key in errors:
                continue
            try:
                times[key].append(_operation(key, coll, ids, rng, serial, problems, returned,
                                             timer))
                cpus[key].append(timer.last_cpu)
            except Exception as error:  # the server refused it: a figure of its own
                detail = str(error).split(", full error:")[0]  # pymongo repeats the reply
                frame = traceback.extract_tb(error.__traceback__)[-1]
                errors[key] = (f"{type(error).__name__}: {detail} (raised at "
                               f"{Path(frame.filename).name}:{frame.lineno})")
    out: dict[str, Any] = {}
    for key, values in times.items():
        known = [cpu for cpu in cpus[key] if cpu is not None]
        out[key] = {"best": min(values) if values else None, "all": values,
                    "server_cpu": (sum(known) / len(known)
                                   if known and len(known) == len(cpus[key]) else None),
                    "returned": returned.get(key)}
        if key in errors:
            out[key]["error"] = errors[key]
    if problems:
        out["problems"] = sorted(set(problems))
    return out


def _operation(key: str, coll: Any, ids: Ids, rng: random.Random, serial: list[int],
               problems: list[str], returned: dict[str, int], timed: Timer) -> float:
    """One timed run of the operation ``key``; what it returned goes to ``returned``."""
    from pymongo import UpdateOne
    from pymongo.errors import BulkWriteError

    size = len(ids)
    if key == "range":
        x = ids[size // 2]
        elapsed, docs = timed(_range, coll, x)
        returned[key] = len(docs)
        want = min(RANGE_LIMIT, size - size // 2)
        if len(docs) != want or docs[0]["_id"] != x:
            problems.append(f"range read returned {len(docs)} documents, expected {want}")
    elif key == "bulk":
        serial[0] += 1
        # fewer documents than operations (the SQLite part): some _ids twice
        picked = (rng.sample(range(size), BULK_OPS) if size >= BULK_OPS
                  else rng.choices(range(size), k=BULK_OPS))
        requests = [UpdateOne({"_id": ids[i]}, {"$set": {"u": serial[0]}}) for i in picked]
        elapsed, result = timed(coll.bulk_write, requests)
        returned[key] = result.modified_count
        if result.matched_count != BULK_OPS or result.modified_count != len(set(picked)):
            problems.append(f"bulk_write matched {result.matched_count}, modified "
                            f"{result.modified_count} of {BULK_OPS} operations on "
                            f"{len(set(picked))} documents")
    elif key == "find_one":
        wanted = [ids[i] for i in rng.sample(range(size), POINT_OPS)]
        elapsed, found = timed(_find_each, coll, wanted)
        returned[key] = sum(doc is not None for doc in found)
        if returned[key] != POINT_OPS:
            problems.append(f"find_one found {returned[key]} of {POINT_OPS}")
    elif key in ("count", "estimated"):
        call = coll.count_documents if key == "count" else coll.estimated_document_count
        elapsed, count = timed(call, *([{}] if key == "count" else []))
        returned[key] = count
        if count != size:
            problems.append(f"{call.__name__} gave {count}, expected {size}")
    elif key == "unindexed":
        elapsed, docs = timed(_unindexed, coll)
        returned[key] = len(docs)
        if len(docs) != 10:
            problems.append(f"unindexed find returned {len(docs)} documents")
    elif key == "delete":
        wanted = [ids[i] for i in rng.sample(range(size), POINT_OPS)]
        kept = list(coll.find({"_id": {"$in": wanted}}))
        try:
            elapsed, results = timed(_delete_each, coll, wanted)
        finally:  # put back: the next figures see the same collection
            try:
                coll.insert_many(kept, ordered=False)
            except BulkWriteError:  # some were not deleted (an error above): already there
                pass
        returned[key] = sum(r.deleted_count for r in results)
        if returned[key] != POINT_OPS:
            problems.append(f"delete_one deleted {returned[key]} of {POINT_OPS}")
    elif key == "sample":
        elapsed, docs = timed(_sample, coll)
        returned[key] = len({doc["_id"] for doc in docs})
        if returned[key] != min(SAMPLE_SIZE, size):
            problems.append(f"$sample returned {returned[key]} distinct documents")
    elif key == "first_match":
        elapsed, count = timed(_first_match, coll)
        returned[key] = count
        if count != 1:
            problems.append(f"count_documents with limit=1 gave {count}")
    else:  # pragma: no cover - a key of OPERATIONS without a branch
        raise ValueError(key)
    return elapsed


def measure_memory_server(process: Any, n: int, log: Log) -> dict[str, Any]:
    """Seeding, operations and memory on one in-memory server (already started)."""
    from pymongo import MongoClient

    pid = process.pid
    ids = Ids()
    rng = random.Random(20261203)
    serial = [0]
    timer = Timer(pid)
    figures: dict[str, Any] = {"n": n, "batch": SEED_BATCH, "pid": pid, "batches": []}
    client: Any
    with MongoClient(process.uri, serverSelectionTimeoutMS=10_000) as client:
        client.admin.command("ping")
        coll = client.bench_devserver.docs
        coll.drop()
        figures["memory_empty"] = proc_status(pid)
        sizes: list[float] = []
        seeded_started = time.perf_counter()
        while len(ids) < n:
            docs = make_batch(ids, len(ids), min(SEED_BATCH, n - len(ids)))
            if len(sizes) < 2 or len(ids) == n:  # the first and the last batch
                sizes.append(bson_size(docs))
            elapsed, _ = timer(coll.insert_many, docs)
            figures["batches"].append({"docs": len(docs), "seconds": elapsed,
                                       "server_cpu": timer.last_cpu})
            done = len(ids)
            if done % (n // 10 or 1) == 0 or done == SMALL_N:
                log(f"devserver: {done:,} documents ({elapsed:.2f} s for the last "
                    f"{len(docs):,})")
            if done == SMALL_N:
                figures["memory_small"] = proc_status(pid)
                log(f"devserver: operations at {SMALL_N:,}")
                figures["ops_small"] = measure_operations(coll, ids, rng, serial, pid)
        figures["seed_wall"] = time.perf_counter() - seeded_started
        figures["memory_n"] = proc_status(pid)
        log(f"devserver: operations at {n:,}")
        figures["ops_n"] = measure_operations(coll, ids, rng, serial, pid)
        figures["final_count"] = coll.estimated_document_count()
        figures["bson_size"] = statistics.fmean(sizes)
    figures["memory_end"] = proc_status(pid)
    return figures


def measure_sqlite(start_subprocess: Callable[..., Any], log: Log) -> dict[str, Any]:
    """The ``--path`` mode on a fresh server and data file: seeding batch by batch up to
    ``SQLITE_SIZES[-1]``, the range read and the ``bulk_write`` at each of ``SQLITE_SIZES``."""
    from pymongo import MongoClient

    figures: dict[str, Any] = {"batch": SQLITE_BATCH, "sizes": list(SQLITE_SIZES), "steps": [],
                               "stopped": None}
    started = time.perf_counter()
    ids = Ids()
    rng = random.Random(20261204)
    serial = [0]
    with tempfile.TemporaryDirectory(prefix="migronaut-bench-sqlite-") as tmp:
        path = str(Path(tmp) / "devserver.sqlite")
        process = start_subprocess(path=path)
        timer = Timer(process.pid)
        try:
            client: Any
            with MongoClient(process.uri, serverSelectionTimeoutMS=10_000) as client:
                coll = client.bench_devserver.docs
                coll.drop()
                while len(ids) < SQLITE_SIZES[-1]:
                    if time.perf_counter() - started > SQLITE_BUDGET:
                        figures["stopped"] = (f"stopped at {len(ids):,} documents: the SQLite "
                                              f"part had run {SQLITE_BUDGET:.0f} s")
                        break
                    docs = make_batch(ids, len(ids), SQLITE_BATCH)
                    elapsed, _ = timer(coll.insert_many, docs)
                    step: dict[str, Any] = {"size": len(ids), "docs": len(docs),
                                            "seconds": elapsed, "server_cpu": timer.last_cpu}
                    figures["steps"].append(step)
                    log(f"devserver --path: {len(ids):,} documents ({elapsed:.1f} s for the last "
                        f"{len(docs):,})")
                    if elapsed > SQLITE_STEP_LIMIT:
                        figures["stopped"] = (f"stopped at {len(ids):,} documents: a batch of "
                                              f"{len(docs):,} took {elapsed:.0f} s (over "
                                              f"{SQLITE_STEP_LIMIT:.0f} s)")
                        break
                    if len(ids) in SQLITE_SIZES:
                        if time.perf_counter() - started > SQLITE_BUDGET:
                            figures["stopped"] = (f"operations at {len(ids):,} not measured: "
                                                  f"the SQLite part had run "
                                                  f"{SQLITE_BUDGET:.0f} s")
                            break
                        step["ops"] = measure_operations(coll, ids, rng, serial,
                                                         process.pid, ("range", "bulk"))
        finally:
            process.close()
    figures["seconds"] = time.perf_counter() - started
    return figures


# ------------------------------------------------------------------------------ tables


def ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 1000 \
        else f"{value:,.0f} ms"


def _op_cell(figure: dict[str, Any]) -> str:
    if figure["best"] is None:
        return f"fails ({figure.get('error', '?').split(':')[0]})"
    return ms(figure["best"]) + (" (then fails)" if "error" in figure else "")


def _cpu_cell(figure: dict[str, Any]) -> str:
    cpu = figure.get("server_cpu")
    if cpu is None or figure["best"] is None:
        return "—"
    if cpu * len(figure["all"]) < CPU_RATIO_FLOOR:  # under 3 clock ticks in all
        return f"< {CPU_RATIO_FLOOR / len(figure['all']) * 1000:.0f} ms"
    return ms(cpu)


def mib(value: float | None) -> str:
    return "?" if value is None else f"{value / 1024 / 1024:,.0f} MiB"


def tables(figures: dict[str, Any], quick: bool
           ) -> tuple[list[tuple[str, tuple[str, ...], list[list[str]]]], list[str]]:
    """Each table as (title, headers, lines), and the notes."""
    memory = figures["memory"]
    n = memory["n"]
    full = n >= FULL_N
    notes: list[str] = []
    out: list[tuple[str, tuple[str, ...], list[list[str]]]] = []

    # -- seeding
    batches = memory["batches"]
    total = sum(b["seconds"] for b in batches)
    cpu_values = [b["server_cpu"] for b in batches if b["server_cpu"] is not None]
    server_cpu = sum(cpu_values) if len(cpu_values) == len(batches) else None
    first, last = batches[0], batches[-1]
    flat = last["seconds"] / first["seconds"]
    slowest = max(range(len(batches)), key=lambda i: batches[i]["seconds"])
    per_doc = total / n * 1e6
    projected = per_doc * FULL_N / 1e6
    if full:
        total_met = "yes" if total <= SEED_TOTAL_TARGET_S else "NO"
    else:
        total_met = (f"not judged (N = {n:,}); linear projection to {FULL_N:,}: "
                     f"{projected:.0f} s")
    lines = [
        ["documents inserted (batches)", f"{n:,} ({len(batches)} × {SEED_BATCH:,})", "", ""],
        ["total time in `insert_many` (wall)", f"{total:.1f} s",
         f"≤ {SEED_TOTAL_TARGET_S:.0f} s at {FULL_N:,}", total_met],
        ["… server process CPU (/proc/PID/stat)",
         f"{server_cpu:.1f} s" if server_cpu is not None else "?", "", ""],
        ["µs per document", f"{per_doc:.1f} µs", "", ""],
        [f"first {SEED_BATCH:,} (wall / server CPU)",
         f"{first['seconds']:.2f} s / {first['server_cpu'] or 0:.2f} s", "", ""],
        [f"last {SEED_BATCH:,} (wall / server CPU)",
         f"{last['seconds']:.2f} s / {last['server_cpu'] or 0:.2f} s", "", ""],
        ["last ÷ first (wall)", f"{flat:.2f}×", f"≤ {FLAT_TARGET}×",
         "yes" if flat <= FLAT_TARGET else "NO"],
        ["last ÷ first (server CPU: what machine load does not stretch)",
         f"{last['server_cpu'] / first['server_cpu']:.2f}×"
         if first["server_cpu"] and last["server_cpu"] is not None else "?", "", ""],
        [f"median {SEED_BATCH:,}-document batch (wall)",
         f"{statistics.median(b['seconds'] for b in batches):.2f} s", "", ""],
        ["slowest batch (wall)", f"{batches[slowest]['seconds']:.2f} s (batch {slowest + 1} of "
         f"{len(batches)})", "", ""],
    ]
    out.append((f"Seeding: insert_many of {SEED_BATCH:,} documents per call up to {n:,}",
                ("Figure", "Measured", "Target", "Met"), lines))

    # -- operations
    small, large = memory["ops_small"], memory["ops_n"]
    lines = []
    for key, label in OPERATIONS:
        a, b = small[key]["best"], large[key]["best"]
        cells = [_op_cell(small[key]), _op_cell(large[key])]
        cpu_a, cpu_b = small[key]["server_cpu"], large[key]["server_cpu"]
        cpu_cells = [_cpu_cell(small[key]), _cpu_cell(large[key])]
        cpu_ratio = (f"{cpu_b / cpu_a:.2f}×" if cpu_a and cpu_b is not None
                     and min(cpu_a, cpu_b) * REPEATS >= CPU_RATIO_FLOOR else "—")
        if a is not None and b is not None:
            ratio = b / a
            lines.append([label, *cells, f"{ratio:.2f}×", *cpu_cells, cpu_ratio,
                          f"≤ {FLAT_TARGET}×", "yes" if ratio <= FLAT_TARGET else "NO"])
        else:
            lines.append([label, *cells, "—", *cpu_cells, "—", f"≤ {FLAT_TARGET}×",
                          "NO (fails)"])
        for where, figure in ((f"{SMALL_N:,}", small[key]), (f"{n:,}", large[key])):
            if "error" in figure:
                notes.append(f"{key} at {where} documents failed: {figure['error']}")
    out.append((f"Per operation, best of {REPEATS} (wall), at {SMALL_N:,} and at {n:,} documents",
                ("Operation", f"at {SMALL_N:,}", f"at {n:,}", f"{n:,} ÷ {SMALL_N:,}",
                 f"server CPU at {SMALL_N:,}", f"at {n:,}", "÷", "Target (wall)", "Met"),
                lines))
    for label, ops in (("at " + f"{SMALL_N:,}", small), (f"at {n:,}", large)):
        for problem in ops.get("problems", []):
            notes.append(f"WRONG ANSWER {label}: {problem}")
        notes.append(f"every timing {label} (ms): " + "; ".join(
            f"{key} " + (", ".join(f"{s * 1000:.1f}" for s in ops[key]["all"]) or "—")
            for key, _ in OPERATIONS))

    # -- memory
    empty = memory["memory_empty"].get("VmRSS")
    at_small = memory["memory_small"].get("VmRSS")
    at_n = memory["memory_n"].get("VmRSS")
    bson = memory["bson_size"]
    lines = []
    per_small = per_n = None
    if empty is not None and at_small is not None and at_n is not None:
        per_small = (at_small - empty) / SMALL_N
        per_n = (at_n - empty) / n
        if full:
            met = "yes" if at_n < MEMORY_TARGET_BYTES else "NO"
        else:
            estimate = empty + per_n * FULL_N
            met = (f"not judged (N = {n:,}); linear projection to {FULL_N:,}: "
                   f"{mib(estimate)}")
        lines = [
            ["RSS of the server, empty (before the first insert)", mib(empty), "", ""],
            [f"RSS at {SMALL_N:,} documents", mib(at_small), "", ""],
            [f"RSS at {n:,} documents", mib(at_n), f"< 1 GiB at {FULL_N:,}", met],
            [f"peak RSS (VmHWM) after the operations at {n:,}",
             mib(memory["memory_end"].get("VmHWM")), "", ""],
            [f"bytes per stored document, (RSS at {SMALL_N:,} − empty) / {SMALL_N:,}",
             f"{per_small:,.0f} B", "", ""],
            [f"bytes per stored document, (RSS at {n:,} − empty) / {n:,}", f"{per_n:,.0f} B",
             "", ""],
            ["average BSON size of a document (`len(bson.encode(doc))`)", f"{bson:.0f} B", "",
             ""],
            ["stored ÷ BSON", f"{per_n / bson:.1f}×", "", ""],
        ]
    else:
        notes.append("memory: /proc/PID/status was not readable (not Linux?)")
    out.append(("Memory of the server process (VmRSS, /proc/PID/status)",
                ("Figure", "Measured", "Target", "Met"), lines))

    # -- sqlite
    sqlite = figures["sqlite"]
    lines = []
    cumulative = 0.0
    for step in sqlite["steps"]:
        cumulative += step["seconds"]
        ops = step.get("ops") or {}
        lines.append([
            f"{step['size']:,}", f"{step['seconds']:.1f} s",
            f"{step['seconds'] / step['docs'] * 1000:.1f} ms", f"{cumulative:.1f} s",
            (_op_cell(ops["range"]) + (f" ({ops['range']['returned']:,} docs)"
                                        if ops["range"]["best"] is not None else ""))
            if ops else "",
            _op_cell(ops["bulk"]) if ops else "",
        ])
        for key in ("range", "bulk"):
            if "error" in ops.get(key, {}):
                notes.append(f"--path: {key} at {step['size']:,} failed: {ops[key]['error']}")
        for problem in ops.get("problems", []):
            notes.append(f"WRONG ANSWER with --path at {step['size']:,}: {problem}")
    out.append((f"The --path (SQLite) mode: batches of {SQLITE_BATCH:,}, operations best of "
                f"{REPEATS}",
                ("Documents", f"last {SQLITE_BATCH:,} inserted", "ms per document of that batch",
                 "seeding so far", "range read (returned)", f"bulk_write of {BULK_OPS:,}"),
                lines))
    if sqlite.get("stopped"):
        notes.append(f"--path: {sqlite['stopped']}")
    notes.append(f"--path part: {sqlite['seconds']:.0f} s in all (bounds: no step starts after "
                 f"{SQLITE_BUDGET:.0f} s, a batch over {SQLITE_STEP_LIMIT:.0f} s ends it)")

    notes[:0] = [
        f"one in-memory dev server for the whole run (`start_subprocess()`, pid {memory['pid']}); "
        f"the operations at {SMALL_N:,} ran when the seeding reached {SMALL_N:,}, then the seeding "
        f"went on in the same collection; `delete_one` rows put their documents back (not timed), "
        f"so every figure sees {SMALL_N:,} or {n:,} documents "
        f"(final `estimated_document_count()`: {memory['final_count']:,})",
        f"documents: {{_id: ObjectId(), n: int, s: 40 characters, tag: n % 10}}, "
        f"{memory['bson_size']:.0f} bytes of BSON; ObjectIds from pymongo, so `_id` order is "
        f"insertion order, as with one client's ObjectIds",
        f"seeding: wall of each `insert_many` (default options, pymongo's BSON encoding included, "
        f"building the documents not); the whole loop took {memory['seed_wall']:.1f} s with the "
        f"documents' building and the operations at {SMALL_N:,}",
        f"operations: {REPEATS} rounds, the {len(OPERATIONS)} operations in turn in each round, "
        "the best wall of each reported (the target is judged on it) and the server process's "
        f"CPU during it, the mean of the {REPEATS} rounds (/proc/PID/stat counts in 10 ms ticks, "
        "so short operations show as '< 10 ms'; CPU is not stretched by other work on the "
        "machine as wall time is); `bulk_write` ordered (the default), each round a new `$set` "
        "value so every document is modified",
        "the --path (SQLite) part ran after the in-memory server was closed, on a fresh server "
        "and data file (in a temporary directory); it is known to be much slower. Its range read "
        "starts in the middle as above (so it returns half the collection), and below "
        f"{BULK_OPS:,} documents its `bulk_write` of {BULK_OPS:,} updates some `_id`s twice",
    ]
    if quick:
        notes.insert(0, f"--quick: N = {n:,} instead of {FULL_N:,}; nothing else differs")
    return out, notes


def render(title: str, headers: tuple[str, ...], lines: list[list[str]], markdown: bool,
           grid: Callable[[tuple[str, ...], list[list[str]]], tuple[str, str]]) -> str:
    if not lines:
        return f"{title}: not measured"
    plain, table = grid(headers, lines)
    return f"**{title}**\n\n{table}" if markdown else f"[{title}]\n{plain}"

