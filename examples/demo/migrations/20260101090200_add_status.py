"""Give every user a status, in a transaction with its changelog record."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut import MigrationContext

use_transaction = True


def up(ctx: MigrationContext) -> None:
    ctx.db.users.update_many(
        {"status": {"$exists": False}}, {"$set": {"status": "active"}}, session=ctx.session
    )


def down(ctx: MigrationContext) -> None:
    ctx.db.users.update_many({}, {"$unset": {"status": ""}}, session=ctx.session)
