"""``migronaut fleet enqueue COMMAND``: a fleet run handed to the Celery migration queue.

The tenants are resolved and ordered here, the run record (with its plan) is written, and one
coordinating step is sent; the workers do the rest — the canary stage, the failure budget, one
task per tenant. The command returns at once with the run id: ``fleet logs RUN`` and ``fleet
status`` follow the run from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from migronaut.cli.app import command
from migronaut.cli.commands.fleet import fleet_group
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
         "at a time, no new tenant after --max-failures failures. Returns at once with the run "
         "id; follow it with `fleet logs RUN` and `fleet status`.")
@click.argument("action", type=click.Choice(["up", "down", "converge"]))
@click.option("--steps", metavar="N", help="down: how many migrations to revert in each tenant.")
@click.option("--tenants", "pattern", metavar="PATTERN",
              help="Only the tenants whose name matches this glob.")
@click.option("--concurrency", metavar="N", help="Tenants in flight at once.")
@click.option("--per-cluster-concurrency", metavar="N",
              help="Tenants of one cluster in flight at once.")
@click.option("--canary", metavar="K", help="Run K tenants first; the rest only if all succeed.")
@click.option("--max-failures", metavar="F",
              help="Send no new tenant after F failures (0: the first failure stops).")
@click.option("--order", type=click.Choice(["name", "size", "random"]),
              help="The order tenants are sent in.")
@click.option("--on-lock", type=click.Choice(["skip", "wait"]),
              help="A tenant whose lock is held: skip it, or wait up to lock_wait_ms.")
@click.option("--reason", metavar="TEXT", help="Why; recorded in each tenant's history.")
def enqueue(session: Session, action: str, steps: str | None, pattern: str | None,
            concurrency: str | None, per_cluster_concurrency: str | None, canary: str | None,
            max_failures: str | None, order: str | None, on_lock: str | None,
            reason: str | None) -> int:
    policy: dict[str, Any] = {
        "concurrency": _int(concurrency, "--concurrency", 1),
        "per_cluster_concurrency": _int(per_cluster_concurrency, "--per-cluster-concurrency", 1),
        "canary": _int(canary, "--canary", 0),
        "max_failures": _int(max_failures, "--max-failures", 0),
        "order": order, "on_lock": on_lock}
    count = _int(steps, "--steps", 1)
    if action == "down" and count is None:
        count = 1
    elif action != "down" and count is not None:
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
    from migronaut.fleet.api import Fleet

    options = session.options
    flags = options.config_flags()
    with Fleet(flags, tenants=pattern, config_path=options.config,
               _flags_origin="flag") as handle:
        session.out.spinner.show("Resolving the fleet's tenants…")
        try:
            _, installed = create_app(config=flags, config_path=options.config)
            sent = enqueue_fleet(installed, handle, action, steps=count,
                                 requested_by=executed_by(), reason=reason, **policy)
        finally:
            session.out.spinner.stop()
    if options.json:
        session.out.json(sent.to_json())
    else:
        render_enqueued(sent, session.out)
    return 0


def _int(value: str | None, flag: str, low: int) -> int | None:
    """A numeric flag (ranges are checked with the fleet's policy, naming the option)."""
    number = parse_int(value, flag)
    if number is not None and number < low:
        raise ConfigInvalidError(f"{flag} must be at least {low} (got {value!r})",
                                 {"option": flag})
    return number


def render_enqueued(sent: FleetEnqueued, out: Output) -> None:
    from migronaut._redact import sanitize_terminal

    canary = sent.policy.canary
    out.info(f"⇉ Fleet {sent.command} queued: {len(sent.tenants)} tenant(s), at most "
             f"{sent.policy.concurrency} at a time"
             + (f", {canary} canary tenant(s) first" if canary else "")
             + (f", stopping after {sent.policy.max_failures} failure(s)"
                if sent.policy.max_failures is not None else ""))
    out.info(f"  run {sent.run_id} — follow it with: migronaut fleet logs "
             f"{sanitize_terminal(sent.run_id[:12])}")
