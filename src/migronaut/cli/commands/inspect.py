"""``migronaut status``, ``list`` and ``dry-run``: read-only views as a table or ``StatusRow[]``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import click

from migronaut.cli.app import command
from migronaut.cli.commands import rows_json
from migronaut.cli.output import Output
from migronaut.cli.render import status_table
from migronaut.cli.session import Session, parse_int
from migronaut.errors import EXIT_CODES, ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.core.results import StatusRow

#: ``status --check`` counts these as outstanding work (a failed attempt still has to run, a
#: running one to finish); an ``in-doubt`` row refuses with ``MIGRATION_IN_DOUBT`` instead.
OUTSTANDING = ("pending", "failed", "running")


@command(
    "status",
    help="Every migration on disk or in the changelog, with its status, batch, time, duration "
    "and checksum check.",
    short_help="Show migration status.",
)
@click.option("--check", is_flag=True,
              help="Exit 2 when any migration is pending or failed (for CI and readiness).")
@click.option("--pending", is_flag=True, help="Only the migrations `up` would run.")
@click.option("--limit", metavar="N", help="Only the last N rows (not with --check).")
def status(session: Session, check: bool, pending: bool, limit: str | None) -> int:
    from migronaut.core.plan import MAX_SELECTOR

    window = parse_int(limit, "--limit")
    if window is not None and not 0 < window <= MAX_SELECTOR:
        raise ConfigInvalidError(
            f"--limit must be a positive integer (got {limit!r})"
            if window <= 0 else f"--limit must be at most {MAX_SELECTOR} (got {limit!r})",
            {"option": "--limit"},
        )
    if check and window is not None:
        raise ConfigInvalidError(
            "--limit cannot be combined with --check: a window could hide pending migrations",
            {"options": ["--limit", "--check"]},
        )

    def rows_of(migrator_rows: list[StatusRow]) -> list[StatusRow]:
        return migrator_rows[-window:] if window is not None else migrator_rows

    def verdict(rows: Sequence[StatusRow], out: Output) -> int:
        if not check:
            return 0
        from migronaut.commands.status import in_doubt

        doubt = in_doubt(list(rows))
        if doubt is not None:
            raise doubt
        outstanding = sum(1 for row in rows if row.status in OUTSTANDING)
        if not outstanding:
            return 0
        out.error(f"✖ {outstanding} pending migration(s)")
        return EXIT_CODES["PENDING_MIGRATIONS"]

    return session.run(
        lambda migrator: rows_of(migrator.status("pending" if pending else "all")),
        render=status_table,
        to_json=rows_json,
        exit_code=verdict,
        read_only=True,
    )


@command(
    "list",
    help="List migrations (all, or only --pending / --applied).",
    short_help="List migrations.",
)
@click.option("--pending", is_flag=True, help="Only pending (and failed) migrations.")
@click.option("--applied", is_flag=True, help="Only applied migrations.")
def list_(session: Session, pending: bool, applied: bool) -> int:
    if pending and applied:
        raise ConfigInvalidError(
            "--pending and --applied cannot be combined", {"options": ["--pending", "--applied"]}
        )
    which: Literal["all", "pending", "applied"] = (
        "pending" if pending else "applied" if applied else "all"
    )
    return session.run(
        lambda migrator: migrator.status(which),
        render=status_table,
        to_json=rows_json,
        read_only=True,
    )


def _render_preview(rows: Sequence[StatusRow], out: Output) -> None:
    if rows:
        status_table(rows, out)


@command(
    "dry-run",
    help="Preview what `up` or `down` (DIRECTION) would do, with the same selection rules: no "
    "lock, no writes.",
    short_help="Preview up or down.",
)
@click.argument("direction", metavar="up|down")
@click.argument("file", required=False)
@click.option("--steps", metavar="N", help="down: the last N applied migrations.")
@click.option("--batch", metavar="N", help="down: batch N.")
@click.option("--to", metavar="FILE", help="up: up to FILE (inclusive); down: after FILE.")
def dry_run(
    session: Session,
    direction: str,
    file: str | None,
    steps: str | None,
    batch: str | None,
    to: str | None,
) -> int:
    # The engine checks the direction and the selectors before it connects.
    steps_n, batch_n = parse_int(steps, "--steps"), parse_int(batch, "--batch")
    return session.run(
        lambda migrator: migrator.dry_run(
            direction,  # type: ignore[arg-type]  # validated by dry_run
            file, steps=steps_n, batch=batch_n, to=to
        ),
        render=_render_preview,
        to_json=rows_json,
        read_only=True,
    )
