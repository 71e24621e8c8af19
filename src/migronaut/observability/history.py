"""Reading the run history back: :class:`RunRecord` and :class:`RunLog` (``migronaut logs``).

A record still ``running`` whose run no longer holds the lock was interrupted (its process died
or lost the lock without finishing): it is shown as ``interrupted``; nothing is rewritten.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from migronaut._json import render_fields, to_json_value
from migronaut._values import int_within
from migronaut.errors import ConfigInvalidError
from migronaut.observability.migration_log import LEVELS, level_number
from migronaut.observability.runstore import RUNNING

if TYPE_CHECKING:
    from migronaut.observability.runstore import RunStore

__all__ = ["INTERRUPTED", "RunLog", "RunRecord", "read_run_log", "recent_runs", "run_log_json"]

INTERRUPTED = "interrupted"


class LockHolder(Protocol):
    """What a run record needs of the lock's holder (``core.results.LockInfo``): whose run it is."""

    @property
    def run_id(self) -> str | None: ...
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class RunRecord:
    """One recorded run (a document of ``runs_collection``)."""

    run_id: str
    command: str | None
    outcome: str
    direction: str | None = None
    requested_by: str | None = None
    requested_by_source: str | None = None
    reason: str | None = None
    executed_by: str | None = None
    host: str | None = None
    pid: int | None = None
    locked: bool | None = None
    environment: str | None = None
    version: str | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    duration_ms: int | None = None
    applied: list[str] = field(default_factory=list)
    reverted: list[str] = field(default_factory=list)
    skipped: int = 0
    total: int = 0
    error: dict[str, Any] | None = None
    lock_lost: str | None = None
    log_lines: int | None = None
    log_lines_dropped: int | None = None

    @classmethod
    def from_document(cls, doc: dict[str, Any], *, lock: LockHolder | None) -> RunRecord:
        outcome = str(doc.get("outcome") or RUNNING)
        if outcome == RUNNING and doc.get("locked") and (lock is None or lock.run_id != doc["_id"]):
            outcome = INTERRUPTED
        return cls(
            run_id=str(doc["_id"]), command=doc.get("command"), outcome=outcome,
            direction=doc.get("direction"), requested_by=doc.get("requestedBy"),
            requested_by_source=doc.get("requestedBySource"), reason=doc.get("reason"),
            executed_by=doc.get("executedBy"), host=doc.get("host"), pid=doc.get("pid"),
            locked=doc.get("locked"), environment=doc.get("environment"),
            version=doc.get("version"), started_at=doc.get("startedAt"),
            ended_at=doc.get("endedAt"), duration_ms=doc.get("durationMs"),
            applied=list(doc.get("applied") or []), reverted=list(doc.get("reverted") or []),
            skipped=int(doc.get("skipped") or 0), total=int(doc.get("total") or 0),
            error=doc.get("error"), lock_lost=doc.get("lockLost"),
            log_lines=doc.get("logLines"), log_lines_dropped=doc.get("logLinesDropped"),
        )

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ("run_id", "command", "outcome", "started_at"))


@dataclass(frozen=True)
class RunLog:
    """A run and its kept log lines (``{runId, seq, at, level, migration, msg, data…}``)."""

    run: RunRecord
    lines: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run.to_dict(), "lines": to_json_value(self.lines)}


def run_log_json(log: RunLog | None) -> dict[str, Any]:
    """``logs RUN_ID --json``: the run and its lines; no run recorded at all is
    ``{"run": null, "lines": []}`` (the CLI and the dashboard)."""
    return log.to_dict() if log is not None else {"run": None, "lines": []}


def check_limit(limit: Any, option: str = "limit") -> int:
    """A positive number of runs to list (at most :data:`MAX_LIMIT`); ``option`` is how the
    caller named it (the CLI's ``--limit``)."""
    if not int_within(limit, 1, MAX_LIMIT):
        raise ConfigInvalidError(
            f"{option} must be a positive integer of at most {MAX_LIMIT} (got {limit!r})",
            {"option": option},
        )
    return limit


def check_level(level: Any) -> int | None:
    """``None`` or a level name (``debug``, ``info``, ``warning``, ``error``, ``critical``)."""
    if level is None:
        return None
    if not isinstance(level, str) or level.strip().lower() not in LEVELS:
        raise ConfigInvalidError(
            f"level must be one of {', '.join(LEVELS)} (got {level!r})", {"option": "level"}
        )
    return LEVELS[level.strip().lower()]


def recent_runs(store: RunStore, limit: int, *, lock: LockHolder | None) -> list[RunRecord]:
    """The newest ``limit`` runs, newest first."""
    return [RunRecord.from_document(doc, lock=lock) for doc in store.recent(check_limit(limit))]


def read_run_log(
    store: RunStore,
    run_id: str | None,
    *,
    migration: str | None,
    level: str | None,
    lock: LockHolder | None,
) -> RunLog | None:
    """One run (id, unique id prefix, or ``None`` for the newest) with its lines; ``None`` when
    no run is recorded at all. An unknown or ambiguous id is ``CONFIG_INVALID``."""
    threshold = check_level(level)
    if run_id is None:
        doc = store.latest()
        if doc is None:
            return None
    else:
        if not isinstance(run_id, str) or not run_id.strip():
            raise ConfigInvalidError("run id must be a non-empty string", {"option": "runId"})
        found = store.matching(run_id.strip())
        if not found:
            raise ConfigInvalidError(f"No recorded run with id {run_id!r}", {"runId": run_id})
        if len(found) > 1:
            raise ConfigInvalidError(
                f"Run id prefix {run_id!r} is ambiguous: give more characters",
                {"runId": run_id, "matches": [str(d["_id"]) for d in found]},
            )
        doc = found[0]
    lines = store.lines(str(doc["_id"]), migration=migration)
    if threshold is not None:
        lines = [ln for ln in lines if level_number(str(ln.get("level"))) >= threshold]
    return RunLog(RunRecord.from_document(doc, lock=lock), lines)
