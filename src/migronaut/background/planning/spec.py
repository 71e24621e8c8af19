"""Background migration specs: validate what a file declares, resolve it to the persisted form.

A migration file defines ``background = {...}`` (a dict, snake_case keys) instead of
``up``/``down``. :func:`resolve_background` checks every key (reference background §1.3), collects
*every* problem as ``{path: 'background.<key>', message}`` and raises one
``MIGRATION_INVALID_EXPORT`` (exit 20) naming the first; otherwise it returns the resolved spec —
plain data with the Node original's camelCase field names, stored on the state document (§1.4) —
and the functions, which stay in memory.

Invariants:

* Nothing is silently defaulted over a bad value: unknown keys, ``None`` where a value is expected,
  floats or booleans where an integer is expected, and out-of-range integers are all errors.
* The persisted spec never holds a function or a value the wire cannot carry; the filter is a
  copy (tuples become lists, dict subclasses plain dicts), so later changes to the module's
  objects cannot change a registered spec.
* :func:`match_hash` changes with what changes *which documents match* (collection, versions,
  filter, field names, direction) and never with tuning settings or the filter's key order.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from bson import json_util
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from migronaut._names import OWN_PREFIX
from migronaut._suggest import snake_case, suggest
from migronaut._values import int_within, is_int
from migronaut.core.config import validate_collection_name
from migronaut.core.files import is_valid_name
from migronaut.errors import MigrationInvalidExportError

__all__ = [
    "DEFAULT_RESERVED_COLLECTIONS",
    "DIRECTIONS",
    "MAX_SAFE_INTEGER",
    "PLACEHOLDER_COLLECTION",
    "SKELETON",
    "BackgroundFunctions",
    "ResolvedBackground",
    "match_filter",
    "match_hash",
    "resolve_background",
    "validate_requires",
]

MAX_SAFE_INTEGER: Final = 2**53 - 1
PLACEHOLDER_COLLECTION: Final = "TODO"
DIRECTIONS: Final = ("forward", "revert")
#: migronaut's own collections under their default names; callers add the configured ones.
DEFAULT_RESERVED_COLLECTIONS: Final = (
    "_migronaut_migrations",
    "_migronaut_locks",
    "_migronaut_converge",
    "_migronaut_background",
    "_migronaut_background_partitions",
    "_migronaut_background_watch",
)

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_MAX_FILTER_DEPTH: Final = 100

_FUNCTION_KEYS: Final = (
    "migrate",
    "migrate_batch",
    "revert",
    "revert_batch",
    "step",
    "revert_step",
    "throttle",
)
_DECLARATIVE_KEYS: Final = (
    "from",
    "to",
    "filter",
    "migrate",
    "migrate_batch",
    "revert",
    "revert_batch",
    "version_field",
    "revision_field",
    "occ",
)
_STEP_KEYS: Final = ("step", "revert_step")
_SETTING_KEYS: Final = (
    "description",
    "batch_size",
    "pause_ms",
    "slice_ms",
    "write_concern",
    "max_document_errors",
    "max_passes",
    "max_conflict_retries",
    "max_slice_failures",
    "max_outage_ms",
    "max_replication_lag_ms",
    "throttle",
    "max_parallel",
    "shard_concurrency",
    "partitions",
    "transaction",
    "adaptive",
)
_KNOWN_KEYS: Final = frozenset(("collection", *_DECLARATIVE_KEYS, *_STEP_KEYS, *_SETTING_KEYS))
_OCC_VALUES: Final = ("revision", "version-only")

# (key, camelCase name, default, low, high)
_INT_SETTINGS: Final = (
    ("pause_ms", "pauseMs", 100, 0, 3_600_000),
    ("slice_ms", "sliceMs", 30_000, 1_000, 3_600_000),
    ("max_document_errors", "maxDocumentErrors", 0, 0, 1000),
    ("max_passes", "maxPasses", 10, 1, 1000),
    ("max_conflict_retries", "maxConflictRetries", 3, 0, 100),
    ("max_slice_failures", "maxSliceFailures", 3, 1, 100),
    ("max_outage_ms", "maxOutageMs", 300_000, 0, 86_400_000),
)
_PARTITION_KEYS: Final = ("over_partition", "max_partitions", "min_partition_docs", "sample_size")
_TRANSACTION_KEYS: Final = ("timeout_ms", "max_retries")
_ADAPTIVE_KEYS: Final = ("target_latency_ms", "min_batch_size", "max_batch_size", "max_pause_ms")
_WRITE_CONCERN_KEYS: Final = ("w", "j", "wtimeout", "fsync")

_SERVER_JS_OPERATORS: Final = frozenset(("$where", "$function", "$accumulator"))
_LOGICAL_OPERATORS: Final = frozenset(("$and", "$or", "$nor"))


# ------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class BackgroundFunctions:
    """The user functions of a background migration; ``None`` when the file does not define one.

    Each may be a plain function or an ``async def``; callers decide how to run them.
    """

    migrate: Callable[..., Any] | None = None
    migrate_batch: Callable[..., Any] | None = None
    revert: Callable[..., Any] | None = None
    revert_batch: Callable[..., Any] | None = None
    step: Callable[..., Any] | None = None
    revert_step: Callable[..., Any] | None = None
    throttle: Callable[..., Any] | None = None

    def transform(self, direction: str) -> tuple[Callable[..., Any] | None, bool]:
        """The declarative transform for ``direction`` and whether it takes a batch of documents."""
        _check_direction(direction)
        if direction == "forward":
            return (self.migrate, False) if self.migrate is not None else (self.migrate_batch, True)
        if self.revert is not None:
            return self.revert, False
        return self.revert_batch, self.revert_batch is not None

    def step_for(self, direction: str) -> Callable[..., Any] | None:
        """The step function for ``direction`` (``revert_step`` going back)."""
        _check_direction(direction)
        return self.step if direction == "forward" else self.revert_step


@dataclass(frozen=True)
class ResolvedBackground:
    """A validated declaration: the persisted ``spec`` and the in-memory ``functions``."""

    spec: dict[str, Any]
    functions: BackgroundFunctions

    @property
    def mode(self) -> str:
        return str(self.spec["mode"])


# ------------------------------------------------------------------------------------ helpers


def _show(value: Any) -> str:
    """A short description of a *setting* value for messages (never used for document data)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"
    return f"a {type(value).__name__}"


def _field_name_problem(value: Any) -> str | None:
    if (
        not isinstance(value, str)
        or not value
        or value.startswith("$")
        or "." in value
        or "\x00" in value
        or value == "_id"
    ):
        return (
            "must be a top-level field name: a non-empty string without '.', a leading '$' or "
            f"NUL, and not '_id' (got {_show(value)})"
        )
    return None


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'forward' or 'revert', got {direction!r}")


class _Issues:
    """Collects ``{path, message}`` problems in the order they are found."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append({"path": path, "message": message})

    def integer(self, path: str, value: Any, low: int, high: int | None, default: int) -> int:
        """``value`` when it is an integer in ``low..high`` (inclusive), else an issue + default."""
        if is_int(value) and low <= value <= (MAX_SAFE_INTEGER if high is None else high):
            return int(value)
        if high is None:
            self.add(path, f"must be a safe integer ≥ {low}, got {_show(value)}")
        else:
            self.add(path, f"must be an integer from {low} to {high}, got {_show(value)}")
        return default

    def unknown_keys(self, base: str, value: Mapping[Any, Any], known: Sequence[str]) -> None:
        for key in value:
            if key not in known:
                self.add(f"{base}.{key}", "unknown key" + _suggest(key, known))


def _suggest(key: Any, known: Collection[str]) -> str:
    if not isinstance(key, str):
        return f" (keys are strings, got {_show(key)})"
    close = suggest(key, known, cutoff=0.75)
    if close is not None and close == snake_case(key) != key:
        return f" — did you mean '{close}'? (keys are snake_case)"
    return f" — did you mean '{close}'?" if close else ""


# ------------------------------------------------------------------------------------ filter


def _filter_problem(value: Any, loc: str, depth: int) -> str | None:
    """Why ``value`` cannot travel in a query (or run safely there), or ``None``.

    ``loc`` names where, for the message (``$or[0].a``); filter values are the author's query,
    not document data, so they may be named.
    """
    if depth > _MAX_FILTER_DEPTH:
        return f"is nested too deeply (more than {_MAX_FILTER_DEPTH} levels, at {loc})"
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"has a key that is not a string ({_show(key)} at {loc or 'the top'})"
            if "\x00" in key:
                return f"has a key containing NUL (at {loc or 'the top'})"
            here = f"{loc}.{key}" if loc else key
            if key in _SERVER_JS_OPERATORS:
                return f"must not run server-side JavaScript ({key} at {here})"
            problem = _filter_problem(item, here, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = _filter_problem(item, f"{loc}[{index}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, Code):
        return f"must not run server-side JavaScript (bson.Code at {loc or 'the top'})"
    if value is None or isinstance(value, (bool, str, float, bytes, ObjectId, Decimal128)):
        return None
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            return None
        return f"holds an integer outside the 64-bit range (at {loc})"
    if isinstance(
        value, (_dt.datetime, DatetimeMS, re.Pattern, Regex, Timestamp, MinKey, MaxKey, DBRef)
    ):
        return None
    if isinstance(value, uuid.UUID):
        return (
            f"holds a uuid.UUID (at {loc}); use bson.binary.Binary.from_uuid(...) so the "
            "encoding does not depend on the client's uuidRepresentation"
        )
    if callable(value):
        return f"holds a function (at {loc}); a filter must be plain data"
    hint = " (use bson.Decimal128)" if type(value).__name__ == "Decimal" else ""
    return f"holds a {type(value).__name__} (at {loc}), which is not a BSON value{hint}"


def _copy_filter(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy_filter(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy_filter(item) for item in value]
    return value


def _expr_mentions(value: Any, field: str) -> bool:
    """Whether an aggregation expression refers to ``$<field>`` (or a path below it)."""
    if isinstance(value, str):
        return value == "$" + field or value.startswith("$" + field + ".")
    if isinstance(value, Mapping):
        return any(_expr_mentions(item, field) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_expr_mentions(item, field) for item in value)
    return False


def _query_mentions(query: Mapping[str, Any], field: str) -> bool:
    """Whether a query document constrains ``field`` (top level, ``$and/$or/$nor``, ``$expr``)."""
    prefix = field + "."
    for key, value in query.items():
        if key == field or key.startswith(prefix):
            return True
        if key in _LOGICAL_OPERATORS and isinstance(value, (list, tuple)):
            if any(isinstance(q, Mapping) and _query_mentions(q, field) for q in value):
                return True
        elif key == "$expr" and _expr_mentions(value, field):
            return True
        elif key == "$jsonSchema" and isinstance(value, Mapping):
            properties = value.get("properties")
            required = value.get("required")
            if (isinstance(properties, Mapping) and field in properties) or (
                isinstance(required, (list, tuple)) and field in required
            ):
                return True
    return False


# ------------------------------------------------------------------------------------ resolve


def resolve_background(
    name: str,
    declared: Any,
    *,
    reserved_collections: Collection[str] = (),
    collection_versioning: Mapping[str, Any] | None = None,
) -> ResolvedBackground:
    """Validate a file's ``background`` declaration and resolve it (reference §1.3–§1.4).

    ``reserved_collections`` are migronaut's own collection names as configured (the defaults in
    :data:`DEFAULT_RESERVED_COLLECTIONS` are always reserved). ``collection_versioning`` is the
    target collection's declared versioning ``{field, current, revision_field}`` when it has one
    (``revision_field`` missing = ``'__rev'``; ``None`` or ``revision: False`` = no revisions).

    Raises ``MigrationInvalidExportError`` whose ``context['issues']`` lists every problem.
    """
    issues = _Issues()
    if not isinstance(declared, Mapping):
        issues.add("background", f"must be a dict of settings, got {_show(declared)}")
        _raise(name, issues)
    step_mode = "step" in declared

    for key in declared:
        if key in _KNOWN_KEYS:
            continue
        if key == "partitioner":
            issues.add(
                "background.partitioner",
                "is not supported yet — partitions follow _id (or the shard key) automatically",
            )
        else:
            issues.add(f"background.{key}", "unknown key" + _suggest(key, _KNOWN_KEYS))

    def given(key: str) -> bool:
        return key in declared

    functions: dict[str, Callable[..., Any] | None] = {}
    for key in _FUNCTION_KEYS:
        if not given(key):
            continue
        value = declared[key]
        if callable(value):
            functions[key] = value
        else:
            issues.add(f"background.{key}", f"must be a function, got {_show(value)}")

    collection: str | None = None
    if given("collection"):
        collection = _check_collection(declared["collection"], reserved_collections, issues)
    elif not step_mode:
        issues.add("background.collection", "is required: the collection to rewrite")

    settings = _resolve_settings(declared, step_mode, issues)

    spec: dict[str, Any]
    if step_mode:
        for key in _DECLARATIVE_KEYS:
            if given(key):
                issues.add(
                    f"background.{key}",
                    "is a declarative key — a step owns its own writes (remove it, or drop step)",
                )
        spec = {"mode": "step"}
        if collection is not None:
            spec["collection"] = collection
        spec["reversible"] = given("revert_step")
    else:
        if given("revert_step"):
            issues.add("background.revert_step", "is only for step migrations (there is no step)")
        spec = _resolve_declarative(declared, collection, collection_versioning, issues)
    if "description" in settings:
        spec["description"] = settings.pop("description")
    spec.update(settings)

    if issues.items:
        _raise(name, issues)
    return ResolvedBackground(
        spec=spec,
        functions=BackgroundFunctions(**{k: functions.get(k) for k in _FUNCTION_KEYS}),
    )


def _raise(name: str, issues: _Issues) -> NoReturn:
    first = issues.items[0]
    raise MigrationInvalidExportError(
        f"Invalid background migration {name}: {first['path']} {first['message']}",
        {"issues": issues.items},
    )



def _check_collection(
    value: Any, reserved_collections: Collection[str], issues: _Issues
) -> str | None:
    problem = validate_collection_name(value)
    if problem:
        issues.add("background.collection", f"{problem} (got {_show(value)})")
        return None
    if value == PLACEHOLDER_COLLECTION:
        issues.add(
            "background.collection",
            "is still the 'TODO' placeholder from the skeleton — name the collection to rewrite",
        )
        return None
    if value in DEFAULT_RESERVED_COLLECTIONS or value in reserved_collections \
            or value.startswith(OWN_PREFIX):
        issues.add(
            "background.collection",
            f"'{value}' is one of migronaut's own collections — background migrations rewrite "
            "application data only",
        )
        return None
    return str(value)


def _resolve_declarative(
    declared: Mapping[str, Any],
    collection: str | None,
    versioning: Mapping[str, Any] | None,
    issues: _Issues,
) -> dict[str, Any]:
    # from / to
    bounds: dict[str, int | None] = {}
    for key in ("from", "to"):
        if key not in declared:
            issues.add(f"background.{key}", "is required: a version number (safe integer ≥ 0)")
            bounds[key] = None
            continue
        value = declared[key]
        if int_within(value, 0, MAX_SAFE_INTEGER):
            bounds[key] = int(value)
        else:
            issues.add(f"background.{key}", f"must be a safe integer ≥ 0, got {_show(value)}")
            bounds[key] = None
    start, end = bounds["from"], bounds["to"]
    if start is not None and end is not None and end <= start:
        issues.add(
            "background.to",
            f"must be greater than from ({start}) — the way back is revert, never to < from",
        )

    # functions
    has_migrate, has_batch = "migrate" in declared, "migrate_batch" in declared
    if has_migrate and has_batch:
        issues.add("background.migrate_batch", "give either migrate or migrate_batch, not both")
    elif not has_migrate and not has_batch:
        issues.add(
            "background.migrate",
            "is required: a migrate(doc, ctx) or migrate_batch(docs, ctx) function",
        )
    if "revert" in declared and "revert_batch" in declared:
        issues.add("background.revert_batch", "give either revert or revert_batch, not both")

    # occ and field names
    occ = declared.get("occ", "revision")
    if occ not in _OCC_VALUES:
        issues.add("background.occ", f"must be 'revision' or 'version-only', got {_show(occ)}")
        occ = "revision"

    field = "__v"
    revision_field: str | None = "__rev"
    declared_revision: str | None = "__rev"
    if versioning is not None:
        field = str(versioning.get("field") or "__v")
        declared_revision = _declared_revision_field(versioning)
        revision_field = declared_revision

    if "version_field" in declared:
        value = declared["version_field"]
        problem = _field_name_problem(value)
        if problem:
            issues.add("background.version_field", problem)
        elif versioning is not None and value != field:
            issues.add(
                "background.version_field",
                f"must equal the collection's versioning field '{field}', got {_show(value)}",
            )
        else:
            field = value
    if "revision_field" in declared:
        value = declared["revision_field"]
        problem = _field_name_problem(value)
        if occ == "version-only":
            issues.add(
                "background.revision_field",
                "has no effect with occ 'version-only' — remove it, or use occ 'revision'",
            )
        elif problem:
            issues.add("background.revision_field", problem)
        elif versioning is not None and declared_revision is None:
            issues.add(
                "background.revision_field",
                "cannot be used: the collection's versioning declares no revision field "
                "(use occ 'version-only')",
            )
        elif versioning is not None and value != declared_revision:
            issues.add(
                "background.revision_field",
                f"must equal the collection's revision field '{declared_revision}', "
                f"got {_show(value)}",
            )
        else:
            revision_field = value
    if occ == "version-only":
        revision_field = None
    elif revision_field is None and "revision_field" not in declared:
        # only reachable through a versioning declaration without revisions
        issues.add(
            "background.occ",
            "must be 'version-only': the collection's versioning declares no revision field",
        )
    if revision_field is not None and revision_field == field:
        issues.add("background.revision_field", f"must differ from the version field '{field}'")

    if versioning is not None and end is not None:
        current = versioning.get("current")
        if is_int(current) and end > current:
            issues.add(
                "background.to",
                f"must not exceed the collection's versioning.current ({current}) — "
                "raise current first",
            )

    # filter
    query: dict[str, Any] = {}
    if "filter" in declared:
        value = declared["filter"]
        if not isinstance(value, dict):
            issues.add("background.filter", f"must be a plain dict (a query), got {_show(value)}")
        else:
            problem = _filter_problem(value, "", 0)
            if problem:
                issues.add("background.filter", problem)
            elif _query_mentions(value, field):
                issues.add(
                    "background.filter",
                    f"must not mention the version field '{field}' — from and to constrain it",
                )
            else:
                query = _copy_filter(value)

    return {
        "mode": "declarative",
        "collection": collection,
        "from": start,
        "to": end,
        "filter": query,
        "field": field,
        "revisionField": revision_field,
        "occ": occ,
        "batched": has_batch,
        "reversible": "revert" in declared or "revert_batch" in declared,
    }


def _declared_revision_field(versioning: Mapping[str, Any]) -> str | None:
    if versioning.get("revision", True) is False:
        return None
    for key in ("revision_field", "revisionField"):
        if key in versioning:
            value = versioning[key]
            return str(value) if value else None
    return "__rev"


def _resolve_settings(
    declared: Mapping[str, Any], step_mode: bool, issues: _Issues
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "description" in declared:
        value = declared["description"]
        if isinstance(value, str):
            if value.strip():
                out["description"] = value
        elif value is not None:
            issues.add("background.description", f"must be a string, got {_show(value)}")

    # transaction first: it changes the default batch size
    transaction: Any = False
    if "transaction" in declared:
        transaction = _resolve_transaction(declared["transaction"], issues)
    batch_default = 100 if transaction else 500
    batch_size = batch_default
    if "batch_size" in declared:
        batch_size = issues.integer(
            "background.batch_size", declared["batch_size"], 1, 10_000, batch_default
        )
    out["batchSize"] = batch_size
    for key, camel, default, low, high in _INT_SETTINGS:
        if camel == "maxDocumentErrors":  # the persisted order of §1.4
            out["writeConcern"] = _resolve_write_concern(declared, issues)
        out[camel] = (
            issues.integer(f"background.{key}", declared[key], low, high, default)
            if key in declared
            else default
        )

    lag: Any = 10_000
    if "max_replication_lag_ms" in declared:
        value = declared["max_replication_lag_ms"]
        if value is False:
            lag = False
        elif int_within(value, 0, 3_600_000):
            lag = int(value)
        else:
            issues.add(
                "background.max_replication_lag_ms",
                f"must be False or an integer from 0 to 3600000, got {_show(value)}",
            )
    out["maxReplicationLagMs"] = lag

    max_parallel = 1
    if "max_parallel" in declared:
        value = declared["max_parallel"]
        if step_mode:
            if not (is_int(value) and value == 1):
                issues.add(
                    "background.max_parallel",
                    f"must be 1 for a step migration (a step runs as one partition), "
                    f"got {_show(value)}",
                )
        else:
            max_parallel = issues.integer("background.max_parallel", value, 1, 64, 1)
    out["maxParallel"] = max_parallel
    out["shardConcurrency"] = (
        issues.integer("background.shard_concurrency", declared["shard_concurrency"], 1, 64, 1)
        if "shard_concurrency" in declared
        else 1
    )
    out["partitions"] = _resolve_partitions(declared, batch_size, max_parallel, issues)
    out["transaction"] = transaction
    out["adaptive"] = _resolve_adaptive(declared, batch_size, issues)
    return out


def _resolve_transaction(value: Any, issues: _Issues) -> Any:
    if value is False:
        return False
    if value is True:
        return {"timeoutMs": 10_000, "maxRetries": 5}
    if not isinstance(value, Mapping):
        issues.add(
            "background.transaction",
            f"must be True, False or a dict with timeout_ms, max_retries; got {_show(value)}",
        )
        return False
    issues.unknown_keys("background.transaction", value, _TRANSACTION_KEYS)
    timeout = 10_000
    if "timeout_ms" in value:
        timeout = issues.integer(
            "background.transaction.timeout_ms", value["timeout_ms"], 1, 50_000, 10_000
        )
    retries = 5
    if "max_retries" in value:
        retries = issues.integer(
            "background.transaction.max_retries", value["max_retries"], 0, 20, 5
        )
    return {"timeoutMs": timeout, "maxRetries": retries}


def _resolve_write_concern(declared: Mapping[str, Any], issues: _Issues) -> dict[str, Any]:
    default: dict[str, Any] = {"w": "majority"}
    if "write_concern" not in declared:
        return default
    value = declared["write_concern"]
    document = getattr(value, "document", None)  # a pymongo WriteConcern
    if type(value).__name__ == "WriteConcern" and isinstance(document, Mapping):
        value = dict(document)
    if not isinstance(value, Mapping):
        issues.add(
            "background.write_concern",
            f"must be a dict such as {{'w': 'majority'}}, got {_show(value)}",
        )
        return default
    issues.unknown_keys("background.write_concern", value, _WRITE_CONCERN_KEYS)
    out: dict[str, Any] = {}
    ok = True
    if "w" in value:
        w = value["w"]
        if is_int(w) and w == 0:
            issues.add("background.write_concern.w", "must be acknowledged (w: 0 is refused)")
            ok = False
        elif not (int_within(w, 1, 50) or (isinstance(w, str) and w)):
            issues.add(
                "background.write_concern.w",
                f"must be a positive integer or a tag name such as 'majority', got {_show(w)}",
            )
            ok = False
        else:
            out["w"] = w
    for key in ("j", "fsync"):
        if key in value:
            if isinstance(value[key], bool):
                out[key] = value[key]
            else:
                issues.add(
                    f"background.write_concern.{key}",
                    f"must be True or False, got {_show(value[key])}",
                )
                ok = False
    if "wtimeout" in value:
        wtimeout = value["wtimeout"]
        if int_within(wtimeout, 0, MAX_SAFE_INTEGER):
            out["wtimeout"] = int(wtimeout)
        else:
            issues.add(
                "background.write_concern.wtimeout",
                f"must be an integer ≥ 0 (milliseconds), got {_show(wtimeout)}",
            )
            ok = False
    return out if ok else default


def _resolve_partitions(
    declared: Mapping[str, Any], batch_size: int, max_parallel: int, issues: _Issues
) -> dict[str, int]:
    value: Any = declared.get("partitions", {})
    if not isinstance(value, Mapping):
        issues.add(
            "background.partitions",
            "must be a dict with over_partition, max_partitions, min_partition_docs, "
            f"sample_size; got {_show(value)}",
        )
        value = {}
    issues.unknown_keys("background.partitions", value, _PARTITION_KEYS)
    base = "background.partitions."

    def setting(key: str, low: int, high: int | None, default: int) -> int:
        if key not in value:
            return default
        return issues.integer(base + key, value[key], low, high, default)

    over = setting("over_partition", 1, 64, 4)
    most = setting("max_partitions", 1, 4096, 256)
    min_docs = setting("min_partition_docs", 1, None, 4 * batch_size)
    sample = setting("sample_size", 1, 100_000, min(10_000, 100 * min(most, over * max_parallel)))
    return {
        "overPartition": over,
        "maxPartitions": most,
        "minPartitionDocs": min_docs,
        "sampleSize": sample,
    }


def _resolve_adaptive(declared: Mapping[str, Any], batch_size: int, issues: _Issues) -> Any:
    value: Any = declared.get("adaptive", True)
    if value is False:
        return False
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        issues.add(
            "background.adaptive",
            "must be False, True or a dict with target_latency_ms, min_batch_size, "
            f"max_batch_size, max_pause_ms; got {_show(value)}",
        )
        return False
    issues.unknown_keys("background.adaptive", value, _ADAPTIVE_KEYS)
    base = "background.adaptive."
    latency = 500
    if "target_latency_ms" in value:
        latency = issues.integer(
            base + "target_latency_ms", value["target_latency_ms"], 1, 600_000, 500
        )
    min_given: int | None = None
    max_given: int | None = None
    if "min_batch_size" in value:
        min_given = issues.integer(base + "min_batch_size", value["min_batch_size"], 1, 10_000, 10)
    if "max_batch_size" in value:
        max_given = issues.integer(
            base + "max_batch_size", value["max_batch_size"], 1, 10_000, batch_size
        )
    if min_given is not None and max_given is not None and min_given > max_given:
        issues.add(
            base + "min_batch_size",
            f"must not exceed max_batch_size ({max_given}), got {min_given}",
        )
    pause = 30_000
    if "max_pause_ms" in value:
        pause = issues.integer(base + "max_pause_ms", value["max_pause_ms"], 0, 3_600_000, 30_000)
    return {
        "targetLatencyMs": latency,
        "minBatchSize": min(10 if min_given is None else min_given, batch_size),
        "maxBatchSize": min(batch_size if max_given is None else max_given, batch_size),
        "maxPauseMs": pause,
    }


# ------------------------------------------------------------------------------------ match


def match_filter(spec: Mapping[str, Any], direction: str) -> dict[str, Any]:
    """The documents a declarative spec still has to rewrite in ``direction``.

    Forward: the filter AND version == ``from``; revert: the filter AND version == ``to``. Version
    0 means "no version": missing, null or 0 (``{field: {$in: [None, 0]}}``).
    """
    _check_direction(direction)
    if spec.get("mode") != "declarative":
        raise ValueError("match_filter applies to declarative background migrations only")
    field = spec["field"]
    version = spec["from"] if direction == "forward" else spec["to"]
    condition: Any = {"$in": [None, 0]} if version == 0 else version
    query = spec.get("filter") or {}
    if not query:
        return {field: condition}
    if field in query:  # never for a validated spec; keep both constraints anyway
        return {"$and": [dict(query), {field: condition}]}
    return {**query, field: condition}


def match_hash(spec: Mapping[str, Any], direction: str) -> str:
    """First 32 hex characters of SHA-256 over what decides which documents match (§1.4)."""
    _check_direction(direction)
    payload: dict[str, Any]
    if spec.get("mode") == "step":
        payload = {"mode": "step", "direction": direction}
    else:
        payload = {
            "collection": spec.get("collection"),
            "from": spec.get("from"),
            "to": spec.get("to"),
            "filter": _canon_query(spec.get("filter") or {}),
            "field": spec.get("field"),
            "revisionField": spec.get("revisionField"),
            "direction": direction,
        }
    text = json.dumps(
        payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_leaf
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


# Canonical filter for hashing. Key order never matters in a query document or an operator
# document ({$gte, $lt} = {$lt, $gte}), so those are sorted; it *does* matter in a literal
# embedded document ({a: {x: 1, y: 2}} matches other documents than {a: {y: 2, x: 1}}), so
# literals keep their order. Numbers are compared by value (5, Int64(5) and 5.0 match the same
# documents); regexes by pattern and options (re.compile and a stored bson Regex agree).

_REGEX_FLAGS: Final = (
    (re.IGNORECASE, "i"),
    (re.LOCALE, "l"),
    (re.MULTILINE, "m"),
    (re.DOTALL, "s"),
    (re.VERBOSE, "x"),
)


def _canon_query(query: Any) -> Any:
    if not isinstance(query, Mapping):
        return _canon_literal(query)
    out: dict[str, Any] = {}
    for key in sorted(query, key=str):
        value = query[key]
        if key in _LOGICAL_OPERATORS and isinstance(value, (list, tuple)):
            out[key] = [_canon_query(item) for item in value]
        elif isinstance(key, str) and key.startswith("$"):
            out[key] = _canon_expr(value)
        else:
            out[key] = _canon_field_value(value)
    return out


def _is_operator_doc(value: Mapping[Any, Any]) -> bool:
    return bool(value) and all(isinstance(k, str) and k.startswith("$") for k in value)


def _canon_field_value(value: Any) -> Any:
    if isinstance(value, Mapping) and _is_operator_doc(value):
        out: dict[str, Any] = {}
        for key in sorted(value):
            item = value[key]
            if key == "$elemMatch":
                out[key] = _canon_query(item)
            elif key == "$not":
                out[key] = _canon_field_value(item)
            else:
                out[key] = _canon_literal(item)
        return out
    return _canon_literal(value)


def _canon_expr(value: Any) -> Any:
    if isinstance(value, Mapping):
        keys = sorted(value) if _is_operator_doc(value) else list(value)
        return {key: _canon_expr(value[key]) for key in keys}
    if isinstance(value, (list, tuple)):
        return [_canon_expr(item) for item in value]
    return _canon_leaf(value)


def _canon_literal(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _canon_literal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon_literal(item) for item in value]
    return _canon_leaf(value)


def _canon_leaf(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return int(value) if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER else value
        return {"$numberDouble": repr(value).replace("inf", "Infinity").replace("nan", "NaN")}
    if isinstance(value, (re.Pattern, Regex)):
        pattern = value.pattern
        flags = value.flags
        options = "".join(letter for flag, letter in _REGEX_FLAGS if flags & flag)
        return {"$regex": pattern, "$options": options}
    return value  # left to _json_leaf (extended JSON)


def _json_leaf(value: Any) -> Any:
    return json_util.default(value, json_options=CANONICAL_JSON_OPTIONS)


# ------------------------------------------------------------------------------------ requires


def validate_requires(
    name: str,
    requires: Any,
    files_on_disk: Sequence[str],
    is_background: Callable[[str], bool],
) -> tuple[str, ...]:
    """Check a file's ``requires`` (reference §1.8) and return it as a tuple.

    Bare file names, no duplicates, not the file itself, each sorting *before* the file (so no
    cycles), each present on disk and a background migration. Every problem is collected; the
    first is named in the ``MIGRATION_INVALID_EXPORT`` message, all are in ``context['issues']``.
    """
    if requires is None:
        return ()
    issues = _Issues()
    if isinstance(requires, (str, bytes)) or not isinstance(requires, (list, tuple)):
        issues.add("requires", f"must be a list of migration file names, got {_show(requires)}")
        _raise_requires(name, issues)
    on_disk = set(files_on_disk)
    seen: set[str] = set()
    for index, item in enumerate(requires):
        path = f"requires[{index}]"
        if not isinstance(item, str) or not is_valid_name(item):
            issues.add(path, f"must be a bare migration file name, got {_show(item)}")
            continue
        if item in seen:
            issues.add(path, f"'{item}' is listed twice")
            continue
        seen.add(item)
        if item == name:
            issues.add(path, "a migration cannot require itself")
        elif not item < name:
            issues.add(
                path,
                f"'{item}' does not sort before this file — a requirement must come earlier "
                "(so there are no cycles)",
            )
        elif item not in on_disk:
            issues.add(path, f"'{item}' is not a migration file in the migrations directory")
        elif not is_background(item):
            issues.add(path, f"'{item}' is not a background migration")
    if issues.items:
        _raise_requires(name, issues)
    return tuple(requires)


def _raise_requires(name: str, issues: _Issues) -> NoReturn:
    first = issues.items[0]
    raise MigrationInvalidExportError(
        f"Invalid migration {name}: {first['path']} {first['message']}",
        {"issues": issues.items},
    )


# ------------------------------------------------------------------------------------ skeleton

#: The ``create --background`` template, a ``str.format`` template like the ordinary one:
#: ``SKELETON.format(title=...)``. ``resolve_background`` refuses it untouched (placeholder).
SKELETON: Final = '''"""{title}

A background migration: `up` registers it; the rewrite happens afterwards, in batches over _id
ranges, outside the migration lock (`migronaut background work`, the in-process runner, or
inline). The engine reads each document, calls migrate() with a copy, writes only the changed
top-level fields, sets the version field to `to` and bumps the revision.
"""

from __future__ import annotations

from typing import Any

# requires = []  # background migration files that must complete before this one starts


def migrate(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Return the whole new document. Keep it a pure function of `doc`."""
    # doc["status"] = doc.get("status", "active")
    return doc


# No revert on purpose: write one only if the change can really be undone.
# def revert(doc: dict[str, Any], ctx: Any) -> dict[str, Any]:
#     doc.pop("status", None)
#     return doc


background = {{
    "collection": "TODO",  # the collection to rewrite
    "from": 0,  # documents at this version (0 = no version field yet) ...
    "to": 1,  # ... are rewritten to this version
    "migrate": migrate,
    # "revert": revert,
    # "filter": {{"status": {{"$exists": False}}}},
    # "batch_size": 500,
    # "max_parallel": 4,  # partitions worked at once, across all worker processes
}}
'''
