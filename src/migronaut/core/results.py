"""Typed results of every command, with the JSON shapes (field names) of the Node original.

Python attributes are snake_case; :meth:`to_dict` renders the camelCase fields that ``--json``
prints and other tooling parses. Datetimes render as ISO-8601 UTC strings with a ``Z``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from migronaut._json import iso, naive_utc, render_fields

__all__ = [
    "AuditCheck",
    "AuditReport",
    "BaselineResult",
    "ImportResult",
    "ImportRow",
    "LockInfo",
    "LockProblem",
    "LockState",
    "LockStatus",
    "MigrationSummary",
    "RunResult",
    "StatusRow",
    "rows_json",
    "run_results_json",
]

RunStatus = Literal["applied", "reverted", "skipped", "error"]
RowStatus = Literal["applied", "pending", "failed", "running", "in-doubt"]
ChecksumSource = Literal["reused", "recomputed", "missing"]
CheckStatus = Literal["pass", "warn", "fail"]
LockState = Literal["free", "held", "expired", "invalid"]


def run_results_json(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """``RunResult[]`` as ``up``/``down``/``redo`` print it."""
    return [result.to_dict() for result in results]


def rows_json(rows: Sequence[StatusRow]) -> list[dict[str, Any]]:
    """``StatusRow[]`` as ``status``/``list``/``dry-run`` print it."""
    return [row.to_dict() for row in rows]


@dataclass(frozen=True)
class RunResult:
    """One migration's outcome in a run (``up``/``down``/``redo``)."""

    file: str
    status: RunStatus
    duration: int | None = None
    batch: int | None = None
    reason: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ("file", "status"))


@dataclass(frozen=True)
class StatusRow:
    """One migration in ``status``/``list``/``dry-run`` (files ∪ changelog records)."""

    file: str
    status: RowStatus
    batch: int | None = None
    applied_at: dt.datetime | None = None
    duration: int | None = None
    checksum_ok: bool | None = None
    description: str | None = None
    executed_by: str | None = None
    environment: str | None = None
    run_id: str | None = None
    reverted_at: dt.datetime | None = None
    origin: str | None = None
    error: str | None = None
    failed_at: dt.datetime | None = None
    failed_checksum: str | None = None
    kind: str | None = None
    out_of_order: bool = field(default=False, metadata={"only_true": True})
    invalid: bool = field(default=False, metadata={"only_true": True})
    checksum: str | None = None
    requested_by: str | None = None
    reason: str | None = None
    revert_requested_by: str | None = None
    revert_reason: str | None = None
    #: Several changelog records carry this name (the unique index on ``name`` is missing).
    duplicate: bool = field(default=False, metadata={"only_true": True})
    #: ``running`` / ``in-doubt`` rows: which way the body went (``up``/``down``), where its
    #: run was and when it started (the run is ``run_id``).
    direction: str | None = None
    host: str | None = None
    pid: int | None = None
    started_at: dt.datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return render_fields(
            self, ("file", "status", "batch", "applied_at", "duration", "checksum_ok")
        )


@dataclass(frozen=True)
class LockInfo:
    """Who holds the migration lock; the nonce is never exposed."""

    locked_at: dt.datetime | None
    pid: int | None
    host: str | None
    executed_by: str | None
    run_id: str | None = None
    ttl_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ("locked_at", "pid", "host", "executed_by"))

    def describe(self) -> str:
        when = iso(self.locked_at) or "an unknown time"
        return f"pid {self.pid} on {self.host} ({self.executed_by}) since {when}"


@dataclass(frozen=True)
class LockProblem:
    """One field of a lock document migronaut cannot read, and what is wrong with it."""

    field: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "message": self.message}


@dataclass(frozen=True)
class LockStatus:
    """A lock document judged by the one rule every reader and ``up`` share (``core/lock.py``).

    ``state``: ``free`` (no document), ``held`` (a run is refused), ``expired`` (past its TTL:
    the next run reclaims it) or ``invalid`` (``problems`` say what cannot be read: held until
    ``unlock`` removes it). ``ttl_ms`` is the TTL it is judged by (its own ``ttlMs``, else ours);
    ``server_time`` the server's clock when it was read.
    """

    state: LockState
    holder: LockInfo | None = None
    problems: tuple[LockProblem, ...] = ()
    ttl_ms: int | None = None
    server_time: dt.datetime | None = None

    @property
    def blocks_runs(self) -> bool:
        """Whether a run that tried now would get ``LOCK_ALREADY_HELD``."""
        return self.state in ("held", "invalid")

    @property
    def held_for_s(self) -> int | None:
        """Seconds since ``lockedAt``, in server time (never negative)."""
        locked_at = self.holder.locked_at if self.holder else None
        if locked_at is None or self.server_time is None:
            return None
        return max(0, int((naive_utc(self.server_time) - naive_utc(locked_at)).total_seconds()))

    def describe_problems(self) -> str:
        """``lockedAt 'x' is not a date; owner is missing`` (empty when there is none)."""
        return "; ".join(problem.message for problem in self.problems)

    def to_dict(self) -> dict[str, Any]:
        """``lock --json``: the original's ``{held, holder}`` (``held``: a document is there),
        with ``state`` and, when there are any, ``problems``."""
        out: dict[str, Any] = {"held": self.state != "free",
                               "holder": self.holder.to_dict() if self.holder else None,
                               "state": self.state}
        if self.problems:
            out["problems"] = [problem.to_dict() for problem in self.problems]
        return out



@dataclass(frozen=True)
class MigrationSummary:
    """What :func:`migronaut.run_migrations` did."""

    applied: list[RunResult]
    up_to_date: bool
    waited: bool = False
    waited_ms: int = 0
    attempts: int = 1
    #: ``on_background_pending="stop"`` only (``None`` otherwise): the migration the run stopped
    #: before, and what it waits for — ``[{migration, waitsFor: [{migration, status}]}]``
    waiting: list[dict[str, Any]] | None = None
    #: with ``converge_after_up`` (and something declared): the converge's result, a
    #: ``ConvergeResult`` (collections.md §2.11); ``None`` otherwise
    converge: Any = None

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ())


@dataclass(frozen=True)
class ImportRow:
    """One imported record: the file it stands for, its batch, historical time and checksum.

    ``source_name`` is the name the other tool recorded, when it differs from ``file``
    (``20200101120000-add-users.js`` → ``20200101120000_add_users.py``).
    """

    file: str
    batch: int
    applied_at: Any
    checksum: str
    checksum_source: ChecksumSource
    source_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ("file", "batch", "applied_at", "checksum", "checksum_source"))


@dataclass(frozen=True)
class ImportResult:
    """What ``import`` did (or, with ``dry_run``, would do): ``source``/``target`` are the
    collections, ``origin`` the tool whose records were read."""

    source: str
    target: str
    imported: int
    skipped: int
    dry_run: bool
    rows: list[ImportRow]
    origin: str | None = None
    #: A dry run only: how many records the import would write (``imported`` stays 0).
    would_import: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ())

    def counts(self) -> dict[str, int]:
        """The counts ``run:end`` reports for the run (``total``: records written)."""
        return {"imported": self.imported, "skipped": self.skipped, "total": self.imported}


@dataclass(frozen=True)
class BaselineResult:
    """What ``baseline`` marked applied without running it; ``skipped`` counts the files on
    disk it left alone (already applied, or after ``to``)."""

    baselined: list[str]
    skipped: int
    batch: int | None
    dry_run: bool = field(default=False, metadata={"only_true": True})

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ("batch",))

    def counts(self) -> dict[str, int]:
        """The counts ``run:end`` and the run span report (``total``: records written, each
        marked applied)."""
        done = len(self.baselined)
        return {"baselined": done, "applied": done, "skipped": self.skipped, "total": done}


@dataclass(frozen=True)
class AuditCheck:
    """One ``audit`` check: its name, ``pass``/``warn``/``fail`` and a one-line detail."""

    name: str
    status: CheckStatus
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return render_fields(self, ("name", "status", "detail"))


@dataclass(frozen=True)
class AuditReport:
    """What ``audit`` found: ``ok`` when no check failed (warnings never fail an audit)."""

    checks: tuple[AuditCheck, ...]

    @property
    def failed(self) -> int:
        return sum(1 for check in self.checks if check.status == "fail")

    @property
    def warnings(self) -> int:
        return sum(1 for check in self.checks if check.status == "warn")

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed, "warnings": self.warnings,
                "checks": [check.to_dict() for check in self.checks]}
