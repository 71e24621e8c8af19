"""``bench/run.py --converge``: the converge section's measurement and its table.

Speed: migronaut's ``converge`` (first run, in-sync run, in-sync ``--check``) beside
Beanie's ``init_beanie`` and MongoEngine's ``ensure_indexes`` doing the same index work on the
same collections (``bench/_converge_scenarios.py``), each tool in a fresh process against a
fresh database: wall, client CPU and the commands sent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (tool, pass) rows in table order; the tool's label and its driver name
TOOLS = (("migronaut `converge`", "migronaut"), ("Beanie `init_beanie`", "beanie"),
         ("MongoEngine `ensure_indexes`", "mongoengine"))
PASSES = {"migronaut": ("first run", "in-sync run", "in-sync --check"),
          "beanie": ("first run", "in-sync run"), "mongoengine": ("first run", "in-sync run")}
HEADERS = ("Tool", "Pass", "wall", "client CPU", "× migronaut CPU", "commands", "connections",
           "what was sent")


def measure_converge(run_driver: Callable[..., dict[str, Any]], me: Path, uri: str,
                     n: int) -> dict[str, Any]:
    """Each tool in its own fresh process on its own fresh database."""
    return {tool: run_driver(me, "converge", uri, n, 1, 900.0, extra={"tool": tool})
            for _, tool in TOOLS}


def _sent(commands: list[list[Any]]) -> str:
    by_name: dict[str, int] = {}
    for name, _, count in commands:
        by_name[name] = by_name.get(name, 0) + count
    return ", ".join(f"{name} ×{count}" for name, count in
                     sorted(by_name.items(), key=lambda item: (-item[1], item[0])))


def converge_table(figures: dict[str, Any], n: int) -> tuple[list[list[str]], list[str]]:
    """The table's rows (under :data:`HEADERS`) and its notes."""
    ours = figures.get("migronaut", {})
    lines: list[list[str]] = []
    for label, tool in TOOLS:
        result = figures.get(tool, {})
        if "error" in result:
            lines.append([label, f"failed: {result['error']}"[:80], *[""] * 6])
            continue
        for step in PASSES[tool]:
            figure = result[step]
            base = ours.get("in-sync run" if step.startswith("in-sync") else step, {})
            ratio = (f"{figure['cpu_seconds'] / base['cpu_seconds']:.2f}×"
                     if base.get("cpu_seconds") else "—")
            commands = figure.get("commands", [])
            lines.append([label, step, f"{figure['seconds'] * 1000:.0f} ms",
                          f"{figure['cpu_seconds'] * 1000:.0f} ms", ratio,
                          str(sum(count for _, _, count in commands)),
                          str(figure.get("connections", 0)), _sent(commands)])
    notes = [f"{n} collections, each declaring {{a: 1}}, {{b: 1, c: -1}} and {{d: 1}} unique; "
             "each tool runs in a fresh process against a fresh database; every pass builds "
             "its own client inside the timed block; imports and model classes are not timed",
             "× migronaut CPU: client CPU over migronaut's `converge` pass of the same kind "
             "(first run / in-sync run); migronaut's `--check` row is over its in-sync run",
             "commands are pymongo `CommandStartedEvent`s of the tool's own client; connection "
             "handshakes are not commands"]
    for _, tool in TOOLS:
        found = figures.get(tool, {}).get("indexes_after")
        if found is not None and found != 3 * n:
            notes.append(f"WARNING: {tool} left {found} indexes, not {3 * n}")
    return lines, notes
