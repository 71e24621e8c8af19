"""Before/after of a whole background migration's client CPU, interleaved in one run.

    .venv-3.13/bin/python bench/ab_background.py --before DIR [--rounds R] [--docs N]
        [--lanes L ...] [--passes P]

``DIR`` is a ``src`` directory of the engine to compare with (e.g. ``git archive <rev> src | tar
-x -C /tmp/before`` then ``--before /tmp/before/src``); "after" is this tree's ``src``. One dev
server, one database seeded once with N documents (and the version index); each round runs, in
fresh processes and in turn, the engine before, the engine after (each lane count) and the
hand-written loop, ``P`` passes each (``bench/_driver.py``'s ``_engine_pass`` / ``_loop_pass``;
the collection is reset after every pass) and keeps each process's median pass. On a shared
machine the load moves between rounds, so the ratios are taken per round (engine / the loop of
the same round) and their median printed, with the calling thread's CPU in ``drive`` and the
commands ``drive`` sent, which do not depend on load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

PASS = """
import json, statistics, sys, tempfile
sys.path.insert(0, {bench!r})
import _driver as d
uri, db, variant, lanes, passes, n, batch = sys.argv[1:8]
if variant != "loop":
    import migronaut.api  # noqa: F401
    import migronaut.background.engine  # noqa: F401
    import migronaut.background.lanes.slices  # noqa: F401
run = d._loop_pass if variant == "loop" else d._engine_pass
out = []
for _ in range(int(passes)):
    with tempfile.TemporaryDirectory() as tmp:
        spec = {{"uri": uri, "db": db, "workdir": tmp, "lanes": int(lanes),
                 "batch_size": int(batch), "n": int(n)}}
        trace = d.Trace(d.BG_COLLECTION, int(batch))
        result = run(spec, trace, memory=False)
        check = d.background_check(uri, db, int(n))
        assert check["verified"], check
        d.background_reset(uri, db)
        out.append({{"cpu": result["cpu"], "caller": result.get("caller_cpu", 0.0),
                     "commands": (result.get("drive") or {{}}).get("total", 0)}})
print(json.dumps({{k: statistics.median(p[k] for p in out) for k in out[0]}}))
"""


def seed(uri: str, db_name: str, n: int) -> None:
    from pymongo import ASCENDING, MongoClient

    with MongoClient(uri) as client:
        coll = client[db_name]["docs"]
        for first in range(0, n, 500):
            coll.insert_many([{"x": i} for i in range(first, min(n, first + 500))],
                             ordered=False)
        coll.create_index([("__v", ASCENDING), ("_id", ASCENDING)])


def one(python: str, script: Path, src: str | None, argv: list[str]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(BENCH / "results" / "pycache")
    if src is not None:
        env["PYTHONPATH"] = src
    done = subprocess.run([python, str(script), *argv], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the src directory to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--lanes", type=int, nargs="+", default=[1])
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from migronaut.devserver import default_python, start_subprocess

    python = sys.executable
    server = start_subprocess(default_python())
    results: dict[str, list[dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="migronaut-ab-") as tmp:
            script = Path(tmp) / "pass.py"
            script.write_text(PASS.format(bench=str(BENCH)), encoding="utf-8")
            seed(server.uri, "ab", args.docs)
            common = [str(args.passes), str(args.docs), str(args.batch)]
            srcs = {"before": str(Path(args.before).resolve()), "after": str(ROOT / "src")}
            for round_ in range(args.rounds):
                for lanes in args.lanes:
                    for label, src in srcs.items():
                        results.setdefault(f"{label}, {lanes} lane(s)", []).append(one(
                            python, script, src,
                            [server.uri, "ab", "engine", str(lanes), *common]))
                results.setdefault("loop", []).append(
                    one(python, script, None, [server.uri, "ab", "loop", "1", *common]))
                shown = {k: round(v[-1]["cpu"] * 1000, 1) for k, v in results.items()}
                print(f"round {round_ + 1}: CPU ms {shown}", file=sys.stderr, flush=True)
    finally:
        server.close()
    loop = results.pop("loop")
    print(f"loop: median CPU {statistics.median(r['cpu'] for r in loop) * 1000:.1f} ms")
    for label, rows in results.items():
        ratios = [r["cpu"] / base["cpu"] for r, base in zip(rows, loop, strict=True)]
        print(f"{label}: CPU ratio to the loop, median {statistics.median(ratios):.2f} "
              f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}); median CPU "
              f"{statistics.median(r['cpu'] for r in rows) * 1000:.1f} ms, calling thread "
              f"{statistics.median(r['caller'] for r in rows) * 1000:.1f} ms, commands in "
              f"drive {statistics.median(r['commands'] for r in rows):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
