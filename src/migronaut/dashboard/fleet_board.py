"""What the dashboard's fleet page shows: every tenant's state, read through
:meth:`migronaut.fleet.api.Fleet.tenant_status` (the rows ``fleet status --all`` prints), with
the counts and percentages of ``fleet status --json`` and server-side filters.

The tenants are resolved afresh for each page (a tenant added since the dashboard started is
listed), and a tenant's own pages (``/t/<tenant>/``) are only ever opened for a name the fleet
lists: the dashboard never reads a database its fleet does not name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from migronaut._json import json_document
from migronaut.errors import ConfigInvalidError, ConnectionFailedError
from migronaut.fleet.status import STATES, FleetStatus

if TYPE_CHECKING:
    from migronaut import Fleet
    from migronaut.fleet.tenants import Tenant

__all__ = ["MAX_NAME_FILTER", "FleetBoard", "check_filters"]

#: The longest name filter taken (a database name is at most 63 bytes).
MAX_NAME_FILTER = 64


class FleetBoard:
    """The fleet page's documents over one :class:`~migronaut.fleet.api.Fleet` (its shared
    clients live as long as the dashboard)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def tenants(self) -> tuple[list[Tenant], dict[str, dict[str, Any]]]:
        """The fleet's tenants now, and the clusters that could not list theirs."""
        from migronaut.fleet.tenants import resolve_tenants

        unreachable: dict[str, ConnectionFailedError] = {}
        tenants = resolve_tenants(self.fleet.fleet_config, self.fleet.clients, None,
                                  unreachable=unreachable)
        return tenants, {name: error.to_dict() for name, error in unreachable.items()}

    def tenant(self, name: str) -> Tenant | None:
        """The fleet's tenant ``name``, or ``None`` when the fleet does not list it."""
        for tenant in self.tenants()[0]:
            if tenant.name == name:
                return tenant
        return None

    def summary(self, *, state: str | None = None, name: str | None = None) -> dict[str, Any]:
        """``fleet status --json`` (counts and percentages over every tenant) with the rows
        narrowed to ``state`` and to names containing ``name`` (case-insensitive)."""
        state, name = check_filters(state, name)
        tenants, unreachable = self.tenants()
        statuses = self.fleet._map(self.fleet.tenant_status, tenants, None)
        document = FleetStatus(statuses, unreachable).to_json()
        rows = [row for row in document["tenants"]
                if (state is None or row["state"] == state)
                and (name is None or name.casefold() in row["tenant"].casefold())]
        document.update(tenants=rows, shown=len(rows), states=list(STATES),
                        filters={"state": state, "name": name})
        return json_document(document)  # type: ignore[no-any-return]


def check_filters(state: str | None, name: str | None) -> tuple[str | None, str | None]:
    """The page's ``?state=`` and ``?name=``: an empty one is no filter; an unknown state or an
    over-long name is ``CONFIG_INVALID`` (a 400) naming it."""
    state = state or None
    name = (name or "").strip() or None
    if state is not None and state not in STATES:
        raise ConfigInvalidError(f"state must be one of {', '.join(STATES)} (got {state!r})",
                                 {"option": "state"})
    if name is not None and len(name) > MAX_NAME_FILTER:
        raise ConfigInvalidError(f"name must be at most {MAX_NAME_FILTER} characters",
                                 {"option": "name"})
    return state, name
