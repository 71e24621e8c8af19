"""``migronaut audit``: read-only health checks, one line per check, exit 22 when one fails.

There is no pre-connect: a configuration or connection failure is reported as a check (and the
report ends there), so ``--json`` prints an ``AuditReport`` in every case, never an error envelope
for a finding. Warnings never change the exit code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from migronaut.cli.app import command
from migronaut.cli.output import GREEN, RED, YELLOW, Output
from migronaut.cli.session import Session
from migronaut.errors import EXIT_CODES

if TYPE_CHECKING:
    from migronaut.core.results import AuditReport

_MARK: Final = {"pass": ("✔", GREEN), "warn": ("⚠", YELLOW), "fail": ("✖", RED)}


def render_report(report: AuditReport, out: Output) -> None:
    """``<✔|⚠|✖> <name padded to 12> <detail>`` per check, then the summary line."""
    for check in report.checks:
        mark, style = _MARK[check.status]
        out.info(f"{mark} {check.name:<12} {check.detail}", style=None if check.status == "pass"
                 else style)
    if report.ok:
        out.info(f"No problems found ({report.warnings} warning(s))", style=GREEN)
    else:
        out.error(f"{report.failed} check(s) failed, {report.warnings} warning(s)")


def _verdict(report: AuditReport, out: Output) -> int:
    return 0 if report.ok else EXIT_CODES["AUDIT_FAILED"]


@command(
    "audit",
    help="Read-only health checks: config, connection, transactions, changelog indexes, lock, "
    "checksums, pending and out-of-order migrations, background migrations, runtime. Exits 22 "
    "when a check fails (warnings never do). Takes no lock and writes nothing.",
    short_help="Check the deployment's health.",
)
def audit(session: Session) -> int:
    return session.run(
        lambda migrator: migrator.audit(),
        render=render_report,
        to_json=lambda report: report.to_dict(),
        exit_code=_verdict,
        read_only=True,
        connects=False,
    )
