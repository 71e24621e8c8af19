"""The live drift watcher: change streams that upgrade old-shape writes as they happen.

Reference background §6.8 (``watchBackground``; ``background_drift = 'stream' | 'both'``). A
:class:`Watcher` runs a supervisor thread that follows every collection with a completed forward
declarative background migration, and one :class:`Follower` thread per collection. A follower
leads its collection only while it holds the ``watch:<collection>`` lock; it then opens a change
stream that carries only writes of an old version, and rewrites each such document with the pinned
migration's transform through the guarded write — one edge (``from → to``) at a time up to the
newest version — or hands the finding back (reopen or report, as the poll does).

Invariants:

* one leader per collection (I18): a follower streams only while it holds the lock, and every
  write to its watch document is fenced by ``leader.owner`` — a deposed leader's save matches
  nothing and it stands down;
* a document is only rewritten by the guarded write (``_id`` + version + revision as read, the
  pinned file's code): a write that raced an application write loses and is retried from a fresh
  read, never overwrites it;
* nothing carries document data: the stream projects ``operationType``, ``documentKey`` and
  ``clusterTime`` only, and events, logs and watch documents name collections and migrations —
  never a document id;
* only the leader moves the resume token, and it saves it at least every ``checkpoint_ms`` and on
  stop, so the next leader continues from there instead of catching up again.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from migronaut._suggest import suggest
from migronaut._values import int_within, is_int
from migronaut.background.lanes.diff import DocumentProblem, Update, guard_filter, stamped_diff
from migronaut.background.lanes.slices import (
    DOCUMENT_WRITE_CODES,
    TXN_TRANSIENT_CODES,
    BackgroundInfo,
    TransformContext,
    _user_message,
    _write_error_message,
)
from migronaut.background.state.fields import literal, stamped
from migronaut.background.tools.drift import (
    OPEN_STATUSES,
    REOPEN_REASON,
    check_collections,
    check_on_drift,
    collection_of,
    is_candidate,
    report_drift,
    verify,
)
from migronaut.core._calls import call_user
from migronaut.core.context import Cancellation, LinkedCancellation
from migronaut.core.lock import MigrationLock
from migronaut.errors import (
    ConfigInvalidError,
    ConnectionFailedError,
    LockAlreadyHeldError,
    MigronautError,
    RunAbortedError,
    describe_exception,
)

if TYPE_CHECKING:
    from pymongo import WriteConcern
    from pymongo.database import Database

    from migronaut.background.engine_core import EngineCore
    from migronaut.background.planning.job import BackgroundJob

__all__ = [
    "STATES",
    "Edges",
    "Follower",
    "UpgradeOutcome",
    "WatchOptions",
    "Watcher",
    "backoff_s",
    "change_pipeline",
    "classify_stream_error",
    "event_lag_ms",
    "load_edges",
    "require_change_streams",
    "upgrade_document",
    "watch_options",
    "watch_status",
]

STATES: Final = (
    "starting", "following", "catching-up", "streaming", "history-lost", "overloaded",
    "restarting", "suspended", "fallback", "stopped",
)
#: An upgrade follows at most this many edges (v1 → v2 → … ) for one event.
MAX_HOPS: Final = 16
ENDING_EVENTS: Final = ("drop", "rename", "dropDatabase", "invalidate")
#: Change-stream history gone (oplog rolled over, resume point lost): restart from now.
HISTORY_LOST_CODES: Final = frozenset({286, 280, 136})
UNAUTHORIZED: Final = 13
#: "The $changeStream stage is only supported on replica sets".
STANDALONE: Final = 40573
COUNTER_NAMES: Final = ("events", "upgraded", "failed", "skipped")
STREAM_AWAIT_MS: Final = 1000

_log = logging.getLogger("migronaut.background.watch")


# ------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class WatchOptions:
    """What a watcher does; build it with :func:`watch_options` (which validates)."""

    collections: tuple[str, ...] | None = None
    upgrade: bool = True
    refresh_ms: int = 30_000
    checkpoint_ms: int = 5000
    leader_retry_ms: int = 10_000
    max_collections: int = 16
    max_lag_ms: int = 60_000
    on_drift: str = "reopen"
    cancellation: Cancellation | None = None
    on_error: Callable[[BaseException, str | None], Any] | None = None


# (low, high) of each integer option — reference §6.8
_RANGES: Final[dict[str, tuple[int, int]]] = {
    "refresh_ms": (100, 3_600_000),
    "checkpoint_ms": (10, 3_600_000),
    "leader_retry_ms": (10, 3_600_000),
    "max_collections": (1, 1000),
    "max_lag_ms": (1, 86_400_000),
}
_KNOWN: Final = (
    "collections", "upgrade", *_RANGES, "on_drift", "cancellation", "on_error",
)


def _suggest(key: str) -> str:
    if key == "signal":
        return " (pass a Cancellation as 'cancellation')"
    close = suggest(key, _KNOWN)
    return f" (did you mean {close!r}?)" if close else ""


def watch_options(**options: Any) -> WatchOptions:
    """Validate watcher options (before connecting): unknown keys and out-of-range values are
    refused with ``CONFIG_INVALID`` naming the option."""
    for key in options:
        if key not in _KNOWN:
            raise ConfigInvalidError(
                f"Unknown watch option {key!r}{_suggest(key)}", {"option": key}
            )
    values: dict[str, Any] = {}
    if "collections" in options:
        values["collections"] = check_collections(options["collections"])
    if "upgrade" in options:
        if not isinstance(options["upgrade"], bool):
            raise ConfigInvalidError(
                f"watch option upgrade must be True or False, got {options['upgrade']!r}",
                {"option": "upgrade"},
            )
        values["upgrade"] = options["upgrade"]
    for key, (low, high) in _RANGES.items():
        if key not in options:
            continue
        value = options[key]
        if not int_within(value, low, high):
            raise ConfigInvalidError(
                f"watch option {key} must be an integer from {low} to {high}, got {value!r}",
                {"option": key},
            )
        values[key] = value
    if "on_drift" in options:
        values["on_drift"] = check_on_drift(options["on_drift"])
    cancellation = options.get("cancellation")
    if cancellation is not None and not isinstance(cancellation, Cancellation):
        raise ConfigInvalidError(
            "watch option cancellation must be a migronaut Cancellation, got "
            f"{type(cancellation).__name__}", {"option": "cancellation"},
        )
    values["cancellation"] = cancellation
    on_error = options.get("on_error")
    if on_error is not None and not callable(on_error):
        raise ConfigInvalidError(
            f"watch option on_error must be callable, got {type(on_error).__name__}",
            {"option": "on_error"},
        )
    values["on_error"] = on_error
    return WatchOptions(**values)


def standalone_error() -> ConfigInvalidError:
    return ConfigInvalidError(
        "The live drift watcher needs change streams, and this server is a standalone (its "
        "hello reports no replica set) — run it against a replica set or mongos, or set "
        "background_drift to 'poll'",
        {"backgroundDrift": "stream"},
    )


def require_change_streams(db: Database[dict[str, Any]]) -> None:
    """Refuse a server without change streams (a standalone) with ``CONFIG_INVALID``."""
    try:
        hello: dict[str, Any] = db.client.admin.command("hello")
    except Exception as error:
        raise ConnectionFailedError(
            f"Cannot ask the server whether it has change streams: {describe_exception(error)}",
            cause=error,
        ) from error
    if hello.get("setName") or hello.get("msg") == "isdbgrid":
        return
    raise standalone_error()


# ------------------------------------------------------------------------------------ pure parts


def backoff_s(failures: int) -> float:
    """``min(30 s, 250 ms × 2^failures)``."""
    return float(min(30.0, 0.25 * 2 ** min(failures, 16)))


def below_target(version_field: str, target: int) -> dict[str, Any]:
    """Documents older than ``target``: a lower number, or no version at all (missing or null)."""
    return {"$or": [{version_field: {"$lt": target}}, {version_field: None}]}


def change_pipeline(version_field: str, target: int) -> list[dict[str, Any]]:
    """The change-stream pipeline: only writes that leave a document below ``target``, and the
    events that end a stream; each event is cut down to its type, key and cluster time."""
    full = f"fullDocument.{version_field}"
    updated = f"updateDescription.updatedFields.{version_field}"
    return [
        {"$match": {"$or": [
            {"operationType": {"$in": ["insert", "replace"]},
             "$or": [{full: {"$lt": target}}, {full: None}]},
            {"operationType": "update",
             "$or": [{updated: {"$lt": target}}, {updated: {"$type": "null"}},
                     {"updateDescription.removedFields": version_field}]},
            {"operationType": {"$in": list(ENDING_EVENTS)}},
        ]}},
        {"$project": {"operationType": 1, "documentKey": 1, "clusterTime": 1}},
    ]


def classify_stream_error(error: BaseException) -> str:
    """``history-lost``, ``unauthorized``, ``standalone`` or ``retry``."""
    code = getattr(error, "code", None)
    has_label = getattr(error, "has_error_label", None)
    if code in HISTORY_LOST_CODES or (
        callable(has_label) and has_label("NonResumableChangeStreamError")
    ):
        return "history-lost"
    if code == UNAUTHORIZED:
        return "unauthorized"
    if code == STANDALONE:
        return "standalone"
    return "retry"


def event_lag_ms(cluster_time: Any, skew_ms: float, now_ms: float | None = None) -> float | None:
    """How far behind the server's clock an event is: ``(now − skew) − clusterTime.t × 1000``."""
    seconds = getattr(cluster_time, "time", None)
    if not isinstance(seconds, int):
        return None
    now = time.time() * 1000 if now_ms is None else now_ms
    return (now - skew_ms) - seconds * 1000


def clock_skew_ms(db: Database[dict[str, Any]]) -> float:
    """Local clock minus the server's (``hello.localTime``); 0 when unreadable."""
    try:
        local_time = db.client.admin.command("hello").get("localTime")
    except Exception:
        return 0.0
    if not isinstance(local_time, dt.datetime):
        return 0.0
    if local_time.tzinfo is None:
        local_time = local_time.replace(tzinfo=dt.UTC)
    return time.time() * 1000 - local_time.timestamp() * 1000


def _version_of(value: Any) -> int | None:
    """A stored version as an edge key: missing/null is 0; a non-integer has no edge."""
    if value is None:
        return 0
    if is_int(value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


# ------------------------------------------------------------------------------------ edges


@dataclass(frozen=True)
class Edges:
    """What a follower upgrades on one collection: completed forward declarative migrations keyed
    by their ``from`` (first registered wins) and the newest version, ``target``."""

    collection: str
    field: str
    target: int
    by_from: Mapping[int, Mapping[str, Any]]
    #: versions an open forward migration still owns (its own passes take those documents)
    open_froms: frozenset[int] = frozenset()
    #: a revert on the collection is not settled: upgrading now would fight it
    suspended: bool = False

    @property
    def names(self) -> list[str]:
        return [str(state["_id"]) for _, state in sorted(self.by_from.items())]

    def first(self) -> str:
        return self.names[0]


def load_edges(engine: EngineCore, collection: str) -> Edges | None:
    """The collection's edges from the state documents; ``None`` when it has none."""
    states = list(engine.store.states.find({"collection": collection})
                  .sort([("registeredAt", 1), ("_id", 1)]))
    suspended = any(
        s.get("direction") == "revert" and s.get("status") not in ("completed", "cancelled")
        for s in states
    )
    by_from: dict[int, Mapping[str, Any]] = {}
    open_froms: set[int] = set()
    version_field: str | None = None
    for state in states:
        spec = state.get("spec") or {}
        if state.get("direction", "forward") == "forward" and spec.get("mode") == "declarative" \
                and state.get("status") in OPEN_STATUSES:
            open_froms.add(int(spec["from"]))
        if not is_candidate(state):
            continue
        name = str(spec.get("field", "__v"))
        if version_field is None:
            version_field = name
        elif name != version_field:
            engine.warn_once(  # the engine's once-per-process warning set
                f"watch-field:{collection}:{name}",
                "⚠ %s: %s uses version field %s, not %s — the watcher leaves it to the poll",
                collection, state["_id"], name, version_field,
            )
            continue
        by_from.setdefault(int(spec["from"]), state)
    if not by_from or version_field is None:
        return None
    target = max(int(state["spec"]["to"]) for state in by_from.values())
    return Edges(collection, version_field, target, by_from, frozenset(open_froms), suspended)


# ------------------------------------------------------------------------------------ upgrade


@dataclass(frozen=True)
class UpgradeOutcome:
    """``migrated``, ``gone`` (nothing left to do), ``conflict`` (kept losing) or ``failed``."""

    kind: str
    reason: str | None = None
    error: str | None = None


_MIGRATED: Final = UpgradeOutcome("migrated")
_GONE: Final = UpgradeOutcome("gone")
_CONFLICT: Final = UpgradeOutcome("conflict")


class _Abort(Exception):
    """Leave a transaction (aborting it) with an outcome."""

    def __init__(self, outcome: UpgradeOutcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


def _failed(reason: str, error: str) -> UpgradeOutcome:
    return UpgradeOutcome("failed", reason, error)


def _transformed(
    job: BackgroundJob, doc: Mapping[str, Any], ctx: TransformContext
) -> Update | UpgradeOutcome:
    """Run the forward transform on a private copy of ``doc``; diff it into a stamped update."""
    function, batched = job.functions.transform("forward")
    if function is None:
        return _failed("transform", f"{job.name} has no forward transform")
    try:
        result = call_user(function, [copy.deepcopy(dict(doc))], ctx) if batched else \
            call_user(function, copy.deepcopy(dict(doc)), ctx)
    except Exception as error:  # the user's transform: a document error, never a crash
        return _failed("transform", _user_message(error, doc.get("_id")))
    if batched:
        if not isinstance(result, (list, tuple)) or len(result) != 1:
            got = len(result) if isinstance(result, (list, tuple)) else \
                f"a {type(result).__name__}"
            return _failed("transform", f"migrate_batch returned {got} results for 1 document "
                                        "— it must return one per document, in order")
        result = result[0]
    if isinstance(result, BaseException):
        return _failed("transform", _user_message(result, doc.get("_id")))
    spec = job.spec
    update = stamped_diff(
        doc, result, version_field=str(spec["field"]),
        revision_field=spec.get("revisionField"), target_version=int(spec["to"]),
    )
    if isinstance(update, DocumentProblem):
        return _failed(update.reason, update.message)
    return update


def _write_refused(error: Any) -> str:
    """A per-document write error by its code (the server's text can quote values)."""
    details = getattr(error, "details", None)
    return _write_error_message(details if isinstance(details, Mapping) else
                                {"code": getattr(error, "code", None)})


def _guarded(doc: Mapping[str, Any], key: Mapping[str, Any],
             spec: Mapping[str, Any]) -> dict[str, Any]:
    guard = guard_filter(doc, str(spec["field"]), spec.get("revisionField"),
                         str(spec.get("occ", "revision")))
    for name, value in key.items():  # shard-key fields of the document key target the write
        guard.setdefault(name, value)
    return guard


def _write_concern(spec: Mapping[str, Any]) -> WriteConcern:
    from pymongo import WriteConcern

    return WriteConcern(**dict(spec.get("writeConcern") or {"w": "majority"}))


def upgrade_document(
    db: Database[dict[str, Any]],
    job: BackgroundJob,
    state: Mapping[str, Any],
    key: Mapping[str, Any],
    *,
    cancellation: Cancellation | None = None,
    logger: logging.Logger | None = None,
) -> UpgradeOutcome:
    """Rewrite one document (by its change-stream ``documentKey``) along one edge.

    Reads it with the migration's match (minus its failed ids), transforms a copy, and writes the
    stamped diff with the guarded ``update_one`` — the same diff and guard as the lanes' batches.
    A write that matched nothing (an application write came between) is retried from a fresh read
    up to ``maxConflictRetries`` times, then ``conflict``. A transactional migration does each
    attempt in a snapshot transaction whose session its transform gets. Document problems are
    ``failed`` outcomes, never exceptions.
    """
    from pymongo.errors import WriteError

    spec = job.spec
    match = {"$and": [dict(key), job.match(list(state.get("badIds") or []) or None)]}
    info = BackgroundInfo(job.name, int(state.get("generation") or 0),
                          f"watch:{spec['collection']}")
    adapter = logging.LoggerAdapter(logger or _log, {"migration": job.name})
    ctx = TransformContext(cancellation or Cancellation(), adapter, "forward", info)
    if spec.get("transaction"):
        return _upgrade_in_transaction(db, job, key, match, ctx)
    collection = db[str(spec["collection"])].with_options(write_concern=_write_concern(spec))
    for _ in range(int(spec.get("maxConflictRetries", 3)) + 1):
        doc = collection.find_one(match)
        if doc is None:
            return _GONE
        update = _transformed(job, doc, ctx)
        if isinstance(update, UpgradeOutcome):
            return update
        try:
            result = collection.update_one(_guarded(doc, key, spec), update)
        except WriteError as error:
            if error.code in DOCUMENT_WRITE_CODES:
                return _failed("write", _write_refused(error))
            raise
        if result.matched_count == 1:
            return _MIGRATED
    return _CONFLICT


def _upgrade_in_transaction(
    db: Database[dict[str, Any]], job: BackgroundJob, key: Mapping[str, Any],
    match: Mapping[str, Any], ctx: TransformContext,
) -> UpgradeOutcome:
    from pymongo import ReadPreference
    from pymongo.errors import OperationFailure, PyMongoError
    from pymongo.read_concern import ReadConcern

    spec = job.spec
    collection = db[str(spec["collection"])]
    options = spec.get("transaction")
    timeout_ms = int(options.get("timeoutMs", 10_000)) if isinstance(options, Mapping) else 10_000
    with db.client.start_session() as session:
        txn_ctx = replace(ctx, session=session, db=db, client=db.client)
        for _ in range(int(spec.get("maxConflictRetries", 3)) + 1):
            try:
                with session.start_transaction(
                    read_concern=ReadConcern("snapshot"), write_concern=_write_concern(spec),
                    read_preference=ReadPreference.PRIMARY, max_commit_time_ms=timeout_ms,
                ):
                    doc = collection.find_one(match, session=session, max_time_ms=timeout_ms)
                    if doc is None:
                        return _GONE
                    update = _transformed(job, doc, txn_ctx)
                    if isinstance(update, UpgradeOutcome):
                        raise _Abort(update)  # its side writes must not commit
                    result = collection.update_one(_guarded(doc, key, spec), update,
                                                   session=session)
                    if result.matched_count != 1:
                        raise _Abort(_CONFLICT)
                return _MIGRATED
            except _Abort as abort:
                if abort.outcome.kind != "conflict":
                    return abort.outcome
            except PyMongoError as error:
                code = getattr(error, "code", None)
                if error.has_error_label("TransientTransactionError") or \
                        code in TXN_TRANSIENT_CODES:
                    continue
                if isinstance(error, OperationFailure) and code in DOCUMENT_WRITE_CODES:
                    return _failed("write", _write_refused(error))
                raise
    return _CONFLICT


# ------------------------------------------------------------------------------------ follower


class _LeadershipLost(Exception):
    """The lock was lost or a fenced save matched nothing: stop streaming, follow again."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Follower:
    """One collection's follower: tries to lead it, then streams, upgrades and checkpoints.

    Run by the watcher on its own thread (:meth:`run`); :meth:`try_lead` and :meth:`release` are
    the leadership steps on their own.
    """

    def __init__(self, watcher: Watcher, collection: str) -> None:
        self.watcher = watcher
        self.engine = watcher.engine
        self.options = watcher.options
        self.collection = collection
        self.owner = uuid.uuid4().hex
        self.state = "starting"
        self.leading = False
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self.last_event_at: dt.datetime | None = None
        self.last_error: str | None = None
        #: why :meth:`run` ended: ``gone`` (no edges / collection dropped), ``fallback``,
        #: ``stopped``; ``None`` while running
        self.ended: str | None = None
        self.stop_event = LinkedCancellation(watcher._cancel)
        self.thread: threading.Thread | None = None
        self._lock: MigrationLock | None = None
        self._token: Any = None
        self._edges: Edges | None = None
        self._saved: dict[str, int] = dict(self.counters)
        self._last_save = 0.0
        self._jobs: dict[tuple[str, str, str], BackgroundJob] = {}

    # -- views ----------------------------------------------------------------------------
    @property
    def resume_token(self) -> Any:
        """Where the stream resumes (``None``: from now, after a catch-up probe)."""
        return self._token

    def status(self) -> dict[str, Any]:
        row: dict[str, Any] = {"collection": self.collection, "state": self.state,
                               "leading": self.leading, "counters": dict(self.counters)}
        if self.last_event_at is not None:
            row["lastEventAt"] = self.last_event_at
        return row

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        self.engine.emit("background:watch", {"collection": self.collection, "state": state})
        self.engine.logger.debug("%s: drift watcher %s", self.collection, state)
        if self.leading:
            self.save(force=True)

    # -- leadership -----------------------------------------------------------------------
    def try_lead(self) -> bool:
        """Take the ``watch:<collection>`` lock and record ourselves as leader; ``False`` (state
        ``following``) when another watcher holds it."""
        if self.leading:
            return True
        lock = MigrationLock(
            self.engine.lock_collection, owner=self.owner, ttl_ms=self.engine.ttl_ms,
            executed_by=self.engine.executed_by, lock_id=f"watch:{self.collection}",
        )
        try:
            lock.acquire()
        except LockAlreadyHeldError:
            self._set_state("following")
            return False
        try:
            previous = self.engine.store.watch.find_one({"_id": self.collection},
                                                        {"resumeToken": 1})
            self.engine.store.watch.update_one(
                {"_id": self.collection},
                [{"$set": {
                    "leader": stamped({"owner": self.owner, "host": socket.gethostname(),
                                       "pid": os.getpid()}, "at"),
                    "state": literal(self.state),
                    "counters": {"$ifNull": ["$counters",
                                             literal(dict.fromkeys(COUNTER_NAMES, 0))]},
                    "updatedAt": "$$NOW",
                }}],
                upsert=True,
            )
        except BaseException:
            lock.release(run_failed=True)
            raise
        self._lock = lock
        self._token = (previous or {}).get("resumeToken")
        self.leading = True
        self._saved = dict(self.counters)
        self._last_save = time.monotonic()
        self.engine.logger.info("%s: leading the drift watch", self.collection)
        return True

    def save(self, *, force: bool = False) -> bool:
        """Record state, position and counters (at most every ``checkpoint_ms`` unless forced),
        fenced by our ``leader.owner``; ``False`` when we are not (or no longer) the leader."""
        if not self.leading:
            return False
        now = time.monotonic()
        if not force and (now - self._last_save) * 1000 < self.options.checkpoint_ms:
            return True
        sets: dict[str, Any] = {"state": self.state}
        if self._edges is not None:
            sets["target"] = self._edges.target
            sets["edges"] = self._edges.names
        if self.last_event_at is not None:
            sets["lastEventAt"] = self.last_event_at
        if self.last_error is not None:
            sets["lastError"] = self.last_error
        update: dict[str, Any] = {"$set": sets, "$currentDate": {"updatedAt": True}}
        if self._token is None:
            update["$unset"] = {"resumeToken": ""}
        else:
            sets["resumeToken"] = self._token
        counters = dict(self.counters)
        delta = {f"counters.{k}": counters[k] - self._saved.get(k, 0) for k in COUNTER_NAMES
                 if counters[k] != self._saved.get(k, 0)}
        if delta:
            update["$inc"] = delta
        result = self.engine.store.watch.update_one(
            {"_id": self.collection, "leader.owner": self.owner}, update
        )
        if result.matched_count != 1:
            self.engine.logger.warning("⚠ %s: another watcher leads this collection now — "
                                       "following", self.collection)
            self._stand_down()
            return False
        self._saved = counters
        self._last_save = now
        return True

    def _check_leadership(self) -> None:
        if not self.leading or self._lock is None or self._lock.poll_lost() is not None:
            raise _LeadershipLost()

    def _stand_down(self) -> None:
        """Give up the lock without a save (we may no longer be entitled to one)."""
        lock, self._lock = self._lock, None
        self.leading = False
        if lock is not None:
            lock.release(run_failed=True)

    def release(self, state: str = "stopped") -> None:
        """Stop leading: save the position and ``state`` (``stopped``, or ``fallback`` for a
        collection left to the poll), then release the lock."""
        if self.state != state:
            self.state = state
            self.engine.emit("background:watch", {"collection": self.collection,
                                                  "state": state})
        if self.leading:
            try:
                self.save(force=True)
            except Exception as error:  # best effort: the next leader resumes from the last save
                self.engine.logger.warning("⚠ %s: could not save the watch position (%s)",
                                           self.collection, describe_exception(error))
        self._stand_down()

    # -- the loop -------------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name=f"migronaut-watch-{self.collection}",
                                       daemon=True)
        self.thread.start()

    def run(self) -> None:
        """Lead or follow until stopped, the collection has no edges left, or it falls back."""
        from pymongo.errors import PyMongoError

        failures = 0
        try:
            while not self.stop_event.cancelled:
                try:
                    edges = load_edges(self.engine, self.collection)
                    if edges is None:
                        self.ended = "gone"
                        return
                    self._edges = edges
                    if edges.suspended:
                        self._set_state("suspended")
                        self.stop_event.wait(self.options.refresh_ms / 1000)
                        continue
                    if not self.try_lead():
                        jitter = 0.75 + random.random() * 0.5
                        self.stop_event.wait(self.options.leader_retry_ms * jitter / 1000)
                        continue
                    outcome = self._stream(edges)
                    failures = 0
                    if outcome == "gone":
                        self.ended = "gone"
                        return
                except _LeadershipLost:
                    self._stand_down()
                    self._set_state("following")
                except PyMongoError as error:
                    kind = classify_stream_error(error)
                    if kind == "history-lost":
                        self._token = None
                        self._note_error(error, warn=True)
                        self._set_state("history-lost")
                        continue
                    if kind == "unauthorized":
                        self._note_error(error, warn=True)
                        self._set_state("fallback")
                        self.engine.logger.warning(
                            "⚠ %s: not allowed to open a change stream — left to the poll",
                            self.collection)
                        self.ended = "fallback"
                        return
                    if kind == "standalone":
                        self.watcher._fail(standalone_error())
                        return
                    failures += 1
                    self._note_error(error, warn=True)
                    self.stop_event.wait(backoff_s(failures))
                except Exception as error:  # never let one collection's trouble end the thread
                    failures += 1
                    self._note_error(error, warn=True)
                    self.stop_event.wait(backoff_s(failures))
        finally:
            if self.ended is None:
                self.ended = "stopped"
            self.release("fallback" if self.ended == "fallback" else "stopped")

    def _note_error(self, error: BaseException, *, warn: bool) -> None:
        text = error.message if isinstance(error, MigronautError) else describe_exception(error)
        self.last_error = text
        if warn:
            self.engine.logger.warning("⚠ %s: drift watcher: %s", self.collection, text)
        self.watcher._report_error(error, self.collection)

    def _stream(self, edges: Edges) -> str:
        """One stream session: ``refresh`` (re-read edges), ``restart`` (from now), ``gone`` or
        ``stopped``."""
        db = self.engine.db
        skew_ms = clock_skew_ms(db)
        refresh_at = time.monotonic() + self.options.refresh_ms / 1000
        kwargs: dict[str, Any] = {"full_document": "default", "max_await_time_ms": STREAM_AWAIT_MS}
        token = self._token
        if token is not None:
            kwargs["resume_after"] = token
        with db[self.collection].watch(change_pipeline(edges.field, edges.target),
                                       **kwargs) as stream:
            if token is None:
                first = stream.try_next()  # the stream is open: nothing can fall between now
                if first is None:
                    self._token = stream.resume_token
                outcome = self._on_event(first, edges, skew_ms) if first is not None else None
                if outcome is not None:
                    return outcome
                self._set_state("catching-up")
                self._check_leadership()
                verify(self.engine, on_drift=self.options.on_drift,
                       collections=[self.collection], drift_mode="both")
            self._set_state("streaming")
            while True:
                self._check_leadership()
                if self.stop_event.cancelled:
                    return "stopped"
                if time.monotonic() >= refresh_at:
                    if not self.save(force=True):
                        raise _LeadershipLost()
                    return "refresh"
                event = stream.try_next()
                if event is None:
                    self._token = stream.resume_token or self._token  # stay on the oplog
                else:
                    outcome = self._on_event(event, edges, skew_ms)
                    if outcome is not None:
                        return outcome
                if not self.save():
                    raise _LeadershipLost()

    def _on_event(self, event: Mapping[str, Any], edges: Edges, skew_ms: float) -> str | None:
        self.counters["events"] += 1
        self.last_event_at = _now()
        operation = event.get("operationType")
        if operation in ENDING_EVENTS:
            self._token = None
            self._set_state("restarting")
            return "restart" if operation == "invalidate" else "gone"
        lag = event_lag_ms(event.get("clusterTime"), skew_ms)
        if lag is not None and lag > self.options.max_lag_ms:
            self._fell_behind(edges, lag)
            return "restart"
        self.upgrade(event.get("documentKey") or {}, edges)
        self._token = event.get("_id", self._token)
        return None

    def _fell_behind(self, edges: Edges, lag_ms: float) -> None:
        """Too far behind to catch up event by event: reopen (or only warn), restart from now."""
        self._set_state("overloaded")
        self._token = None
        reopen = self.options.on_drift == "reopen"
        self.engine.logger.warning(
            "⚠ %s: the drift watcher fell %d s behind — %s, restarting from now",
            self.collection, int(lag_ms // 1000),
            "reopening its migrations" if reopen else "the poll covers what it skipped")
        if reopen:
            for name in edges.names:
                try:
                    self.engine.control(name, "retry", reason="the drift watcher fell behind")
                except MigronautError as error:
                    self.engine.logger.warning("⚠ %s: could not reopen (%s)", name,
                                               error.message)

    # -- upgrading ------------------------------------------------------------------------
    def _job(self, state: Mapping[str, Any]) -> BackgroundJob:
        key = (str(state["_id"]), str(state.get("checksum")), str(state.get("registration")))
        job = self._jobs.get(key)
        if job is None:
            job = self.engine.job(state)  # strict: never run code other than the pinned file
            self._jobs[key] = job
        return job

    def upgrade(self, key: Mapping[str, Any], edges: Edges) -> None:
        """Handle one drifted write (by its ``documentKey``): bring the document to
        ``edges.target`` one edge at a time (at most 16 hops), or report / hand it back."""
        if "_id" not in key:
            self.counters["skipped"] += 1
            return
        collection = self.engine.db[self.collection]
        below = below_target(edges.field, edges.target)
        for hop in range(MAX_HOPS):
            current = collection.find_one({"$and": [dict(key), below]}, {edges.field: 1})
            if current is None:
                if hop == 0:
                    self.counters["skipped"] += 1
                return
            version = _version_of(current.get(edges.field))
            del current
            if version is not None and version in edges.open_froms:
                if hop == 0:
                    self.counters["skipped"] += 1  # its open migration's pass takes it
                return
            state = edges.by_from.get(version) if version is not None else None
            if state is None or not self.options.upgrade:
                name = str(state["_id"]) if state is not None else edges.first()
                report_drift(self.engine, migration=name, collection=self.collection,
                             on_drift="report", source="stream")
                return
            name = str(state["_id"])
            try:
                job = self._job(state)
            except MigronautError as error:
                self._hand_back(name, error.message)
                return
            outcome = upgrade_document(self.engine.db, job, state, key,
                                       cancellation=self.stop_event, logger=self.engine.logger)
            if outcome.kind == "migrated":
                self.counters["upgraded"] += 1
                self.engine.emit("background:drift", {"migration": name,
                                                      "collection": self.collection,
                                                      "source": "stream", "action": "upgraded"})
                self.engine.logger.info("✔ %s: upgraded (%s)", self.collection, name)
                continue
            if outcome.kind == "gone":
                if hop == 0:
                    self.counters["skipped"] += 1
                return
            if outcome.kind == "conflict":
                self._hand_back(name, "kept losing to other writes")
                return
            self._document_failed(name, outcome)
            return

    def _hand_back(self, name: str, why: str) -> None:
        """Leave the document to the migration itself: reopen it, or report (``on_drift``)."""
        self.engine.logger.warning("⚠ %s: the drift watcher could not upgrade a document for %s "
                                   "(%s)", self.collection, name, why)
        report_drift(self.engine, migration=name, collection=self.collection,
                     on_drift=self.options.on_drift, source="stream")

    def _document_failed(self, name: str, outcome: UpgradeOutcome) -> None:
        self.counters["failed"] += 1
        self.last_error = f"{outcome.reason}: {outcome.error}"
        self.engine.emit("background:drift", {"migration": name, "collection": self.collection,
                                              "source": "stream", "action": "failed"})
        self.engine.logger.warning("⚠ %s: failed (%s) — a document could not be upgraded: %s",
                                   self.collection, name, self.last_error)
        if self.options.on_drift == "reopen":
            try:
                self.engine.control(name, "retry", reason=REOPEN_REASON)
            except MigronautError as error:
                self.engine.logger.warning("⚠ %s: could not reopen (%s)", name, error.message)


# ------------------------------------------------------------------------------------ watcher


class Watcher:
    """The live drift watcher of one database: a supervisor and a follower per collection.

    Build it through :meth:`BackgroundEngine.watch` (which starts it) or construct and
    :meth:`start` it; :meth:`stop` closes the streams, saves positions and releases the locks.
    Also a context manager (stops on exit).
    """

    def __init__(self, engine: EngineCore, **options: Any) -> None:
        self.engine = engine
        self.options = watch_options(**options)
        #: why the watcher stopped by itself (e.g. the server turned out to be a standalone)
        self.error: MigronautError | None = None
        self._cancel = LinkedCancellation(self.options.cancellation or Cancellation())
        self._followers: dict[str, Follower] = {}
        self._retired: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self._left_to_poll: set[str] = set()
        self._warned_cap = False
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def __enter__(self) -> Watcher:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._cancel.cancelled

    @property
    def counters(self) -> dict[str, int]:
        """What this watcher did, over every follower it ran."""
        with self._mutex:
            totals = dict(self._retired)
            for follower in self._followers.values():
                for key in COUNTER_NAMES:
                    totals[key] += follower.counters[key]
        return totals

    def status(self) -> list[dict[str, Any]]:
        """``[{collection, state, leading, counters, lastEventAt?}]``, by collection."""
        with self._mutex:
            followers = sorted(self._followers.values(), key=lambda f: f.collection)
        return [follower.status() for follower in followers]

    def start(self) -> Watcher:
        """Refuse a standalone (``CONFIG_INVALID``) before anything else, then start."""
        if self._thread is not None:
            return self
        require_change_streams(self.engine.db)
        self.engine.logger.debug("Watching for old-shape writes")
        self._thread = threading.Thread(target=self._supervise, name="migronaut-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every follower (streams closed, positions saved, locks released) and wait."""
        self._cancel.cancel(RunAbortedError("The drift watcher was stopped"))
        deadline = time.monotonic() + timeout_s
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self._join_followers(deadline)

    def _join_followers(self, deadline: float) -> None:
        with self._mutex:
            followers = list(self._followers.values())
        for follower in followers:
            follower.stop_event.cancel(RunAbortedError("The drift watcher was stopped"))
        for follower in followers:
            if follower.thread is not None and follower.thread is not threading.current_thread():
                follower.thread.join(max(0.0, deadline - time.monotonic()))
            elif follower.thread is None:
                follower.release()

    def follower(self, collection: str) -> Follower:
        """The (not started) follower of ``collection`` — created on first use."""
        with self._mutex:
            existing = self._followers.get(collection)
            if existing is not None and existing.ended is None:
                return existing
            if existing is not None:
                self._retire(existing)
            follower = Follower(self, collection)
            self._followers[collection] = follower
            return follower

    def _retire(self, follower: Follower) -> None:
        for key in COUNTER_NAMES:
            self._retired[key] += follower.counters[key]

    def followed_collections(self) -> list[str]:
        """Collections with a completed forward declarative migration (filtered, sorted, at most
        ``max_collections``; the rest is left to the poll, warned once)."""
        names = sorted({collection_of(s) for s in self.engine.store.all(["completed"])
                        if is_candidate(s)})
        if self.options.collections is not None:
            names = [n for n in names if n in self.options.collections]
        names = [n for n in names if n not in self._left_to_poll]
        cap = self.options.max_collections
        if len(names) > cap and not self._warned_cap:
            self._warned_cap = True
            self.engine.logger.warning(
                "⚠ The drift watcher follows %d of %d collections (max_collections) — the poll "
                "covers the rest", cap, len(names))
        return names[:cap]

    def refresh(self) -> list[str]:
        """One supervisor pass: start followers for followed collections (again, when one ended
        because its collection went away) and stop those no longer followed."""
        with self._mutex:
            current = dict(self._followers)
        for collection, follower in current.items():
            if follower.ended == "fallback":
                self._left_to_poll.add(collection)  # its row stays, in state fallback
        followed = self.followed_collections()
        for collection, follower in current.items():
            if collection not in followed and collection not in self._left_to_poll:
                follower.stop_event.cancel(RunAbortedError("no longer followed"))
                if follower.ended is not None or follower.thread is None:
                    with self._mutex:
                        if self._followers.get(collection) is follower:
                            self._retire(follower)
                            del self._followers[collection]
        for collection in followed:
            running = current.get(collection)
            if running is None or running.ended is not None:
                fresh = self.follower(collection)
                if fresh.thread is None and not self._cancel.cancelled:
                    fresh.start()
        return followed

    def _supervise(self) -> None:
        failures = 0
        try:
            while not self._cancel.cancelled:
                try:
                    self.refresh()
                    failures = 0
                except Exception as error:  # the supervisor keeps going; followers too
                    failures += 1
                    self.engine.logger.warning("⚠ drift watcher: %s — retrying",
                                               describe_exception(error))
                    self._report_error(error, None)
                    self._cancel.wait(backoff_s(failures))
                    continue
                self._cancel.wait(self.options.refresh_ms / 1000)
        finally:
            self._join_followers(time.monotonic() + 30.0)

    def _fail(self, error: MigronautError) -> None:
        """Stop the whole watcher by itself (the server cannot serve change streams)."""
        self.error = error
        self.engine.logger.error("✖ %s", error.message)
        self._report_error(error, None)
        self._cancel.cancel(error)

    def _report_error(self, error: BaseException, collection: str | None) -> None:
        if self.options.on_error is None:
            return
        try:
            self.options.on_error(error, collection)
        except Exception as failure:  # a user callback never breaks the watcher
            _log.debug("on_error failed: %s", failure)


def watch_status(engine: EngineCore, collection: str | None = None) -> list[dict[str, Any]]:
    """The stored watch rows (``backgroundWatchStatus``) — never the resume token."""
    query: dict[str, Any] = {} if collection is None else {"_id": collection}
    rows = []
    for doc in engine.store.watch.find(query, {"resumeToken": 0}).sort("_id", 1):
        row: dict[str, Any] = {"collection": doc.pop("_id")}
        row.update(doc)
        rows.append(row)
    return rows
