"""Reading and planning every declared collection at once (collections.md §2.3 steps 4–5):
what ``converge --dry-run``, the audit's drift check and the start of a real converge share.

Invariants: the Search probe runs once per run and only when some definition declares search
indexes (§7.4); the search-list reads follow its answer; planning is the pure planner over what
was read, so a dry run and a real run over the same state plan the same rows; the run's search
warnings (skipped indexes, ignored server-only options) are logged once, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from migronaut.commands.converge_options import ConvergeOptions
from migronaut.commands.converge_read import ServerFacts, primary, read_live, server_facts
from migronaut.declared.plan import CollectionPlan, ConvergeResult
from migronaut.declared.planner import PlanOptions, plan_collection
from migronaut.declared.search_build import search_summary
from migronaut.declared.search_plan import UNAVAILABLE, SearchAvailability

if TYPE_CHECKING:
    from migronaut.core.workspace import Workspace
    from migronaut.declared.definition import CollectionDefinition

__all__ = ["Planned", "plan_all", "plan_declared", "plan_options", "search_result",
           "warn_search"]


@dataclass(frozen=True)
class Planned:
    """The first read and plan of a run, and what later re-plans of the run reuse."""

    plans: list[CollectionPlan]
    facts: ServerFacts
    search: SearchAvailability
    read_search: bool  #: whether search lists are read (declared, and Search available)


def plan_options(options: ConvergeOptions, facts: ServerFacts,
                 search: SearchAvailability) -> PlanOptions:
    return PlanOptions(prune=options.prune, rebuild_unique=options.rebuild_unique,
                       capabilities=facts.capabilities, search=search)


def _search_availability(ws: Workspace, definitions: Sequence[CollectionDefinition],
                         facts: ServerFacts) -> tuple[SearchAvailability, bool]:
    """``(availability, read search lists?)``: probed once per run, only when some definition
    declares search indexes (§7.4)."""
    from migronaut.commands.converge_search import probe_search

    on_unavailable = ws.project.config.on_search_unavailable
    probed = probe_search(primary(ws.connection.db), definitions, facts.capabilities.version,
                          on_unavailable)
    if probed is None:
        return SearchAvailability(True, on_unavailable), False
    return probed, probed.available


def plan_all(ws: Workspace, definitions: Sequence[CollectionDefinition],
             options: ConvergeOptions) -> Planned:
    """Read every declared collection (one ``listCollections``, one ``listIndexes`` per
    existing collection) and plan each."""
    db = ws.connection.db
    facts = server_facts(db)
    search, read_search = _search_availability(ws, definitions, facts)
    live = read_live(db, definitions, mongos=facts.mongos, search=read_search)
    planning = plan_options(options, facts, search)
    plans = [plan_collection(d, live[d.name], planning) for d in definitions]
    return Planned(plans, facts, search, read_search)


def plan_declared(ws: Workspace, definitions: Sequence[CollectionDefinition],
                  options: ConvergeOptions | None = None, *, warn: bool = False
                  ) -> ConvergeResult:
    """The dry-run result over a connected workspace: reads and plans only (no lock, no
    events) — shared by ``converge --dry-run`` and the audit's drift check; ``warn`` logs the
    run's search warnings (skipped indexes, ignored server options)."""
    planned = plan_all(ws, definitions, options or ConvergeOptions(dry_run=True))
    if warn:
        warn_search(ws, planned.plans, planned.search)
    return ConvergeResult.planned(planned.plans,
                                  search_result(definitions, planned.plans, planned.search))


def warn_search(ws: Workspace, plans: Sequence[CollectionPlan],
                search: SearchAvailability) -> None:
    """Once per run: the skipped search indexes (Search unavailable, ``skip``) and the
    server-only options the comparison ignored (§7.3 step 3, §7.4)."""
    logger = ws.project.logger
    rows = [(plan.name, row) for plan in plans for row in plan.actions
            if row.target == "searchIndex"]
    skipped = sum(1 for _, row in rows if row.action == "skip" and row.reason == UNAVAILABLE)
    if skipped:
        logger.warning("⚠ %s: %d declared search index(es) skipped (on_search_unavailable = "
                       "skip)", UNAVAILABLE, skipped)
    ignored = sorted({f'{name} search index "{row.name}": {path}' for name, row in rows
                      for path in row.ignored or ()})
    if ignored:
        logger.warning("⚠ Ignoring option(s) only the server sets (not declared): %s",
                       "; ".join(ignored))


def search_result(definitions: Sequence[CollectionDefinition], plans: Sequence[CollectionPlan],
                  search: SearchAvailability, wait: Mapping[str, Any] | None = None
                  ) -> dict[str, Any] | None:
    """``result.search`` — present whenever a definition declares search indexes (§7.7)."""
    if all(d.search_indexes is None for d in definitions):
        return None
    return search_summary(plans, available=search.available, evidence=search.evidence,
                          wait=wait)
