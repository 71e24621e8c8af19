"""The scheduling rules of a fleet run, as the pure pieces a pool or a queue coordinator uses."""

from __future__ import annotations

import pytest

from migronaut.fleet.schedule import ClusterSlots, FailureBudget, order_tenants, stages
from migronaut.fleet.tenants import Tenant

T = [Tenant("t_c", "eu"), Tenant("t_a", "us"), Tenant("t_b", "eu"), Tenant("t_d", "us")]


def test_orders_by_name_size_and_repeatable_random() -> None:
    assert [t.name for t in order_tenants(T, "name")] == ["t_a", "t_b", "t_c", "t_d"]
    sizes = {T[0]: 10, T[1]: 300, T[2]: 5}  # t_d unknown: last
    assert [t.name for t in order_tenants(T, "size", sizes=sizes)] == \
        ["t_b", "t_c", "t_a", "t_d"]
    shuffled = order_tenants(T, "random", seed=7)
    assert shuffled == order_tenants(T, "random", seed=7) and set(shuffled) == set(T)
    with pytest.raises(ValueError, match="unknown order"):
        order_tenants(T, "alpha")


def test_stages_split_the_canary_off_the_start_order() -> None:
    ordered = order_tenants(T, "name")
    assert stages(ordered, 0) == ([], ordered)
    assert stages(ordered, 1) == (ordered[:1], ordered[1:])
    assert stages(ordered, 99) == (ordered, [])


@pytest.mark.parametrize(("max_failures", "exhausted_after"), [(0, 1), (2, 3), (None, None)])
def test_the_failure_budget_tolerates_max_failures(max_failures: int | None,
                                                   exhausted_after: int | None) -> None:
    budget = FailureBudget(max_failures)
    for failures in range(1, 6):
        budget.failed()
        assert budget.exhausted == (exhausted_after is not None and failures >= exhausted_after)


def test_cluster_slots_cap_each_cluster() -> None:
    slots = ClusterSlots(1)
    queue = order_tenants(T, "name")  # a(us) b(eu) c(eu) d(us)
    assert slots.next_startable(queue) == 0
    slots.take("us")
    assert slots.next_startable(queue) == 1  # b: eu is free, a's cluster is not
    slots.take("eu")
    assert slots.next_startable(queue) is None
    slots.give_back("us")
    assert slots.next_startable(queue[1:]) == 2  # d
    assert ClusterSlots(None).next_startable(queue) == 0
