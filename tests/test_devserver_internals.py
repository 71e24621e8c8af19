"""mongoeco's private surface, where the dev server's one module over it expects to find it.

``migronaut.devserver.mongoeco_internals`` is the only module that names mongoeco's internals.
Each test below checks one of them on the installed mongoeco — that it is there, of the kind and
with the parameters the module passes — so an upgrade that moves or reshapes one fails here,
naming it, instead of in the middle of a served command. Then the hooks are run in-process, and
the version guard that refuses a mongoeco release line the module was not written against.

In-process, on Python 3.13+ with mongoeco installed; skipped otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.markers import needs_embedded
from migronaut.errors import EXIT_CODES, ConfigInvalidError

pytestmark = needs_embedded

ANY_VERSION = "MIGRONAUT_DEVSERVER_ANY_MONGOECO"


def parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(function).parameters)


def takes(function: Callable[..., Any], *positional: str, keywords: tuple[str, ...] = ()) -> bool:
    """``function`` takes ``positional`` first, in that order, and each of ``keywords`` by
    name."""
    found = parameters(function)
    first = [name for name, parameter in found.items()
             if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)]
    by_name = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return first[: len(positional)] == list(positional) and all(
        name in found and found[name].kind in by_name for name in keywords)


def new_server(engine: Any = None) -> Any:
    from mongoeco.wire import AsyncMongoEcoProxyServer

    return AsyncMongoEcoProxyServer(engine=engine, host="127.0.0.1", port=0,
                                    pymongo_profile="auto-installed")


# ------------------------------------------------------------ the names, on the installed mongoeco


def test_the_proxy_server_keeps_its_command_executor() -> None:
    executor = getattr(new_server(), "_executor", None)

    assert executor is not None, "mongoeco moved AsyncMongoEcoProxyServer._executor"


def test_the_executor_runs_a_prepared_context() -> None:
    execute = getattr(new_server()._executor, "execute_prepared", None)

    assert execute is not None, "mongoeco moved WireCommandExecutor.execute_prepared"
    assert inspect.iscoroutinefunction(execute), "execute_prepared is no longer a coroutine"
    assert takes(execute, "context"), f"execute_prepared now takes {parameters(execute)}"


def test_the_executor_builds_request_contexts_from_a_body_and_a_connection() -> None:
    prepare = getattr(new_server()._executor, "_build_request_context", None)

    assert prepare is not None, "mongoeco moved WireCommandExecutor._build_request_context"
    assert not inspect.iscoroutinefunction(prepare), "_build_request_context became a coroutine"
    assert takes(prepare, "body", keywords=("connection",)), (
        f"_build_request_context now takes {parameters(prepare)}")


def test_the_executor_says_which_commands_mongoeco_serves() -> None:
    surface = getattr(new_server()._executor, "_surface", None)
    supports = getattr(surface, "supports_command", None)

    assert supports is not None, "mongoeco moved WireCommandExecutor._surface.supports_command"
    assert takes(supports, "command_name"), f"supports_command now takes {parameters(supports)}"
    assert supports("find") is True
    assert supports("collMod") is False  # the layer serves it


def test_the_executor_reaches_the_engine_through_its_client() -> None:
    from mongoeco.engines import MemoryEngine

    client = getattr(new_server()._executor, "_client", None)

    assert client is not None, "mongoeco moved WireCommandExecutor._client"
    assert isinstance(getattr(client, "_engine", None), MemoryEngine), (
        "mongoeco moved the client's _engine")


def test_a_request_context_is_a_dataclass_with_the_fields_the_layer_reads() -> None:
    prepare = new_server()._executor._build_request_context
    context_type = typing.get_type_hints(prepare)["return"]
    fields = {field.name for field in dataclasses.fields(context_type)}

    assert dataclasses.is_dataclass(context_type), f"{context_type} is no dataclass any more"
    missing = {"command_name", "command_document", "raw_body", "db_name", "connection"} - fields
    assert missing == set(), f"mongoeco's request context lost {sorted(missing)}"


def test_the_memory_engine_keeps_collection_options_under_a_lock() -> None:
    from mongoeco.engines import MemoryEngine

    engine = MemoryEngine()

    assert isinstance(getattr(engine, "_collection_options", None), dict), (
        "mongoeco moved MemoryEngine._collection_options")
    assert takes(engine._get_lock, "db", "coll"), (
        f"MemoryEngine._get_lock now takes {parameters(engine._get_lock)}")
    lock = engine._get_lock("db", "coll")
    assert hasattr(lock, "__aenter__") and hasattr(lock, "__aexit__"), (
        "MemoryEngine._get_lock no longer returns an async context manager")


def test_the_sqlite_engine_runs_blocking_work_on_its_connection(tmp_path: Path) -> None:
    from mongoeco.engines import SQLiteEngine

    engine = SQLiteEngine(str(tmp_path / "data.sqlite"))

    assert not hasattr(engine, "_collection_options"), (
        "SQLiteEngine grew a memory option store: set_collection_options would write there")
    assert hasattr(engine._lock, "__enter__") and hasattr(engine._lock, "__exit__"), (
        "SQLiteEngine._lock is no longer a lock")
    assert takes(engine._require_connection, "context"), (
        f"SQLiteEngine._require_connection now takes {parameters(engine._require_connection)}")
    assert inspect.iscoroutinefunction(engine._run_blocking), (
        "SQLiteEngine._run_blocking is no longer a coroutine")
    assert takes(engine._run_blocking, "func"), (
        f"SQLiteEngine._run_blocking now takes {parameters(engine._run_blocking)}")


def test_the_json_encoder_of_stored_options() -> None:
    from mongoeco.core.json_compat import json_dumps_compact

    assert takes(json_dumps_compact, "value", keywords=("sort_keys",))
    assert json_dumps_compact({"b": 1, "a": 2}, sort_keys=True) == '{"a":2,"b":1}'


def test_the_in_memory_aggregation() -> None:
    from mongoeco.core.aggregation.stages import apply_pipeline

    assert takes(apply_pipeline, "documents", "pipeline")


# ---------------------------------------------------------------------- the hooks, in process


# -- the indexed memory engine: what it overrides, calls and replaces

#: MemoryEngine methods the indexed engine overrides or calls, with the parameters it passes.
ENGINE_METHODS = {
    "_storage_key": (("self", "value"), ()),
    "_index_keys": (("self", "document", "fields"), ()),
    "_unique_index_keys": (("self", "document", "fields"), ()),
    "_index_equality_key": (("value",), ()),
    "_validate_compound_multikey_shape": (("self", "document", "index"), ()),
    "_unique_key_error": (("self", "message", "namespace", "document"), ("index", "conflict")),
    "_ensure_unique_indexes": (("self", "db_name", "coll_name", "candidate"), (
        "exclude_storage_key", "indexes_view", "storage_view", "index_data_view",
        "check_id_storage", "scan_payload_id")),
    "_candidate_items_for_plan_locked": (("self", "coll", "query_plan"), (
        "dialect", "indexes", "index_data", "collation")),
    "_indexed_candidate_storage_keys_for_plan_locked": (
        ("self", "indexes", "index_data", "query_plan"), ("dialect", "collation")),
    "_storage_view": (("self", "context"), ()),
    "_indexes_view": (("self", "context"), ()),
    "_index_data_view": (("self", "context"), ()),
    "_get_lock": (("self", "db", "coll"), ()),
    "_purge_expired_documents_locked": (("self", "db_name", "coll_name"), (
        "context", "indexes_view", "index_data_view", "storage_view", "now")),
    "_is_profile_namespace": (("self", "coll_name"), ()),
    "_borrow_storage_document": (("self", "payload"), ()),
    "scan_find_semantics": (("self", "db_name", "coll_name", "semantics"), ("context",)),
    "count_find_semantics": (("self", "db_name", "coll_name", "semantics"), (
        "context", "operation_context")),
    "create_index": (("self", "db_name", "coll_name", "keys"), ("unique", "name", "context")),
    "drop_index": (("self", "db_name", "coll_name"), ("context",)),
    # mongoeco's methods that scan for a numeric _id its typed key missed
    "_insert_documents_impl": (("self", "db_name", "coll_name", "documents"), ()),
    "get_document": (("self", "db_name", "coll_name", "doc_id"), ()),
    "delete_document": (("self", "db_name", "coll_name"), ()),
    "merge_document": (("self", "db_name", "coll_name"), ()),
    "update_with_operation": (("self", "db_name", "coll_name"), ()),
    "delete_with_operation": (("self", "db_name", "coll_name"), ()),
}


@pytest.mark.parametrize("name", sorted(ENGINE_METHODS))
def test_the_memory_engine_methods_the_indexed_engine_overrides_or_calls(name: str) -> None:
    from mongoeco.engines.memory import MemoryEngine

    method = getattr(MemoryEngine, name, None)
    positional, keywords = ENGINE_METHODS[name]
    assert method is not None, f"mongoeco moved MemoryEngine.{name}"
    assert takes(method, *positional, keywords=keywords), (
        f"MemoryEngine.{name} now takes {parameters(method)}")


def test_the_memory_engine_module_names_the_indexed_engine_replaces_or_calls() -> None:
    import mongoeco.engines.memory as memory
    from mongoeco.engines._memory_collection import MemoryCollection

    for name in ("id_contains_numeric_value", "document_in_virtual_index",
                 "normalize_index_keys", "default_index_name", "index_build_duplicate_error",
                 "deepcopy"):
        assert callable(getattr(memory, name, None)), f"mongoeco.engines.memory lost {name}"
    assert memory.MemoryCollection is MemoryCollection or issubclass(
        memory.MemoryCollection, MemoryCollection)
    for name in ("_values", "_snapshot_state", "_restore_state", "replace_key", "copy",
                 "ordered_keys", "items"):
        assert hasattr(MemoryCollection(), name), f"MemoryCollection lost {name}"
    assert len(MemoryCollection()._snapshot_state()) == 8, "MemoryCollection's state changed"


def test_the_query_plan_nodes_the_indexed_engine_reads() -> None:
    from mongoeco.core import query_plan

    for name in ("AndCondition", "EqualsCondition", "InCondition", "MatchAll",
                 "GreaterThanCondition", "GreaterThanOrEqualCondition", "LessThanCondition",
                 "LessThanOrEqualCondition"):
        assert hasattr(query_plan, name), f"mongoeco.core.query_plan lost {name}"
    assert [f.name for f in dataclasses.fields(query_plan.GreaterThanCondition)] == [
        "field", "value"]
    assert "clauses" in {f.name for f in dataclasses.fields(query_plan.AndCondition)}


def test_the_find_semantics_the_indexed_engine_reads_and_replaces() -> None:
    from mongoeco.engines.semantic_core import EngineFindSemantics

    fields = {field.name for field in dataclasses.fields(EngineFindSemantics)}
    assert {"query_plan", "sort", "skip", "limit", "collation", "text_query", "hint",
            "variables"} <= fields


def test_the_insert_command_the_indexed_engine_batches() -> None:
    from mongoeco.api._async import _database_admin_write_commands as commands
    from mongoeco.api._async.database_admin import AsyncDatabaseAdminService
    from mongoeco.errors import BulkWriteError
    from mongoeco.types import WriteCommandResult, WriteErrorEntry

    service = commands.DatabaseAdminWriteCommandService
    assert takes(service.command_insert, "self", "spec", keywords=("session",))
    for name in ("command_boolean", "write_command_acknowledged", "_write_command_result"):
        assert callable(getattr(commands, name, None)), f"the write commands lost {name}"
    for name in ("_require_collection_name", "_normalize_insert_documents",
                 "_normalize_ordered_from_command"):
        assert callable(getattr(AsyncDatabaseAdminService, name, None)), f"admin lost {name}"
    assert {"index", "errmsg", "code", "details"} <= {
        f.name for f in dataclasses.fields(WriteErrorEntry)}
    assert {"count", "write_errors"} <= {f.name for f in dataclasses.fields(WriteCommandResult)}
    assert "details" in dir(BulkWriteError("x", details={}))


def test_the_modules_whose_deepcopy_the_indexed_engine_replaces() -> None:
    from migronaut.devserver import mongoeco_internals

    for name in mongoeco_internals._DEEPCOPY_USERS:
        module = importlib.import_module(name)
        assert callable(getattr(module, "deepcopy", None)), f"{name} no longer uses deepcopy"


def test_the_update_codec_the_indexed_engine_replaces() -> None:
    from mongoeco.api._async import _collection_modify
    from mongoeco.core import bson_scalars, codec

    assert issubclass(_collection_modify.DocumentCodec, codec.DocumentCodec), (
        "mongoeco.api._async._collection_modify no longer uses DocumentCodec")
    for name in ("to_internal", "is_internal"):
        assert callable(getattr(codec.DocumentCodec, name, None)), f"DocumentCodec lost {name}"
    assert issubclass(codec._InternalBsonDocument, dict), "codec lost _InternalBsonDocument"
    assert issubclass(codec._InternalBsonArray, list), "codec lost _InternalBsonArray"
    made = codec.DocumentCodec.to_internal({"a": [{"b": 1}]})
    assert (type(made), type(made["a"]), type(made["a"][0])) == (
        codec._InternalBsonDocument, codec._InternalBsonArray, codec._InternalBsonDocument)
    assert callable(getattr(codec, "validate_bson_value", None))
    for name in ("normalize_utc_bson_datetime", "BsonInt32", "BsonInt64", "BsonDouble"):
        assert getattr(bson_scalars, name, None) is not None, f"bson_scalars lost {name}"
    for name in ("BsonInt32", "BsonInt64", "BsonDouble"):  # shared, not copied: immutable
        params = getattr(getattr(bson_scalars, name), "__dataclass_params__", None)
        assert params is not None and params.frozen, f"{name} is no longer a frozen dataclass"


def test_the_update_plan_compilation_the_indexed_engine_replaces() -> None:
    from mongoeco.api import operations
    from mongoeco.core.operators import CompiledUpdatePipelinePlan, UpdateEngine
    from mongoeco.types import PlanningMode

    options = ("dialect", "selector_filter", "collation", "array_filters", "variables")
    assert takes(operations._compile_update_plans, "update_spec",
                 keywords=(*options, "planning_mode")), (
        f"_compile_update_plans now takes {parameters(operations._compile_update_plans)}")
    assert takes(UpdateEngine.compile_update_plan, "update_spec",
                 keywords=(*options, "is_upsert_insert"))
    assert takes(UpdateEngine.build_execution_context,
                 keywords=("dialect", "collation", "selector_filter", "array_filters",
                           "is_upsert_insert"))
    assert PlanningMode.RELAXED and callable(operations.OperationFailure)
    fields = {field.name for field in dataclasses.fields(CompiledUpdatePipelinePlan)}
    assert fields == {"update_spec", "context", "compiled_pipeline"}, (
        f"CompiledUpdatePipelinePlan now holds {sorted(fields)}")
    # what a pipeline's compilation reads of its context: never is_upsert_insert
    source = inspect.getsource(UpdateEngine.compile_update_pipeline_plan)
    assert "is_upsert_insert" not in source, "a pipeline's compilation now reads the upsert flag"


def test_the_indexed_engine_serves_a_client() -> None:
    from mongoeco import MongoClient

    from migronaut.devserver.mongoeco_internals import indexed_memory_engine

    client = MongoClient(indexed_memory_engine())
    try:
        coll = client.get_database("hooks").get_collection("ids")
        coll.insert_many([{"_id": n} for n in (3, 1, 2)])
        assert [doc["_id"] for doc in coll.find({"_id": {"$gt": 1}}).sort("_id", -1)] == [3, 2]
        assert coll.count_documents({}) == 3
    finally:
        client.close()


def test_the_hooks_run_a_command_straight_in_mongoeco() -> None:
    from migronaut.devserver.mongoeco_internals import CommandHooks

    hooks = CommandHooks(new_server())
    connection_type = typing.get_type_hints(hooks.prepare)["connection"]
    connection = connection_type(connection_id=1)
    context = hooks.prepare({"ping": 1, "$db": "admin"}, connection=connection)

    request = hooks.request(context)
    assert request is not None
    assert (request.name, request.command, request.db) == ("ping", {"ping": 1}, "admin")
    assert request.connection is connection and request.starts_transaction is False
    assert asyncio.run(hooks.original_execute(context)) == {"ok": 1.0}


def test_a_served_context_names_the_command_the_layer_serves() -> None:
    from migronaut.devserver.mongoeco_internals import CommandHooks

    hooks = CommandHooks(new_server())
    connection = typing.get_type_hints(hooks.prepare)["connection"](connection_id=1)

    context = hooks.served_context({"$db": "shop"}, "collMod", {"collMod": "orders"},
                                   connection=connection)

    request = hooks.request(context)
    assert request is not None
    assert (request.name, request.command, request.db) == (
        "collMod", {"collMod": "orders"}, "shop")


def test_the_proxy_server_dispatches_each_request_from_its_header_and_payload() -> None:
    from mongoeco.wire.protocol import parse_message_header

    dispatch = getattr(new_server(), "_dispatch_wire_request", None)

    assert dispatch is not None, "mongoeco moved AsyncMongoEcoProxyServer._dispatch_wire_request"
    assert inspect.iscoroutinefunction(dispatch), "_dispatch_wire_request is no longer a coroutine"
    assert takes(dispatch, "header", "payload", keywords=("connection",)), \
        f"_dispatch_wire_request now takes {parameters(dispatch)}"
    header = parse_message_header((16).to_bytes(4, "little") + (7).to_bytes(4, "little")
                                  + bytes(4) + (2013).to_bytes(4, "little"))
    assert header.op_code == 2013, "a parsed header no longer names its op code as op_code"


def test_routed_requests_are_answered_through_the_router() -> None:
    from pymongo import MongoClient

    from migronaut.devserver.engine_loop import MONITORING
    from migronaut.devserver.mongoeco_internals import route_requests

    seen: list[tuple[int, str | None]] = []

    async def router(op_code: int, payload: bytes, request: Any) -> Any:
        from migronaut.devserver.engine_loop import command_name

        seen.append((op_code, command_name(op_code, payload)))
        return await request()

    async def main() -> None:
        server = new_server()
        route_requests(server, router)
        address = await server.start()
        try:
            def ping() -> Any:
                with MongoClient(f"mongodb://{address.host}:{address.port}/?directConnection=true",
                                 serverSelectionTimeoutMS=5_000) as client:
                    return client.admin.command("ping")
            assert (await asyncio.to_thread(ping))["ok"] == 1.0
        finally:
            await server.close()

    asyncio.run(main())
    assert (2013, "ping") in seen and any(name in MONITORING for _, name in seen)


def test_routing_over_a_server_without_a_dispatch_refuses_this_mongoeco() -> None:
    from migronaut.devserver.mongoeco_internals import route_requests

    async def router(op_code: int, payload: bytes, request: Any) -> Any:
        raise AssertionError("never called")

    with pytest.raises(ConfigInvalidError) as raised:
        route_requests(object(), router)

    assert raised.value.message.startswith(
        "the dev server does not support this mongoeco version")


def test_hooks_over_a_server_without_an_executor_refuse_this_mongoeco() -> None:
    from migronaut.devserver.mongoeco_internals import CommandHooks

    with pytest.raises(ConfigInvalidError) as raised:
        CommandHooks(object())

    assert raised.value.message.startswith(
        "the dev server does not support this mongoeco version")


@pytest.mark.parametrize("persisted", [False, True], ids=["memory", "sqlite"])
def test_set_collection_options_is_what_list_collections_shows(
    persisted: bool, tmp_path: Path
) -> None:
    from mongoeco.engines import SQLiteEngine

    from migronaut.devserver.mongoeco_internals import CommandHooks, set_collection_options

    server = new_server(SQLiteEngine(str(tmp_path / "data.sqlite")) if persisted else None)
    hooks = CommandHooks(server)
    connection = typing.get_type_hints(hooks.prepare)["connection"](connection_id=1)

    async def run(body: dict[str, Any]) -> Any:
        return await hooks.original_execute(hooks.prepare(body, connection=connection))

    async def scenario() -> Any:
        await server.start()
        try:
            await run({"create": "people", "$db": "shop"})
            await set_collection_options(hooks.engine, "shop", "people",
                                         {"validator": {"age": {"$type": "int"}}})
            return await run({"listCollections": 1, "filter": {"name": "people"}, "$db": "shop"})
        finally:
            await server.close()

    listed = asyncio.run(scenario())

    assert listed["cursor"]["firstBatch"][0]["options"] == {
        "validator": {"age": {"$type": "int"}}}


def test_apply_pipeline_runs_the_stages_in_memory() -> None:
    from migronaut.devserver.mongoeco_internals import apply_pipeline

    documents = [{"name": "a", "n": 1}, {"name": "b", "n": 2}]

    assert apply_pipeline(documents, [{"$match": {"n": 2}}, {"$project": {"_id": 0}}]) == [
        {"name": "b", "n": 2}]


# ---------------------------------------------------------------------------- the version guard


def installed(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    """Make ``importlib.metadata`` report mongoeco ``version`` (``None``: not installed)."""
    real = importlib.metadata.version

    def version_of(name: str) -> str:
        if name != "mongoeco":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", version_of)


def test_the_installed_mongoeco_is_a_supported_release_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from migronaut.devserver.mongoeco_internals import SUPPORTED, check_version, installed_version

    monkeypatch.delenv(ANY_VERSION, raising=False)

    assert installed_version() == importlib.metadata.version("mongoeco")
    assert ".".join(installed_version().split(".")[:2]) in SUPPORTED
    check_version()


@pytest.mark.parametrize("version", ["4.12.0", "4.10.3", "5.0.0", "4.1.11", None])
def test_another_release_line_is_refused_naming_both_versions(
    monkeypatch: pytest.MonkeyPatch, version: str | None
) -> None:
    from migronaut.devserver.mongoeco_internals import check_version

    monkeypatch.delenv(ANY_VERSION, raising=False)
    installed(monkeypatch, version)

    with pytest.raises(ConfigInvalidError) as raised:
        check_version()

    message = raised.value.message
    assert raised.value.code == "CONFIG_INVALID"
    assert raised.value.exit_code == EXIT_CODES["CONFIG_INVALID"]
    assert "\n" not in message
    assert f"the installed {version or 'unknown'}" in message
    assert "supports mongoeco 4.11.x" in message
    assert ANY_VERSION in message


def test_the_escape_hatch_serves_any_release_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from migronaut.devserver.mongoeco_internals import check_version

    monkeypatch.setenv(ANY_VERSION, "1")
    installed(monkeypatch, "4.12.0")

    check_version()


def test_serve_refuses_another_release_line_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from migronaut import devserver

    monkeypatch.delenv(ANY_VERSION, raising=False)
    installed(monkeypatch, "4.12.0")
    ready: list[str] = []

    with pytest.raises(ConfigInvalidError) as raised:
        devserver.serve(on_ready=ready.append)

    assert "the installed 4.12.0" in raised.value.message
    assert ready == []


# ------------------------------------------------------------------------------ the boundary


def test_importing_the_dev_server_package_imports_neither_mongoeco_nor_pymongo() -> None:
    code = ("import sys, migronaut.devserver; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mongoeco', 'pymongo'}))")

    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()

    assert loaded == "[]"


def test_a_server_in_memory_does_not_import_the_sqlite_engine() -> None:
    code = ("import os, signal, sys\n"
            "from migronaut.devserver.serve import serve\n"
            "def ready(uri):\n"
            "    print(sorted(m for m in sys.modules if m.startswith('mongoeco.engines.')"
            " and 'sqlite' in m))\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "serve(port=0, on_ready=ready)\n")

    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()

    assert loaded == "[]"
