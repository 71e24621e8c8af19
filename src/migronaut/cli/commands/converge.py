"""``migronaut converge``: plan, confirm and apply the declared collections (collections.md
§2.10), or show the converge history.

Without ``--yes`` a real run first plans (dry run) and asks before anything that needs
confirmation (§2.12: index drop/recreate, search-index drop, a validator change on a collection
not created by the same plan); in ``--json`` mode such a plan is ``CONFIG_INVALID`` with
``context.destructive``. A plan with a conflict is not asked about: the run refuses it anyway.
``--check`` exits 28 (``COLLECTIONS_DRIFT``) when the plan is not in sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from migronaut.cli.app import command
from migronaut.cli.commands.migrate import NO_LOCK_HELP
from migronaut.cli.session import Session, parse_int
from migronaut.errors import EXIT_CODES, ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.cli.output import Output
    from migronaut.declared.plan import CollectionPlan, ConvergeResult, PlanRow

DRIFT = EXIT_CODES["COLLECTIONS_DRIFT"]


def needs_confirmation(plan: CollectionPlan, row: PlanRow) -> bool:
    """§2.12: destructive rows, and validator changes on a collection that already exists."""
    if row.is_destructive:
        return True
    created = any(r.target == "collection" and r.action == "create" for r in plan.actions)
    return row.target == "validator" and row.is_change and not created


def _confirm_rows(result: ConvergeResult) -> list[dict[str, Any]]:
    return [{"collection": plan.name, **row.to_dict()} for plan in result.collections
            for row in plan.actions if needs_confirmation(plan, row)]


@command(
    "converge",
    help="Make the declared collections, validators and indexes exist as declared, under the "
    "migration lock; --dry-run or --check only plan. Drops and rebuilds ask for confirmation.",
    short_help="Apply the declared collections and indexes.",
)
@click.option("--dry-run", is_flag=True, help="Plan and print; change nothing, take no lock.")
@click.option("--check", is_flag=True,
              help=f"Like --dry-run, then exit {DRIFT} when the collections are not in sync.")
@click.option("--prune", is_flag=True,
              help="Drop undeclared indexes (a definition's own prune setting wins).")
@click.option("--ordered", is_flag=True, help="Refuse while a migration is pending (exit 24).")
@click.option("--rebuild-unique", is_flag=True,
              help="Allow rebuilding a unique index (no uniqueness during the rebuild).")
@click.option("--reason", metavar="TEXT",
              help="Why this run happens; recorded on the run and its converge history entry "
              "(≤ 512 characters).")
@click.option("--history", is_flag=True, help="Show the converge history instead.")
@click.option("--limit", metavar="N", help="With --history: entries to show (1–1000, default 20).")
@click.option("-y", "--yes", is_flag=True, help="Apply without asking (required with --json "
              "for a plan that needs confirmation).")
@click.option("--wait-search/--no-wait-search", "wait_search", default=None,
              help="Wait (or not) for the declared search indexes to be built, with the lock "
              "released (default: wait_for_search_indexes).")
@click.option("--no-lock", is_flag=True, help=NO_LOCK_HELP)
def converge(
    session: Session, dry_run: bool, check: bool, prune: bool, ordered: bool,
    rebuild_unique: bool, reason: str | None, history: bool, limit: str | None, yes: bool,
    wait_search: bool | None, no_lock: bool,
) -> int:
    from migronaut.cli.render_converge import drift_line, render_history, render_plan
    from migronaut.commands.converge_options import (
        ConvergeOptions,
        validate_converge_options,
    )
    from migronaut.observability.converge_history import check_limit

    if limit is not None and not history:
        raise ConfigInvalidError("--limit applies to --history only", {"option": "limit"})
    if wait_search is not None and (history or dry_run or check):
        flag = "--wait-search" if wait_search else "--no-wait-search"
        other = "--history" if history else "--dry-run" if dry_run else "--check"
        raise ConfigInvalidError(f"{flag} cannot be combined with {other}: only a converge "
                                 "that applies waits for search indexes",
                                 {"option": "wait-search"})
    if history:
        count = check_limit(parse_int(limit, "--limit") if limit is not None else 20)
        return session.run(lambda migrator: migrator.converge_history(count),
                           render=render_history, to_json=list, read_only=True)
    validate_converge_options(ConvergeOptions(prune=prune, ordered=ordered, reason=reason,
                                              rebuild_unique=rebuild_unique, no_lock=no_lock,
                                              dry_run=dry_run or check,
                                              wait_for_search_indexes=wait_search or None))
    verbose = session.options.verbose
    if dry_run or check:
        def exit_code(result: ConvergeResult, out: Output) -> int:
            failed = any(entry.get("status") == "FAILED"
                         for entry in (result.search or {}).get("notReady") or ())
            if not check or not (failed or not result.in_sync):
                return 0
            out.error(drift_line(result) if not result.in_sync else
                      "✖ COLLECTIONS_DRIFT: a search index failed to build (status FAILED) — "
                      "`migronaut converge --dry-run` lists it")
            return DRIFT

        return session.run(
            lambda migrator: migrator.converge(dry_run=True, prune=prune,
                                               rebuild_unique=rebuild_unique),
            render=lambda result, out: render_plan(result, out, verbose=verbose),
            to_json=lambda result: result.to_dict(), exit_code=exit_code, read_only=True)

    def apply(migrator: Migrator) -> ConvergeResult | None:
        if session.guard is not None:  # a stop waits for the step in flight (§2.3 step 8)
            session.guard.finishing = "finishing the current step, then stopping"
        if not yes:
            plan = migrator.converge(dry_run=True, prune=prune, rebuild_unique=rebuild_unique)
            asking = _confirm_rows(plan)
            conflicted = any(plan_.conflicts for plan_ in plan.collections)
            if asking and not conflicted:
                if session.options.json:
                    raise ConfigInvalidError(
                        f"converge needs a confirmation for {len(asking)} change(s) and --json "
                        "is non-interactive: pass --yes", {"option": "yes",
                                                          "destructive": asking})
                session.out.spinner.stop()
                render_plan(plan, session.out, verbose=verbose)
                if not session.confirm("apply? [y/N] ", action="converge"):
                    return None
        if rebuild_unique:
            session.out.warn("⚠ --rebuild-unique: unique indexes being rebuilt enforce nothing "
                             "until the new index is built")
        return migrator.converge(prune=prune, ordered=ordered, rebuild_unique=rebuild_unique,
                                 reason=reason, no_lock=no_lock,
                                 wait_for_search_indexes=wait_search)

    def finish(result: ConvergeResult | None, out: Output) -> int:
        return session.aborted() if result is None else 0

    return session.run(apply, to_json=lambda result: None if result is None
                       else result.to_dict(), exit_code=finish, mutating=True)
