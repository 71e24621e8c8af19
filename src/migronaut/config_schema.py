"""The JSON Schema of ``migronaut.toml`` and ``[tool.migronaut]``, built from the config loader's
own key table (:data:`migronaut.core.config.KEYS`), the Celery executor's settings and the
declared-collection keys, so an editor (Taplo, VS Code's Even Better TOML) completes and checks
exactly what the loader accepts.

The published copy is ``docs/schema/migronaut.schema.json``; the test suite fails when it differs
from :func:`config_schema` or when a key has no description here. The schema describes the file:
keys that only a ``migronaut_config.py`` can hold (``client``, ``hooks``, ``logger``, …) are left
out, and values the loader checks beyond their type (a database name's characters, Celery's
cross-key rules) are still checked when the config loads.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from migronaut._names import DB_NAME_FORBIDDEN
from migronaut.core.config import KEYS, KeySpec
from migronaut.declared.definition import (
    DEFINITION_KEYS,
    VALIDATION_ACTIONS,
    VALIDATION_LEVELS,
)
from migronaut.declared.indexes import DIRECTIONS, INDEX_KEYS
from migronaut.declared.search import SEARCH_INDEX_KEYS, SEARCH_TYPES
from migronaut.declared.versioning import KEYS as VERSIONING_KEYS
from migronaut.executors.celery.settings import ENV, NULLABLE, RANGES, CelerySettings
from migronaut.fleet import config as fleet_config

__all__ = ["SCHEMA_ID", "config_schema", "schema_text"]

SCHEMA_ID = "https://migronaut.readthedocs.io/en/latest/schema/migronaut.schema.json"

#: One line per file key: what it does (docs/configuration.md says more).
DESCRIPTIONS: dict[str, str] = {
    "uri": "Connection string, mongodb://… or mongodb+srv://… (required unless a client is "
           "given in migronaut_config.py).",
    "db_name": "The database: no space, '.', '$', '/', '\\', '\"' or NUL, at most 63 bytes.",
    "migrations_dir": "The migrations directory, relative to the working directory; it must "
                      "exist (migronaut init creates it).",
    "migrations_collection": "The changelog collection.",
    "lock_collection": "The collection of the lock document.",
    "converge_log_collection": "The converge history; rebuilds in flight are recorded in "
                               "<name>_rebuilds.",
    "lock_ttl_seconds": "A crashed run's lock frees itself after this many seconds; the "
                        "heartbeat renews it every TTL/2.",
    "strict": "Refuse to run when an applied migration file was edited.",
    "use_transaction": "Run every migration in a transaction unless its file says otherwise.",
    "file_extensions": "Which files in migrations_dir are migrations.",
    "sequential": "migronaut create names files 0001_… instead of timestamps.",
    "template_path": "A custom template (a .py file) for migronaut create.",
    "environment": "Stamped on changelog records (default: production).",
    "on_lock_lost": "abort stops the run before its next migration when the lock is lost; "
                    "warn continues.",
    "on_out_of_order": "What to do with pending files older than the newest applied one.",
    "env_file": "The .env file to load, or false for none.",
    "ensure_indexes": "Create the changelog indexes with the first run that may write the "
                      "changelog.",
    "timeout_ms": "Per-migration timeout in milliseconds; a file's timeout_ms wins.",
    "reload_migrations": "Re-read migration files on every load (long-lived processes).",
    "connect_timeout_ms": "The driver's connectTimeoutMS: how long opening one connection may "
                          "take.",
    "server_selection_timeout_ms": "How long a command waits for a server before "
                                   "CONNECTION_FAILED (default 10000; 3000 for the CLI's "
                                   "read-only commands).",
    "client_options": "Keyword arguments for pymongo.MongoClient (they win over every other "
                      "key).",
    "celery": "The Celery executor's settings.",
    "fleet": "A fleet of tenant databases (migronaut fleet …): one tenant source — names, "
             "pattern, regex, registry or callable — or clusters, and the policy of its runs.",
    "collections": "Inline collection definitions that converge applies.",
    "collections_dir": "A directory of collection definition files (.py, .json).",
    "converge_after_up": "A bulk up converges the declared collections after its migrations, "
                         "in the same run and lock.",
    "on_search_unavailable": "Without Atlas Search, refuse the converge (fail) or skip the "
                             "declared search indexes with a warning (skip).",
    "wait_for_search_indexes": "After a real converge, wait for the declared search indexes to "
                               "be built.",
    "search_index_wait_timeout_ms": "How long that wait may take, in milliseconds.",
    "background_collection": "The collection of background migration state.",
    "background_inline": "up runs background migrations to completion.",
    "background_on_drift": "What a drift check does: reopen the migration or only report.",
    "background_drift": "How drift is detected: polling, a change stream, or both.",
    "background_shard_aware": "Shard-aware planning of background migrations.",
    "runs_collection": "Run records; their log lines go to <name>_logs.",
    "record_runs": "Record every locked run and its ctx.logger lines.",
    "log_format": "CLI log lines as text, or one JSON object per line on stderr.",
}

CELERY_DESCRIPTIONS: dict[str, str] = {
    "broker_url": "The ready app's broker (Redis or RabbitMQ amqp://).",
    "result_backend": "Where task results and states go (the broker when it is Redis); "
                      "required with RabbitMQ.",
    "queue": "The migration queue (up, down, converge, sync); no ':'.",
    "background_queue": "The background queue (default <queue>-background); must differ from "
                        "queue.",
    "slice_ms": "One background lane task's work, in milliseconds; must fit five times into "
                "the visibility timeout.",
    "poll_interval_ms": "How often a background coordinator looks again, in milliseconds.",
    "stall_ms": "After this long without progress a background migration is taken over.",
    "chain_ttl_ms": "How long a coordinator chain counts as live without renewing its "
                    "heartbeat; must exceed slice_ms.",
    "verify_interval_ms": "The verify schedule of completed background migrations, or false.",
    "max_lane_retries": "How often a failed lane task is retried before giving up.",
    "sync_interval_s": "A beat entry migronaut-sync every so many seconds, or false.",
    "lock_wait_timeout_ms": "How long a job waits in the worker for a held lock before it "
                            "retries later.",
    "visibility_timeout_s": "Redis: how long an unacknowledged task stays invisible before it "
                            "comes back.",
}

_URI_PATTERN = r"^\s*[mM][oO][nN][gG][oO][dD][bB](\+[sS][rR][vV])?://"
_COLLECTION_NAME = {"type": "string", "minLength": 1, "pattern": r"^[^$\u0000]+$",
                    "not": {"pattern": r"(^\.|\.\.|\.$|^system\.)"}}


def _class(chars: tuple[str, ...]) -> str:
    """``chars`` inside a regex character class, written so ECMA-262 (editors) and Python's
    ``re`` read it alike: only ``\\``, ``]``, ``^`` and ``-`` escaped, NUL as ``\\u0000``."""
    return "".join("\\u0000" if ch == "\x00" else "\\" + ch if ch in "\\]^-" else ch
                   for ch in chars)


def _key_schema(spec: KeySpec) -> dict[str, Any]:
    kind = spec.kind
    schema: dict[str, Any]
    if kind == "bool":
        schema = {"type": "boolean"}
    elif kind == "posint":
        schema = {"type": "integer", "minimum": 1}
    elif kind in ("str", "uri", "dbname"):
        schema = {"type": "string", "minLength": 1}
        if kind == "uri":
            schema["pattern"] = _URI_PATTERN
        if kind == "dbname":
            schema.update({"maxLength": 63, "pattern": f"^[^{_class(DB_NAME_FORBIDDEN)}]+$"})
    elif kind == "collection":
        schema = dict(_COLLECTION_NAME)
    elif kind == "enum":
        schema = {"enum": list(spec.choices)}
    elif kind == "env_file":
        schema = {"anyOf": [{"type": "string", "minLength": 1}, {"const": False}]}
    elif kind == "extensions":
        schema = {"type": "array", "minItems": 1,
                  "items": {"type": "string", "minLength": 1}}
    elif kind == "definitions":
        schema = {"type": "array", "items": _definition_schema()}
    elif spec.name == "celery":
        schema = _celery_schema()
    elif kind == "fleet":
        schema = _fleet_schema()
    else:  # client_options: pymongo's keyword arguments
        schema = {"type": "object"}
    schema["description"] = DESCRIPTIONS[spec.name] + (
        f" Environment variable: {spec.env}." if spec.env else "")
    if spec.default is not None and kind not in ("definitions", "mapping", "fleet"):
        schema["default"] = list(spec.default) if isinstance(spec.default, tuple) \
            else spec.default
    return schema


def _celery_schema() -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for field in fields(CelerySettings):
        name = field.name
        value: dict[str, Any]
        if name in RANGES:
            low, high = RANGES[name]
            value = {"type": "integer", "minimum": low, "maximum": high}
            if name in ("verify_interval_ms", "sync_interval_s"):
                value = {"anyOf": [value, {"const": False}]}
        else:
            value = {"type": "string", "minLength": 1}
            if name in ("queue", "background_queue"):
                value["pattern"] = r"^[^:\s](?:[^:]*[^:\s])?$"
        value["description"] = CELERY_DESCRIPTIONS[name] + (
            f" Environment variable: {ENV[name]}." if name in ENV else "")
        if field.default is not None and name not in NULLABLE | {"queue"}:
            value["default"] = field.default
        properties[name] = value
    return {"type": "object", "properties": properties, "additionalProperties": False}


FLEET_DESCRIPTIONS: dict[str, str] = {
    "names": "The tenants: an explicit list of database names.",
    "pattern": "The tenants: every database listDatabases shows whose name matches this glob "
               "(tenant_*).",
    "regex": "The tenants: every database listDatabases shows whose name this regular "
             "expression finds.",
    "registry": "The tenants: the field of every document of db.collection matching filter.",
    "callable": "The tenants: what module:function returns (a list of names; sync or async).",
    "clusters": "More clusters: [fleet.clusters.NAME] with uri and its own tenant source.",
    "admin_db": "The database fleet run records live in (on the first cluster).",
    "runs_collection": "The collection of fleet run records in admin_db.",
    "concurrency": "How many tenants run at once.",
    "per_cluster_concurrency": "At most this many tenants of one cluster at once.",
    "canary": "Run this many tenants first; the rest only if all of them succeed.",
    "max_failures": "Stop starting tenants after this many failures (0: at the first).",
    "order": "The order tenants start in: by name, by size (smallest first) or random.",
    "on_lock": "A tenant whose lock is held: skip it (reported locked) or wait for it.",
    "lock_wait_ms": "With on_lock = 'wait': how long one tenant may wait for its lock.",
}


def _fleet_source_schema() -> dict[str, Any]:
    db_name = {"type": "string", "minLength": 1, "maxLength": 63,
               "pattern": f"^[^{_class(DB_NAME_FORBIDDEN)}]+$"}
    return {
        "names": {"type": "array", "minItems": 1, "items": db_name},
        "pattern": {"type": "string", "minLength": 1},
        "regex": {"type": "string", "minLength": 1},
        "registry": {"type": "object", "additionalProperties": False,
                     "required": ["db", "collection", "field"],
                     "properties": {"db": db_name, "collection": dict(_COLLECTION_NAME),
                                    "field": {"type": "string", "minLength": 1},
                                    "filter": {"type": "object"}}},
        "callable": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"},
    }


def _fleet_schema() -> dict[str, Any]:
    sources = _fleet_source_schema()
    one_source = {"oneOf": [{"required": [key]} for key in fleet_config.SOURCE_KEYS]}
    policy: dict[str, Any] = {}
    for key in fleet_config.POLICY_KEYS:
        value: dict[str, Any]
        if key in fleet_config.RANGES:
            low, high = fleet_config.RANGES[key]
            value = {"type": "integer", "minimum": low, "maximum": high}
        elif key == "admin_db":
            value = dict(sources["names"]["items"])
        elif key == "runs_collection":
            value = dict(_COLLECTION_NAME)
        else:
            value = {"enum": list(fleet_config.ORDERS if key == "order"
                                  else fleet_config.ON_LOCK)}
        policy[key] = value
    cluster = {"type": "object", "additionalProperties": False, "required": ["uri"],
               "properties": {"uri": {"type": "string", "pattern": _URI_PATTERN}, **sources},
               **one_source}
    properties = {**sources, **policy, "clusters": {
        "type": "object", "minProperties": 1,
        "propertyNames": {"pattern": "^[A-Za-z0-9_-]{1,64}$", "not": {"const": "default"}},
        "additionalProperties": cluster}}
    for key, value in properties.items():
        value["description"] = FLEET_DESCRIPTIONS[key]
    defaults = fleet_config.FleetConfig(clusters=())
    for key in fleet_config.POLICY_KEYS:
        default = getattr(defaults, key)
        if default is not None:
            properties[key]["default"] = default
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "anyOf": [{"required": ["clusters"]}, *one_source["oneOf"]],
            "not": {"anyOf": [{"required": [a, b]}
                              for i, a in enumerate(fleet_config.SOURCE_KEYS)
                              for b in fleet_config.SOURCE_KEYS[i + 1:]]}}


def _closed(keys: Any, required: str, typed: dict[str, Any]) -> dict[str, Any]:
    """An object of exactly ``keys`` (what the loader knows), ``typed`` where a type is known."""
    return {"type": "object", "required": [required], "additionalProperties": False,
            "properties": {name: typed.get(name, {}) for name in keys}}


def _definition_schema() -> dict[str, Any]:
    """One inline collection definition (Python-style keys, as a config file writes them)."""
    index = _closed(INDEX_KEYS, "key", {
        "key": {"type": "object", "minProperties": 1,
                "additionalProperties": {"enum": list(DIRECTIONS)},
                "description": "Field → direction (1, -1) or type (text, hashed, 2d, 2dsphere)."},
        "name": {"type": "string", "minLength": 1},
        "unique": {"type": "boolean"}, "sparse": {"type": "boolean"},
        "hidden": {"type": "boolean"}, "background": {"type": "boolean"},
        "expireAfterSeconds": {"type": "integer", "minimum": 0},
        "partialFilterExpression": {"type": "object"}, "collation": {"type": "object"},
        "wildcardProjection": {"type": "object"}, "weights": {"type": "object"},
        "default_language": {"type": "string"}, "language_override": {"type": "string"},
    })
    search = _closed(SEARCH_INDEX_KEYS, "definition", {
        "name": {"type": "string", "minLength": 1}, "type": {"enum": list(SEARCH_TYPES)},
        "definition": {"type": "object"}})
    versioning = _closed(VERSIONING_KEYS["python"], "current", {
        "current": {"type": "integer", "minimum": 1}, "min": {"type": "integer", "minimum": 1}})
    return _closed(DEFINITION_KEYS["python"].values(), "name", {
        "name": dict(_COLLECTION_NAME, description="The collection's name."),
        "indexes": {"type": "array", "items": index},
        "search_indexes": {"type": "array", "items": search},
        "validator": {"type": "object"},
        "validation_level": {"enum": list(VALIDATION_LEVELS)},
        "validation_action": {"enum": list(VALIDATION_ACTIONS)},
        "prune": {"type": "boolean"},
        "versioning": versioning,
    })


def config_schema() -> dict[str, Any]:
    """The schema of one config table: a ``migronaut.toml`` file, or ``[tool.migronaut]``."""
    properties = {spec.name: _key_schema(spec) for spec in KEYS if spec.kind != "code"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "migronaut configuration",
        "description": "migronaut.toml, or the [tool.migronaut] table of pyproject.toml.",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def schema_text() -> str:
    """The published file's text: stable key order, two-space indents, a final newline."""
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"
