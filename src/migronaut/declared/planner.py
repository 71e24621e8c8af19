"""The converge planner: one definition + what the server has → rows and steps (§2.4).

A pure function, so the same plan serves the dry run, ``--check``, the real run's first plan and
every re-plan and fixed-point check. Invariants: a view or time-series collection is one
``conflict`` and nothing else; a missing collection is created with the validator options only
and only when something will live in it; steps run validator → search submissions → index
creates (one batch) → in-place changes → rebuilds → prune drops → search drops, so anything is
removed only after everything declared exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from migronaut.declared.canonical import same
from migronaut.declared.definition import CollectionDefinition
from migronaut.declared.index_plan import IndexPlan, plan_indexes
from migronaut.declared.indexes import DeclaredIndex
from migronaut.declared.live import LiveCollection, ServerCapabilities
from migronaut.declared.plan import (
    CollectionPlan,
    CollModValidator,
    CreateCollection,
    PlanRow,
    Step,
)
from migronaut.declared.search_plan import SearchAvailability, SearchPlan, plan_search_indexes
from migronaut.declared.versioned import desired_validator, live_version_floor, version_index

__all__ = ["PlanOptions", "floor_to_probe", "managed_indexes", "plan_collection"]

_VALIDATOR_PARTS = ("validator", "validationLevel", "validationAction")


@dataclass(frozen=True)
class PlanOptions:
    """The call's options. ``prune`` is only the default: a definition's own ``prune`` wins."""

    prune: bool = False
    rebuild_unique: bool = False
    capabilities: ServerCapabilities = field(default_factory=ServerCapabilities)
    search: SearchAvailability = field(default_factory=SearchAvailability)


def floor_to_probe(definition: CollectionDefinition, live: LiveCollection) -> int | None:
    """The ``min`` the executor must probe for documents below (§3.3.4), or ``None`` when no
    probe is needed: not versioned, ``min`` 0, missing or irregular collection, or the live
    validator already enforcing a floor at least ``min``."""
    spec = definition.versioning
    if spec is None or spec.min == 0 or not live.exists or live.type != "collection":
        return None
    state = live.validator_state()
    floor = live_version_floor(state["validator"] if state else None, spec.field)
    return None if floor is not None and floor >= spec.min else spec.min


def managed_indexes(definition: CollectionDefinition, live: LiveCollection
                    ) -> tuple[DeclaredIndex, ...] | None:
    """The declared indexes plus versioning's index (shard-key variant behind a mongos);
    ``None`` when indexes are not managed at all."""
    spec = definition.versioning
    extra = (version_index(spec, live.shard_key),) if spec is not None and spec.index else ()
    if definition.indexes is None and not extra:
        return None
    return (*(definition.indexes or ()), *extra)


def _validator_row(definition: CollectionDefinition, live: LiveCollection) -> PlanRow | None:
    if not definition.manages_validator and definition.versioning is None:
        return None
    desired = desired_validator(definition)
    have = live.validator_state() if live.exists else None
    row = None
    if desired is None:
        row = PlanRow("validator", live.name, "unchanged") if have is None else PlanRow(
            "validator", live.name, "drop", from_=have)
    elif have is None:
        row = PlanRow("validator", live.name, "create", to=desired)
    else:
        changed = [part for part in _VALIDATOR_PARTS if not same(desired[part], have[part])]
        row = PlanRow("validator", live.name, "modify", reason=", ".join(changed), from_=have,
                      to=desired) if changed else PlanRow("validator", live.name, "unchanged")
    floor = live.version_floor
    if desired is not None and floor is not None and floor.below is not False:
        if floor.below is True:
            reason = (f"documents below version {floor.min} remain; raising min would "
                      "invalidate them — let the background migration that upgrades them "
                      "finish (migronaut background status), then converge again")
        else:
            reason = (f"could not check for documents below version {floor.min} "
                      f"({floor.error or 'unknown cause'}); converge with the old min first so "
                      "the version index exists, then raise it")
        row = PlanRow("validator", live.name, "conflict", reason=reason, to=desired)
    return row


def plan_collection(definition: CollectionDefinition, live: LiveCollection,
                    options: PlanOptions | None = None) -> CollectionPlan:
    """Plan one collection (§2.4): rows in the reference's order and the steps carrying them."""
    options = options or PlanOptions()
    name = definition.name
    if live.exists and live.type != "collection":
        return CollectionPlan(name, (PlanRow("collection", name, "conflict",
                                             reason=f"is a {live.type}, not a regular "
                                                    "collection"),))
    prune = options.prune if definition.prune is None else definition.prune
    validator = _validator_row(definition, live)
    declared = managed_indexes(definition, live)
    indexes = None
    if declared is not None:
        spec = definition.versioning
        ordinary = version_index(spec) if spec is not None and spec.index else None
        sharded = declared[-1] if ordinary is not None else None
        indexes = plan_indexes(
            declared, live, prune=prune, rebuild_unique=options.rebuild_unique,
            capabilities=options.capabilities, partial=definition.indexes is None,
            replaced_version_key=ordinary.key if ordinary is not None and sharded is not None
            and sharded.name != ordinary.name else None)
    search = None
    if definition.search_indexes is not None:
        search = plan_search_indexes(definition.search_indexes, live.search_indexes or (),
                                     prune=prune, search=options.search)
    rows: list[PlanRow] = []
    steps: list[Step] = []
    if not live.exists:
        wanted = (validator is not None and validator.action == "create") or bool(declared) or (
            bool(definition.search_indexes) and options.search.available)
        if not wanted:
            return CollectionPlan(name, search.rows if search else ())
        collection_row = PlanRow("collection", name, "create")
        rows.append(collection_row)
        settled = [collection_row.id]
        if validator is not None and validator.action == "create":
            rows.append(validator)
            settled.append(validator.id)
            fields = validator.to
            steps.append(CreateCollection(rows=tuple(settled), options=dict(fields)))
        else:
            steps.append(CreateCollection(rows=tuple(settled)))
    elif validator is not None:
        rows.append(validator)
        if validator.action in ("create", "modify"):
            steps.append(CollModValidator(rows=(validator.id,), fields=dict(validator.to)))
        elif validator.action == "drop":
            steps.append(CollModValidator(rows=(validator.id,), fields={"validator": {}}))
    rows.extend(indexes.rows if indexes else ())
    rows.extend(search.rows if search else ())
    steps.extend(_ordered_steps(indexes, search))
    return CollectionPlan(name, tuple(rows), tuple(steps))


def _ordered_steps(indexes: IndexPlan | None, search: SearchPlan | None) -> list[Step]:
    """Search submissions, index creates, in-place changes, rebuilds, drops, search drops."""
    steps: list[Step] = []
    if search is not None:
        steps.extend(([search.create] if search.create else []) + list(search.updates))
    if indexes is not None:
        steps.extend(([indexes.creates] if indexes.creates else []) + list(indexes.modifies)
                     + list(indexes.rebuilds) + list(indexes.drops))
    if search is not None:
        steps.extend(search.drops)
    return steps
