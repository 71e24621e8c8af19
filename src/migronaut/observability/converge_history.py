"""Converge history: one append-only entry per real converge that changed something or failed
(collections.md §2.9), in ``converge_log_collection`` (default ``_migronaut_converge``).

Invariants: best effort — a failed write is a warning and never changes the converge's outcome;
the descending ``startedAt`` index is created with the first entry this process writes; a
converge that found everything in place writes nothing, so a database that never converges never
gets the collection; converge never reads its history to decide anything; no stored document
carries a ``$``-prefixed field name (a row's ``from``/``to`` — validators, partial filters —
are stored as Extended JSON text and read back as documents).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any

from bson import json_util
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from migronaut._values import int_within
from migronaut.errors import ConfigInvalidError, StateInvalidError, describe_exception

__all__ = ["ConvergeHistory", "check_limit"]

MAX_LIMIT = 1000
#: Row members whose values are user documents (may hold ``$`` operators).
_DOCUMENTS = ("from", "to")


def _stored(action: Mapping[str, Any]) -> dict[str, Any]:
    return {key: json_util.dumps(value) if key in _DOCUMENTS else value
            for key, value in action.items()}


def _read(entry: Mapping[str, Any], collection: str) -> dict[str, Any]:
    """An entry as written, its rows' ``from``/``to`` documents again — or ``STATE_INVALID``
    naming the entry and the field when it is not what :meth:`ConvergeHistory.record` wrote."""
    def invalid(field: str, why: str) -> StateInvalidError:
        started = entry.get("startedAt")
        return StateInvalidError(
            f"Converge history entry of {started} in {collection} is unreadable: {field} {why}",
            {"collection": collection, "startedAt": str(started), "field": field})

    actions = entry.get("actions", [])
    if not isinstance(actions, list):
        raise invalid("actions", "is not a list")
    read = []
    for index, action in enumerate(actions):
        if not isinstance(action, Mapping):
            raise invalid(f"actions[{index}]", "is not a document")
        row = dict(action)
        for key in _DOCUMENTS:
            if isinstance(row.get(key), str):
                try:
                    row[key] = json_util.loads(row[key])
                except ValueError as error:
                    raise invalid(f"actions[{index}].{key}", "is not Extended JSON") from error
        read.append(row)
    return {**entry, "actions": read}


def check_limit(limit: Any) -> int:
    """``limit`` must be an integer 1–1000 (``CONFIG_INVALID`` otherwise)."""
    if not int_within(limit, 1, MAX_LIMIT):
        raise ConfigInvalidError(f"limit must be an integer between 1 and {MAX_LIMIT} "
                                 f"(got {limit!r})", {"option": "limit"})
    return limit


class ConvergeHistory:
    """Writes and reads the converge log of one database."""

    def __init__(self, collection: Collection[dict[str, Any]], logger: logging.Logger) -> None:
        self._collection = collection
        self._logger = logger
        self._indexed = False

    def record(self, entry: Mapping[str, Any]) -> None:
        """Append ``entry`` (plus ``host``), warning instead of failing."""
        try:
            if not self._indexed:
                self._collection.create_index([("startedAt", -1)], name="startedAt")
                self._indexed = True
            self._collection.insert_one({
                **entry, "host": socket.gethostname(),
                "actions": [_stored(action) for action in entry.get("actions", ())]})
        except PyMongoError as error:
            self._logger.warning("⚠ Converge history not recorded: %s",
                                 describe_exception(error))

    def entries(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, newest first, without ``_id``."""
        check_limit(limit)
        found = self._collection.find({}, {"_id": 0}).sort("startedAt", -1).limit(limit)
        return [_read(entry, self._collection.name) for entry in found]
