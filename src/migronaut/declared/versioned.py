"""What a ``versioning`` block makes converge manage: validator rules and the version index
(reference collections §3.3).

Versioning adds no row kind of its own: its rules are merged into the declared validator and its
index is one more declared index. Invariant: the rules never carry a ``maximum`` on the version
(newer releases may write ahead during a rolling deploy), and the revision admits ``long``
because ``$inc`` promotes past 2^31−1.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from migronaut.declared.definition import CollectionDefinition
from migronaut.declared.indexes import DeclaredIndex, default_index_name, server_key
from migronaut.declared.versioning import VersioningSpec

__all__ = ["desired_validator", "live_version_floor", "version_index", "version_rules"]


def version_rules(spec: VersioningSpec) -> dict[str, Any]:
    """The ``$jsonSchema`` rules for the version (and revision) field."""
    properties: dict[str, Any] = {spec.field: {"bsonType": "int", "minimum": spec.min}}
    required = [spec.field]
    if spec.revision_field:
        properties[spec.revision_field] = {"bsonType": ["int", "long"], "minimum": 0}
        required.append(spec.revision_field)
    rules: dict[str, Any] = {"properties": properties}
    if spec.min > 0:
        rules["required"] = required
    return rules


def _merged(validator: Mapping[str, Any] | None, spec: VersioningSpec) -> dict[str, Any]:
    rules = version_rules(spec)
    if not validator:
        return {"$jsonSchema": rules}
    merged = copy.deepcopy(dict(validator))
    schema = merged.get("$jsonSchema")
    if not isinstance(schema, Mapping):  # query operators only: the server applies both
        merged["$jsonSchema"] = rules
        return merged
    schema = dict(schema)
    schema["properties"] = {**dict(schema.get("properties") or {}), **rules["properties"]}
    required = [*schema.get("required", ()), *rules.get("required", ())]
    if required:
        schema["required"] = required
    merged["$jsonSchema"] = schema
    return merged


def desired_validator(definition: CollectionDefinition) -> dict[str, Any] | None:
    """The validator state the definition asks for (§2.4.2): ``{validator, validationLevel,
    validationAction}`` with the defaults filled, or ``None`` for "no validator". Call only
    when the definition manages a validator or is versioned."""
    spec = definition.versioning
    if spec is None and not definition.validator:
        return None
    level = definition.validation_level
    if spec is not None:
        validator = _merged(definition.validator, spec)
        if level is None and not definition.validator:
            level = "moderate"  # updates to legacy documents still pass
    else:
        validator = copy.deepcopy(dict(definition.validator or {}))
    return {"validator": validator, "validationLevel": level or "strict",
            "validationAction": definition.validation_action or "error"}


def version_index(spec: VersioningSpec, shard_key: Mapping[str, Any] | None = None
                  ) -> DeclaredIndex:
    """The version index ``{<field>: 1, _id: 1}``; behind a mongos with a readable shard key,
    ``{<field>: 1, …shard key (the version field skipped), _id: 1}`` — ``_id`` once."""
    key: list[tuple[str, int | str]] = [(spec.field, 1)]
    for name, direction in (shard_key or {}).items():
        if name != spec.field:
            key.append((name, direction if isinstance(direction, str) else int(direction)))
    if all(name != "_id" for name, _ in key):
        key.append(("_id", 1))
    pairs = tuple(key)
    return DeclaredIndex(name=default_index_name(pairs), key=pairs, server_key=server_key(pairs),
                         is_text=False, options={}, is_version_index=True)


def live_version_floor(validator: Mapping[str, Any] | None, field: str) -> int | None:
    """The floor a live validator enforces: the ``minimum`` of its ``$jsonSchema`` rule for
    the version field, or ``None``."""
    schema = (validator or {}).get("$jsonSchema")
    rule = schema.get("properties", {}).get(field) if isinstance(schema, Mapping) else None
    minimum = rule.get("minimum") if isinstance(rule, Mapping) else None
    if isinstance(minimum, bool) or not isinstance(minimum, (int, float)):
        return None
    return int(minimum)
