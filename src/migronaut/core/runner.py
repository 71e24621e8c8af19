"""Running one migration body: transaction, timeout, and the changelog write that records it.

Invariant: a migration is recorded only when its body succeeded and in time, and is never run
twice without a decision. In a transaction the changelog write happens inside the same
transaction, so data and record commit together (the driver may retry the whole callback: bodies
must be idempotent; no intent is needed, a killed run leaves nothing behind); a body that timed
out can still finish in its thread, but its transaction is refused at the commit guard. Without
a transaction the run first claims the record (``begin``: an intent, ``running``/``reverting``,
see :mod:`migronaut.core.changelog`), then runs the body, then writes the record (retried over
transient network errors, see :mod:`migronaut.core.retry`); a crash or a failed write in between
leaves the record in doubt, as does a body that outlived its timeout (it may still be running,
or have stopped half-way), and nothing runs that migration again until an operator resolves it.
A body that raises ``SystemExit`` or ``KeyboardInterrupt`` has failed like one that raises
anything else.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migronaut.core._calls import (
    TimedOut,
    call_user,
    call_with_timeout,
    escaped,
    is_coroutine_function,
)
from migronaut.core.context import MigrationContext
from migronaut.core.retry import is_connection_error
from migronaut.core.topology import refuses_transactions
from migronaut.errors import (
    ConnectionFailedError,
    MigrationExecutionFailedError,
    MigrationTimeoutError,
    MigronautError,
    TransactionsUnsupportedError,
    describe_exception,
)

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.client_session import ClientSession

__all__ = ["Execution", "execute", "user_line"]


@dataclass
class Execution:
    duration_ms: int = 0
    attempts: int = 0


def user_line(error: BaseException, path: Path | None) -> int | None:
    """The line of the migration file where ``error`` was raised (its innermost frame in that
    file), so the error can point at the user's code rather than at migronaut's."""
    if path is None:
        return None
    wanted = str(path)
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == wanted:
            line = frame.lineno
    return line


def execute(
    body: Callable[[MigrationContext], Any],
    ctx: MigrationContext,
    *,
    name: str,
    direction: str,
    use_transaction: bool,
    timeout_ms: int | None,
    record: Callable[[ClientSession | None], None],
    batch: int | None = None,
    sessions: list[ClientSession] | None = None,
    record_async: Callable[[AsyncClientSession], Awaitable[None]] | None = None,
    path: Path | None = None,
    begin: Callable[[], None] | None = None,
) -> Execution:
    """Run ``body(ctx)`` and ``record(session)``; raise the typed error on any failure.

    ``sessions`` receives the transaction's session, so a failure handler can give the
    ``on_error`` hook the same context the body had. An ``async def`` body in a transaction runs
    in an async transaction on ``ctx.bridge``, and ``record_async`` writes its changelog record in
    that same transaction. ``path`` (the migration file) lets a failure name the line of the
    user's code it came from. ``begin`` claims the record before a body that runs outside a
    transaction (its intent); a claim that fails stops before the body.
    """
    outcome = Execution()
    timeout_s = timeout_ms / 1000 if timeout_ms else None

    def run_plain() -> None:
        outcome.attempts = 1
        started = time.monotonic()
        call_user(body, ctx.for_migration(attempt=1))  # ctx.logger lines carry it too
        outcome.duration_ms = int((time.monotonic() - started) * 1000)

    def run_transaction() -> None:
        with ctx.client.start_session() as session:
            if sessions is not None:
                sessions.append(session)

            def callback(s: ClientSession) -> None:
                outcome.attempts += 1
                started = time.monotonic()
                call_user(body, ctx.with_session(s).for_migration(attempt=outcome.attempts))
                outcome.duration_ms = int((time.monotonic() - started) * 1000)
                # Commit guard: a body that outlived its timeout or a stopped run never commits.
                if timed_out:
                    raise MigrationTimeoutError("timed out before commit")
                record(s)

            session.with_transaction(callback)

    def run_async_transaction() -> None:
        assert ctx.bridge is not None and record_async is not None
        bridge = ctx.bridge

        async def callback(s: AsyncClientSession, client: Any) -> None:
            outcome.attempts += 1
            started = time.monotonic()
            await body(bridge.coloured(ctx, s).for_migration(attempt=outcome.attempts))
            outcome.duration_ms = int((time.monotonic() - started) * 1000)
            if timed_out:  # the same commit guard as the sync transaction's
                raise MigrationTimeoutError("timed out before commit")
            await record_async(s)

        bridge.transaction(callback)

    if not use_transaction:
        run = run_plain
    elif is_coroutine_function(body) and ctx.bridge is not None:
        run = run_async_transaction
    else:
        run = run_transaction
    timed_out = False
    if not use_transaction and begin is not None:
        _claim(begin, name=name, direction=direction)
    try:
        call_with_timeout(run, timeout_s)
    except TimedOut:
        timed_out = True
        # Outside a transaction the body may still finish (or may have stopped half-way): its
        # claim stays, and the migration is in doubt until an operator records the outcome.
        in_doubt = not use_transaction and begin is not None
        doubt = (f"; its body may still be running, so its record is left in doubt until you "
                 f"record the outcome: migronaut resolve {name} --applied|--pending"
                 ) if in_doubt else ""
        error = MigrationTimeoutError(
            f"Migration {direction} timed out after {timeout_ms}ms: {name}{doubt}",
            {"name": name, "direction": direction, "timeoutMs": timeout_ms,
             "inDoubt": in_doubt},
        )
        ctx.cancellation.cancel(error)
        raise error from None
    except MigronautError:
        raise
    except BaseException as error:
        if not isinstance(error, Exception) and not escaped(error):
            raise  # a real Ctrl-C under Python's own SIGINT handler
        if use_transaction and refuses_transactions(error):
            raise TransactionsUnsupportedError(
                f"Migration {name} uses a transaction, but the server is a standalone: "
                "transactions need a replica set or a sharded cluster",
                {"name": name},
                cause=error,
            ) from error
        line = user_line(error, path)
        where = f"{name}, line {line}" if line is not None else name
        context: dict[str, Any] = {"name": name, "direction": direction, "batch": batch}
        if line is not None:
            context.update({"file": str(path), "line": line})
        raise MigrationExecutionFailedError(
            f"Migration {direction} failed: {where}: {describe_exception(error)}",
            context,
            cause=error,
        ) from error
    if not use_transaction:
        try:
            record(None)
        except MigronautError:
            raise
        except Exception as error:
            failed = ConnectionFailedError if is_connection_error(error) \
                else MigrationExecutionFailedError
            doubt = (f"; its record is left in doubt until you record the outcome: "
                     f"migronaut resolve {name} --applied") if begin is not None else ""
            raise failed(
                f"Migration {direction} of {name} succeeded but recording it in the changelog "
                f"failed: {describe_exception(error)}{doubt}",
                {
                    "name": name,
                    "direction": direction,
                    "phase": "changelog-write",
                    "bodySucceeded": True,
                    "inDoubt": begin is not None,
                    "durationMs": outcome.duration_ms,
                },
                cause=error,
            ) from error
    return outcome


def _claim(begin: Callable[[], None], *, name: str, direction: str) -> None:
    """Write the intent; a network failure is ``CONNECTION_FAILED`` with nothing run."""
    try:
        begin()
    except MigronautError:
        raise
    except Exception as error:
        failed = ConnectionFailedError if is_connection_error(error) \
            else MigrationExecutionFailedError
        raise failed(
            f"Migration {direction} of {name} did not start: recording its intent in the "
            f"changelog failed: {describe_exception(error)}",
            {"name": name, "direction": direction, "phase": "intent-write",
             "bodySucceeded": False},
            cause=error,
        ) from error
