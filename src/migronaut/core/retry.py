"""Writes of migronaut's own state that survive a dropped connection: retry, then say so typed.

Invariant: only writes that are idempotent go through :func:`retry_transient` — the changelog
upsert by name, the failed-attempt record, the lock's acquire (judged by owner + nonce), renewal
and release — so a write the server applied but whose reply was lost can be sent again without
changing the outcome. A migration body is never retried here: what it did is its own business
(a body that fails on the network is a failed migration). A connection error that survives the
retries, or that any other command of a run meets, is ``CONNECTION_FAILED`` (exit 5), never a
raw driver error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Final, TypeVar

from migronaut.errors import ConnectionFailedError, MigronautError, describe_exception

__all__ = ["ATTEMPTS", "OUTAGE_CODES", "as_connection_failed", "is_connection_error",
           "is_outage", "is_transient", "retry_transient"]

T = TypeVar("T")

#: Attempts of one write (the first included); the pauses between them double from
#: :data:`FIRST_PAUSE_S` (jittered), about 1.5 s in all: longer than a connection reset,
#: a pool refill and a re-check of the server take, short enough to fail a run promptly.
ATTEMPTS = 6
FIRST_PAUSE_S = 0.05


#: Server answers meaning "not the primary now / shutting down / unreachable": an election or a
#: restart, over once a primary answers again (the codes drivers retry writes on).
OUTAGE_CODES: Final = frozenset({
    6, 7, 89, 91, 189, 9001, 10058, 10107, 11600, 11602, 13435, 13436,
})


def is_outage(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is an outage rather than a fault.

    A lost connection, a server that is not (or no longer) the primary, an election, a shutdown,
    and any error the server labels ``RetryableWriteError`` or ``TransientTransactionError`` is
    over once the network or the replica set is back: callers back off and retry instead of
    counting a failure (background lanes ride outages out this way).
    """
    from pymongo.errors import ConnectionFailure, PyMongoError

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionFailure):
            return True
        if isinstance(error, PyMongoError):
            if getattr(error, "code", None) in OUTAGE_CODES:
                return True
            if error.has_error_label("RetryableWriteError") or error.has_error_label(
                "TransientTransactionError"
            ):
                return True
        error = error.__cause__
    return False


def is_connection_error(error: BaseException) -> bool:
    """The driver lost (or never got) a connection: network error, timeout, no primary."""
    from pymongo.errors import ConnectionFailure

    return isinstance(error, ConnectionFailure)


def is_transient(error: BaseException) -> bool:
    """Worth sending the same idempotent write again: an outage (:func:`is_outage`), but not a
    server-selection timeout: it has already waited the whole ``serverSelectionTimeoutMS``,
    waiting again would only double it."""
    from pymongo.errors import ServerSelectionTimeoutError

    return not isinstance(error, ServerSelectionTimeoutError) and is_outage(error)


def retry_transient(
    write: Callable[[], T],
    *,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """``write()``, sent again after a short backoff while it fails transiently.

    The last error is raised as it is (callers type it); anything not transient at once.
    """
    pause = FIRST_PAUSE_S
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except Exception as error:
            if attempt == attempts or not is_transient(error):
                raise
        sleep(pause * random.uniform(0.75, 1.25))
        pause *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def as_connection_failed(error: BaseException, context: dict[str, object] | None = None
                         ) -> MigronautError | None:
    """``CONNECTION_FAILED`` for a connection error met mid-command, else ``None``."""
    if isinstance(error, MigronautError) or not is_connection_error(error):
        return None
    return ConnectionFailedError(
        f"Lost the connection to MongoDB: {describe_exception(error)}", context or {},
        cause=error,
    )
