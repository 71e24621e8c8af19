"""The run history collections: ``_migronaut_runs`` and ``_migronaut_runs_logs``.

Invariant: one document per locked run, keyed by its run id, written when the run starts
(``outcome: 'running'``) and completed when it ends; its log lines live beside it, one document
per line, unique by ``(runId, seq)``. ``startedAt``/``endedAt`` are server time. The field names
of both collections live here and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

__all__ = ["LOGS_SUFFIX", "OUTCOMES", "RUNNING", "RunStore", "logs_collection_name"]

#: The log lines' collection is the runs collection's name plus this suffix.
LOGS_SUFFIX = "_logs"
RUNNING = "running"
#: Final outcomes of a run record (``running`` while it is in flight).
OUTCOMES = ("success", "failed", "stopped", "lock-lost")

_RUN_INDEXES: tuple[tuple[str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("startedAt", [("startedAt", -1)], {}),
)
_LOG_INDEXES: tuple[tuple[str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("runId_seq", [("runId", 1), ("seq", 1)], {"unique": True}),
)


def logs_collection_name(runs_collection: str) -> str:
    return runs_collection + LOGS_SUFFIX


def _literal(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Pipeline ``$set`` values that are never read as field paths or operators."""
    return {key: {"$literal": value} for key, value in fields.items()}


class RunStore:
    """Reads and writes the run records and their log lines."""

    def __init__(self, db: Database[dict[str, Any]], runs_collection: str) -> None:
        self.collections = (runs_collection, logs_collection_name(runs_collection))
        self.runs: Collection[dict[str, Any]] = db[self.collections[0]]
        self.logs: Collection[dict[str, Any]] = db[self.collections[1]]

    def ensure_run_indexes(self) -> None:
        """The runs collection's index, once per (client, database) in this process."""
        self._ensure_once(self.runs, _RUN_INDEXES)

    def ensure_log_indexes(self) -> None:
        """The log lines' unique index, once per (client, database) in this process: sent with
        the first lines written, so a run that logs nothing never sends it."""
        self._ensure_once(self.logs, _LOG_INDEXES)

    @staticmethod
    def _ensure_once(collection: Collection[dict[str, Any]],
                     indexes: Sequence[tuple[str, list[tuple[str, int]], dict[str, Any]]]) -> None:
        from pymongo import IndexModel

        from migronaut._ensured import ensure_once

        ensure_once(collection.database.client, collection.database.name, collection.name,
                    lambda: collection.create_indexes(
                        [IndexModel(keys, name=name, **opts) for name, keys, opts in indexes]))

    # -- writes -------------------------------------------------------------------------------
    @staticmethod
    def start_fields(
        *,
        command: str,
        direction: str | None,
        requested_by: str,
        requested_by_source: str,
        reason: str | None,
        executed_by: str,
        locked: bool,
        environment: str,
    ) -> dict[str, Any]:
        """What a record knows when its run starts (this process, this host)."""
        import os
        import socket

        from migronaut._version import __version__

        return {
            "command": command, "direction": direction, "requestedBy": requested_by,
            "requestedBySource": requested_by_source, "reason": reason,
            "executedBy": executed_by, "host": socket.gethostname(), "pid": os.getpid(),
            "locked": locked, "environment": environment, "version": __version__,
        }

    def begin(self, run_id: str, start: Mapping[str, Any]) -> None:
        """The record of a run that holds its lock: ``outcome: 'running'``, server start time."""
        fields = {**start, "outcome": RUNNING}
        self.runs.update_one(
            {"_id": run_id}, [{"$set": {**_literal(fields), "startedAt": "$$NOW"}}], upsert=True
        )

    def finish(
        self,
        run_id: str,
        *,
        outcome: str,
        duration_ms: int,
        applied: Sequence[str],
        reverted: Sequence[str],
        skipped: int,
        total: int,
        error: Mapping[str, Any] | None,
        lock_lost: str | None,
        log_lines: int,
        log_lines_dropped: int,
        start: Mapping[str, Any],
    ) -> None:
        """Complete the record (or write it whole when the start write was lost)."""
        fields: dict[str, Any] = {
            "outcome": outcome, "durationMs": duration_ms, "applied": list(applied),
            "reverted": list(reverted), "skipped": skipped, "total": total, "error": error,
            "lockLost": lock_lost, "logLines": log_lines, "logLinesDropped": log_lines_dropped,
        }
        missing = {key: {"$ifNull": [f"${key}", {"$literal": value}]}
                   for key, value in start.items()}
        self.runs.update_one(
            {"_id": run_id},
            [{"$set": {**missing, **_literal(fields), "endedAt": "$$NOW",
                       "startedAt": {"$ifNull": ["$startedAt", "$$NOW"]}}}],
            upsert=True,
        )

    def insert_lines(self, lines: Sequence[Mapping[str, Any]]) -> None:
        if lines:
            self.logs.insert_many([dict(line) for line in lines], ordered=False)

    # -- reads --------------------------------------------------------------------------------
    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` records, newest first."""
        return list(self.runs.find({}).sort([("startedAt", -1), ("_id", -1)]).limit(limit))

    def latest(self) -> dict[str, Any] | None:
        found = self.recent(1)
        return found[0] if found else None

    def matching(self, run_id: str) -> list[dict[str, Any]]:
        """The record with this id, else those whose id starts with it (at most two)."""
        exact = self.runs.find_one({"_id": run_id})
        if exact is not None:
            return [exact]
        pattern = "^" + re.escape(run_id)
        return list(self.runs.find({"_id": {"$regex": pattern}}).limit(2))

    def lines(self, run_id: str, *, migration: str | None = None) -> list[dict[str, Any]]:
        query: dict[str, Any] = {"runId": run_id}
        if migration is not None:
            query["migration"] = migration
        return list(self.logs.find(query, {"_id": 0}).sort("seq", 1))
