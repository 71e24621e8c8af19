"""Rename users.fullname to users.name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut import MigrationContext


def up(ctx: MigrationContext) -> None:
    ctx.db.users.update_many({"fullname": {"$exists": True}}, {"$rename": {"fullname": "name"}})


def down(ctx: MigrationContext) -> None:
    ctx.db.users.update_many({"name": {"$exists": True}}, {"$rename": {"name": "fullname"}})
