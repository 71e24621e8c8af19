"""Planning a collection's secondary indexes: pairing, blockers, safety, steps (§2.4.3).

Invariant: the plan never drops an index before everything declared exists, never leaves a
unique constraint missing unless ``rebuild_unique`` allows it, never drops an index it does not
own (undeclared ones only with prune, never one backing the shard key, never outside the managed
set in versioning's partial mode), and never sends two creates the server would refuse side by
side (entangled rebuilds run as one group: all drops, then all creates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from migronaut.declared.index_compare import collides, compare_index, same_key
from migronaut.declared.indexes import DeclaredIndex
from migronaut.declared.live import LiveCollection, LiveIndex, ServerCapabilities
from migronaut.declared.plan import (
    CollModIndex,
    ConvertUnique,
    CreateIndexes,
    DropIndex,
    PlanRow,
    Rebuild,
    Step,
)

__all__ = ["UNIQUE_REBUILD", "IndexPlan", "plan_indexes"]

UNIQUE_REBUILD = (
    "rebuilding drops a unique index, and nothing enforces uniqueness until the new one is "
    "built; pass rebuild_unique (--rebuild-unique) to accept that window, or declare the new "
    "index under a new name, converge, then remove the old declaration and converge with prune")


@dataclass(frozen=True)
class IndexPlan:
    """Index rows (declared order, then undeclared) and steps by kind, for the caller to order."""

    rows: tuple[PlanRow, ...] = ()
    creates: CreateIndexes | None = None
    modifies: tuple[Step, ...] = ()
    rebuilds: tuple[Rebuild, ...] = ()
    drops: tuple[DropIndex, ...] = ()


@dataclass
class _Decision:
    index: DeclaredIndex
    row: PlanRow
    drops: list[LiveIndex] = field(default_factory=list)
    in_place: Mapping[str, object] = field(default_factory=dict)


def _row(index: DeclaredIndex | LiveIndex, action: str, *, reason: str | None = None,
         live_name: str | None = None, from_: object = None, to: object = None) -> PlanRow:
    return PlanRow(target="index", name=index.name, action=action, reason=reason,
                   live_name=live_name, from_=from_, to=to)


def plan_indexes(
    declared: Sequence[DeclaredIndex],
    live: LiveCollection,
    *,
    prune: bool,
    rebuild_unique: bool,
    capabilities: ServerCapabilities,
    partial: bool = False,
    replaced_version_key: tuple[tuple[str, int | str], ...] | None = None,
) -> IndexPlan:
    """Plan ``declared`` against the live indexes. ``partial``: only the version index is
    managed (undeclared indexes are not even listed); ``replaced_version_key``: the ordinary
    version index key when a shard-key-prefixed one replaced it (§3.3.3)."""
    default = live.default_collation
    names = {index.name for index in declared}
    by_name = {index.name: index for index in live.indexes}
    claimed: set[str] = set()
    decisions: list[_Decision] = []
    for index in declared:
        same_named = by_name.get(index.name)
        reason: str | None = None
        drops: list[LiveIndex] = []
        if same_named is not None:
            comparison = compare_index(index, same_named, default, capabilities)
            if not comparison.diffs:
                decisions.append(_Decision(index, _row(index, "unchanged")))
                continue
            if comparison.in_place:
                decisions.append(_Decision(index, _row(
                    index, "modify", reason=comparison.reason, from_=same_named.value(),
                    to=index.spec()), in_place=comparison.in_place))
                continue
            reason, drops = comparison.reason, [same_named]
        blockers = [other for other in live.indexes if other.name not in names
                    and other.name not in claimed and collides(index, other, default)]
        claimed.update(blocker.name for blocker in blockers)
        decisions.append(_decide(index, same_named, reason, drops, blockers, prune=prune,
                                 rebuild_unique=rebuild_unique, default=default,
                                 capabilities=capabilities))
    rows = [decision.row for decision in decisions]
    drop_steps: list[DropIndex] = []
    for other in live.indexes:
        if other.name in names or other.name in claimed:
            continue
        row = _undeclared(other, prune=prune, partial=partial, shard_key=live.shard_key,
                          replaced_version_key=replaced_version_key)
        if row is None:
            continue
        rows.append(row)
        if row.action == "drop":
            drop_steps.append(DropIndex(rows=(row.id,), name=other.name))
    creates, rebuilds = _build_steps(decisions, default)
    return IndexPlan(rows=tuple(rows), creates=creates, modifies=_modify_steps(decisions),
                     rebuilds=rebuilds, drops=tuple(drop_steps))


def _decide(
    index: DeclaredIndex, same_named: LiveIndex | None, reason: str | None,
    drops: list[LiveIndex], blockers: list[LiveIndex], *, prune: bool, rebuild_unique: bool,
    default: Mapping[str, object] | None, capabilities: ServerCapabilities,
) -> _Decision:
    """A create or rebuild, settled against the undeclared indexes in its way."""
    to = index.spec()
    from_ = same_named.value() if same_named is not None else None
    live_name = None
    if blockers:
        first = blockers[0]
        live_name, from_ = first.name, first.value()
        identical = (same_named is None and len(blockers) == 1
                     and not compare_index(index, first, default, capabilities).diffs)
        if not prune:
            if identical:
                return _Decision(index, _row(index, "unchanged", reason=f'exists as "{first.name}"',
                                             live_name=first.name))
            return _Decision(index, _row(
                index, "conflict", live_name=first.name, from_=from_, to=to,
                reason=f'the undeclared index "{first.name}" covers the same key; declare it '
                       "under its own name, or converge with prune to replace it"))
        replaces = ", ".join(f'"{blocker.name}"' for blocker in blockers)
        reason = "name" if identical else "; ".join(
            part for part in (reason, f"replaces {replaces}") if part)
        drops = [*drops, *blockers]
    action = "recreate" if drops else "create"
    if (action == "recreate" and index.options.get("unique") and not rebuild_unique
            and any(dropped.unique for dropped in drops)):
        return _Decision(index, _row(index, "conflict", reason=f"{reason}; {UNIQUE_REBUILD}",
                                     live_name=live_name, from_=from_, to=to))
    return _Decision(index, _row(index, action, reason=reason, live_name=live_name,
                                 from_=from_, to=to), drops=drops)


def _backs_shard_key(index: LiveIndex, shard_key: Mapping[str, object] | None) -> bool:
    fields = list(shard_key or {})
    return bool(fields) and [name for name, _ in index.key[:len(fields)]] == fields


def _undeclared(
    index: LiveIndex, *, prune: bool, partial: bool, shard_key: Mapping[str, object] | None,
    replaced_version_key: tuple[tuple[str, int | str], ...] | None,
) -> PlanRow | None:
    """The row of a live index nothing declares (``None``: not listed in partial mode)."""
    if replaced_version_key is not None and same_key(replaced_version_key, index.key) and (
            partial or not prune):
        return _row(index, "keep", from_=index.value(), reason="replaced by the "
                    "shard-key-prefixed version index; drop it once no query hints it")
    if partial:
        return None
    if prune and _backs_shard_key(index, shard_key):
        return _row(index, "keep", from_=index.value(), reason="backs the shard key")
    return _row(index, "drop" if prune else "keep", from_=index.value(), reason="not declared")


def _modify_steps(decisions: Sequence[_Decision]) -> tuple[Step, ...]:
    steps: list[Step] = []
    for decision in decisions:
        if decision.row.action != "modify":
            continue
        changes = {name: value for name, value in decision.in_place.items() if name != "unique"}
        rows = (decision.row.id,)
        if "unique" in decision.in_place:
            steps.append(ConvertUnique(rows=rows, name=decision.index.name, changes=changes))
        else:
            steps.append(CollModIndex(rows=rows, name=decision.index.name, changes=changes))
    return tuple(steps)


def _build_steps(
    decisions: Sequence[_Decision], default: Mapping[str, object] | None
) -> tuple[CreateIndexes | None, tuple[Rebuild, ...]]:
    """Creates batched into one ``createIndexes``; each rebuild its own step, except those
    entangled (a create colliding with what another rebuild drops), merged into one group."""
    units = [d for d in decisions if d.row.action in ("create", "recreate")]
    parent = list(range(len(units)))

    def find(at: int) -> int:
        while parent[at] != at:
            parent[at] = parent[parent[at]]
            at = parent[at]
        return at

    for mine, unit in enumerate(units):
        for theirs, other in enumerate(units):
            if mine != theirs and any(collides(unit.index, dropped, default)
                                      for dropped in other.drops):
                parent[find(mine)] = find(theirs)
    components: dict[int, list[_Decision]] = {}
    for position, unit in enumerate(units):
        components.setdefault(find(position), []).append(unit)
    creates: list[_Decision] = []
    single: list[Rebuild] = []
    groups: list[Rebuild] = []
    for members in components.values():
        if len(members) == 1 and not members[0].drops:
            creates.append(members[0])
            continue
        step = Rebuild(rows=tuple(member.row.id for member in members),
                       drops=tuple(dict(dropped.spec) for member in members
                                   for dropped in member.drops),
                       creates=tuple(member.index.spec() for member in members),
                       group=len(members) > 1)
        (groups if step.group else single).append(step)
    batch = CreateIndexes(rows=tuple(unit.row.id for unit in creates),
                          specs=tuple(unit.index.spec() for unit in creates)) if creates else None
    return batch, (*single, *groups)
