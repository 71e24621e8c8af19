"""Calling user code that may be a plain function or ``async def``, with an optional timeout.

User code that runs on a helper thread runs in a copy of the caller's ``contextvars`` context, so
what the caller made current (an OpenTelemetry span, a log correlation) is current there too.

User code that raises ``SystemExit`` (``sys.exit()``) or ``KeyboardInterrupt`` has failed like
any other: callers turn it into their typed error (:func:`escaped`). The one exception is a
``KeyboardInterrupt`` that may be a real Ctrl-C — raised in the main thread while Python's own
SIGINT handler is installed (the API without the CLI, whose handler stops runs gracefully
instead): it keeps its meaning and propagates.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import signal
import threading
from collections.abc import Callable
from types import FunctionType
from typing import Any

from migronaut.core.context import MigrationContext

__all__ = ["TimedOut", "call_user", "call_with_timeout", "escaped", "is_coroutine_function"]


class TimedOut(Exception):
    """Internal: the call did not finish within its timeout (it keeps running in its thread)."""


def escaped(error: BaseException) -> bool:
    """Whether ``error`` — not an ``Exception`` — is user code's own failure: ``SystemExit``,
    ``KeyboardInterrupt`` (unless it may be a real Ctrl-C, see the module docstring), an
    ``asyncio.CancelledError`` a coroutine raised… ``GeneratorExit`` never reaches here."""
    if isinstance(error, Exception):
        return False
    if isinstance(error, KeyboardInterrupt):
        return not (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    return True


def call_user(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn``; when it returns an awaitable, run it to completion.

    An ``async def`` given a :class:`MigrationContext` that carries a bridge runs on the bridge's
    loop with the async-coloured context; any other awaitable runs on a fresh event loop.
    """
    if is_coroutine_function(fn):
        bridge = next((a.bridge for a in args
                       if isinstance(a, MigrationContext) and a.bridge is not None), None)
        if bridge is not None:
            return bridge.call(fn, *args)
    result = fn(*args)
    if result is None or not inspect.isawaitable(result):  # (None: most bodies and hooks)
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(result))
    # Already inside an event loop (a sync Migrator used from async code): use a private thread.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(_await(result))
        except BaseException as error:
            box["error"] = error

    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,),
                              name="migronaut-async-body")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def is_coroutine_function(fn: Any) -> bool:
    """``inspect.iscoroutinefunction``, answered from the code's flags for a plain function
    without a coroutine mark (every ``up``/``down`` and most hooks): a tenth of its cost, paid
    once per body and hook of a run."""
    if type(fn) is FunctionType and getattr(fn, "_is_coroutine_marker", None) is None:
        return bool(fn.__code__.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def call_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    """Run ``fn`` and wait at most ``timeout_s``; on expiry raise :class:`TimedOut`.

    The body cannot be cancelled from outside, so it keeps running in a daemon thread: the caller
    must make sure its late completion has no effect (see the runner's commit guard).
    """
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as error:
            box["error"] = error

    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,),
                              name="migronaut-migration-body", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimedOut()
    if "error" in box:
        raise box["error"]
    return box.get("value")
