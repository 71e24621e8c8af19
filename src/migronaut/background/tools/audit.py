"""The ``background`` check of ``audit`` (reference background §6.9): read-only findings.

Invariant: nothing here writes, emits or logs — not even the probes, which are the drift poll's
(:func:`~migronaut.background.tools.drift.probe_old_shape`) without its reopen. Ages are measured
against the server's clock and the server-stamped times of the state, never the client's.

A failed migration fails the check; everything that needs an operator's eye but is not (yet) a
failure warns: a migration nobody runs, a stalled or paused one, one blocked by a failed
requirement, failed or foreign-plan partitions, documents that could not be migrated, old-shape
documents after completion, a file changed or missing, a changelog record without a state, and a
live drift watcher that stopped leading.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from migronaut.background.tools.drift import (
    OPEN_STATUSES,
    collection_of,
    floored,
    is_candidate,
    live_watched,
    probe_old_shape,
)
from migronaut.core.results import AuditCheck

if TYPE_CHECKING:
    from migronaut.background.engine_core import EngineCore
    from migronaut.core.changelog import Changelog

__all__ = ["STALL_MINUTES", "audit_background"]

#: Pending, stalled or leaderless this long is worth a warning (reference background App. A).
STALL_MINUTES: Final = 15
_STATUS_ORDER: Final = ("blocked", "pending", "running", "paused", "completed", "reverted",
                        "failed", "cancelled")
#: Statuses in which a worker still needs the pinned file.
_NEEDS_FILE: Final = (*OPEN_STATUSES, "failed")


def _minutes_since(value: Any, now: dt.datetime) -> float | None:
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    elapsed: dt.timedelta = now - value
    return elapsed.total_seconds() / 60


def _moved_at(state: Mapping[str, Any]) -> Any:
    """When the state last changed status (its newest history entry), else its registration."""
    history = state.get("history") or []
    moved = history[-1].get("at") if history and isinstance(history[-1], Mapping) else None
    return moved or state.get("registeredAt")


def _latest(*values: Any) -> Any:
    stamps = [v for v in values if isinstance(v, dt.datetime)]
    return max(stamps) if stamps else None


def _state_findings(
    engine: EngineCore,
    state: Mapping[str, Any],
    *,
    changelog: Changelog,
    on_disk: set[str],
    checksum: Callable[[str], str | None],
    now: dt.datetime,
) -> tuple[list[str], list[str]]:
    """(failures, warnings) of one background migration."""
    name, status = str(state["_id"]), state.get("status")
    failures: list[str] = []
    warnings: list[str] = []
    if status == "failed":
        failures.append(f"{name} failed ({state.get('lastError') or 'no error recorded'})")
    elif status == "pending":
        waited = _minutes_since(_moved_at(state), now)
        if waited is not None and waited > STALL_MINUTES:
            warnings.append(f"{name} pending for {int(waited)} min — is a runner up?")
    elif status == "running":
        quiet = _minutes_since(_latest(state.get("lastProgressAt"), _moved_at(state)), now)
        if quiet is not None and quiet > STALL_MINUTES and \
                not engine.store.live_leases(name):
            warnings.append(f"{name} running but stalled (no live lease, no progress for "
                            f"{int(quiet)} min)")
    elif status == "paused":
        warnings.append(f"{name} is paused")
    elif status == "blocked":
        failed = [w["migration"] for w in engine.unmet(state.get("requires") or [], changelog)
                  if w["status"] == "failed"]
        if failed:
            warnings.append(f"{name} is blocked by failed {', '.join(failed)}")

    plan = state.get("plan") or {}
    if plan.get("token") and status != "failed":
        generation = int(state.get("generation", 0))
        counts = engine.store.count_by_status(name, int(plan.get("generation", generation)),
                                              str(plan["token"]))
        if counts.get("failed"):
            warnings.append(f"{name}: {counts['failed']} failed partition(s) in the current plan")
        foreign = engine.store.count_foreign_partitions(name, generation, str(plan["token"]))
        if foreign:
            warnings.append(f"{name}: {foreign} partition(s) of an old plan")
    if status == "completed" and state.get("badIds"):
        warnings.append(f"{name} completed with {len(state['badIds'])} document(s) that could "
                        "not be migrated")

    if status in _NEEDS_FILE:
        if name not in on_disk:
            warnings.append(f"{name}: file missing")
        elif checksum(name) != state.get("checksum"):
            warnings.append(f"{name} changed on disk since it was registered (repin it)")
    return failures, warnings


def _watch_findings(engine: EngineCore, now: dt.datetime) -> list[str]:
    from migronaut.background.tools.watch import watch_status

    warnings = []
    for row in watch_status(engine):
        quiet = _minutes_since(row.get("updatedAt"), now)
        if quiet is None or quiet <= STALL_MINUTES:
            continue
        if row.get("state") == "fallback":
            warnings.append(f"{row['collection']}: drift watcher fallen back to polling for "
                            f"{int(quiet)} min")
        else:
            warnings.append(f"{row['collection']}: drift watcher had no live leader for "
                            f"{int(quiet)} min")
    return warnings


def audit_background(
    engine: EngineCore,
    *,
    changelog: Changelog,
    records: Sequence[Mapping[str, Any]],
    files: Sequence[str],
    checksum: Callable[[str], str | None],
    now: dt.datetime,
    drift_mode: str = "poll",
) -> AuditCheck | None:
    """The ``background`` check, or ``None`` when no background migration is registered or
    recorded (the check is then absent from the report).

    ``records`` are the changelog's records, ``files`` the migration files on disk, ``now`` the
    server's clock (naive UTC), ``drift_mode`` the config's ``background_drift``.
    """
    states = engine.store.all()
    recorded = [r for r in records if r.get("kind") == "background"]
    if not states and not recorded:
        return None
    failures: list[str] = []
    warnings: list[str] = []
    on_disk = set(files)
    owned = {collection_of(s) for s in states if s.get("status") in OPEN_STATUSES}
    streaming = live_watched(engine) if drift_mode == "stream" else set()
    hints: dict[tuple[str, str], str | None] = {}
    floors = engine.declared_floors()
    for state in states:
        failed, warned = _state_findings(engine, state, changelog=changelog, on_disk=on_disk,
                                         checksum=checksum, now=now)
        failures += failed
        warnings += warned
        collection = collection_of(state) if is_candidate(state) else None
        if collection is not None and collection not in owned | streaming and \
                not floored(state, floors) and probe_old_shape(engine, state, hints).found:
            warnings.append(f"{state['_id']} holds old-shape documents again ({collection})")
    registered = {s["_id"] for s in states}
    warnings += [f"{r['name']} is applied but its background migration is not registered"
                 for r in recorded if r.get("status") == "applied" and r["name"] not in registered]
    if drift_mode in ("stream", "both"):
        warnings += _watch_findings(engine, now)

    if failures or warnings:
        return AuditCheck("background", "fail" if failures else "warn",
                          "; ".join(failures + warnings))
    counts = {status: sum(1 for s in states if _label(s) == status) for status in _STATUS_ORDER}
    summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    return AuditCheck("background", "pass", f"{len(states)} background migration(s)"
                      + (f": {summary}" if summary else ""))


def _label(state: Mapping[str, Any]) -> str:
    """The status as the summary counts it: a completed revert (``down``) is ``reverted``."""
    status = str(state.get("status"))
    return "reverted" if status == "completed" and state.get("direction") == "revert" else status
