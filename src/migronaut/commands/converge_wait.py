"""Waiting for search index builds after a converge (reference collections §7.8).

Invariants: everything was applied before the wait starts (the wait only watches); a touched
target that FAILED ends the wait at once, an untouched FAILED/STALE one never holds it; a read
that fails transiently is retried at the next poll (at most :data:`TRANSIENT_READS` in a row),
any other failure ends the wait ``unreadable``; a stop request cuts the sleeps short.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pymongo.database import Database

from migronaut.commands.converge_read import primary
from migronaut.commands.converge_search import list_search_indexes
from migronaut.core.context import Cancellation
from migronaut.core.locked_run import release_early
from migronaut.declared.plan import CollectionPlan, UpdateSearchIndex
from migronaut.declared.search_build import WaitTarget, classify_wait
from migronaut.declared.search_plan import live_search_index
from migronaut.errors import ConvergeFailedError, MigronautError, RunAbortedError

if TYPE_CHECKING:
    from migronaut.core.run import Run
    from migronaut.core.workspace import Workspace

__all__ = ["TRANSIENT_READS", "SearchWait", "is_transient", "wait_after_converge",
           "wait_for_builds", "wait_targets"]

#: Failed reads in a row that are retried before the wait ends ``unreadable``.
TRANSIENT_READS = 3
_MAX_IN_FLIGHT = 8
_PROGRESS_S = 30.0
_NETWORK_NAMES = ("MongoNetworkError", "MongoNetworkTimeoutError", "MongoServerSelectionError",
                  "MongoPoolClearedError", "AutoReconnect", "NetworkTimeout",
                  "ServerSelectionTimeoutError", "ConnectionFailure", "PoolClearedError")
_TRANSIENT_CODES = frozenset({6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435,
                              13436})
_TRANSIENT_LABELS = ("ResetPool", "RetryableWriteError", "PoolRequstedRetry")

Builds = dict[tuple[str, str], tuple[Mapping[str, Any], int | None]]


def is_transient(error: BaseException | None) -> bool:
    """A network-ish failure (by class name, code or label), up to three causes deep."""
    for _ in range(4):
        if error is None:
            return False
        if any(cls.__name__ in _NETWORK_NAMES for cls in type(error).__mro__):
            return True
        code = getattr(error, "code", None)
        if code in _TRANSIENT_CODES:
            return True
        has_label = getattr(error, "has_error_label", None)
        if callable(has_label) and any(has_label(label) for label in _TRANSIENT_LABELS):
            return True
        error = error.__cause__
    return False


@dataclass
class SearchWait:
    """The wait's end: ``outcome`` (ready/failed/timeout/unreadable/aborted), how long it
    waited, the last builds seen, and the targets still held or preexisting."""

    outcome: str
    waited_ms: int
    builds: Builds = field(default_factory=dict)
    waiting: list[WaitTarget] = field(default_factory=list)
    preexisting: list[WaitTarget] = field(default_factory=list)
    error: ConvergeFailedError | None = None


def _poll(db: Database[Any], collections: Sequence[str]) -> Builds:
    with ThreadPoolExecutor(max_workers=_MAX_IN_FLIGHT) as pool:
        lists = list(pool.map(lambda name: list_search_indexes(
            db, name, phase="wait", reason="unreadable"), collections))
    builds: Builds = {}
    for name, listed in zip(collections, lists, strict=True):
        for document in listed:
            live = live_search_index(document)
            builds[(name, live.name)] = (live.build, live.version)
    return builds


def wait_for_builds(
    db: Database[Any], targets: Sequence[WaitTarget], *, timeout_ms: int,
    cancellation: Cancellation, logger: logging.Logger,
    progress: Callable[[int], None],
    clock: Callable[[], float] = time.monotonic,
) -> SearchWait:
    """Poll the targets' collections until every target is ready, one FAILED, the budget is
    spent, a read keeps failing, or the run is stopped."""
    started = clock()
    collections = sorted({target.collection for target in targets})
    attempt = failures = 0
    last_progress = started
    builds: Builds = {}
    waiting: list[WaitTarget] = list(targets)
    preexisting: list[WaitTarget] = []

    def waited() -> int:
        return int((clock() - started) * 1000)

    while True:
        if cancellation.cancelled:
            return SearchWait("aborted", waited(), builds, waiting, preexisting)
        try:
            builds = _poll(db, collections)
            failures = 0
        except ConvergeFailedError as error:
            failures += 1
            if not is_transient(error.__cause__) or failures > TRANSIENT_READS:
                return SearchWait("unreadable", waited(), builds, waiting, preexisting, error)
            logger.warning("⚠ Reading the search indexes failed (%s) — retrying",
                           error.context.get("cause"))
        else:
            outcome, waiting, preexisting = classify_wait(targets, builds)
            if outcome is not None:
                return SearchWait(outcome, waited(), builds, waiting, preexisting)
        remaining = timeout_ms - waited()
        if remaining <= 0:
            return SearchWait("timeout", waited(), builds, waiting, preexisting)
        if clock() - last_progress >= _PROGRESS_S:
            last_progress = clock()
            logger.info("… still waiting for %d search index(es) (%ds)", len(waiting),
                        waited() // 1000)
            progress(waited())
        delay = min(1000 * 1.5 ** attempt, 10_000, remaining)
        attempt += 1
        if cancellation.wait(delay / 1000):
            return SearchWait("aborted", waited(), builds, waiting, preexisting)


def wait_targets(plans: Sequence[CollectionPlan]) -> list[WaitTarget]:
    """Every declared search index with a create/modify/unchanged row (§7.8)."""
    targets: list[WaitTarget] = []
    for plan in plans:
        since = {step.name: step.since_version for step in plan.steps
                 if isinstance(step, UpdateSearchIndex)}
        targets.extend(WaitTarget(plan.name, row.name, row.action != "unchanged",
                                  since.get(row.name))
                       for row in plan.actions if row.target == "searchIndex"
                       and row.action in ("create", "modify", "unchanged"))
    return targets


def _labels(targets: Sequence[WaitTarget], builds: Builds) -> str:
    def one(target: WaitTarget) -> str:
        build = builds.get((target.collection, target.name), ({}, None))[0]
        status = build.get("status", "not listed")
        message = f": {build['message']}" if build.get("message") else ""
        return f'{target.collection} "{target.name}" ({status}{message})'

    return ", ".join(one(target) for target in targets)


def wait_after_converge(ws: Workspace, run: Run, plans: Sequence[CollectionPlan]
                        ) -> tuple[dict[str, Any], Builds, MigronautError | None]:
    """Release the lock, wait for the targets' builds, and report: ``(result.search.wait,
    last builds, error)`` — the error (phase ``wait``, or the stop request) for a FAILED,
    timed-out, unreadable or aborted wait, for the caller to raise once the rows are
    refreshed."""
    targets = wait_targets(plans)
    config = ws.project.config
    logger = ws.project.logger
    emit = ws.events.emit
    timeout_ms = config.search_index_wait_timeout_ms
    released = release_early(ws, run)
    logger.info("… waiting for %d search index(es) (up to %ds%s)", len(targets),
                timeout_ms // 1000, ", the migration lock released" if released else "")
    emit("converge:wait", status="started", searchIndexes=len(targets), lockReleased=released,
         timeoutMs=timeout_ms)
    began = time.monotonic()
    end = wait_for_builds(
        primary(ws.connection.db), targets, timeout_ms=timeout_ms,
        cancellation=run.cancellation, logger=logger,
        progress=lambda ms: emit("converge:wait", status="progress", waitedMs=ms))
    ws.project.telemetry.search_wait(time.monotonic() - began, end.outcome)
    held = [{"collection": t.collection, "name": t.name} for t in end.waiting]
    emit("converge:wait", status=end.outcome, waitedMs=end.waited_ms,
         **({"notReady": held} if held and end.outcome != "ready" else {}))
    for target in end.preexisting:
        logger.warning('⚠ %s search index "%s" was already FAILED or STALE before this '
                       "converge", target.collection, target.name)
    wait = {"outcome": end.outcome, "waitedMs": end.waited_ms}
    if end.outcome == "ready":
        logger.info("✔ %d search index(es) ready in %dms", len(targets) - len(end.preexisting),
                    end.waited_ms)
        return wait, end.builds, None
    if end.outcome == "aborted":
        return wait, end.builds, run.cancellation.reason or RunAbortedError(
            "Run stopped by request")
    context: dict[str, Any] = {"phase": "wait", "notReady": held, "waitedMs": end.waited_ms,
                               "timeoutMs": timeout_ms}
    if end.outcome == "failed":
        failed = [t for t in end.waiting
                  if end.builds.get((t.collection, t.name), ({}, None))[0].get("status")
                  == "FAILED"]
        message = "Search index build(s) FAILED: " + _labels(failed, end.builds)
        return wait, end.builds, ConvergeFailedError(message, {**context, "reason": "failed"})
    if end.outcome == "unreadable" and end.error is not None:
        return wait, end.builds, ConvergeFailedError(
            end.error.message, {**end.error.context, **context, "reason": "unreadable"})
    return wait, end.builds, ConvergeFailedError(
        f"Search index build(s) not ready after {timeout_ms}ms: "
        + _labels(end.waiting, end.builds) + " — a STALE index will not fix itself; otherwise "
        "converge again later or raise search_index_wait_timeout_ms",
        {**context, "reason": "timeout"})
