"""The stored shapes of background state: schema, limits, statuses and their moves, indexes,
the checks that refuse a stored value migronaut does not know, and the builders of the update
pipelines that write them.

Shared by the state documents (:mod:`~migronaut.background.state.store`), the partitions and leases
(:mod:`~migronaut.background.state.partitions`) and the features that write beside them; user
values inside an update pipeline are always wrapped in ``$literal`` (:func:`literal`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from migronaut._values import is_int
from migronaut.errors import BackgroundConflictError, StateInvalidError

__all__ = [
    "ACTIONS",
    "COUNTERS",
    "DOC_ERRORS_KEPT",
    "HISTORY_KEPT",
    "INDEXES",
    "MAX_BAD_IDS",
    "OPEN_STATUSES",
    "PHASES",
    "SCHEMA",
    "TERMINAL",
    "TRANSITIONS",
    "control_stamp",
    "history_entry",
    "is_count",
    "literal",
    "max_parallel",
    "set_stage",
    "stamped",
    "state_update",
    "stored_round",
    "transition",
    "understood",
]

SCHEMA = 2
MAX_BAD_IDS = 1000
DOC_ERRORS_KEPT = 20
HISTORY_KEPT = 50

OPEN_STATUSES = ("blocked", "pending", "running", "paused")
TERMINAL = ("completed", "failed", "cancelled")
COUNTERS = (
    "scanned", "migrated", "skipped", "conflicts", "failed", "retried", "batches", "processed",
    "txnRetries",
)

#: (collection suffix, name, keys, options) — the four indexes of reference background §2.2.
INDEXES: tuple[tuple[str, str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("", "status_registeredAt", [("status", 1), ("registeredAt", 1)], {}),
    ("_partitions", "claim",
     [("background", 1), ("generation", 1), ("plan", 1), ("status", 1), ("seq", 1)], {}),
    ("_partitions", "lease_slot", [("background", 1), ("lease.slot", 1)],
     {"unique": True, "partialFilterExpression": {"lease.slot": {"$exists": True}}}),
    ("_partitions", "lease_group_slot", [("background", 1), ("lease.groupSlot", 1)],
     {"unique": True, "partialFilterExpression": {"lease.groupSlot": {"$exists": True}}}),
)

#: What ``phase`` may hold (reference background §2): plan, process the plan, supersede it.
PHASES = ("partition", "process", "replan")


def _invalid(state: Mapping[str, Any], field: str, value: Any, expected: str
             ) -> StateInvalidError:
    return StateInvalidError(
        f"Background migration {state.get('_id')} has a {field} migronaut does not understand: "
        f"{value!r} (expected {expected})",
        {"collection": "background", "record": str(state.get("_id")),
         "problems": [{"field": field, "value": repr(value)}]})


def is_count(value: Any) -> TypeGuard[int]:
    """A non-negative integer (``True`` is not one)."""
    return is_int(value) and value >= 0


def stored_round(state: Mapping[str, Any]) -> int:
    """The state's coordinator ``round`` (0 when absent); anything but a non-negative integer is
    ``STATE_INVALID`` — a chain must never guess which round is current."""
    value = state.get("round", 0)
    if value is None:
        return 0
    if not is_count(value):
        raise _invalid(state, "round", value, "a non-negative integer")
    return value


def understood(state: Mapping[str, Any]) -> bool:
    """Whether migronaut may act on ``state``: ``False`` when a newer migronaut wrote it (its
    ``schema`` above ours: wait for it). Fail closed on the fields every driver and view decides
    on: a ``schema`` that is not a positive integer, or a ``status``, ``phase``, ``generation``,
    ``plan``, ``spec`` or ``spec.maxParallel`` migronaut does not know is ``STATE_INVALID`` naming
    the field — never read as some status, as "plan again" or as "nothing to claim"."""
    schema = state.get("schema", SCHEMA)
    if not is_count(schema) or schema < 1:
        raise _invalid(state, "schema", schema, "a positive integer")
    if schema > SCHEMA:
        return False
    status = state.get("status")
    if status not in (*OPEN_STATUSES, *TERMINAL):
        raise _invalid(state, "status", status, "one of " + ", ".join((*OPEN_STATUSES, *TERMINAL)))
    phase = state.get("phase")
    if phase is not None and phase not in PHASES:
        raise _invalid(state, "phase", phase, "one of " + ", ".join(PHASES))
    generation = state.get("generation")
    if generation is not None and not is_count(generation):
        raise _invalid(state, "generation", generation, "a non-negative integer")
    plan = state.get("plan")
    if plan is not None and (not isinstance(plan, Mapping)
                             or not isinstance(plan.get("token"), str)
                             or not is_count(plan.get("generation"))):
        raise _invalid(state, "plan", plan,
                       "a document with a string token and a non-negative integer generation")
    max_parallel(state)
    return True


def max_parallel(state: Mapping[str, Any]) -> int:
    """The state's ``spec.maxParallel`` (1 when absent); a ``spec`` that is not a document, or a
    ``maxParallel`` that is not a positive integer, is ``STATE_INVALID`` — the slot cap must
    never be guessed."""
    spec = state.get("spec")
    if spec is None:
        return 1
    if not isinstance(spec, Mapping):
        raise _invalid(state, "spec", spec, "a document")
    value = spec.get("maxParallel")
    if value is None:
        return 1
    if not is_count(value) or value < 1:
        raise _invalid(state, "spec.maxParallel", value, "a positive integer")
    return value


# action -> (allowed from, goes to, already-done statuses) — reference background §2.5.
TRANSITIONS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "unblock": (("blocked",), "pending", ("pending", "running", "paused")),
    "plan": (("pending",), "running", ("running",)),
    "complete": (("running",), "completed", ("completed",)),
    "fail": (("blocked", "pending", "running"), "failed", ("failed",)),
    "pause": (("blocked", "pending", "running"), "paused", ("paused",)),
    "resume": (("paused",), "pending", ("blocked", "pending", "running")),
    "cancel": (("blocked", "pending", "running", "paused"), "cancelled", ("cancelled",)),
    "retry": (("failed", "cancelled"), "pending", ("pending",)),
    "reopen": (("completed",), "running", ("running",)),
}
ACTIONS = tuple(TRANSITIONS)


def transition(name: str, status: str, action: str) -> tuple[str, bool]:
    """The status ``action`` leads to from ``status`` and whether it changes anything.

    Already being where the action leads is not an error (``changed`` is ``False``); anything
    else not in the table is ``BACKGROUND_CONFLICT``.
    """
    rule = TRANSITIONS.get(action)
    if rule is not None:
        allowed, to, done = rule
        if status in allowed:
            return to, True
        if status in done:
            return status, False
    raise BackgroundConflictError(
        f"Cannot {action} background migration {name}: it is {status}",
        {"migration": name, "action": action, "status": status},
    )


def literal(value: Any) -> dict[str, Any]:
    return {"$literal": value}


def stamped(fields: Mapping[str, Any], *server_times: str) -> dict[str, Any]:
    """An object value for a pipeline ``$set``: ``fields`` as literals plus ``server_times``
    stamped with ``$$NOW``, replacing the stored object whole.

    A plain ``{"a": {...}}`` would be merged into the stored object by mongod (and ``{"a": …,
    "a.at": "$$NOW"}`` is refused, error 40176), so object values go through ``$mergeObjects``.
    """
    return {"$mergeObjects": [literal(dict(fields)), {name: "$$NOW" for name in server_times}]}


def set_stage(
    set_fields: Mapping[str, Any], server_times: Sequence[str] = ()
) -> dict[str, Any]:
    """A pipeline ``$set`` stage: ``set_fields`` as literals, ``server_times`` as ``$$NOW``.

    A server time inside a field that is also set (``plan`` and ``plan.at``) is stamped into
    that object, never named beside it (mongod refuses a path and its sub-path, 40176).
    """
    stage: dict[str, Any] = {k: literal(v) for k, v in set_fields.items()}
    for path in server_times:
        parent, _, leaf = path.partition(".")
        if leaf and parent in set_fields:
            stage[parent] = stamped(set_fields[parent], leaf)
        else:
            stage[path] = "$$NOW"
    return stage


def history_entry(action: str, to: str | None, by: str | None, reason: str | None) -> Any:
    entry: dict[str, Any] = {"at": "$$NOW", "action": literal(action), "from": "$status"}
    entry["to"] = literal(to) if to is not None else "$status"
    if by is not None:
        entry["by"] = literal(by)
    if reason is not None:
        entry["reason"] = literal(reason)
    return {
        "$concatArrays": [
            {"$slice": [{"$ifNull": ["$history", []]}, -(HISTORY_KEPT - 1)]},
            [entry],
        ]
    }


def control_stamp(action: str, by: str | None, reason: str | None) -> dict[str, Any]:
    """The state's ``control`` object: the last control applied, who asked and why."""
    fields: dict[str, Any] = {"action": action}
    if by:
        fields["requestedBy"] = by
    if reason:
        fields["reason"] = reason
    return stamped(fields, "at")


def state_update(
    set_fields: Mapping[str, Any], server_times: Sequence[str] = (),
    inc: Mapping[str, int] | None = None, unset: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The pipeline of a state update that does not move its status: ``set_fields`` as
    literals, ``server_times`` stamped ``$$NOW``, ``inc`` added, ``unset`` removed."""
    stage = set_stage(set_fields, server_times)
    for key, amount in (inc or {}).items():
        stage[key] = {"$add": [{"$ifNull": ["$" + key, 0]}, amount]}
    stage["updatedAt"] = "$$NOW"
    pipeline: list[dict[str, Any]] = [{"$set": stage}]
    if unset:
        pipeline.append({"$unset": list(unset)})
    return pipeline
