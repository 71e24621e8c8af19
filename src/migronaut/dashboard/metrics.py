"""``/metrics``: the dashboard's figures through ``prometheus_client``'s own exposition (text
0.0.4, or OpenMetrics when the scraper asks for it).

A custom collector per application reads, on each scrape, the migrations' status, the lock and
:meth:`Board.live` — the very views the overview shows, so a page and a scrape cannot disagree
(failed documents included). Nothing goes into prometheus_client's global registry: two
applications in one process keep apart. Counters are the stored totals, so Prometheus' own
``rate()`` works across dashboard restarts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from migronaut.background.state.progress import number
from migronaut.dashboard.board import migration_counts

if TYPE_CHECKING:
    from migronaut.dashboard.board import Board

__all__ = ["BoardCollector", "exposition", "registry_of"]

#: ``invalid``: a state migronaut cannot read (STATE_INVALID) — the others are still scraped.
BACKGROUND_STATUSES = ("blocked", "pending", "running", "paused", "completed", "failed",
                       "cancelled", "invalid")
COUNTERS = ("scanned", "migrated", "skipped", "conflicts", "failed", "retried", "batches")


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=list(labels))


class BoardCollector(Collector):
    """The families of one scrape, read through one :class:`Board`."""

    def __init__(self, board: Board) -> None:
        self.board = board

    def collect(self) -> Iterator[Metric]:
        board = self.board
        by_status = migration_counts(board.migrator.status("all", checksums=False))
        lock = board.lock()
        views = board.live()["background"]
        migrations = _gauge("migronaut_migrations",
                            "Migrations on disk or in the changelog, by status.", ("status",))
        for status, count in by_status.items():
            migrations.add_metric([status], count)
        yield migrations
        yield GaugeMetricFamily("migronaut_migrations_pending",
                                "Migrations `up` would run (pending and failed).",
                                value=by_status["pending"] + by_status["failed"])
        yield GaugeMetricFamily("migronaut_migrations_in_doubt",
                                "Migrations in doubt: a run ended without recording whether the "
                                "body finished (migronaut resolve).", value=by_status["in-doubt"])
        yield GaugeMetricFamily("migronaut_lock_held", "1 while the migration lock is held "
                                "(expired or unreadable included).",
                                value=0 if lock.get("state") == "free" else 1)
        # the counter's name without "_total": prometheus_client appends it
        documents = CounterMetricFamily(
            "migronaut_background_documents", "Documents by counter (scanned, migrated, "
            "failed, …), stored totals (the running generation's partitions included).",
            labels=["migration", "counter"])
        families: dict[str, tuple[GaugeMetricFamily, Any]] = {
            "rate": (_gauge("migronaut_background_documents_per_second",
                            "Average documents read per second since the migration started.",
                            ("migration",)), lambda v, p: p["rate"] or 0),
            "done": (_gauge("migronaut_background_done_documents",
                            "Documents read by the passes so far.", ("migration",)),
                     lambda v, p: p["done"]),
            "estimate": (_gauge("migronaut_background_estimate_documents",
                                "The current plan's estimate of documents to read (a lower "
                                "bound when migronaut_background_estimate_is_lower_bound is 1).",
                                ("migration",)), lambda v, p: p["estimate"]),
            "atLeast": (_gauge("migronaut_background_estimate_is_lower_bound",
                               "1 when the estimate is a lower bound (the CLI's ≥N).",
                               ("migration",)), lambda v, p: 1 if p["atLeast"] else 0),
            "lanes": (_gauge("migronaut_background_lanes", "Live leases (lanes working now).",
                             ("migration",)), lambda v, p: number(v.get("liveLeases"))),
            "capacity": (_gauge("migronaut_background_max_parallel",
                                "The migration's lane cap (maxParallel).", ("migration",)),
                         lambda v, p: number(v.get("maxParallel"))),
            "failed": (_gauge("migronaut_background_failed_documents",
                              "Documents that failed so far (live: the running generation's "
                              "failed counter until its bad ids are rolled up).",
                              ("migration",)), lambda v, p: p["failed"]),
        }
        state = _gauge("migronaut_background_status", "1 for the migration's current status.",
                       ("migration", "status"))
        for view in views:
            name = str(view["migration"])
            progress = view["progress"]
            totals = view.get("totals") or {}
            for counter in COUNTERS:
                documents.add_metric([name, counter], number(totals.get(counter)))
            for family, value in families.values():
                family.add_metric([name], float(value(view, progress)))
            for status in BACKGROUND_STATUSES:
                state.add_metric([name, status], 1 if view.get("status") == status else 0)
        yield documents
        yield from (family for family, _ in families.values())
        yield state


def registry_of(board: Board) -> CollectorRegistry:
    """A registry of its own (never the global one) holding the board's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(board))
    return registry


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The scrape in the format ``accept`` asks for: body and content type."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
