"""mongod's ``failCommand`` failpoint, set for the length of a ``with`` block.

The same call works on the dev server started with ``--enable-test-commands`` and on a real
``mongod`` started with ``--setParameter enableTestCommands=1``; a server that refuses the
command (a production mongod, Atlas) skips the test instead of failing it — except in CI
(``MIGRONAUT_TEST_REQUIRE_TOOLS``), whose servers are started with test commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pymongo.errors import OperationFailure

from helpers.tools import tool_unavailable

#: Codes of a server that does not let us set failpoints (unknown command, not authorized).
REFUSED = frozenset({59, 13, 8000})


def configure(client: Any, mode: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send ``configureFailPoint`` for ``failCommand`` to ``admin``; its reply."""
    command: dict[str, Any] = {"configureFailPoint": "failCommand", "mode": mode}
    if data is not None:
        command["data"] = data
    reply: dict[str, Any] = client.admin.command(command)
    return reply


@contextmanager
def fail_command(client: Any, commands: list[str], *, times: int, error_code: int | None = None,
                 close_connection: bool = False) -> Iterator[None]:
    """The next ``times`` of ``commands`` fail (with ``error_code``, or their connection is
    closed); the failpoint is off again after the block whatever happened."""
    data: dict[str, Any] = {"failCommands": commands}
    if error_code is not None:
        data["errorCode"] = error_code
    if close_connection:
        data["closeConnection"] = True
    try:
        configure(client, {"times": times}, data)
    except OperationFailure as error:
        if error.code in REFUSED:
            tool_unavailable(f"this server does not serve configureFailPoint (start mongod "
                             f"with --setParameter enableTestCommands=1): {error}")
        raise
    try:
        yield
    finally:
        configure(client, "off")
