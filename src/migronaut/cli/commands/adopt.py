"""``migronaut import`` and ``baseline``: adopt a database whose migrations ran before migronaut.

Both are mutating runs under the lock (graceful SIGINT/SIGTERM); ``--dry-run`` only reads.
``baseline`` asks for confirmation (``--yes`` skips it and is required with ``--json``);
``import`` does not, since it refuses a non-empty changelog unless ``--force``.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import click

from migronaut._redact import sanitize_terminal
from migronaut.cli.app import command
from migronaut.cli.commands.migrate import NO_LOCK_HELP, REASON_HELP
from migronaut.cli.output import CYAN, GREEN, RED, Output
from migronaut.cli.render import Cell, applied_at, table
from migronaut.cli.session import Session

if TYPE_CHECKING:
    from migronaut.core.results import BaselineResult, ImportResult, ImportRow

IMPORT_COLUMNS = ("Migration", "Batch", "Applied At", "Checksum")
_CHECKSUM_STYLE = {"recomputed": GREEN, "reused": CYAN, "missing": RED}


def _import_cells(row: ImportRow) -> list[Cell]:
    name = row.file if row.source_name is None else f"{row.file} ← {row.source_name}"
    when = applied_at(row.applied_at) if isinstance(row.applied_at, dt.datetime) else \
        "" if row.applied_at is None else str(row.applied_at)
    return [
        (sanitize_terminal(name), None),
        (str(row.batch), None),
        (sanitize_terminal(when), None),
        (row.checksum_source, _CHECKSUM_STYLE[row.checksum_source]),
    ]


def _render_import(result: ImportResult, out: Output) -> None:
    if result.rows:
        table(IMPORT_COLUMNS, [_import_cells(row) for row in result.rows], out,
              wrap=("Migration",))


def _import_json(result: ImportResult) -> dict[str, Any]:
    return result.to_dict()


@command(
    "import",
    help="Adopt the record of applied migrations another tool kept (migrate-mongo's `changelog`, "
    "mongodb-migrations' `database_migrations`, or the Node.js migronaut's "
    "`_migronaut_migrations`), so `up` runs only what is new. Each record is matched to the "
    "migration file it stands for (same name, same stem, or same leading timestamp/version) "
    "and becomes a forward-only record that `down`/`redo` refuse. Preview with --dry-run "
    "first: it writes nothing at all.",
    short_help="Import another tool's changelog.",
)
@click.option("--tool", default="migrate-mongo", show_default=True,
              metavar="migrate-mongo|mongodb-migrations|migronaut",
              help="The tool that wrote the source collection (migronaut: the Node.js "
              "original, whose .js/.ts records map onto the .py files by stem).")
@click.option("--from", "source", metavar="COLLECTION",
              help="Source collection (default: `changelog` for migrate-mongo, "
              "`database_migrations` for mongodb-migrations, `_migronaut_migrations` for "
              "migronaut). Only read.")
@click.option("--to", "target", metavar="COLLECTION",
              help="Target changelog (default: the configured migrations collection).")
@click.option("--dry-run", is_flag=True,
              help="Show what would be imported (`wouldImport`); write nothing at all.")
@click.option("--trust-hash", is_flag=True,
              help="Reuse the source's fileHash as the checksum instead of hashing the file.")
@click.option("--force", is_flag=True,
              help="Import into a changelog that already has records (re-imports are stable).")
@click.option("--no-lock", is_flag=True, help=NO_LOCK_HELP)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
def import_(
    session: Session,
    tool: str,
    source: str | None,
    target: str | None,
    dry_run: bool,
    trust_hash: bool,
    force: bool,
    no_lock: bool,
    reason: str | None,
) -> int:
    from migronaut.core.adopt import validate_import_options
    from migronaut.core.plan import validate_actor

    validate_import_options(tool, source, target)
    validate_actor(None, reason)
    return session.run(
        lambda migrator: migrator.import_changelog(
            tool, source=source, target=target, dry_run=dry_run, trust_hash=trust_hash,
            force=force, no_lock=no_lock, reason=reason,
        ),
        render=_render_import,
        to_json=_import_json,
        mutating=True,
    )


def _render_baseline(result: BaselineResult, out: Output) -> None:
    if result.dry_run:
        for name in result.baselined:
            out.info(f"  {sanitize_terminal(name)}")


def _baseline_json(result: BaselineResult) -> dict[str, Any]:
    return result.to_dict()


@command(
    "baseline",
    help="Mark the pending migration files (up to --to FILE, inclusive) as applied WITHOUT "
    "running them, in one batch: for a database whose schema already matches them and that "
    "no migration tool managed. Re-runnable; `down`/`redo` refuse baselined records. Asks for "
    "confirmation unless --yes.",
    short_help="Mark pending files applied without running them.",
)
@click.option("--to", metavar="FILE", help="Baseline up to this file (inclusive).")
@click.option("--dry-run", is_flag=True, help="Show what would be baselined; write nothing.")
@click.option("-y", "--yes", is_flag=True, help="Confirm without a prompt (required with --json).")
@click.option("--no-lock", is_flag=True, help=NO_LOCK_HELP)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
def baseline(
    session: Session,
    to: str | None,
    dry_run: bool,
    yes: bool,
    no_lock: bool,
    reason: str | None,
) -> int:
    from migronaut.core.adopt import validate_baseline_options
    from migronaut.core.plan import validate_actor

    validate_baseline_options(to)
    validate_actor(None, reason)
    if not dry_run and not yes and not session.confirm(
        "Mark pending migration files as applied WITHOUT running them? [y/N] ", action="baseline"
    ):
        return session.aborted()
    return session.run(
        lambda migrator: migrator.baseline(to, dry_run=dry_run, no_lock=no_lock, reason=reason),
        render=_render_baseline,
        to_json=_baseline_json,
        mutating=True,
    )
