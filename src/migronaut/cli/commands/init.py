"""``migronaut init``: write a config file into the working directory, make the migrations
directory it names, and say what to run next. Never connects."""

from __future__ import annotations

import os
from pathlib import Path

import click

from migronaut.cli.app import command
from migronaut.cli.session import Session
from migronaut.errors import ConfigInvalidError


@command(
    "init",
    help="Write a config file (migronaut.toml, or migronaut_config.py with --format py) into "
    "the current directory and make the migrations directory it names. --uri/--db/--dir (else "
    "MIGRONAUT_URI, MIGRONAUT_DB, MIGRONAUT_MIGRATIONS_DIR) prefill it; a URI password is "
    "masked.",
    short_help="Write a config file.",
)
@click.option("--format", "fmt", default="toml", metavar="toml|py",
              help="migronaut.toml (default) or migronaut_config.py.")
@click.option("--secret-provider", is_flag=True,
              help="A Python config that reads the URI from a secret manager (needs --format py).")
@click.option("--force", is_flag=True, help="Overwrite an existing config file.")
def init(session: Session, fmt: str, secret_provider: bool, force: bool) -> int:
    options = session.options
    if options.json:
        raise ConfigInvalidError(
            "init has no JSON output and does not take --json; choose the file format with "
            "--format toml|py",
            {"option": "json"},
        )
    from migronaut.core.templates import write_config

    path, created, warnings = write_config(
        Path(os.getcwd()),
        fmt=fmt,
        secret_provider=secret_provider,
        force=force,
        uri=options.uri or os.environ.get("MIGRONAUT_URI") or None,
        db_name=options.db or os.environ.get("MIGRONAUT_DB") or None,
        migrations_dir=options.dir or os.environ.get("MIGRONAUT_MIGRATIONS_DIR") or None,
    )
    for warning in warnings:
        session.out.warn(f"⚠ {warning}")
    session.out.info(f"✔ Created  {path.name}")
    if created is not None:
        session.out.info(f"✔ Created  {_shown(created)}/")
    session.out.info(NEXT_STEPS)
    return 0


#: What to run after ``init``, in order (README's quickstart).
NEXT_STEPS = """Next:
  migronaut create "add users email index"   # a migration file to edit
  migronaut status                           # what is applied, what is pending
  migronaut up                               # apply the pending migrations
  migronaut dev-server                       # no MongoDB yet? a local one (extra 'embedded')"""


def _shown(directory: Path) -> str:
    """The directory relative to the working directory when it is inside it."""
    try:
        return str(directory.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(directory)
