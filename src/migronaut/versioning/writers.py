"""The guarded writers and ``retry_on_conflict``, sync and async (reference §3.4.2).

Collections are used structurally: anything with ``update_one``, ``replace_one``,
``find_one_and_update``, ``find_one`` and ``with_options`` (a pymongo ``Collection``; the ``a…``
variants take an ``AsyncCollection``). Both flavours run one body (:func:`_write`); the sync
one drives it with calls that never suspend. The driver is imported only when a miss is verified.

Every writer takes its own keyword options — ``field`` (default ``__v``), ``revision_field``
(``__rev``), ``version`` (also set the shape version; 0 removes it), ``verify`` (default true:
re-read once on a miss to name the reason) — and passes the rest to pymongo (``session``,
``hint``, ``collation``, ``array_filters``, ``let``, ``projection``, ``return_document``, …).
A miss raises :class:`RevisionConflictError` with ``reason`` ``not-found``, ``conflict`` (and
``actual``), ``invalid`` (a stored revision that is no count, an array say) or ``unknown``; a
refused call raises ``CONFIG_INVALID`` before sending anything.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar, cast

from migronaut._values import is_int
from migronaut.errors import RevisionConflictError, RunAbortedError
from migronaut.versioning.guards import (
    GuardedWrite,
    RevisionResult,
    prepare_replace,
    prepare_update,
)
from migronaut.versioning.updates import refuse

__all__ = [
    "afind_one_and_update_with_revision",
    "areplace_with_revision",
    "aretry_on_conflict",
    "aupdate_with_revision",
    "find_one_and_update_with_revision",
    "replace_with_revision",
    "retry_on_conflict",
    "update_with_revision",
]

T = TypeVar("T")
#: Full-jitter backoff bounds, in milliseconds.
BASE_MS, MAX_MS = 10, 1000


def _primary(write: GuardedWrite) -> Any:
    from pymongo import ReadPreference

    return write.collection.with_options(read_preference=ReadPreference.PRIMARY)


Call = Callable[..., Awaitable[Any]]


async def _direct(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls a sync driver method: never suspends, so :func:`_sync` finishes in one step."""
    return method(*args, **kwargs)


async def _awaited(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await method(*args, **kwargs)


def _sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (driven by :func:`_direct`)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a synchronous guarded write suspended")  # pragma: no cover


async def _write(write: GuardedWrite, method: str, call: Call) -> Any:
    """One guarded write and, on a miss, the re-read naming the reason — the same body for
    sync (``call`` = :func:`_direct`) and async (:func:`_awaited`) collections."""
    send = getattr(write.collection, method)
    if method == "find_one_and_update":
        # the document after the update unless asked otherwise
        document = await call(send, write.filter, write.document,
                              **{"return_document": True, **write.options})
        if document is not None:
            return document
    else:
        result = write.result(await call(send, write.filter, write.document, **write.options))
        if result is not None:
            return result
    if not write.verify:
        raise write.conflict(None, read=False)
    options = {"projection": {"_id": 0, write.revision_field: 1}, **write.read_options}
    try:  # the caller's filter without the guard, on the primary, projecting the revision
        found = await call(_primary(write).find_one, write.caller_filter, **options)
    except Exception:
        raise write.conflict(None, read=False) from None  # a failed re-read: unknown
    raise write.conflict(found, read=True)


def update_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any,
    **options: Any,
) -> RevisionResult:
    """``update_one`` applied only at ``expected_revision``, bumping the revision.

    Own options: ``field`` (``__v``), ``revision_field`` (``__rev``), ``version`` (also set the
    shape version; 0 removes it), ``verify`` (re-read once on a miss to name the reason); the
    rest go to pymongo. Returns a :class:`RevisionResult`; a miss raises
    :class:`RevisionConflictError` (``not-found``, ``conflict`` with ``actual``, ``unknown``).
    """
    write = prepare_update(collection, filter, expected_revision, update, options)
    return cast(RevisionResult, _sync(_write(write, "update_one", _direct)))


def replace_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int,
    replacement: Mapping[str, Any], **options: Any,
) -> RevisionResult:
    """``replace_one`` at ``expected_revision``; the stored revision becomes expected + 1."""
    write = prepare_replace(collection, filter, expected_revision, replacement, options)
    return cast(RevisionResult, _sync(_write(write, "replace_one", _direct)))


def find_one_and_update_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any,
    **options: Any,
) -> Any:
    """``find_one_and_update`` at ``expected_revision``: the document after the update (or
    before, with ``return_document=ReturnDocument.BEFORE``)."""
    write = prepare_update(collection, filter, expected_revision, update, options)
    return _sync(_write(write, "find_one_and_update", _direct))


async def aupdate_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any,
    **options: Any,
) -> RevisionResult:
    """:func:`update_with_revision` over an ``AsyncCollection``."""
    write = prepare_update(collection, filter, expected_revision, update, options)
    return cast(RevisionResult, await _write(write, "update_one", _awaited))


async def areplace_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int,
    replacement: Mapping[str, Any], **options: Any,
) -> RevisionResult:
    """:func:`replace_with_revision` over an ``AsyncCollection``."""
    write = prepare_replace(collection, filter, expected_revision, replacement, options)
    return cast(RevisionResult, await _write(write, "replace_one", _awaited))


async def afind_one_and_update_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any,
    **options: Any,
) -> Any:
    """:func:`find_one_and_update_with_revision` over an ``AsyncCollection``."""
    write = prepare_update(collection, filter, expected_revision, update, options)
    return await _write(write, "find_one_and_update", _awaited)


# ------------------------------------------------------------------------------ retry


def _check_retry(fn: Any, attempts: Any, backoff: Any) -> None:
    if not callable(fn):
        raise refuse("retry_on_conflict needs a function", "fn")
    if not is_int(attempts) or attempts < 1:
        raise refuse(f"attempts must be an integer ≥ 1 (got {attempts!r})", "attempts")
    if backoff is not None and not callable(backoff):
        raise refuse("backoff must be a function of the attempt returning milliseconds",
                     "backoff")


def _delay(
    error: RevisionConflictError, attempt: int, attempts: int,
    backoff: Callable[[int], float] | None,
) -> float:
    """Seconds to wait before the next attempt; re-raises what must not be retried."""
    if error.context.get("reason") == "not-found" or attempt >= attempts:
        raise error
    ms = backoff(attempt) if backoff is not None else \
        random.random() * min(MAX_MS, BASE_MS * 2**attempt)
    return max(0.0, float(ms)) / 1000


def _stopped() -> RunAbortedError:
    return RunAbortedError("retry_on_conflict stopped by its signal")


async def _retry(
    fn: Callable[[int], Any], attempts: int, backoff: Callable[[int], float] | None,
    call: Call, pause: Callable[[float], Awaitable[bool]], stopped: Callable[[], bool],
) -> Any:
    """The retry loop for both flavours: ``pause`` waits and says whether the signal fired."""
    _check_retry(fn, attempts, backoff)
    attempt = 1
    while True:
        if stopped():
            raise _stopped()
        try:
            return await call(fn, attempt)
        except RevisionConflictError as error:
            wait = _delay(error, attempt, attempts, backoff)
        if await pause(wait):
            raise _stopped()
        attempt += 1


def retry_on_conflict(
    fn: Callable[[int], T], *, attempts: int = 3,
    backoff: Callable[[int], float] | None = None, signal: threading.Event | None = None,
) -> T:
    """Run ``fn(attempt)`` (1, 2, …) until it does not raise a retryable
    :class:`RevisionConflictError` (any reason but ``not-found``), at most ``attempts`` times,
    waiting a full-jitter backoff between tries. Setting ``signal`` stops the wait
    (:class:`RunAbortedError`); any other error is raised at once."""

    async def pause(seconds: float) -> bool:
        if signal is None:
            time.sleep(seconds)
            return False
        return signal.wait(seconds)

    return cast(T, _sync(_retry(fn, attempts, backoff, _direct, pause,
                                lambda: signal is not None and signal.is_set())))


async def aretry_on_conflict(
    fn: Callable[[int], Awaitable[T]], *, attempts: int = 3,
    backoff: Callable[[int], float] | None = None, signal: asyncio.Event | None = None,
) -> T:
    """:func:`retry_on_conflict` for a coroutine function; ``signal`` is an ``asyncio.Event``."""

    async def pause(seconds: float) -> bool:
        if signal is None:
            await asyncio.sleep(seconds)
            return False
        try:
            await asyncio.wait_for(signal.wait(), seconds)
        except TimeoutError:
            return False
        return True

    return cast(T, await _retry(fn, attempts, backoff, _awaited, pause,
                                lambda: signal is not None and signal.is_set()))
