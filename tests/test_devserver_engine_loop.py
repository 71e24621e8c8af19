"""The dev server's engine loop: every request but a monitor's ``hello`` runs on a thread of its
own, so a command that holds the engine does not keep a driver's monitor waiting.

In-process (no server needed: the loop routes coroutines); the served path is covered by every
test that talks to the dev server.
"""

from __future__ import annotations

import asyncio
import threading

import bson
import pytest

from migronaut.devserver.engine_loop import MONITORING, EngineLoop, command_name


def op_msg(body: dict[str, object]) -> bytes:
    """An ``OP_MSG`` payload after its header: flags, the body section."""
    return bytes(4) + b"\x00" + bson.encode(body)


def op_query(namespace: str, body: dict[str, object]) -> bytes:
    """A legacy ``OP_QUERY`` payload after its header (as drivers send their first ``isMaster``
    when they do not know the server yet)."""
    return (bytes(4) + namespace.encode() + b"\x00" + (0).to_bytes(4, "little")
            + (1).to_bytes(4, "little", signed=True) + bson.encode(body))


@pytest.mark.parametrize(("op_code", "payload", "name"), [
    (2013, op_msg({"hello": 1, "$db": "admin"}), "hello"),
    (2013, op_msg({"find": "orders", "filter": {}, "$db": "shop"}), "find"),
    (2004, op_query("admin.$cmd", {"isMaster": 1, "helloOk": True}), "isMaster"),
    (2004, op_query("admin.$cmd", {"ismaster": 1}), "ismaster"),
])
def test_the_command_is_read_from_the_request_bytes(op_code: int, payload: bytes, name: str
                                                    ) -> None:
    assert command_name(op_code, payload) == name


@pytest.mark.parametrize(("op_code", "payload"), [
    (2013, b""),  # nothing
    (2013, bytes(4) + b"\x01" + bson.encode({"hello": 1})),  # a document sequence first
    (2013, op_msg({})),  # an empty body
    (2013, bytes(4) + b"\x00" + b"\x05\x00\x00\x00\x10hello"),  # a key never terminated
    (2013, bytes(4) + b"\x00" + b"\x0b\x00\x00\x00\x10\xff\xfe\x00\x01\x00\x00\x00\x00"),
    (2004, bytes(4) + b"admin.$cmd"),  # a namespace never terminated
    (2012, op_msg({"hello": 1})),  # OP_COMPRESSED: mongoeco answers it
])
def test_a_request_it_cannot_read_has_no_command(op_code: int, payload: bytes) -> None:
    assert command_name(op_code, payload) is None


def test_a_hello_is_answered_while_the_engine_is_held() -> None:
    """A request that holds the engine's thread (as a long aggregation does) does not delay a
    monitor's ``hello``: it is answered, and the held request finishes only after."""
    released = threading.Event()
    order: list[str] = []
    engine = EngineLoop()
    engine.start()

    async def held() -> str:
        assert threading.current_thread().name == "migronaut-devserver-engine"
        # holds its loop without awaiting, like a command that works for seconds
        released.wait(timeout=30)
        order.append("held")
        return "held"

    async def hello() -> str:
        assert threading.current_thread() is threading.main_thread()
        order.append("hello")
        return "hello"

    async def main() -> None:
        working = asyncio.ensure_future(engine.route(2013, op_msg({"find": "x"}), held))
        await asyncio.sleep(0.05)  # (it has started: even if not, hello need not wait for it)
        assert await engine.route(2013, op_msg({"hello": 1}), hello) == "hello"
        released.set()
        assert await working == "held"

    try:
        asyncio.run(main())
    finally:
        released.set()
        engine.stop()
    assert order == ["hello", "held"]


def test_an_exception_and_a_dropped_connection_cross_back_from_the_engine() -> None:
    from migronaut.devserver.failpoints import CloseConnection

    engine = EngineLoop()
    engine.start()

    async def refused() -> None:
        raise ValueError("refused")

    async def dropped() -> None:
        raise CloseConnection

    async def main() -> None:
        with pytest.raises(ValueError, match="refused"):
            await engine.route(2013, op_msg({"find": "x"}), refused)
        with pytest.raises(CloseConnection):  # a BaseException: mongoeco closes the socket
            await engine.route(2013, op_msg({"insert": "x"}), dropped)

    try:
        asyncio.run(main())
    finally:
        engine.stop()


def test_a_cancelled_request_is_cancelled_on_the_engine_and_stop_ends_its_thread() -> None:
    started, cancelled = threading.Event(), threading.Event()
    engine = EngineLoop()
    engine.start()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main() -> None:
        task = asyncio.ensure_future(engine.route(2013, op_msg({"getMore": 1}), forever))
        await asyncio.to_thread(started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cancelled.wait(30)
    engine.stop()
    assert not engine._thread.is_alive()


def test_monitoring_is_the_hello_family_only() -> None:
    assert frozenset({"hello", "isMaster", "ismaster"}) == MONITORING
