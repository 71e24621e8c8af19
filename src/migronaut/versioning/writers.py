"""The guarded writers and ``retry_on_conflict``, sync and async (reference §3.4.2).

Collections are used structurally: anything with ``update_one``, ``replace_one``,
``find_one_and_update``, ``find_one`` and ``with_options`` (a pymongo ``Collection``; the ``a…``
variants take an ``AsyncCollection``). Both flavours share :mod:`.guards`; they differ only in
the awaits. The driver is imported only when a miss is verified.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from migronaut.errors import RevisionConflictError, RunAbortedError
from migronaut.versioning.fields import DEFAULT_FIELD, DEFAULT_REVISION_FIELD
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


def _verify_args(write: GuardedWrite) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """The re-read: the caller's filter without the guard, projecting only the revision."""
    return write.caller_filter, {"projection": {"_id": 0, write.revision_field: 1},
                                 **write.read_options}


def _verified(write: GuardedWrite) -> RevisionConflictError:
    if not write.verify:
        return write.conflict(None, read=False)
    filter, options = _verify_args(write)
    try:
        found = _primary(write).find_one(filter, **options)
    except Exception:
        return write.conflict(None, read=False)
    return write.conflict(found, read=True)


async def _averified(write: GuardedWrite) -> RevisionConflictError:
    if not write.verify:
        return write.conflict(None, read=False)
    filter, options = _verify_args(write)
    try:
        found = await _primary(write).find_one(filter, **options)
    except Exception:
        return write.conflict(None, read=False)
    return write.conflict(found, read=True)


def _find_options(write: GuardedWrite) -> dict[str, Any]:
    """``find_one_and_update`` returns the document after the update unless asked otherwise."""
    return {"return_document": True, **write.options}


def update_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any, *,
    field: str = DEFAULT_FIELD, revision_field: str = DEFAULT_REVISION_FIELD,
    version: int | None = None, verify: bool = True, **options: Any,
) -> RevisionResult:
    """``update_one`` that applies only at ``expected_revision`` and bumps it; a miss raises
    :class:`RevisionConflictError` with its reason. ``options`` go to the driver."""
    write = prepare_update(collection, filter, expected_revision, update, field=field,
                           revision_field=revision_field, version=version, verify=verify,
                           options=options)
    result = write.result(collection.update_one(write.filter, write.document, **write.options))
    if result is None:
        raise _verified(write)
    return result


def replace_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int,
    replacement: Mapping[str, Any], *, field: str = DEFAULT_FIELD,
    revision_field: str = DEFAULT_REVISION_FIELD, version: int | None = None,
    verify: bool = True, **options: Any,
) -> RevisionResult:
    """``replace_one`` at ``expected_revision``; the stored revision becomes expected + 1."""
    write = prepare_replace(collection, filter, expected_revision, replacement, field=field,
                            revision_field=revision_field, version=version, verify=verify,
                            options=options)
    result = write.result(collection.replace_one(write.filter, write.document, **write.options))
    if result is None:
        raise _verified(write)
    return result


def find_one_and_update_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any, *,
    field: str = DEFAULT_FIELD, revision_field: str = DEFAULT_REVISION_FIELD,
    version: int | None = None, verify: bool = True, **options: Any,
) -> Any:
    """``find_one_and_update`` at ``expected_revision``: the document after the update (or
    before, with ``return_document=ReturnDocument.BEFORE``)."""
    write = prepare_update(collection, filter, expected_revision, update, field=field,
                           revision_field=revision_field, version=version, verify=verify,
                           options=options)
    document = collection.find_one_and_update(write.filter, write.document,
                                              **_find_options(write))
    if document is None:
        raise _verified(write)
    return document


async def aupdate_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any, *,
    field: str = DEFAULT_FIELD, revision_field: str = DEFAULT_REVISION_FIELD,
    version: int | None = None, verify: bool = True, **options: Any,
) -> RevisionResult:
    """:func:`update_with_revision` over an ``AsyncCollection``."""
    write = prepare_update(collection, filter, expected_revision, update, field=field,
                           revision_field=revision_field, version=version, verify=verify,
                           options=options)
    result = write.result(await collection.update_one(write.filter, write.document,
                                                      **write.options))
    if result is None:
        raise await _averified(write)
    return result


async def areplace_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int,
    replacement: Mapping[str, Any], *, field: str = DEFAULT_FIELD,
    revision_field: str = DEFAULT_REVISION_FIELD, version: int | None = None,
    verify: bool = True, **options: Any,
) -> RevisionResult:
    """:func:`replace_with_revision` over an ``AsyncCollection``."""
    write = prepare_replace(collection, filter, expected_revision, replacement, field=field,
                            revision_field=revision_field, version=version, verify=verify,
                            options=options)
    result = write.result(await collection.replace_one(write.filter, write.document,
                                                       **write.options))
    if result is None:
        raise await _averified(write)
    return result


async def afind_one_and_update_with_revision(
    collection: Any, filter: Mapping[str, Any], expected_revision: int, update: Any, *,
    field: str = DEFAULT_FIELD, revision_field: str = DEFAULT_REVISION_FIELD,
    version: int | None = None, verify: bool = True, **options: Any,
) -> Any:
    """:func:`find_one_and_update_with_revision` over an ``AsyncCollection``."""
    write = prepare_update(collection, filter, expected_revision, update, field=field,
                           revision_field=revision_field, version=version, verify=verify,
                           options=options)
    document = await collection.find_one_and_update(write.filter, write.document,
                                                    **_find_options(write))
    if document is None:
        raise await _averified(write)
    return document


# ------------------------------------------------------------------------------ retry


def _check_retry(fn: Any, attempts: Any, backoff: Any) -> None:
    if not callable(fn):
        raise refuse("retry_on_conflict needs a function", "fn")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
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


def retry_on_conflict(
    fn: Callable[[int], T], *, attempts: int = 3,
    backoff: Callable[[int], float] | None = None, signal: threading.Event | None = None,
) -> T:
    """Run ``fn(attempt)`` (1, 2, …) until it does not raise a retryable
    :class:`RevisionConflictError` (any reason but ``not-found``), at most ``attempts`` times,
    waiting a full-jitter backoff between tries. Setting ``signal`` stops the wait
    (:class:`RunAbortedError`); any other error is raised at once."""
    _check_retry(fn, attempts, backoff)
    attempt = 1
    while True:
        if signal is not None and signal.is_set():
            raise _stopped()
        try:
            return fn(attempt)
        except RevisionConflictError as error:
            wait = _delay(error, attempt, attempts, backoff)
        if signal is not None:
            if signal.wait(wait):
                raise _stopped()
        else:
            time.sleep(wait)
        attempt += 1


async def aretry_on_conflict(
    fn: Callable[[int], Awaitable[T]], *, attempts: int = 3,
    backoff: Callable[[int], float] | None = None, signal: asyncio.Event | None = None,
) -> T:
    """:func:`retry_on_conflict` for a coroutine function; ``signal`` is an ``asyncio.Event``."""
    _check_retry(fn, attempts, backoff)
    attempt = 1
    while True:
        if signal is not None and signal.is_set():
            raise _stopped()
        try:
            return await fn(attempt)
        except RevisionConflictError as error:
            wait = _delay(error, attempt, attempts, backoff)
        if signal is not None:
            try:
                await asyncio.wait_for(signal.wait(), wait)
            except TimeoutError:
                pass
            else:
                raise _stopped()
        else:
            await asyncio.sleep(wait)
        attempt += 1
