"""Drift detection by polling: old-shape documents that reappeared after a migration completed.

Reference background §3.7 (``verifyBackground``). For every completed, forward, declarative
background migration, one indexed probe asks the server whether a document still matches the
migration's match (minus its known failed ids); a finding either reopens the migration (a new pass,
not a reset) or is only reported.

Invariants:

* nothing here ever holds, logs, emits or returns a document id: the probe projects ``_id`` only to
  learn that *a* document exists, and findings name the migration and the collection;
* the probe never scans: it runs only with a usable index (the version index, or any index led by
  ``{<version field>: 1}``) and a ``maxTimeMS`` bound; a collection without one is skipped;
* a collection with another background migration still open is left to that migration (its
  completion count is the stronger check), so chains converge one edge at a time.

:func:`report_drift` is shared with the live watcher (``watch.py``), which hands findings back
the same way with ``source='stream'``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from migronaut._values import is_int
from migronaut.background.planning.spec import match_filter
from migronaut.background.state.fields import understood
from migronaut.errors import ConfigInvalidError, MigronautError, describe_exception

if TYPE_CHECKING:
    from migronaut.background.engine_core import EngineCore

__all__ = [
    "DRIFT_MODES",
    "ON_DRIFT",
    "PROBE_MAX_TIME_MS",
    "REOPEN_REASON",
    "WATCH_FRESH_MS",
    "DriftFinding",
    "Probe",
    "check_collections",
    "check_drift_mode",
    "check_on_drift",
    "floored",
    "is_candidate",
    "probe_hint",
    "probe_old_shape",
    "probe_requirement",
    "report_drift",
    "state_match",
    "verify",
]

ON_DRIFT: Final = ("reopen", "report")
DRIFT_MODES: Final = ("poll", "stream", "both")
PROBE_MAX_TIME_MS: Final = 5000
#: A watcher record younger than this (server time) counts as live in ``'stream'`` mode.
WATCH_FRESH_MS: Final = 60_000
REOPEN_REASON: Final = "old-shape documents reappeared"
#: Statuses in which a background migration still owns its collection's documents.
OPEN_STATUSES: Final = ("blocked", "pending", "running", "paused")


@dataclass(frozen=True)
class DriftFinding:
    """One finding: which migration's old shape reappeared where, and what was done about it."""

    migration: str
    collection: str
    action: str

    def to_dict(self) -> dict[str, str]:
        return {"migration": self.migration, "collection": self.collection, "action": self.action}


# ------------------------------------------------------------------------------------ options


def check_on_drift(value: Any) -> str:
    """``None`` → ``'reopen'`` (the config default); anything but reopen/report is refused."""
    if value is None:
        return "reopen"
    if value not in ON_DRIFT:
        raise ConfigInvalidError(
            f"on_drift must be 'reopen' or 'report', got {value!r}", {"onDrift": repr(value)}
        )
    return str(value)


def check_drift_mode(value: Any) -> str:
    """``None`` → ``'poll'``; otherwise one of ``background_drift``'s values."""
    if value is None:
        return "poll"
    if value not in DRIFT_MODES:
        raise ConfigInvalidError(
            f"background_drift must be 'poll', 'stream' or 'both', got {value!r}",
            {"backgroundDrift": repr(value)},
        )
    return str(value)


def check_collections(value: Any, *, option: str = "collections") -> tuple[str, ...] | None:
    """``None`` (all collections) or a non-empty sequence of non-empty collection names."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, Collection)):
        raise ConfigInvalidError(
            f"{option} must be a list of collection names, got {type(value).__name__}",
            {"option": option},
        )
    names = list(value)
    if not names:
        raise ConfigInvalidError(f"{option} must not be empty (omit it to mean every "
                                 "collection)", {"option": option})
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigInvalidError(
                f"{option} must hold non-empty strings, got {name!r}", {"option": option}
            )
    return tuple(names)


# ------------------------------------------------------------------------------------ probing


def is_candidate(state: Mapping[str, Any]) -> bool:
    """Completed, forward and declarative: a migration whose old shape must not come back."""
    spec = state.get("spec") or {}
    return (
        state.get("status") == "completed"
        and state.get("direction", "forward") == "forward"
        and (state.get("mode") or spec.get("mode")) == "declarative"
        and bool(state.get("collection") or spec.get("collection"))
    )


def floored(state: Mapping[str, Any], floors: Mapping[str, int]) -> bool:
    """Whether the collection's declared ``versioning.min`` is at or above the migration's
    ``to``: the validator then refuses the old shape, so no probe is needed."""
    floor = floors.get(collection_of(state))
    to = (state.get("spec") or {}).get("to")
    return floor is not None and is_int(to) and floor >= to


def collection_of(state: Mapping[str, Any]) -> str:
    return str(state.get("collection") or (state.get("spec") or {}).get("collection"))


def state_match(state: Mapping[str, Any]) -> dict[str, Any]:
    """The forward match of the pinned spec, minus the migration's known failed ids.

    The same filter as :meth:`BackgroundJob.match`, built from the stored spec alone: detecting
    drift needs no migration file (a host without the file can still verify).
    """
    base = match_filter(dict(state["spec"]), "forward")
    bad_ids = list(state.get("badIds") or [])
    if bad_ids:
        return {"$and": [base, {"_id": {"$nin": bad_ids}}]}
    return base


def probe_hint(index_information: Mapping[str, Any], field: str) -> str | None:
    """The name of the index a probe may use: the version index ``{field: 1, _id: 1}`` when it
    exists, otherwise any index whose first key is ``{field: 1}``; ``None`` when there is none.

    Partial and sparse indexes are not usable (they may leave matching documents out).
    """
    led_by: list[str] = []
    for name, info in index_information.items():
        if info.get("partialFilterExpression") is not None or info.get("sparse"):
            continue
        keys = [(str(k), v) for k, v in info.get("key", [])]
        if not keys or keys[0][0] != field or not _ascending(keys[0][1]):
            continue
        if len(keys) == 2 and keys[1][0] == "_id" and _ascending(keys[1][1]):
            return str(name)
        led_by.append(str(name))
    return sorted(led_by)[0] if led_by else None


def _ascending(direction: Any) -> bool:
    return not isinstance(direction, bool) and isinstance(direction, (int, float)) and \
        direction == 1


@dataclass(frozen=True)
class Probe:
    """One probe's outcome: ``found`` an old-shape document, or ``skipped`` (why, and the
    driver's error for ``'unreadable'``/``'failed'``)."""

    found: bool = False
    skipped: Literal["unreadable", "no-index", "failed"] | None = None
    error: str | None = None


def probe_old_shape(
    engine: EngineCore,
    state: Mapping[str, Any],
    hints: dict[tuple[str, str], str | None] | None = None,
) -> Probe:
    """Ask the server whether a document of ``state``'s old shape exists — read-only, silent.

    One indexed ``find_one`` (``_id`` projected, ``maxTimeMS`` bound); without a usable index it
    is skipped, never a scan. ``hints`` caches the index choice per (collection, field).
    """
    collection = collection_of(state)
    field = str(state["spec"].get("field", "__v"))
    cache = {} if hints is None else hints
    if (collection, field) not in cache:
        try:
            info = engine.db[collection].index_information()
        except Exception as error:  # an unreadable collection is a probe error
            return Probe(skipped="unreadable", error=describe_exception(error))
        cache[(collection, field)] = probe_hint(info, field)
    hint = cache[(collection, field)]
    if hint is None:
        return Probe(skipped="no-index")
    try:
        found = engine.db[collection].find_one(
            state_match(state), {"_id": 1}, hint=hint, max_time_ms=PROBE_MAX_TIME_MS
        )
    except Exception as error:
        return Probe(skipped="failed", error=describe_exception(error))
    return Probe(found=found is not None)  # the id itself never travels any further


def live_watched(engine: EngineCore) -> set[str]:
    """Collections a live watcher is streaming with a record younger than 60 s (server time)."""
    cursor = engine.store.watch.find(
        {
            "state": "streaming",
            "$expr": {"$gte": ["$updatedAt", {"$subtract": ["$$NOW", WATCH_FRESH_MS]}]},
        },
        {"_id": 1},
    )
    return {str(doc["_id"]) for doc in cursor}


# ------------------------------------------------------------------------------------ findings


def report_drift(
    engine: EngineCore,
    *,
    migration: str,
    collection: str,
    on_drift: str,
    source: str,
    reason: str = REOPEN_REASON,
) -> str:
    """Act on a finding: reopen the migration (``'reopened'``) or only report it (``'reported'``).

    Emits ``background:drift`` and logs the CLI's warning line (poll: "⚠ <collection>: old-shape
    documents after <migration> — <action>"; stream: "⚠ <collection>: <action> (<migration>)");
    neither carries a document id. A reopen that the state no longer allows (it moved meanwhile)
    degrades to a report, with the reason logged.
    """
    action = "reported"
    if on_drift == "reopen":
        try:
            result = engine.control(migration, "retry", reason=reason)
        except MigronautError as error:
            engine.logger.warning("⚠ %s: could not reopen after drift (%s)", migration,
                                  error.message)
        else:
            if result.status in OPEN_STATUSES:
                action = "reopened"
    engine.emit("background:drift", {"migration": migration, "collection": collection,
                                     "source": source, "action": action})
    if source == "stream":
        engine.logger.warning("⚠ %s: %s (%s)", collection, action, migration)
    else:
        engine.logger.warning("⚠ %s: old-shape documents after %s — %s", collection, migration,
                              action)
    return action


def probe_requirement(engine: EngineCore, name: str) -> bool:
    """The ``requires`` probe (reference §1.8): ``True`` when ``name`` completed forward and an
    old-shape document has reappeared — it is then reopened (``source='requires'``).

    Step migrations and states that are not completed are not probed; without a usable index or
    when the probe fails the status alone is trusted (warned), so this answers ``False``.
    """
    state = engine.store.get(name)
    if state is None or not is_candidate(state) or floored(state, engine.declared_floors()):
        return False
    collection = collection_of(state)
    probe = probe_old_shape(engine, state)
    if probe.skipped == "no-index":
        engine.logger.warning("⚠ %s has no index led by {%s: 1} — trusting the status of %s",
                              collection, state["spec"].get("field", "__v"), name)
        return False
    if probe.skipped is not None:  # a probe failure is warned, never fatal
        engine.logger.warning("⚠ %s: requires probe for %s failed (%s) — trusting its status",
                              collection, name, probe.error)
        return False
    if not probe.found:
        return False
    report_drift(engine, migration=name, collection=collection, on_drift="reopen",
                 source="requires")
    return True


# ------------------------------------------------------------------------------------ verify


def verify(
    engine: EngineCore,
    *,
    on_drift: str | None = None,
    collections: Sequence[str] | None = None,
    drift_mode: str | None = None,
    floors: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Probe every completed forward declarative migration once (reference §3.7).

    ``on_drift``: ``'reopen'`` (default, the config default) or ``'report'``. ``collections``
    limits the candidates. ``drift_mode`` is the config's ``background_drift``: in ``'stream'``
    mode a collection whose watcher is streaming with a fresh record is skipped. ``floors`` maps a
    collection to its declared ``versioning.min`` (default: the engine's declared collections; a
    floor ≥ the migration's ``to`` means the validator already refuses the old shape: skipped).

    Returns ``{"checked", "skipped", "drift": [{migration, collection, action}]}`` — counts and
    names only, never a document id.
    """
    mode = check_on_drift(on_drift)
    wanted = check_collections(collections)
    drift = check_drift_mode(drift_mode)
    states = engine.store.all()
    for state in states:  # a state it cannot read is STATE_INVALID naming it, never skipped
        understood(state)
    owned = {collection_of(s) for s in states if s.get("status") in OPEN_STATUSES}
    streaming = live_watched(engine) if drift == "stream" else set()
    floors = engine.declared_floors() if floors is None else floors
    checked = skipped = 0
    findings: list[DriftFinding] = []
    hints: dict[tuple[str, str], str | None] = {}
    for state in states:
        if not is_candidate(state):
            continue
        name = str(state["_id"])
        collection = collection_of(state)
        spec = state["spec"]
        if wanted is not None and collection not in wanted:
            continue
        if collection in owned or collection in streaming or floored(state, floors):
            skipped += 1
            continue
        field = str(spec.get("field", "__v"))
        probe = probe_old_shape(engine, state, hints)
        if probe.skipped == "unreadable":
            engine.logger.warning("⚠ %s: drift probe skipped (%s)", collection, probe.error)
        elif probe.skipped == "no-index":
            engine.warn_once(  # the engine's once-per-process warning set
                f"drift-index:{collection}:{field}",
                "⚠ %s has no index led by {%s: 1} — drift probes skip it (create the version "
                "index {%s: 1, _id: 1})", collection, field, field,
            )
        elif probe.skipped == "failed":  # a probe failure is warned and skipped, never fatal
            engine.logger.warning("⚠ %s: drift probe for %s failed (%s)", collection, name,
                                  probe.error)
        if probe.skipped is not None:
            skipped += 1
            continue
        checked += 1
        if not probe.found:
            continue
        action = report_drift(engine, migration=name, collection=collection, on_drift=mode,
                              source="poll")
        if action == "reopened":
            owned.add(collection)  # the reopened pass owns the collection now
        findings.append(DriftFinding(name, collection, action))
    return {"checked": checked, "skipped": skipped, "drift": [f.to_dict() for f in findings]}
