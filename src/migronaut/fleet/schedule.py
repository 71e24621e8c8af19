"""The scheduling rules of a fleet run, as plain pieces without threads or I/O (the run's
:class:`FleetPolicy` says which apply).

A thread pool (:mod:`migronaut.fleet.runner`) or a queue coordinator applies the same rules:

- :func:`order_tenants`: the order tenants start in — by name, by size (smallest first, so a
  broken migration shows on a small tenant before it meets a large one) or random;
- :func:`stages`: the canary stage and the rest; the rest starts only if every canary succeeded;
- :class:`FailureBudget`: ``max_failures`` tolerated failures; the next one stops new starts
  (``0``: the first failure stops them); tenants already running finish;
- :class:`ClusterSlots`: at most ``per_cluster`` tenants of one cluster at a time, so one
  cluster is not flooded while another is idle.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from migronaut.fleet.config import FleetPolicy
from migronaut.fleet.tenants import Tenant

__all__ = ["ClusterSlots", "FailureBudget", "FleetPolicy", "order_tenants", "stages"]


def order_tenants(tenants: Iterable[Tenant], order: str, *,
                  sizes: Mapping[Tenant, int] | None = None,
                  seed: int | None = None) -> list[Tenant]:
    """``tenants`` in start order: ``name`` (cluster, then name), ``size`` (``sizes``
    ascending, unknown sizes last, then name) or ``random`` (``seed`` makes it repeatable)."""
    by_name = sorted(tenants, key=lambda t: (t.name, t.cluster))
    if order == "name":
        return by_name
    if order == "size":
        known = sizes or {}
        return sorted(by_name, key=lambda t: (t not in known, known.get(t, 0)))
    if order == "random":
        random.Random(seed).shuffle(by_name)
        return by_name
    raise ValueError(f"unknown order {order!r}")


def stages(tenants: Sequence[Tenant], canary: int) -> tuple[list[Tenant], list[Tenant]]:
    """(the canary stage, the rest): the first ``canary`` tenants of the start order."""
    count = max(0, min(canary, len(tenants)))
    return list(tenants[:count]), list(tenants[count:])


@dataclass
class FailureBudget:
    """``max_failures`` failures are tolerated; one more and no tenant starts any more."""

    max_failures: int | None
    failures: int = 0

    def failed(self) -> None:
        self.failures += 1

    @property
    def exhausted(self) -> bool:
        return self.max_failures is not None and self.failures > self.max_failures


@dataclass
class ClusterSlots:
    """How many tenants of each cluster are running, capped at ``per_cluster``."""

    per_cluster: int | None
    running: dict[str, int] = field(default_factory=dict)

    def free(self, cluster: str) -> bool:
        return self.per_cluster is None or self.running.get(cluster, 0) < self.per_cluster

    def take(self, cluster: str) -> None:
        self.running[cluster] = self.running.get(cluster, 0) + 1

    def give_back(self, cluster: str) -> None:
        self.running[cluster] = max(0, self.running.get(cluster, 0) - 1)

    def next_startable(self, queue: Sequence[Tenant]) -> int | None:
        """The index of the first tenant in ``queue`` whose cluster has a free slot."""
        for index, tenant in enumerate(queue):
            if self.free(tenant.cluster):
                return index
        return None
