"""Where each tenant of a fleet stands, read through the ordinary ``status`` command.

One read path: a tenant's state comes from :meth:`migronaut.api.Migrator.status` over the
tenant's database with its cluster's shared client — the very rows ``migronaut --db TENANT
status`` shows — plus the lock's status when something is pending or running. An up-to-date
tenant costs a ping and one changelog read; no process, no connection pool.

States, worst first: ``unreachable`` (its cluster did not answer), ``in-doubt`` (a migration's
outcome is unknown: only ``migronaut resolve`` decides), ``failed`` (its last attempt failed, or
its state cannot be read), ``locked`` (a run holds its lock), ``pending``, ``up-to-date``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.errors import ConnectionFailedError, MigronautError

if TYPE_CHECKING:
    from collections.abc import Callable

    from migronaut.api import Migrator
    from migronaut.core.results import StatusRow
    from migronaut.fleet.tenants import Tenant

__all__ = [
    "FAILED",
    "IN_DOUBT",
    "LOCKED",
    "PENDING",
    "STATES",
    "UNREACHABLE",
    "UP_TO_DATE",
    "FleetStatus",
    "TenantStatus",
    "failure_of",
    "read_tenant_status",
    "state_of",
]

UP_TO_DATE = "up-to-date"
PENDING = "pending"
FAILED = "failed"
IN_DOUBT = "in-doubt"
LOCKED = "locked"
UNREACHABLE = "unreachable"
#: Every state, in the order summaries show them.
STATES = (UP_TO_DATE, PENDING, FAILED, IN_DOUBT, LOCKED, UNREACHABLE)


@dataclass(frozen=True)
class TenantStatus:
    """One tenant's state: ``applied`` and ``pending`` migrations (``pending`` counts failed
    attempts too: ``up`` would run them), and the typed error as JSON when it has one — for a
    ``failed`` migration, what ``status`` shows of it (:func:`failure_of`)."""

    tenant: Tenant
    state: str
    applied: int
    pending: int
    error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tenant": self.tenant.name, "cluster": self.tenant.cluster,
                               "state": self.state, "applied": self.applied,
                               "pending": self.pending}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class FleetStatus:
    """Every tenant's state; ``unreachable_clusters`` are clusters whose tenants could not even
    be listed (a pattern or registry source on a cluster that did not answer)."""

    tenants: list[TenantStatus]
    unreachable_clusters: dict[str, dict[str, Any]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """The number of tenants in each state, every state present (zeros included)."""
        out = dict.fromkeys(STATES, 0)
        for status in self.tenants:
            out[status.state] = out.get(status.state, 0) + 1
        return out

    @property
    def up_to_date(self) -> bool:
        """Whether every tenant is up to date and every cluster answered (``--check``)."""
        return not self.unreachable_clusters and all(
            s.state == UP_TO_DATE for s in self.tenants)

    def to_json(self) -> dict[str, Any]:
        total = len(self.tenants)
        counts = self.counts()
        out: dict[str, Any] = {
            "total": total,
            "counts": counts,
            "percent": {state: round(100 * n / total, 1) if total else 0.0
                        for state, n in counts.items()},
            "upToDate": self.up_to_date,
            "tenants": [s.to_json() for s in self.tenants],
        }
        if self.unreachable_clusters:
            out["unreachableClusters"] = self.unreachable_clusters
        return out


def state_of(rows: list[StatusRow]) -> tuple[str, int, int]:
    """(state, applied, pending) from a tenant's status rows, before its lock is considered:
    ``in-doubt`` > ``failed`` > ``locked`` (a live run's ``running`` row) > ``pending`` >
    ``up-to-date``."""
    applied = sum(1 for row in rows if row.status == "applied")
    pending = sum(1 for row in rows if row.status in ("pending", "failed"))
    kinds = {row.status for row in rows}
    if "in-doubt" in kinds:
        return IN_DOUBT, applied, pending
    if "failed" in kinds:
        return FAILED, applied, pending
    if "running" in kinds:
        return LOCKED, applied, pending
    return (PENDING if pending else UP_TO_DATE), applied, pending


def failure_of(rows: list[StatusRow]) -> dict[str, Any] | None:
    """The first failed migration of a tenant's status rows as its ``error`` object: its
    ``file``, the ``message`` its changelog record stores and ``failedAt`` — the changelog keeps
    no error code, so none is made up. ``None`` when no row failed."""
    from migronaut._json import to_json_value
    from migronaut._redact import redact

    row = next((r for r in rows if r.status == "failed"), None)
    if row is None:
        return None
    error: dict[str, Any] = {"file": row.file, "message": redact(row.error or "")}
    if row.failed_at is not None:
        error["failedAt"] = to_json_value(row.failed_at)
    return error


def read_tenant_status(tenant: Tenant,
                       migrator_of: Callable[[Tenant], Migrator]) -> TenantStatus:
    """One tenant's status through its ordinary migrator (``migrator_of(tenant)``, on its
    cluster's shared client; closed after the read). Errors become states:
    ``CONNECTION_FAILED`` → ``unreachable``, any other typed error (``STATE_INVALID``…) →
    ``failed`` with the error; a failed migration → ``failed`` with :func:`failure_of`."""
    try:
        with migrator_of(tenant) as migrator:
            rows = migrator.status("all", checksums=False)
            state, applied, pending = state_of(rows)
            if state == PENDING and migrator.lock_status().blocks_runs:
                state = LOCKED
    except ConnectionFailedError as error:
        return TenantStatus(tenant, UNREACHABLE, 0, 0, error.to_dict())
    except MigronautError as error:
        return TenantStatus(tenant, FAILED, 0, 0, error.to_dict())
    return TenantStatus(tenant, state, applied, pending,
                        failure_of(rows) if state == FAILED else None)
