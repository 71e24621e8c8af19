"""The integer checks every stored or configured count goes through.

``True`` and ``False`` are ``int`` subclasses in Python; a value read from TOML, JSON, BSON or a
keyword argument that is a boolean is never a count, a limit or a version, so every check here
refuses them. Nothing of ours is imported: every layer may use this module.
"""

from __future__ import annotations

from typing import Any, TypeGuard

__all__ = ["int_within", "is_int"]


def is_int(value: Any) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_within(value: Any, low: int, high: int) -> TypeGuard[int]:
    """An ``int`` (not a ``bool``) with ``low <= value <= high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
