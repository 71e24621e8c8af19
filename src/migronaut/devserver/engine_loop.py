"""The dev server's commands run on an event loop of their own, so its monitors are answered
while it works.

mongoeco serves every request on the loop that accepts connections. A command that works for
seconds — an aggregation over a million documents, an update of every document — held that loop,
so the ``hello`` a driver's monitor sends every 10 s went unanswered: the driver declared the
server gone, cancelled the command itself ("operation cancelled") and every other client's server
selection timed out. Here every request but ``hello`` runs on a second loop, in a thread of its
own; the accepting loop answers ``hello`` meanwhile (Python hands it the interpreter at least
every 5 ms). The storage engine and the layer in front of it stay single-threaded: only that
thread runs them, interleaving requests at the same points as before; a ``hello`` reads the
server's description, never the stored data.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final

__all__ = ["MONITORING", "EngineLoop", "command_name"]

#: Commands answered on the accepting loop: what a driver's monitor sends.
MONITORING: Final = frozenset({"hello", "isMaster", "ismaster"})

_OP_QUERY: Final = 2004
_OP_MSG: Final = 2013

Request = Callable[[], Coroutine[Any, Any, Any]]


def command_name(op_code: int, payload: bytes) -> str | None:
    """The first key of a request's command document, read from its bytes without decoding
    them; ``None`` when the request is not one command document (mongoeco then answers it)."""
    try:
        if op_code == _OP_MSG:
            if payload[4] != 0:  # after the flags, the body section (kind 0) comes first
                return None
            start = 4 + 1 + 4  # flags, section kind, document length
        elif op_code == _OP_QUERY:
            namespace_end = payload.index(b"\x00", 4)  # flags, then the namespace
            start = namespace_end + 1 + 4 + 4 + 4  # skip, return, document length
        else:
            return None
        if payload[start] == 0:  # an empty document
            return None
        key_end = payload.index(b"\x00", start + 1)
        return payload[start + 1:key_end].decode("utf-8")
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


class EngineLoop:
    """The thread and event loop that run every request but a monitor's."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="migronaut-devserver-engine",
                                         daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(
                    asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def route(self, op_code: int, payload: bytes, request: Request) -> Any:
        """Run ``request`` (mongoeco's answer to the request ``payload``) here for a monitor's
        ``hello``, on the engine's loop otherwise; its reply, or what it raised."""
        if command_name(op_code, payload) in MONITORING:
            return await request()
        future = asyncio.run_coroutine_threadsafe(request(), self._loop)
        return await asyncio.wrap_future(future)  # (a cancel here cancels it there)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what still runs on the engine's loop and end its thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
