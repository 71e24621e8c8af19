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
from typing import TypeVar

from migronaut.errors import ConnectionFailedError, MigronautError, describe_exception

__all__ = ["ATTEMPTS", "as_connection_failed", "is_connection_error", "is_transient",
           "retry_transient"]

T = TypeVar("T")

#: Attempts of one write (the first included); the pauses between them double from
#: :data:`FIRST_PAUSE_S` (jittered), about 1.5 s in all: longer than a connection reset,
#: a pool refill and a re-check of the server take, short enough to fail a run promptly.
ATTEMPTS = 6
FIRST_PAUSE_S = 0.05


def is_connection_error(error: BaseException) -> bool:
    """The driver lost (or never got) a connection: network error, timeout, no primary."""
    from pymongo.errors import ConnectionFailure

    return isinstance(error, ConnectionFailure)


def is_transient(error: BaseException) -> bool:
    """Worth sending the same idempotent write again: a network error, a not-primary reply, or
    a server error labelled ``RetryableWriteError``. Not a server-selection timeout: it has
    already waited the whole ``serverSelectionTimeoutMS``, waiting again would only double it."""
    from pymongo.errors import ConnectionFailure, PyMongoError, ServerSelectionTimeoutError

    if isinstance(error, ServerSelectionTimeoutError):
        return False
    if isinstance(error, ConnectionFailure):
        return True
    return isinstance(error, PyMongoError) and error.has_error_label("RetryableWriteError")


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
