"""Versioned, validated job payloads (reference background §6.4 "Job names and payloads").

Every job carries ``v`` (:data:`VERSION`) and ``kind``; each kind has an allow-list of fields with
their checks. A payload from a newer producer, an unknown kind or field, or a bad value is refused
with ``QUEUE_JOB_INVALID`` before any work — a worker never guesses what a job meant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from migronaut._values import int_within, is_int
from migronaut.errors import QueueJobInvalidError

__all__ = ["FIELDS", "VERSION", "Check", "fragment", "validate"]

VERSION = 1
MAX_NAME = 255

Check = Callable[[Any], str | None]  # the problem with a value, or None


def _int(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        if not int_within(value, low, high):
            return f"must be an integer from {low} to {high}"
        return None
    return check


def _text(limit: int) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str) or not value or len(value) > limit:
            return f"must be a non-empty string of at most {limit} characters"
        return None
    return check


def _migration(value: Any) -> str | None:
    if (not isinstance(value, str) or not value or len(value) > MAX_NAME
            or "/" in value or "\\" in value or value in (".", "..") or "\x00" in value):
        return f"must be a bare migration file name of at most {MAX_NAME} characters"
    return None


def _tenant(value: Any) -> str | None:
    from migronaut._names import validate_db_name

    return validate_db_name(value)


def _fleet_command(value: Any) -> str | None:
    return None if value in ("up", "down", "converge") else "must be 'up', 'down' or 'converge'"


def _true(value: Any) -> str | None:
    return None if value is True else "must be true when present"


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _sha256(value: Any) -> str | None:
    if (not isinstance(value, str) or len(value) != 64
            or any(c not in "0123456789abcdef" for c in value)):
        return "must be 64 lower-case hex characters (a SHA-256)"
    return None


#: The checks everyone shares; a kind's allow-list picks from them.
MIGRATION: Check = _migration
ROUND: Check = _int(1, 2**31 - 1)
COUNT: Check = _int(0, 2**31 - 1)
LANE: Check = _int(0, 63)
REQUESTED_BY: Check = _text(128)
REASON: Check = _text(512)
TOKEN: Check = _text(128)
BOOL: Check = _bool
TRUE: Check = _true
BATCH: Check = _int(1, 2**31 - 1)
CHECKSUM: Check = _sha256
TENANT: Check = _tenant
CLUSTER: Check = _text(64)
FLEET_COMMAND: Check = _fleet_command
#: Fields that come together or not at all (a tenant is a database on a cluster).
PAIRED = (("tenant", "cluster"),)

#: kind -> {field: (check, required)}. The migration queue's kinds: ``up`` (one file, ordered,
#: with its batch and planned checksum — or a bulk ``up`` to ``to``), ``down`` (one file or the
#: last batch), ``converge`` (never ``prune``: pruning comes only from the worker's definitions)
#: and the periodic ``sync``; then the background queue's, whose coordinator and lane jobs may
#: name a fleet tenant (``tenant`` with its ``cluster``, both or neither): the job then works that
#: tenant's database, and without them — every payload written before they existed too — the
#: worker's own.
FIELDS: dict[str, dict[str, tuple[Check, bool]]] = {
    "up": {
        "migration": (MIGRATION, False), "to": (MIGRATION, False), "batch": (BATCH, False),
        "ordered": (BOOL, False), "checksum": (CHECKSUM, False), "groupId": (TOKEN, False),
        "requestedBy": (REQUESTED_BY, False), "reason": (REASON, False),
    },
    "down": {
        "migration": (MIGRATION, False), "ordered": (BOOL, False), "groupId": (TOKEN, False),
        "requestedBy": (REQUESTED_BY, False), "reason": (REASON, False),
    },
    "converge": {
        "ordered": (BOOL, False), "groupId": (TOKEN, False),
        "requestedBy": (REQUESTED_BY, False), "reason": (REASON, False),
    },
    "sync": {"requestedBy": (REQUESTED_BY, False), "reason": (REASON, False)},
    "background": {
        "migration": (MIGRATION, True), "round": (ROUND, False), "spawn": (COUNT, False),
        "takeover": (TRUE, False), "requestedBy": (REQUESTED_BY, False),
        "reason": (REASON, False), "attempt": (COUNT, False),
        "tenant": (TENANT, False), "cluster": (CLUSTER, False),
    },
    "background-lane": {
        "migration": (MIGRATION, True), "registration": (TOKEN, True),
        "generation": (COUNT, True), "round": (ROUND, False), "spawn": (COUNT, False),
        "lane": (LANE, True), "retry": (COUNT, False),
        "tenant": (TENANT, False), "cluster": (CLUSTER, False),
    },
    "background-verify": {},
    # a fleet run fanned out on the migration queue: one tenant's command, and the step that
    # coordinates the run (its plan lives in the fleet run record)
    "fleet-tenant": {
        "runId": (TOKEN, True), "tenant": (TENANT, True), "cluster": (CLUSTER, True),
        "command": (FLEET_COMMAND, True), "steps": (BATCH, False),
        "requestedBy": (REQUESTED_BY, False), "reason": (REASON, False),
    },
    "fleet-step": {"runId": (TOKEN, True)},
}


def validate(kind: str, data: Any) -> dict[str, Any]:
    """``data`` as a checked payload of ``kind``; ``QUEUE_JOB_INVALID`` naming the first problem.

    ``data`` must carry ``v`` (:data:`VERSION`) and the same ``kind``; every other field must be
    on the kind's allow-list and pass its check, and every required field must be there.
    """
    def invalid(problem: str, field: str | None = None) -> QueueJobInvalidError:
        where = f"{kind} job" + (f" field {field!r}" if field else "")
        return QueueJobInvalidError(f"Invalid queue job: {where} {problem}",
                                    {"kind": kind, **({"field": field} if field else {})})

    allowed = FIELDS.get(kind)
    if allowed is None:
        raise invalid("is not a job kind this version knows")
    if not isinstance(data, Mapping):
        raise invalid("payload must be an object")
    version = data.get("v")
    if not is_int(version):
        raise invalid("must carry an integer v", "v")
    if version > VERSION:
        raise invalid(f"has v={version}, newer than this worker understands ({VERSION}) — "
                      "upgrade the workers before the producers", "v")
    if version < 1:
        raise invalid(f"has v={version}; versions start at 1", "v")
    if data.get("kind") != kind:
        raise invalid(f"must carry kind {kind!r}", "kind")
    for field, value in data.items():
        if field in ("v", "kind"):
            continue
        if field not in allowed:
            raise invalid("is not a known field", str(field))
        problem = allowed[field][0](value)
        if problem:
            raise invalid(problem, field)
    for field, (_, required) in allowed.items():
        if required and field not in data:
            raise invalid("is required", field)
    for field, partner in PAIRED:
        if field in allowed and (field in data) != (partner in data):
            present, missing = (field, partner) if field in data else (partner, field)
            raise invalid(f"is required with {present!r}", missing)
    return dict(data)


def fragment(name: str) -> str:
    """``name`` made safe for a task id: ``[A-Za-z0-9._-]`` kept, anything else ``~`` + its UTF-8
    bytes in upper-case hex — reversible and collision-free (reference background §6.4)."""
    out = []
    for char in name:
        if char.isascii() and (char.isalnum() or char in "._-"):
            out.append(char)
        else:
            out.append("~" + char.encode("utf-8").hex().upper())
    return "".join(out)
