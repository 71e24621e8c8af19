"""The fleet run record: one document per fleet run in the fleet's ``admin_db``.

Written as the run goes — created when it starts (``outcome: running``), each tenant's entry
when it starts and when it ends, the outcome when the run ends — with the changes made in one
scheduling round written together (one update, not one round trip per state change). A tenant's
entry is always written whole (``tenants.<name>``), so one update never sets a path and its
sub-path. A run killed mid-way keeps ``outcome: running`` and no ``endedAt``: read back it is
``incomplete`` unless its process still lives on this host. Each tenant's own changelog remains
the truth of what ran; the record says what the fleet run did.

Read back fail closed: a record of another version, or with a field of the wrong type, is
``STATE_INVALID`` naming the record and the field — never shown as something it is not.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut._json import iso
from migronaut.errors import ConnectionFailedError, StateInvalidError

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = [
    "COMMANDS",
    "INCOMPLETE",
    "RECORD_VERSION",
    "RUN_OUTCOMES",
    "TENANT_STATES",
    "FleetRunRecord",
    "FleetRunStore",
    "TenantEntry",
]

RECORD_VERSION = 1
#: The shortest time between two throttled writes of a run's record (four a second at most).
FLUSH_INTERVAL_S = 0.25
COMMANDS = ("up", "down", "converge", "audit")
#: A run's outcome as stored; ``incomplete`` is how a ``running`` record of a dead process reads.
RUN_OUTCOMES = ("running", "succeeded", "partial", "stopped")
INCOMPLETE = "incomplete"
#: A tenant's state in a record: ``started`` while it runs, then one of the final states.
TENANT_STATES = ("started", "succeeded", "up-to-date", "failed", "skipped-locked",
                 "skipped-budget", "skipped-canary", "skipped-stopped")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class TenantEntry:
    """One tenant in a run record."""

    name: str
    cluster: str
    state: str
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    error: Mapping[str, Any] | None = None
    #: migrations applied or reverted in this tenant by the run
    changed: int = 0

    def to_document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cluster": self.cluster, "state": self.state,
                               "startedAt": self.started_at, "endedAt": self.ended_at,
                               "changed": self.changed}
        if self.error is not None:
            out["error"] = {"code": self.error.get("code"), "message": self.error.get("message")}
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tenant": self.name, "cluster": self.cluster, "state": self.state,
                               "startedAt": iso(self.started_at),
                               "endedAt": iso(self.ended_at), "changed": self.changed}
        if self.error is not None:
            out["error"] = dict(self.error)
        return out


@dataclass(frozen=True)
class FleetRunRecord:
    """A fleet run as recorded (``outcome`` is ``incomplete`` for a run that died)."""

    run_id: str
    command: str
    options: Mapping[str, Any]
    host: str
    pid: int
    started_at: dt.datetime
    ended_at: dt.datetime | None
    outcome: str
    total: int
    tenants: list[TenantEntry] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(TENANT_STATES, 0)
        for entry in self.tenants:
            out[entry.state] += 1
        out["not-started"] = max(0, self.total - len(self.tenants))
        return out

    def to_json(self, *, tenants: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runId": self.run_id, "command": self.command, "options": dict(self.options),
            "host": self.host, "pid": self.pid, "startedAt": iso(self.started_at),
            "endedAt": iso(self.ended_at), "outcome": self.outcome, "total": self.total,
            "counts": self.counts()}
        if tenants:
            out["tenants"] = [entry.to_json() for entry in self.tenants]
        return out


class FleetRunStore:
    """Writes one run's record (batched, at most four writes a second) and reads records back."""

    def __init__(self, collection: Collection[dict[str, Any]]) -> None:
        self.collection = collection
        self._pending: dict[str, TenantEntry] = {}
        self._lock = threading.Lock()
        self._run_id: str | None = None
        self._last_flush = float("-inf")

    # -- writes -------------------------------------------------------------------------------
    def start(self, run_id: str, command: str, options: Mapping[str, Any], total: int) -> None:
        from migronaut._version import __version__

        self._run_id = run_id
        self._write(lambda: self.collection.insert_one({
            "_id": run_id, "v": RECORD_VERSION, "command": command, "options": dict(options),
            "host": socket.gethostname(), "pid": os.getpid(), "version": __version__,
            "startedAt": _now(), "endedAt": None, "outcome": "running", "total": total,
            "tenants": {}}))

    def note(self, entry: TenantEntry) -> None:
        """Keep a tenant's entry for the next :meth:`flush` (the latest one wins)."""
        with self._lock:
            self._pending[entry.name] = entry

    def due_in(self) -> float | None:
        """Seconds until :meth:`flush` with ``throttled=True`` may write (``None``: nothing
        noted), so a scheduler waiting for tenants can wake up to write the record."""
        with self._lock:
            if not self._pending:
                return None
        return max(0.0, self._last_flush + FLUSH_INTERVAL_S - time.monotonic())

    def flush(self, *, throttled: bool = False) -> None:
        """Write every entry noted since the last flush, in one update. ``throttled``: not
        within :data:`FLUSH_INTERVAL_S` of the last write — the record grows with the fleet, and
        a write per scheduling round over hundreds of tenants costs more than the tenants' own
        reads; what is noted meanwhile waits for the next flush, never dropped."""
        with self._lock:
            if throttled and time.monotonic() - self._last_flush < FLUSH_INTERVAL_S:
                return
            pending, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
        if not pending or self._run_id is None:
            return
        run_id = self._run_id
        changes = {f"tenants.{name}": entry.to_document() for name, entry in pending.items()}
        try:
            self._write(lambda: self.collection.update_one({"_id": run_id}, {"$set": changes}))
        except BaseException:
            with self._lock:  # kept for the next flush: an outcome is never dropped
                self._pending = {**pending, **self._pending}
            raise

    def end(self, outcome: str) -> None:
        self.flush()
        run_id = self._run_id
        if run_id is None:
            return
        self._write(lambda: self.collection.update_one(
            {"_id": run_id}, {"$set": {"outcome": outcome, "endedAt": _now()}}))

    @staticmethod
    def _write(call: Any) -> None:
        from pymongo.errors import PyMongoError

        from migronaut.core.retry import as_connection_failed, retry_transient

        try:
            retry_transient(call)
        except PyMongoError as error:
            raise as_connection_failed(error) or ConnectionFailedError(
                f"Failed to write the fleet run record: {error}", cause=error) from error

    # -- reads ----------------------------------------------------------------------------------
    def runs(self, limit: int = 20) -> list[FleetRunRecord]:
        """The newest records, newest first."""
        cursor = self.collection.find({}).sort([("startedAt", -1), ("_id", -1)]).limit(limit)
        return [parse_record(document) for document in cursor]

    def get(self, run_id: str | None = None) -> FleetRunRecord | None:
        """A record by id or unique id prefix (``None``: the newest)."""
        if run_id is None:
            newest = self.runs(1)
            return newest[0] if newest else None
        document = self.collection.find_one({"_id": run_id})
        if document is None:
            import re

            matches = list(self.collection.find(
                {"_id": {"$regex": "^" + re.escape(run_id)}}).limit(2))
            if len(matches) != 1:
                return None
            document = matches[0]
        return parse_record(document)


def _invalid(document: Mapping[str, Any], path: str, problem: str) -> StateInvalidError:
    run_id = document.get("_id")
    return StateInvalidError(
        f"Fleet run record {run_id!r} cannot be read: {path} {problem} (a record this version "
        "of migronaut did not write)",
        {"record": str(run_id), "field": path, "problems": [f"{path} {problem}"]})


def _typed(document: Mapping[str, Any], key: str, kinds: type | tuple[type, ...],
           where: str | None = None, source: Mapping[str, Any] | None = None) -> Any:
    holder = document if source is None else source
    value = holder.get(key)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise _invalid(document, where or key, f"is {type(value).__name__}, not what a record "
                                               "holds")
    return value


def parse_record(document: Mapping[str, Any]) -> FleetRunRecord:
    """A stored record, checked field by field (``STATE_INVALID`` naming what is wrong)."""
    if document.get("v") != RECORD_VERSION:
        raise _invalid(document, "v", f"is {document.get('v')!r}, not {RECORD_VERSION}")
    run_id = _typed(document, "_id", str)
    command = _typed(document, "command", str)
    if command not in COMMANDS:
        raise _invalid(document, "command", f"is {command!r}, not one of {', '.join(COMMANDS)}")
    outcome = _typed(document, "outcome", str)
    if outcome not in RUN_OUTCOMES:
        raise _invalid(document, "outcome", f"is {outcome!r}, not one of "
                                            f"{', '.join(RUN_OUTCOMES)}")
    host = _typed(document, "host", str)
    pid = _typed(document, "pid", int)
    started_at = _typed(document, "startedAt", dt.datetime)
    ended_at = document.get("endedAt")
    if ended_at is not None and not isinstance(ended_at, dt.datetime):
        raise _invalid(document, "endedAt", "is not a date")
    options = _typed(document, "options", Mapping)
    total = _typed(document, "total", int)
    tenants_doc = _typed(document, "tenants", Mapping)
    entries = []
    for name, raw in tenants_doc.items():
        where = f"tenants.{name}"
        if not isinstance(raw, Mapping):
            raise _invalid(document, where, "is not a document")
        cluster = _typed(document, "cluster", str, f"{where}.cluster", raw)
        state = _typed(document, "state", str, f"{where}.state", raw)
        if state not in TENANT_STATES:
            raise _invalid(document, f"{where}.state", f"is {state!r}, not a tenant state")
        times = []
        for key in ("startedAt", "endedAt"):
            value = raw.get(key)
            if value is not None and not isinstance(value, dt.datetime):
                raise _invalid(document, f"{where}.{key}", "is not a date")
            times.append(value)
        error = raw.get("error")
        if error is not None and not (isinstance(error, Mapping)
                                      and isinstance(error.get("code"), str)):
            raise _invalid(document, f"{where}.error", "is not an error {code, message}")
        changed = _typed(document, "changed", int, f"{where}.changed", raw)
        entries.append(TenantEntry(str(name), cluster, state, times[0], times[1],
                                   dict(error) if error is not None else None, changed))
    if outcome == "running" and ended_at is None and not _alive(host, pid):
        outcome = INCOMPLETE
    return FleetRunRecord(run_id, command, dict(options), host, pid, started_at, ended_at,
                          outcome, total, sorted(entries, key=lambda e: e.name))


def _alive(host: str, pid: int) -> bool:
    """Whether the run's process may still be running: on this host, its pid lives; on another
    host it cannot be told, so the record keeps saying ``running``."""
    from migronaut.core.lock import pid_alive

    return host != socket.gethostname() or pid_alive(pid)
