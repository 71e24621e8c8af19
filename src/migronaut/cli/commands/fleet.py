"""``migronaut fleet …``: the commands over every tenant database of the configured fleet.

Presentation only: flags → :class:`~migronaut.fleet.api.Fleet` → render or JSON → exit code.
``fleet status`` reads; ``up``/``down``/``converge``/``audit`` run the ordinary command in each
tenant with graceful SIGINT/SIGTERM (the first stops new tenants and lets running ones finish
their migration in flight); ``logs`` shows the run records. Exit codes: 0 when every tenant
succeeded (``status --check``: is up to date), ``FLEET_PARTIAL`` (38) otherwise, the error's own
code when the fleet could not start (``FLEET_INVALID`` 37, ``CONFIG_INVALID`` 6, …).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from migronaut.cli.app import command, group
from migronaut.cli.session import Session, parse_int
from migronaut.errors import EXIT_CODES

if TYPE_CHECKING:
    from migronaut.cli.output import Output
    from migronaut.fleet.api import Fleet
    from migronaut.fleet.runner import FleetResult

F = TypeVar("F", bound=Callable[..., Any])

PARTIAL_EXIT = EXIT_CODES["FLEET_PARTIAL"]

fleet_group = group(
    "fleet",
    help="Work on every tenant database of the fleet configured in [fleet]: status, up, "
    "down, converge, audit, logs. Each tenant keeps its own changelog and lock.",
    short_help="Migrate every tenant database.",
)

_TENANTS_HELP = "Only the tenants whose name matches this glob (tenant_0*)."


def _tenants_option(f: F) -> F:
    return click.option("--tenants", metavar="PATTERN", help=_TENANTS_HELP)(f)


def _policy_options(f: F) -> F:
    options = [
        click.option("--concurrency", metavar="N", help="Tenants at once (default: the "
                     "fleet's concurrency, 4)."),
        click.option("--per-cluster", metavar="N", help="At most N tenants of one cluster at "
                     "once."),
        click.option("--canary", metavar="K", help="Run K tenants first; the rest only if "
                     "every one succeeded."),
        click.option("--max-failures", metavar="F", help="Stop starting tenants after F "
                     "failures are exceeded (0: at the first); running ones finish."),
        click.option("--order", metavar="name|size|random", help="The order tenants start in."),
        click.option("--on-lock", metavar="skip|wait", help="A tenant whose lock is held: skip "
                     "it (default) or wait for it (bounded by lock_wait_ms)."),
    ]
    for option in reversed(options):
        f = option(f)
    return _tenants_option(f)


def _open(session: Session, tenants: str | None, *, read_only: bool) -> Fleet:
    from migronaut.fleet.api import Fleet

    options = session.options
    return Fleet(options.config_flags(), config_path=options.config, tenants=tenants,
                 tenant_logger=None if not options.verbose else _default_logger(),
                 _quick_connect=read_only, _flags_origin="flag")


def _default_logger() -> Any:
    from migronaut.core.config import DEFAULT_LOGGER

    return DEFAULT_LOGGER


def _policy(concurrency: str | None, per_cluster: str | None, canary: str | None,
            max_failures: str | None, order: str | None, on_lock: str | None) -> dict[str, Any]:
    return {
        "concurrency": parse_int(concurrency, "--concurrency"),
        "per_cluster_concurrency": parse_int(per_cluster, "--per-cluster"),
        "canary": parse_int(canary, "--canary"),
        "max_failures": parse_int(max_failures, "--max-failures"),
        "order": order, "on_lock": on_lock,
    }


@command(
    "status",
    help="Where every tenant stands: a summary of up to date / pending / failed / in doubt / "
    "locked / unreachable (counts and percentages) and the tenants that are not up to date; "
    "--all lists every tenant. --check exits 38 unless every tenant is up to date.",
    short_help="Every tenant's state.",
    parent=fleet_group,
)
@_tenants_option
@click.option("--all", "show_all", is_flag=True, help="List every tenant, up to date ones too.")
@click.option("--check", is_flag=True, help="Exit 38 (FLEET_PARTIAL) unless every tenant is "
              "up to date (a CI gate).")
@click.option("--concurrency", metavar="N", help="Tenants read at once.")
def status(session: Session, tenants: str | None, show_all: bool, check: bool,
           concurrency: str | None) -> int:
    workers = parse_int(concurrency, "--concurrency")
    with _open(session, tenants, read_only=True) as fleet:
        if workers is not None:
            fleet.policy(concurrency=workers)  # checked like the config key
        session.out.spinner.show("Reading the fleet…")
        try:
            result = fleet.status(concurrency=workers)
        finally:
            session.out.spinner.stop()
    if session.options.json:
        session.out.json(result.to_json())
    else:
        render_status = _render().render_status
        render_status(result, session.out, show_all=show_all)
    return PARTIAL_EXIT if check and not result.up_to_date else 0


def _render() -> Any:
    from migronaut.cli import render_fleet

    return render_fleet


def _run(session: Session, tenants: str | None, call: Callable[[Fleet], FleetResult],
         command_name: str) -> int:
    from migronaut.cli.render_fleet import FleetProgress, render_result
    from migronaut.cli.signals import GracefulStop

    guard = GracefulStop(session.out)
    guard.finishing = "starting no more tenants; running ones finish their migration in flight"
    session.guard = guard
    with guard, _open(session, tenants, read_only=command_name == "audit") as fleet:
        guard.bind(fleet)
        progress = FleetProgress(session.out, command_name)
        progress.attach(fleet)
        try:
            result = call(fleet)
        finally:
            progress.close()
    if session.options.json:
        session.out.json(result.to_json())
    else:
        render_result(result, session.out)
    return 0 if result.ok else PARTIAL_EXIT


@command("up", help="Apply pending migrations in every tenant (its ordinary `up`, under its own "
         "lock); a tenant already up to date costs one status read.",
         short_help="up in every tenant.", parent=fleet_group)
@_policy_options
def up(session: Session, tenants: str | None, concurrency: str | None, per_cluster: str | None,
       canary: str | None, max_failures: str | None, order: str | None,
       on_lock: str | None) -> int:
    policy = _policy(concurrency, per_cluster, canary, max_failures, order, on_lock)
    return _run(session, tenants, lambda fleet: fleet.up(**policy), "up")


@command("down", help="Revert the last N applied migrations in every tenant (its ordinary "
         "`down --steps N`).", short_help="down --steps N in every tenant.", parent=fleet_group)
@click.option("--steps", metavar="N", default="1", show_default=True,
              help="How many migrations to revert in each tenant.")
@_policy_options
def down(session: Session, steps: str, tenants: str | None, concurrency: str | None,
         per_cluster: str | None, canary: str | None, max_failures: str | None,
         order: str | None, on_lock: str | None) -> int:
    count = parse_int(steps, "--steps") or 0
    policy = _policy(concurrency, per_cluster, canary, max_failures, order, on_lock)
    return _run(session, tenants, lambda fleet: fleet.down(steps=count, **policy), "down")


@command("converge", help="Converge the declared collections in every tenant (its ordinary "
         "`converge`). Asks once before starting unless --yes (a tenant's plan may drop or "
         "rebuild indexes).", short_help="converge in every tenant.", parent=fleet_group)
@click.option("-y", "--yes", is_flag=True, help="Converge without asking (required with --json).")
@_policy_options
def converge(session: Session, yes: bool, tenants: str | None, concurrency: str | None,
             per_cluster: str | None, canary: str | None, max_failures: str | None,
             order: str | None, on_lock: str | None) -> int:
    policy = _policy(concurrency, per_cluster, canary, max_failures, order, on_lock)
    if not yes and not session.confirm(
            "converge the declared collections in every tenant of the fleet (indexes may be "
            "dropped or rebuilt)? [y/N] ", action="fleet converge"):
        return session.aborted()
    return _run(session, tenants, lambda fleet: fleet.converge(**policy), "converge")


@command("audit", help="The read-only health checks in every tenant; a tenant whose audit fails "
         "is failed.", short_help="audit every tenant.", parent=fleet_group)
@_policy_options
def audit(session: Session, tenants: str | None, concurrency: str | None,
          per_cluster: str | None, canary: str | None, max_failures: str | None,
          order: str | None, on_lock: str | None) -> int:
    policy = _policy(concurrency, per_cluster, canary, max_failures, order, on_lock)
    return _run(session, tenants, lambda fleet: fleet.audit(**policy), "audit")


@command("logs", help="The fleet run records: the newest runs, or one run (by id or unique "
         "prefix) tenant by tenant. A run that was killed shows as incomplete.",
         short_help="Fleet run records.", parent=fleet_group)
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("--limit", metavar="N", default="20", show_default=True,
              help="How many runs to list.")
def logs(session: Session, run_id: str | None, limit: str) -> int:
    count = parse_int(limit, "--limit") or 0
    if not 1 <= count <= 1000:
        from migronaut.errors import ConfigInvalidError

        raise ConfigInvalidError(f"--limit must be from 1 to 1000 (got {limit})",
                                 {"option": "--limit"})
    render = _render()
    out: Output = session.out
    with _open(session, None, read_only=True) as fleet:
        if run_id is None:
            records = fleet.runs(count)
            if session.options.json:
                out.json([record.to_json(tenants=False) for record in records])
            else:
                render.render_runs(records, out)
            return 0
        record = fleet.logs(run_id)
    if session.options.json:
        out.json(record.to_json())
    else:
        render.render_record(record, out)
    return 0
