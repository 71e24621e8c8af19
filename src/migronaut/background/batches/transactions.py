"""Transactions of transactional batches and steps (reference §4.5): open, commit, retry.

A transactional batch or step runs in one snapshot transaction whose last write is its fenced
checkpoint, so a lane that lost its lease commits nothing. :func:`transaction` opens it (and
aborts it on any error), :func:`commit` retries an unknown commit result, and
:func:`txn_error_kind` sorts retryable errors (``conflict``, ``limit``, ``transient``) from the
rest; an outage is never retried here — the lane holding the partition rides it out.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from migronaut.background.batches.failures import SliceFailure, describe_server
from migronaut.core.retry import OUTAGE_CODES
from migronaut.core.topology import refuses_transactions
from migronaut.errors import TransactionsUnsupportedError

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

    from migronaut.background.lanes.turn import LaneState
    from migronaut.core.context import LinkedCancellation

__all__ = [
    "TXN_LIMIT_CODES",
    "TXN_TRANSIENT_CODES",
    "Conflict",
    "Retries",
    "commit",
    "outage",
    "transaction",
    "txn_error_kind",
]

#: Transaction time/size limits, transient codes.
TXN_LIMIT_CODES = frozenset({50, 262, 290, 334, 10334, 17419})
TXN_TRANSIENT_CODES = frozenset({112, 251, 24})
_WRITE_CONFLICT = 112


class Conflict(Exception):
    """Transactional strict mode: a guarded write matched nothing."""


@contextmanager
def transaction(lane: LaneState, timeout_ms: int) -> Iterator[ClientSession]:
    """A session in a snapshot transaction on the primary; aborted when the block raises."""
    from pymongo import ReadPreference, WriteConcern
    from pymongo.read_concern import ReadConcern

    with lane.db.client.start_session() as session:
        session.start_transaction(
            read_concern=ReadConcern("snapshot"),
            write_concern=WriteConcern(**dict(lane.spec.get("writeConcern") or {})),
            read_preference=ReadPreference.PRIMARY,
            max_commit_time_ms=timeout_ms,
        )
        try:
            yield session
        except BaseException:
            if session.in_transaction:
                try:
                    session.abort_transaction()
                except Exception as abort_error:
                    lane.logger.debug("abort failed: %s", type(abort_error).__name__)
            raise


def commit(session: ClientSession) -> None:
    """Commit; an unknown commit result is retried up to two more times."""
    from pymongo.errors import PyMongoError

    for attempt in range(3):
        try:
            session.commit_transaction()
            return
        except PyMongoError as error:
            if attempt < 2 and error.has_error_label("UnknownTransactionCommitResult"):
                continue
            raise


class Retries:
    """The failed attempts in a row a transactional batch or step may make (``maxRetries``)."""

    def __init__(self, transaction: Mapping[str, Any], what: str) -> None:
        self.max = int(transaction.get("maxRetries", 5))
        self.what = what
        self.attempts = 0

    def failed(self, error: BaseException) -> SliceFailure | None:
        """Count a failed attempt; the slice failure to raise once over the budget."""
        self.attempts += 1
        if self.attempts <= self.max:
            return None
        return SliceFailure(
            f"a transactional {self.what} failed {self.attempts} times in a row "
            f"({describe_server(error)}) — more than maxRetries ({self.max})")

    def pause(self, signal: LinkedCancellation) -> None:
        """A jittered, doubling pause before the next attempt; a stop ends it and raises."""
        if signal.wait(random.random() * min(2000, 50 * 2**self.attempts) / 1000.0):
            signal.raise_if_cancelled()


def txn_error_kind(error: BaseException) -> str | None:
    """``conflict``, ``limit`` or ``transient`` for retryable transaction errors, else ``None``.

    A server that cannot run transactions at all raises ``TRANSACTIONS_UNSUPPORTED``.
    """
    from pymongo.errors import PyMongoError

    if isinstance(error, Conflict):
        return "conflict"
    if not isinstance(error, PyMongoError):
        return None
    code = getattr(error, "code", None)
    if refuses_transactions(error):
        raise TransactionsUnsupportedError(
            "This server cannot run transactions (a standalone mongod?) — the background "
            "migration's transaction setting needs a replica set or mongos",
            {"code": code},
        ) from error
    if code == _WRITE_CONFLICT or (code is None and "write conflict" in str(error).lower()):
        return "conflict"  # (the dev server reports a conflict at commit by text only)
    if code in TXN_LIMIT_CODES:
        return "limit"
    if error.has_error_label("TransientTransactionError") or code in TXN_TRANSIENT_CODES:
        return "transient"
    return None


def outage(error: BaseException) -> bool:
    """A lost connection or a server that is not the primary: over once it is back."""
    from pymongo.errors import ConnectionFailure

    return isinstance(error, ConnectionFailure) or getattr(error, "code", None) in OUTAGE_CODES
