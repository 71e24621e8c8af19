"""A small user project for the ``migronaut.testing`` tests: three migrations, one with a bad down.

Shared by the in-process helper tests and the pytester runs of the plugin, so both exercise the
same scenario.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

INDEX = "20260101000000_users_email_index.py"
SPLIT = "20260102000000_split_names.py"
NORMALISE = "20260103000000_normalise_emails.py"
FILES = (INDEX, SPLIT, NORMALISE)

MIGRATIONS = {
    INDEX: '''
        """A unique index on users.email and the default theme setting."""


        def up(ctx):
            ctx.db.users.create_index("email", unique=True, name="email_unique")
            ctx.db.settings.insert_one({"_id": "theme", "value": "dark"})


        def down(ctx):
            ctx.db.users.drop_index("email_unique")
            ctx.db.settings.delete_one({"_id": "theme"})
    ''',
    SPLIT: '''
        """Split users.name into first and last."""


        def up(ctx):
            for user in ctx.db.users.find({"name": {"$exists": True}}):
                first, _, last = user["name"].partition(" ")
                ctx.db.users.update_one(
                    {"_id": user["_id"]},
                    {"$set": {"first": first, "last": last}, "$unset": {"name": ""}},
                )


        def down(ctx):
            for user in ctx.db.users.find({"first": {"$exists": True}}):
                name = f"{user['first']} {user['last']}" if user["last"] else user["first"]
                ctx.db.users.update_one(
                    {"_id": user["_id"]},
                    {"$set": {"name": name}, "$unset": {"first": "", "last": ""}},
                )
    ''',
    NORMALISE: '''
        """Lower-case every e-mail address."""


        def up(ctx):
            for user in ctx.db.users.find({"email": {"$exists": True}}):
                ctx.db.users.update_one(
                    {"_id": user["_id"]}, {"$set": {"email": user["email"].lower()}}
                )


        def down(ctx):
            pass  # the original spelling is lost: this down restores nothing
    ''',
}

#: Users in the shape before SPLIT (``name``), with mixed-case e-mails for NORMALISE.
USERS: list[dict[str, Any]] = [
    {"_id": 1, "name": "Ada Lovelace", "email": "Ada@Example.COM"},
    {"_id": 2, "name": "Plato", "email": "plato@example.com"},
]


def write_migrations(directory: Path, names: tuple[str, ...] = FILES) -> None:
    """Write the named migrations of the project into ``directory`` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(textwrap.dedent(MIGRATIONS[name]).lstrip(), "utf-8")


def seed_users(db: Any) -> None:
    db.users.insert_many([dict(user) for user in USERS])
