"""External tools a test needs (``node``, ``npm``, …): skipped where absent, unless CI says not to.

A developer without Node.js should still get a green suite, so a test whose tool is missing is
skipped with a message naming what to install. CI exports ``MIGRONAUT_TEST_REQUIRE_TOOLS=1``
(``.ci/run``): there a missing tool, or a failed install of one, is a failure, so CI can never
pass by skipping.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

#: Set to ``1`` to turn "tool missing" skips into failures (CI sets it).
REQUIRE_TOOLS_VARIABLE = "MIGRONAUT_TEST_REQUIRE_TOOLS"


def tools_required() -> bool:
    """Whether a missing tool fails the test instead of skipping it."""
    return os.environ.get(REQUIRE_TOOLS_VARIABLE, "").strip() not in ("", "0")


def tool_unavailable(reason: str) -> NoReturn:
    """Skip with ``reason`` — or fail with it when :func:`tools_required`."""
    if tools_required():
        pytest.fail(f"{reason} ({REQUIRE_TOOLS_VARIABLE} is set: this must not be skipped)",
                    pytrace=False)
    pytest.skip(reason)


def require_tool(name: str, hint: str) -> str:
    """The path of executable ``name`` on ``PATH``; skips (or fails, see above) without it.

    ``hint`` says how to get it, e.g. ``"install Node.js 20+ (node and npm)"``.
    """
    found = shutil.which(name)
    if found is None:
        tool_unavailable(f"needs {name!r} on PATH: {hint}")
    return found
