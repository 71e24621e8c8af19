"""The dev server's ``collMod``: mongoeco has none, converge needs it.

Served as ``mongod`` 7.0 serves it: the collection's ``validator``/``validationLevel``/
``validationAction`` (enforced afterwards by mongoeco's own validation), and ``index: {name |
keyPattern, expireAfterSeconds | hidden | prepareUnique | unique}`` with mongod's reply fields
(``hidden_old``/``hidden_new``, …) and error codes. Everything is checked before anything
changes. An index change is a drop and re-create of the same index inside mongoeco (it has no
way to alter one), so it is not atomic towards concurrent clients; ``prepareUnique`` is
remembered by the layer (:class:`~migronaut.devserver.catalog.IndexExtras`) and listed, but
mongoeco does not refuse new duplicates because of it. The collection's options are replaced
through ``set_options`` (the wire layer passes
:func:`~migronaut.devserver.mongoeco_internals.set_collection_options`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from migronaut.devserver.catalog import (
    IndexExtras,
    Refused,
    mongod_collection,
    mongod_index,
    unknown_field,
    wrong_type,
)

__all__ = ["CollMod", "check_validator"]

#: Runs one command inside mongoeco (no layer) and returns its reply; raises on ``ok: 0``.
Run = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
#: Replaces a collection's stored options.
SetOptions = Callable[[str, str, dict[str, Any]], Awaitable[None]]

_VALIDATION: Final = ("validator", "validationLevel", "validationAction")
_LEVELS: Final = ("off", "strict", "moderate")
_ACTIONS: Final = ("error", "warn")
_IGNORED: Final = frozenset({"collMod", "writeConcern", "comment", "maxTimeMS", "$db"})
_INDEX_CHANGES: Final = ("expireAfterSeconds", "hidden", "prepareUnique", "unique")
_MAX_TTL: Final = 2**31 - 1
_NOT_TO_RECREATE: Final = frozenset({"ns", "v"})


def _wrong_type(field: str, value: Any, expected: str) -> Refused:
    return wrong_type(f"collMod.{field}", value, expected)


def _shown(key: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{name}: {json.dumps(value)}" for name, value in key.items()) + " }"


class CollMod:
    """One ``collMod`` command against database ``db``."""

    def __init__(self, db: str, run: Run, set_options: SetOptions, extras: IndexExtras) -> None:
        self.db, self._run, self._set_options, self._extras = db, run, set_options, extras

    async def __call__(self, command: Mapping[str, Any]) -> dict[str, Any]:
        coll = command.get("collMod")
        if not isinstance(coll, str) or not coll:
            raise _wrong_type("collMod", coll, "string")
        for field in command:
            if field not in _IGNORED and field not in _VALIDATION and field != "index":
                raise unknown_field(f"collMod.{field}")
        self._check_validation(command)
        found = await self._run({"listCollections": 1, "filter": {"name": coll}})
        listed = found["cursor"]["firstBatch"]
        if not listed:
            raise Refused(26, "NamespaceNotFound", f"ns does not exist: {self.db}.{coll}")
        collection = mongod_collection(listed[0])
        validation = {field: command[field] for field in _VALIDATION if field in command}
        if validation and collection["type"] != "collection":
            raise Refused(72, "InvalidOptions",
                          f"option not supported on a view: {next(iter(validation))}")
        if isinstance(validation.get("validator"), Mapping) and validation["validator"]:
            await check_validator(self._run, coll, validation["validator"])
        reply: dict[str, Any] = {}
        if "index" in command:
            reply.update(await self._index(coll, command["index"]))
        if validation:
            options = dict(listed[0].get("options") or {})
            options.update(validation)
            if not options.get("validator"):
                options.pop("validator", None)
            await self._set_options(self.db, coll, options)
        reply["ok"] = 1.0
        return reply

    @staticmethod
    def _check_validation(command: Mapping[str, Any]) -> None:
        if "validator" in command and not isinstance(command["validator"], Mapping):
            raise _wrong_type("validator", command["validator"], "object")
        for field, allowed in (("validationLevel", _LEVELS), ("validationAction", _ACTIONS)):
            if field not in command:
                continue
            if not isinstance(command[field], str):
                raise _wrong_type(field, command[field], "string")
            if command[field] not in allowed:
                raise Refused(2, "BadValue", f"Enumeration value '{command[field]}' for field "
                              f"'collMod.{field}' is not a valid value.")
        if "index" in command and not isinstance(command["index"], Mapping):
            raise _wrong_type("index", command["index"], "object")

    # -- index -------------------------------------------------------------------------------

    async def _index(self, coll: str, request: Mapping[str, Any]) -> dict[str, Any]:
        changes = {name: request[name] for name in _INDEX_CHANGES if name in request}
        unknown = [name for name in request
                   if name not in _INDEX_CHANGES and name not in ("name", "keyPattern")]
        if unknown:
            raise unknown_field(f"collMod.index.{unknown[0]}")
        if "name" in request and "keyPattern" in request:
            raise Refused(72, "InvalidOptions", "Cannot specify both key pattern and name.")
        if "name" not in request and "keyPattern" not in request:
            raise Refused(72, "InvalidOptions", "Must specify either index name or key pattern.")
        if not changes:
            raise Refused(72, "InvalidOptions",
                          "no expireAfterSeconds or hidden or prepareUnique or unique field")
        for name in ("hidden", "prepareUnique", "unique"):
            if name in changes and not isinstance(changes[name], bool):
                raise _wrong_type(f"index.{name}", changes[name], "bool")
        raw, listed = await self._find_index(coll, request)
        self._check_changes(listed, changes)
        extras = self._extras.get(self.db, coll, listed["name"])
        spec = {name: value for name, value in raw.items() if name not in _NOT_TO_RECREATE}
        reply: dict[str, Any] = {}
        if "expireAfterSeconds" in changes:
            old, new = listed.get("expireAfterSeconds"), changes["expireAfterSeconds"]
            if old != new:
                if old is not None:
                    reply["expireAfterSeconds_old"] = old
                reply["expireAfterSeconds_new"] = new
                spec["expireAfterSeconds"] = new
        if "hidden" in changes:
            old_hidden = bool(listed.get("hidden", False))
            if old_hidden != changes["hidden"]:
                reply.update(hidden_old=old_hidden, hidden_new=changes["hidden"])
                spec.pop("hidden", None)
                extras.pop("hidden", None)
                if changes["hidden"]:
                    spec["hidden"] = True
        if "prepareUnique" in changes:
            old_prepare = bool(extras.get("prepareUnique", False))
            if old_prepare != changes["prepareUnique"]:
                reply.update(prepareUnique_old=old_prepare,
                             prepareUnique_new=changes["prepareUnique"])
                extras.pop("prepareUnique", None)
                if changes["prepareUnique"]:
                    extras["prepareUnique"] = True
        if changes.get("unique") and not listed.get("unique"):
            await self._check_duplicates(coll, raw)
            spec["unique"] = True
            extras.pop("prepareUnique", None)
            extras.pop("unique", None)
            reply["unique_new"] = True
        if spec != {name: value for name, value in raw.items() if name not in _NOT_TO_RECREATE}:
            await self._recreate(coll, raw, spec)
        self._extras.put(self.db, coll, listed["name"], extras)
        return reply

    async def _find_index(
        self, coll: str, request: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The index ``request`` names: mongoeco's document and mongod's listing of it."""
        reply = await self._run({"listIndexes": coll})
        pairs = [(raw, mongod_index(raw, self._extras.get(self.db, coll, raw.get("name", ""))))
                 for raw in reply["cursor"]["firstBatch"]]
        if "name" in request:
            matches = [pair for pair in pairs if pair[1]["name"] == request["name"]]
            shown = str(request["name"])
        else:
            pattern = request["keyPattern"]
            if not isinstance(pattern, Mapping):
                raise _wrong_type("index.keyPattern", pattern, "object")
            matches = [pair for pair in pairs
                       if list(pair[1]["key"].items()) == list(pattern.items())]
            shown = _shown(pattern)
            if len(matches) > 1:
                raise Refused(289, "AmbiguousIndexKeyPattern",
                              f"index keyPattern {shown} matches {len(matches)} indexes, "
                              "must use index name")
        if not matches:
            raise Refused(27, "IndexNotFound",
                          f"cannot find index {shown} for ns {self.db}.{coll}")
        return matches[0]

    @staticmethod
    def _check_changes(listed: Mapping[str, Any], changes: Mapping[str, Any]) -> None:
        key = listed["key"]
        if "expireAfterSeconds" in changes:
            ttl = changes["expireAfterSeconds"]
            if isinstance(ttl, bool) or not isinstance(ttl, int | float):
                raise _wrong_type("index.expireAfterSeconds", ttl, "long")
            if not 0 <= ttl <= _MAX_TTL:
                raise Refused(72, "InvalidOptions", "TTL index 'expireAfterSeconds' option "
                              "must be within an acceptable range, try a lower number")
            if listed["name"] == "_id_":
                raise Refused(72, "InvalidOptions", "The field 'expireAfterSeconds' is not "
                              "valid for an _id index specification.")
            if "expireAfterSeconds" not in listed and len(key) > 1:
                raise Refused(72, "InvalidOptions", "TTL indexes are single-field indexes, "
                              "compound indexes do not support TTL.")
        if changes.get("hidden") and listed["name"] == "_id_":
            raise Refused(2, "BadValue", "can't hide _id index")
        if changes.get("unique") is False:
            raise Refused(72, "InvalidOptions",
                          "collMod does not support converting an index to 'unique: false'")
        if changes.get("unique") and not listed.get("unique"):
            if "prepareUnique" in changes:
                raise Refused(72, "InvalidOptions", "Cannot set 'unique' and 'prepareUnique' "
                              "at the same time.")
            if not listed.get("prepareUnique"):
                raise Refused(72, "InvalidOptions", "Cannot make index unique with "
                              "'prepareUnique=false'. Run collMod to set it first.")

    async def _check_duplicates(self, coll: str, raw: Mapping[str, Any]) -> None:
        """mongod's CannotConvertIndexToUnique (359), with the ids of each duplicate group."""
        fields = [name for name in raw["key"] if isinstance(name, str)]
        pipeline: list[dict[str, Any]] = []
        if isinstance(raw.get("partialFilterExpression"), Mapping):
            pipeline.append({"$match": dict(raw["partialFilterExpression"])})
        if raw.get("sparse"):
            pipeline.append({"$match": {"$or": [{name: {"$exists": True}} for name in fields]}})
        pipeline += [
            {"$group": {"_id": {f"k{i}": {"$ifNull": ["$" + name, None]}
                                for i, name in enumerate(fields)},
                        "ids": {"$push": "$_id"}, "n": {"$sum": 1}}},
            {"$match": {"n": {"$gt": 1}}},
        ]
        reply = await self._run({"aggregate": coll, "pipeline": pipeline,
                                 "cursor": {"batchSize": 100_000}})
        violations = [{"ids": group["ids"]} for group in reply["cursor"]["firstBatch"]]
        if violations:
            raise Refused(359, "CannotConvertIndexToUnique",
                          "Cannot convert the index to unique. Please resolve conflicting "
                          "documents before running collMod again.", violations=violations)

    async def _recreate(self, coll: str, raw: Mapping[str, Any], spec: dict[str, Any]) -> None:
        """Drop the index and build ``spec``; the old index comes back when the build fails."""
        await self._run({"dropIndexes": coll, "index": raw["name"]})
        try:
            await self._run({"createIndexes": coll, "indexes": [spec]})
        except Exception as error:
            old = {name: value for name, value in raw.items() if name not in _NOT_TO_RECREATE}
            await self._run({"createIndexes": coll, "indexes": [old]})
            if getattr(error, "code", None) == 11000:
                raise Refused(359, "CannotConvertIndexToUnique",
                              "Cannot convert the index to unique. Please resolve conflicting "
                              "documents before running collMod again.", violations=[]) from error
            raise


async def check_validator(run: Run, coll: str, validator: Mapping[str, Any]) -> None:
    """mongod parses a validator before storing it (``collMod``, ``create``); a query with it
    as filter does the same here: BadValue (2) when it does not parse."""
    try:
        await run({"find": coll, "filter": dict(validator), "limit": 1, "projection": {"_id": 1}})
    except Exception as error:  # mongoeco's refusal of the expression
        raise Refused(2, "BadValue", str(error)) from error
