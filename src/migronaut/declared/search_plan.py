"""Planning a collection's Atlas Search / Vector Search indexes (reference §7.2, §7.5).

Invariant: a search index is never dropped and re-created (a type change is a conflict with
the new-name recipe), an undeclared one is dropped only with prune, and when Search is
unavailable no search row changes anything (``conflict`` or ``skip``).

The comparison itself (Atlas's defaults, server-only options, immutable autoEmbed changes) is
:mod:`migronaut.declared.search_compare`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from migronaut.declared.plan import (
    CreateSearchIndexes,
    DropSearchIndex,
    PlanRow,
    UpdateSearchIndex,
)
from migronaut.declared.search import DeclaredSearchIndex
from migronaut.declared.search_compare import SearchDiff, compare_definitions

__all__ = ["SearchAvailability", "SearchPlan", "compare_search", "live_search_index",
           "plan_search_indexes"]

UNAVAILABLE = "Atlas Search is not available on this server"
_GONE = ("DELETING", "DOES_NOT_EXIST")
_MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class SearchAvailability:
    """The probe's verdict (§7.4) and what to do when Search is missing (``fail``/``skip``)."""

    available: bool = True
    on_unavailable: str = "fail"
    #: How the probe decided: ``version``, ``error``, ``listed``, ``parameter`` or ``assumed``.
    evidence: str | None = None
    #: The server's refusal when ``evidence`` is ``error``.
    reason: str | None = None


@dataclass(frozen=True)
class SearchPlan:
    rows: tuple[PlanRow, ...] = ()
    create: CreateSearchIndexes | None = None
    updates: tuple[UpdateSearchIndex, ...] = ()
    drops: tuple[DropSearchIndex, ...] = ()


@dataclass(frozen=True)
class _Live:
    name: str
    type: str
    definition: Mapping[str, Any]
    status: str
    build: Mapping[str, Any] = field(default_factory=dict)
    version: int | None = None

    def value(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "definition": dict(self.definition)}


def live_search_index(document: Mapping[str, Any]) -> _Live:
    """One ``$listSearchIndexes`` document, normalized (§7.2)."""
    definition = dict(document.get("latestDefinition") or {})
    kind = document.get("type") or ("vectorSearch" if "fields" in definition
                                    and "mappings" not in definition else "search")
    status = str(document.get("status") or "UNKNOWN")
    build: dict[str, Any] = {"status": status, "queryable": document.get("queryable") is True}
    message = document.get("message")
    if isinstance(message, str) and message:
        build["message"] = message if len(message) <= _MESSAGE_LIMIT \
            else message[:_MESSAGE_LIMIT - 1] + "…"
    latest = document.get("latestDefinitionVersion")
    version = latest.get("version") if isinstance(latest, Mapping) else document.get(
        "latestVersion")
    for detail in document.get("statusDetail") or ():
        main = (detail.get("mainIndex") or {}).get("definitionVersion") or {}
        if detail.get("stagedIndex") or (
                isinstance(version, int) and isinstance(main.get("version"), int)
                and main["version"] < version):
            build["updating"] = True
    return _Live(name=str(document.get("name")), type=str(kind), definition=definition,
                 status=status, build=build, version=version if isinstance(version, int) else None)


def compare_search(declared: DeclaredSearchIndex, live: _Live) -> SearchDiff:
    """How ``declared`` differs from ``live`` (§7.3)."""
    return compare_definitions(declared.type, declared.definition, live.type, live.definition)


_RECIPE = ("declare it under a new name, converge, remove the old declaration, then converge "
           "with prune")


def _value(index: DeclaredSearchIndex) -> dict[str, Any]:
    return {"name": index.name, "type": index.type, "definition": dict(index.definition)}


def plan_search_indexes(
    declared: Sequence[DeclaredSearchIndex], listed: Sequence[Mapping[str, Any]],
    *, prune: bool, search: SearchAvailability,
) -> SearchPlan:
    """Rows and steps for one collection's declared search indexes (§7.5)."""
    def row(name: str, action: str, **fields: Any) -> PlanRow:
        return PlanRow(target="searchIndex", name=name, action=action, **fields)

    if not search.available:
        action = "skip" if search.on_unavailable == "skip" else "conflict"
        return SearchPlan(rows=tuple(row(index.name, action, reason=UNAVAILABLE,
                                         to=_value(index)) for index in declared))
    live = {index.name: index for index in map(live_search_index, listed)}
    rows: list[PlanRow] = []
    creates: list[DeclaredSearchIndex] = []
    updates: list[UpdateSearchIndex] = []
    for index in declared:
        have = live.get(index.name)
        if have is None:
            rows.append(row(index.name, "create", to=_value(index)))
            creates.append(index)
        elif have.status in _GONE:
            rows.append(row(index.name, "conflict", from_=have.value(), to=_value(index),
                            build=have.build, reason=f"is being deleted on the server "
                            f"({have.status}); converge again when it is gone"))
        else:
            diff = compare_search(index, have)
            ignored = diff.ignored or None
            if not diff.diffs:
                rows.append(row(index.name, "unchanged", build=have.build, ignored=ignored))
            elif diff.diffs == ("type",) or diff.immutable:
                what = "its type" if diff.diffs == ("type",) else \
                    "its autoEmbed fields (" + ", ".join(diff.immutable) + ")"
                rows.append(row(index.name, "conflict", from_=have.value(), to=_value(index),
                                build=have.build, ignored=ignored,
                                reason=f"{what} cannot change in place: {_RECIPE}"))
            else:
                reason = ", ".join(diff.paths) + (f" (+{diff.more} more)" if diff.more else "")
                new = row(index.name, "modify", reason=reason, from_=have.value(),
                          to=_value(index), build=have.build, ignored=ignored)
                rows.append(new)
                updates.append(UpdateSearchIndex(
                    rows=(new.id,), name=index.name, type=index.type,
                    definition=dict(index.definition), since_version=have.version))
    names = {index.name for index in declared}
    drops: list[DropSearchIndex] = []
    for have in live.values():
        if have.name in names:
            continue
        if have.status in _GONE:
            rows.append(row(have.name, "keep", reason="being deleted", from_=have.value(),
                            build=have.build))
        elif prune:
            rows.append(row(have.name, "drop", reason="not declared", from_=have.value(),
                            build=have.build))
            drops.append(DropSearchIndex(rows=(rows[-1].id,), name=have.name))
        else:
            rows.append(row(have.name, "keep", reason="not declared", from_=have.value(),
                            build=have.build))
    create = CreateSearchIndexes(
        rows=tuple(("searchIndex", index.name) for index in creates),
        indexes=tuple({"name": index.name, **({"type": index.type}
                                              if index.type == "vectorSearch" else {}),
                       "definition": dict(index.definition)} for index in creates),
    ) if creates else None
    return SearchPlan(rows=tuple(rows), create=create, updates=tuple(updates),
                      drops=tuple(drops))
