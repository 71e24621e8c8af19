"""The run recorder: who ran what, why, and how it ended — one record per locked run, with its
``ctx.logger`` lines.

Invariant: recording never changes a run. Every write is guarded: the first failure of a
migrator is warned once (``⚠ Run history not recorded …``), later ones only at debug level, and
the run goes on exactly as it would without a recorder. Log lines are buffered and written in
bulk (when the buffer fills, when a migration ends, when the run ends), never one round trip per
line, and at most :data:`MAX_LINES` per run; the rest are counted, and a last line says so.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from migronaut._redact import redact
from migronaut.errors import LockLostError, MigronautError, RunAbortedError, describe_exception
from migronaut.observability.migration_log import log_line

if TYPE_CHECKING:
    from migronaut.observability.runstore import RunStore

__all__ = [
    "MAX_LINES",
    "REQUESTED_BY_VARIABLES",
    "RunRecorder",
    "RunRecording",
    "outcome_of",
    "resolve_requested_by",
]

#: Lines kept per run; past it lines are counted, not stored.
MAX_LINES = 10_000
#: Buffered lines that trigger a write before the migration ends.
FLUSH_EVERY = 500
MAX_REQUESTED_BY = 128

#: Who asked for a run when no ``requested_by`` is given, first set wins: our own variable, then
#: the user that triggered the CI job (GitHub Actions, GitLab CI, Jenkins with the build-user-vars
#: plugin, Azure Pipelines, CircleCI, Buildkite, Bitbucket Pipelines).
REQUESTED_BY_VARIABLES = (
    "MIGRONAUT_REQUESTED_BY",
    "GITHUB_ACTOR",
    "GITLAB_USER_LOGIN",
    "BUILD_USER_ID",
    "BUILD_USER",
    "BUILD_REQUESTEDFOR",
    "CIRCLE_USERNAME",
    "BUILDKITE_BUILD_CREATOR",
    "BITBUCKET_STEP_TRIGGERER_UUID",
)

Emit = Callable[[dict[str, Any]], None]


def resolve_requested_by(
    given: str | None, executed_by: str, environ: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """``(who, where it came from)``: the argument, else the first variable of
    :data:`REQUESTED_BY_VARIABLES` that is set, else the OS user running the process."""
    if given:
        return given, "argument"
    env = os.environ if environ is None else environ
    for name in REQUESTED_BY_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value[:MAX_REQUESTED_BY], name
    return executed_by[:MAX_REQUESTED_BY], "os-user"


def outcome_of(error: BaseException | None) -> str:
    if error is None:
        return "success"
    if isinstance(error, LockLostError):
        return "lock-lost"
    if isinstance(error, (RunAbortedError, KeyboardInterrupt)):
        return "stopped"
    return "failed"


def _error_document(error: BaseException) -> dict[str, Any]:
    if isinstance(error, MigronautError):
        return {"code": error.code, "message": redact(error.message)}
    return {"message": redact(describe_exception(error))}


class RunRecorder:
    """A migrator's recorder: opens one :class:`RunRecording` per run.

    ``store`` is ``None`` when recording is off (``record_runs = false``): recordings then only
    route ``ctx.logger`` lines to ``migration:log`` events.
    """

    def __init__(
        self,
        store: RunStore | None,
        *,
        logger: logging.Logger,
        ensure_indexes: bool,
        executed_by: str,
        environment: str,
    ) -> None:
        self.store = store
        self.logger = logger
        self.executed_by = executed_by
        self.environment = environment
        self.ensures_indexes = ensure_indexes
        self._warned = False
        self._lock = threading.Lock()

    def guarded(self, what: str, write: Callable[[], None]) -> bool:
        """Run one write; a failure is warned once per migrator and never raised."""
        try:
            write()
            return True
        except Exception as error:
            with self._lock:
                first, self._warned = not self._warned, True
            text = f"⚠ Run history not recorded ({what}): {describe_exception(error)}"
            if first:
                self.logger.warning(text + " — the run goes on",
                                    extra={"event": "run:record-failed"})
            else:
                self.logger.debug(text)
            return False

    def ensure_indexes(self, *, logs: bool = False) -> None:
        """The run records' index, or (``logs``) the log lines' one, sent with the first lines
        written; each once per client and database in this process. A failure is warned,
        never raised."""
        store = self.store
        if store is not None and self.ensures_indexes:
            self.guarded("indexes", store.ensure_log_indexes if logs else store.ensure_run_indexes)

    def begin(
        self,
        run_id: str,
        *,
        command: str,
        direction: str | None,
        requested_by: str | None,
        reason: str | None,
        locked: bool,
        emit: Emit,
        debug: bool,
    ) -> RunRecording:
        """Record the start of a run (it holds its lock now) and return its recording."""
        from migronaut.observability.runstore import RunStore

        who, source = resolve_requested_by(requested_by, self.executed_by)
        start = RunStore.start_fields(
            command=command, direction=direction, requested_by=who, requested_by_source=source,
            reason=reason, executed_by=self.executed_by, locked=locked,
            environment=self.environment,
        )
        recording = RunRecording(self, run_id, start, emit=emit, debug=debug,
                                 actor={"requestedBy": requested_by, "reason": reason})
        store = self.store
        if store is not None:
            self.ensure_indexes()
            self.guarded("run start", lambda: store.begin(run_id, start))
        return recording


class RunRecording:
    """One run as it happens: the names it applied and reverted, its ``ctx.logger`` lines.

    Fed by the migrator's events (:meth:`observe`) and by ``ctx.logger`` (:meth:`line`, a
    :class:`~migronaut.observability.migration_log.LineSink`); closed by :meth:`finish`.
    Thread-safe: migration bodies and the lock heartbeat call it from their own threads.
    """

    def __init__(
        self,
        recorder: RunRecorder,
        run_id: str,
        start: Mapping[str, Any],
        *,
        emit: Emit,
        debug: bool,
        actor: Mapping[str, str | None],
    ) -> None:
        self.recorder = recorder
        self.run_id = run_id
        self.start = dict(start)
        self.applied: list[str] = []
        self.reverted: list[str] = []
        self.skipped = 0
        self.lock_lost: str | None = None
        self._emit = emit
        self._actor = {k: v for k, v in actor.items() if v is not None}
        self._keep_level = logging.DEBUG if debug else logging.INFO
        self._seq = itertools.count(1)
        self._buffer: list[dict[str, Any]] = []
        self._kept = 0
        self._dropped = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    @property
    def storing(self) -> bool:
        return self.recorder.store is not None

    # -- events -------------------------------------------------------------------------------
    def observe(self, event: str, payload: Mapping[str, Any]) -> None:
        """Follow the run's lifecycle events (called for every event the migrator emits)."""
        if event == "migration:success":
            names = self.applied if payload.get("direction") == "up" else self.reverted
            with self._lock:
                names.append(str(payload.get("migration")))
            self.flush()
        elif event == "migration:error":
            self.flush()
        elif event == "migration:skipped":
            with self._lock:
                self.skipped += 1
        elif event == "lock:lost":
            self.lock_lost = str(payload.get("reason") or "lost")

    # -- ctx.logger ---------------------------------------------------------------------------
    def line(
        self,
        level: int,
        msg: object,
        args: tuple[Any, ...],
        fields: dict[str, Any],
        correlation: Mapping[str, Any],
        userland: bool,
    ) -> None:
        """One ``ctx.logger`` call: a ``migration:log`` event when it is ``userland``, a stored
        line when it is at info level or above (debug too under ``--verbose``)."""
        keep = self.storing and level >= self._keep_level
        if not (userland or keep):
            return
        line = log_line(kind="migration", level=level, msg=msg, args=args, fields=fields,
                        correlation=correlation, seq=next(self._seq))
        if userland:
            self._emit({**line, **self._actor})
        if keep:
            self._keep(line)

    def _keep(self, line: dict[str, Any]) -> None:
        with self._lock:
            if self._kept >= MAX_LINES:
                self._dropped += 1
                return
            self._kept += 1
            self._buffer.append(line)
            full = len(self._buffer) >= FLUSH_EVERY
        if full:
            self.flush()

    def flush(self) -> None:
        """Write the buffered lines in one round trip (a failed write drops them)."""
        store = self.recorder.store
        if store is None or not self._buffer:  # (a line added meanwhile waits for the next)
            return
        with self._flush_lock:
            with self._lock:
                lines, self._buffer = self._buffer, []
            if not lines:
                return
            self.recorder.ensure_indexes(logs=True)
            if not self.recorder.guarded("log lines", lambda: store.insert_lines(lines)):
                with self._lock:
                    self._kept -= len(lines)
                    self._dropped += len(lines)

    # -- the end ------------------------------------------------------------------------------
    def finish(self, error: BaseException | None, *, duration_ms: int, total: int) -> None:
        """Write the last lines (and a truncation notice) and complete the record."""
        store = self.recorder.store
        if store is None:
            return
        self.flush()
        with self._lock:
            applied, reverted = list(self.applied), list(self.reverted)
            kept, dropped = self._kept, self._dropped
        if dropped:
            notice = log_line(
                kind="migration", level=logging.WARNING,
                msg="%d more log line(s) of this run were not kept (limit %d per run)",
                args=(dropped, MAX_LINES), fields={}, correlation={"runId": self.run_id},
                seq=next(self._seq),
            )
            notice["truncated"] = True
            self.recorder.guarded("log lines", lambda: store.insert_lines([notice]))
        self.recorder.guarded("run end", lambda: store.finish(
            self.run_id, outcome=outcome_of(error), duration_ms=duration_ms, applied=applied,
            reverted=reverted, skipped=self.skipped, total=total,
            error=_error_document(error) if error is not None else None,
            lock_lost=self.lock_lost, log_lines=kept, log_lines_dropped=dropped,
            start=self.start,
        ))
