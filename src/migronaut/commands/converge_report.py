"""How a real converge reports (collections.md §2.6.4, §2.8, §2.9, §7.7): its closing log
lines, its history entry and the counts of ``converge:end``.

Invariants: a history entry is written only for a run that changed something or failed (a
converge that found everything in place leaves no trace, a dry run never does), and it holds
only the rows that changed, failed or conflicted; writing it is best effort
(:class:`~migronaut.observability.converge_history.ConvergeHistory`); nothing here decides
anything about the run — converge never reads its history.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from migronaut.declared.plan import CollectionPlan, ConvergeResult
from migronaut.observability.converge_history import ConvergeHistory

if TYPE_CHECKING:
    from logging import Logger

    from migronaut.commands.converge_options import ConvergeOptions
    from migronaut.core.run import Run
    from migronaut.core.workspace import Workspace

__all__ = ["action_counts", "closing_lines", "history", "record_history"]


def history(ws: Workspace) -> ConvergeHistory:
    """The workspace's converge history collection (``converge_log_collection``)."""
    collection = ws.connection.db[ws.project.config.converge_log_collection]
    return ConvergeHistory(collection, ws.project.logger)


def action_counts(plans: Sequence[CollectionPlan]) -> dict[str, int]:
    """``converge:end``'s ``counts``: rows by action."""
    counts: dict[str, int] = {}
    for plan in plans:
        for row in plan.actions:
            counts[row.action] = counts.get(row.action, 0) + 1
    return counts


def closing_lines(logger: Logger, plans: Sequence[CollectionPlan], result: ConvergeResult,
                  duration_ms: int) -> None:
    """The lines a successful run ends with (§2.6.4): what changed, undeclared indexes kept,
    search builds (§7.7)."""
    touched = sum(1 for plan in plans if any(row.status == "applied" for row in plan.actions))
    if result.changed:
        logger.info("✔ Converged %d change(s) in %d of %d collection(s) in %dms",
                    result.changed, touched, len(plans), duration_ms)
    else:
        logger.info("✔ Collections already match their declarations")
    kept = sum(1 for plan in plans for row in plan.actions
               if row.action == "keep" and row.reason == "not declared")
    if kept:
        logger.info("%d undeclared index(es) kept — converge with prune to drop them", kept)
    _report_builds(logger, result)


def _report_builds(logger: Logger, result: ConvergeResult) -> None:
    """A note for the search indexes still building, a warning per STALE and per FAILED one."""
    entries = list((result.search or {}).get("notReady") or ())
    building = [e for e in entries if e["status"] not in ("FAILED", "STALE")]
    if building:
        logger.info("%d search index(es) still building: %s — set wait_for_search_indexes "
                    "(--wait-search) to wait for them", len(building),
                    ", ".join(f'{e["collection"]} "{e["name"]}"' for e in building))
    for entry in entries:
        if entry["status"] in ("FAILED", "STALE"):
            what = "FAILED to build" if entry["status"] == "FAILED" else \
                "is STALE (queryable, but no longer replicating)"
            logger.warning('⚠ %s search index "%s" %s%s', entry["collection"], entry["name"],
                           what, f': {entry["message"]}' if entry.get("message") else "")


def record_history(ws: Workspace, run: Run, options: ConvergeOptions, result: ConvergeResult,
                   *, started_at: float, duration_ms: int, error: str | None,
                   restored: Sequence[dict[str, Any]] = ()) -> None:
    """The history entry of a run that changed something or failed (§2.9); ``restored``: the
    rows of the indexes an interrupted rebuild had dropped, restored first."""
    if result.changed <= 0 and error is None and not restored:
        return
    actions = [*restored, *({"collection": plan.name, **row.to_dict()}
                            for plan in result.collections for row in plan.actions
                            if row.status in ("applied", "failed")
                            or row.action == "conflict")]
    entry: dict[str, Any] = {
        "runId": run.id, "executedBy": run.executed_by,
        "environment": ws.project.config.resolved_environment, "trigger": options.trigger,
        "startedAt": datetime.fromtimestamp(started_at, UTC),
        "finishedAt": datetime.now(UTC), "durationMs": duration_ms,
        "success": error is None, "changed": result.changed, "actions": actions,
    }
    for key, value in (("error", error), ("requestedBy", options.requested_by),
                       ("reason", options.reason)):
        if value is not None:
            entry[key] = value
    if result.unstable:
        entry["unstable"] = [dict(item) for item in result.unstable]
    history(ws).record(entry)
