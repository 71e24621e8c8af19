"""The shape registry: the versioned collections of an application, by name (reference §3.4.1).

Definitions are read by the same validator converge uses (:mod:`migronaut.declared`), so the
application and ``migronaut converge`` can never disagree on a contract: pass the same
definition objects (inline dicts, ``.py`` definition modules, loaded ``.json`` dicts, or the
:class:`~migronaut.declared.definition.CollectionDefinition` objects converge loaded).
Invariant: the registry is frozen once built; a name it does not know is an error, never
"unversioned".
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

from migronaut.declared.definition import (
    DEFINITION_KEYS,
    CollectionDefinition,
    Style,
    module_definition,
    validate_definition,
)
from migronaut.declared.issues import Issues, invalid_definitions
from migronaut.declared.versioning import VersioningSpec, validate_versioning
from migronaut.errors import ConfigInvalidError
from migronaut.versioning.bound import BoundWriters
from migronaut.versioning.fields import exact_filter, version_of
from migronaut.versioning.upcaster import Newer, Step, Upcaster
from migronaut.versioning.updates import refuse, update_kind, writes_field

__all__ = ["Shapes", "define_shapes", "resolve_versioning"]

#: Keys only the original's (JSON) spelling uses: a dict with one of them is read as JSON.
_JSON_ONLY = frozenset(set(DEFINITION_KEYS["json"].values()) - set(DEFINITION_KEYS["python"]))


def _style(raw: Mapping[str, Any]) -> Style:
    versioning = raw.get("versioning")
    if any(key in _JSON_ONLY for key in raw) or (
            isinstance(versioning, Mapping) and "revisionField" in versioning):
        return "json"
    return "python"


def _definition(raw: Any, issues: Issues, name: str | None, base: str) -> VersioningSpec | None:
    """The versioning of one definition-like object (``None`` with an issue, or when the
    definition declares none — the caller decides whether that is an error)."""
    if isinstance(raw, CollectionDefinition):
        return raw.versioning
    if isinstance(raw, ModuleType):
        raw = module_definition(raw, issues)
        if raw is None:
            return None
    if not isinstance(raw, Mapping):
        issues.add(base, f"must be a collection definition (got {type(raw).__name__})")
        return None
    if "versioning" not in raw:
        return None
    definition = validate_definition(raw, issues, base=base, style=_style(raw),
                                     fallback_name=name)
    return definition.versioning if definition is not None else None


def resolve_versioning(source: Any) -> tuple[str | None, VersioningSpec]:
    """The contract of a definition, a definition module or a bare ``versioning`` block, with
    the collection name when the source gives one."""
    if isinstance(source, VersioningSpec):
        return None, source
    issues = Issues()
    name = getattr(source, "name", None) if isinstance(source, CollectionDefinition) else None
    if isinstance(source, Mapping) and "versioning" not in source and "name" not in source:
        spec = validate_versioning(source, "versioning", issues, style=_style(
            {"versioning": source}))
    else:
        if isinstance(source, Mapping) and isinstance(source.get("name"), str):
            name = source["name"]
        spec = _definition(source, issues, name or "unnamed", name or "")
        if spec is None and not issues:
            issues.add(f"{name}.versioning" if name else "versioning", "declares no versioning")
    if spec is None:
        raise invalid_definitions(issues)
    return name, spec


def _entries(definitions: Any, issues: Issues) -> Iterable[tuple[str, Any, bool]]:
    """``(name, definition, required)`` per entry: a mapping ``{name: definition}`` requires
    versioning of each; a list skips unversioned entries and takes names from the entries."""
    if isinstance(definitions, Mapping):
        for name, raw in definitions.items():
            yield str(name), raw, True
        return
    if isinstance(definitions, (str, bytes)) or not isinstance(definitions, Iterable):
        raise ConfigInvalidError("define_shapes takes a mapping {name: definition} or a list "
                                 "of definitions with a name")
    for position, raw in enumerate(definitions):
        name = raw.name if isinstance(raw, CollectionDefinition) else \
            raw.get("name") if isinstance(raw, Mapping) else None
        if not isinstance(name, str) or not name:
            issues.add(f"[{position}].name", "is required in a list of definitions")
            continue
        yield name, raw, False


def define_shapes(definitions: Any) -> Shapes:
    """The registry of the versioned collections in ``definitions`` — a mapping
    ``{name: definition}`` (each must declare versioning) or a list of definitions with a
    ``name`` (unversioned ones skipped). Every problem is reported in one ``CONFIG_INVALID``."""
    issues = Issues()
    specs: dict[str, VersioningSpec] = {}
    for name, raw, required in _entries(definitions, issues):
        if name in specs:
            issues.add(name, "is defined twice")
            continue
        spec = _definition(raw, issues, name, name)
        if spec is not None:
            specs[name] = spec
        elif required and not any(issue["path"].startswith(name) for issue in issues.found):
            issues.add(f"{name}.versioning", "declares no versioning")
    if issues:
        raise invalid_definitions(issues)
    return Shapes(specs)


class Shapes:
    """The frozen registry :func:`define_shapes` returns."""

    __slots__ = ("_specs",)
    _specs: Mapping[str, VersioningSpec]

    def __init__(self, specs: Mapping[str, VersioningSpec]) -> None:
        object.__setattr__(self, "_specs", MappingProxyType(dict(specs)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Shapes registry is frozen")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def has(self, name: str) -> bool:
        return name in self._specs

    __contains__ = has

    def get(self, name: str) -> VersioningSpec:
        """The resolved versioning of ``name``; an unknown name is an error."""
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(self._specs) or "none"
            raise ConfigInvalidError(f"{name!r} is not a versioned collection (known: {known})",
                                     {"collection": name, "known": list(self._specs)}) from None

    def current(self, name: str) -> int:
        return self.get(name).current

    def version_of(self, name: str, doc: Any) -> int:
        """The shape version of ``doc`` (0 when missing; invalid → ``ShapeVersionError``)."""
        spec = self.get(name)
        return version_of(doc, spec.field, spec.current, name)

    def is_current(self, name: str, doc: Any) -> bool:
        return self.version_of(name, doc) == self.current(name)

    def is_version(self, name: str, doc: Any, version: int) -> bool:
        return self.version_of(name, doc) == version

    def version_filter(self, name: str, version: int) -> dict[str, Any]:
        """The filter for documents of ``name`` at exactly ``version`` (0 includes missing)."""
        return exact_filter(self.get(name).field, version)

    def stamp(self, name: str, doc: Any) -> dict[str, Any]:
        """A shallow copy of a new document with version ``current`` and revision 0, each only
        when absent (stamping twice changes nothing)."""
        spec = self.get(name)
        if not isinstance(doc, dict):
            raise refuse(f"stamp takes a document (a dict), not {type(doc).__name__}", "doc")
        out = copy.copy(doc)
        out.setdefault(spec.field, spec.current)
        if spec.revision_field is not None:
            out.setdefault(spec.revision_field, 0)
        return out

    def on_insert(self, name: str, docs: Any) -> Any:
        """:meth:`stamp` one document, or each of a list (for ``insert_many``)."""
        if isinstance(docs, (list, tuple)):
            return [self.stamp(name, doc) for doc in docs]
        return self.stamp(name, docs)

    def stamp_upsert(self, name: str, update: Any) -> dict[str, Any]:
        """An operator update made safe for ``upsert=True``: an inserted document gets version
        ``current`` (unless the update writes it) and starts at revision 1."""
        spec = self.get(name)
        if update_kind(update) != "operator":
            raise refuse("stamp_upsert takes an operator update (a pipeline or replacement "
                         "cannot be stamped for an upsert)", "update")
        if spec.revision_field and writes_field(update, "operator", spec.revision_field):
            raise refuse(f"The update writes the revision field {spec.revision_field!r}",
                         "update")
        out = {operator: dict(value) if isinstance(value, Mapping) else value
               for operator, value in update.items()}
        if not writes_field(update, "operator", spec.field):
            out.setdefault("$setOnInsert", {})[spec.field] = spec.current
        if spec.revision_field is not None:
            out.setdefault("$inc", {})[spec.revision_field] = 1
        return out

    def upcaster(
        self, name: str, steps: Mapping[Any, Step], *, newer: Newer = "throw"
    ) -> Upcaster:
        return Upcaster(self.get(name), steps, newer=newer, collection=name)

    def occ(self, name: str) -> BoundWriters:
        """The guarded writers bound to ``name``'s field names (revisions must be on)."""
        spec = self.get(name)
        if spec.revision_field is None:
            raise ConfigInvalidError(f"{name!r} declares revision: false; guarded writes need "
                                     "revisions", {"collection": name})
        return BoundWriters(spec.field, spec.revision_field)

    def __repr__(self) -> str:
        return f"Shapes({', '.join(self._specs)})"

