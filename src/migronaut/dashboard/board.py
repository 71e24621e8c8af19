"""What the dashboard shows, read through the public API (:class:`~migronaut.api.Migrator` and
its :class:`~migronaut.background.engine.BackgroundEngine`) and shaped like the CLI's ``--json``.

Invariant: every value leaving this module went through
:func:`~migronaut._json.json_document` — plain JSON values, dates as ISO text, every
string redacted of credentials — so a page or an endpoint cannot show a password stored in an
error, whatever the template does. Nothing here writes except :meth:`Board.control`, and nothing
is kept between calls: rates are derived from stored timestamps, never from earlier requests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut._json import iso, json_document
from migronaut.background.state.progress import TERMINAL, number, partition_json
from migronaut.observability.history import run_log_json

if TYPE_CHECKING:
    from migronaut import Migrator, StatusRow

__all__ = ["CONTROLS", "Board", "derived_progress", "failed_documents", "migration_counts",
           "throughput"]

#: The controls the dashboard offers (reference background §2.5), and the statuses each applies
#: from (a button is shown only where it would change something).
CONTROLS: Mapping[str, tuple[str, ...]] = {
    "pause": ("blocked", "pending", "running"),
    "resume": ("paused",),
    "cancel": ("blocked", "pending", "running", "paused"),
    "retry": ("failed", "cancelled"),
}
#: Runs listed on the overview.
OVERVIEW_RUNS = 10
#: Pending and failed migrations listed on the overview (the rest are counted).
OUTSTANDING_SHOWN = 50
#: Bars of the throughput chart.
THROUGHPUT_BARS = 24
#: Bad ids and errors shown on a migration's page (the state keeps ≤ 1001 and ≤ 20).
BAD_IDS_SHOWN = 100


def _parse(value: Any) -> dt.datetime | None:
    """An ISO text of :func:`iso` (or a datetime) back to an aware datetime."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str) and value:
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def failed_documents(view: Mapping[str, Any]) -> int:
    """Documents that failed so far: the distinct bad ids rolled up into the state, or — while
    the generation runs and they still sit on its partitions — the live ``failed`` counter of
    the partitions (what ``background status`` sums into ``totals``), whichever is larger. The
    page and ``/metrics`` both read this, so they cannot disagree."""
    return max(number(view.get("failedDocuments")),
               number((view.get("totals") or {}).get("failed")))


def derived_progress(view: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    """Progress bar, documents per second and ETA of one ``BackgroundStatus`` view.

    ``done`` is what the passes read (``totals.scanned`` + ``processed``, the unrolled
    generation included) against the current plan's estimate. The rate is the average since the
    migration started (``startedAt`` to ``lastProgressAt``, or now while it runs) — stored times
    only; the page's script replaces it with the rate between its own polls once it has two.

    An estimate that is a lower bound (``plan.atLeast``, as ``background progress`` prints
    ``≥N``), or one the reads have already passed, gives no percentage and no document ETA: the
    share is then the partitions done of the plan's (``partitionPercent``), labelled as such.
    """
    totals = view.get("totals") or {}
    done = number(totals.get("scanned")) + number(totals.get("processed"))
    plan = view.get("plan") or {}
    estimate = number(plan.get("estimate"))
    at_least = bool(plan.get("atLeast"))
    status = str(view.get("status"))
    known = bool(estimate) and not at_least and done <= estimate
    if status == "completed":
        percent: float | None = 100.0
    else:
        percent = round(100.0 * done / estimate, 1) if known else None
    counts = view.get("partitions") or {}
    parts_total = number(counts.get("total"))
    partition_percent = (round(100.0 * number(counts.get("done")) / parts_total, 1)
                         if parts_total and percent is None else None)
    started = _parse(view.get("startedAt"))
    until = _parse(view.get("completedAt")) or (now if status == "running" else
                                                _parse(view.get("lastProgressAt")))
    rate = None
    if started and until and until > started and done:
        rate = round(done / (until - started).total_seconds(), 1)
    eta = None
    if status == "running" and rate and known and done < estimate:
        eta = round((estimate - done) / rate, 1)
    return {"done": done, "estimate": estimate, "atLeast": at_least, "percent": percent,
            "partitionPercent": partition_percent, "rate": rate, "etaSeconds": eta,
            "migrated": number(totals.get("migrated")), "failed": failed_documents(view)}


def throughput(partitions: Sequence[Mapping[str, Any]], bars: int = THROUGHPUT_BARS,
               ) -> list[dict[str, Any]]:
    """Documents read over time, from the stored partitions only.

    Each partition's read count (``counters.scanned`` + ``processed``) is spread evenly over the
    time it was worked, ``startedAt`` to ``doneAt`` (still open: to its last checkpoint,
    ``updatedAt``); the spread is summed into ``bars`` equal spans from the first start to the
    last end. ``[{start, at (end of the span), seconds, documents, rate (documents per
    second)}]``; empty until
    something was read. Pauses inside a partition's interval are smoothed over — the stored
    counters have no finer grain.
    """
    worked: list[tuple[dt.datetime, dt.datetime, int]] = []
    for row in partitions:
        counters = row.get("counters") or {}
        read = number(counters.get("scanned")) + number(counters.get("processed"))
        end = _parse(row.get("doneAt")) or _parse(row.get("updatedAt"))
        if read and end:
            begin = _parse(row.get("startedAt")) or end
            worked.append((min(begin, end), end, read))
    if not worked:
        return []
    first = min(begin for begin, _, _ in worked)
    last = max(end for _, end, _ in worked)
    span = max((last - first).total_seconds(), 1.0) / bars
    buckets = [0.0] * bars
    for begin, end, read in worked:
        low = (begin - first).total_seconds() / span
        high = (end - first).total_seconds() / span
        if high - low < 1e-9:  # an instant: all of it in one span
            buckets[min(bars - 1, int(low))] += read
            continue
        for index in range(int(low), min(bars, int(high) + 1)):
            overlap = min(high, index + 1) - max(low, index)
            if overlap > 0:
                buckets[index] += read * overlap / (high - low)
    return [{"start": iso(first + dt.timedelta(seconds=span * i)),
             "at": iso(first + dt.timedelta(seconds=span * (i + 1))), "seconds": round(span, 3),
             "documents": round(documents, 1), "rate": round(documents / span, 1)}
            for i, documents in enumerate(buckets)]


def _union(lists: Sequence[Sequence[Any]]) -> list[Any]:
    """The items of ``lists`` in order, each once."""
    seen: set[str] = set()
    out = []
    for item in (i for items in lists for i in items):
        if repr(item) not in seen:
            seen.add(repr(item))
            out.append(item)
    return out


def migration_counts(rows: Sequence[StatusRow]) -> dict[str, int]:
    """Migrations by status (``applied``, ``pending``, ``failed``, ``running``, ``in-doubt``)."""
    counts = {"applied": 0, "pending": 0, "failed": 0, "running": 0, "in-doubt": 0}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return counts


class Board:
    """The dashboard's reads (and its one write, :meth:`control`) over one migrator."""

    def __init__(self, migrator: Migrator) -> None:
        self.migrator = migrator

    # -- the CLI's --json shapes ------------------------------------------------------------
    def status(self, *, checksums: bool = True) -> Any:
        """``migronaut status --json``: every migration (``checksums=False``: no file hashing,
        ``checksumOk`` left out — the overview and ``/metrics`` do not show it)."""
        return json_document(self.migrator.status("all", checksums=checksums))

    def lock(self) -> Any:
        """``migronaut lock --json``."""
        return json_document(self.migrator.lock_status().to_dict())

    def runs(self, limit: int = 20) -> Any:
        """``migronaut logs --json``."""
        return json_document([run.to_dict() for run in self.migrator.runs(limit)])

    def run_log(self, run_id: str) -> Any:
        """``migronaut logs RUN_ID --json`` (an unknown id is ``CONFIG_INVALID``, as there)."""
        return json_document(run_log_json(self.migrator.run_log(run_id)))

    def audit(self) -> Any:
        """``migronaut audit --json``."""
        return json_document(self.migrator.audit().to_dict())

    def drift(self) -> Any:
        """``migronaut converge --dry-run --json``: the declared collections' pending changes."""
        return json_document(self.migrator.converge(dry_run=True).to_dict())

    def converge_history(self, limit: int = 20) -> Any:
        """``migronaut converge --history --json``."""
        return json_document(list(self.migrator.converge_history(limit)))

    def background(self, name: str | None = None) -> Any:
        """``migronaut background status [NAME] --json`` — except that in the list a state
        migronaut cannot read is the row ``{migration, status: "invalid", error}`` and the
        others are shown (by name it is ``STATE_INVALID``, as in the CLI)."""
        views = self.migrator.background.status(name, invalid_rows=name is None)
        return json_document({"background": views})

    def partitions(self, name: str) -> Any:
        """``migronaut background status NAME --partitions --json``."""
        rows = self.migrator.background.partitions_view(name)
        return json_document({"partitions": [partition_json(row) for row in rows]})

    # -- pages ------------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        """Counts of the migrations, the lock, the last runs and every background migration."""
        rows = self.migrator.status("all", checksums=False)
        lock = self.migrator.lock_status()
        counts = migration_counts(rows)
        applied = [row for row in rows if row.status == "applied"]
        outstanding = [row for row in rows if row.status != "applied"]
        return {
            "counts": counts, "total": len(rows),
            # only the rows shown are shaped: on a 1,000-migration database the rest would cost
            # more than the reads
            "outstanding": json_document(outstanding[:OUTSTANDING_SHOWN]),
            "outstandingCount": len(outstanding),
            "recent": json_document(applied[-5:][::-1]),
            "lock": json_document(lock.to_dict()),
            "lockAgeSeconds": lock.held_for_s, "lockTtlSeconds": (lock.ttl_ms or 0) / 1000,
            "runs": self.runs(OVERVIEW_RUNS),
            **self.live(),
        }

    def live(self, name: str | None = None) -> dict[str, Any]:
        """The poll of a page: ``{at, background: [view + progress]}`` — one state read and
        three small aggregates per migration, whatever its number of partitions."""
        now = dt.datetime.now(dt.UTC)
        views = self.background(name)["background"]
        for view in views:
            view["progress"] = derived_progress(view, now)
            view["failedDocuments"] = view["progress"]["failed"]
            view["controls"] = [action for action, allowed in CONTROLS.items()
                                if view.get("status") in allowed]
        return {"at": iso(now), "background": views,
                "done": all(v.get("status") in TERMINAL for v in views)}

    def migration(self, name: str) -> dict[str, Any]:
        """One background migration: its view, partitions, throughput, errors, bad ids, budgets,
        control history and plan (``NOT_APPLIED`` when it is not registered, ``STATE_INVALID``
        when its state cannot be read)."""
        live = self.live(name)
        view = live["background"][0]
        partitions = self.partitions(name)["partitions"]
        state = json_document(self.migrator.background.state(name) or {})
        spec = state.get("spec") or {}
        plan = state.get("plan") or {}
        current = [p for p in partitions if p.get("generation") == view.get("generation")]
        unrolled = [p for p in current
                    if number(state.get("rolledGeneration")) < number(p.get("generation"))]
        bad_ids = _union([state.get("badIds") or [], *(p.get("badIds") or [] for p in unrolled)])
        errors = [*(state.get("docErrors") or []),
                  *(e for p in unrolled for e in p.get("lastDocErrors") or [])]
        return {
            **live, "view": view, "name": name, "partitions": current,
            "older": len(partitions) - len(current),
            "throughput": throughput(partitions),
            "errors": errors[::-1],
            "partitionErrors": [p for p in partitions if p.get("lastError")],
            "badIds": [str(i) for i in bad_ids[:BAD_IDS_SHOWN]], "badIdCount": len(bad_ids),
            "budget": {
                "failedDocuments": max(number(view.get("failedDocuments")), len(bad_ids)),
                "maxDocumentErrors": number(spec.get("maxDocumentErrors")),
                "pass": view.get("pass", 0), "maxPasses": number(spec.get("maxPasses")),
                "lanes": view.get("liveLeases", 0), "maxParallel": view.get("maxParallel", 1),
                "failures": number(state.get("failures")),
                "reopened": number(state.get("reopened")),
            },
            "history": list(state.get("history") or [])[::-1],
            "control": state.get("control"),
            "plan": {"method": plan.get("method"), "partitioner": plan.get("partitioner"),
                     "partitions": plan.get("partitions"), "estimate": plan.get("estimate"),
                     "at": plan.get("at"), "pass": state.get("pass", 0),
                     "generation": state.get("generation", 0),
                     "rolledGeneration": state.get("rolledGeneration", 0)},
        }

    # -- the one write ----------------------------------------------------------------------
    def control(self, name: str, action: str, *, requested_by: str,
                reason: str | None) -> Any:
        """pause / resume / cancel / retry — the engine's compare-and-set with history."""
        result = self.migrator.background.control(name, action, requested_by=requested_by,
                                                  reason=reason)
        return json_document(result.to_dict())
