"""Markers shared by the test modules that need something only some interpreters have."""

from __future__ import annotations

import importlib.util
import sys

import pytest

HAS_EMBEDDED = sys.version_info >= (3, 13) and importlib.util.find_spec("mongoeco") is not None

# The dev server's engine (mongoeco) needs Python 3.13+; the suite's 3.11 pass runs without it.
needs_embedded = pytest.mark.skipif(
    not HAS_EMBEDDED, reason="needs the dev server's engine: Python 3.13+ with migronaut[embedded]"
)
