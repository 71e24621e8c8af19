"""The converge plan and result as data: rows, steps and the JSON the original prints (§2.6).

Rows are what a user reads (``{target, name, action, status, reason?, liveName?, from?, to?,
build?, ignored?}``); steps are what the executor sends, each naming the rows it settles.
Invariant: ``to_dict()`` produces exactly the original's keys, and a plan with a ``conflict`` row
is refused as a whole before the first write.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "CHANGE_ACTIONS",
    "CollModIndex",
    "CollModValidator",
    "CollectionPlan",
    "ConvergeResult",
    "ConvertUnique",
    "CreateCollection",
    "CreateIndexes",
    "CreateSearchIndexes",
    "DropIndex",
    "DropSearchIndex",
    "PlanRow",
    "Rebuild",
    "RowId",
    "Step",
    "UpdateSearchIndex",
]

#: Actions that change the database (each such row counts in ``changed``).
CHANGE_ACTIONS = ("create", "modify", "recreate", "drop")
#: ``(target, name)``: how a step names the rows it settles.
RowId = tuple[str, str]


@dataclass(frozen=True)
class PlanRow:
    """One row of a collection's plan; ``target`` is ``collection``, ``validator``, ``index``
    or ``searchIndex``; ``name`` the index name, or the collection's for the other two."""

    target: str
    name: str
    action: str
    status: str = "planned"
    reason: str | None = None
    live_name: str | None = None
    from_: Any = None
    to: Any = None
    build: Mapping[str, Any] | None = None
    ignored: tuple[str, ...] | None = None
    duration_ms: int | None = None

    @property
    def id(self) -> RowId:
        return (self.target, self.name)

    @property
    def is_change(self) -> bool:
        return self.action in CHANGE_ACTIONS

    @property
    def is_destructive(self) -> bool:
        """Index drop/recreate or search-index drop (§2.12)."""
        return (self.target == "index" and self.action in ("drop", "recreate")) or (
            self.target == "searchIndex" and self.action == "drop")

    def settled(self, status: str) -> PlanRow:
        return replace(self, status=status)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "name": self.name,
                               "action": self.action, "status": self.status}
        for key, value in (("reason", self.reason), ("liveName", self.live_name),
                           ("from", self.from_), ("to", self.to), ("build", self.build),
                           ("durationMs", self.duration_ms)):
            if value is not None:
                out[key] = copy.deepcopy(value)
        if self.ignored:
            out["ignored"] = list(self.ignored)
        return out


# --------------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class CreateCollection:
    """``createCollection`` with the validator options only (§1.5); settles the collection
    row and the validator row."""

    rows: tuple[RowId, ...]
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CollModValidator:
    """``collMod`` with the desired triple, or ``{validator: {}}`` to remove it."""

    rows: tuple[RowId, ...]
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class CreateIndexes:
    """One ``createIndexes`` with every spec: one pass over the data, all-or-nothing."""

    rows: tuple[RowId, ...]
    specs: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class CollModIndex:
    """``collMod index: {name, hidden?, expireAfterSeconds?}``."""

    rows: tuple[RowId, ...]
    name: str
    changes: Mapping[str, Any]


@dataclass(frozen=True)
class ConvertUnique:
    """``prepareUnique: true`` then ``unique: true`` (7.0+); ``changes`` (hidden, TTL) follow."""

    rows: tuple[RowId, ...]
    name: str
    changes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rebuild:
    """Drop every index in ``drops`` (their listed specs restore them if a create fails), then
    create every spec in ``creates`` one at a time; ``group`` for entangled rebuilds."""

    rows: tuple[RowId, ...]
    drops: tuple[Mapping[str, Any], ...]
    creates: tuple[Mapping[str, Any], ...]
    group: bool = False

    @property
    def dropped_names(self) -> tuple[str, ...]:
        return tuple(str(spec["name"]) for spec in self.drops)


@dataclass(frozen=True)
class DropIndex:
    """Prune one undeclared index (``index not found`` counts as done)."""

    rows: tuple[RowId, ...]
    name: str


@dataclass(frozen=True)
class CreateSearchIndexes:
    """One ``createSearchIndexes`` for every missing declared search index."""

    rows: tuple[RowId, ...]
    indexes: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class UpdateSearchIndex:
    """``updateSearchIndex``; ``since_version`` is the live definition version."""

    rows: tuple[RowId, ...]
    name: str
    type: str
    definition: Mapping[str, Any]
    since_version: int | None = None


@dataclass(frozen=True)
class DropSearchIndex:
    """``dropSearchIndex`` (runs last)."""

    rows: tuple[RowId, ...]
    name: str


Step = (CreateCollection | CollModValidator | CreateIndexes | CollModIndex | ConvertUnique
        | Rebuild | DropIndex | CreateSearchIndexes | UpdateSearchIndex | DropSearchIndex)


# -------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CollectionPlan:
    """One collection's rows (reference order) and the steps that carry them out."""

    name: str
    actions: tuple[PlanRow, ...] = ()
    steps: tuple[Step, ...] = ()

    @property
    def changes(self) -> tuple[PlanRow, ...]:
        return tuple(row for row in self.actions if row.is_change)

    @property
    def conflicts(self) -> tuple[PlanRow, ...]:
        return tuple(row for row in self.actions if row.action == "conflict")

    def row(self, target: str, name: str) -> PlanRow:
        """The row ``(target, name)``; ``KeyError`` when the plan has none."""
        for row in self.actions:
            if row.id == (target, name):
                return row
        raise KeyError((target, name))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "actions": [row.to_dict() for row in self.actions]}


@dataclass(frozen=True)
class ConvergeResult:
    """``{dryRun, changed, inSync, collections, unstable?, search?}`` (§2.6)."""

    dry_run: bool
    changed: int
    in_sync: bool
    collections: tuple[CollectionPlan, ...] = ()
    unstable: tuple[Mapping[str, Any], ...] | None = None
    search: Mapping[str, Any] | None = None

    @classmethod
    def planned(cls, plans: Sequence[CollectionPlan],
                search: Mapping[str, Any] | None = None) -> ConvergeResult:
        """A dry run's result: ``changed`` counts change rows; in sync when there is no
        change and no conflict (``keep``/``skip`` rows never count against it)."""
        changes = sum(len(plan.changes) for plan in plans)
        conflicts = sum(len(plan.conflicts) for plan in plans)
        return cls(dry_run=True, changed=changes, in_sync=changes == 0 and conflicts == 0,
                   collections=tuple(plans), search=search)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dryRun": self.dry_run, "changed": self.changed,
                               "inSync": self.in_sync,
                               "collections": [plan.to_dict() for plan in self.collections]}
        if self.unstable is not None:
            out["unstable"] = [dict(entry) for entry in self.unstable]
        if self.search is not None:
            out["search"] = copy.deepcopy(dict(self.search))
        return out
