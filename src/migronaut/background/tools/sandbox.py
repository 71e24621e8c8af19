"""The dry-run sandbox: user code against one snapshot transaction that is always aborted.

A :class:`Sandbox` owns one session and one transaction (``readConcern: snapshot``, primary) and
hands user code three proxies — :class:`SandboxDatabase`, :class:`SandboxClient`,
:class:`SandboxSession` — that inject that session into every operation, record what ran, and
refuse everything that is not on the allow-list (reference background §6.7).

Invariants:

* **Nothing persists.** No code path commits: :meth:`Sandbox.close` aborts the transaction and
  ends the session, and the session proxy refuses ``commit_transaction`` like any other method
  that is not on the list. The raw session never reaches user code.
* **Fail closed.** Any attribute not on the allow-list raises :class:`SandboxRefusedError`
  ("The dry run refused <method>: <reason>") and is recorded in :attr:`Sandbox.refusals` before
  the raise, so a refusal counts even when user code catches it. migronaut's own collections,
  ``system.*`` collections (also through ``$lookup``/``$graphLookup``/``$unionWith``/``$facet``
  and nested pipelines), other databases, other sessions, the options ``write_concern``,
  ``read_concern`` and ``bypass_document_validation``, non-primary read preferences and the
  stages of :data:`FORBIDDEN_STAGES` are refused.
* **Serialised and bounded.** Operations run one at a time (one lock); after the deadline, after
  :meth:`Sandbox.close` and after an operation error (the server aborts a transaction on error;
  later operations fail with ``NoSuchTransaction``, code 251) nothing more reaches the server.
* **Recorded, within limits.** Up to ``max_ops`` operations ``{seq, step?, collection, method,
  filter, result, durationMs, error?}`` (filters as relaxed Extended JSON up to 2 KiB, results as
  counts only) and up to ``max_documents`` before/after images of changed documents (64 KiB
  each); ``truncated`` says a limit was hit. These records belong to the dry-run report — the
  only output that may contain documents; nothing here logs or emits them.

It is a guard rail, not a security boundary: user code that builds its own ``MongoClient`` can
still write wherever it likes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Collection as AbstractCollection
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import bson
from bson import json_util
from bson.json_util import RELAXED_JSON_OPTIONS
from pymongo import ReadPreference
from pymongo.database import Database
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.mongo_client import MongoClient
from pymongo.read_concern import ReadConcern

from migronaut._redact import redact
from migronaut.background.lanes.diff import bson_equal
from migronaut.background.planning.spec import DEFAULT_RESERVED_COLLECTIONS
from migronaut.errors import RunAbortedError, SandboxRefusedError, server_message

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection
    from pymongo.command_cursor import CommandCursor
    from pymongo.cursor import Cursor

__all__ = [
    "DEADLINE_MS",
    "FILTER_BYTES",
    "FORBIDDEN_STAGES",
    "IMAGE_BYTES",
    "MAX_ATTEMPTS",
    "MAX_DOCUMENTS",
    "MAX_OPS",
    "Sandbox",
    "SandboxClient",
    "SandboxCollection",
    "SandboxCursor",
    "SandboxDatabase",
    "SandboxSession",
    "describe_error",
    "is_transient",
    "relaxed",
]

T = TypeVar("T")

#: Defaults and ceilings of reference background Appendix A ("Sandbox defaults").
DEADLINE_MS: Final = 50_000
MAX_DOCUMENTS: Final = 20
MAX_OPS: Final = 1000
FILTER_BYTES: Final = 2 * 1024
IMAGE_BYTES: Final = 64 * 1024
MAX_ATTEMPTS: Final = 3

#: Aggregation stages a dry run never runs (they write, watch, or read server internals).
FORBIDDEN_STAGES: Final = frozenset({
    "$out", "$merge", "$changeStream", "$changeStreamSplitLargeEvent", "$currentOp",
    "$collStats", "$indexStats", "$listSessions", "$listLocalSessions", "$planCacheStats",
    "$listSearchIndexes", "$querySettings",
})
#: Error codes of a transaction that is worth running again (WriteConflict, NoSuchTransaction,
#: LockTimeout); the ``TransientTransactionError`` label counts too.
TRANSIENT_CODES: Final = frozenset({112, 251, 24})

_NO_SUCH_TRANSACTION: Final = 251
_DATABASE_ATTRIBUTES: Final = frozenset(dir(Database))
_CLIENT_ATTRIBUTES: Final = frozenset(dir(MongoClient))


# ------------------------------------------------------------------------------------ helpers


def relaxed(value: Any) -> Any:
    """``value`` as relaxed Extended JSON, parsed back into plain JSON-ready Python values."""
    return json.loads(json_util.dumps(value, json_options=RELAXED_JSON_OPTIONS))


def _bounded(value: Any, limit: int) -> Any:
    """Relaxed EJSON of ``value`` when its text is at most ``limit`` bytes, else a marker."""
    try:
        text = json_util.dumps(value, json_options=RELAXED_JSON_OPTIONS)
    except (TypeError, ValueError, bson.errors.InvalidDocument):
        return {"$truncated": True, "size": None}
    size = len(text.encode("utf-8"))
    if size > limit:
        return {"$truncated": True, "size": size}
    return json.loads(text)


def _image(doc: Mapping[str, Any] | None) -> Any:
    """A document image for the report (``None`` stays ``None``; > 64 KiB BSON → a marker)."""
    if doc is None:
        return None
    try:
        size = len(bson.encode(doc))
    except (TypeError, ValueError, bson.errors.InvalidDocument):
        return {"$truncated": True, "size": None}
    if size > IMAGE_BYTES:
        return {"$truncated": True, "size": size}
    return relaxed(doc)


def is_transient(error: BaseException) -> bool:
    """Whether a server error says "run the transaction again"."""
    if not isinstance(error, PyMongoError):
        return False
    if error.has_error_label("TransientTransactionError"):
        return True
    return getattr(error, "code", None) in TRANSIENT_CODES


def describe_error(error: BaseException) -> str:
    """One line for a report: type and message, duplicate-key values masked.

    For server errors only the server's ``errmsg`` is kept — pymongo's ``full error`` part
    repeats the offending key values.
    """
    text = server_message(error) if isinstance(error, OperationFailure) else str(error).strip()
    first = text.splitlines()[0] if text else ""
    name = type(error).__name__
    line = f"{name}: {first}" if first and first != name else name
    return redact(line)[:1000]


def _key(value: Any) -> bytes:
    """A hashable identity for an ``_id`` of any BSON type."""
    return bson.encode({"k": value})


# ------------------------------------------------------------------------------------ sandbox


class Sandbox:
    """One session and one always-aborted transaction, with proxies, records and limits.

    Use as a context manager (``with Sandbox(...) as sandbox:``); the transaction starts on entry
    and is aborted on exit whatever happened. ``deadline`` is a ``time.monotonic()`` instant.
    """

    def __init__(
        self,
        db: Database[dict[str, Any]],
        *,
        deadline: float,
        reserved: AbstractCollection[str] = (),
        max_ops: int = MAX_OPS,
        max_documents: int = MAX_DOCUMENTS,
        mongos: bool = False,
    ) -> None:
        self._db = db
        self._client: MongoClient[dict[str, Any]] = db.client
        self.db_name = db.name
        self.deadline = deadline
        self.reserved = frozenset(reserved) | frozenset(DEFAULT_RESERVED_COLLECTIONS)
        self.max_ops = max_ops
        self.max_documents = max_documents
        self.mongos = mongos
        self.ops: list[dict[str, Any]] = []
        self.documents: list[dict[str, Any]] = []
        self.refusals: list[dict[str, Any]] = []
        self.truncated = False
        self.aborted_by: dict[str, Any] | None = None
        self.transient = False
        self.deadline_hit = False
        self.leaked_cursors = 0
        self.step: int | None = None
        self._seq = 0
        self._lock = threading.RLock()
        self._closed = False
        self._session: ClientSession | None = None
        self._cursors: list[SandboxCursor] = []
        self._sharded: dict[str, bool] = {}
        self.last_record: dict[str, Any] | None = None
        self.db = SandboxDatabase(self)
        self.client = SandboxClient(self)
        self.session = SandboxSession(self)

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Sandbox:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        session = self._client.start_session(causal_consistency=False)
        try:
            session.start_transaction(
                read_concern=ReadConcern("snapshot"), read_preference=ReadPreference.PRIMARY
            )
        except BaseException:
            session.end_session()
            raise
        self._session = session

    def close(self) -> None:
        """Abort the transaction (never commit), close leaked cursors, end the session."""
        acquired = self._lock.acquire(timeout=30)  # an operation in flight finishes first
        try:
            if self._closed:
                return
            self._closed = True
            for cursor in self._cursors:
                if cursor._started and not cursor._closed and cursor._raw.alive:
                    self.leaked_cursors += 1
                cursor._close_raw()
            session = self._session
            self._session = None
            if session is not None:
                try:
                    if session.in_transaction:
                        session.abort_transaction()
                except PyMongoError:
                    pass  # the server drops an unfinished transaction on its own
                finally:
                    try:
                        session.end_session()
                    except PyMongoError:
                        pass
        finally:
            if acquired:
                self._lock.release()

    def expire(self) -> None:
        """The deadline passed while user code was running: stop every later operation."""
        self.deadline_hit = True
        self.close()

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    @property
    def epoch_deadline_ms(self) -> int:
        """The deadline as epoch milliseconds (``ctx.deadline`` of a step)."""
        return int(time.time() * 1000 + self.remaining_s * 1000)

    @property
    def raw_session(self) -> ClientSession:
        if self._session is None:
            raise RunAbortedError("The dry run is over: its transaction was rolled back")
        return self._session

    # -- refusals -------------------------------------------------------------------------
    def refuse(self, method: str, reason: str, collection: str | None = None) -> NoReturn:
        """Record a refusal, then raise it (recorded even when the caller catches it)."""
        with self._lock:
            entry: dict[str, Any] = {"method": method, "reason": reason}
            if collection is not None:
                entry["collection"] = collection
            if self.step is not None:
                entry["step"] = self.step
            if len(self.refusals) < MAX_OPS:  # always kept: a refusal decides the outcome
                self.refusals.append(entry)
            else:
                self.truncated = True
        raise SandboxRefusedError(
            f"The dry run refused {method}: {reason}",
            {"method": method, "reason": reason, **({"collection": collection}
                                                   if collection is not None else {})},
        )

    def check_collection(self, method: str, name: Any) -> str:
        if not isinstance(name, str) or not name:
            self.refuse(method, "a collection name must be a non-empty string")
        if name in self.reserved:
            self.refuse(method, f"{name} is one of migronaut's own collections", name)
        if name.startswith("system."):
            self.refuse(method, f"{name} is a system collection", name)
        return name

    def check_database(self, method: str, name: Any) -> None:
        if name is not None and name != self.db_name:
            self.refuse(method, "another database — a dry run stays in the migration's database")

    def check_read_preference(self, method: str, read_preference: Any) -> None:
        if read_preference is not None and getattr(read_preference, "mode", 0) != 0:
            self.refuse(method, "a non-primary read preference (a transaction reads the "
                                "primary)")

    def check_options(self, method: str, kwargs: dict[str, Any], collection: str) -> None:
        """Refuse user options that would escape the transaction; drop our own session."""
        session = kwargs.pop("session", None)
        if session is not None and session is not self.session and session is not self._session:
            self.refuse(method, "another session — every operation runs in the dry run's own",
                        collection)
        if kwargs.get("write_concern") is not None:
            self.refuse(method, "the write_concern option (the transaction has its own)",
                        collection)
        if kwargs.get("read_concern") is not None:
            self.refuse(method, "the read_concern option (the transaction reads a snapshot)",
                        collection)
        if kwargs.get("bypass_document_validation"):
            self.refuse(method, "bypass_document_validation (the real run validates "
                                "documents)", collection)

    def check_pipeline(self, method: str, pipeline: Any, collection: str, depth: int = 0) -> None:
        """Refuse forbidden stages and reads of refused namespaces, at any nesting depth."""
        if depth > 32 or not isinstance(pipeline, (list, tuple)):
            return
        for stage in pipeline:
            if not isinstance(stage, Mapping):
                continue
            for name, body in stage.items():
                if name in FORBIDDEN_STAGES:
                    self.refuse(method, f"the {name} stage", collection)
                if name in ("$lookup", "$graphLookup") and isinstance(body, Mapping):
                    self._check_namespace(method, body.get("from"), collection)
                    self.check_pipeline(method, body.get("pipeline"), collection, depth + 1)
                elif name == "$unionWith":
                    if isinstance(body, Mapping):
                        self._check_namespace(method, body.get("coll"), collection)
                        self.check_pipeline(method, body.get("pipeline"), collection, depth + 1)
                    else:
                        self._check_namespace(method, body, collection)
                elif name == "$facet" and isinstance(body, Mapping):
                    for sub in body.values():
                        self.check_pipeline(method, sub, collection, depth + 1)

    def _check_namespace(self, method: str, target: Any, collection: str) -> None:
        if isinstance(target, Mapping):  # {db, coll}
            self.check_database(method, target.get("db"))
            target = target.get("coll")
        if target is None:
            return
        if not isinstance(target, str) or target in self.reserved or target.startswith("system."):
            shown = target if isinstance(target, str) else "a non-string namespace"
            self.refuse(method, f"a pipeline reads {shown}, which a dry run may not touch",
                        collection)

    def check_distinct(self, collection: str) -> None:
        """``distinct`` is not allowed in a transaction on a sharded collection (code 263)."""
        if not self.mongos:
            return
        if collection not in self._sharded:
            try:
                found = self._client["config"]["collections"].find_one(
                    {"_id": f"{self.db_name}.{collection}", "dropped": {"$ne": True}},
                    {"_id": 1},
                )
            except PyMongoError:
                found = None
            self._sharded[collection] = found is not None
        if self._sharded[collection]:
            self.refuse("distinct", "distinct on a sharded collection (not allowed in a "
                                    "transaction)", collection)

    # -- running operations ---------------------------------------------------------------
    def admit(self) -> None:
        """Called under the lock before an operation reaches the server."""
        if self._closed or self._session is None:
            raise RunAbortedError("The dry run is over: its transaction was rolled back")
        if time.monotonic() >= self.deadline:
            self.deadline_hit = True
            raise RunAbortedError("The dry run reached its deadline")
        if self.aborted_by is not None:
            raise OperationFailure(
                "The dry run's transaction was aborted by an earlier failed operation "
                f"({self.aborted_by['method']} on {self.aborted_by['collection']}); "
                "later operations fail",
                code=_NO_SUCH_TRANSACTION,
            )

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def record_op(
        self,
        seq: int,
        collection: str,
        method: str,
        filter_value: Any,
        result: Mapping[str, Any] | None,
        duration_ms: float,
        error: BaseException | None = None,
    ) -> dict[str, Any] | None:
        self.last_record = None
        if len(self.ops) >= self.max_ops:
            self.truncated = True
            return None
        entry: dict[str, Any] = {"seq": seq}
        if self.step is not None:
            entry["step"] = self.step
        entry.update({
            "collection": collection,
            "method": method,
            "filter": _bounded(filter_value, FILTER_BYTES),
            "result": dict(result or {}),
            "durationMs": round(duration_ms, 3),
        })
        if error is not None:
            entry["error"] = describe_error(error)
        self.ops.append(entry)
        self.last_record = entry
        return entry

    def failed(self, seq: int, collection: str, method: str, error: BaseException) -> None:
        """An operation failed on the server: the transaction is gone (as on a real server)."""
        if is_transient(error):
            self.transient = True
        if self.aborted_by is None:
            self.aborted_by = {"seq": seq, "collection": collection, "method": method,
                               "error": describe_error(error)}

    def run(
        self,
        collection: str,
        method: str,
        filter_value: Any,
        call: Callable[[ClientSession], T],
        counts: Callable[[T], Mapping[str, Any]],
        images: _Images | None = None,
    ) -> T:
        """Run one operation in the transaction: admit, image, time, record."""
        with self._lock:
            self.admit()
            session = self.raw_session
            seq = self._next_seq()
            if images is not None:
                images.before(self, session)
            started = time.perf_counter()
            try:
                result = call(session)
            except PyMongoError as error:
                self.record_op(seq, collection, method, filter_value, None,
                               (time.perf_counter() - started) * 1000, error)
                self.failed(seq, collection, method, error)
                raise
            duration = (time.perf_counter() - started) * 1000
            self.record_op(seq, collection, method, filter_value, counts(result), duration)
            if images is not None:
                try:
                    images.after(self, session, seq, result)
                except PyMongoError as error:  # an image read failing is not the user's error
                    self.failed(seq, collection, "(image read)", error)
            return result

    def internal(self, call: Callable[[ClientSession], T]) -> T:
        """An engine read in the transaction (admitted, serialised, not recorded)."""
        with self._lock:
            self.admit()
            try:
                return call(self.raw_session)
            except PyMongoError as error:
                self.failed(self._seq, "(engine)", "(read)", error)
                raise

    def add_document(self, seq: int, collection: str, op: str, doc_id: Any,
                     before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        if len(self.documents) >= self.max_documents:
            self.truncated = True
            return
        entry: dict[str, Any] = {"seq": seq}
        if self.step is not None:
            entry["step"] = self.step
        entry.update({"collection": collection, "op": op})
        if op != "unknown":
            entry["_id"] = relaxed(doc_id)
        if before is not None:
            entry["before"] = _image(before)
        if after is not None:
            entry["after"] = _image(after)
        self.documents.append(entry)

    @property
    def room(self) -> int:
        """How many more document images may be recorded."""
        return max(0, self.max_documents - len(self.documents))

    def register_cursor(self, cursor: SandboxCursor) -> None:
        self._cursors.append(cursor)

    def collection(self, name: str) -> Collection[dict[str, Any]]:
        return self._db[name]

    def report(self) -> dict[str, Any]:
        """What the report shows of this sandbox (JSON-ready)."""
        out: dict[str, Any] = {
            "ops": list(self.ops),
            "documents": list(self.documents),
            "refusals": list(self.refusals),
            "leakedCursors": self.leaked_cursors,
            "truncated": self.truncated,
        }
        if self.aborted_by is not None:
            out["abortedBy"] = dict(self.aborted_by)
        return out


# ------------------------------------------------------------------------------------ images


class _Images:
    """Before/after images of the documents one write changes (best effort, within limits).

    ``kind``: ``insert`` (read back what was inserted), ``update`` / ``delete`` (read what the
    filter matches first, then read the same ``_id``s back), ``unknown`` (``bulk_write``: only
    an entry saying something changed).
    """

    def __init__(self, collection: str, kind: str, filter_value: Any = None, *,
                 many: bool = False, sort: Any = None, collation: Any = None,
                 inserted: Sequence[Any] = ()) -> None:
        self.collection = collection
        self.kind = kind
        self.filter = filter_value
        self.many = many
        self.sort = sort
        self.collation = collation
        self.inserted = list(inserted)
        self.previous: list[dict[str, Any]] = []
        self.overflow = False

    def before(self, sandbox: Sandbox, session: ClientSession) -> None:
        if self.kind not in ("update", "delete") or sandbox.room == 0:
            return
        limit = sandbox.room + 1 if self.many else 1
        kwargs: dict[str, Any] = {"session": session, "limit": limit}
        if self.sort is not None:
            kwargs["sort"] = self.sort
        if self.collation is not None:
            kwargs["collation"] = self.collation
        try:
            found = list(sandbox.collection(self.collection).find(self.filter or {}, **kwargs))
        except PyMongoError:
            found = []  # the write itself will report a bad filter
        if len(found) > sandbox.room:
            self.overflow = True
            found = found[: sandbox.room]
        self.previous = found

    def after(self, sandbox: Sandbox, session: ClientSession, seq: int, result: Any) -> None:
        coll = sandbox.collection(self.collection)
        changed = _changed(result)
        if self.kind == "unknown":
            if changed:
                sandbox.add_document(seq, self.collection, "unknown", None, None, None)
            return
        if self.kind == "insert":
            for doc_id in self.inserted:
                if sandbox.room == 0:
                    sandbox.truncated = True
                    return
                stored = coll.find_one({"_id": doc_id}, session=session)
                sandbox.add_document(seq, self.collection, "insert", doc_id, None, stored)
            return
        if not changed:
            return
        if changed and sandbox.room == 0 and not self.previous:
            sandbox.truncated = True
        upserted = _upserted_id(result)
        for before in self.previous:
            if self.kind == "delete":
                still = coll.find_one({"_id": before["_id"]}, session=session)
                if still is None:
                    sandbox.add_document(seq, self.collection, "delete", before["_id"], before,
                                         None)
                continue
            after = coll.find_one({"_id": before["_id"]}, session=session)
            if after is not None and not bson_equal(after, before):
                sandbox.add_document(seq, self.collection, "update", before["_id"], before, after)
        if upserted is not None:
            if sandbox.room == 0:
                sandbox.truncated = True
            else:
                stored = coll.find_one({"_id": upserted}, session=session)
                sandbox.add_document(seq, self.collection, "insert", upserted, None, stored)
        if self.overflow:
            sandbox.truncated = True


def _changed(result: Any) -> bool:
    """Whether a write result says something changed (unknown shapes: assume it did)."""
    if result is None:
        return False
    if isinstance(result, Mapping):  # find_one_and_* returned a document
        return True
    for attribute in ("modified_count", "deleted_count", "inserted_count", "upserted_count"):
        value = getattr(result, attribute, None)
        if value:
            return True
    if getattr(result, "upserted_id", None) is not None:
        return True
    return bool(getattr(result, "inserted_ids", None) or getattr(result, "inserted_id", None))


def _upserted_id(result: Any) -> Any:
    return getattr(result, "upserted_id", None)


def _update_counts(result: Any) -> dict[str, Any]:
    return {"matched": result.matched_count, "modified": result.modified_count,
            "upserted": 1 if result.upserted_id is not None else 0}


def _returned(value: Any) -> dict[str, Any]:
    return {"returned": 0 if value is None else 1}


# ------------------------------------------------------------------------------------ proxies


class _Proxy:
    """Base of the proxies: unknown attributes are refused, dunders stay plain errors."""

    __slots__ = ("_sandbox",)
    _kind = "handle"
    _sandbox: Sandbox

    def __init__(self, sandbox: Sandbox) -> None:
        object.__setattr__(self, "_sandbox", sandbox)

    def __setattr__(self, name: str, value: Any) -> None:
        self._sandbox.refuse(f"setting {name}", f"the {self._kind} handle is read-only")

    def _refuse_attribute(self, name: str) -> NoReturn:
        self._sandbox.refuse(name, f"not on the dry run's allow-list for a {self._kind}",
                             self._collection_name())

    def _collection_name(self) -> str | None:
        return None


class SandboxSession(_Proxy):
    """The transaction's session as user code sees it: identity only."""

    __slots__ = ()
    _kind = "session"

    @property
    def in_transaction(self) -> bool:
        return True

    @property
    def session_id(self) -> Mapping[str, Any]:
        session_id: Mapping[str, Any] = self._sandbox.raw_session.session_id
        return session_id

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse_attribute(name)

    def __repr__(self) -> str:
        return "<SandboxSession (dry run; always aborted)>"


class SandboxClient(_Proxy):
    """The client: only the migration's own database."""

    __slots__ = ()
    _kind = "client"

    def get_database(
        self,
        name: str | None = None,
        codec_options: Any = None,
        read_preference: Any = None,
        write_concern: Any = None,
        read_concern: Any = None,
    ) -> SandboxDatabase:
        sandbox = self._sandbox
        sandbox.check_database("get_database", name)
        _check_handle_options(sandbox, "get_database", read_preference, write_concern,
                              read_concern)
        return sandbox.db if codec_options is None else SandboxDatabase(sandbox, codec_options)

    def __getitem__(self, name: str) -> SandboxDatabase:
        self._sandbox.check_database("get_database", name)
        return self._sandbox.db

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _CLIENT_ATTRIBUTES:
            self._refuse_attribute(name)
        return self[name]

    def __repr__(self) -> str:
        return f"<SandboxClient {self._sandbox.db_name} (dry run)>"


def _command_cursor(
    sandbox: Sandbox, collection: str, pipeline: Any,
    call: Callable[[ClientSession], CommandCursor[dict[str, Any]]],
) -> SandboxCursor:
    """Run an ``aggregate`` (it executes at once) and wrap its cursor; fetches add to its op."""
    with sandbox._lock:
        raw = sandbox.run(collection, "aggregate", pipeline, call, lambda _: {"returned": 0})
        record = sandbox.last_record
    return SandboxCursor(sandbox, raw, collection, "aggregate", started=True, record=record)


def _check_handle_options(sandbox: Sandbox, method: str, read_preference: Any,
                          write_concern: Any, read_concern: Any) -> None:
    sandbox.check_read_preference(method, read_preference)
    if write_concern is not None:
        sandbox.refuse(method, "the write_concern option (the transaction has its own)")
    if read_concern is not None:
        sandbox.refuse(method, "the read_concern option (the transaction reads a snapshot)")


class SandboxDatabase(_Proxy):
    """The migration's database: collections and database-level aggregation."""

    __slots__ = ("_codec_options",)
    _kind = "database"
    _codec_options: Any

    def __init__(self, sandbox: Sandbox, codec_options: Any = None) -> None:
        super().__init__(sandbox)
        object.__setattr__(self, "_codec_options", codec_options)

    @property
    def name(self) -> str:
        return self._sandbox.db_name

    def get_collection(
        self,
        name: str,
        codec_options: Any = None,
        read_preference: Any = None,
        write_concern: Any = None,
        read_concern: Any = None,
    ) -> SandboxCollection:
        sandbox = self._sandbox
        sandbox.check_collection("get_collection", name)
        _check_handle_options(sandbox, "get_collection", read_preference, write_concern,
                              read_concern)
        return SandboxCollection(sandbox, name, codec_options or self._codec_options)

    def __getitem__(self, name: str) -> SandboxCollection:
        self._sandbox.check_collection("get_collection", name)
        return SandboxCollection(self._sandbox, name, self._codec_options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _DATABASE_ATTRIBUTES:
            self._refuse_attribute(name)
        return self[name]

    def aggregate(self, pipeline: Sequence[Mapping[str, Any]], *args: Any,
                  **kwargs: Any) -> SandboxCursor:
        sandbox = self._sandbox
        sandbox.check_options("aggregate", kwargs, "(database)")
        sandbox.check_pipeline("aggregate", pipeline, "(database)")
        database: Any = sandbox._db if self._codec_options is None else \
            sandbox._db.with_options(codec_options=self._codec_options)
        return _command_cursor(
            sandbox, "(database)", pipeline,
            lambda session: database.aggregate(list(pipeline), *args, session=session,
                                               **kwargs),
        )

    def __repr__(self) -> str:
        return f"<SandboxDatabase {self._sandbox.db_name} (dry run)>"


class SandboxCollection(_Proxy):
    """A collection of the migration's database; every operation joins the transaction."""

    __slots__ = ("_codec_options", "_name")
    _kind = "collection"
    _codec_options: Any
    _name: str

    def __init__(self, sandbox: Sandbox, name: str, codec_options: Any = None) -> None:
        super().__init__(sandbox)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_codec_options", codec_options)

    def _collection_name(self) -> str | None:
        return self._name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse_attribute(name)

    def __getitem__(self, name: str) -> NoReturn:
        self._sandbox.refuse("collection[...]", "sub-collections are not on the dry run's "
                                                "allow-list", self._name)

    def __repr__(self) -> str:
        return f"<SandboxCollection {self._sandbox.db_name}.{self._name} (dry run)>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def full_name(self) -> str:
        return f"{self._sandbox.db_name}.{self._name}"

    @property
    def database(self) -> SandboxDatabase:
        return self._sandbox.db

    # -- internals ------------------------------------------------------------------------
    def _raw(self) -> Any:
        raw: Any = self._sandbox.collection(self._name)
        if self._codec_options is not None:
            raw = raw.with_options(codec_options=self._codec_options)
        return raw

    def _prepare(self, method: str, kwargs: dict[str, Any]) -> Sandbox:
        sandbox = self._sandbox
        sandbox.check_options(method, kwargs, self._name)
        return sandbox

    # -- reads ----------------------------------------------------------------------------
    def find(self, *args: Any, **kwargs: Any) -> SandboxCursor:
        sandbox = self._prepare("find", kwargs)
        raw = self._raw().find(*args, session=sandbox.raw_session, **kwargs)
        filter_value = args[0] if args else kwargs.get("filter")
        return SandboxCursor(sandbox, raw, self._name, "find", filter_value=filter_value)

    def find_one(self, filter: Any = None, *args: Any, **kwargs: Any) -> Any:
        sandbox = self._prepare("find_one", kwargs)
        raw = self._raw()
        return sandbox.run(
            self._name, "find_one", filter,
            lambda session: raw.find_one(filter, *args, session=session, **kwargs), _returned,
        )

    def aggregate(self, pipeline: Sequence[Mapping[str, Any]], *args: Any,
                  **kwargs: Any) -> SandboxCursor:
        sandbox = self._prepare("aggregate", kwargs)
        sandbox.check_pipeline("aggregate", pipeline, self._name)
        raw = self._raw()
        return _command_cursor(
            sandbox, self._name, pipeline,
            lambda session: raw.aggregate(list(pipeline), *args, session=session, **kwargs),
        )

    def count_documents(self, filter: Any, *args: Any, **kwargs: Any) -> int:
        sandbox = self._prepare("count_documents", kwargs)
        raw = self._raw()
        count: int = sandbox.run(
            self._name, "count_documents", filter,
            lambda session: raw.count_documents(filter, *args, session=session, **kwargs),
            lambda n: {"count": n},
        )
        return count

    def distinct(self, key: str, filter: Any = None, *args: Any, **kwargs: Any) -> list[Any]:
        sandbox = self._prepare("distinct", kwargs)
        sandbox.check_distinct(self._name)
        raw = self._raw()
        values: list[Any] = sandbox.run(
            self._name, "distinct", filter,
            lambda session: raw.distinct(key, filter, *args, session=session, **kwargs),
            lambda v: {"returned": len(v)},
        )
        return values

    # -- writes ---------------------------------------------------------------------------
    def insert_one(self, document: Any, *args: Any, **kwargs: Any) -> Any:
        sandbox = self._prepare("insert_one", kwargs)
        raw = self._raw()
        images = _Images(self._name, "insert")

        def call(session: ClientSession) -> Any:
            result = raw.insert_one(document, *args, session=session, **kwargs)
            images.inserted = [result.inserted_id]
            return result

        return sandbox.run(self._name, "insert_one", None, call, lambda r: {"inserted": 1},
                           images)

    def insert_many(self, documents: Any, *args: Any, **kwargs: Any) -> Any:
        sandbox = self._prepare("insert_many", kwargs)
        raw = self._raw()
        docs = list(documents)
        images = _Images(self._name, "insert")

        def call(session: ClientSession) -> Any:
            result = raw.insert_many(docs, *args, session=session, **kwargs)
            images.inserted = list(result.inserted_ids)
            return result

        return sandbox.run(self._name, "insert_many", None, call,
                           lambda r: {"inserted": len(r.inserted_ids)}, images)

    def _update(self, method: str, filter: Any, update: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any], *, many: bool) -> Any:
        sandbox = self._prepare(method, kwargs)
        if isinstance(update, (list, tuple)):
            sandbox.check_pipeline(method, update, self._name)
        raw = self._raw()
        images = _Images(self._name, "update", filter, many=many, sort=kwargs.get("sort"),
                         collation=kwargs.get("collation"))
        call = getattr(raw, method)
        return sandbox.run(
            self._name, method, filter,
            lambda session: call(filter, update, *args, session=session, **kwargs),
            _update_counts, images,
        )

    def update_one(self, filter: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
        return self._update("update_one", filter, update, args, kwargs, many=False)

    def update_many(self, filter: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
        return self._update("update_many", filter, update, args, kwargs, many=True)

    def replace_one(self, filter: Any, replacement: Any, *args: Any, **kwargs: Any) -> Any:
        return self._update("replace_one", filter, replacement, args, kwargs, many=False)

    def _delete(self, method: str, filter: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                *, many: bool) -> Any:
        sandbox = self._prepare(method, kwargs)
        raw = self._raw()
        images = _Images(self._name, "delete", filter, many=many,
                         collation=kwargs.get("collation"))
        call = getattr(raw, method)
        return sandbox.run(
            self._name, method, filter,
            lambda session: call(filter, *args, session=session, **kwargs),
            lambda r: {"deleted": r.deleted_count}, images,
        )

    def delete_one(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        return self._delete("delete_one", filter, args, kwargs, many=False)

    def delete_many(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        return self._delete("delete_many", filter, args, kwargs, many=True)

    def _find_and_modify(self, method: str, kind: str, filter: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any], update: Any = None) -> Any:
        sandbox = self._prepare(method, kwargs)
        if isinstance(update, (list, tuple)):
            sandbox.check_pipeline(method, update, self._name)
        raw = self._raw()
        images = _Images(self._name, kind, filter, sort=kwargs.get("sort"),
                         collation=kwargs.get("collation"))
        call = getattr(raw, method)
        extra = () if update is None else (update,)
        return sandbox.run(
            self._name, method, filter,
            lambda session: call(filter, *extra, *args, session=session, **kwargs),
            _returned, images,
        )

    def find_one_and_update(self, filter: Any, update: Any, *args: Any, **kwargs: Any) -> Any:
        return self._find_and_modify("find_one_and_update", "update", filter, args, kwargs,
                                     update)

    def find_one_and_replace(self, filter: Any, replacement: Any, *args: Any,
                             **kwargs: Any) -> Any:
        return self._find_and_modify("find_one_and_replace", "update", filter, args, kwargs,
                                     replacement)

    def find_one_and_delete(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        return self._find_and_modify("find_one_and_delete", "delete", filter, args, kwargs)

    def bulk_write(self, requests: Any, *args: Any, **kwargs: Any) -> Any:
        sandbox = self._prepare("bulk_write", kwargs)
        raw = self._raw()
        ops = list(requests)
        shown = [type(op).__name__ for op in ops[:50]]

        def counts(result: Any) -> dict[str, Any]:
            return {"inserted": result.inserted_count, "matched": result.matched_count,
                    "modified": result.modified_count, "deleted": result.deleted_count,
                    "upserted": result.upserted_count}

        return sandbox.run(
            self._name, "bulk_write", {"requests": shown, "count": len(ops)},
            lambda session: raw.bulk_write(ops, *args, session=session, **kwargs),
            counts, _Images(self._name, "unknown"),
        )


class SandboxCursor(_Proxy):
    """A ``find`` or ``aggregate`` cursor: builders before the first fetch, then terminals."""

    __slots__ = (
        "_closed",
        "_collection",
        "_command",
        "_filter",
        "_method",
        "_raw",
        "_record",
        "_started",
    )
    _kind = "cursor"
    _raw: Any
    _collection: str
    _method: str
    _filter: Any
    _started: bool
    _closed: bool
    _record: dict[str, Any] | None
    _command: bool

    _BUILDERS: Final = frozenset({
        "sort", "limit", "skip", "hint", "batch_size", "max_time_ms", "collation", "comment",
        "min", "max", "allow_disk_use",
    })

    def __init__(self, sandbox: Sandbox, raw: Cursor[Any] | CommandCursor[Any],
                 collection: str, method: str, *, filter_value: Any = None,
                 started: bool = False, record: dict[str, Any] | None = None) -> None:
        super().__init__(sandbox)
        for name, value in (("_raw", raw), ("_collection", collection), ("_method", method),
                            ("_filter", filter_value), ("_started", started), ("_closed", False),
                            ("_record", record), ("_command", started)):
            object.__setattr__(self, name, value)
        sandbox.register_cursor(self)

    def _collection_name(self) -> str | None:
        return self._collection

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if (name == "batch_size") if self._command else (name in self._BUILDERS):
            if self._closed:
                self._sandbox.refuse(name, "the cursor is closed", self._collection)
            builder = getattr(self._raw, name)

            def build(*args: Any, **kwargs: Any) -> SandboxCursor:
                builder(*args, **kwargs)
                return self

            return build
        self._refuse_attribute(name)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        sandbox = self._sandbox
        if self._closed:
            sandbox.refuse("next", "the cursor is closed", self._collection)
        with sandbox._lock:
            sandbox.admit()
            first = not self._started
            if first:
                object.__setattr__(self, "_started", True)
            started = time.perf_counter()
            try:
                doc = next(self._raw)
            except StopIteration:
                self._account(first, started, 0)
                raise
            except PyMongoError as error:
                seq = self._account(first, started, 0, error)
                sandbox.failed(seq, self._collection, self._method, error)
                raise
            self._account(first, started, 1)
            return doc

    def _account(self, first: bool, started: float, returned: int,
                 error: BaseException | None = None) -> int:
        sandbox = self._sandbox
        elapsed = (time.perf_counter() - started) * 1000
        if first and self._record is None:
            seq = sandbox._next_seq()
            record = sandbox.record_op(seq, self._collection, self._method, self._filter,
                                       {"returned": returned}, elapsed, error)
            object.__setattr__(self, "_record", record)
            return seq
        record = self._record
        if record is not None:
            record["result"]["returned"] = record["result"].get("returned", 0) + returned
            record["durationMs"] = round(record["durationMs"] + elapsed, 3)
            if error is not None:
                record["error"] = describe_error(error)
            return int(record["seq"])
        return sandbox._seq

    def next(self) -> Any:
        return self.__next__()

    def try_next(self) -> Any:
        try:
            return self.__next__()
        except StopIteration:
            return None

    def to_list(self, length: int | None = None) -> list[Any]:
        out: list[Any] = []
        for doc in self:
            out.append(doc)
            if length is not None and len(out) >= length:
                break
        return out

    @property
    def alive(self) -> bool:
        return not self._closed and bool(self._raw.alive)

    def close(self) -> None:
        object.__setattr__(self, "_closed", True)
        self._close_raw()

    def _close_raw(self) -> None:
        try:
            self._raw.close()
        except PyMongoError:
            pass

    def __enter__(self) -> SandboxCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SandboxCursor {self._method} on {self._collection} (dry run)>"
