"""How the dev server answers: the layer in front of mongoeco's command executor.

mongoeco serves the wire protocol; this layer makes it answer the way ``mongod`` does where
migronaut, its tests and the official clients depend on it:

* **strict** (the default): a command ``mongod`` refuses is refused with ``mongod``'s code and
  message shape (:mod:`migronaut.devserver.mongod_rules`) — ``ok: 0`` for the whole command, or a
  ``writeErrors`` entry for one update statement (ordered batches stop there, unordered ones run
  the others);
* **mongod's ``$set`` semantics**: in a pipeline ``$set``/``$addFields`` stage, a nested
  document of field names (``{"a": {"b": 1}}``) is merged into the existing object, as
  ``mongod`` does; mongoeco would replace the object;
* **cursor ids are int64** on the wire (the Node driver and ``mongosh`` refuse an int32 ``id``),
  and int64 ids sent back by ``getMore``/``killCursors`` are understood; a command mongoeco does
  not serve is mongod's ``CommandNotFound`` (59), which clients such as ``mongosh`` expect;
* **catalog commands mongoeco lacks or lists differently**: ``collMod`` is served
  (:mod:`migronaut.devserver.collmod`), ``listIndexes``/``listCollections`` replies are reshaped
  as ``mongod`` 7.0 lists them and ``createIndexes`` keeps the options mongoeco cannot store
  (:mod:`migronaut.devserver.catalog`);
* **Atlas Search index commands** (``createSearchIndexes``, ``updateSearchIndex``,
  ``dropSearchIndex``, ``$listSearchIndexes``): served like Atlas with ``search``
  (:mod:`migronaut.devserver.search`), refused like a ``mongod`` without Search otherwise (31082);
* **test failpoint** (``--enable-test-commands`` only): mongod's ``configureFailPoint`` with its
  ``failCommand`` failpoint (:mod:`migronaut.devserver.failpoints`), so failure paths are
  reached over the wire; without the flag the command is unknown (59), as on a production mongod
  (mongoeco's own failpoint, which would also fail this layer's internal reads, is never reached);
* ``standalone``: ``startTransaction`` is refused like a standalone ``mongod`` (error 20);
* ``sharded``: ``hello`` answers like a ``mongos`` and a ``find``'s ``min``/``max`` index bounds
  are applied as a filter (mongoeco ignores them).

mongoeco's command executor is internal: the layer reaches it only through
:class:`~migronaut.devserver.mongoeco_internals.CommandHooks`, which checks it is there, so a newer
mongoeco fails loudly with ``CONFIG_INVALID`` instead of silently serving without this layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from migronaut._values import is_int
from migronaut.devserver.catalog import (
    IndexExtras,
    Refused,
    equivalent_index_refusal,
    mongod_collection,
    mongod_index,
    mongoeco_index_spec,
    with_collection_collation,
)
from migronaut.devserver.collmod import CollMod, check_validator
from migronaut.devserver.failpoints import COMMAND as CONFIGURE_FAIL_POINT
from migronaut.devserver.failpoints import FailCommand
from migronaut.devserver.mongod_rules import (
    Violation,
    check_batch_size,
    check_command,
    is_nested_spec,
)
from migronaut.devserver.mongoeco_internals import (
    CommandHooks,
    Execute,
    Request,
    sampling,
    set_collection_options,
)
from migronaut.devserver.search import SearchIndexes, is_search_request, not_enabled

__all__ = ["install"]

#: Runs one command straight in mongoeco (no layer) and returns its reply; raises on ``ok: 0``.
Run = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

_STANDALONE_TXN_MESSAGE: Final = (
    "Transaction numbers are only allowed on a replica set member or mongos"
)
#: Keys of a command body that are not the command (a body's first key is, in practice).
_INTERNAL_KEYS: Final = frozenset({
    "$db", "$readPreference", "$clusterTime", "lsid", "txnNumber", "autocommit",
    "startTransaction", "$audit",
})
#: The handshake commands whose reply says what kind of server this is.
_HELLO_COMMANDS: Final = frozenset({"hello", "isMaster", "ismaster"})
#: Reply fields a mongos never sends (they would make the driver see a replica set member).
_NOT_ON_MONGOS: Final = (
    "setName", "hosts", "passives", "arbiters", "primary", "me", "setVersion", "electionId",
    "secondary", "arbiterOnly", "hidden", "topologyVersion",
)


def install(server: Any, *, strict: bool, standalone: bool, sharded: bool,
            search: SearchIndexes | None = None, fail_command: FailCommand | None = None
            ) -> None:
    """Put the layer in front of ``server``'s command executor (before it starts); ``search``
    serves the search-index commands (``None``: refused as by a ``mongod`` without Search);
    ``fail_command`` serves ``configureFailPoint`` (``None``: an unknown command)."""
    from bson.int64 import Int64
    from mongoeco.errors import OperationFailure

    hooks = CommandHooks(server)
    original, prepare = hooks.original_execute, hooks.prepare
    extras = IndexExtras()
    #: createIndexes options set aside before mongoeco validates the command, by context id.
    aside_by_context: dict[int, dict[str, dict[str, Any]]] = {}
    #: count_documents aggregates served as a count, by context id: the collection's name.
    counted_by_context: dict[int, str] = {}

    def inside(request: Request) -> Run:
        """Run a command straight in mongoeco, on ``request``'s connection and database."""
        async def run(body: dict[str, Any]) -> dict[str, Any]:
            context = prepare({**body, "$db": request.db}, connection=request.connection)
            reply = await original(context)
            if not isinstance(reply, dict) or not reply.get("ok", 1):
                raise OperationFailure(str(reply.get("errmsg")), code=reply.get("code"))
            return dict(reply)
        return run

    async def set_options(db: str, coll: str, options: dict[str, Any]) -> None:
        await set_collection_options(hooks.engine, db, coll, options)

    def build_request_context(body: Any, **options: Any) -> Any:
        """What must happen before mongoeco validates the command (it refuses all three without
        a code): int64 cursor ids, mongod's empty-batch and unknown-command errors."""
        if isinstance(body, dict):
            _cursor_ids_in(body)
            batch = check_batch_size(body) if strict else None
            if batch is not None:
                raise _refusal(batch)
            name = next((key for key in body if key not in _INTERNAL_KEYS), None)
            searching = is_search_request(name, body)
            if searching and search is None:
                raise _refused(not_enabled())
            served = name == "collMod" or searching or (
                fail_command is not None and name == CONFIGURE_FAIL_POINT)
            if served:  # served here: a context mongoeco accepts
                carrier = {key: body[key] for key in body if key in _INTERNAL_KEYS}
                command = {key: body[key] for key in body if key not in _INTERNAL_KEYS}
                return hooks.served_context(carrier, name, command, **options)
            counting = _as_count(body) if name == "aggregate" else None
            if counting is not None:
                context = prepare(counting, **options)
                counted_by_context[id(context)] = body["aggregate"]
                return context
            aside = _split_index_specs(body) if name == "createIndexes" else None
            unknown = name == CONFIGURE_FAIL_POINT or (  # mongoeco's own, served without a flag
                isinstance(name, str) and not hooks.supports_command(name))
            if unknown:
                raise OperationFailure(f"no such command: '{name}'", code=59,
                                       details={"codeName": "CommandNotFound"})
            if aside is not None:
                context = prepare(body, **options)
                aside_by_context[id(context)] = aside
                return context
        return prepare(body, **options)

    async def execute_prepared(context: Any) -> Any:
        request = hooks.request(context)
        aside = aside_by_context.pop(id(context), {})
        counted = counted_by_context.pop(id(context), None)
        if request is None:
            return await original(context)
        name, command, db = request.name, request.command, request.db
        if fail_command is not None:
            try:
                if name == CONFIGURE_FAIL_POINT:
                    return fail_command.configure(command, db)
                fail_command.check(name, request.connection)
            except Refused as refusal:
                raise _refused(refusal) from None
        if standalone and request.starts_transaction:
            raise OperationFailure(_STANDALONE_TXN_MESSAGE, code=20)
        if sharded and name == "find":
            _index_bounds(command)
        refused = check_command(command) if strict else []
        for violation in refused:
            if violation.index is None:
                raise _refusal(violation)
        _merge_nested_specs(command)
        try:
            if search is not None and is_search_request(name, command):
                return await search.serve(name, command, db, inside(request))
            if name == "collMod":
                return await CollMod(db, inside(request), set_options, extras)(command)
            if name == "createIndexes":
                return await _create_indexes(original, context, db, command, aside,
                                             inside(request), extras)
            if name == "create":
                await _check_create(command, db, inside(request))
        except Refused as refusal:
            raise _refused(refusal) from None
        if refused:
            reply = await _update_without(original, context, command, refused)
        else:
            size = _leading_sample(command) if name == "aggregate" else None
            with contextlib.nullcontext() if size is None else sampling(
                    db, command["aggregate"], size):
                reply = await original(context)
        if search is not None and isinstance(reply, dict) and reply.get("ok"):
            search.follow(name, command, db)
        if counted is not None and isinstance(reply, dict) and reply.get("ok"):
            total = int(reply.get("n") or 0)
            reply = {"cursor": {"firstBatch": [{"_id": 1, "n": total}] if total else [],
                                "id": 0, "ns": f"{db}.{counted}"}, "ok": 1.0}
        if isinstance(reply, dict):
            cursor = reply.get("cursor")
            if isinstance(cursor, dict) and isinstance(cursor.get("id"), int):
                cursor["id"] = Int64(cursor["id"])
            if name in ("listIndexes", "listCollections") and isinstance(cursor, dict):
                await _reshape_listing(name, command, cursor, db, inside(request), extras)
            if sharded and name in _HELLO_COMMANDS:
                for field in _NOT_ON_MONGOS:
                    reply.pop(field, None)
                reply["msg"] = "isdbgrid"
        return reply

    hooks.install(build_request_context, execute_prepared)


def _leading_sample(command: dict[str, Any]) -> int | None:
    """The size of an ``aggregate``'s first stage ``{$sample: {size: n}}`` on a collection
    (``None`` for any other pipeline): a draw the dev server's engine serves without reading
    every document."""
    pipeline = command.get("pipeline")
    if not isinstance(command.get("aggregate"), str) or not isinstance(pipeline, list) \
            or not pipeline or not isinstance(pipeline[0], dict) or len(pipeline[0]) != 1:
        return None
    spec = pipeline[0].get("$sample")
    if not isinstance(spec, dict) or list(spec) != ["size"]:
        return None
    size = spec["size"]
    return size if type(size) is int and size > 0 else None


# -- count_documents -------------------------------------------------------------------------

#: The last stage of the pipeline pymongo sends for ``count_documents``.
_COUNT_GROUP: Final = {"$group": {"_id": 1, "n": {"$sum": 1}}}
#: Options of such an ``aggregate`` that the ``count`` command takes under the same name.
_COUNT_OPTIONS: Final = ("collation", "hint", "maxTimeMS", "comment", "readConcern")


def _as_count(body: dict[str, Any]) -> dict[str, Any] | None:
    """The ``count`` command that answers a ``count_documents`` aggregate (``$match``, then
    ``$skip``/``$limit``, then ``{$group: {_id: 1, n: {$sum: 1}}}``), or ``None`` for any other
    pipeline, option or a transaction (mongod refuses ``count`` in one). mongoeco runs the
    pipeline over every matching document, holding them all (and refuses past 50,000); its
    ``count`` is served from the collection's size, or from the ``_id`` index for a range."""
    pipeline = body.get("pipeline")
    if (not isinstance(body.get("aggregate"), str) or not isinstance(pipeline, list)
            or len(pipeline) < 2 or pipeline[-1] != _COUNT_GROUP
            or "autocommit" in body or "startTransaction" in body):
        return None
    first = pipeline[0]
    if not isinstance(first, dict) or list(first) != ["$match"] or not isinstance(
            first["$match"], dict):
        return None
    count: dict[str, Any] = {"count": body["aggregate"], "query": first["$match"]}
    for stage in pipeline[1:-1]:
        if not isinstance(stage, dict) or len(stage) != 1:
            return None
        (operator, value), = stage.items()
        field = {"$skip": "skip", "$limit": "limit"}.get(operator)
        if field is None or field in count or (field == "skip" and "limit" in count):
            return None
        count[field] = value
    for key, value in body.items():
        if key in _COUNT_OPTIONS or key in _INTERNAL_KEYS:
            count[key] = value
        elif key not in ("aggregate", "pipeline", "cursor"):
            return None  # an option count has not: mongoeco runs the pipeline
    return count


# -- catalog: createIndexes, listIndexes, listCollections ------------------------------------


def _split_index_specs(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Take out of a ``createIndexes`` body what mongoeco cannot store (it would refuse the
    command); returns it by index name."""
    aside: dict[str, dict[str, Any]] = {}
    specs = body.get("indexes")
    if not isinstance(specs, list):
        return aside
    for position, spec in enumerate(specs):
        if isinstance(spec, dict):
            try:
                specs[position], aside[str(spec.get("name"))] = mongoeco_index_spec(spec)
            except Refused as refusal:
                raise _refused(refusal) from None
    return aside


async def _create_indexes(
    original: Execute, context: Any, db: str, command: dict[str, Any],
    aside: dict[str, dict[str, Any]], run: Run, extras: IndexExtras,
) -> Any:
    """``createIndexes`` on database ``db`` with the collection's default collation applied;
    what was set ``aside`` is remembered for the indexes this command creates."""
    coll = command.get("createIndexes")
    specs = command.get("indexes")
    if not isinstance(coll, str) or not isinstance(specs, list):
        return await original(context)
    listed = await run({"listCollections": 1, "filter": {"name": coll}})
    batch = listed["cursor"]["firstBatch"]
    default_collation = (batch[0].get("options") or {}).get("collation") if batch else None
    listed_indexes: list[Mapping[str, Any]] = []
    if batch:
        indexes = await run({"listIndexes": coll})
        listed_indexes = indexes["cursor"]["firstBatch"]
    existing = {index.get("name") for index in listed_indexes}
    for spec in specs:
        if isinstance(spec, dict):
            with_collection_collation(spec, default_collation)
            requested = {**spec, **aside.get(str(spec.get("name")), {})}
            refusal = equivalent_index_refusal(requested, listed_indexes)
            if refusal is not None:
                raise refusal
    reply = await original(context)
    if isinstance(reply, dict) and reply.get("ok"):
        for spec in specs:
            index = str(spec.get("name")) if isinstance(spec, dict) else ""
            if index not in existing:
                extras.put(db, coll, index, aside.get(index, {}))
    return reply


async def _check_create(command: Mapping[str, Any], db: str, run: Run) -> None:
    """``create`` refused with mongod's codes, which callers such as converge recognise
    (mongoeco refuses both without one): a name already taken is NamespaceExists (48), a
    validator that does not parse BadValue (2) as in ``collMod``."""
    coll = command.get("create")
    if not isinstance(coll, str):
        return
    listed = await run({"listCollections": 1, "filter": {"name": coll}, "nameOnly": True})
    if listed["cursor"]["firstBatch"]:
        raise Refused(48, "NamespaceExists", f"Collection {db}.{coll} already exists.")
    if isinstance(command.get("validator"), Mapping):
        await check_validator(run, coll, command["validator"])


async def _reshape_listing(
    name: str, command: Mapping[str, Any], cursor: dict[str, Any], db: str, run: Run,
    extras: IndexExtras,
) -> None:
    """A ``listIndexes``/``listCollections`` first batch as mongod lists it."""
    batch = cursor.get("firstBatch")
    if not isinstance(batch, list):
        return
    if name == "listIndexes":
        coll = command.get("listIndexes")
        cursor["firstBatch"] = [mongod_index(doc, extras.get(db, str(coll), doc.get("name")))
                                for doc in batch]
        return
    if command.get("nameOnly") and batch:  # the type needs the options mongoeco left out
        full = await run({"listCollections": 1, "filter": command.get("filter") or {}})
        types = {doc.get("name"): mongod_collection(doc)["type"]
                 for doc in full["cursor"]["firstBatch"]}
        cursor["firstBatch"] = [dict(doc, type=types.get(doc.get("name"), doc.get("type")))
                                for doc in batch]
        return
    cursor["firstBatch"] = [mongod_collection(doc) for doc in batch]


def _refused(refusal: Refused) -> Exception:
    """A refusal of the layer as the error mongoeco turns into mongod's reply."""
    from mongoeco.errors import OperationFailure

    return OperationFailure(refusal.message, code=refusal.code,
                            details={"codeName": refusal.code_name, **refusal.details})


def _refusal(violation: Violation) -> Exception:
    """The error mongoeco turns into mongod's ``{ok: 0, errmsg, code, codeName}``."""
    from mongoeco.errors import OperationFailure

    return OperationFailure(violation.message, code=violation.code,
                            details={"codeName": violation.code_name})


# -- cursor ids ------------------------------------------------------------------------------


def _cursor_ids_in(command: dict[str, Any]) -> None:
    """int64 cursor ids sent back by a client, as the plain ints mongoeco's cursors are keyed by.

    mongoeco decodes an int64 into its own scalar type, which its ``getMore`` refuses.
    """
    if "getMore" in command:
        command["getMore"] = _plain_int(command["getMore"])
    elif "killCursors" in command and isinstance(command.get("cursors"), list):
        command["cursors"] = [_plain_int(cursor) for cursor in command["cursors"]]


def _plain_int(value: Any) -> Any:
    inner = getattr(value, "value", None)
    if not isinstance(value, int) and is_int(inner):
        return inner
    return value


# -- refused update statements ---------------------------------------------------------------


async def _update_without(
    original: Execute, context: Any, command: dict[str, Any], refused: list[Violation]
) -> Any:
    """Run an ``update`` batch whose statements ``refused`` names as mongod would.

    Ordered (the default): the statements before the first refused one run, then the batch
    stops with that statement's write error. Unordered: every other statement runs. Indexes in
    the reply are the client's.
    """
    statements = list(command.get("updates") or [])
    by_index = {violation.index: violation for violation in refused}
    if command.get("ordered", True):
        first = min(index for index in by_index if index is not None)
        runs, reported = list(range(first)), [by_index[first]]
    else:
        runs = [i for i in range(len(statements)) if i not in by_index]
        reported = list(refused)
    reply: dict[str, Any] = {"n": 0, "nModified": 0, "ok": 1.0}
    if runs:
        command["updates"] = [statements[i] for i in runs]
        reply = await original(context)
        if not isinstance(reply, dict) or not reply.get("ok"):
            return reply
        for key in ("upserted", "writeErrors"):
            for entry in reply.get(key) or []:
                entry["index"] = runs[entry["index"]]
        if command.get("ordered", True) and reply.get("writeErrors"):
            return reply  # the batch stopped at an earlier error, before the refused one
    errors = list(reply.get("writeErrors") or [])
    errors += [{"index": v.index, "code": v.code, "codeName": v.code_name, "errmsg": v.message}
               for v in reported]
    reply["writeErrors"] = sorted(errors, key=lambda entry: entry["index"])
    return reply


# -- mongod's $set semantics -----------------------------------------------------------------


def _merge_nested_specs(command: dict[str, Any]) -> None:
    """Rewrite nested field specs of pipeline ``$set``/``$addFields`` stages into expressions
    that merge, as mongod reads them (the update statements, ``findAndModify`` and
    ``aggregate``)."""
    pipelines: list[Any] = []
    if "update" in command and isinstance(command.get("updates"), list):
        pipelines += [s.get("u") for s in command["updates"] if isinstance(s, dict)]
    if "findAndModify" in command or "findandmodify" in command:
        pipelines.append(command.get("update"))
    if "aggregate" in command:
        pipelines.append(command.get("pipeline"))
    for pipeline in pipelines:
        if not isinstance(pipeline, list):
            continue
        for stage in pipeline:
            if not isinstance(stage, dict) or len(stage) != 1:
                continue
            name, spec = next(iter(stage.items()))
            if name in ("$set", "$addFields") and isinstance(spec, dict):
                for field, value in spec.items():
                    if is_nested_spec(value) and _plain_names(value):
                        spec[field] = _merged("$" + field, value, 0)


def _plain_names(spec: Mapping[str, Any]) -> bool:
    """Nested specs whose names hold no dot (those are left as mongoeco reads them)."""
    return all("." not in str(key) and (not is_nested_spec(value) or _plain_names(value))
               for key, value in spec.items())


def _merged(current: str, spec: Mapping[str, Any], depth: int) -> dict[str, Any]:
    """The expression mongod evaluates for ``{field: spec}``: merged into an object, applied
    to each element of an array (one level), a new object otherwise."""
    def fields(base: str) -> dict[str, Any]:
        return {key: _merged(f"{base}.{key}", value, depth + 1) if is_nested_spec(value)
                else value for key, value in spec.items()}

    def onto(base: str) -> dict[str, Any]:
        built = fields(base)
        return {"$cond": [{"$eq": [{"$type": base}, "object"]},
                          {"$mergeObjects": [base, built]}, built]}

    element = f"migronautElement{depth}"
    return {"$cond": [{"$isArray": current},
                      {"$map": {"input": current, "as": element, "in": onto("$$" + element)}},
                      onto(current)]}


# -- sharded: index bounds -------------------------------------------------------------------


def _index_bounds(command: dict[str, Any]) -> None:
    """Rewrite a ``find``'s ``min`` (inclusive) / ``max`` (exclusive) into its filter.

    The bounds are index-key tuples compared field by field in BSON order, exactly what
    ``$expr`` comparisons do (a missing field indexes as ``null``). Bounds on a hashed index
    compare hash values, which cannot be computed here: those are left alone (and ignored).
    """
    hint = command.get("hint")
    bounds = [(name, command.get(name)) for name in ("min", "max")]
    if not any(isinstance(bound, dict) for _, bound in bounds) or (
        isinstance(hint, dict) and "hashed" in hint.values()
    ):
        return
    conditions: list[Any] = []
    for name, bound in bounds:
        if isinstance(bound, dict) and bound:
            command.pop(name)
            conditions.append(_tuple_compare(list(bound.items()), "$gt" if name == "min"
                                             else "$lt", inclusive=name == "min"))
    found = command.get("filter") or {}
    command["filter"] = {"$and": [found, *({"$expr": c} for c in conditions)]}


def _tuple_compare(bound: list[tuple[str, Any]], operator: str, *, inclusive: bool) -> Any:
    """``$expr`` for "the document's key tuple is ``operator`` ``bound``" (lexicographic)."""
    def value(name: str) -> Any:
        return {"$ifNull": ["$" + name, None]}

    branches: list[Any] = []
    for index, (name, limit) in enumerate(bound):
        equal = [{"$eq": [value(prior), {"$literal": at}]} for prior, at in bound[:index]]
        branches.append({"$and": [*equal, {operator: [value(name), {"$literal": limit}]}]})
    if inclusive:
        branches.append({"$and": [{"$eq": [value(n), {"$literal": at}]} for n, at in bound]})
    return {"$or": branches}
