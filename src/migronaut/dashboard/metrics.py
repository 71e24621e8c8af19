"""``/metrics``: the dashboard's figures in the Prometheus text exposition format (0.0.4).

Written by hand (a dozen families need no client library): each scrape reads the migrations'
status, the lock and every background migration's view, like the overview does. Counters are
the stored totals, so Prometheus' own ``rate()`` works across dashboard restarts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from migronaut.background.progress import number
from migronaut.dashboard.board import derived_progress, migration_counts

if TYPE_CHECKING:
    from migronaut.dashboard.board import Board

__all__ = ["exposition"]

#: ``invalid``: a state migronaut cannot read (STATE_INVALID) — the others are still scraped.
BACKGROUND_STATUSES = ("blocked", "pending", "running", "paused", "completed", "failed",
                       "cancelled", "invalid")
COUNTERS = ("scanned", "migrated", "skipped", "conflicts", "failed", "retried", "batches")


def _label(value: Any) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def _family(name: str, kind: str, help_text: str,
            samples: Iterable[tuple[Mapping[str, Any], float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{_labels(labels)} {value:g}" for labels, value in samples]
    return lines


def exposition(board: Board) -> str:
    """The whole scrape as text."""
    by_status = migration_counts(board.migrator.status("all", checksums=False))
    lock = board.lock()
    views = board.background()["background"]
    now = dt.datetime.now(dt.UTC)
    lines: list[str] = []
    lines += _family("migronaut_migrations", "gauge",
                     "Migrations on disk or in the changelog, by status.",
                     [({"status": s}, n) for s, n in by_status.items()])
    lines += _family("migronaut_migrations_pending", "gauge",
                     "Migrations `up` would run (pending and failed).",
                     [({}, by_status["pending"] + by_status["failed"])])
    lines += _family("migronaut_migrations_in_doubt", "gauge",
                     "Migrations in doubt: a run ended without recording whether the body "
                     "finished (migronaut resolve).", [({}, by_status["in-doubt"])])
    lines += _family("migronaut_lock_held", "gauge",
                     "1 while the migration lock is held (expired or unreadable included).",
                     [({}, 0 if lock.get("state") == "free" else 1)])
    documents: list[tuple[Mapping[str, Any], float]] = []
    rates, lanes, capacity, failed, state, done, estimate = [], [], [], [], [], [], []
    for view in views:
        name = view["migration"]
        migration = {"migration": name}
        totals = view.get("totals") or {}
        documents += [({**migration, "counter": c}, number(totals.get(c))) for c in COUNTERS]
        progress = derived_progress(view, now)
        rates.append((migration, float(progress["rate"] or 0)))
        lanes.append((migration, float(number(view.get("liveLeases")))))
        capacity.append((migration, float(number(view.get("maxParallel")))))
        failed.append((migration, float(number(view.get("failedDocuments")))))
        done.append((migration, float(progress["done"])))
        estimate.append((migration, float(progress["estimate"])))
        state += [({**migration, "status": s}, 1.0 if view.get("status") == s else 0.0)
                  for s in BACKGROUND_STATUSES]
    lines += _family("migronaut_background_documents_total", "counter",
                     "Documents by counter (scanned, migrated, failed, …), stored totals.",
                     documents)
    lines += _family("migronaut_background_documents_per_second", "gauge",
                     "Average documents read per second since the migration started.", rates)
    lines += _family("migronaut_background_done_documents", "gauge",
                     "Documents read by the passes so far.", done)
    lines += _family("migronaut_background_estimate_documents", "gauge",
                     "The current plan's estimate of documents to read.", estimate)
    lines += _family("migronaut_background_lanes", "gauge",
                     "Live leases (lanes working now).", lanes)
    lines += _family("migronaut_background_max_parallel", "gauge",
                     "The migration's lane cap (maxParallel).", capacity)
    lines += _family("migronaut_background_failed_documents", "gauge",
                     "Distinct documents that failed (bad ids).", failed)
    lines += _family("migronaut_background_status", "gauge",
                     "1 for the migration's current status.", state)
    return "\n".join(lines) + "\n"
