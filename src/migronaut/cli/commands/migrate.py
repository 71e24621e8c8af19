"""``migronaut up``, ``down`` and ``redo``: the mutating runs (graceful SIGINT/SIGTERM).

Human output is the engine's own log lines (``✔ Applied …``, ``✔ Done …``); ``--json`` prints the
``RunResult[]``. Every option is checked before connecting, and so is the ``--force`` prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from migronaut.cli.app import command
from migronaut.cli.celery_handoff import RegisteredHandoff
from migronaut.cli.commands import run_results_json
from migronaut.cli.session import Session, parse_int
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.core.results import RunResult

NO_LOCK_HELP = "Run without the migration lock (development only: concurrent runs are unsafe)."
REASON_HELP = "Why this run happens; recorded on the changelog records (≤ 512 characters)."
_REQUESTED_BY_HELP = (
    "Who asked for this run (≤ 128 characters); default: MIGRONAUT_REQUESTED_BY, the CI user, "
    "else the OS user (see Observability in the documentation)."
)


@command(
    "up",
    help="Apply pending migrations in name order (or only FILE), under the migration lock.",
    short_help="Apply pending migrations.",
)
@click.argument("file", required=False)
@click.option("--to", metavar="FILE", help="Stop after this migration (inclusive).")
@click.option("--step", is_flag=True, help="Give each migration its own batch number.")
@click.option("--strict", is_flag=True,
              help="Refuse to run when an applied file changed on disk (checksum drift).")
@click.option("-f", "--force", is_flag=True,
              help="Re-run FILE even when it is already applied (asks for confirmation).")
@click.option("-y", "--yes", is_flag=True, help="Confirm --force without a prompt.")
@click.option("--no-lock", is_flag=True, help=NO_LOCK_HELP)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
@click.option("--requested-by", metavar="WHO", help=_REQUESTED_BY_HELP)
@click.option("--converge/--no-converge", default=None,
              help="Converge the declared collections after the migrations, in the same run "
              "(default: the converge_after_up setting). Bulk up only.")
def up(
    session: Session,
    file: str | None,
    to: str | None,
    step: bool,
    strict: bool,
    force: bool,
    yes: bool,
    no_lock: bool,
    reason: str | None,
    requested_by: str | None,
    converge: bool | None,
) -> int:
    from migronaut.core.plan import validate_up_options

    validate_up_options(file, to=to, step=step, force=force, reason=reason,
                        requested_by=requested_by, converge=converge)
    if force and not yes and not session.confirm(
        f'are you sure you want to re-run "{file}"? [y/N] ', action="up --force"
    ):
        return session.aborted()

    def apply(migrator: Migrator) -> list[RunResult]:
        # on a project served by Celery, what the run registered is enqueued at once
        with RegisteredHandoff(session, migrator, reason=reason, requested_by=requested_by):
            return migrator.up(
                file, to=to, step=step, force=force, no_lock=no_lock,
                strict=True if strict else None, reason=reason, requested_by=requested_by,
                converge=converge,
            )

    return session.run(apply, to_json=run_results_json, mutating=True)


@command(
    "down",
    help="Revert the last batch, or FILE, the last --steps N, batch --batch N, or everything "
    "applied after --to FILE (exclusive). The selectors are mutually exclusive.",
    short_help="Revert migrations.",
)
@click.argument("file", required=False)
@click.option("--batch", metavar="N", help="Revert batch N.")
@click.option("--steps", metavar="N", help="Revert the last N applied migrations.")
@click.option("--to", metavar="FILE", help="Revert everything applied after FILE (it stays).")
@click.option("--no-lock", is_flag=True, help=NO_LOCK_HELP)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
@click.option("--requested-by", metavar="WHO", help=_REQUESTED_BY_HELP)
def down(
    session: Session,
    file: str | None,
    batch: str | None,
    steps: str | None,
    to: str | None,
    no_lock: bool,
    reason: str | None,
    requested_by: str | None,
) -> int:
    from migronaut.core.plan import validate_down_options

    batch_n, steps_n = parse_int(batch, "--batch"), parse_int(steps, "--steps")
    validate_down_options(file, steps=steps_n, batch=batch_n, to=to, reason=reason,
                          requested_by=requested_by)
    return session.run(
        lambda migrator: migrator.down(
            file, steps=steps_n, batch=batch_n, to=to, no_lock=no_lock, reason=reason,
            requested_by=requested_by,
        ),
        to_json=run_results_json,
        mutating=True,
    )


@command(
    "redo",
    help="Revert then re-apply the newest applied migration (or FILE) under one lock.",
    short_help="Revert and re-apply a migration.",
)
@click.argument("file", required=False)
@click.option("--no-lock", is_flag=True, help=NO_LOCK_HELP)
@click.option("--reason", metavar="TEXT", help=REASON_HELP)
@click.option("--requested-by", metavar="WHO", help=_REQUESTED_BY_HELP)
def redo(
    session: Session, file: str | None, no_lock: bool, reason: str | None,
    requested_by: str | None,
) -> int:
    from migronaut.core.plan import validate_down_options

    validate_down_options(file, reason=reason, requested_by=requested_by)
    return session.run(
        lambda migrator: migrator.redo(file, no_lock=no_lock, reason=reason,
                                       requested_by=requested_by),
        to_json=run_results_json,
        mutating=True,
    )


@command(
    "resolve",
    help="Record the outcome of a migration in doubt (a run started it outside a transaction "
    "and ended without recording whether it finished): --applied if its body finished, "
    "--pending if it did not. Under the lock; asks for confirmation unless --yes.",
    short_help="Settle a migration in doubt.",
)
@click.argument("file")
@click.option("--applied", is_flag=True, help="Its body finished: record it applied.")
@click.option("--pending", is_flag=True,
              help="Its body did not finish (or was undone by hand): the next up runs it.")
@click.option("--reason", metavar="TEXT", help="What you checked to decide (required).")
@click.option("--requested-by", metavar="WHO", help=_REQUESTED_BY_HELP)
@click.option("-y", "--yes", is_flag=True, help="Resolve without a prompt (required with --json).")
def resolve(
    session: Session, file: str, applied: bool, pending: bool, reason: str | None,
    requested_by: str | None, yes: bool,
) -> int:
    from migronaut.commands.resolve import check_resolve_options

    if applied == pending:
        raise ConfigInvalidError(
            "resolve needs exactly one outcome: --applied (its body finished) or --pending "
            "(it did not)", {"options": ["--applied", "--pending"]})
    outcome = "applied" if applied else "pending"
    check_resolve_options(file, outcome, reason, requested_by)
    if not yes and not session.confirm(
        f'record "{file}" as {outcome}? [y/N] ', action="resolve"
    ):
        return session.aborted()
    return session.run(
        lambda migrator: migrator.resolve(file, applied=applied, reason=reason or "",
                                          requested_by=requested_by),
        to_json=lambda done: done.to_dict(),
        mutating=True,
    )
