"""``converge``: make the declared collections, validators and indexes exist as declared
(collections.md §2.2, §2.3, §2.6, §2.8, §2.9).

The dry run reads and plans (:mod:`migronaut.commands.converge_plan`; no lock, no events, no
history). The real run is a locked run (:mod:`migronaut.core.locked_run`, ``command:
'converge'``) that reads everything, plans, refuses any conflict before the first write, then
for each collection that has work re-reads and re-plans, applies the steps
(:mod:`migronaut.commands.converge_apply`) and re-plans once more (the fixed-point check), and
reports (:mod:`migronaut.commands.converge_report`).

Invariants: options are checked before anything is resolved or connected; a conflict anywhere
refuses the whole run before any write; a re-plan that introduces a conflict or a destructive
row stops before touching that collection; a converge with nothing to do reads exactly what
its dry run reads; every row of a result is settled; a failure after ``converge:start`` still
produces ``converge:end``, a history entry and ``context.converge``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from migronaut.commands.converge_apply import StepFailed, apply_step
from migronaut.commands.converge_options import ConvergeOptions, validate_converge_options
from migronaut.commands.converge_plan import (
    plan_all,
    plan_declared,
    plan_options,
    search_result,
    warn_search,
)
from migronaut.commands.converge_read import read_one
from migronaut.commands.converge_rebuilds import (
    RebuildJournal,
    journal_name,
    restore_interrupted,
)
from migronaut.commands.converge_report import (
    action_counts,
    closing_lines,
    history,
    record_history,
)
from migronaut.core.locked_run import check_between, locked_run
from migronaut.declared.plan import CollectionPlan, ConvergeResult, PlanRow
from migronaut.declared.planner import plan_collection
from migronaut.declared.search_plan import UNAVAILABLE
from migronaut.declared.sources import load_definitions
from migronaut.errors import (
    ConvergeFailedError,
    MigrationBlockedError,
    MigronautError,
    describe_exception,
)

if TYPE_CHECKING:
    from pymongo.database import Database

    from migronaut.core.run import Run
    from migronaut.core.workspace import Workspace
    from migronaut.declared.definition import CollectionDefinition

__all__ = ["VERIFY_RETRY_DELAYS", "ConvergeOptions", "converge", "converge_history",
           "converge_in_run", "plan_declared", "validate_converge_options"]

_LABELS = {"index": "index", "validator": "validator", "collection": "collection",
           "searchIndex": "search index"}
_DONE = {"create": "Created", "modify": "Modified", "recreate": "Rebuilt", "drop": "Dropped"}
#: Seconds the fixed-point check waits before reading a collection again while its search
#: list still shows a change it just applied: Atlas lists search indexes eventually (§2.6.3).
VERIFY_RETRY_DELAYS = (0.25, 0.5, 1.0)


def converge_history(ws: Workspace, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` history entries (§2.9), newest first."""
    from migronaut.observability.converge_history import check_limit

    check_limit(limit)
    with ws.slot.busy():
        ws.connection.connect()
        return history(ws).entries(limit)


def converge(ws: Workspace, options: ConvergeOptions) -> ConvergeResult:
    """Plan (``dry_run``) or converge every declared collection."""
    validate_converge_options(options)
    definitions = load_definitions(ws.project.config)
    logger = ws.project.logger
    if not definitions:
        if not options.dry_run:
            logger.info("No collections declared — set collections or collections_dir to "
                        "declare some")
        return ConvergeResult(dry_run=options.dry_run, changed=0, in_sync=True)
    if options.dry_run:
        with ws.slot.busy():
            ws.connection.connect()
            result = plan_declared(ws, definitions, options, warn=True)
        changing = sum(1 for plan in result.collections if plan.changes)
        level = 20 if result.changed else 10
        logger.log(level, "Planned %d change(s) in %d of %d collection(s)", result.changed,
                   changing, len(result.collections))
        return result
    box: list[ConvergeResult] = []
    locked_run(ws, "converge", None,
               lambda run: box.append(converge_in_run(ws, run, definitions, options)),
               no_lock=options.no_lock, requested_by=options.requested_by,
               reason=options.reason)
    return box[0]


def converge_in_run(ws: Workspace, run: Run, definitions: Sequence[CollectionDefinition],
                    options: ConvergeOptions) -> ConvergeResult:
    """A real converge inside a locked run someone else holds (its own, or ``up``'s — §2.11)."""
    return _Converge(ws, run, definitions, options).run()


def _describe_conflict(collection: str, row: PlanRow) -> str:
    if row.target == "collection":
        return f"{collection} {row.reason}"
    what = {"index": f'index "{row.name}"', "searchIndex": f'search index "{row.name}"',
            "validator": "the validator"}[row.target]
    return f"{collection} {what}: {row.reason}"


def _still_searching(plan: CollectionPlan) -> bool:
    """A search-index row of ``plan`` still shows a change."""
    return any(row.target == "searchIndex" and row.is_change for row in plan.actions)


class _Converge:
    """One real converge inside its locked run (§2.3 steps 3–10)."""

    def __init__(self, ws: Workspace, run: Run, definitions: Sequence[CollectionDefinition],
                 options: ConvergeOptions) -> None:
        self.ws = ws
        self.run_ = run
        self.definitions = definitions
        self.options = options
        self.logger = ws.project.logger
        self.emit: Callable[..., None] = ws.events.emit
        self.plans: list[CollectionPlan] = []
        self.unstable: list[dict[str, Any]] = []
        self.search_wait: dict[str, Any] | None = None
        self.stepped = False  #: a step was started since the first read
        self.journal = RebuildJournal(
            ws.connection.state_db[journal_name(ws.project.config.converge_log_collection)],
            run.id)
        self.restored: list[dict[str, Any]] = []  #: history rows of the indexes restored
        self.started = time.monotonic()
        self.started_at = time.time()

    # ------------------------------------------------------------------------------- run

    def run(self) -> ConvergeResult:
        if self.options.ordered:
            self._check_ordered()
        planned = plan_all(self.ws, self.definitions, self.options)
        warn_search(self.ws, planned.plans, planned.search)
        self.plans = planned.plans
        self.facts, self.search, self.read_search = (planned.facts, planned.search,
                                                     planned.read_search)
        self.emit("converge:start", trigger=self.options.trigger,
                  collections=len(self.definitions))
        try:
            self._restore_interrupted()
            self._guard()
            for index, definition in enumerate(self.definitions):
                self._collection(index, definition)
            self._wait_searches()
        except BaseException as error:
            self._settle_rest()
            result = self._result()
            self._finish(result, error)
            if isinstance(error, MigronautError):
                error.context = {**error.context, "converge": result.to_dict()}
            raise
        result = self._result()
        self._finish(result, None)
        return result

    def _restore_interrupted(self) -> None:
        """Restore what an interrupted rebuild dropped, before anything is decided
        (:mod:`migronaut.commands.converge_rebuilds`); the plans are then made again."""
        restored = restore_interrupted(self.ws.connection.state_db, self.journal)
        for collection, name in restored:
            self.logger.warning('⚠ %s index "%s" restored: an interrupted rebuild had dropped it',
                                collection, name)
            self.emit("converge:action", collection=collection, target="index", name=name,
                      action="restore", status="applied")
            self.restored.append({"collection": collection, "target": "index", "name": name,
                                  "action": "restore", "status": "applied"})
        if restored:
            planned = plan_all(self.ws, self.definitions, self.options)
            self.plans, self.facts = planned.plans, planned.facts
            self.search, self.read_search = planned.search, planned.read_search

    def _check_ordered(self) -> None:
        changelog = self.ws.connection.changelog
        applied = set(changelog.applied_names())
        pending = [name for name in self.ws.project.files() if name not in applied]
        if not pending:
            return
        failed = [r["name"] for r in changelog.records_named(pending)
                  if r.get("status") == "failed"]
        raise MigrationBlockedError(
            f"converge is blocked: {len(pending)} migration(s) still pending: "
            + ", ".join(pending),
            {"command": "converge", "blockedBy": pending, "failed": failed})

    def _guard(self) -> None:
        """Any conflict refuses the whole run before the first write (phase ``plan``)."""
        conflicts = [(plan.name, row) for plan in self.plans for row in plan.conflicts]
        if not conflicts:
            return
        self.plans = [replace(plan, actions=tuple(
            row.settled("failed" if row.action == "conflict" else "skipped")
            for row in plan.actions)) for plan in self.plans]
        message = (f"Converge refused: {len(conflicts)} conflict(s) — "
                   + "; ".join(_describe_conflict(name, row) for name, row in conflicts))
        hint: dict[str, Any] = {}
        if any(row.target == "searchIndex" and row.reason == UNAVAILABLE
               for _, row in conflicts):
            from migronaut.commands.converge_search import UNAVAILABLE_HINT

            hint = {"hint": UNAVAILABLE_HINT}
        raise ConvergeFailedError(message, {"phase": "plan", **hint, "conflicts": [
            {"collection": name, "target": row.target, "name": row.name,
             "reason": row.reason, **({"liveName": row.live_name} if row.live_name else {})}
            for name, row in conflicts]})

    @property
    def db(self) -> Database[Any]:
        return self.ws.connection.db

    def _plan_one(self, definition: CollectionDefinition, phase: str) -> CollectionPlan:
        live = read_one(self.db, definition, mongos=self.facts.mongos,
                        search=self.read_search, phase=phase)
        return plan_collection(definition, live,
                               plan_options(self.options, self.facts, self.search))

    def _replan(self, index: int, definition: CollectionDefinition) -> None:
        """Re-read and re-plan a collection right before its turn (§2.3 step 8)."""
        old = self.plans[index]
        fresh = self._plan_one(definition, "replan")
        known = {(row.target, row.name, row.action) for row in old.actions}
        introduced = [row for row in fresh.actions
                      if (row.action == "conflict" or row.is_destructive)
                      and (row.target, row.name, row.action) not in known]
        if introduced:
            raise ConvergeFailedError(
                f"{definition.name} changed while converging: the new plan has "
                + ", ".join(f"{row.target} \"{row.name}\" {row.action}" for row in introduced)
                + " — converge again to review the new plan",
                {"phase": "replan", "collection": definition.name, "introduced": [
                    {"target": row.target, "name": row.name, "action": row.action,
                     **({"reason": row.reason} if row.reason else {})}
                    for row in introduced]})
        self.plans[index] = fresh

    def _collection(self, index: int, definition: CollectionDefinition) -> None:
        """One collection's turn (§2.3 step 8): re-read and re-planned when it has work, or
        when earlier steps of the run took time since the first read. Otherwise the first
        read is still fresh, so a converge with nothing to do reads what its dry run reads."""
        if index > 0 and (self.plans[index].steps or self.stepped):
            self._replan(index, definition)
        plan = self.plans[index]
        for row in plan.actions:
            if row.action == "unchanged" and row.reason and row.reason.startswith("exists as"):
                self.logger.warning('⚠ %s index "%s" %s', plan.name, row.name, row.reason)
        for step in plan.steps:
            check_between(self.run_)
            self._step(index, step)
        self._settle(index, lambda row: row.status == "planned", "skipped")
        if plan.steps:
            self._verify(index, definition)

    def _step(self, index: int, step: Any) -> None:
        plan = self.plans[index]
        rows = [plan.row(*row_id) for row_id in step.rows]
        first = rows[0]
        for row in rows:
            self.emit("converge:action", collection=plan.name, target=row.target,
                      name=row.name, action=row.action, status="started",
                      **({"reason": row.reason} if row.reason else {}))
        level = 20 if first.target == "index" and first.action in ("create", "recreate") \
            else 10
        self.logger.log(level, "… %s %s %s on %s", first.action, _LABELS[first.target],
                        first.name, plan.name)
        began = time.monotonic()
        self.stepped = True
        try:
            outcome = apply_step(self.db, plan.name, step, first.action, self.journal)
        except StepFailed as failed:
            ids = set(step.rows)
            self._settle(index, lambda row: row.id in ids, "failed")
            for row in rows:
                self.emit("converge:action", collection=plan.name, target=row.target,
                          name=row.name, action=row.action, status="failed",
                          error=failed.context["cause"])
            raise ConvergeFailedError(failed.message, failed.context) from failed.cause
        duration = int((time.monotonic() - began) * 1000)
        kept = set(outcome.kept)
        for row in rows:
            if row.id in kept:
                self.logger.warning('⚠ %s index "%s" backs the shard key; kept', plan.name,
                                    row.name)
                self._replace(index, replace(row, action="keep", reason="backs the shard key",
                                             status="skipped"))
                continue
            self._replace(index, replace(row, status="applied", duration_ms=duration))
            self.emit("converge:action", collection=plan.name, target=row.target,
                      name=row.name, action=row.action, status="applied", durationMs=duration)
            self.logger.info("✔ %s %s %s on %s (%dms)", _DONE[row.action],
                             _LABELS[row.target], row.name, plan.name, duration)

    def _verify(self, index: int, definition: CollectionDefinition) -> None:
        """The fixed-point check: a re-plan after the steps must show no change (§2.6.3)."""
        plan = self.plans[index]
        kept = {row.id for row in plan.actions if row.reason == "backs the shard key"}
        again = self._plan_one(definition, "apply")
        if any(row.target == "searchIndex" and row.status == "applied" for row in plan.actions):
            for delay in VERIFY_RETRY_DELAYS:  # the search list may lag what was just applied
                if not _still_searching(again) or self.run_.cancellation.wait(delay):
                    break
                again = self._plan_one(definition, "apply")
        builds = {row.name: row.build for row in again.actions
                  if row.target == "searchIndex" and row.build is not None}
        for row in plan.actions:
            if row.target == "searchIndex" and row.name in builds:
                self._replace(index, replace(row, build=builds[row.name]))
        for row in again.actions:
            if not row.is_change or row.id in kept:
                continue
            entry = {"collection": plan.name, "target": row.target, "name": row.name,
                     "action": row.action, **({"reason": row.reason} if row.reason else {})}
            self.unstable.append(entry)
            self.logger.warning('⚠ %s %s "%s" still shows %s after converging — the server '
                                "stores it differently from its declaration%s", plan.name,
                                _LABELS[row.target], row.name, row.action,
                                " (every update makes the server rebuild the index)"
                                if row.target == "searchIndex" else "")

    def _wait_searches(self) -> None:
        """``wait_for_search_indexes`` (§7.8): after everything was applied, lock released."""
        from migronaut.commands.converge_wait import wait_after_converge, wait_targets

        wanted = self.options.wait_for_search_indexes
        if wanted is None:
            wanted = self.ws.project.config.wait_for_search_indexes
        if not (wanted and self.read_search and wait_targets(self.plans)):
            return
        self.search_wait, builds, error = wait_after_converge(self.ws, self.run_, self.plans)
        for index, plan in enumerate(self.plans):
            for row in plan.actions:
                found = builds.get((plan.name, row.name))
                if row.target == "searchIndex" and found is not None:
                    self._replace(index, replace(row, build=found[0]))
        if error is not None:
            raise error

    # ------------------------------------------------------------------------- results

    def _replace(self, index: int, new: PlanRow) -> None:
        plan = self.plans[index]
        self.plans[index] = replace(plan, actions=tuple(
            new if row.id == new.id else row for row in plan.actions))

    def _settle(self, index: int, which: Callable[[PlanRow], bool], status: str) -> None:
        plan = self.plans[index]
        self.plans[index] = replace(plan, actions=tuple(
            row.settled(status) if which(row) else row for row in plan.actions))

    def _settle_rest(self) -> None:
        for index in range(len(self.plans)):
            self._settle(index, lambda row: row.status == "planned", "skipped")

    def _result(self) -> ConvergeResult:
        rows = [row for plan in self.plans for row in plan.actions]
        changes = [row for row in rows if row.is_change]
        applied = sum(1 for row in changes if row.status == "applied")
        conflicts = any(row.action == "conflict" for row in rows)
        in_sync = (not conflicts and applied == len(changes) and not self.unstable)
        return ConvergeResult(dry_run=False, changed=applied, in_sync=in_sync,
                              collections=tuple(self.plans),
                              unstable=tuple(self.unstable) if self.unstable else None,
                              search=search_result(self.definitions, self.plans, self.search,
                                                   self.search_wait))

    def _finish(self, result: ConvergeResult, error: BaseException | None) -> None:
        """Closing lines, history entry and ``converge:end`` (§2.3 step 10)."""
        duration = int((time.monotonic() - self.started) * 1000)
        described = describe_exception(error) if error is not None else None
        if error is None:
            closing_lines(self.logger, self.plans, result, duration)
        record_history(self.ws, self.run_, self.options, result, started_at=self.started_at,
                       duration_ms=duration, error=described, restored=self.restored)
        self.emit("converge:end", trigger=self.options.trigger, success=error is None,
                  durationMs=duration, changed=result.changed, inSync=result.in_sync,
                  counts=action_counts(self.plans), result=result.to_dict(),
                  **({"error": described} if described else {}))
