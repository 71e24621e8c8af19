"""Create the users collection with a unique index on email."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut import MigrationContext


def up(ctx: MigrationContext) -> None:
    ctx.db.create_collection("users")
    ctx.db.users.create_index("email", unique=True, name="email_unique")


def down(ctx: MigrationContext) -> None:
    ctx.db.drop_collection("users")
