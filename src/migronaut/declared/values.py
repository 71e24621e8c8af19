"""Whether a declared value can be sent to the server and stored exactly as written.

A validator, partial filter, wildcard projection, weights or search definition is compared with
what the server later lists (:mod:`.canonical`); a value the driver would change on the way (a
function, a ``uuid.UUID`` without a representation, a regular expression with a flag BSON cannot
hold as written) would never compare equal, so converge would rebuild forever. Such values are
refused when the definition is checked.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from bson import (
    Binary,
    Code,
    DBRef,
    Decimal128,
    Int64,
    MaxKey,
    MinKey,
    ObjectId,
    Regex,
    Timestamp,
)

from migronaut.declared.issues import Issues

__all__ = ["check_sendable", "regex_problem"]

#: Flags a declared regular expression may carry: BSON stores ``i`` and ``m`` as written;
#: ``re.UNICODE`` is implied for every ``str`` pattern and means nothing to the server.
_ALLOWED_RE_FLAGS = re.IGNORECASE | re.MULTILINE | re.UNICODE
_RE_FLAG_NAMES = ((re.DOTALL, "s (DOTALL)"), (re.VERBOSE, "x (VERBOSE)"),
                  (re.ASCII, "a (ASCII)"), (re.LOCALE, "l (LOCALE)"))
_SCALARS = (str, bool, float, datetime.datetime, ObjectId, Decimal128, Int64, Binary, bytes,
            Timestamp, MinKey, MaxKey, Code, DBRef)
_INT64 = (-(2**63), 2**63 - 1)


def regex_problem(value: re.Pattern[Any] | Regex[Any]) -> str | None:
    """Why a regular expression cannot be stored as written (only ``i`` and ``m``), or ``None``."""
    extra = value.flags & ~_ALLOWED_RE_FLAGS  # bson.Regex keeps its letters as re bits
    if not extra:
        return None
    names = [name for bit, name in _RE_FLAG_NAMES if extra & bit] or [hex(extra)]
    return (f"uses regex flag(s) {', '.join(names)} that cannot be stored as written "
            "(only i and m)")


def check_sendable(value: Any, path: str, issues: Issues) -> None:
    """Add an issue for each part of ``value`` that cannot be sent faithfully (first per path)."""
    _walk(value, path, issues, set())


def _walk(value: Any, path: str, issues: Issues, active: set[int]) -> None:
    if value is None or isinstance(value, _SCALARS):
        return
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            issues.add(path, "is an integer out of the 64-bit range BSON can store")
        return
    if isinstance(value, (re.Pattern, Regex)):
        problem = regex_problem(value)
        if problem:
            issues.add(path, problem)
        return
    if callable(value):
        issues.add(path, f"is a {'class' if isinstance(value, type) else 'function'} — "
                   "a definition holds data only (a function cannot be sent as written)")
        return
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in active:
            issues.add(path, "is a circular structure")
            return
        active.add(id(value))
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    issues.add(path, f"has a key that is not a string: {key!r}")
                    continue
                _walk(item, f"{path}.{key}", issues, active)
        else:
            for position, item in enumerate(value):
                _walk(item, f"{path}[{position}]", issues, active)
        active.discard(id(value))
        return
    issues.add(path, f"is a {type(value).__name__}, which cannot be stored as written"
               + (" (use bson.Binary.from_uuid)" if type(value).__name__ == "UUID" else ""))
