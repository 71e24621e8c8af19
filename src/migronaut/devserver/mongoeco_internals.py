"""Every reach of the dev server into mongoeco's private surface, in one module.

mongoeco's public API serves the wire protocol (``mongoeco.wire``), stores data
(``mongoeco.engines``) and raises ``mongoeco.errors``; the layer in front of it
(:mod:`migronaut.devserver.wire`) needs more than that:

* :class:`CommandHooks` — the server's command executor (``server._executor``): its two steps
  ``_build_request_context`` and ``execute_prepared``, which the layer replaces and calls; its
  command list (``_surface.supports_command``); its engine (``_client._engine``); and mongoeco's
  request context (``WireRequestContext``: its fields read, a served command swapped in with
  ``dataclasses.replace``);
* :func:`set_collection_options` — a collection's stored options, which mongoeco has no command
  to change (the memory engine's option store and lock, the SQLite engine's connection, lock
  and worker, ``mongoeco.core.json_compat``);
* :func:`apply_pipeline` — mongoeco's aggregation pipeline over documents in memory
  (``mongoeco.core.aggregation.stages``);
* :func:`route_requests` — the server's dispatch of one wire request
  (``server._dispatch_wire_request``, and the ``op_code`` of the header it is given), which
  :mod:`migronaut.devserver.engine_loop` moves to a loop of its own.

Invariants:

* No other module of migronaut names a private mongoeco attribute or module; mongoeco's private
  modules are imported here lazily, when first used.
* :data:`SUPPORTED` names the mongoeco release lines this module was written against;
  :func:`check_version` refuses any other before a server starts (unless
  ``MIGRONAUT_DEVSERVER_ANY_MONGOECO=1``), and a hooked attribute that is not where it is
  expected is a :class:`~migronaut.errors.ConfigInvalidError` when the server is built, never an
  ``AttributeError`` in the middle of a command. ``tests/test_devserver_internals.py`` checks
  each name on the installed mongoeco.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import functools
import gc
import heapq
import importlib
import importlib.metadata
import math
import os
import random
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, ClassVar, Final

from migronaut.devserver.catalog import Refused
from migronaut.errors import ConfigInvalidError

__all__ = [
    "ANY_VERSION_ENV_VAR",
    "SUPPORTED",
    "CommandHooks",
    "Request",
    "apply_pipeline",
    "check_version",
    "indexed_memory_engine",
    "installed_version",
    "route_requests",
    "sampling",
    "set_collection_options",
]

#: The mongoeco release lines (``major.minor``) this module was written against and tested with.
SUPPORTED: Final = ("4.11",)
#: Set to ``1`` to serve with a mongoeco outside :data:`SUPPORTED` (at your own risk).
ANY_VERSION_ENV_VAR: Final = "MIGRONAUT_DEVSERVER_ANY_MONGOECO"

#: mongoeco's execution of a prepared request context (``execute_prepared``).
Execute = Callable[[Any], Awaitable[Any]]
#: mongoeco's build of a request context from a command body (``_build_request_context``).
Prepare = Callable[..., Any]
#: What runs one wire request: given its op code, its bytes after the header, and mongoeco's
#: answer to it (a coroutine function), returns that answer's reply bytes.
Router = Callable[[int, bytes, Callable[[], Coroutine[Any, Any, Any]]], Awaitable[Any]]


def installed_version() -> str:
    """The installed mongoeco's version (``"unknown"`` when its metadata cannot be read)."""
    try:
        return importlib.metadata.version("mongoeco")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def check_version() -> None:
    """Refuse a mongoeco whose ``major.minor`` is not in :data:`SUPPORTED`: its internals may
    have moved. ``MIGRONAUT_DEVSERVER_ANY_MONGOECO=1`` skips the check."""
    if os.environ.get(ANY_VERSION_ENV_VAR, "").strip() == "1":
        return
    version = installed_version()
    if ".".join(version.split(".")[:2]) in SUPPORTED:
        return
    supported = ", ".join(f"{line}.x" for line in SUPPORTED)
    raise ConfigInvalidError(
        f"the dev server supports mongoeco {supported}, not the installed {version} "
        f"(pip install 'migronaut[embedded]' installs a supported one; "
        f"{ANY_VERSION_ENV_VAR}=1 serves with it anyway)",
        {"mongoeco": version, "supported": supported},
    )


@dataclasses.dataclass(frozen=True)
class Request:
    """What the layer reads of a request context mongoeco prepared.

    ``command`` is the very dict mongoeco runs: the layer's changes to it are what runs.
    """

    name: Any
    command: dict[str, Any]
    db: str
    connection: Any
    starts_transaction: bool


class CommandHooks:
    """mongoeco's wire command executor, as the layer hooks it (before the server starts).

    Raises :class:`~migronaut.errors.ConfigInvalidError` when the executor or either step the
    layer replaces is not where mongoeco 4.11 keeps it.
    """

    def __init__(self, server: Any) -> None:
        executor: Any = getattr(server, "_executor", None)
        original: Execute | None = getattr(executor, "execute_prepared", None)
        prepare: Prepare | None = getattr(executor, "_build_request_context", None)
        if executor is None or original is None or prepare is None:
            raise ConfigInvalidError("the dev server does not support this mongoeco version "
                                     "(its command executor moved)")
        self._executor = executor
        self._surface: Any = getattr(executor, "_surface", None)
        #: mongoeco's own execution of a request context: the command as mongoeco runs it.
        self.original_execute: Execute = original
        #: mongoeco's own build of a request context: ``prepare(body, connection=..., ...)``.
        self.prepare: Prepare = prepare
        #: The storage engine (memory or SQLite) behind the server; ``None`` when not found.
        self.engine: Any = getattr(getattr(executor, "_client", None), "_engine", None)

    def supports_command(self, name: str) -> bool:
        """Whether mongoeco serves command ``name`` (``True`` when it cannot say)."""
        return self._surface is None or bool(self._surface.supports_command(name))

    def install(self, build_request_context: Prepare, execute_prepared: Execute) -> None:
        """Put the layer's two steps in place of mongoeco's (which stay reachable as
        :attr:`prepare` and :attr:`original_execute`)."""
        self._executor._build_request_context = build_request_context
        self._executor.execute_prepared = execute_prepared

    def served_context(self, carrier: dict[str, Any], name: str | None, command: dict[str, Any],
                       **options: Any) -> Any:
        """A context for a command the layer serves itself (mongoeco would refuse it): built
        for a ``ping`` that carries the body's session and transaction fields (``carrier``),
        then naming ``name`` with ``command``."""
        context = self.prepare({"ping": 1, **carrier}, **options)
        return dataclasses.replace(context, command_name=name, command_document=command)

    @staticmethod
    def request(context: Any) -> Request | None:
        """What the layer reads of ``context``; ``None`` when it carries no command document
        (mongoeco runs it untouched)."""
        command = getattr(context, "command_document", None)
        if not isinstance(command, dict):
            return None
        raw_body = getattr(context, "raw_body", None) or {}
        return Request(name=getattr(context, "command_name", None), command=command,
                       db=context.db_name, connection=getattr(context, "connection", None),
                       starts_transaction=bool(raw_body.get("startTransaction")))


def route_requests(server: Any, router: Router) -> None:
    """Put ``router`` in front of ``server``'s dispatch of each wire request (before it starts).

    Raises :class:`~migronaut.errors.ConfigInvalidError` when the dispatch is not where mongoeco
    4.11 keeps it.
    """
    original: Any = getattr(server, "_dispatch_wire_request", None)
    if original is None:
        raise ConfigInvalidError("the dev server does not support this mongoeco version "
                                 "(its request dispatch moved)")

    async def dispatch(header: Any, payload: bytes, *, connection: Any) -> Any:
        return await router(header.op_code, payload,
                            lambda: original(header, payload, connection=connection))

    server._dispatch_wire_request = dispatch


async def set_collection_options(
    engine: Any, db: str, coll: str, options: dict[str, Any]
) -> None:
    """Replace a collection's stored options in mongoeco's memory or SQLite engine (it has no
    public way to); its validation reads them on every write."""
    store = getattr(engine, "_collection_options", None)
    if isinstance(store, dict):
        async with engine._get_lock(db, coll):
            store.setdefault(db, {})[coll] = dict(options)
        return
    if hasattr(engine, "_run_blocking") and hasattr(engine, "_require_connection"):
        from mongoeco.core.json_compat import json_dumps_compact

        encoded = json_dumps_compact(options, sort_keys=True)

        def write() -> None:
            with engine._lock:
                connection = engine._require_connection(None)
                connection.execute(
                    "UPDATE collections SET options_json = ? WHERE db_name = ? AND coll_name = ?",
                    (encoded, db, coll))
                connection.commit()

        await engine._run_blocking(write)
        return
    raise Refused(115, "CommandNotSupported",
                  "collMod: this mongoeco engine cannot change collection options")


def apply_pipeline(documents: Iterable[dict[str, Any]],
                   pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run aggregation ``pipeline`` over ``documents`` in memory, as mongoeco runs stages."""
    from mongoeco.core.aggregation.stages import apply_pipeline as run_stages

    return list(run_stages(documents, pipeline))


# -- the indexed memory engine ---------------------------------------------------------------
#
# mongoeco's memory engine keeps documents in a persistent map keyed by a typed key of the
# ``_id`` (``bson_engine_key``: ``1`` and ``1.0`` are different keys). So it finds a numeric
# ``_id`` (a lookup, a delete, a duplicate), and a single insert's duplicate, by decoding every
# stored document; it serves an ``_id`` range, a sort on ``_id`` and a count by reading them
# all; it inserts an ``insert`` command's documents one ``insert_one`` at a time; and it
# deep-copies each document several times on the way. The engine below keys documents by the
# ``_id``'s value (numbers by their exact value, as mongod's equality has it), so a map lookup
# answers what the scans answered, and keeps beside each collection an ordered index of its
# ``_id`` values (:class:`~migronaut.devserver.id_order.OrderedIds`) for ranges and sorts.

#: Documents added since the collector last set the stored ones aside (see :func:`_stored_grew`).
#: mongod's ``WriteConflict``: a transaction's commit that lost to a concurrent write.
WRITE_CONFLICT: Final = 112
#: mongod's ``NoSuchTransaction``: a commit of a transaction that was aborted.
NO_SUCH_TRANSACTION: Final = 251
_FREEZE_EVERY: Final = 20_000
#: Committed changes mongoeco keeps for change streams (which the dev server does not serve):
#: it rebuilds this list on every write, so a short one keeps each write cheap.
_CHANGE_LOG_ENTRIES: Final = 256


def indexed_memory_engine() -> Any:
    """A mongoeco memory engine whose ``_id`` lookups, duplicate checks (``_id``, and unique
    indexes without a collation, compound and partial ones included), ``_id`` ranges, sorts on
    ``_id``, plain counts and ``insert`` commands cost the same in a collection of ten
    documents as of a million."""
    # mongoeco refuses a pipeline that holds more than 50,000 documents at once (a $group over
    # a larger collection); mongod has no such limit
    return _indexed_engine_type()(change_log_max_entries=_CHANGE_LOG_ENTRIES,
                                  aggregation_materialization_limit=None)


#: Set while the indexed engine runs one of mongoeco's methods that scans for a numeric ``_id``
#: its typed key missed: with keys by value, a miss is an answer, and the scan is skipped.
_KEYED_BY_VALUE: Any = None
#: Set while a find the indexed engine serves in ``_id`` order gathers its candidates: the
#: direction (1 or -1), or 0 for a find that may read them lazily in natural order.
_FIND_ORDER: Any = None
#: Set while an ``aggregate`` whose pipeline starts with ``$sample`` runs: ``[db, collection,
#: size]`` until the read of its source consumes it (see :func:`sampling`).
_SAMPLE: Any = None
_stored_since_freeze = 0
#: No value (an empty iterator's default).
_NONE: Final = object()


def _end_transaction(session: Any) -> None:
    """Mark a mongoeco session's transaction as over (its commit raised, so mongoeco left it
    open): later operations on the session run outside any transaction."""
    session._state.transaction.active = False
    session._state.transaction.options = None


@functools.cache
def _indexed_engine_type() -> type:
    """Build the engine and collection classes (mongoeco is imported only now) and put the
    process-wide hooks in place, once."""
    global _KEYED_BY_VALUE, _FIND_ORDER, _SAMPLE
    import contextvars

    from bson.objectid import ObjectId

    from migronaut.devserver.id_order import OBJECT_ID, OrderedIds, sort_key

    memory = _module("mongoeco.engines.memory")
    plans = _module("mongoeco.core.query_plan")
    bson_engine_key = _module("mongoeco.core.bson_ordering").bson_engine_key
    object_ids = frozenset({ObjectId, _module("mongoeco.types").ObjectId})
    codec = _module("mongoeco.core.codec")
    collection_base: Any = _module("mongoeco.engines._memory_collection").MemoryCollection
    engine_base: Any = memory.MemoryEngine
    conflict_error: Any = _module("mongoeco.errors").OperationFailure
    empty_map: Any = _module("rpds").HashTrieMap()  # mongoeco's persistent map

    _KEYED_BY_VALUE = contextvars.ContextVar("migronaut_keyed_by_value", default=False)
    _FIND_ORDER = contextvars.ContextVar("migronaut_find_order", default=None)
    _SAMPLE = contextvars.ContextVar("migronaut_sample", default=None)
    ranges = {
        plans.GreaterThanCondition: ("low", False),
        plans.GreaterThanOrEqualCondition: ("low", True),
        plans.LessThanCondition: ("high", False),
        plans.LessThanOrEqualCondition: ("high", True),
    }
    points = (plans.EqualsCondition, plans.InCondition)

    class IdOrderedCollection(collection_base):  # type: ignore[misc]
        """mongoeco's collection, stored leaner: documents in one persistent map keyed by
        storage key; the ordered index of their ``_id`` values, each with the document's
        insertion ordinal; and the ordinals in order, each with its storage key (the natural
        order). mongoeco's collection keeps four persistent maps (documents, ordinals,
        positions, order chunks), each holding every document; these two indexes hold 16
        bytes an entry. Every write, copy, snapshot and restore keeps the three together;
        a copy costs O(1), as mongoeco's does."""

        #: Entries per chunk and chunks per group of the two indexes (see ``OrderedIds``).
        index_loads: ClassVar[tuple[int, int]] = (128, 32)

        def __init__(self, values: Any = ()) -> None:
            dict.__init__(self)
            self._values = empty_map
            self._new_indexes()
            self._next_ordinal = 0
            #: (storage key, ordinal) of the last insert: mongoeco asks for its ordinal next
            self._last: tuple[Any, int] | None = None
            self.update(values)

        def _new_indexes(self) -> None:
            load, group_load = self.index_loads
            self._ids = OrderedIds(load=load, group_load=group_load)  # _id key -> ordinal
            # insertion ordinal -> storage key: the natural order
            self._order = OrderedIds(load=load, group_load=group_load, bracketed=False)

        def __setitem__(self, key: Any, value: Any) -> None:
            values = self._values
            if key not in values:
                ordinal = self._next_ordinal
                self._next_ordinal = ordinal + 1
                self._ids.add(_sort_key_of(key), ordinal)
                self._order.add(ordinal, key)
                self._last = (key, ordinal)
            self._values = values.insert(key, value)

        def __delitem__(self, key: Any) -> None:
            if key not in self._values:
                raise KeyError(key)
            sort = _sort_key_of(key)
            ordinal = self._ids.find(sort)
            self._values = self._values.remove(key)
            self._ids.remove(sort)
            if ordinal is not None:
                self._order.remove(ordinal)
            self._last = None

        def replace_key(self, key: Any, replacement: Any) -> None:
            """Keep the document's place in the natural order when its ``_id`` is retyped."""
            if key == replacement:
                return
            if replacement in self:
                raise KeyError(replacement)
            value = self[key]
            old, new = _sort_key_of(key), _sort_key_of(replacement)
            ordinal = self._ids.find(old)
            if old != new:
                self._ids.remove(old)
                self._ids.add(new, ordinal)
            self._order.repoint(ordinal, replacement)
            self._values = self._values.remove(key).insert(replacement, value)
            self._last = None

        def _iter_items(self) -> Any:
            values = self._values
            return ((key, values[key]) for key in self._order.scan())

        def clear(self) -> None:
            self._values = empty_map
            self._new_indexes()
            self._next_ordinal = 0
            self._last = None

        def popitem(self) -> tuple[Any, Any]:
            key = next(self._order.scan(reverse=True), _NONE)
            if key is _NONE:
                raise KeyError("popitem(): dictionary is empty")
            value = self[key]
            del self[key]
            return key, value

        def copy(self) -> Any:
            twin = type(self)()
            twin._restore_state(self._snapshot_state())
            return twin

        def _snapshot_state(self) -> tuple[Any, ...]:
            return (self._values, self._ids.copy(), self._order.copy(), self._next_ordinal)

        def _restore_state(self, state: tuple[Any, ...]) -> None:
            self._values, ids, order, self._next_ordinal = state
            self._ids, self._order = ids.copy(), order.copy()  # the state can be restored again
            self._last = None

        def ordinal_for(self, key: Any) -> int:
            last = self._last
            if last is not None and last[0] == key:
                return last[1]
            ordinal = self._ids.find(_sort_key_of(key)) if key in self._values else None
            if ordinal is None:
                raise KeyError(key)
            return int(ordinal)

        def ordered_keys(self, candidates: Any, *, limit: int | None = None) -> list[Any]:
            present = [key for key in candidates if key in self._values]
            if limit is None:
                return sorted(present, key=self.ordinal_for)
            return [] if limit <= 0 else heapq.nsmallest(limit, present, key=self.ordinal_for)

        @property
        def ids(self) -> OrderedIds:
            return self._ids

        def items_at(self, ordinals: Any) -> Any:
            """``(storage key, stored document)`` pairs of the documents of ``ordinals``, read
            lazily from this version of the collection (a later write makes a new version)."""
            values, order = self._values, self._order.copy()
            for ordinal in ordinals:
                key = order.find(ordinal)
                yield key, values[key]

        def natural_items(self) -> Any:
            """Every pair in insertion order, read lazily from this version."""
            return self._iter_items()

        def sample_items(self, size: int) -> list[tuple[Any, Any]]:
            """``size`` distinct documents (all when there are fewer) at random positions of
            the natural order, in random order: what ``$sample`` draws, without reading the
            others."""
            total = len(self._order)
            positions = random.sample(range(total), min(size, total))
            values = self._values
            return [(key, values[key]) for key in self._order.at_positions(positions)]

    def storage_key(value: Any) -> Any:
        """mongoeco's key of an ``_id``, but numbers (alone, or in a document or array) by
        their exact value: ``1``, ``1.0``, ``Int64(1)`` and ``Decimal128("1")`` are one key
        (Python's ``==`` and ``hash`` across int, float and Decimal are exact)."""
        kind = type(value)
        if kind in object_ids or isinstance(value, ObjectId):  # pymongo's and mongoeco's
            # the ObjectId's sort key: the index of _id values holds the same tuple
            return (OBJECT_ID, bytes(value.binary))
        if kind is str:
            return ("str", value)
        if kind is int:
            return ("number", value)
        if isinstance(value, dict):  # and mongoeco's internal documents
            return ("dict", tuple((name, storage_key(item)) for name, item in value.items()))
        if isinstance(value, list | tuple):
            return ("list", tuple(storage_key(item) for item in value))
        plain = _plain(value)
        if isinstance(plain, int | float | decimal.Decimal) and not isinstance(plain, bool):
            return ("number", "NaN" if plain != plain else plain)  # NaN equals NaN in BSON
        return bson_engine_key(plain)

    plain_scalars = frozenset({str, int, float, bool, type(None), datetime.datetime, ObjectId,
                               _module("mongoeco.types").ObjectId})

    def plain_values(document: Any, fields: list[str]) -> list[Any] | None:
        """The value of each of ``fields`` in ``document`` (``None`` where one is missing) when
        each path runs through plain documents only, to a plain scalar or to nothing: the one
        key combination a compound index has for it. ``None`` otherwise (an array, or another
        type, on a path: mongoeco works its combinations out)."""
        values: list[Any] = []
        for field in fields:
            value = document
            for part in field.split("."):
                if type(value) is not dict:
                    return None
                value = value.get(part, _NONE)
                if value is _NONE:
                    break
            if value is _NONE:
                values.append(None)
            elif type(value) in plain_scalars:
                values.append(value)
            else:
                return None
        return values

    def _sort_key_of(key: Any) -> Any:
        return key if key[0] == OBJECT_ID else sort_key(_key_value(key))

    def _value_sort_key(value: Any) -> Any:
        return _sort_key_of(storage_key(value))

    def id_clauses(plan: Any) -> list[Any]:
        """The conditions on ``_id`` that every match meets: those of the plan's top-level
        ``$and``, nested ones included (``{a: 1, _id: {$type: …, $gt: …}}`` compiles to an
        ``$and`` holding an ``$and``)."""
        if isinstance(plan, plans.AndCondition):
            return [found for clause in plan.clauses for found in id_clauses(clause)]
        return [plan] if getattr(plan, "field", None) == "_id" else []

    def id_bounds(clauses: list[Any]) -> tuple[Any, bool, Any, bool] | None:
        """The tightest ``_id`` sort-key bounds of the range clauses, within one ordered type
        bracket (mongod's comparison operators match values of their operand's type only);
        ``None`` when there is no range clause or one outside the ordered brackets; bounds
        that meet nothing when two clauses name different brackets."""
        from migronaut.devserver.id_order import ORDERED

        low = high = bracket = None
        low_inclusive = high_inclusive = True
        brackets = set()
        for clause in clauses:
            side = ranges.get(type(clause))
            if side is None:
                continue
            key = _value_sort_key(clause.value)
            if key[0] not in ORDERED:
                return None
            brackets.add(key[0])
            bracket = key[0]
            if side[0] == "low" and (low is None or key > low or (key == low and not side[1])):
                low, low_inclusive = key, side[1]
            elif side[0] == "high" and (
                    high is None or key < high or (key == high and not side[1])):
                high, high_inclusive = key, side[1]
        if bracket is None:
            return None
        if len(brackets) > 1:  # a value of two types at once: none
            return (bracket,), False, (bracket,), False
        if low is None:
            low, low_inclusive = (bracket,), True
        if high is None:
            high, high_inclusive = (bracket + 1,), False
        return low, low_inclusive, high, high_inclusive

    def in_id_order(coll: IdOrderedCollection, plan: Any) -> bool:
        """Whether a find sorted on ``_id`` can take its candidates from the ordered index."""
        clauses = id_clauses(plan)
        if any(isinstance(clause, points) for clause in clauses):
            return False  # one or a few documents: mongoeco sorts them
        if id_bounds(clauses) is not None:
            return True
        return not any(type(clause) in ranges for clause in clauses) and coll.ids.all_ordered

    class IndexedMemoryEngine(engine_base):  # type: ignore[misc]
        def _storage_key(self, value: Any) -> Any:
            return storage_key(value)

        def _commit_session_transaction(self, session: Any) -> None:
            """A commit refused for a write conflict aborts the transaction, as mongod's
            does (``WriteConflict``, 112, labelled ``TransientTransactionError``). mongoeco
            keeps the refused transaction open: the session's next operations (the driver
            reuses its lsid) read and wrote its dead snapshot, which was committed later —
            writes lost to everyone else, reads of a state that never was."""
            refused: set[Any] = self.__dict__.setdefault("_migronaut_refused_commits", set())
            if session.session_id in refused and \
                    session.session_id not in self._mvcc_states:
                # mongoeco retries a commit phase itself: the transaction is gone, as mongod
                # answers (NoSuchTransaction), never an empty success
                _end_transaction(session)
                raise conflict_error(
                    "Transaction was aborted by a write conflict", code=NO_SUCH_TRANSACTION,
                    error_labels=("TransientTransactionError",))
            try:
                super()._commit_session_transaction(session)
            except conflict_error as error:
                if "Write conflict" not in str(error):
                    raise
                self._abort_session_transaction(session)
                _end_transaction(session)
                refused.add(session.session_id)
                raise conflict_error(
                    "Write conflict during transaction commit", code=WRITE_CONFLICT,
                    error_labels=("TransientTransactionError",)) from None

        def _start_session_transaction(self, session: Any) -> None:
            self.__dict__.get("_migronaut_refused_commits", set()).discard(session.session_id)
            super()._start_session_transaction(session)

        def _encode_storage_document(self, document: Any) -> Any:
            """Keep a stored document as the plain document it decodes to, already decoded:
            mongoeco encodes it into tagged JSON-like values, then decodes a second copy on
            its first read and keeps both (its readers copy a document before changing it)."""
            if not codec.DocumentCodec.is_internal(document):  # internal ones were checked
                codec.validate_bson_value(document)
            plain = _plain_copy(document)
            stored = memory._StoredDocument(plain)
            stored.decoded_wrapped = plain
            return stored

        def _index_keys(self, document: Any, fields: list[str]) -> Any:
            if len(fields) > 1:  # every combination, as the uniqueness check compares them
                values = plain_values(document, fields)
                if values is not None:  # one combination: mongoeco's, without its walks
                    return {tuple(self._index_equality_key(value) for value in values)}
                return self._unique_index_keys(document, fields)
            return super()._index_keys(document, fields)

        def _ensure_unique_indexes(
            self, db_name: str, coll_name: str, candidate: Any, *,
            exclude_storage_key: Any | None = None, indexes_view: Any = None,
            storage_view: Any = None, index_data_view: Any = None,
            check_id_storage: bool = False, scan_payload_id: bool = False,
        ) -> None:
            coll = ((self._storage if storage_view is None else storage_view)
                    .get(db_name, {}).get(coll_name, {}))
            exclude = exclude_storage_key
            if exclude is not None and exclude not in coll:
                exclude = self._storage_key(exclude)
            namespace = f"{db_name}.{coll_name}"
            if check_id_storage and "_id" in candidate:
                key = storage_key(candidate["_id"])
                if key in coll and key != exclude:
                    raise self._unique_key_error(
                        f"Duplicate key: _id={candidate['_id']}", namespace, candidate)
            indexes = ((self._indexes if indexes_view is None else indexes_view)
                       .get(db_name, {}).get(coll_name, []))
            index_data = ((self._index_data if index_data_view is None else index_data_view)
                          .get(db_name, {}).get(coll_name, {}))
            unserved = []
            for index in indexes:
                if not memory.document_in_virtual_index(candidate, index):
                    continue
                self._validate_compound_multikey_shape(candidate, index)
                if not index.get("unique"):
                    continue
                index_map = index_data.get(index["name"])
                if index_map is None or index.get("collation") is not None:
                    unserved.append(index)  # collation equality: mongoeco compares them all
                    continue
                fields = index["fields"]
                for key in self._unique_index_keys(candidate, fields):
                    matches = index_map.get(key)
                    if matches and (exclude is None or any(m != exclude for m in matches)):
                        raise self._unique_key_error(
                            f"Duplicate key for unique index '{index['name']}': "
                            f"{fields}={key!r}", namespace, candidate, index=index,
                            conflict=key)
            if unserved:
                super()._ensure_unique_indexes(
                    db_name, coll_name, candidate, exclude_storage_key=exclude_storage_key,
                    indexes_view={db_name: {coll_name: unserved}}, storage_view=storage_view,
                    index_data_view=index_data_view, check_id_storage=False,
                    scan_payload_id=False)

        def _candidate_items_for_plan_locked(self, coll: Any, query_plan: Any,
                                             **options: Any) -> Any:
            if not isinstance(coll, IdOrderedCollection) or options.get("collation") is not None:
                return super()._candidate_items_for_plan_locked(coll, query_plan, **options)
            clauses = id_clauses(query_plan)
            for clause in clauses:
                if type(clause) is plans.EqualsCondition:
                    key = storage_key(clause.value)
                    return [(key, coll[key])] if key in coll else []
                if type(clause) is plans.InCondition:
                    keys = {storage_key(value) for value in clause.values}
                    return [(key, coll[key]) for key in coll.ordered_keys(keys)]
            order = _FIND_ORDER.get()
            if isinstance(order, _Sample):  # a leading $sample over every document
                return coll.sample_items(order.size)
            bounds = id_bounds(clauses)
            if order:  # a find sorted on _id (checked by in_id_order)
                scan = coll.ids.scan(*(bounds or (None, True, None, True)), reverse=order < 0)
                return coll.items_at(scan)
            if bounds is not None:
                return list(coll.items_at(sorted(coll.ids.scan(*bounds))))
            if order == 0 and self._indexed_candidate_storage_keys_for_plan_locked(
                    options.get("indexes") or [], options.get("index_data") or {}, query_plan,
                    dialect=options["dialect"], collation=None) is None:
                return coll.natural_items()  # a find reads as far as it needs, not all
            return super()._candidate_items_for_plan_locked(coll, query_plan, **options)

        def scan_find_semantics(self, db_name: str, coll_name: str, semantics: Any, *,
                                context: Any = None) -> Any:
            sort = semantics.sort
            # 0: candidates may be read lazily; None: mongoeco sorts them all (read them once)
            order: Any = None if sort else 0
            sample = _SAMPLE.get()
            if (sample is not None and sample[:2] == [db_name, coll_name] and _reads_all(semantics)
                    and isinstance(self._storage_view(context).get(db_name, {}).get(coll_name),
                                   IdOrderedCollection)):
                draw = _Sample(sample[2])
                sample[:] = [None, None, None]  # the aggregate's source: its inner reads read all
                return _FirstStepIn(
                    super().scan_find_semantics(db_name, coll_name, semantics, context=context),
                    _FIND_ORDER, draw)
            if (sort and len(sort) == 1 and sort[0][0] == "_id" and sort[0][1] in (1, -1)
                    and semantics.collation is None and semantics.text_query is None):
                coll = self._storage_view(context).get(db_name, {}).get(coll_name)
                if isinstance(coll, IdOrderedCollection) and in_id_order(
                        coll, semantics.query_plan):
                    order = sort[0][1]  # read in _id order: the sort is already done
                    semantics = dataclasses.replace(semantics, sort=None)
            return _FirstStepIn(
                super().scan_find_semantics(db_name, coll_name, semantics, context=context),
                _FIND_ORDER, order)

        async def create_index(self, db_name: str, coll_name: str, keys: Any, *,
                               unique: bool = False, **options: Any) -> Any:
            """A unique index without a collation is built as a plain one (mongoeco checks a
            unique build by comparing every pair of documents), then checked from its own
            entries (a key shared by two documents is a duplicate) and made unique."""
            if not unique or options.get("collation") is not None:
                return await super().create_index(db_name, coll_name, keys, unique=unique,
                                                  **options)
            context = options.get("context")
            wanted = memory.normalize_index_keys(keys)
            name = options.get("name") or memory.default_index_name(wanted)
            if any(index.name == name or index.key == wanted for index in
                   self._indexes_view(context).get(db_name, {}).get(coll_name, [])):
                # there is one: mongoeco compares the two and builds nothing
                return await super().create_index(db_name, coll_name, keys, unique=unique,
                                                  **options)
            await super().create_index(db_name, coll_name, keys, unique=False, **options)
            async with self._get_lock(db_name, coll_name):
                indexes = self._indexes_view(context).get(db_name, {}).get(coll_name, [])
                position = next(i for i, index in enumerate(indexes) if index.name == name)
                record = dataclasses.replace(indexes[position], unique=True)
                entries = (self._index_data_view(context).get(db_name, {}).get(coll_name, {})
                           .get(name, {}))
                shared = next(((key, members) for key, members in entries.items()
                               if len(members) > 1), None)
                if shared is None:
                    indexes[position] = record
                    return name
                coll = self._storage_view(context).get(db_name, {}).get(coll_name, {})
                document = self._borrow_storage_document(coll[next(iter(shared[1]))])
            await self.drop_index(db_name, coll_name, name, context=context)
            raise memory.index_build_duplicate_error(
                namespace=f"{db_name}.{coll_name}", index=record, document=document,
                conflict=shared[0])

        async def count_find_semantics(self, db_name: str, coll_name: str, semantics: Any, *,
                                       context: Any = None, operation_context: Any = None
                                       ) -> int:
            plain = (type(semantics.query_plan) is plans.MatchAll
                     and semantics.text_query is None and semantics.hint is None
                     and not self._is_profile_namespace(coll_name))
            if not plain:
                # a count with a limit stops at it: its candidates are read lazily
                token = _FIND_ORDER.set(0 if semantics.limit else None)
                try:
                    return int(await super().count_find_semantics(
                        db_name, coll_name, semantics, context=context,
                        operation_context=operation_context))
                finally:
                    _FIND_ORDER.reset(token)
            if operation_context is not None:
                context = operation_context.session
            async with self._get_lock(db_name, coll_name):
                self._purge_expired_documents_locked(
                    db_name, coll_name, context=context,
                    indexes_view=self._indexes_view(context),
                    index_data_view=self._index_data_view(context),
                    storage_view=self._storage_view(context),
                    now=semantics.variables.now.replace(tzinfo=datetime.UTC))
                total = len(self._storage_view(context).get(db_name, {}).get(coll_name, {}))
            total = max(0, total - int(semantics.skip))
            return total if semantics.limit is None else min(total, int(semantics.limit))

    memory.MemoryCollection = IdOrderedCollection
    original_numeric = memory.id_contains_numeric_value

    def id_contains_numeric_value(value: Any) -> bool:
        return False if _KEYED_BY_VALUE.get() else bool(original_numeric(value))

    memory.id_contains_numeric_value = id_contains_numeric_value
    for name in _SCANS_FOR_NUMERIC_IDS:  # each reads keys by value: no scan after a miss
        setattr(IndexedMemoryEngine, name,
                _keyed_by_value(getattr(engine_base, name), _KEYED_BY_VALUE))
    _copy_documents_cheaply()
    _validate_values_cheaply()
    _internal_documents_cheaply()
    _update_specs_cheaply()
    _pipeline_updates_compiled_once()
    _insert_in_batches()
    _abandoned_transactions_abort()
    return IndexedMemoryEngine


def _abandoned_transactions_abort() -> None:
    """A command on a session that is not part of its transaction (no ``autocommit``) aborts
    the transaction left open there, as mongod does when the driver moves on to the next
    statement. mongoeco runs such a command inside the dead transaction: after a refused
    commit (a ``failCommand`` failpoint, a network error) the driver reuses the session, and
    its next writes — a lock release — were never committed."""
    store = _module("mongoeco.wire.sessions").WireSessionStore
    original = store._apply_transaction_metadata

    def apply_transaction_metadata(session: Any, body: dict[str, Any]) -> None:
        if "autocommit" not in body and session.transaction_active:
            session.abort_transaction()
        original(session, body)

    store._apply_transaction_metadata = staticmethod(apply_transaction_metadata)


def _key_value(key: Any) -> Any:
    """The ``_id`` value behind a storage key, as
    :func:`~migronaut.devserver.id_order.sort_key` reads values (mongoeco's own ``repr`` keys
    are kept as they are: ordered among themselves, equal when equal)."""
    from bson.binary import Binary
    from bson.objectid import ObjectId
    from bson.regex import Regex
    from bson.timestamp import Timestamp

    from migronaut.devserver.id_order import OBJECT_ID

    tag = key[0]
    if tag == OBJECT_ID:
        return ObjectId(key[1])
    if tag == "number":
        return math.nan if key[1] == "NaN" else key[1]
    if tag in ("objectid", "str", "bool", "datetime", "uuid", "bytes", "int", "float"):
        return key[1]
    if tag == "none":
        return None
    if tag == "binary":
        return Binary(key[2], key[1])
    if tag == "timestamp":
        return Timestamp(key[1], key[2])
    if tag == "regex":
        return Regex(key[1], key[2])
    if tag == "dict":
        return {name: _key_value(item) for name, item in key[1]}
    if tag == "list":
        return [_key_value(item) for item in key[1]]
    if isinstance(tag, type):
        return _plain(key[1])
    return key


def _keyed_by_value(method: Any, flag: Any) -> Any:
    """``method`` run with ``flag`` set (see :data:`_KEYED_BY_VALUE`)."""
    @functools.wraps(method)
    async def keyed(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = flag.set(True)
        try:
            return await method(self, *args, **kwargs)
        finally:
            flag.reset(token)

    return keyed


@dataclasses.dataclass(frozen=True)
class _Sample:
    """The candidates of a find are a random draw of ``size`` documents (a leading
    ``$sample``), not every document."""

    size: int


def _reads_all(semantics: Any) -> bool:
    """Whether a find reads every document as it is stored: no filter, sort, skip, limit,
    collation, text search or hint (what mongoeco reads as the source of a leading
    ``$sample``)."""
    plans = _module("mongoeco.core.query_plan")
    return (type(semantics.query_plan) is plans.MatchAll and not semantics.sort
            and not semantics.skip and semantics.limit is None and semantics.collation is None
            and semantics.text_query is None and semantics.hint is None)


@contextlib.contextmanager
def sampling(db: str, coll: str, size: int) -> Iterator[None]:
    """Run an ``aggregate`` on ``db.coll`` whose pipeline starts with ``{$sample: {size}}``:
    mongoeco reads every document and draws from them; the indexed engine hands its source
    read ``size`` documents drawn at random positions of the collection instead (mongoeco's
    ``$sample`` then keeps them all, in random order). Nothing changes where the indexed
    engine does not serve that read (another engine, a view)."""
    if _SAMPLE is None:  # the indexed engine was never built in this process
        yield
        return
    token = _SAMPLE.set([db, coll, size])
    try:
        yield
    finally:
        _SAMPLE.reset(token)


#: mongoeco's engine methods that scan for a numeric ``_id`` whose typed key missed.
_SCANS_FOR_NUMERIC_IDS: Final = ("_insert_documents_impl", "get_document", "delete_document",
                                 "merge_document", "update_with_operation",
                                 "delete_with_operation")


def _plain(value: Any) -> Any:
    """mongoeco's own scalar types as the Python and pymongo values they stand for."""
    from bson.max_key import MaxKey
    from bson.min_key import MinKey

    if hasattr(value, "to_decimal"):  # Decimal128, pymongo's or mongoeco's
        return value.to_decimal()
    try:
        wrapped = _scalars().wrap_bson_numeric(value)
    except (TypeError, ValueError, OverflowError):
        wrapped = None
    if wrapped is not None:
        return wrapped.value
    kind = type(value).__name__
    if kind == "MinKey":
        return MinKey()
    if kind == "MaxKey":
        return MaxKey()
    return value


class _FirstStepIn:
    """An async iterator over ``inner`` whose first step (where mongoeco gathers a find's
    candidates) runs with ``variable`` set to ``value``."""

    def __init__(self, inner: Any, variable: Any, value: Any) -> None:
        self._inner, self._variable, self._value = inner, variable, value
        self._started = False

    def __aiter__(self) -> _FirstStepIn:
        return self

    async def __anext__(self) -> Any:
        if self._started:
            return await self._inner.__anext__()
        self._started = True
        token = self._variable.set(self._value)
        try:
            return await self._inner.__anext__()
        finally:
            self._variable.reset(token)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _module(name: str) -> Any:
    """A mongoeco module, untyped: what is read of it is checked by the internals tests."""
    return importlib.import_module(name)


@functools.cache
def _scalars() -> Any:
    return _module("mongoeco.core.bson_scalars")


def _plain_copy(value: Any) -> Any:
    """``value`` as mongoeco's codec gives it back from its encoding (plain dicts and lists,
    dates in UTC, bytes), without the encoding."""
    if isinstance(value, dict):
        return {key: _plain_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_copy(item) for item in value]
    if isinstance(value, datetime.datetime):
        return _scalars().normalize_utc_bson_datetime(value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _internal_documents_cheaply() -> None:
    """mongoeco's batch insert makes each document internal by encoding it into tagged values
    and decoding it again; documents that came off the wire hold mongoeco's values already:
    copy them into its immutable internal form directly."""
    codec = _module("mongoeco.core.codec")
    base: Any = codec.DocumentCodec
    own = codec._own_internal_bson

    class InternalByCopy(base):  # type: ignore[misc]
        @staticmethod
        def to_internal(data: Any) -> Any:
            if base.is_internal(data):
                return data
            codec.validate_bson_value(data)  # as mongoeco's encoding checks it
            return own(_plain_copy(data))

    _module("mongoeco.api._async._collection_insert").DocumentCodec = InternalByCopy


def _update_specs_cheaply() -> None:
    """mongoeco makes an update command's spec internal by encoding it into tagged values and
    decoding it again (``DocumentCodec.to_internal``). For a spec made of plain dicts, lists,
    strings, numbers (mongoeco's wrappers included), booleans, nulls and dates, that round trip
    is a copy with dates in BSON's form (UTC, milliseconds): make that copy directly, checked as
    the encoding checks it; any other value takes mongoeco's own round trip."""
    codec = _module("mongoeco.core.codec")
    base: Any = codec.DocumentCodec
    # what mongoeco's codec makes of a decoded document and array (``_own_internal_bson``)
    internal_document, internal_array = codec._InternalBsonDocument, codec._InternalBsonArray
    scalars = _scalars()
    normalize = scalars.normalize_utc_bson_datetime
    same = frozenset({str, int, float, bool, type(None), scalars.BsonInt32, scalars.BsonInt64,
                      scalars.BsonDouble})

    def copied(value: Any) -> Any:
        """The decoded encoding of ``value``, internal; :data:`_NONE` when it holds another
        type."""
        kind = type(value)
        if kind in same:
            return value
        if kind is dict:
            document = {}
            for key, item in value.items():
                item = copied(item)
                if item is _NONE:
                    return _NONE
                document[key] = item
            return internal_document(document)
        if kind is list:
            items = []
            for item in value:
                item = copied(item)
                if item is _NONE:
                    return _NONE
                items.append(item)
            return internal_array(items)
        if kind is datetime.datetime:
            return normalize(value)
        return _NONE

    def check(value: Any) -> None:
        """What the encoding checks, in its order: a document whole, a list item by item."""
        if type(value) is list:
            for item in value:
                check(item)
        else:
            codec.validate_bson_value(value)

    class SpecByCopy(base):  # type: ignore[misc]
        @staticmethod
        def to_internal(data: Any) -> Any:
            if base.is_internal(data):
                return data
            plain = copied(data)
            if plain is _NONE:
                return base.to_internal(data)
            check(data)
            return plain

    _module("mongoeco.api._async._collection_modify").DocumentCodec = SpecByCopy


def _pipeline_updates_compiled_once() -> None:
    """mongoeco compiles an update pipeline twice per update: for a matched document and for an
    upsert's insert. The two differ only in their context's ``is_upsert_insert`` (a pipeline's
    preparation and compilation read the context's dialect, collation and array filters, never
    that flag): compile it once and give the upsert's plan its own context."""
    operations = _module("mongoeco.api.operations")
    engine: Any = _module("mongoeco.core.operators").UpdateEngine
    failure: Any = operations.OperationFailure
    relaxed = operations.PlanningMode.RELAXED
    original = operations._compile_update_plans

    def compile_update_plans(update_spec: Any, *, dialect: Any, selector_filter: Any,
                             collation: Any, array_filters: Any, variables: Any,
                             planning_mode: Any) -> tuple[Any, Any]:
        if not isinstance(update_spec, list):
            plans: tuple[Any, Any] = original(update_spec, dialect=dialect,
                                              selector_filter=selector_filter,
                                              collation=collation, array_filters=array_filters,
                                              variables=variables,
                                              planning_mode=planning_mode)
            return plans
        try:
            plan = engine.compile_update_plan(
                update_spec, dialect=dialect, selector_filter=selector_filter,
                collation=collation, array_filters=array_filters, variables=variables)
        except failure:
            if planning_mode is relaxed:
                return None, None
            raise
        upsert_context = engine.build_execution_context(
            dialect=dialect, collation=collation, selector_filter=selector_filter,
            array_filters=array_filters, is_upsert_insert=True)
        return plan, dataclasses.replace(plan, context=upsert_context)

    operations._compile_update_plans = compile_update_plans


def _validate_values_cheaply() -> None:
    """mongoeco checks every value of a document it stores (a BSON type, an int within int64)
    by wrapping each number in an object first; check the common types directly, and hand
    the rest to mongoeco's own check."""
    codec = _module("mongoeco.core.codec")
    scalars = _scalars()
    original = codec.validate_bson_value
    low, high = scalars.INT64_MIN, scalars.INT64_MAX
    from bson.objectid import ObjectId

    fine = frozenset({str, float, bool, type(None), bytes, datetime.datetime, ObjectId,
                      _module("mongoeco.types").ObjectId, scalars.BsonInt32, scalars.BsonInt64,
                      scalars.BsonDouble})

    def validate_bson_value(value: object) -> None:
        pending: list[Any] = [value]
        while pending:
            current = pending.pop()
            kind = type(current)
            if kind in fine:
                continue
            if isinstance(current, dict):  # and mongoeco's internal documents
                for key in current:
                    if not isinstance(key, str):
                        raise TypeError("BSON document keys must be strings")
                pending.extend(current.values())
            elif isinstance(current, list | tuple):
                pending.extend(current)
            elif kind is int:
                if not low <= current <= high:
                    raise scalars.BsonScalarOverflowError("integer exceeds BSON int64 range")
            else:
                original(current)

    codec.validate_bson_value = validate_bson_value


def _copy_documents_cheaply() -> None:
    """mongoeco deep-copies each document several times per write; ``copy.deepcopy`` walks
    every scalar through its memo. Documents are trees of dicts, lists and immutable scalars:
    copy those directly, and hand anything else to ``deepcopy``."""
    import copy

    from bson.decimal128 import Decimal128
    from bson.int64 import Int64
    from bson.objectid import ObjectId

    scalars = _module("mongoeco.core.bson_scalars")
    deepcopy = copy.deepcopy
    immutable = frozenset({str, int, float, bool, type(None), bytes, datetime.datetime,
                           decimal.Decimal, uuid.UUID, ObjectId, _module("mongoeco.types").ObjectId,
                           Int64, Decimal128, scalars.BsonInt32, scalars.BsonInt64,
                           scalars.BsonDouble, scalars.BsonDecimal128})

    def document_copy(value: Any, memo: Any = None) -> Any:
        kind = type(value)
        if kind in immutable:
            return value
        if kind is dict:
            return {key: document_copy(item) for key, item in value.items()}
        if kind is list:
            return [document_copy(item) for item in value]
        return deepcopy(value, memo)

    for name in _DEEPCOPY_USERS:
        module = _module(name)
        if getattr(module, "deepcopy", None) is deepcopy:
            module.deepcopy = document_copy


#: mongoeco modules whose per-document ``deepcopy`` calls are on the write and read paths.
_DEEPCOPY_USERS: Final = (
    "mongoeco.engines.memory", "mongoeco.api._async.collection",
    "mongoeco.api._async._collection_runtime", "mongoeco.api._async._collection_insert",
    "mongoeco.api._async._collection_bulk", "mongoeco.engines.results",
    "mongoeco.core.operators", "mongoeco.core.aggregation.preparation",
    "mongoeco.core.aggregation.transform_stages",
)


def _insert_in_batches() -> None:
    """mongoeco's ``insert`` command inserts its documents one ``insert_one`` at a time; its
    ``insert_many`` does what the command asks (ordered or not, each failure as a write error
    at its index) in one engine call per batch."""
    from mongoeco.errors import BulkWriteError

    commands = _module("mongoeco.api._async._database_admin_write_commands")
    types = _module("mongoeco.types")
    service = commands.DatabaseAdminWriteCommandService

    async def command_insert(self: Any, spec: dict[str, object], *, session: Any = None
                             ) -> object:
        admin = self._admin
        name = admin._require_collection_name(spec.get("insert"), "insert")
        documents = admin._normalize_insert_documents(spec.get("documents"))
        ordered = admin._normalize_ordered_from_command(spec.get("ordered"))
        bypass = commands.command_boolean(spec.get("bypassDocumentValidation", False),
                                          "bypassDocumentValidation", numeric=True)
        acknowledged = commands.write_command_acknowledged(
            spec, dialect=admin._mongodb_dialect.key)
        collection = admin._database.get_collection(name)
        inserted, errors = len(documents), []
        try:
            await collection.insert_many(documents, ordered=ordered,
                                         bypass_document_validation=bypass, session=session)
        except BulkWriteError as error:
            details = dict(getattr(error, "details", None) or {})
            inserted = int(details.get("nInserted") or 0)
            for entry in details.get("writeErrors") or []:
                rest = {key: value for key, value in entry.items()
                        if key not in ("index", "errmsg", "code", "op")}
                errors.append(types.WriteErrorEntry(
                    index=entry["index"], errmsg=entry["errmsg"], code=entry.get("code"),
                    details=rest or None))
        _stored_grew(inserted)
        return commands._write_command_result(
            types.WriteCommandResult(count=inserted, write_errors=errors or None),
            acknowledged=acknowledged)

    service.command_insert = command_insert


def _stored_grew(documents: int) -> None:
    """Stored documents are acyclic and long-lived; Python's cyclic collector would walk all of
    them on each of its full passes, and those come more often the more are stored. Once enough
    were added, collect, then set everything alive aside (``gc.freeze``): the collector's passes
    then cost what the live requests cost. A frozen document is still freed when dropped."""
    global _stored_since_freeze
    _stored_since_freeze += documents
    if _stored_since_freeze >= _FREEZE_EVERY:
        _stored_since_freeze = 0
        gc.collect()
        gc.freeze()
