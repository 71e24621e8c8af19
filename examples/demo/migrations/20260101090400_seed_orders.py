"""Seed 400 orders with a float total (the shape the next migration rewrites).

Also creates the version index {__v: 1, _id: 1} that background migrations read through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut import MigrationContext


def up(ctx: MigrationContext) -> None:
    ctx.db.orders.create_index([("__v", 1), ("_id", 1)], name="version")
    ctx.db.orders.insert_many([{"_id": i, "total": round(i * 1.37, 2)} for i in range(400)])


def down(ctx: MigrationContext) -> None:
    ctx.db.drop_collection("orders")
