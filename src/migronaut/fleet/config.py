"""The ``[fleet]`` table of the config (``[tool.migronaut.fleet]`` in ``pyproject.toml``) parsed
into a frozen :class:`FleetConfig`.

A fleet names where its tenants come from — exactly one source per cluster: an explicit
``names`` list, a ``pattern`` (glob) or ``regex`` over ``listDatabases``, a ``registry``
collection, or a ``callable`` (``module:function``) — and the policy defaults of its runs. The
top-level source, if any, is the cluster ``default`` on the config's own ``uri``; more clusters
are ``[fleet.clusters.NAME]`` tables, each with its ``uri`` and source. Every key is typed and
range-checked where it enters; an unknown one is an issue with a suggestion, like every other
config key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from migronaut._names import validate_collection_name, validate_db_name
from migronaut._suggest import suggest
from migronaut._values import int_within

__all__ = [
    "DEFAULT_CLUSTER",
    "ON_LOCK",
    "ORDERS",
    "RUN_KEYS",
    "ClusterConfig",
    "FleetConfig",
    "FleetPolicy",
    "RegistrySource",
    "TenantSource",
    "check_policy_value",
    "parse_fleet",
]

#: The cluster of the top-level source: the config's own ``uri``.
DEFAULT_CLUSTER = "default"
ORDERS = ("name", "size", "random")
ON_LOCK = ("skip", "wait")
SOURCE_KEYS = ("names", "pattern", "regex", "registry", "callable")
#: The keys of a run's policy (``FleetPolicy``): flags and API arguments override them per run.
RUN_KEYS = ("concurrency", "per_cluster_concurrency", "canary", "max_failures", "order", "on_lock",
            "lock_wait_ms")
POLICY_KEYS = ("admin_db", "runs_collection", *RUN_KEYS)
CLUSTER_KEYS = ("uri", *SOURCE_KEYS)
REGISTRY_KEYS = ("db", "collection", "filter", "field")
#: (minimum, maximum) of each integer policy key.
RANGES: dict[str, tuple[int, int]] = {
    "concurrency": (1, 256),
    "per_cluster_concurrency": (1, 256),
    "canary": (0, 100_000),
    "max_failures": (0, 1_000_000),
    "lock_wait_ms": (1, 86_400_000),
}
_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

SourceKind = Literal["names", "pattern", "regex", "registry", "callable"]


@dataclass(frozen=True)
class RegistrySource:
    """Tenants listed in a collection: ``field`` of every document of ``db.collection`` that
    matches ``filter``."""

    db: str
    collection: str
    field: str
    filter: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class TenantSource:
    """Where one cluster's tenant names come from (exactly one of the kinds)."""

    kind: SourceKind
    names: tuple[str, ...] = ()
    #: the glob (``pattern``) or regular expression (``regex``) text
    pattern: str | None = None
    registry: RegistrySource | None = None
    #: ``module:function``
    callable: str | None = None

    def describe(self) -> str:
        """The source as a user wrote it, for messages (``pattern 'tenant_*'``)."""
        if self.kind == "names":
            return f"names ({len(self.names)})"
        if self.kind == "registry" and self.registry is not None:
            reg = self.registry
            return f"registry {reg.db}.{reg.collection} (field {reg.field!r})"
        if self.kind == "callable":
            return f"callable {self.callable!r}"
        return f"{self.kind} {self.pattern!r}"

    def to_json(self) -> dict[str, Any]:
        if self.kind == "names":
            return {"names": list(self.names)}
        if self.kind == "registry" and self.registry is not None:
            reg = self.registry
            return {"registry": {"db": reg.db, "collection": reg.collection,
                                 "filter": dict(reg.filter), "field": reg.field}}
        return {self.kind: self.pattern if self.kind in ("pattern", "regex") else self.callable}


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster: its name, its ``uri`` (``None``: the config's own) and its tenant source."""

    name: str
    source: TenantSource
    uri: str | None = None


@dataclass(frozen=True)
class FleetPolicy:
    """How one fleet run goes: the config's ``[fleet]`` policy, overridden per run by flags and
    API arguments.

    ``max_failures=None`` is no budget (every tenant is tried); ``lock_wait_ms`` bounds how long
    one tenant waits for its lock with ``on_lock="wait"``.
    """

    concurrency: int = 4
    per_cluster_concurrency: int | None = None
    canary: int = 0
    max_failures: int | None = None
    order: str = "name"
    on_lock: str = "skip"
    lock_wait_ms: int = 60_000
    #: the seed of ``order="random"`` (``None``: a fresh one per run; not a config key)
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency,
                "perClusterConcurrency": self.per_cluster_concurrency,
                "canary": self.canary, "maxFailures": self.max_failures, "order": self.order,
                "onLock": self.on_lock, "lockWaitMs": self.lock_wait_ms}


@dataclass(frozen=True, kw_only=True)
class FleetConfig(FleetPolicy):
    """The fleet: its clusters (``default`` first when there is a top-level source), where its
    run records live, and the policy defaults of its runs (the :class:`FleetPolicy` fields)."""

    clusters: tuple[ClusterConfig, ...]
    #: where fleet run records live (on the first cluster)
    admin_db: str = "migronaut_fleet"
    runs_collection: str = "fleet_runs"

    def policy(self) -> FleetPolicy:
        """The run policy these defaults make."""
        return FleetPolicy(**{key: getattr(self, key) for key in RUN_KEYS})

    def cluster(self, name: str) -> ClusterConfig:
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:  # type: ignore[override]  # the config's shape
        from migronaut._redact import redact

        return {
            "clusters": {c.name: {**({"uri": redact(c.uri)} if c.uri else {}),
                                  **c.source.to_json()} for c in self.clusters},
            **{key: getattr(self, key) for key in POLICY_KEYS},
        }


Problems = list[tuple[str, str]]


def parse_fleet(value: Any, *, allow_code: bool = False) -> tuple[FleetConfig | None, Problems]:
    """The :class:`FleetConfig` of a ``fleet`` table, or ``None`` and every problem as
    ``(path under fleet, message)``. ``allow_code`` (``migronaut_config.py``) also takes a
    function object for ``callable``."""
    problems: Problems = []
    if not isinstance(value, Mapping):
        return None, [("", "must be a table/object")]
    known = (*SOURCE_KEYS, *POLICY_KEYS, "clusters")
    for key in value:
        if key not in known:
            problems.append((str(key), _unknown(key, known)))
    policy: dict[str, Any] = {}
    for key in POLICY_KEYS:
        if key in value:
            checked, problem = _policy_value(key, value[key])
            if problem:
                problems.append((key, problem))
            else:
                policy[key] = checked
    clusters: list[ClusterConfig] = []
    if any(key in value for key in SOURCE_KEYS):
        source = _source(value, "", problems, allow_code=allow_code)
        if source is not None:
            clusters.append(ClusterConfig(DEFAULT_CLUSTER, source))
    table = value.get("clusters")
    if table is not None:
        if not isinstance(table, Mapping) or not table:
            problems.append(("clusters", "must be a table of clusters, each with uri and a "
                                         "tenant source"))
        else:
            for name, spec in table.items():
                cluster = _cluster(str(name), spec, problems, allow_code=allow_code)
                if cluster is not None:
                    clusters.append(cluster)
    if not clusters and not problems:
        problems.append(("", "names no tenant source: set one of " + ", ".join(SOURCE_KEYS)
                             + " (or [fleet.clusters.NAME] tables)"))
    if problems:
        return None, problems
    return FleetConfig(clusters=tuple(clusters), **policy), []


def _unknown(key: object, known: tuple[str, ...]) -> str:
    close = suggest(key, known)
    return "unknown key" + (f" (did you mean '{close}'?)" if close else "")


def check_policy_value(key: str, value: Any) -> tuple[Any, str | None]:
    """A policy key's value checked (a flag or API argument overriding the config's)."""
    return _policy_value(key, value)


def _policy_value(key: str, value: Any) -> tuple[Any, str | None]:
    if key in RANGES:
        low, high = RANGES[key]
        if not int_within(value, low, high):
            return value, f"must be an integer from {low} to {high} (got {value!r})"
        return value, None
    if key == "admin_db":
        return value, validate_db_name(value)
    if key == "runs_collection":
        return value, validate_collection_name(value)
    choices = ORDERS if key == "order" else ON_LOCK
    if value not in choices:
        return value, "must be one of " + ", ".join(repr(c) for c in choices) + \
            f" (got {value!r})"
    return value, None


def _cluster(name: str, spec: Any, problems: Problems, *, allow_code: bool) -> ClusterConfig | None:
    path = f"clusters.{name}"
    if not _CLUSTER_NAME.match(name):
        problems.append((path, "a cluster name is 1-64 letters, digits, '_' or '-'"))
        return None
    if name == DEFAULT_CLUSTER:
        problems.append((path, f"'{DEFAULT_CLUSTER}' is the top-level source's cluster; "
                               "name this one otherwise"))
        return None
    if not isinstance(spec, Mapping):
        problems.append((path, "must be a table with uri and a tenant source"))
        return None
    for key in spec:
        if key not in CLUSTER_KEYS:
            problems.append((f"{path}.{key}", _unknown(key, CLUSTER_KEYS)))
    uri = spec.get("uri")
    if not isinstance(uri, str) or not uri.strip().lower().startswith(
            ("mongodb://", "mongodb+srv://")):
        problems.append((f"{path}.uri", "must be a mongodb:// or mongodb+srv:// connection "
                                        "string"))
        uri = None
    source = _source(spec, f"{path}.", problems, allow_code=allow_code)
    if source is None or uri is None:
        return None
    return ClusterConfig(name, source, uri)


def _source(spec: Mapping[str, Any], prefix: str, problems: Problems,
            *, allow_code: bool) -> TenantSource | None:
    given = [key for key in SOURCE_KEYS if key in spec]
    if len(given) != 1:
        where = prefix.rstrip(".") or "fleet"
        problems.append((prefix.rstrip(".") or "", (
            f"{where} needs exactly one tenant source of " + ", ".join(SOURCE_KEYS)
            + (f" (got {', '.join(given)})" if given else ""))))
        return None
    kind = given[0]
    value = spec[kind]
    path = prefix + kind
    if kind == "names":
        if not isinstance(value, (list, tuple)) or not value:
            problems.append((path, "must be a non-empty array of database names"))
            return None
        return TenantSource("names", names=tuple(value))  # each name is checked when resolved
    if kind == "pattern":
        if not isinstance(value, str) or not value.strip():
            problems.append((path, "must be a non-empty glob (tenant_*)"))
            return None
        return TenantSource("pattern", pattern=value)
    if kind == "regex":
        if not isinstance(value, str) or not value:
            problems.append((path, "must be a non-empty regular expression"))
            return None
        try:
            re.compile(value)
        except re.error as error:
            problems.append((path, f"is not a valid regular expression ({error})"))
            return None
        return TenantSource("regex", pattern=value)
    if kind == "registry":
        return _registry(value, path, problems)
    if allow_code and callable(value):
        name = f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', '?')}"
        return _CallableSource("callable", callable=name, function=value)
    if not isinstance(value, str) or not _CALLABLE.match(value):
        problems.append((path, f"must be 'module:function' (got {value!r})"))
        return None
    return TenantSource("callable", callable=value)


@dataclass(frozen=True)
class _CallableSource(TenantSource):
    """A ``callable`` given as a function object (``migronaut_config.py``)."""

    function: Any = None


def _registry(value: Any, path: str, problems: Problems) -> TenantSource | None:
    if not isinstance(value, Mapping):
        problems.append((path, "must be a table with db, collection, field and filter"))
        return None
    before = len(problems)
    for key in value:
        if key not in REGISTRY_KEYS:
            problems.append((f"{path}.{key}", _unknown(key, REGISTRY_KEYS)))
    db, collection, name_field = value.get("db"), value.get("collection"), value.get("field")
    filter_ = value.get("filter", {})
    problem = validate_db_name(db)
    if problem:
        problems.append((f"{path}.db", problem))
    problem = validate_collection_name(collection)
    if problem:
        problems.append((f"{path}.collection", problem))
    if not isinstance(name_field, str) or not name_field or name_field.startswith("$"):
        problems.append((f"{path}.field", "must be the name of the field holding the tenant's "
                                          "database name"))
    if not isinstance(filter_, Mapping):
        problems.append((f"{path}.filter", "must be a query document (a table)"))
    if len(problems) > before:
        return None
    return TenantSource("registry", registry=RegistrySource(
        db=str(db), collection=str(collection), field=str(name_field), filter=dict(filter_)))
