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

from migronaut.errors import ConfigInvalidError, describe_exception

__all__ = ["ConvergeHistory", "check_limit"]

MAX_LIMIT = 1000
#: Row members whose values are user documents (may hold ``$`` operators).
_DOCUMENTS = ("from", "to")


def _stored(action: Mapping[str, Any]) -> dict[str, Any]:
    return {key: json_util.dumps(value) if key in _DOCUMENTS else value
            for key, value in action.items()}


def _read(action: Mapping[str, Any]) -> dict[str, Any]:
    return {key: json_util.loads(value) if key in _DOCUMENTS and isinstance(value, str)
            else value for key, value in action.items()}


def check_limit(limit: Any) -> int:
    """``limit`` must be an integer 1–1000 (``CONFIG_INVALID`` otherwise)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
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
        return [{**entry, "actions": [_read(action) for action in entry.get("actions", ())]}
                for entry in found]
