"""Store order totals in integer cents — a background migration.

`migronaut up` only registers it; `migronaut background run` (or any number of
`migronaut background work` processes) rewrites the orders in _id ranges, beside the application.
"""

from __future__ import annotations

from typing import Any


def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    doc["total_cents"] = int(round(doc["total"] * 100))
    return doc


def revert(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    doc.pop("total_cents", None)
    return doc


background = {
    "collection": "orders",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "revert": revert,
    "batch_size": 100,
    "max_parallel": 2,
    "pause_ms": 0,
    "partitions": {"min_partition_docs": 100},  # small demo data: still cut it into ranges
}
