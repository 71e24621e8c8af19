"""Who the tenants of a fleet are, resolved and validated before any of them runs.

Each cluster's source yields names — the explicit list, the databases ``listDatabases`` shows
(``nameOnly``, ``authorizedDatabases``: a user who may not list every database still sees its
own) whose name matches the glob or regular expression, the ``field`` of each matching document
of a registry collection (primary read), or what a ``module:function`` returns (sync or async).
Then every name must be a valid database name, appear once across all clusters, and not be
MongoDB's own (``admin``, ``local``, ``config``) nor the fleet's admin database; a ``--tenants``
glob narrows the result. Anything else — junk in the registry, a callable that raises or returns
something other than names, a source or narrowing that matches nothing — is ``FLEET_INVALID``
naming it: a fleet run never starts over a guess.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migronaut._names import validate_db_name
from migronaut.errors import ConnectionFailedError, FleetInvalidError, MigronautError

if TYPE_CHECKING:
    from migronaut.fleet.clients import ClusterClients
    from migronaut.fleet.config import ClusterConfig, FleetConfig, TenantSource

__all__ = ["SYSTEM_DATABASES", "Tenant", "resolve_tenants"]

#: MongoDB's own databases: never a tenant, never matched by a pattern.
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})


@dataclass(frozen=True)
class Tenant:
    """One tenant: a database on a cluster."""

    name: str
    cluster: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "cluster": self.cluster}


def resolve_tenants(
    config: FleetConfig,
    clients: ClusterClients,
    pattern: str | None = None,
    *,
    unreachable: dict[str, ConnectionFailedError] | None = None,
) -> list[Tenant]:
    """Every tenant of the fleet, cluster by cluster in config order, names sorted.

    A cluster whose source needs the server (a pattern, a registry) and cannot be reached raises
    its ``CONNECTION_FAILED`` — unless ``unreachable`` is given: then the failure is recorded
    there under the cluster's name and the other clusters are resolved (``fleet status`` reports
    it; its tenants are unknown). ``pattern`` (a glob) keeps the matching names only.
    """
    found: list[Tenant] = []
    seen: dict[str, str] = {}
    for cluster in config.clusters:
        try:
            names = _names_of(cluster, clients)
        except ConnectionFailedError as error:
            if unreachable is None:
                raise
            unreachable[cluster.name] = error
            continue
        for name in names:
            _check_name(name, cluster, config)
            if name in seen:
                where = "twice" if seen[name] == cluster.name else \
                    f"on clusters '{seen[name]}' and '{cluster.name}'"
                raise FleetInvalidError(
                    f"Invalid fleet: tenant {name!r} is listed {where} (a tenant is one "
                    "database on one cluster)",
                    {"tenant": name, "cluster": cluster.name, "source": cluster.source.describe()})
            seen[name] = cluster.name
        found.extend(Tenant(name, cluster.name) for name in sorted(names))
    if pattern is not None:
        narrowed = [t for t in found if fnmatch.fnmatchcase(t.name, pattern)]
        if not narrowed and found:
            raise FleetInvalidError(
                f"Invalid fleet: --tenants {pattern!r} matched no tenant (of {len(found)})",
                {"pattern": pattern, "tenants": len(found)})
        found = narrowed
    return found


def _names_of(cluster: ClusterConfig, clients: ClusterClients) -> list[str]:
    source = cluster.source
    if source.kind == "names":
        names = list(source.names)
    elif source.kind in ("pattern", "regex"):
        names = _listed(cluster, clients)
    elif source.kind == "registry":
        names = _registered(cluster, clients)
    else:
        names = _called(cluster, clients.cwd)
    if not names:
        raise FleetInvalidError(
            f"Invalid fleet: the {source.describe()} of cluster '{cluster.name}' matched no "
            "database (a fleet of no tenant is a mistake, not a success)",
            {"cluster": cluster.name, "source": source.to_json()})
    return names


def _check_name(name: Any, cluster: ClusterConfig, config: FleetConfig) -> None:
    problem = validate_db_name(name)
    if problem is None and name in SYSTEM_DATABASES | {config.admin_db}:
        problem = "is MongoDB's own database or the fleet's admin_db, not a tenant"
    if problem is not None:
        raise FleetInvalidError(
            f"Invalid fleet: tenant {name!r} from the {cluster.source.describe()} of cluster "
            f"'{cluster.name}' {problem}",
            {"tenant": repr(name) if not isinstance(name, str) else name,
             "cluster": cluster.name, "source": cluster.source.describe()})


def _listed(cluster: ClusterConfig, clients: ClusterClients) -> list[str]:
    from pymongo.errors import PyMongoError

    from migronaut.core.retry import as_connection_failed

    client = clients.get(cluster.name)
    try:
        reply = client.admin.command("listDatabases", nameOnly=True, authorizedDatabases=True)
        names = [str(entry["name"]) for entry in reply.get("databases", [])]
    except PyMongoError as error:
        raise as_connection_failed(error) or ConnectionFailedError(
            f"Failed to list the databases of cluster '{cluster.name}': {error}",
            {"cluster": cluster.name}, cause=error) from error
    text = cluster.source.pattern or ""
    regex = re.compile(fnmatch.translate(text) if cluster.source.kind == "pattern" else text)
    match = regex.match if cluster.source.kind == "pattern" else regex.search
    return [name for name in names
            if name not in SYSTEM_DATABASES and name != clients.fleet.admin_db
            and match(name) is not None]


def _registered(cluster: ClusterConfig, clients: ClusterClients) -> list[str]:
    from pymongo.errors import PyMongoError

    from migronaut.core.reads import primary
    from migronaut.core.retry import as_connection_failed

    registry = cluster.source.registry
    assert registry is not None
    client = clients.get(cluster.name)
    collection = primary(client[registry.db])[registry.collection]
    names: list[str] = []
    try:
        for document in collection.find(dict(registry.filter), {registry.field: 1}):
            value = _field(document, registry.field)
            if not isinstance(value, str):
                got = "no such field" if value is _MISSING else f"a {type(value).__name__}"
                raise FleetInvalidError(
                    f"Invalid fleet: registry document {document.get('_id')!r} in "
                    f"{registry.db}.{registry.collection} has no string {registry.field!r} "
                    f"(got {got})",
                    {"cluster": cluster.name, "document": str(document.get("_id")),
                     "field": registry.field,
                     "source": f"{registry.db}.{registry.collection}"})
            names.append(value)
    except PyMongoError as error:
        raise as_connection_failed(error) or FleetInvalidError(
            f"Invalid fleet: the registry query on {registry.db}.{registry.collection} of "
            f"cluster '{cluster.name}' failed: {error}",
            {"cluster": cluster.name, "source": f"{registry.db}.{registry.collection}"},
            cause=error) from error
    return names


_MISSING: Any = object()


def _field(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _called(cluster: ClusterConfig, cwd: str) -> list[str]:
    from migronaut.core._calls import call_user

    source = cluster.source
    name = source.callable or "?"
    try:
        function = getattr(source, "function", None) or _import(name, cwd)
        result = call_user(function)
    except MigronautError:
        raise
    except Exception as error:
        raise FleetInvalidError(
            f"Invalid fleet: the tenant callable {name!r} of cluster '{cluster.name}' failed: "
            f"{type(error).__name__}: {error}",
            {"cluster": cluster.name, "callable": name}, cause=error) from error
    return _names_returned(result, name, cluster, source)


def _names_returned(result: Any, name: str, cluster: ClusterConfig,
                    source: TenantSource) -> list[str]:
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, Iterable):
        raise FleetInvalidError(
            f"Invalid fleet: the tenant callable {name!r} of cluster '{cluster.name}' must "
            f"return a list of database names (got {type(result).__name__})",
            {"cluster": cluster.name, "callable": name})
    names = list(result)
    for item in names:
        if not isinstance(item, str):
            raise FleetInvalidError(
                f"Invalid fleet: the tenant callable {name!r} of cluster '{cluster.name}' "
                f"returned {item!r} ({type(item).__name__}), not a database name",
                {"cluster": cluster.name, "callable": name, "source": source.describe()})
    return names


def _import(target: str, cwd: str) -> Any:
    """``module:function``, importable from the project's directory too (like a config file)."""
    module_name, _, attribute = target.partition(":")
    root = str(Path(cwd).resolve())
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    finally:
        if added:
            sys.path.remove(root)
    try:
        return getattr(module, attribute)
    except AttributeError as error:
        raise AttributeError(f"module {module_name!r} has no {attribute!r}") from error
