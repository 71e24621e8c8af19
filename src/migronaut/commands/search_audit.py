"""The audit's ``search`` check (reference collections §4.1 row 9): is Atlas Search available
for the declared search indexes, and is any of them FAILED or STALE?

Invariants: read-only (the probe and ``$listSearchIndexes`` only); absent when no definition
declares ``searchIndexes`` or the definitions do not load (converge reports those); only
**declared** names are considered.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pymongo.database import Database

from migronaut.commands.converge_read import MAX_IN_FLIGHT, primary, server_facts
from migronaut.commands.converge_search import UNAVAILABLE_HINT, list_search_indexes, probe_search
from migronaut.core.config import Config
from migronaut.core.results import AuditCheck
from migronaut.declared.search_build import build_state
from migronaut.declared.search_plan import live_search_index
from migronaut.errors import MigronautError

__all__ = ["audit_search"]


def audit_search(config: Config, db: Database[Any]) -> AuditCheck | None:
    """The ``search`` check, or ``None`` when it does not apply."""
    from migronaut.declared.sources import load_definitions

    try:
        definitions = load_definitions(config)
    except MigronautError:
        return None
    declaring = [d for d in definitions if d.search_indexes is not None]
    if not declaring:
        return None
    db = primary(db)
    search = probe_search(db, declaring, server_facts(db).capabilities.version,
                          config.on_search_unavailable)
    declared = sum(len(d.search_indexes or ()) for d in declaring)
    if search is not None and not search.available:
        why = f" ({search.reason})" if search.reason else ""
        if search.on_unavailable == "skip":
            return AuditCheck("search", "warn", f"Atlas Search is not available{why}; "
                              f"{declared} declared search index(es) skipped "
                              "(on_search_unavailable = skip)")
        return AuditCheck("search", "fail", f"Atlas Search is not available{why} — "
                          f"{UNAVAILABLE_HINT}")
    with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT) as pool:
        listed = list(pool.map(lambda d: list_search_indexes(db, d.name), declaring))
    bad: list[str] = []
    for definition, documents in zip(declaring, listed, strict=True):
        names = {index.name for index in definition.search_indexes or ()}
        for live in map(live_search_index, documents):
            if live.name in names and build_state(live.build) in ("failed", "stale"):
                message = live.build.get("message")
                bad.append(f'{definition.name} "{live.name}" {live.status}'
                           + (f": {message}" if message else ""))
    if bad:
        return AuditCheck("search", "warn", "Search index(es) not serving: " + "; ".join(bad))
    return AuditCheck("search", "pass",
                      f"Atlas Search available; {declared} declared search index(es)")
