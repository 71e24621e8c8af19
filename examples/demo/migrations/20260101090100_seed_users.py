"""Seed three users (idempotent: upserts by email)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut import MigrationContext

USERS = [
    {"email": "ada@example.com", "fullname": "Ada Lovelace"},
    {"email": "grace@example.com", "fullname": "Grace Hopper"},
    {"email": "edsger@example.com", "fullname": "Edsger Dijkstra"},
]


def up(ctx: MigrationContext) -> None:
    for user in USERS:
        ctx.db.users.update_one({"email": user["email"]}, {"$setOnInsert": user}, upsert=True)
    ctx.logger.info("seeded %d users", len(USERS))


def down(ctx: MigrationContext) -> None:
    ctx.db.users.delete_many({"email": {"$in": [u["email"] for u in USERS]}})
