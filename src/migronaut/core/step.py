"""One migration of a run: requirements, hooks, events, the body and the changelog record.

The body itself (transaction, timeout, retries of the record write) runs in
:func:`migronaut.core.runner.execute`; this module wraps it in what a run adds: background
requirements (a contract migration waits for its background work), ``before_each``/``after_each``
/``on_error`` hooks, ``migration:*`` events, the progress reporter, the log line, the result, and
the record itself — applied, reverted, or failed.

Invariants: the changelog write of a migration is fenced by the run's lock (in a transaction the
lock is renewed in the same transaction and a lost lock aborts it; without one the record is
written whatever the lock says, because the body's writes are done, and the run stops right
after); outside a transaction the body runs only once its run has claimed the record (an intent
matching the status it planned from: a run that lost its lock to another that got there first
refuses instead), and the final write matches that claim only; a failed ``up`` leaves a
``failed`` record (a record that was applied before stays applied) unless it failed writing its
record, lost its lock (a run that lost its lock writes no more) or outlived its timeout outside
a transaction (its body may still be running) — the claim then stays, and the migration is in
doubt.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migronaut.core.changelog import (
    APPLIED,
    REVERTING,
    RUNNING,
    ChangelogWrite,
    applied_write,
    finished_write,
    intent_write,
    reverted_write,
    withdrawn_write,
)
from migronaut.core.hooks import Hooks, call_hook
from migronaut.core.locked_run import abort_if_lock_lost
from migronaut.core.results import RunResult
from migronaut.core.runner import execute
from migronaut.errors import LockLostError, MigrationInDoubtError, MigronautError

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.client_session import ClientSession

    from migronaut.core.context import MigrationContext
    from migronaut.core.files import MigrationModule
    from migronaut.core.run import Direction, Run
    from migronaut.core.workspace import Workspace

__all__ = ["Handover", "WaitingForBackground", "run_step"]

#: This machine's name, as every intent records it (looked up once per process).
_HOST = socket.gethostname()


class WaitingForBackground(Exception):
    """Ends an ``up`` run cleanly before a migration whose background requirements are not done
    (``on_background_pending="stop"``); caught by the run loop."""


def run_step(
    ws: Workspace,
    run: Run,
    base_ctx: MigrationContext,
    hooks: Hooks,
    migration: MigrationModule,
    direction: Direction,
    batch: int | None,
    index: int,
    total: int,
    *,
    handover: Handover | None = None,
    following: tuple[MigrationModule, int | None] | None = None,
) -> None:
    """Run one migration of ``run`` (``index`` of ``total``) and record it.

    ``following`` is the next migration and its batch: when it may be claimed ahead
    (:func:`_claims_ahead`), its claim rides with this migration's final write and waits in
    ``handover`` until its own step starts its body.
    """
    config = ws.project.config
    name = migration.name
    ctx = base_ctx.for_migration(migration=name, batch=batch)
    info = {"direction": direction, "index": index, "total": total}
    if direction == "up" and migration.background is None and migration.requires:
        ws.background.require_done(run, migration.name, migration.requires)
    call_hook(hooks, "before_each", name, ctx, info)
    use_transaction = (
        migration.use_transaction if migration.use_transaction is not None
        else config.use_transaction
    )
    timeout_ms = migration.timeout_ms or config.timeout_ms
    run.trace.migration_attributes({"migronaut.migration.transaction": use_transaction})
    held = handover.held if handover is not None else None
    checksum = held.checksum if held is not None and held.migration is migration \
        else _checksum(ws, migration)  # (a claim sent ahead has it already)
    progress = ws.progress
    if progress:
        progress.on_start(name, direction)
    ws.events.emit("migration:start", migration=name, direction=direction, batch=batch)
    record = _Record(ws, run, migration, direction, batch, checksum, handover=handover)
    if handover is not None and following is not None \
            and _claims_ahead(ws, hooks, migration, direction, following[0]):
        record.ahead = _Record(ws, run, following[0], direction, following[1],
                               _checksum(ws, following[0]))
    body = ws.background.body(migration, direction, checksum) \
        if migration.background is not None else \
        migration.up if direction == "up" else migration.down
    assert body is not None
    sessions: list[ClientSession] = []
    try:
        outcome = execute(body, ctx, name=name, direction=direction,
                          use_transaction=use_transaction, timeout_ms=timeout_ms,
                          record=record.write, batch=batch, sessions=sessions,
                          record_async=record.write_async, path=migration.path,
                          begin=record.begin)
    except MigronautError as error:
        record.failed(error, ctx.with_session(sessions[0]) if sessions else ctx, hooks)
        raise
    if progress:
        progress.on_stop("success")
    ws.events.emit("migration:success", migration=name, direction=direction, batch=batch,
                   durationMs=outcome.duration_ms, attempts=outcome.attempts)
    if migration.background is not None:
        verb = "⧗ Registered" if direction == "up" else "⧗ Reverting"
    else:
        verb = "✔ Applied " if direction == "up" else "↩ Reverted"
    logger = ws.project.logger
    if logger.isEnabledFor(logging.INFO):  # (its fields are only built for a line written)
        logger.info("%s %s   [%dms]", verb, name, outcome.duration_ms, extra={
            "runId": run.id, "migration": name, "direction": direction, "batch": batch,
            "durationMs": outcome.duration_ms, "attempts": outcome.attempts})
    run.results.append(RunResult(
        name, "applied" if direction == "up" else "reverted",
        duration=outcome.duration_ms, batch=batch))
    if migration.background is not None and direction == "up" and config.background_inline:
        ws.background.drive_inline(run, name)
    call_hook(hooks, "after_each", name, outcome.duration_ms, ctx, info)


def _checksum(ws: Workspace, migration: MigrationModule) -> str:
    """The checksum the record keeps: that of the bytes the run loaded and runs, else (a
    module not loaded from its file) the file's now."""
    return migration.checksum or ws.project.checksum(migration.name) or ""


@dataclass(slots=True)
class _Record:
    """The changelog record of one migration: written inside its transaction (or right after
    its body), or, when it failed, the failure."""

    ws: Workspace
    run: Run
    migration: MigrationModule
    direction: Direction
    batch: int | None
    checksum: str
    started: float = field(default_factory=time.monotonic)
    #: The status this run claimed the record in (outside a transaction), else ``None``.
    claimed: str | None = None
    #: The status the record had when the run planned it.
    planned: str | None = None
    #: Where a claim sent ahead waits for its step (see :class:`Handover`).
    handover: Handover | None = None
    #: The next migration, claimed with this one's final write (:func:`_claims_ahead`).
    ahead: _Record | None = None

    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def applied(self) -> dict[str, Any]:
        run, migration = self.run, self.migration
        config = self.ws.project.config
        return {
            "name": migration.name, "batch": self.batch, "status": "applied",
            "checksum": self.checksum, "environment": config.resolved_environment,
            "executedBy": run.executed_by, "duration": self.elapsed_ms(),
            "runId": run.id, "description": migration.description,
            "requestedBy": run.requested_by, "reason": run.reason,
            "kind": "background" if migration.background is not None else None,
        }

    def _reverted(self, matched: int) -> None:
        if self.direction == "down" and matched == 0:
            self.ws.project.logger.warning(
                "⚠ Warning  Changelog record for %s was not 'applied' — revert not "
                "recorded", self.migration.name, extra={"event": "changelog:revert-miss"},
            )

    def begin(self) -> None:
        """Claim the record before a body outside a transaction (its intent); another run that
        changed it since this run planned refuses this one (``LOCK_LOST``: it lost its lock to
        that run), never a second execution. A claim the previous migration's final write
        already made (confirmed by its reply) is taken over instead."""
        if self.handover is not None and self.handover.adopt(self):
            return
        run, name = self.run, self.migration.name
        if not self.ws.connection.changelog.claim(self.intent(), run.id):
            raise LockLostError(
                f"Another run changed the changelog record of {name} since this run planned "
                "it; it was not run again", {"name": name, "reason": "record claimed by "
                                             "another run", "aborted": True})
        self.claimed = RUNNING if self.direction == "up" else REVERTING

    def intent(self) -> ChangelogWrite:
        """This migration's claim (:func:`intent_write`); sets :attr:`planned`."""
        run = self.run
        # a revert and a forced re-run start from an applied record; any other up from one
        # that is not applied (the claim's filter says so: no read needed)
        self.planned = APPLIED if self.direction == "down" or self.migration.name in run.rerun \
            else None
        intent = {"runId": run.id, "lockOwner": run.lock.owner if run.lock else None,
                  "host": _HOST, "pid": os.getpid(), "direction": self.direction}
        return intent_write(self.migration.name, direction=self.direction,
                            planned=self.planned, intent=intent, record=self.applied())

    def give_back(self) -> None:
        """Undo this claim, its body never started (best effort: a claim that stays leaves
        the migration in doubt, never run twice)."""
        from pymongo.errors import PyMongoError

        name = self.migration.name
        try:
            self.ws.connection.changelog.give_back(name, RUNNING, self.run.id)
        except PyMongoError as error:
            self.ws.project.logger.warning(
                "⚠ Warning  Could not give back the claim of %s (its body never started): %s — "
                "it is in doubt until you record the outcome: migronaut resolve %s --pending",
                name, error, name, extra={"event": "changelog:claim-kept"})

    def write(self, session: ClientSession | None) -> None:
        ws, run = self.ws, self.run
        lock = run.lock
        if lock is not None and session is not None:
            fence = lock.fence()
            if fence is not None:
                renewal = ws.connection.lock_collection.update_one(*fence, session=session)
                lock.fenced(renewal.matched_count == 1)
            abort_if_lock_lost(ws, run)
        lost = None
        if lock is not None and session is None:
            # The body's writes are done: its record is written whatever the lock says (a
            # changelog hiding them would let a later up apply it again); a lost lock stops
            # the run right after (check_between, the run's finish).
            lost = lock.confirm()
        changelog = ws.connection.changelog
        ahead = self.ahead
        if ahead is not None and self.claimed == RUNNING and lost is None \
                and not run.cancellation.cancelled:
            self._finish_and_claim(finished_write(applied_write(self.applied()), run.id), ahead)
        elif self.claimed is not None:
            change = applied_write(self.applied()) if self.direction == "up" else \
                reverted_write(self.migration.name, requested_by=run.requested_by,
                               reason=run.reason)
            done = "applied" if self.direction == "up" else "reverted"
            if not changelog.finish(finished_write(change, run.id), done):
                raise self._taken()
        elif self.direction == "up":
            changelog.mark_applied(self.applied(), session)
        else:
            self._reverted(changelog.mark_reverted(
                self.migration.name, session, requested_by=run.requested_by, reason=run.reason
            ).matched_count)

    def _finish_and_claim(self, final: ChangelogWrite, ahead: _Record) -> None:
        """This migration's final write and the next one's claim in one command
        (:meth:`~migronaut.core.changelog.Changelog.finish_and_claim`). The next body starts
        only on a claim confirmed with this record; a claim made while this record was not
        (no match, or no answer) is given back, and this migration is in doubt as after a
        lone final write; a claim refused is sent again by the next step's own ``begin``."""
        assert self.handover is not None
        changelog = self.ws.connection.changelog
        try:
            finished, claimed = changelog.finish_and_claim(final, ahead.intent(), self.run.id)
        except Exception:
            ahead.give_back()  # its statement may have been applied before the reply was lost
            raise
        if claimed and finished:
            ahead.claimed = RUNNING
            self.handover.held = ahead
        elif claimed:
            ahead.give_back()
        if not finished:
            raise self._taken()

    def _taken(self) -> MigrationInDoubtError:
        name = self.migration.name
        return MigrationInDoubtError(
            f"Migration {self.direction} of {name} finished, but its changelog record is no "
            "longer this run's claim (resolved or changed by another run meanwhile): check it, "
            "migronaut status", {"name": name, "runId": self.run.id,
                                 "direction": self.direction, "bodySucceeded": True})

    def withdraw(self) -> bool:
        """After a failed body: give the claim back when the record was applied before it (a
        revert, a forced re-run); ``False`` when an ``up`` claim should become ``failed``."""
        if self.claimed is None or self.planned != APPLIED:
            return False
        from pymongo.errors import PyMongoError

        change = withdrawn_write(self.migration.name, self.claimed, self.run.id)
        try:
            self.ws.connection.changelog.finish(change, APPLIED)
        except PyMongoError:
            pass  # best effort: the claim stays, and the migration is in doubt
        return True

    async def write_async(self, session: AsyncClientSession) -> None:
        ws, run = self.ws, self.run
        config = ws.project.config
        database = session.client[config.db_name or ""]
        lock = run.lock
        fence = lock.fence() if lock is not None else None
        if lock is not None and fence is not None:  # (as write's, in the async transaction)
            renewal = await database[config.lock_collection].update_one(*fence, session=session)
            lock.fenced(renewal.matched_count == 1)
        abort_if_lock_lost(ws, run)
        change = applied_write(self.applied()) if self.direction == "up" else \
            reverted_write(self.migration.name, requested_by=run.requested_by,
                           reason=run.reason)
        collection = database[config.migrations_collection]
        self._reverted((await change.apply_async(collection, session)).matched_count)

    def failed(self, error: MigronautError, ctx: MigrationContext, hooks: Hooks) -> None:
        """The failure of the migration: events, log, result, ``on_error``, failed record."""
        ws, run, direction, batch = self.ws, self.run, self.direction, self.batch
        name = self.migration.name
        duration = self.elapsed_ms()
        logger = ws.project.logger
        if ws.progress:
            ws.progress.on_stop("error")
        ws.events.emit("migration:error", migration=name, direction=direction, batch=batch,
                       durationMs=duration, error=error.message)
        logger.error("✖ Error    %s", name, extra={
            "runId": run.id, "migration": name, "direction": direction, "batch": batch,
            "event": "migration:error"})
        run.results.append(RunResult(name, "error", duration=duration, batch=batch,
                                     error=error.message))
        try:
            call_hook(hooks, "on_error", name, error, ctx)
        except MigronautError as hook_error:
            logger.warning("⚠ on_error hook failed for %s: %s", name, hook_error.message)
        fenced = isinstance(error, LockLostError)  # a run that lost its lock writes no more
        phase = error.context.get("phase")
        if phase == "changelog-write" or fenced or isinstance(error, MigrationInDoubtError) \
                or error.context.get("inDoubt") is True:  # (a timed-out body outside a txn)
            pass  # the claim (if any) stays: the migration is in doubt
        elif self.withdraw():
            pass  # it was applied before this attempt, and stays so
        elif direction == "up" and not (phase == "intent-write" and self.planned == APPLIED):
            config = ws.project.config
            ws.connection.changelog.mark_failed({
                "name": name, "error": error.message,
                "environment": config.resolved_environment, "executedBy": run.executed_by,
                "batch": batch, "duration": duration, "runId": run.id, "checksum": self.checksum,
                "requestedBy": run.requested_by, "reason": run.reason,
            })
        error.context["durationMs"] = duration


@dataclass(slots=True)
class Handover:
    """A claim sent ahead with the previous migration's final write, held from that write's
    reply until its own step's ``begin``; :meth:`give_back` undoes it when the run stops in
    between (a lost lock, a stop request, any failure), so a migration whose body never
    started is not left in doubt."""

    held: _Record | None = None

    def adopt(self, record: _Record) -> bool:
        """Hand the held claim to ``record``'s step when it is that migration's."""
        held, self.held = self.held, None
        if held is None:
            return False
        if held.migration.name != record.migration.name:
            held.give_back()
            return False
        record.claimed, record.planned = held.claimed, held.planned
        return True

    def give_back(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            held.give_back()


def _claims_ahead(ws: Workspace, hooks: Hooks, migration: MigrationModule, direction: Direction,
                  following: MigrationModule) -> bool:
    """Whether the next migration's claim may ride with this one's final write.

    Only going up, between two plain migrations that run outside a transaction (a
    transactional one writes its record in its transaction and has no claim), and only with no
    ``before_each``/``after_each`` hook: those hooks run between this record and the next body,
    so a claim made before them would show the next migration ``running`` to a hook that reads
    the changelog, and would have to be given back whenever one fails — with such a hook each
    migration keeps its own two writes. A background migration drives or waits on its work in
    between, and a migration with background requirements may wait or stop before its body.
    """
    config = ws.project.config

    def outside_transaction(m: MigrationModule) -> bool:
        return not (m.use_transaction if m.use_transaction is not None
                    else config.use_transaction)

    return (direction == "up" and hooks.before_each is None and hooks.after_each is None
            and migration.background is None and following.background is None
            and not following.requires and outside_transaction(migration)
            and outside_transaction(following))
