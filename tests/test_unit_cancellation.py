"""Cancellation tokens: a linked token is woken by its parent (no polling), carries the
parent's reason, and only an ``also`` predicate is polled."""

from __future__ import annotations

import gc
import threading
import time

from migronaut.core.context import Cancellation, LinkedCancellation
from migronaut.errors import RunAbortedError


def _waiter(token: Cancellation, timeout: float) -> tuple[threading.Thread, list[bool]]:
    woke: list[bool] = []
    thread = threading.Thread(target=lambda: woke.append(token.wait(timeout)), daemon=True)
    thread.start()
    return thread, woke


def test_a_parents_cancel_wakes_a_linked_wait_at_once_and_passes_down_the_chain() -> None:
    root = Cancellation()
    child = LinkedCancellation(root, poll_s=60.0)  # a poll would never come in this test
    grandchild = LinkedCancellation(child, poll_s=60.0)
    waits = [_waiter(token, 30.0) for token in (child, grandchild)]
    time.sleep(0.05)
    assert not child.cancelled and not grandchild.cancelled
    reason = RunAbortedError("stop now")
    root.cancel(reason)
    for thread, woke in waits:
        thread.join(5.0)
        assert woke == [True]  # woken by the parent, not by a 60 s poll nor the 30 s timeout
    assert child.reason is reason and grandchild.reason is reason


def test_a_wait_returns_false_at_its_timeout_and_a_child_of_a_cancelled_parent_is_cancelled(
) -> None:
    root = Cancellation()
    child = LinkedCancellation(root)
    started = time.monotonic()
    assert child.wait(0.05) is False
    assert time.monotonic() - started >= 0.05
    root.cancel(RunAbortedError("gone"))
    late = LinkedCancellation(root)  # linked after the parent was set
    assert late.cancelled and late.wait(10.0) is True


def test_a_childs_own_cancel_does_not_reach_its_parent() -> None:
    root = Cancellation()
    child = LinkedCancellation(root)
    child.cancel(RunAbortedError("only the child"))
    assert child.cancelled and not root.cancelled
    assert child.wait(0) is True


def test_the_also_predicate_is_polled() -> None:
    root = Cancellation()
    flag: list[bool] = []
    pacing = LinkedCancellation(root, also=lambda: bool(flag), poll_s=0.01)
    threading.Timer(0.05, lambda: flag.append(True)).start()
    started = time.monotonic()
    assert pacing.wait(10.0) is True
    assert time.monotonic() - started < 5.0


def test_linked_tokens_are_held_weakly_by_their_parent() -> None:
    root = Cancellation()
    for _ in range(100):
        LinkedCancellation(root)
    gc.collect()
    assert root._linked is not None and len(root._linked) == 0
