"""Progress of background migrations as ``background progress --json`` and ``background status
--partitions --json`` print it: pure shaping of the engine's views, no I/O.

The CLI and the dashboard both build their JSON from here, so their shapes cannot drift. A
partition scope is shown by its type bracket only, never its bounds (they are ``_id`` values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TERMINAL", "ProgressTracker", "number", "partition_json", "scope_json"]

#: Statuses a migration does not leave by itself.
TERMINAL = ("completed", "failed", "cancelled")


def scope_json(scope: Mapping[str, Any] | None, group_name: str | None = None) -> dict[str, Any]:
    """A partition scope without its bounds (they are ``_id`` values)."""
    scope = scope or {}
    out: dict[str, Any] = {"kind": scope.get("kind")}
    if scope.get("bracket"):
        out["bracket"] = scope["bracket"]
    if group_name:
        out["group"] = group_name
    return out


def partition_json(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    out["scope"] = scope_json(row.get("scope"), row.get("group"))
    return out


def number(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass
class _Rate:
    at: float
    scanned: int
    rate: float | None = None


class ProgressTracker:
    """Per-tick progress of background migrations: done, rate, ETA, lanes, failures.

    ``done`` counts the documents read in the current pass (against the plan's estimate); the
    rate is a smoothed rate of documents read, across passes.
    """

    SMOOTHING = 0.5

    def __init__(self) -> None:
        self._last: dict[str, _Rate] = {}

    def migration(self, view: Mapping[str, Any], partitions: Sequence[Mapping[str, Any]],
                  now: float) -> dict[str, Any]:
        name = str(view.get("migration"))
        generation = view.get("generation")
        current = [p for p in partitions if p.get("generation") == generation]
        plan = view.get("plan") or {}
        estimate = number(plan.get("estimate"))
        status = str(view.get("status"))
        totals = view.get("totals") or {}
        scanned = number(totals.get("scanned")) + number(totals.get("processed"))
        if current or status not in TERMINAL:
            done = sum(number((p.get("counters") or {}).get("scanned")) +
                       number((p.get("counters") or {}).get("processed")) for p in current)
        else:  # a settled migration shown without its partitions: what its passes read
            done = scanned
        last = self._last.get(name)
        rate = last.rate if last else None
        if last is not None and now > last.at and scanned >= last.scanned:
            instant = (scanned - last.scanned) / (now - last.at)
            rate = instant if rate is None else \
                self.SMOOTHING * instant + (1 - self.SMOOTHING) * rate
        self._last[name] = _Rate(now, scanned, rate)
        if status == "completed":
            percent: float | None = 100.0
        elif estimate:
            percent = min(100.0, 100.0 * done / estimate)
        else:
            percent = None
        eta = None
        if status != "running":
            rate = None  # a rate only means something while lanes work
        elif rate and estimate:
            eta = max(0.0, (estimate - done) / rate)
        counts = view.get("partitions") or {}
        row: dict[str, Any] = {
            "migration": name,
            "status": status,
            "phase": view.get("phase"),
            "pass": view.get("pass", 0),
            "generation": generation,
            "collection": view.get("collection"),
            "done": done,
            "estimate": estimate,
            "percent": None if percent is None else round(percent, 1),
            "migrated": number(totals.get("migrated")),
            "rate": None if rate is None else round(rate, 1),
            "etaSeconds": None if eta is None else round(eta, 1),
            "liveLeases": view.get("liveLeases", 0),
            "maxParallel": view.get("maxParallel", 1),
            "failedDocuments": view.get("failedDocuments", 0),
            "failedPartitions": number(counts.get("failed")),
            "sliceFailures": sum(number(p.get("failures")) for p in current),
            "partitions": [self._partition(p) for p in current],
        }
        if plan.get("atLeast"):
            row["atLeast"] = True
        if view.get("lastError"):
            row["lastError"] = view["lastError"]
        return row

    @staticmethod
    def _partition(p: Mapping[str, Any]) -> dict[str, Any]:
        counters = p.get("counters") or {}
        done = number(counters.get("scanned")) + number(counters.get("processed"))
        estimate = number(p.get("estimate"))
        status = p.get("status")
        if status == "done":
            percent: float | None = 100.0
        else:
            percent = round(min(100.0, 100.0 * done / estimate), 1) if estimate else None
        row: dict[str, Any] = {
            "id": p.get("id"), "seq": p.get("seq"), "status": status,
            "scope": scope_json(p.get("scope"), p.get("group")), "done": done,
            "estimate": estimate, "percent": percent,
            "migrated": number(counters.get("migrated")),
            "failures": number(p.get("failures")), "claims": p.get("claims", 0),
        }
        if p.get("lease"):
            row["lease"] = p["lease"]
        if p.get("lastError"):
            row["lastError"] = p["lastError"]
        return row
