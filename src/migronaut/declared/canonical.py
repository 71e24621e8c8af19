"""The canonical form two declared or live values are compared by (reference collections §1.4).

Invariant: ``canonical(a) == canonical(b)`` exactly when the server treats ``a`` and ``b`` as the
same stored value for a validator, partial filter, wildcard projection, text weights or search
definition — whatever Python or BSON type each side was decoded as. Mapping keys are sorted,
lists keep their order, ``int``/``Int64``/integral ``float`` are one number (``-0.0`` is ``0``),
integers beyond 2^53 are tagged strings, NaN/±inf, dates, regular expressions, ``ObjectId`` and
``Decimal128`` are tagged, and other BSON values compare by their extended-JSON form.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bson import Decimal128, ObjectId, Regex, json_util

__all__ = ["canonical", "fill_collation_defaults", "regex_flags", "same"]

#: Integers a double holds exactly; beyond this a number is compared as its decimal digits.
_SAFE_INTEGER = 2**53 - 1
#: Collation fields the server fills in identically for every locale (reference §2.4.4).
UNIVERSAL_COLLATION_DEFAULTS: Mapping[str, Any] = {
    "strength": 3, "caseLevel": False, "numericOrdering": False,
}
#: Python ``re`` flag bits as the BSON regex option letters the driver writes.
_FLAG_LETTERS = ((re.IGNORECASE, "i"), (re.LOCALE, "l"), (re.MULTILINE, "m"),
                 (re.DOTALL, "s"), (re.VERBOSE, "x"))


def canonical(value: Any) -> str:
    """The canonical JSON text of ``value``; equal texts mean equal values."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def same(left: Any, right: Any) -> bool:
    """Whether two values are equal under :func:`canonical`."""
    return canonical(left) == canonical(right)


def regex_flags(value: re.Pattern[Any] | Regex[Any]) -> str:
    """The option letters of a regular expression, sorted; ``u`` is left out on both sides
    because the server always matches UTF-8 (the driver adds it to every ``str`` pattern)."""
    return "".join(sorted(letter for bit, letter in _FLAG_LETTERS if value.flags & bit))


def fill_collation_defaults(collation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A declared collation with the universal defaults filled in (``{locale: 'en'}`` is
    ``{locale: 'en', strength: 3, …}``); ``{locale: 'simple'}`` and ``None`` stay as they are,
    because the server stores no collation for either."""
    if collation is None or collation.get("locale") == "simple":
        return None if collation is None else dict(collation)
    return {**UNIVERSAL_COLLATION_DEFAULTS, **collation}


def _number(value: int | float) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return {"$number": "NaN"}
        if math.isinf(value):
            return {"$number": "Infinity" if value > 0 else "-Infinity"}
        if not value.is_integer():
            return value
        value = int(value)
    if abs(value) > _SAFE_INTEGER:
        return {"$long": str(value)}
    return value


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):  # Int64 is an int
        return _number(value)
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, datetime):
        moment = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        text = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
        return {"$date": text}
    if isinstance(value, (re.Pattern, Regex)):
        return {"$regex": {"pattern": value.pattern if isinstance(value.pattern, str)
                           else value.pattern.decode("utf-8", "replace"),
                           "flags": regex_flags(value)}}
    if isinstance(value, ObjectId):
        return {"$oid": str(value)}
    if isinstance(value, Decimal128):
        return {"$numberDecimal": str(value)}
    return json.loads(json_util.dumps(value, json_options=json_util.CANONICAL_JSON_OPTIONS))

