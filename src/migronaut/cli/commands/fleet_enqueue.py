"""``migronaut fleet enqueue COMMAND``: a fleet run handed to the Celery migration queue.

The tenants are resolved and ordered here, the run record (with its plan) is written, and one
coordinating step is sent; the workers do the rest — the canary stage, the failure budget, one
task per tenant. The command returns at once with the run id: ``fleet logs RUN`` and ``fleet
status`` follow the run from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from migronaut.cli.app import command
from migronaut.cli.commands.fleet import _open, _policy, _policy_options, fleet_group
from migronaut.cli.session import Session, parse_int
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.cli.output import Output
    from migronaut.executors.celery.fleet_tasks import FleetEnqueued


@command("enqueue", parent=fleet_group,
         short_help="Run up/down/converge in every tenant through Celery.",
         help="Hand a fleet run to the Celery migration queue (broker from the config's celery "
         "table or MIGRONAUT_CELERY_BROKER_URL): the tenants are resolved and ordered now, the "
         "run record is written, and a coordinating task sends one task per tenant — the "
         "canary tenants first, the rest only if every canary succeeded, at most --concurrency "
         "at a time, no new tenant once more than --max-failures failed. Returns at once with "
         "the run id; follow it with `fleet logs RUN` and `fleet status`. After a tenant's "
         "up succeeds, the worker enqueues that tenant's pending background migrations on the "
         "background queue (--no-background: leave them for `background work --db TENANT`).")
@click.argument("action", metavar="up|down|converge")
@click.option("--steps", metavar="N", help="down: how many migrations to revert in each tenant.")
@_policy_options
@click.option("--background/--no-background", default=True,
              help="up: once a tenant's up succeeds, enqueue its pending background migrations "
              "as that tenant's jobs on the background queue (default: yes).")
@click.option("--reason", metavar="TEXT", help="Why; recorded in each tenant's history.")
def enqueue(session: Session, action: str, steps: str | None, tenants: str | None,
            concurrency: str | None, per_cluster: str | None, canary: str | None,
            max_failures: str | None, order: str | None, on_lock: str | None,
            background: bool, reason: str | None) -> int:
    from migronaut.executors.celery.fleet_tasks import COMMANDS

    if action not in COMMANDS:
        raise ConfigInvalidError(f"fleet enqueue runs {' or '.join(COMMANDS)} (got {action!r})",
                                 {"argument": "ACTION"})
    policy = _policy(concurrency, per_cluster, canary, max_failures, order, on_lock)
    count = parse_int(steps, "--steps")
    if action != "down" and count is not None:
        raise ConfigInvalidError("--steps applies to down only", {"option": "--steps"})
    try:
        import celery  # noqa: F401
    except ImportError:
        raise ConfigInvalidError(
            "fleet enqueue needs the celery extra: pip install 'migronaut[celery]'",
            {"extra": "celery"}) from None
    from migronaut.api import executed_by
    from migronaut.executors.celery import create_app
    from migronaut.executors.celery.fleet_tasks import enqueue_fleet

    options = session.options
    with _open(session, tenants, read_only=True) as fleet:
        session.out.spinner.show("Resolving the fleet's tenants…")
        try:
            _, installed = create_app(config=options.config_flags(), config_path=options.config)
            sent = enqueue_fleet(installed, fleet, action,
                                 steps=1 if action == "down" and count is None else count,
                                 requested_by=executed_by(), reason=reason,
                                 background=background, **policy)
        finally:
            session.out.spinner.stop()
    if options.json:
        session.out.json(sent.to_json())
    else:
        render_enqueued(sent, session.out)
    return 0


def render_enqueued(sent: FleetEnqueued, out: Output) -> None:
    from migronaut._redact import sanitize_terminal

    canary = sent.policy.canary
    out.info(f"⇉ Fleet {sent.command} queued: {len(sent.tenants)} tenant(s), at most "
             f"{sent.policy.concurrency} at a time"
             + (f", {canary} canary tenant(s) first" if canary else "")
             + (f", no new tenant once more than {sent.policy.max_failures} failed"
                if sent.policy.max_failures is not None else ""))
    if sent.background:
        out.info("  each tenant's pending background migrations are enqueued once its up "
                 "succeeds")
    out.info(f"  run {sent.run_id} — follow it with: migronaut fleet logs "
             f"{sanitize_terminal(sent.run_id[:12])}")
