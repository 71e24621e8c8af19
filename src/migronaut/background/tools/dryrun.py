"""Dry runs of background migrations: see what a migration would do, and write nothing.

Three kinds (reference background §6.7):

* **Sample preview** (declarative; any topology): read a sample (``$sample``) or the first
  documents (by ``_id``) that the migration would rewrite, run the transform on copies and show
  ``before``, the stamped ``change`` and the ``after`` it would produce. Nothing is written;
  there is no transaction.
* **Validated preview** (declarative, ``validate=True``; needs transactions): the same documents
  go through the guarded write inside a :class:`~migronaut.background.tools.sandbox.Sandbox`, so
  validators, unique indexes and the transform's own writes are exercised for real — and rolled
  back. A failed write aborts that sandbox; the remaining documents continue in a fresh one.
* **Step dry run** (step migrations; needs transactions): ``steps`` calls of ``step`` in one
  sandbox, each getting the previous checkpoint and seeing the earlier steps' writes.

Invariants: a dry run never commits (I14 — every sandbox is aborted) and never writes outside a
sandbox; documents and ids appear only in the returned report, never in log lines or events
(I15 — the log gets counts). Options are validated before anything touches the server.

:func:`exit_code` maps a report to the CLI's exit code (0 ok, 1 nothing would migrate / a step
failed, 34 a sandbox refusal); ``TransactionsUnsupportedError`` (15) is raised, not reported.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import bson
from pymongo.errors import OperationFailure, PyMongoError

from migronaut._values import int_within, is_int
from migronaut.background.lanes.diff import (
    DocumentProblem,
    apply_update_locally,
    copy_document,
    guard_filter,
    stamped_diff,
)
from migronaut.background.planning.job import BackgroundJob, load_job
from migronaut.background.tools.sandbox import (
    DEADLINE_MS,
    MAX_ATTEMPTS,
    MAX_DOCUMENTS,
    MAX_OPS,
    Sandbox,
    SandboxClient,
    SandboxDatabase,
    SandboxSession,
    describe_error,
    is_transient,
    relaxed,
)
from migronaut.core._calls import TimedOut, call_user, call_with_timeout
from migronaut.core.context import Cancellation
from migronaut.core.topology import is_mongos
from migronaut.errors import (
    ConfigInvalidError,
    RunAbortedError,
    TransactionsUnsupportedError,
)

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection

    from migronaut.background.engine_core import EngineCore

__all__ = [
    "DEFAULT_SAMPLE",
    "MAX_SAMPLE",
    "MAX_STEPS",
    "DryRunBackground",
    "DryRunContext",
    "check_options",
    "dry_run",
    "exit_code",
]

DEFAULT_SAMPLE: Final = 5
MAX_SAMPLE: Final = 1000
MAX_STEPS: Final = 50
MAX_MAX_DOCUMENTS: Final = 1000
#: Write errors that fail one document, not the batch (reference background §4.4).
PER_DOCUMENT_CODES: Final = frozenset({11000, 121, 72, 66, 17280})
#: Largest step checkpoint, as the BSON of ``{checkpoint}`` (reference background §1.7).
CHECKPOINT_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class DryRunBackground:
    """``ctx.background`` in a dry run (the fields of the lanes' ``BackgroundInfo``).

    ``generation`` and ``partition`` are the registered migration's current ones (0 and ``None``
    for a file that is not registered, or for a declarative preview).
    """

    name: str
    generation: int = 0
    partition: str | None = None
    attempt: int = 1
    run_id: str | None = None


@dataclass(frozen=True)
class DryRunContext:
    """``ctx`` of a transform or a step during a dry run (``dry_run`` is always ``True``).

    ``db``, ``client`` and ``session`` are the sandbox's proxies (``None`` in a plain sample
    preview, where the transform should be a pure function of the document); ``checkpoint`` and
    ``deadline`` (epoch milliseconds) are set for steps.
    """

    direction: str
    background: DryRunBackground
    logger: logging.LoggerAdapter[logging.Logger]
    cancellation: Cancellation
    db: SandboxDatabase | None = None
    client: SandboxClient | None = None
    session: SandboxSession | None = None
    checkpoint: Any = None
    deadline: int | None = None
    dry_run: bool = True


@dataclass(frozen=True)
class _Failure:
    """A transform that failed for one document (message without document data)."""

    message: str


# ------------------------------------------------------------------------------------ options


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _integer(option: str, value: Any, low: int, high: int) -> int:
    if not int_within(value, low, high):
        raise ConfigInvalidError(
            f"{option} must be an integer from {low} to {high} (got {_show(value)})",
            {"option": option},
        )
    return value


def check_options(
    *, sample: Any = None, first: Any = None, direction: Any = "forward", steps: Any = None,
    max_documents: Any = MAX_DOCUMENTS, deadline_ms: Any = DEADLINE_MS, validate: Any = False,
    from_start: Any = False,
) -> None:
    """Check the options that need neither the file nor the server (``CONFIG_INVALID``).

    :func:`dry_run` calls it first; the CLI may call it to refuse bad flags before connecting.
    """
    if sample is not None and first is not None:
        raise ConfigInvalidError("sample and first are exclusive — pass one, not both",
                                 {"option": "sample"})
    if sample is not None:
        _integer("sample", sample, 1, MAX_SAMPLE)
    if first is not None:
        _integer("first", first, 1, MAX_SAMPLE)
    if direction not in ("forward", "revert"):
        raise ConfigInvalidError(
            f"direction must be 'forward' or 'revert' (got {_show(direction)})",
            {"option": "direction"},
        )
    if steps is not None:
        _integer("steps", steps, 1, MAX_STEPS)
    _integer("max_documents", max_documents, 1, MAX_MAX_DOCUMENTS)
    _integer("deadline_ms", deadline_ms, 1, DEADLINE_MS)
    for option, value in (("validate", validate), ("from_start", from_start)):
        if not isinstance(value, bool):
            raise ConfigInvalidError(f"{option} must be True or False (got {_show(value)})",
                                     {"option": option})


# ------------------------------------------------------------------------------------ entry


def dry_run(
    engine: EngineCore,
    name: str,
    *,
    sample: int | None = None,
    first: int | None = None,
    validate: bool = False,
    direction: str = "forward",
    steps: int | None = None,
    max_documents: int = MAX_DOCUMENTS,
    from_start: bool = False,
    deadline_ms: int = DEADLINE_MS,
) -> dict[str, Any]:
    """Dry-run background migration ``name`` (registered or not) and return the report.

    Raises ``CONFIG_INVALID`` for bad options (before touching the server),
    ``MIGRATION_FILE_NOT_FOUND`` / ``MIGRATION_INVALID_EXPORT`` for the file, and
    ``TRANSACTIONS_UNSUPPORTED`` when a validated preview or a step dry run meets a standalone.
    """
    started = time.monotonic()
    check_options(sample=sample, first=first, direction=direction, steps=steps,
                  max_documents=max_documents, deadline_ms=deadline_ms, validate=validate,
                  from_start=from_start)
    # the file as it is on disk now (a long-lived process may hold an older copy of the module)
    job = load_job(engine.directory, name, reserved_collections=engine.reserved, reload=True,
                   strict_checksum=False)
    job = replace(job, direction=direction)
    deadline = started + deadline_ms / 1000
    logger = logging.LoggerAdapter(engine.logger, {"migration": name, "dryRun": True})
    if job.mode == "step":
        if sample is not None or first is not None:
            raise ConfigInvalidError(
                f"{name} is a step migration: preview it with steps, not sample or first",
                {"option": "sample" if sample is not None else "first"},
            )
        if job.functions.step_for(direction) is None:
            raise ConfigInvalidError(
                f"{name} declares no revert_step — there is no way back to preview",
                {"option": "direction"},
            )
        _require_transactions(engine, "A step dry run")
        return _step_dry_run(engine, job, steps or 1, max_documents, from_start, deadline,
                             deadline_ms, logger)
    if steps is not None:
        raise ConfigInvalidError(
            f"steps applies to step migrations; {name} is declarative (use sample or first)",
            {"option": "steps"},
        )
    if from_start:
        raise ConfigInvalidError(
            f"from_start applies to step migrations; {name} is declarative",
            {"option": "from_start"},
        )
    transform, _batched = job.functions.transform(direction)
    if transform is None:
        raise ConfigInvalidError(
            f"{name} declares no revert — there is no way back to preview",
            {"option": "direction"},
        )
    method, count = ("first", first) if first is not None else ("sample", sample or DEFAULT_SAMPLE)
    if validate:
        _require_transactions(engine, "A validated dry run")
        return _validated_preview(engine, job, method, count, max_documents, deadline, logger)
    return _preview(engine, job, method, count, logger)


def exit_code(report: Mapping[str, Any]) -> int:
    """The CLI exit code of a report: 34 refused, 1 nothing would migrate / step failed, 0 ok."""
    if report.get("refusals"):
        return 34
    if report.get("mode") == "step":
        return 0 if report.get("ok") else 1
    return 0 if int(report.get("migrated") or 0) > 0 else 1


def _require_transactions(engine: EngineCore, what: str) -> None:
    if not engine.supports_transactions():
        raise TransactionsUnsupportedError(
            f"{what} needs transactions (a replica set, mongos or the dev server); this server "
            "is a standalone — use a sample preview (no validate) instead",
            {"feature": "background dry run"},
        )


def _is_mongos(engine: EngineCore) -> bool:
    try:
        return is_mongos(engine.db.client)
    except PyMongoError:
        return False


# ------------------------------------------------------------------------------------ documents


def _collection(engine: EngineCore, job: BackgroundJob) -> Collection[dict[str, Any]]:
    return engine.db[str(job.spec["collection"])]


def _read_documents(engine: EngineCore, job: BackgroundJob, method: str,
                    count: int) -> list[dict[str, Any]]:
    """The documents to preview: the first ``count`` by ``_id``, or a ``$sample`` of them."""
    collection = _collection(engine, job)
    match = job.match()
    if method == "first":
        return list(collection.find(match).sort("_id", 1).limit(count))
    return list(collection.aggregate([{"$match": match}, {"$sample": {"size": count}}]))


def _target_version(job: BackgroundJob) -> int:
    return int(job.spec["to"] if job.direction == "forward" else job.spec["from"])


def _transform_one(fn: Callable[..., Any], doc: Mapping[str, Any], ctx: DryRunContext) -> Any:
    try:
        return call_user(fn, copy_document(doc), ctx)
    except Exception as error:
        return _Failure(describe_error(error))


def _transform_batch(fn: Callable[..., Any], docs: Sequence[Mapping[str, Any]],
                     ctx: DryRunContext) -> list[Any]:
    """``migrate_batch`` semantics: an exception in a slot fails that document; a throw, a
    non-list or a wrong length fails all of them."""
    try:
        results = call_user(fn, [copy_document(doc) for doc in docs], ctx)
    except Exception as error:
        return [_Failure(describe_error(error))] * len(docs)
    if not isinstance(results, (list, tuple)) or len(results) != len(docs):
        got = len(results) if isinstance(results, (list, tuple)) else \
            f"a {type(results).__name__} instead of a list of"
        failure = _Failure(f"{getattr(fn, '__name__', 'the batch transform')} returned {got} "
                           f"results for {len(docs)} documents — must return one per document, "
                           "in order")
        return [failure] * len(docs)
    return [_Failure(describe_error(r)) if isinstance(r, BaseException) else r for r in results]


def _row(job: BackgroundJob, doc: Mapping[str, Any],
         result: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A preview row and the update it would write (``None`` when the document fails)."""
    row: dict[str, Any] = {"_id": relaxed(doc["_id"]), "before": relaxed(doc)}
    if isinstance(result, _Failure):
        row["error"] = result.message
        return row, None
    spec = job.spec
    update = stamped_diff(
        doc, result, version_field=str(spec["field"]),
        revision_field=spec.get("revisionField"), target_version=_target_version(job),
    )
    if isinstance(update, DocumentProblem):
        row["error"] = update.message
        return row, None
    try:
        after = apply_update_locally(doc, update)
    except ValueError as error:
        row["error"] = f"the change cannot be applied: {error}"
        return row, None
    row["change"] = relaxed(update)
    row["after"] = relaxed(after)
    return row, update


def _context(job: BackgroundJob, logger: logging.LoggerAdapter[logging.Logger],
             cancellation: Cancellation, sandbox: Sandbox | None = None,
             **extra: Any) -> DryRunContext:
    background = DryRunBackground(name=job.name, attempt=extra.pop("attempt", 1),
                                  **extra.pop("background", {}))
    if sandbox is None:
        return DryRunContext(direction=job.direction, background=background, logger=logger,
                             cancellation=cancellation, **extra)
    return DryRunContext(
        direction=job.direction, background=background, logger=logger,
        cancellation=cancellation, db=sandbox.db, client=sandbox.client,
        session=sandbox.session, deadline=sandbox.epoch_deadline_ms, **extra,
    )


# ------------------------------------------------------------------------------------ preview


def _preview(engine: EngineCore, job: BackgroundJob, method: str, count: int,
             logger: logging.LoggerAdapter[logging.Logger]) -> dict[str, Any]:
    """The sample preview: transform copies, diff, apply locally — no transaction, no write."""
    docs = _read_documents(engine, job, method, count)
    fn, batched = job.functions.transform(job.direction)
    assert fn is not None
    ctx = _context(job, logger, Cancellation())
    if batched:
        results = _transform_batch(fn, docs, ctx) if docs else []
    else:
        results = [_transform_one(fn, doc, ctx) for doc in docs]
    rows = [_row(job, doc, result)[0] for doc, result in zip(docs, results, strict=True)]
    failed = sum(1 for row in rows if "error" in row)
    report: dict[str, Any] = {
        "mode": "declarative", "migration": job.name, "direction": job.direction,
        "method": method, "requested": count, "found": len(docs),
        "migrated": len(rows) - failed, "failed": failed, "documents": rows,
    }
    engine.logger.info("◎ Dry run of %s (%s): %d of %d document(s) would be migrated, "
                       "%d would fail", job.name, job.direction, len(rows) - failed, len(rows),
                       failed)
    return report


# ------------------------------------------------------------------------------------ validated


class _Restart(Exception):
    """Internal: the sandbox's transaction is gone; continue after document ``index``."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class _Validator:
    """Runs the remaining documents of a validated preview through one sandbox."""

    def __init__(self, engine: EngineCore, job: BackgroundJob,
                 logger: logging.LoggerAdapter[logging.Logger], sandbox: Sandbox,
                 attempt: int, last_attempt: bool) -> None:
        self.engine = engine
        self.job = job
        self.logger = logger
        self.sandbox = sandbox
        self.attempt = attempt
        self.last_attempt = last_attempt
        self.collection = _collection(engine, job)
        self.rows: dict[int, dict[str, Any]] = {}
        self.cancellation = Cancellation()

    def run(self, ids: Sequence[Any], queue: Sequence[int]) -> list[int]:
        """Validate ``queue`` (indexes into ``ids``); return what is left for a fresh sandbox."""
        sandbox = self.sandbox
        wanted = [ids[i] for i in queue]
        match = {"$and": [self.job.match(), {"_id": {"$in": wanted}}]}
        try:
            current = sandbox.internal(
                lambda session: list(self.collection.find(match, session=session)))
        except (RunAbortedError, PyMongoError):
            return list(queue)
        by_key = {_key(doc["_id"]): doc for doc in current}
        present: list[tuple[int, dict[str, Any]]] = []
        for i in queue:
            doc = by_key.get(_key(ids[i]))
            if doc is None:  # it changed since the sample was read: nothing to write
                self.rows[i] = {"_id": relaxed(ids[i]), "validation": "skipped"}
            else:
                present.append((i, doc))
        fn, batched = self.job.functions.transform(self.job.direction)
        assert fn is not None
        ctx = _context(self.job, self.logger, self.cancellation, sandbox, attempt=self.attempt)
        try:
            if batched:
                self._batch(fn, ctx, present)
            else:
                for position, (i, doc) in enumerate(present):
                    result = self._timed(partial(_transform_one, fn, doc, ctx))
                    if self._stopped():
                        return [j for j, _ in present[position:]]
                    if sandbox.aborted_by is not None:
                        row, _ = _row(self.job, doc, result)
                        row.pop("after", None)
                        row["error"] = ("the transform's own write aborted the transaction: "
                                        f"{sandbox.aborted_by['error']}")
                        row["validation"] = "failed"
                        self.rows[i] = row
                        raise _Restart(position)
                    self._write(position, i, doc, result)
        except _Restart as restart:
            return [j for j, _ in present[restart.index + 1:]]
        except _Stopped as stopped:
            return [j for j, _ in present[stopped.index:]]
        return []

    def _batch(self, fn: Callable[..., Any], ctx: DryRunContext,
               present: list[tuple[int, dict[str, Any]]]) -> None:
        if not present:
            return
        docs = [doc for _, doc in present]
        results = self._timed(lambda: _transform_batch(fn, docs, ctx))
        if self._stopped():
            raise _Stopped(0)
        if self.sandbox.aborted_by is not None:
            for i, doc in present:
                row: dict[str, Any] = {"_id": relaxed(doc["_id"]), "before": relaxed(doc),
                                       "validation": "failed",
                                       "error": "the transform's own write aborted the "
                                                f"transaction: {self.sandbox.aborted_by['error']}"}
                self.rows[i] = row
            return
        for position, ((i, doc), result) in enumerate(zip(present, results, strict=True)):
            self._write(position, i, doc, result)

    def _timed(self, call: Callable[[], Any]) -> Any:
        try:
            return call_with_timeout(call, self.sandbox.remaining_s)
        except TimedOut:
            self.cancellation.cancel(RunAbortedError("The dry run reached its deadline"))
            self.sandbox.expire()
            return None

    def _stopped(self) -> bool:
        return self.sandbox.deadline_hit

    def _write(self, position: int, i: int, doc: dict[str, Any], result: Any) -> None:
        """The guarded write of one document, then the stored document read back."""
        row, update = _row(self.job, doc, result)
        self.rows[i] = row
        if update is None:
            row["validation"] = "skipped"
            return
        spec = self.job.spec
        guard = guard_filter(doc, str(spec["field"]), spec.get("revisionField"),
                             str(spec.get("occ", "revision")))
        sandbox = self.sandbox

        def write(session: ClientSession) -> Any:
            return self.collection.update_one(guard, update, session=session)

        try:
            written = sandbox.run(self.collection.name, "update_one", guard, write,
                                  lambda r: {"matched": r.matched_count,
                                             "modified": r.modified_count})
        except RunAbortedError:
            del self.rows[i]
            raise _Stopped(position) from None
        except OperationFailure as error:
            if is_transient(error) and not self.last_attempt:
                del self.rows[i]
                raise _Stopped(position) from None  # the caller retries the whole sandbox
            row.pop("after", None)
            row["error"] = describe_error(error)
            row["validation"] = "failed"
            raise _Restart(position) from None
        except PyMongoError as error:  # e.g. a network error: worth a fresh sandbox
            if not self.last_attempt:
                del self.rows[i]
                raise _Stopped(position) from None
            row.pop("after", None)
            row["error"] = describe_error(error)
            row["validation"] = "failed"
            raise _Restart(position) from None
        if written.matched_count == 0:
            row.pop("after", None)
            row["error"] = ("the guarded write matched nothing: the document changed after it "
                            "was read (does the transform write to it?)")
            row["validation"] = "failed"
            return
        try:
            stored = sandbox.internal(
                lambda session: self.collection.find_one({"_id": doc["_id"]}, session=session))
        except RunAbortedError:
            raise _Stopped(position + 1) from None
        row["after"] = relaxed(stored)
        row["validation"] = "ok"


class _Stopped(Exception):
    """Internal: the deadline (or a retryable error) stopped the sandbox at ``index``."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def _key(value: Any) -> bytes:
    return bson.encode({"k": value})


def _merge(sandbox: Sandbox, offset: int, ops: list[dict[str, Any]],
           documents: list[dict[str, Any]]) -> None:
    """Append a sandbox's records with ``seq`` numbers continuing the previous sandboxes'."""
    for entry in sandbox.ops:
        ops.append({**entry, "seq": entry["seq"] + offset})
    for entry in sandbox.documents:
        documents.append({**entry, "seq": entry["seq"] + offset})


def _validated_preview(engine: EngineCore, job: BackgroundJob, method: str, count: int,
                       max_documents: int, deadline: float,
                       logger: logging.LoggerAdapter[logging.Logger]) -> dict[str, Any]:
    """Every document through the guarded write in always-aborted sandboxes."""
    docs = _read_documents(engine, job, method, count)
    ids = [doc["_id"] for doc in docs]
    rows: dict[int, dict[str, Any]] = {}
    queue = list(range(len(docs)))
    ops: list[dict[str, Any]] = []
    side_effects: list[dict[str, Any]] = []
    refusals: list[dict[str, Any]] = []
    attempts = 0
    offset = 0
    truncated = False
    leaked = 0
    stopped_by: str | None = None
    mongos = _is_mongos(engine)
    while queue:
        if time.monotonic() >= deadline:
            stopped_by = "deadline"
            break
        for attempt in range(1, MAX_ATTEMPTS + 1):
            attempts += 1
            sandbox = Sandbox(engine.db, deadline=deadline, reserved=engine.reserved,
                              max_ops=max(0, MAX_OPS - len(ops)),
                              max_documents=max(0, max_documents - len(side_effects)),
                              mongos=mongos)
            validator = _Validator(engine, job, logger, sandbox, attempt,
                                   last_attempt=attempt == MAX_ATTEMPTS)
            with sandbox:
                rest = validator.run(ids, queue)
            if sandbox.transient and not sandbox.deadline_hit and attempt < MAX_ATTEMPTS and \
                    time.monotonic() < deadline:
                continue  # discard this attempt's records and run the same documents again
            break
        _merge(sandbox, offset, ops, side_effects)
        offset += sandbox._seq
        refusals.extend(sandbox.refusals)
        truncated = truncated or sandbox.truncated
        leaked += sandbox.leaked_cursors
        rows.update(validator.rows)
        if sandbox.deadline_hit:
            stopped_by = "deadline"
            break
        if rest == queue:  # no progress (the sandbox could not even read): stop, do not spin
            break
        queue = rest
    documents: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        row = rows.get(i)
        if row is None:
            row = {"_id": relaxed(doc["_id"]), "before": relaxed(doc), "validation": "skipped"}
        documents.append(row)
    migrated = sum(1 for row in documents if row.get("validation") == "ok")
    failed = sum(1 for row in documents if "error" in row)
    report: dict[str, Any] = {
        "mode": "declarative", "migration": job.name, "direction": job.direction,
        "method": method, "requested": count, "found": len(docs), "migrated": migrated,
        "failed": failed, "documents": documents, "validated": True, "aborted": True,
        "ops": ops, "refusals": refusals, "sideEffects": side_effects, "attempts": attempts,
        "truncated": truncated, "leakedCursors": leaked,
    }
    if stopped_by is not None:
        report["stoppedBy"] = stopped_by
    engine.logger.info("◎ Validated dry run of %s (%s): %d of %d document(s) would be migrated, "
                       "%d would fail; %d operation(s), all rolled back", job.name,
                       job.direction, migrated, len(docs), failed, len(ops))
    _log_refusals(engine, job.name, refusals)
    return report


def _log_refusals(engine: EngineCore, name: str, refusals: list[dict[str, Any]]) -> None:
    if refusals:
        methods = sorted({str(r["method"]) for r in refusals})
        engine.logger.warning("⚠ Dry run of %s: the sandbox refused %d operation(s) (%s)", name,
                              len(refusals), ", ".join(methods))


# ------------------------------------------------------------------------------------ steps


def _stored_checkpoint(engine: EngineCore, job: BackgroundJob,
                       from_start: bool) -> tuple[Any, dict[str, Any]]:
    """The checkpoint the next real step would get, and ``ctx.background`` facts."""
    state = engine.store.get(job.name)
    info: dict[str, Any] = {"generation": int((state or {}).get("generation") or 0)}
    if state is None or from_start or str(state.get("direction", "forward")) != job.direction:
        return None, info
    plan = state.get("plan") or {}
    if not plan.get("token"):
        return None, info
    partition = engine.store.partitions.find_one(
        {"background": job.name, "plan": plan["token"]}, sort=[("seq", 1)])
    if partition is None:
        return None, info
    info["partition"] = str(partition["_id"])
    return (partition.get("cursor") or {}).get("checkpoint"), info


def _check_step_result(result: Any) -> str | None:
    """Why a step's result cannot be checkpointed (lanes' messages), or ``None``."""
    if not isinstance(result, Mapping) or not isinstance(result.get("done"), bool):
        return "step must return { checkpoint, done } — done a boolean"
    try:
        size = len(bson.encode({"checkpoint": result.get("checkpoint")}))
    except (TypeError, ValueError, bson.errors.InvalidDocument) as error:
        return f"the checkpoint cannot be stored as BSON: {describe_error(error)}"
    if size > CHECKPOINT_BYTES:
        return (f"the checkpoint is {size} bytes, more than 64 KiB — keep a cursor in it, "
                "not data")
    return None


def _step_dry_run(engine: EngineCore, job: BackgroundJob, steps: int,
                  max_documents: int, from_start: bool, deadline: float, deadline_ms: int,
                  logger: logging.LoggerAdapter[logging.Logger]) -> dict[str, Any]:
    """``steps`` calls of the step in one sandbox, each from the previous checkpoint."""
    fn = job.functions.step_for(job.direction)
    assert fn is not None
    start, background = _stored_checkpoint(engine, job, from_start)
    mongos = _is_mongos(engine)
    attempts = 0
    for attempt in range(1, MAX_ATTEMPTS + 1):
        attempts += 1
        sandbox = Sandbox(engine.db, deadline=deadline, reserved=engine.reserved,
                          max_ops=MAX_OPS, max_documents=max_documents, mongos=mongos)
        entries: list[dict[str, Any]] = []
        stopped_by: str | None = None
        error: str | None = None
        cancellation = Cancellation()
        try:
            with sandbox:
                stopped_by = _run_steps(sandbox, job, fn, start, steps, background, attempt,
                                        cancellation, logger, entries, deadline_ms)
        except PyMongoError as failure:  # the session or transaction could not start
            error = describe_error(failure)
            if is_transient(failure) and attempt < MAX_ATTEMPTS:
                continue
        if sandbox.transient and not sandbox.deadline_hit and attempt < MAX_ATTEMPTS and \
                time.monotonic() < deadline:
            continue
        break
    failed_step = any("error" in entry for entry in entries)
    ok = not sandbox.refusals and not failed_step and sandbox.aborted_by is None and \
        error is None
    report: dict[str, Any] = {
        "mode": "step", "migration": job.name, "direction": job.direction, "aborted": True,
        "ok": ok, "attempts": attempts,
    }
    if stopped_by is not None:
        report["stoppedBy"] = stopped_by
    report["steps"] = entries
    report.update(sandbox.report())
    if error is not None:
        report["error"] = error
    engine.logger.info("◎ Step dry run of %s (%s): %d step(s), %d operation(s), all rolled back%s",
                       job.name, job.direction, len(entries), len(sandbox.ops),
                       "" if ok else " — not ok")
    _log_refusals(engine, job.name, sandbox.refusals)
    return report


def _run_steps(sandbox: Sandbox, job: BackgroundJob, fn: Callable[..., Any], start: Any,
               steps: int, background: Mapping[str, Any], attempt: int,
               cancellation: Cancellation, logger: logging.LoggerAdapter[logging.Logger],
               entries: list[dict[str, Any]], deadline_ms: int) -> str | None:
    """Run the steps; fill ``entries``; return ``stoppedBy`` (``None`` after a failed step)."""
    checkpoint = start
    for number in range(1, steps + 1):
        if sandbox.remaining_s <= 0:
            return "deadline"
        sandbox.step = number
        entry: dict[str, Any] = {"step": number, "checkpointIn": relaxed(checkpoint)}
        entries.append(entry)
        ctx = _context(job, logger, cancellation, sandbox, attempt=attempt,
                       background=background, checkpoint=copy.deepcopy(checkpoint))
        try:
            result = call_with_timeout(partial(call_user, fn, ctx), sandbox.remaining_s)
        except TimedOut:
            cancellation.cancel(RunAbortedError("The dry run reached its deadline"))
            sandbox.expire()
            entry["error"] = f"stopped at the deadline ({deadline_ms} ms)"
            return "deadline"
        except Exception as failure:
            entry["error"] = describe_error(failure)
            return "deadline" if sandbox.deadline_hit else None
        problem = _check_step_result(result)
        if problem is not None:
            entry["error"] = problem
            return None
        checkpoint = result.get("checkpoint")
        entry["checkpointOut"] = relaxed(checkpoint)
        entry["done"] = result["done"]
        for counter in ("processed", "migrated"):
            value = result.get(counter)
            if is_int(value) and value > 0:
                entry[counter] = value
        if sandbox.aborted_by is not None:
            return None  # an operation failed inside the step: the transaction is gone
        if result["done"]:
            return "done"
    return "steps"
