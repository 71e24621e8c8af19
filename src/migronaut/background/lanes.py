"""Lanes: one slice of work on a background migration — claim, lease, batches, checkpoints.

:func:`run_slice` is one lane turn (reference background §4): it claims a partition and a slot,
keeps the lease alive from a heartbeat thread, works the partition in batches (declarative plain
or transactional batches, or ``step`` calls), records every batch with a checkpoint fenced by the
lease token, enforces the error budgets and returns an outcome.

Invariants:

* **A lane that lost its lease records nothing.** Every checkpoint is filtered by the lease token
  and ``status: running``; in a transaction the checkpoint is the transaction's last write, so a
  fenced-out lane commits nothing. Counters are added to the slice's only after their checkpoint
  succeeded, so a lost batch is never counted (the next holder replays it; the version filter
  makes the replay a no-op).
* **An application write is never lost.** Each document is written with a guarded update
  statement (``{_id, version, revision}`` as read) carrying only the fields the transform
  changed; an unmatched write is re-read, classified and re-transformed up to
  ``maxConflictRetries`` rounds.
* **A stop is not a failure.** An error while the caller's cancellation is set ends the slice as
  ``stopped``; only other errors count against ``maxSliceFailures``.
* **Document data never leaves the batch.** Error texts stored on partitions or emitted in events
  never carry ids or values (write errors are described by code; a user exception's text is
  masked for the document's ``_id``).

Hot path (steady state, plain batches): exactly three round trips per batch on the lane's thread —
the read (``find`` sorted by ``_id`` with ``limit`` = batch size and a matching cursor batch size,
so no ``getMore``), one unordered ``update`` command and the checkpoint (both data commands go
through :mod:`migronaut.background.wire`, which spends the least client CPU per document).
Two decisions keep it there:

* **Control reads live on the heartbeat thread.** The reference reads the state (status,
  generation, plan token) before every batch, a fourth round trip. Here the lease keeper — the
  thread that already renews the lease every ``ttl/2`` — also reads the control fields every
  :data:`CONTROL_INTERVAL_S` (1 s) and the lane checks the latest answer at each batch boundary
  (and pacing waits end early on it). A pause, cancel, failure elsewhere or new plan is therefore
  noticed within about a second plus the batch in flight, at a cost of one small read per second
  per lane that never delays a batch.
* **Cheap copies.** Each document is decoded once (the cursor's batch decode, in C) and the
  transform gets a *structural copy*: every dict and list is new, immutable BSON leaves (``str``,
  numbers, ``ObjectId``, ``Int64``, ``Decimal128``, ``datetime``, ``Binary``, ``UUID``, …) are
  shared, and only an unexpected leaf type falls back to ``copy.deepcopy``. However the transform
  mutates its copy, the stored image the diff compares against stays intact; and because
  unchanged leaves are the very same objects, the diff's identity check skips them. Measured on a
  12-field document with nested values: ~5 µs for the copy against ~6–15 µs for a second decode
  and ~70 µs for ``deepcopy``. Memory stays flat: one batch of documents at a time, never the
  collection. (Transactional batches read :class:`~bson.raw_bson.RawBSONDocument` to know each
  document's size for the 8 MiB cut, then decode each once.)

The adaptive controller judges a batch by the **server's time**: the round trip of its guarded
write commands (and, in a transaction, the commit) — reference §4.8's "write phase". A slow
``migrate`` function is the author's cost, not a sign of a loaded server: it must not shrink
batches nor add pauses (a transform sleeping 60 ms a document would otherwise be paced towards
``maxPauseMs``).

**Outages are not failures.** A lost connection, an election or a primary stepping down (see
:func:`migronaut.core.retry.is_outage`) is ridden out by the lane holding the
partition: it keeps its lease (the keeper keeps renewing), backs off, then starts again from what
the partition document records — counting the write intent's documents found at the target and
reading on from the stored cursor — so a write whose reply was lost is counted exactly once.
Only an outage longer than ``maxOutageMs`` counts as a failed slice.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import bson
from bson.errors import BSONError
from bson.raw_bson import RawBSONDocument

from migronaut.background.diff import DocumentProblem, copy_document, guard_filter, stamper
from migronaut.background.key_ranges import KeyRanges, changed_key_field, shard_key_message
from migronaut.background.planner import index_named, scope_filter
from migronaut.background.sharding import epoch_is_stale, key_values
from migronaut.background.store import SCHEMA, BackgroundStore, Lease
from migronaut.background.throttle import AdaptiveController, Throttle, controller_for
from migronaut.background.wire import UpdateOutcome, guarded_updates, read_batch
from migronaut.core._calls import call_user
from migronaut.core.context import Cancellation
from migronaut.core.retry import OUTAGE_CODES, is_outage
from migronaut.core.topology import refuses_transactions
from migronaut.errors import (
    BackgroundFailedError,
    ChecksumMismatchError,
    ConfigInvalidError,
    ConnectionFailedError,
    LockLostError,
    MigrationExecutionFailedError,
    MigronautError,
    RunAbortedError,
    TransactionsUnsupportedError,
    describe_exception,
)
from migronaut.observability.migration_log import MigrationLogger, log_line
from migronaut.observability.telemetry import DISABLED, Telemetry

if TYPE_CHECKING:
    from bson.codec_options import CodecOptions
    from pymongo import MongoClient
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.background.job import BackgroundJob

__all__ = [
    "CONTROL_INTERVAL_S",
    "OUTCOMES",
    "BackgroundInfo",
    "SliceResult",
    "StepContext",
    "TransformContext",
    "run_slice",
]

Emit = Callable[[str, dict[str, Any]], None]
_D = TypeVar("_D", dict[str, Any], RawBSONDocument)

OUTCOMES = (
    "yielded", "exhausted", "busy", "stale", "paused", "cancelled", "failed", "stopped", "lost",
)
#: How often the lease keeper reads the state's control fields (seconds).
CONTROL_INTERVAL_S = 1.0
#: A lease not renewed for this share of its TTL may be reaped any moment: the lane stops.
LEASE_LOST_AFTER = 0.9
#: First pause of an outage (seconds); it doubles up to :data:`OUTAGE_PAUSE_MAX_S`, jittered.
OUTAGE_PAUSE_S = 0.1
OUTAGE_PAUSE_MAX_S = 5.0
#: A step's checkpoint, encoded as ``{checkpoint: ...}``, may not exceed this (bytes).
STEP_CHECKPOINT_MAX = 64 * 1024
#: A transactional batch keeps the leading documents whose BSON fits in this (bytes).
TXN_BATCH_BYTES = 8 * 1024 * 1024
#: A plain batch's write intent (its ``_id`` s, stored on the partition by the checkpoint before
#: the write) stays under this many bytes: a batch of long ``_id`` s is cut short (the rest is the
#: next batch), so the partition document never nears the 16 MiB limit.
INTENT_MAX_BYTES = 2 * 1024 * 1024
#: Clean transactional batches in a row before the transaction size grows by ×1.5.
TXN_GROW_AFTER = 5
#: What encoding a value BSON cannot store raises (an ``object()``, an int over 64 bits, …).
_UNENCODABLE: Final = (BSONError, OverflowError, TypeError, ValueError)
#: Write errors that fail only their document (reference Appendix A).
DOCUMENT_WRITE_CODES = frozenset({11000, 121, 72, 66, 17280})
#: Transaction time/size limits, transient codes, overload codes.
TXN_LIMIT_CODES = frozenset({50, 262, 290, 334, 10334, 17419})
TXN_TRANSIENT_CODES = frozenset({112, 251, 24})
OVERLOAD_CODES = frozenset({50, 262})
_WRITE_CONFLICT = 112
#: A version index found missing is looked for again after this long (seconds).
_INDEX_RECHECK_S = 30.0
_POLL_S = 0.05
_MESSAGE_MAX = 500


_WRITE_ERROR_TEXT = {
    11000: "duplicate key (E11000)",
    121: "document failed validation (121)",
    72: "invalid options (72) — a shard-key change through mongos?",
    66: "an immutable field was changed (66)",
    17280: "an index key is too large (17280)",
}
_INDEX_NAME = re.compile(r"index: (\S+)")


# ------------------------------------------------------------------------------ public shapes


@dataclass(frozen=True)
class SliceResult:
    """What one slice did: an outcome of :data:`OUTCOMES`, the counters it checkpointed, when to
    come back (``busy``) and the error behind a ``failed`` or ``lost`` outcome."""

    outcome: str
    counters: dict[str, int] = field(default_factory=dict)
    retry_after_ms: int | None = None
    error: MigronautError | None = None


@dataclass(frozen=True)
class BackgroundInfo:
    """``ctx.background``: which migration, plan generation and partition a call works for.

    ``attempt`` counts the transactions a transactional batch went through (1 otherwise).
    """

    name: str
    generation: int
    partition: str
    attempt: int = 1
    run_id: str | None = None


@dataclass(frozen=True)
class TransformContext:
    """The ``ctx`` of ``migrate(doc, ctx)`` / ``migrate_batch(docs, ctx)`` (and the reverts).

    ``cancellation`` is set when the slice stops (the lane finishes the batch regardless);
    ``session``/``db``/``client`` are set only in transactional mode — pass ``session`` to side
    writes that must commit with the batch.
    """

    cancellation: Cancellation
    logger: logging.LoggerAdapter[logging.Logger]
    direction: str
    background: BackgroundInfo
    session: ClientSession | None = None
    db: Database[dict[str, Any]] | None = None
    client: MongoClient[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StepContext:
    """The ``ctx`` of ``step(ctx)`` / ``revert_step(ctx)`` (reference §1.7).

    ``checkpoint`` is ``None`` on the first call, then what the previous call returned;
    ``deadline`` is the slice's end in epoch milliseconds; ``session`` only in transactional mode.
    """

    db: Database[dict[str, Any]]
    client: MongoClient[dict[str, Any]]
    checkpoint: Any
    deadline: int
    cancellation: Cancellation
    logger: logging.LoggerAdapter[logging.Logger]
    direction: str
    background: BackgroundInfo
    session: ClientSession | None = None


# --------------------------------------------------------------------------- entry point


def run_slice(
    *,
    store: BackgroundStore,
    job: BackgroundJob,
    db: Database[dict[str, Any]],
    owner: str,
    ttl_ms: int,
    cancellation: Cancellation,
    slice_ms: int | None = None,
    emit: Emit,
    logger: logging.Logger,
    run_id: str | None = None,
    telemetry: Telemetry = DISABLED,
) -> SliceResult:
    """One lane turn on ``job`` (reference background §4.1).

    Returns the outcome; raises ``CHECKSUM_MISMATCH`` when the file is not the pinned version,
    ``TRANSACTIONS_UNSUPPORTED`` when a transactional spec meets a standalone server, and a
    :class:`MigronautError` (``context.partitionFailed`` says whether the partition failed for
    good) when the slice failed — after counting the failure on the partition.
    """
    if slice_ms is not None and (
        isinstance(slice_ms, bool) or not isinstance(slice_ms, int)
        or not 1 <= slice_ms <= 3_600_000
    ):
        raise ConfigInvalidError(
            f"sliceMs must be an integer from 1 to 3600000, got {slice_ms!r}",
            {"sliceMs": repr(slice_ms)},
        )
    from pymongo.errors import PyMongoError

    name = job.name
    try:
        state = store.get(name)
    except PyMongoError as error:
        raise _wrap(name, error) from error
    if state is None:
        return SliceResult("cancelled")
    status = state.get("status")
    if status in ("paused", "cancelled", "failed"):
        return SliceResult(str(status))
    if int(state.get("schema") or 0) > SCHEMA:
        return SliceResult("stale")
    plan = state.get("plan") or {}
    if status != "running" or state.get("phase") != "process" or not plan.get("token"):
        return SliceResult("exhausted" if status == "completed" else "stale")
    if state.get("checksum") and state["checksum"] != job.checksum:
        raise ChecksumMismatchError(
            f"Background migration {name} changed on disk since it was registered "
            "(a deploy in progress? repin it to adopt the change)",
            {"name": name, "expected": state.get("checksum"), "actual": job.checksum},
        )
    if state.get("direction", "forward") != job.direction:
        return SliceResult("stale")
    try:
        lane = _Lane(
            store=store, job=job, db=db, state=state, owner=owner, ttl_ms=ttl_ms,
            caller=cancellation, slice_ms=slice_ms, emit=emit, logger=logger, run_id=run_id,
            telemetry=telemetry,
        )
        if lane.resharded():
            return SliceResult("stale")
        return lane.run()
    except PyMongoError as error:  # claims, state moves: no lease held, nothing to count
        if cancellation.cancelled:
            return SliceResult("stopped")
        raise _wrap(name, error) from error


# ------------------------------------------------------------------------------- internals


class _Signal(Cancellation):
    """Set by itself (lease lost), by its parent (the caller) or when ``stop()`` says so."""

    def __init__(self, parent: Cancellation, stop: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self._parent = parent
        self._stop = stop

    @property
    def cancelled(self) -> bool:
        return (
            super().cancelled
            or self._parent.cancelled
            or (self._stop is not None and self._stop())
        )

    @property
    def reason(self) -> MigronautError | None:
        return super().reason or self._parent.reason

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise self.reason or RunAbortedError("Slice stopped")

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.cancelled:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            super().wait(_POLL_S if remaining is None else min(_POLL_S, remaining))
        return True


class _SliceFailure(Exception):
    """User code or a server answer that fails the slice (not a single document)."""


class _DocumentFailure(Exception):
    """Transactional strict mode: documents failed; exclude them and retry the batch."""

    def __init__(self, errors: list[_DocError]) -> None:
        super().__init__(errors[0].message)
        self.errors = errors


class _Conflict(Exception):
    """Transactional strict mode: a guarded write matched nothing."""


@dataclass
class _DocError:
    id: Any
    reason: str
    message: str


@dataclass
class _Part:
    """The partition a lane holds, as the lane tracks it between checkpoints."""

    id: Any
    key: str
    generation: int
    scope: Mapping[str, Any]
    cursor: dict[str, Any]
    #: counters and document errors of written batches not yet checkpointed (plain mode)
    pending: dict[str, int] = field(default_factory=dict)
    pending_errors: list[_DocError] = field(default_factory=list)
    #: the partition document holds this lane's intent (the ids of a batch about to be written)
    intent: bool = False

    @property
    def unflushed(self) -> bool:
        return bool(self.pending or self.pending_errors or self.intent)


class _Outage:
    """How long a lane has been riding out an outage, against the ``maxOutageMs`` budget."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_s = max(0, budget_ms) / 1000.0
        self.since: float | None = None
        self.tries = 0

    def clear(self) -> None:
        """Progress: the outage (if any) is over."""
        self.since, self.tries = None, 0

    def ride_out(self, error: BaseException, lane: _Lane) -> bool:
        """Wait before trying again (jittered, doubling); ``False`` when the budget is spent
        and ``error`` should count as a failure. A stop or a lost lease ends the wait."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            lane.logger.info("%s: %s — retrying for up to %gs", lane.name, _describe_server(error),
                             self.budget_s, extra={"migration": lane.name})
        if now - self.since >= self.budget_s:
            return False
        pause = min(OUTAGE_PAUSE_MAX_S, OUTAGE_PAUSE_S * 2 ** min(self.tries, 10))
        self.tries += 1
        if lane.signal.wait(pause * random.uniform(0.5, 1.0)):
            lane.signal.raise_if_cancelled()
        return True


@dataclass
class _Batch:
    counters: dict[str, int]
    latency_ms: float
    batch_size: int
    done: bool
    errors: list[_DocError] = field(default_factory=list)
    #: distinct failed documents of the migration when this batch took it over the budget
    over_budget: int | None = None


@dataclass
class _Outcome:
    outcome: str
    counters: dict[str, int]
    error: MigronautError | None = None


class _LeaseKeeper:
    """The heartbeat thread of one held lease: renewals every ``ttl/2`` and control reads.

    Renewal is skipped when a checkpoint touched the lease within ``ttl/4``. A renewal that
    matches nothing marks the lane lost and sets its signal with ``LOCK_LOST``; a renewal that
    fails (the network, an election) is tried again soon, and only when no renewal succeeded for
    most of the TTL — when a reaper may take the lease — is the lane lost. The control read
    (every :data:`CONTROL_INTERVAL_S`) stores the first stop
    outcome it sees (``paused``, ``cancelled``, ``failed``, ``stale``) for the lane to act on.
    """

    def __init__(self, lane: _Lane, lease: Lease, generation: int, plan: str) -> None:
        self._lane = lane
        self._lease = lease
        self._generation = generation
        self._plan = plan
        self._ttl_s = lease.ttl_ms / 1000.0
        self._stop = threading.Event()
        self._touched = time.monotonic()
        self._errors = 0
        self._thread = threading.Thread(
            target=self._run, name=f"migronaut-lease-{lane.name}", daemon=True
        )

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def touch(self) -> None:
        self._touched = time.monotonic()

    def _run(self) -> None:
        renew_every = max(0.01, self._ttl_s / 2)
        retry_every = max(0.01, min(renew_every, self._ttl_s / 8, 1.0))
        now = time.monotonic()
        next_renew = now + renew_every
        next_control = now + CONTROL_INTERVAL_S
        while not self._stop.wait(max(0.0, min(next_renew, next_control) - time.monotonic())):
            now = time.monotonic()
            if now >= next_control:
                next_control = now + CONTROL_INTERVAL_S
                if self._lane.control is None:
                    self._read_control()
            if now >= next_renew:
                renewed: bool | None = True
                if now - self._touched >= self._ttl_s / 4:
                    renewed = self._renew()
                if renewed is None:
                    return
                next_renew = now + (renew_every if renewed else retry_every)

    def _renew(self) -> bool | None:
        """``True`` renewed, ``False`` failed (try again soon), ``None`` lost (lane stopped)."""
        try:
            held = self._lane.store.renew(self._lease)
        except Exception as error:
            self._errors += 1
            self._lane.logger.debug("lease renewal failed: %s", type(error).__name__)
            if time.monotonic() - self._touched < self._ttl_s * LEASE_LOST_AFTER:
                return False
            held = False
        else:
            self._errors = 0
        if held:
            self.touch()
            return True
        self._lane.lose(self._lease)
        return None

    def _read_control(self) -> None:
        try:
            doc = self._lane.store.control_read(self._lane.name)
        except Exception as error:  # the checkpoint is fenced anyway; try again next second
            self._lane.logger.debug("control read failed: %s", type(error).__name__)
            return
        outcome = _control_outcome(doc, self._generation, self._plan)
        if outcome is None and self._lane.resharded():
            outcome = "stale"
        self._lane.control = outcome


def _control_outcome(doc: Mapping[str, Any] | None, generation: int, plan: str) -> str | None:
    if doc is None:
        return "cancelled"
    status = doc.get("status")
    if status in ("paused", "cancelled", "failed"):
        return str(status)
    if status != "running":
        return "stale"
    if doc.get("generation") != generation or (doc.get("plan") or {}).get("token") != plan:
        return "stale"
    return None


_version_indexes: dict[tuple[Any, ...], tuple[str | None, float]] = {}
_warned_indexes: set[tuple[Any, ...]] = set()
_index_lock = threading.Lock()


class _Lane:
    """One slice's working state; owned by the thread that called :func:`run_slice`."""

    def __init__(
        self,
        *,
        store: BackgroundStore,
        job: BackgroundJob,
        db: Database[dict[str, Any]],
        state: Mapping[str, Any],
        owner: str,
        ttl_ms: int,
        caller: Cancellation,
        slice_ms: int | None,
        emit: Emit,
        logger: logging.Logger,
        run_id: str | None,
        telemetry: Telemetry,
    ) -> None:
        self.store = store
        self.job = job
        self.db = db
        self.name = job.name
        self.spec: Mapping[str, Any] = job.spec
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.caller = caller
        self._emit = emit
        self.logger = logger
        self.run_id = run_id
        self.telemetry = telemetry
        self.generation = int(state["generation"])
        self.plan = str(state["plan"]["token"])
        self.partitioner = str(state["plan"].get("partitioner") or "id")
        #: ``{uuid, key}`` of a sharded collection: a reshard makes the plan stale
        self.epoch: Mapping[str, Any] | None = state["plan"].get("epoch")
        self.sharding: Mapping[str, Any] = state["plan"].get("sharding") or {}
        self.registration = state.get("registration")
        self.state_bad_ids: list[Any] = list(state.get("badIds") or [])
        self.direction = job.direction
        self.control: str | None = None
        self.lost = False
        self.signal = _Signal(caller)
        self.pacing = _Signal(self.signal, stop=lambda: self.control is not None)
        budget_ms = slice_ms if slice_ms is not None else int(self.spec.get("sliceMs", 30_000))
        self.deadline = time.monotonic() + budget_ms / 1000.0
        self.deadline_epoch_ms = int(time.time() * 1000) + budget_ms
        self.first_batch = True
        self._log_seq = itertools.count(1)
        self.user_logger = MigrationLogger(
            logger, {"migration": self.name, "runId": run_id}, sink=self._user_line
        )
        self.throttle = Throttle(
            name=self.name, spec=self.spec, hook=job.functions.throttle, db=db,
            cancellation=self.pacing, logger=logger,
        )
        self.mode = str(self.spec.get("mode", "declarative"))
        transaction = self.spec.get("transaction") or False
        self.transaction: Mapping[str, Any] | None = (
            transaction if isinstance(transaction, Mapping) else None
        )
        self.txn_size: int | None = None
        self.txn_clean = 0
        #: counters of work that no checkpoint recorded yet and that must be recorded once
        #: (transaction retries of a batch that never committed)
        self.carried: dict[str, int] = {}
        #: server time of the current batch's write commands (what the controller judges)
        self.write_s = 0.0
        self.outage = _Outage(int(self.spec.get("maxOutageMs", 300_000)))
        if self.mode == "declarative":
            self._init_declarative()

    # -- setup ----------------------------------------------------------------------------
    def _init_declarative(self) -> None:
        from pymongo import WriteConcern

        spec = self.spec
        self.field: str = spec["field"]
        self.revision_field: str | None = spec.get("revisionField")
        self.occ: str = spec.get("occ", "revision")
        forward = self.direction == "forward"
        self.source = int(spec["from"] if forward else spec["to"])
        self.target = int(spec["to"] if forward else spec["from"])
        self.match: dict[str, Any] = self.job.match(self.state_bad_ids or None)
        self.stamp = stamper(self.field, self.revision_field, self.target)
        transform, batched = self.job.functions.transform(self.direction)
        if transform is None:
            raise MigrationExecutionFailedError(
                f"Background migration {self.name} has no transform for direction "
                f"{self.direction}",
                {"migration": self.name, "direction": self.direction},
            )
        self.transform: Callable[..., Any] = transform
        self.batched = batched
        base = self.db[spec["collection"]]
        options = self.db.codec_options
        self.decode_options: CodecOptions[dict[str, Any]] = options.with_options(
            document_class=dict)
        raw_options: CodecOptions[RawBSONDocument] = options.with_options(
            document_class=RawBSONDocument)
        self.coll: Collection[dict[str, Any]] = base.with_options(
            codec_options=self.decode_options)
        self.raw_coll: Collection[RawBSONDocument] = base.with_options(
            codec_options=raw_options
        )
        self.write_coll: Collection[dict[str, Any]] = base.with_options(
            write_concern=WriteConcern(**dict(spec.get("writeConcern") or {"w": "majority"}))
        )
        key = self.sharding.get("shardKey")
        #: shard-key fields: added to every guarded write, and guarded against changes
        self.shard_fields: list[str] = list(key) if key else []
        self.key_ranges: KeyRanges | None = None
        if self.partitioner == "shard" and key and self.sharding.get("index"):
            self.key_ranges = KeyRanges(key, self.sharding["index"], self.field, self.source,
                                        self.match)
        # key ranges read through the sharded version index; only _id ranges need this one
        self.hint = self._version_index() if self.key_ranges is None else None

    def _version_index(self) -> str | None:
        """The version index's name when the collection has one (looked up once per process)."""
        key = (id(self.db.client), self.db.name, self.coll.name, self.field)
        now = time.monotonic()
        with _index_lock:
            cached = _version_indexes.get(key)
        if cached is not None and (cached[0] is not None or now - cached[1] < _INDEX_RECHECK_S):
            return cached[0]
        found: str | None = None
        try:
            found = index_named(self.coll.index_information(), [(self.field, 1), ("_id", 1)])
        except Exception as error:  # namespace not found, or no listIndexes: scan unhinted
            self.logger.debug("cannot list indexes: %s", type(error).__name__)
        with _index_lock:
            _version_indexes[key] = (found, now)
            warn = found is None and key not in _warned_indexes
            if warn:
                _warned_indexes.add(key)
        if warn:
            self.logger.warning(
                "Background migration %s: collection %s has no version index {%s: 1, _id: 1} "
                "— batches are read without it (create it, e.g. by declaring the collection's "
                "versioning)", self.name, self.coll.name, self.field,
                extra={"migration": self.name, "collection": self.coll.name},
            )
        return found

    # -- events ---------------------------------------------------------------------------
    def emit(self, event: str, payload: dict[str, Any]) -> None:
        body = {"migration": self.name, **payload}
        if self.run_id is not None:
            body["runId"] = self.run_id
        try:
            self._emit(event, body)
        except Exception as error:  # listeners never break work
            self.logger.debug("listener for %s failed: %s", event, error)

    def _user_line(
        self, level: int, msg: object, args: tuple[Any, ...], fields: dict[str, Any],
        correlation: Mapping[str, Any], userland: bool,
    ) -> None:
        """A ``userland`` ``ctx.logger`` line of a transform or step: ``migration:log`` with
        ``kind: 'background'`` (reference background §7.1); other lines only reach the logger."""
        if userland:
            self.emit("migration:log", log_line(
                kind="background", level=level, msg=msg, args=args, fields=fields,
                correlation=correlation, seq=next(self._log_seq)))

    def resharded(self) -> bool:
        """Whether the collection was resharded since the plan (its epoch is stale)."""
        if not self.epoch:
            return False
        return epoch_is_stale(self.db, str(self.spec.get("collection")), self.epoch)

    def lose(self, lease: Lease) -> None:
        """Called by the keeper: the lease is gone; stop the lane."""
        self.lost = True
        self.signal.cancel(
            LockLostError(
                "Lost the partition lease: another lane holds it now",
                {"lease": True, "partition": str(lease.partition_id)},
            )
        )

    # -- the slice loop -------------------------------------------------------------------
    def run(self) -> SliceResult:
        counters: dict[str, int] = {}
        worked = False
        max_parallel = int(self.spec.get("maxParallel", 1) or 1)
        shard_concurrency = (int(self.spec.get("shardConcurrency", 1) or 1)
                             if self.partitioner == "shard" else None)
        while True:
            if self.caller.cancelled:
                return SliceResult("stopped", counters)
            if worked and time.monotonic() >= self.deadline:
                return SliceResult("yielded", counters)
            if worked and self.resharded():  # (the keeper also checks, once a second)
                return SliceResult("stale", counters)
            claimed = self.store.claim(
                self.name, generation=self.generation, plan=self.plan,
                max_parallel=max_parallel, ttl_ms=self.ttl_ms, owner=self.owner,
                shard_concurrency=shard_concurrency,
            )
            if claimed == "exhausted":
                return SliceResult("exhausted", counters)
            if claimed == "busy" or not isinstance(claimed, Lease):
                if worked:
                    return SliceResult("yielded", counters)
                return SliceResult("busy", counters, retry_after_ms=max(1, self.ttl_ms // 2))
            outcome = self._hold(claimed)
            worked = True
            _add(counters, outcome.counters)
            if outcome.outcome != "exhausted":
                return SliceResult(outcome.outcome, counters, error=outcome.error)

    def _hold(self, lease: Lease) -> _Outcome:
        """Work one claimed partition under its lease; settle the lease whatever happens."""
        try:
            partition = self._reload(lease)
        except LockLostError:
            partition = None
        except Exception:
            self._release(lease)
            raise
        if partition is None:
            self.emit("background:lease:lost", {"partition": str(lease.partition_id)})
            return _Outcome("lost", {}, LockLostError(
                "Lost the partition lease right after claiming it", {"lease": True}))
        part = _Part(
            id=partition["_id"], key=str(partition["_id"]),
            generation=int(partition.get("generation", self.generation)),
            scope=partition.get("scope") or {}, cursor=dict(partition.get("cursor") or {}),
        )
        controller = self._controller(partition)
        self.emit("background:slice:start", {
            "generation": part.generation, "partition": part.key, "slot": lease.slot,
        })
        counters: dict[str, int] = {}
        with self.telemetry.background_slice(
            self.name, partition=part.key, generation=part.generation, slot=lease.slot,
            run_id=self.run_id,
        ) as traced:
            try:
                with _LeaseKeeper(self, lease, part.generation,
                                  str(partition.get("plan"))) as keeper:
                    outcome = self._work_through_outages(lease, part, partition, keeper,
                                                         controller, counters)
            except BaseException as error:
                outcome = self._settle_error(lease, part, error, counters)
            else:
                outcome = self._settle(lease, part, outcome)
            traced.set({"migronaut.background.slice.outcome": outcome.outcome}, metric=True)
            if outcome.outcome == "failed" and outcome.error is not None:
                traced.fail(outcome.error)
            traced.set({f"migronaut.background.slice.{key}": outcome.counters.get(key)
                        for key in ("batches", "migrated")})
            return outcome

    def _work_through_outages(
        self,
        lease: Lease,
        part: _Part,
        partition: Mapping[str, Any],
        keeper: _LeaseKeeper,
        controller: AdaptiveController | None,
        counters: dict[str, int],
    ) -> _Outcome:
        """Work the partition; after an outage (lost connection, election) start again from
        what the partition document says, keeping the lease.

        Whatever of the lane's work landed is exactly what the stored partition records: its
        checkpoint's counters and cursor, and the intent naming the one batch that may have been
        written after it. Starting again from there — counting the intent's documents now at the
        target, then reading on from the stored cursor — counts every document once, whether the
        last command's reply was lost after it applied or before. Outages are not failures until
        the outage budget (``maxOutageMs``) runs out; the lease keeper keeps renewing meanwhile.
        """
        while True:
            try:
                if partition.get("inflight"):
                    self._recover(lease, part, partition["inflight"], counters)
                outcome = self._work(lease, part, keeper, controller, counters)
                if part.unflushed:
                    self._flush(lease, part, controller)
                return outcome
            except Exception as error:
                if isinstance(error, (LockLostError, RunAbortedError)) or self.caller.cancelled:
                    raise
                if not is_outage(error) or not self.outage.ride_out(error, self):
                    raise
            for key, value in part.pending.items():  # written, maybe not recorded: see intent
                counters[key] = counters.get(key, 0) - value
            reloaded = self._reload(lease)
            if reloaded is None:
                return _Outcome("exhausted", counters)
            partition = reloaded
            part.cursor = dict(partition.get("cursor") or {})
            part.pending, part.pending_errors = {}, []
            part.intent = bool(partition.get("inflight"))

    def _reload(self, lease: Lease) -> dict[str, Any] | None:
        """The held partition as stored (outages ridden out); ``None`` when it is done.

        ``LOCK_LOST`` when another lane holds it now (a reaper took the lease meanwhile).
        """
        while True:
            try:
                doc = self.store.partitions.find_one({"_id": lease.partition_id})
                break
            except Exception as error:
                if not is_outage(error) or not self.outage.ride_out(error, self):
                    raise
        if doc is not None and (doc.get("lease") or {}).get("token") == lease.token:
            return doc
        if doc is not None and doc.get("status") == "done":
            return None  # its last checkpoint landed, or its next holder finished it
        raise LockLostError("Lost the partition lease", {"lease": True,
                                                         "partition": str(lease.partition_id)})

    def _recover(
        self, lease: Lease, part: _Part, inflight: Mapping[str, Any], counters: dict[str, int]
    ) -> None:
        """Count the batch a previous holder wrote but did not checkpoint (it crashed).

        Its checkpoint before the write named the documents it was about to write; those now
        at the target version were written by it (a replay skips them: they no longer match),
        so they are counted here, once — the fenced checkpoint clears the intent.
        """
        ids = list(inflight.get("ids") or ())
        landed = self._landed(ids) if ids and self.mode == "declarative" else {}
        written = sum(1 for doc in landed.values() if _at(doc.get(self.field), self.target))
        found = _nonzero({"scanned": written, "migrated": written})
        part.intent = True
        part.pending = dict(found)
        self._flush(lease, part, None)
        _add(counters, found)
        if written:
            self.logger.debug("%s: %d document(s) written before a lane stopped were counted",
                              self.name, written, extra={"partition": part.key})

    def _controller(self, partition: Mapping[str, Any]) -> AdaptiveController | None:
        adaptive = self.spec.get("adaptive")
        if self.mode != "declarative" or not isinstance(adaptive, Mapping):
            return None
        key = (self.db.name, self.name, self.registration, partition.get("group"))
        return controller_for(key, adaptive, seed=partition.get("throttle"))

    def _settle(self, lease: Lease, part: _Part, outcome: _Outcome) -> _Outcome:
        if outcome.counters.get("batches"):
            try:
                self.store.update_state(self.name, {}, {}, server_times=["lastProgressAt"])
            except Exception as error:
                self.logger.debug("lastProgressAt not updated: %s", type(error).__name__)
        self.emit("background:slice:end", {
            "partition": part.key, "outcome": outcome.outcome, "counters": outcome.counters,
        })
        if outcome.outcome == "failed" and outcome.error is not None:
            message = outcome.error.message
            self.store.fail_partition(lease, message)
            self.store.move(
                self.name, "fail", set_fields={"lastError": message},
                server_times=["failedAt"], reason="document errors over budget",
            )
            self.logger.error("✖ %s", message, extra={"migration": self.name})
            self.emit("background:failed", {"error": message})
        elif outcome.outcome != "exhausted":
            self._release(lease)
        return outcome

    def _settle_error(
        self, lease: Lease, part: _Part, error: BaseException, counters: dict[str, int]
    ) -> _Outcome:
        fenced = isinstance(error, LockLostError) and bool(error.context.get("lease"))
        if self.lost or fenced:
            lost = error if fenced and isinstance(error, LockLostError) else LockLostError(
                "Lost the partition lease", {"lease": True, "partition": part.key})
            # fenced by the token: frees the slot when the lease is still ours (the partition was
            # superseded or cancelled under it), a no-op when another lane holds it
            self._release(lease)
            self.emit("background:lease:lost", {"partition": part.key})
            self.emit("background:slice:end", {
                "partition": part.key, "outcome": "lost", "counters": counters,
            })
            return _Outcome("lost", counters, lost)
        if self.caller.cancelled and isinstance(error, Exception):
            # a shutdown or deploy, never a failure — whatever the stop made user code raise
            _add(part.pending, self._take_carried())
            if part.unflushed:
                try:
                    self._flush(lease, part, None)
                except Exception as flush_error:  # the next holder recovers the intent
                    self.logger.debug("progress not flushed: %s", type(flush_error).__name__)
            self._release(lease)
            self.emit("background:slice:end", {
                "partition": part.key, "outcome": "stopped", "counters": counters,
            })
            return _Outcome("stopped", counters)
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: leave quickly
            self._release(lease)
            raise error
        failure = self._slice_error(error, part)
        partition_failed = False
        if failure.code != TransactionsUnsupportedError.code:
            try:
                partition_failed = self.store.fail_slice(
                    lease, failure.message,
                    max_failures=int(self.spec.get("maxSliceFailures", 3) or 3),
                    counters=self._take_carried(),
                )
            except Exception as store_error:
                self.logger.debug("slice failure not recorded: %s", type(store_error).__name__)
        else:
            self._release(lease)
        failure.context.update({"background": self.name, "partition": part.key,
                                "partitionFailed": partition_failed})
        self.emit("background:slice:end", {
            "partition": part.key, "outcome": "error", "error": failure.message,
            "counters": counters,
        })
        raise failure from error

    def _take_carried(self) -> dict[str, int]:
        carried, self.carried = self.carried, {}
        return carried

    def _slice_error(self, error: Exception, part: _Part) -> MigronautError:
        return _wrap(self.name, error, part.key)

    def _release(self, lease: Lease) -> None:
        try:
            self.store.release(lease)
        except Exception as error:  # the lease expires by itself
            self.logger.debug("lease not released: %s", type(error).__name__)

    # -- one partition (§4.3) -------------------------------------------------------------
    def _work(
        self,
        lease: Lease,
        part: _Part,
        keeper: _LeaseKeeper,
        controller: AdaptiveController | None,
        counters: dict[str, int],
    ) -> _Outcome:
        batches = 0
        max_errors = int(self.spec.get("maxDocumentErrors", 0) or 0)
        while True:
            if self.signal.cancelled:
                if self.caller.cancelled:
                    return _Outcome("stopped", counters)
                self.signal.raise_if_cancelled()
            if batches and time.monotonic() >= self.deadline:
                return _Outcome("yielded", counters)
            if self.control is not None:
                return _Outcome(self.control, counters)
            size = controller.batch_size if controller else int(self.spec.get("batchSize", 500))
            if not self.throttle.before_batch(
                generation=part.generation, partition=part.key, batch_size=size,
                extra_pause_ms=controller.pause_ms if controller else 0,
                first=self.first_batch,
            ):
                continue
            self.first_batch = False
            batch = self._batch(lease, part, keeper, controller, size)
            self.outage.clear()
            batches += 1
            _add(counters, batch.counters)
            self.emit("background:batch", {
                "partition": part.key, "counters": batch.counters,
                "latencyMs": round(batch.latency_ms, 3), "batchSize": batch.batch_size,
            })
            if batch.over_budget is not None:
                total = batch.over_budget
                return _Outcome("failed", counters, BackgroundFailedError(
                    f"Background migration {self.name} failed: {total} document(s) could "
                    f"not be migrated, more than maxDocumentErrors ({max_errors}) — last: "
                    f"{batch.errors[-1].message}",
                    {"migration": self.name, "documentErrors": total},
                ))
            if batch.done:
                return _Outcome("exhausted", counters)

    def _batch(
        self,
        lease: Lease,
        part: _Part,
        keeper: _LeaseKeeper,
        controller: AdaptiveController | None,
        size: int,
    ) -> _Batch:
        if self.mode == "step":
            return self._step_batch(lease, part, keeper)
        try:
            if self.transaction is not None:
                batch = self._txn_batch(lease, part, keeper, controller, size)
            else:
                batch = self._plain_batch(lease, part, keeper, controller, size)
        except LockLostError:
            raise
        except Exception as error:
            if controller is not None and _overloaded(error):
                self._report(controller.record(0.0, overloaded=True))
            raise
        return batch

    def _over_budget(self, errors: Sequence[_DocError]) -> int | None:
        """Distinct failed documents including ``errors`` when more than the budget allows.

        Counted before the checkpoint, so a batch that exhausts the budget never marks its
        partition done: the lane fails it instead (§4.7).
        """
        if not errors:
            return None
        total = self.store.count_bad_ids(
            self.name, self.generation, [*self.state_bad_ids, *(e.id for e in errors)])
        return total if total > int(self.spec.get("maxDocumentErrors", 0) or 0) else None

    def _report(self, report: Any) -> None:
        if report is not None:
            self.emit("background:throttle", {
                "reason": report.reason, "batchSize": report.batch_size,
                "pauseMs": report.pause_ms,
            })

    # -- reading --------------------------------------------------------------------------
    def _batch_query(self, part: _Part) -> dict[str, Any]:
        condition: dict[str, Any] = (
            dict(scope_filter(part.scope)["_id"]) if part.scope.get("kind") == "id-range" else {}
        )
        if "lastId" in part.cursor:
            condition.pop("$gte", None)
            condition["$gt"] = part.cursor["lastId"]
        if not condition:
            return self.match
        if "_id" in self.match:
            return {"$and": [self.match, {"_id": condition}]}
        return {**self.match, "_id": condition}

    def _read_batch(
        self, coll: Collection[_D], part: _Part, limit: int,
        session: ClientSession | None = None, max_time_ms: int | None = None,
    ) -> list[_D]:
        """The partition's next batch: by ``_id`` range, or through the sharded version index
        with exact index bounds for a key range (reference §5)."""
        if self.key_ranges is None or part.scope.get("kind") != "key-range":
            return self._find(coll, self._batch_query(part), limit, session, max_time_ms)
        read = self.key_ranges.read(part.scope, part.cursor)
        return read_batch(coll, read.filter, limit, hint=read.hint, sort=read.sort,
                          bounds=(read.min, read.max), session=session, max_time_ms=max_time_ms)

    def _advance(self, part: _Part, docs: Sequence[Mapping[str, Any]], full: bool,
                 stuck: Sequence[Any] = ()) -> bool:
        """Move the partition's cursor past a batch; ``True`` when the partition is done."""
        if self.key_ranges is not None and part.scope.get("kind") == "key-range":
            moved = self.key_ranges.advance(part.cursor, last=docs[-1] if docs else None,
                                            full=full, stuck=stuck)
            if moved is not None:
                part.cursor = moved
            return moved is None
        if docs:
            part.cursor = {"lastId": docs[-1]["_id"]}
        return not full

    def _read(
        self, query: Mapping[str, Any], limit: int, session: ClientSession | None = None,
        max_time_ms: int | None = None,
    ) -> list[dict[str, Any]]:
        """One batch: ``limit`` documents by ``_id`` (one round trip, no ``getMore``)."""
        return self._find(self.coll, query, limit, session, max_time_ms)

    def _find(
        self, coll: Collection[_D], query: Mapping[str, Any], limit: int,
        session: ClientSession | None, max_time_ms: int | None,
    ) -> list[_D]:
        from pymongo.errors import OperationFailure

        if self.hint is None:
            return read_batch(coll, query, limit, session=session, max_time_ms=max_time_ms)
        try:
            return read_batch(coll, query, limit, hint=self.hint, session=session,
                              max_time_ms=max_time_ms)
        except OperationFailure as error:
            if error.code != 2 or "hint" not in str(error).lower():
                raise
            # the index went away: forget it and read without a hint
            with _index_lock:
                _version_indexes.pop(
                    (id(self.db.client), self.db.name, self.coll.name, self.field), None)
            self.hint = None
            return read_batch(coll, query, limit, session=session, max_time_ms=max_time_ms)

    # -- transforms -----------------------------------------------------------------------
    def _context(self, part: _Part, attempt: int = 1,
                 session: ClientSession | None = None) -> TransformContext:
        info = BackgroundInfo(self.name, part.generation, part.key, attempt, self.run_id)
        if session is None:
            return TransformContext(self.signal, self.user_logger, self.direction, info)
        return TransformContext(self.signal, self.user_logger, self.direction, info,
                                session=session, db=self.db, client=self.db.client)

    def _prepare(
        self, stored: Sequence[dict[str, Any]], ctx: TransformContext
    ) -> tuple[list[dict[str, Any]], list[Any], list[_DocError]]:
        """Transform copies; return (stored docs written, guarded update statements, errors)."""
        results = self._transform([copy_document(doc) for doc in stored], ctx)
        if self.signal.cancelled:  # stopped mid-batch: write nothing, the next holder replays
            self.signal.raise_if_cancelled()
        written: list[dict[str, Any]] = []
        ops: list[Any] = []
        errors: list[_DocError] = []
        field_, revision, occ, stamp = self.field, self.revision_field, self.occ, self.stamp
        shard_fields = self.shard_fields
        for doc, result in zip(stored, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(_DocError(doc.get("_id"), "transform",
                                        _user_message(result, doc.get("_id"))))
                continue
            if shard_fields and isinstance(result, Mapping):
                changed = changed_key_field(doc, result, shard_fields)
                if changed is not None:
                    errors.append(_DocError(doc.get("_id"), "shard-key-changed",
                                            shard_key_message(changed)))
                    continue
            update = stamp(doc, result)
            if type(update) is DocumentProblem:
                errors.append(_DocError(doc.get("_id"), update.reason, update.message))
                continue
            written.append(doc)
            guard = guard_filter(doc, field_, revision, occ)
            if shard_fields:  # targets the owning shard, never an orphan
                guard.update(key_values(doc, shard_fields))
            ops.append({"q": guard, "u": update})
        return written, ops, errors

    def _transform(self, copies: list[dict[str, Any]], ctx: TransformContext) -> list[Any]:
        fn = self.transform
        if self.batched:
            try:
                results = call_user(fn, copies, ctx)
            except Exception as error:
                if self.signal.cancelled:
                    self.signal.raise_if_cancelled()
                raise _SliceFailure(
                    f"migrate_batch raised {_clip(describe_exception(error))}") from error
            if not isinstance(results, (list, tuple)) or len(results) != len(copies):
                got = len(results) if isinstance(results, (list, tuple)) else (
                    f"a {type(results).__name__}")
                raise _SliceFailure(
                    f"migrate_batch returned {got} results for {len(copies)} documents — it "
                    "must return one per document, in order")
            return list(results)
        out: list[Any] = []
        append = out.append
        for doc in copies:
            try:
                result = fn(doc, ctx)
                if type(result) is not dict and inspect.isawaitable(result):
                    result = call_user(_awaited, result)
            except Exception as error:
                result = error
            append(result)
        return out

    # -- plain batch (§4.4) ---------------------------------------------------------------
    def _plain_batch(
        self,
        lease: Lease,
        part: _Part,
        keeper: _LeaseKeeper,
        controller: AdaptiveController | None,
        limit: int,
    ) -> _Batch:
        """Read, transform, checkpoint the previous batch with this one's intent, write.

        The checkpoint of a batch travels with the next batch's intent (the ids it is about to
        write), so a lane killed between a write and its checkpoint leaves a record the next
        holder counts from (:meth:`_recover`) — totals stay exact — at 3 round trips a batch.
        """
        self.write_s = 0.0
        docs = self._read_batch(self.coll, part, limit)
        read = len(docs)
        docs = _within_intent(docs)
        counters = {"scanned": len(docs), "migrated": 0, "skipped": 0, "conflicts": 0,
                    "retried": 0, "failed": 0, "batches": 1}
        errors: list[_DocError] = []
        ctx = self._context(part)
        candidates: Sequence[dict[str, Any]] = docs
        max_rounds = int(self.spec.get("maxConflictRetries", 3))
        rounds = 0
        left: list[Any] = []
        while candidates:
            written, ops, doc_errors = self._prepare(candidates, ctx)
            errors.extend(doc_errors)
            if rounds == 0 and ops:
                self._flush(lease, part, controller, intent=[doc["_id"] for doc in written])
                keeper.touch()
            retry = self._write(lease, written, ops, errors, counters)
            if not retry:
                break
            if rounds >= max_rounds:
                counters["conflicts"] += len(retry)
                left = retry
                break
            rounds += 1
            counters["retried"] += len(retry)
            candidates = self._read(
                {"$and": [self.match, {"_id": {"$in": retry}}]}, len(retry))
            counters["skipped"] += len(retry) - len(candidates)
        latency_ms = self.write_s * 1000.0
        if controller is not None:
            self._report(controller.record(latency_ms, overloaded=self.throttle.take_lagged()))
        counters["failed"] = len(errors)
        exhausted = self._advance(part, docs, read >= limit or len(docs) < read,
                                  [*(e.id for e in errors), *left])
        _add(part.pending, counters)
        part.pending_errors.extend(errors)
        over = self._over_budget(part.pending_errors if errors else ())
        done = exhausted and over is None
        if done or over is not None:
            self._flush(lease, part, controller, done=done)
            keeper.touch()
        return _Batch(_nonzero(counters), latency_ms, limit, done, errors, over)

    def _flush(
        self,
        lease: Lease,
        part: _Part,
        controller: AdaptiveController | None,
        *,
        intent: Sequence[Any] | None = None,
        done: bool = False,
    ) -> None:
        """Checkpoint what the lane has not recorded yet, with the next write's intent."""
        self._checkpoint(lease, part, part.pending, part.pending_errors, controller, done,
                         intent=intent)
        part.pending = {}
        part.pending_errors = []
        part.intent = intent is not None

    def _write(
        self,
        lease: Lease,
        written: list[dict[str, Any]],
        ops: list[Any],
        errors: list[_DocError],
        counters: dict[str, int],
    ) -> list[Any]:
        """One unordered guarded ``update`` command; returns the ids to re-transform.

        Its round trip is the batch's server time (:attr:`write_s`). A retry after a lost reply
        first confirms the lease (:meth:`_confirm`).
        """
        from pymongo.errors import WriteError

        if not ops:
            return []
        try:
            outcome = self._send(lease, ops)
        except _UNENCODABLE:
            kept_docs, kept_ops = self._storable(written, ops, errors)
            if len(kept_ops) == len(ops):
                raise  # not a value BSON cannot store
            if not kept_ops:
                return []
            written, ops = kept_docs, kept_ops
            outcome = self._send(lease, ops)
        failed_at: set[int] = set()
        for item in outcome.write_errors:
            code = item.get("code")
            if code not in DOCUMENT_WRITE_CODES:
                raise WriteError(str(item.get("errmsg", "write error")), code, dict(item))
            index = int(item["index"])
            failed_at.add(index)
            errors.append(_DocError(written[index].get("_id"), "write",
                                    _write_error_message(item)))
        pending = [doc for i, doc in enumerate(written) if i not in failed_at]
        if outcome.matched >= len(pending):
            counters["migrated"] += len(pending)
            return []
        return self._classify(pending, counters)

    def _send(self, lease: Lease, ops: list[Any]) -> UpdateOutcome:
        started = time.monotonic()
        try:
            return guarded_updates(self.write_coll, ops, confirm=lambda: self._confirm(lease))
        finally:
            self.write_s += time.monotonic() - started

    def _storable(
        self, written: list[dict[str, Any]], ops: list[Any], errors: list[_DocError]
    ) -> tuple[list[dict[str, Any]], list[Any]]:
        """The statements BSON can encode; the others are document errors (reason ``shape``).

        Called only when a batch's command failed to encode (a ``migrate`` that returned a value
        BSON cannot store, such as an ``object()``) — before its statements were sent, since
        encoding comes first: the hot path never encodes anything twice.
        """
        keep_docs: list[dict[str, Any]] = []
        keep_ops: list[Any] = []
        for doc, op in zip(written, ops, strict=True):
            try:
                self._encode(op)
            except _UNENCODABLE as error:
                errors.append(_DocError(doc.get("_id"), "shape",
                                        "the migrated document cannot be stored as BSON "
                                        f"({type(error).__name__})"))
                continue
            keep_docs.append(doc)
            keep_ops.append(op)
        return keep_docs, keep_ops

    def _encode(self, value: Mapping[str, Any]) -> None:
        bson.encode(value, codec_options=self.write_coll.codec_options)

    def _confirm(self, lease: Lease) -> None:
        """Renew the lease (fenced) before a write is sent again: ``LOCK_LOST`` when another
        lane holds the partition now, so a retried write never lands after a takeover."""
        if not self.store.renew(lease):
            raise LockLostError("Lost the partition lease before retrying a write",
                                {"lease": True, "partition": str(lease.partition_id)})

    def _classify(self, pending: list[dict[str, Any]], counters: dict[str, int]) -> list[Any]:
        """Re-read unmatched candidates: which writes landed, which to retry (§4.4)."""
        now = self._landed([doc["_id"] for doc in pending], pending)
        retry: list[Any] = []
        for doc in pending:
            current = now.get(_id_key(doc["_id"]))
            if current is None:
                counters["skipped"] += 1
                continue
            version = current.get(self.field)
            if _at(version, self.target):
                if self.revision_field is None or self.occ != "revision":
                    counters["migrated"] += 1
                else:
                    before = doc.get(self.revision_field) or 0
                    after = current.get(self.revision_field) or 0
                    counters["migrated" if after == before + 1 else "skipped"] += 1
            elif _at(version, self.source):
                retry.append(doc["_id"])
            else:
                counters["skipped"] += 1
        return retry

    def _landed(self, ids: list[Any], docs: Sequence[Mapping[str, Any]] = ()
                ) -> dict[str, dict[str, Any]]:
        """The version (and revision) of documents now, by id key: which writes landed.

        With the documents as read, a sharded collection is asked by ``$or`` of ``{_id,
        …shard key}`` so each lookup goes to one shard.
        """
        projection = {self.field: 1}
        if self.revision_field is not None:
            projection[self.revision_field] = 1
        query: dict[str, Any] = {"_id": {"$in": ids}}
        if self.shard_fields and docs:
            query = {"$or": [{"_id": doc["_id"], **key_values(doc, self.shard_fields)}
                             for doc in docs]}
        return {_id_key(doc["_id"]): doc for doc in self.coll.find(query, projection)}

    def _checkpoint(
        self,
        lease: Lease,
        part: _Part,
        counters: Mapping[str, int],
        errors: Sequence[_DocError],
        controller: AdaptiveController | None,
        done: bool,
        session: ClientSession | None = None,
        *,
        intent: Sequence[Any] | None = None,
    ) -> None:
        at = datetime.now(UTC)
        self.store.checkpoint(
            lease,
            cursor=part.cursor,
            counters=_nonzero(counters),
            bad_ids=[e.id for e in errors],
            doc_errors=[{"error": e.message, "reason": e.reason, "at": at} for e in errors],
            throttle=controller.state() if controller is not None else None,
            done=done,
            session=session,
            intent=intent,
        )

    # -- transactional batch (§4.5) -------------------------------------------------------
    def _txn_batch(
        self,
        lease: Lease,
        part: _Part,
        keeper: _LeaseKeeper,
        controller: AdaptiveController | None,
        limit: int,
    ) -> _Batch:
        from pymongo.errors import PyMongoError

        assert self.transaction is not None
        max_retries = int(self.transaction.get("maxRetries", 5))
        size = min(self.txn_size or limit, limit)
        excluded: dict[str, _DocError] = {}
        attempts = 0
        attempt_no = 0
        txn_retries = 0
        last_read: list[Any] = []
        while True:
            if self.signal.cancelled:
                self.carried["txnRetries"] = self.carried.get("txnRetries", 0) + txn_retries
                self.signal.raise_if_cancelled()
            attempt_no += 1
            started = time.monotonic()
            try:
                batch = self._txn_attempt(lease, part, controller, size, excluded,
                                          attempt_no, txn_retries, last_read)
            except LockLostError:
                raise
            except _DocumentFailure as failure:
                for doc_error in failure.errors:
                    excluded[_id_key(doc_error.id)] = doc_error
                continue
            except (_Conflict, PyMongoError) as error:
                kind = None if _outage(error) else _txn_error_kind(error)
                if kind is None:
                    # not retried here (an outage is ridden out by the partition's holder):
                    # the retries so far are recorded with the next checkpoint or the failure
                    self.carried["txnRetries"] = self.carried.get("txnRetries", 0) + txn_retries
                    raise
                txn_retries += 1
                if controller is not None and kind != "conflict":
                    self._report(controller.record(
                        (time.monotonic() - started) * 1000.0, overloaded=True))
                if len(last_read) == 1:
                    doc_id = last_read[0]
                    if kind == "limit":
                        excluded[_id_key(doc_id)] = _DocError(
                            doc_id, "transaction",
                            "the document's transaction hit a time or size limit")
                        continue
                    if kind == "conflict":
                        return self._step_past(lease, part, keeper, controller, doc_id,
                                               txn_retries, limit)
                if kind == "limit" and size > 1:
                    size = max(1, size // 2)
                    self.txn_size, self.txn_clean = size, 0
                    continue
                attempts += 1
                if attempts > max_retries:
                    self.carried["txnRetries"] = self.carried.get("txnRetries", 0) + txn_retries
                    raise _SliceFailure(
                        f"a transactional batch failed {attempts} times in a row "
                        f"({_describe_server(error)}) — more than maxRetries ({max_retries})"
                    ) from error
                if attempts > max_retries / 2 and size > 1:
                    size = max(1, size // 2)
                    self.txn_size, self.txn_clean = size, 0
                if self.signal.wait(random.random() * min(2000, 50 * 2**attempts) / 1000.0):
                    self.signal.raise_if_cancelled()
                continue
            keeper.touch()
            if attempt_no == 1 and not excluded:
                self.txn_clean += 1
                if self.txn_clean >= TXN_GROW_AFTER:
                    self.txn_clean = 0
                    size = min(limit, math.ceil(size * 1.5))
            else:
                self.txn_clean = 0
            self.txn_size = size
            return batch

    def _txn_attempt(
        self,
        lease: Lease,
        part: _Part,
        controller: AdaptiveController | None,
        size: int,
        excluded: Mapping[str, _DocError],
        attempt: int,
        txn_retries: int,
        last_read: list[Any],
    ) -> _Batch:
        from pymongo import ReadPreference, WriteConcern
        from pymongo.errors import WriteError
        from pymongo.read_concern import ReadConcern

        assert self.transaction is not None
        timeout_ms = int(self.transaction.get("timeoutMs", 10_000))
        self.write_s = 0.0
        with self.db.client.start_session() as session:
            session.start_transaction(
                read_concern=ReadConcern("snapshot"),
                write_concern=WriteConcern(**dict(self.spec.get("writeConcern") or {})),
                read_preference=ReadPreference.PRIMARY,
                max_commit_time_ms=timeout_ms,
            )
            try:
                raws = self._read_batch(self.raw_coll, part, size, session, timeout_ms)
                kept: list[RawBSONDocument] = []
                total = 0
                for raw in raws:
                    total += len(raw.raw)
                    if kept and total > TXN_BATCH_BYTES:
                        break
                    kept.append(raw)
                cut = len(kept) < len(raws)
                last_read[:] = [_raw_id(raw) for raw in kept]
                decode, options = bson.decode, self.decode_options
                todo = [decode(raw.raw, options) for raw in kept
                        if _id_key(_raw_id(raw)) not in excluded]
                failed = [excluded[_id_key(i)] for i in last_read if _id_key(i) in excluded]
                ctx = self._context(part, attempt, session)
                written, ops, errors = self._prepare(todo, ctx)
                if errors:
                    raise _DocumentFailure(errors)
                if ops:
                    outcome = self._txn_write(written, ops, session)
                    refused = [
                        _DocError(written[int(item["index"])].get("_id"), "write",
                                  _write_error_message(item))
                        for item in outcome.write_errors
                        if item.get("code") in DOCUMENT_WRITE_CODES
                    ]
                    if refused:
                        raise _DocumentFailure(refused)
                    if outcome.write_errors:
                        item = outcome.write_errors[0]
                        raise WriteError(str(item.get("errmsg", "write error")),
                                         item.get("code"), dict(item))
                    if outcome.matched < len(ops):
                        raise _Conflict("a guarded write matched nothing")
                carried = self.carried.get("txnRetries", 0)
                counters = {"scanned": len(kept), "migrated": len(ops), "failed": len(failed),
                            "batches": 1, "txnRetries": txn_retries + carried}
                over = self._over_budget(failed)
                cursor_before = part.cursor
                last = [decode(kept[-1].raw, options)] if kept else []
                exhausted = self._advance(part, last, cut or len(raws) >= size,
                                          [e.id for e in failed])
                done = exhausted and over is None
                try:
                    self._checkpoint(lease, part, counters, failed, controller, done, session)
                    committing = time.monotonic()
                    try:
                        _commit(session)
                    finally:
                        self.write_s += time.monotonic() - committing
                except BaseException:
                    part.cursor = cursor_before
                    raise
                if carried:
                    self.carried.pop("txnRetries", None)
                latency_ms = self.write_s * 1000.0
            except BaseException:
                if session.in_transaction:
                    try:
                        session.abort_transaction()
                    except Exception as abort_error:
                        self.logger.debug("abort failed: %s", type(abort_error).__name__)
                raise
        if controller is not None:
            self._report(controller.record(latency_ms, overloaded=self.throttle.take_lagged()))
        return _Batch(_nonzero(counters), latency_ms, size, done, failed, over)

    def _txn_write(
        self, written: list[dict[str, Any]], ops: list[Any], session: ClientSession
    ) -> UpdateOutcome:
        """The batch's guarded writes in the transaction (timed); a statement BSON cannot store
        fails its document (the attempt is retried without it)."""
        started = time.monotonic()
        try:
            return guarded_updates(self.coll, ops, session=session)
        except _UNENCODABLE:
            refused: list[_DocError] = []
            self._storable(written, ops, refused)
            if not refused:
                raise
            raise _DocumentFailure(refused) from None
        finally:
            self.write_s += time.monotonic() - started

    def _step_past(
        self,
        lease: Lease,
        part: _Part,
        keeper: _LeaseKeeper,
        controller: AdaptiveController | None,
        doc_id: Any,
        txn_retries: int,
        limit: int,
    ) -> _Batch:
        """A one-document batch that keeps conflicting: leave it to the next pass."""
        carried = self.carried.get("txnRetries", 0)
        counters = {"scanned": 1, "conflicts": 1, "batches": 1,
                    "txnRetries": txn_retries + carried}
        if self.key_ranges is not None and part.scope.get("kind") == "key-range":
            part.cursor = {**part.cursor, "stuck": [*(part.cursor.get("stuck") or ()), doc_id]}
        else:
            part.cursor = {"lastId": doc_id}
        self._checkpoint(lease, part, counters, (), controller, False)
        self.carried.pop("txnRetries", None)
        keeper.touch()
        return _Batch(counters, 0.0, limit, False)

    # -- step (§4.6) ----------------------------------------------------------------------
    def _step_batch(self, lease: Lease, part: _Part, keeper: _LeaseKeeper) -> _Batch:
        fn = self.job.functions.step_for(self.direction)
        if fn is None:
            raise _SliceFailure(f"there is no step function for direction {self.direction}")
        if self.transaction is not None:
            return self._step_txn(lease, part, keeper, fn)
        started = time.monotonic()
        ctx = self._step_context(part, 1, None)
        result = self._call_step(fn, ctx)
        checkpoint, done, counters = _validate_step(result)
        latency_ms = (time.monotonic() - started) * 1000.0
        part.cursor = {"checkpoint": checkpoint}
        self.store.checkpoint(lease, cursor=part.cursor, counters=counters, done=done)
        keeper.touch()
        return _Batch(counters, latency_ms, 1, done)

    def _step_context(self, part: _Part, attempt: int,
                      session: ClientSession | None) -> StepContext:
        return StepContext(
            db=self.db, client=self.db.client, checkpoint=part.cursor.get("checkpoint"),
            deadline=self.deadline_epoch_ms, cancellation=self.signal, logger=self.user_logger,
            direction=self.direction,
            background=BackgroundInfo(self.name, part.generation, part.key, attempt,
                                      self.run_id),
            session=session,
        )

    def _call_step(self, fn: Callable[..., Any], ctx: StepContext) -> Any:
        try:
            return call_user(fn, ctx)
        except (MigronautError, _SliceFailure):
            raise
        except Exception as error:
            from pymongo.errors import PyMongoError

            if isinstance(error, PyMongoError) and _txn_error_kind(error) is not None and (
                ctx.session is not None
            ):
                raise  # transient inside a transaction: retried by the caller
            if self.signal.cancelled:
                self.signal.raise_if_cancelled()
            raise _SliceFailure(f"step raised {_clip(describe_exception(error))}") from error

    def _step_txn(
        self, lease: Lease, part: _Part, keeper: _LeaseKeeper, fn: Callable[..., Any]
    ) -> _Batch:
        from pymongo import ReadPreference, WriteConcern
        from pymongo.errors import PyMongoError
        from pymongo.read_concern import ReadConcern

        assert self.transaction is not None
        timeout_ms = int(self.transaction.get("timeoutMs", 10_000))
        max_retries = int(self.transaction.get("maxRetries", 5))
        attempts = 0
        txn_retries = 0
        attempt_no = 0
        while True:
            self.signal.raise_if_cancelled()
            started = time.monotonic()
            attempt_no += 1
            try:
                with self.db.client.start_session() as session:
                    session.start_transaction(
                        read_concern=ReadConcern("snapshot"),
                        write_concern=WriteConcern(**dict(self.spec.get("writeConcern") or {})),
                        read_preference=ReadPreference.PRIMARY,
                        max_commit_time_ms=timeout_ms,
                    )
                    try:
                        result = self._call_step(
                            fn, self._step_context(part, attempt_no, session))
                        checkpoint, done, counters = _validate_step(result)
                        carried = self.carried.get("txnRetries", 0)
                        if txn_retries + carried:
                            counters["txnRetries"] = txn_retries + carried
                        cursor = {"checkpoint": checkpoint}
                        self.store.checkpoint(lease, cursor=cursor, counters=counters,
                                              done=done, session=session)
                        _commit(session)
                        self.carried.pop("txnRetries", None)
                    except BaseException:
                        if session.in_transaction:
                            try:
                                session.abort_transaction()
                            except Exception as abort_error:
                                self.logger.debug("abort failed: %s",
                                                  type(abort_error).__name__)
                        raise
            except LockLostError:
                raise
            except PyMongoError as error:
                if _outage(error) or _txn_error_kind(error) is None:
                    self.carried["txnRetries"] = self.carried.get("txnRetries", 0) + txn_retries
                    raise
                txn_retries += 1
                attempts += 1
                if attempts > max_retries:
                    self.carried["txnRetries"] = self.carried.get("txnRetries", 0) + txn_retries
                    raise _SliceFailure(
                        f"a transactional step failed {attempts} times in a row "
                        f"({_describe_server(error)}) — more than maxRetries ({max_retries})"
                    ) from error
                if self.signal.wait(random.random() * min(2000, 50 * 2**attempts) / 1000.0):
                    self.signal.raise_if_cancelled()
                continue
            part.cursor = cursor
            keeper.touch()
            return _Batch(counters, (time.monotonic() - started) * 1000.0, 1, done)


# --------------------------------------------------------------------------------- helpers


def _wrap(name: str, error: BaseException, partition: str | None = None) -> MigronautError:
    """A slice's foreign error as the typed error drivers handle (no document data in it)."""
    from pymongo.errors import ConnectionFailure, PyMongoError

    if isinstance(error, MigronautError):
        return error
    context: dict[str, Any] = {"migration": name}
    if partition is not None:
        context["partition"] = partition
    if isinstance(error, _SliceFailure):
        return MigrationExecutionFailedError(f"Background migration {name}: {error}", context)
    if isinstance(error, ConnectionFailure):
        return ConnectionFailedError(
            f"Background migration {name}: lost the connection ({type(error).__name__})",
            context, cause=error)
    if isinstance(error, PyMongoError):
        return MigrationExecutionFailedError(
            f"Background migration {name}: a slice failed: {_describe_server(error)}", context)
    return MigrationExecutionFailedError(
        f"Background migration {name}: a slice failed: {_clip(describe_exception(error))}",
        context)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable



def _commit(session: ClientSession) -> None:
    """Commit; an unknown commit result is retried up to two more times."""
    from pymongo.errors import PyMongoError

    for attempt in range(3):
        try:
            session.commit_transaction()
            return
        except PyMongoError as error:
            if attempt < 2 and error.has_error_label("UnknownTransactionCommitResult"):
                continue
            raise


def _txn_error_kind(error: BaseException) -> str | None:
    """``conflict``, ``limit`` or ``transient`` for retryable transaction errors, else ``None``.

    A server that cannot run transactions at all raises ``TRANSACTIONS_UNSUPPORTED``.
    """
    from pymongo.errors import PyMongoError

    if isinstance(error, _Conflict):
        return "conflict"
    if not isinstance(error, PyMongoError):
        return None
    code = getattr(error, "code", None)
    if refuses_transactions(error):
        raise TransactionsUnsupportedError(
            "This server cannot run transactions (a standalone mongod?) — the background "
            "migration's transaction setting needs a replica set or mongos",
            {"code": code},
        ) from error
    if code == _WRITE_CONFLICT or (code is None and "write conflict" in str(error).lower()):
        return "conflict"  # (the dev server reports a conflict at commit by text only)
    if code in TXN_LIMIT_CODES:
        return "limit"
    if error.has_error_label("TransientTransactionError") or code in TXN_TRANSIENT_CODES:
        return "transient"
    return None


def _outage(error: BaseException) -> bool:
    """A lost connection or a server that is not the primary: over once it is back."""
    from pymongo.errors import ConnectionFailure

    return isinstance(error, ConnectionFailure) or getattr(error, "code", None) in OUTAGE_CODES


def _overloaded(error: BaseException) -> bool:
    from pymongo.errors import BulkWriteError, PyMongoError, WriteConcernError

    if isinstance(error, WriteConcernError):
        return True
    if isinstance(error, BulkWriteError) and error.details.get("writeConcernErrors"):
        return True
    if isinstance(error, PyMongoError):
        if error.has_error_label("TransientTransactionError") or error.has_error_label(
            "RetryableWriteError"
        ):
            return True
        return getattr(error, "code", None) in OVERLOAD_CODES
    return False


def _validate_step(result: Any) -> tuple[Any, bool, dict[str, int]]:
    if not isinstance(result, Mapping) or not isinstance(result.get("done"), bool):
        raise _SliceFailure(
            "step must return { checkpoint, done } — done a boolean "
            f"(got {type(result).__name__})")
    checkpoint = result.get("checkpoint")
    try:
        size = len(bson.encode({"checkpoint": checkpoint}))
    except Exception as error:
        raise _SliceFailure(
            f"step returned a checkpoint that cannot be stored as BSON ({type(error).__name__})"
        ) from error
    if size > STEP_CHECKPOINT_MAX:
        raise _SliceFailure(
            f"step returned a checkpoint of {size} bytes, more than {STEP_CHECKPOINT_MAX} — "
            "keep a cursor in it, not data")
    counters = {"batches": 1}
    for key in ("processed", "migrated"):
        value = result.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            counters[key] = value
    return checkpoint, result["done"], counters


def _at(value: Any, version: int) -> bool:
    """Whether a stored version equals ``version`` (0 = missing, null or 0)."""
    if type(value) is bool:
        return False
    if version == 0:
        return value is None or value == 0
    return bool(value == version)


_FIXED_SIZE_IDS: Final = frozenset({bson.ObjectId, int, bson.Int64, float, bool, datetime})


def _within_intent(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading documents whose ``_id`` s fit :data:`INTENT_MAX_BYTES` (at least one)."""
    total = 0
    for index, doc in enumerate(docs):
        value = doc.get("_id")
        kind = type(value)
        if kind in _FIXED_SIZE_IDS:
            total += 20  # an element of at most 8 bytes of value (12 for an ObjectId)
        elif isinstance(value, str):
            total += len(value.encode("utf-8", "surrogatepass")) + 16
        else:
            total += len(bson.encode({"": value}))
        if total > INTENT_MAX_BYTES and index:
            return docs[:index]
    return docs


def _raw_id(raw: RawBSONDocument) -> Any:
    return raw["_id"]


def _id_key(value: Any) -> str:
    return f"{type(value).__name__}:{value!r}"


def _add(total: dict[str, int], counters: Mapping[str, int]) -> None:
    for key, value in counters.items():
        if value:
            total[key] = total.get(key, 0) + value


def _nonzero(counters: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in counters.items() if v}


def _clip(text: str) -> str:
    return text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 1] + "…"


def _user_message(error: BaseException, doc_id: Any) -> str:
    """A transform error's text without the document's ``_id`` in it."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = text.splitlines()[0] if text.strip() else type(error).__name__
    for shown in {repr(doc_id), str(doc_id)}:
        if len(shown) >= 4:
            text = text.replace(shown, "‹_id›")
    return _clip(text)


def _write_error_message(item: Mapping[str, Any]) -> str:
    """A per-document write error by its code (server texts quote values: never used)."""
    code = item.get("code")
    text = _WRITE_ERROR_TEXT.get(code, f"write error {code}") if isinstance(code, int) else (
        "write error")
    if code == 11000:
        found = _INDEX_NAME.search(str(item.get("errmsg", "")))
        if found:
            text += f" on index {found.group(1)}"
    return text


def _describe_server(error: BaseException) -> str:
    """A server error by class, code and code name — never its text (it may quote values)."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    name = details.get("codeName") if isinstance(details, Mapping) else None
    parts = [type(error).__name__]
    if code is not None:
        parts.append(f"code {code}" + (f" {name}" if name else ""))
    elif str(error):
        parts.append(_clip(str(error).splitlines()[0]))
    return " ".join(parts)
