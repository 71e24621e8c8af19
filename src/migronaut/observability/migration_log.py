"""``ctx.logger`` and the migration log lines it produces (reference core §10.4).

Invariant: a ``ctx.logger`` call never raises into a migration, and nothing it hands out of the
process — the ``migration:log`` event, a stored line — carries a credential, an unbounded string
or a structure deeper or larger than the limits below. :func:`log_line` is the one place a call
becomes such a line, for the event and for storage alike.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from migronaut._redact import redact

__all__ = [
    "LEVELS",
    "RECORD_ATTRIBUTES",
    "USERLAND",
    "LineSink",
    "MigrationLogger",
    "level_name",
    "level_number",
    "log_line",
    "sanitize_data",
]

#: The marker that turns a ``ctx.logger`` call into a ``migration:log`` event.
USERLAND = "userland"

MAX_MSG_CHARS = 2048
MAX_STRING_CHARS = 4096
MAX_BYTES = 4096
MAX_DEPTH = 8
MAX_ENTRIES = 1000
ELLIPSIS = "…"

#: Correlation fields copied from the logger's binding into a line, in this order.
CORRELATION = ("runId", "direction", "migration", "batch", "attempt", "jobId", "groupId")

#: ``LogRecord`` attributes a field must not overwrite (``makeRecord`` raises on them).
RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__
) | {"message", "asctime"}

#: Level names as stored and as ``--level`` accepts them.
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def level_name(level: int) -> str:
    """``logging`` level number → the stored name (``info``, ``warning``…, or ``level-25``)."""
    for name, number in LEVELS.items():
        if number == level:
            return name
    return f"level-{level}"


def level_number(name: str) -> int:
    """The stored name back to its number (custom ``level-N`` names included)."""
    if name in LEVELS:
        return LEVELS[name]
    if name.startswith("level-") and name[6:].isdigit():
        return int(name[6:])
    return logging.INFO


class LineSink(Protocol):
    """Receives every ``ctx.logger`` call (before the level filter) with its correlation."""

    def __call__(
        self,
        level: int,
        msg: object,
        args: tuple[Any, ...],
        fields: dict[str, Any],
        correlation: Mapping[str, Any],
        userland: bool,
    ) -> None: ...


class MigrationLogger(logging.LoggerAdapter[logging.Logger]):
    """``ctx.logger``: the migrator's logger with the run's correlation bound into every line.

    Fields go in ``extra`` (``ctx.logger.info("copied %d", n, extra={"userland": True, ...})``);
    they are merged with the correlation (the standard adapter would replace them). Every call is
    also handed to the ``sink`` — whatever the logger's level, even with a silenced logger — so a
    run can keep its lines and emit ``migration:log`` for the ``userland`` ones.
    """

    def __init__(
        self,
        logger: logging.Logger,
        correlation: Mapping[str, Any],
        sink: LineSink | None = None,
    ) -> None:
        super().__init__(logger, {k: v for k, v in correlation.items() if v is not None})
        self.sink = sink

    def bind(self, **fields: Any) -> MigrationLogger:
        """The same logger with more correlation (``migration``, ``batch``, ``attempt``…)."""
        merged = dict(self.extra or {})
        for key, value in fields.items():
            if value is not None:
                merged[key] = value
        bound = object.__new__(type(self))  # (what __init__ sets, without filtering ours again)
        bound.__dict__.update(self.__dict__)
        bound.extra = merged
        return bound

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        try:
            given = kwargs.pop("extra", None)
            fields = dict(given) if isinstance(given, Mapping) else {}
            userland = fields.pop(USERLAND, None) is True
            correlation = self.extra or {}
            if self.sink is not None:
                try:
                    self.sink(level, msg, args, fields, correlation, userland)
                except Exception:
                    pass  # keeping a line must never break the migration that logs it
            if not self.isEnabledFor(level):
                return
            extra = {k: v for k, v in fields.items() if k not in RECORD_ATTRIBUTES}
            extra.update(correlation)
            if userland:
                extra[USERLAND] = True
            kwargs.setdefault("stacklevel", 2)
            self.logger.log(level, msg, *args, extra=extra, **kwargs)
        except Exception:
            pass  # ctx.logger never throws (reference core §10.4)


def message_text(msg: object, args: tuple[Any, ...]) -> str:
    """``msg % args`` as logging would render it, or ``str(msg)`` when that fails."""
    try:
        text = str(msg)
        return text % args if args else text
    except Exception:
        try:
            return str(msg)
        except Exception:
            return "<unprintable message>"


def clip(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters plus ``…``; ``(text, was it cut)``."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + ELLIPSIS, True


def log_line(
    *,
    kind: str,
    level: int,
    msg: object,
    args: tuple[Any, ...],
    fields: Mapping[str, Any],
    correlation: Mapping[str, Any],
    seq: int,
    at: dt.datetime | None = None,
) -> dict[str, Any]:
    """One ``ctx.logger`` call as the ``migration:log`` payload / stored line.

    ``{kind, runId, direction, migration?, batch?, attempt?, level, msg, data, at, seq,
    truncated?}``; ``msg`` and every string in ``data`` redacted (credentials and the values a
    duplicate-key error quotes) and clipped.
    """
    line: dict[str, Any] = {"kind": kind}
    for key in CORRELATION:
        value = correlation.get(key)
        if value is not None:
            line[key] = value
    line["level"] = level_name(level)
    line["msg"], clipped = clip(redact(message_text(msg, args)), MAX_MSG_CHARS)
    line["data"], cut = sanitize_data(fields)
    line["at"] = at or dt.datetime.now(dt.UTC)
    line["seq"] = seq
    if clipped or cut:
        line["truncated"] = True
    return line


def sanitize_data(value: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """A deep, storable copy of a line's fields within the limits; ``(copy, truncated)``."""
    state = _Budget()
    out = state.mapping(value, 1)
    return out, state.truncated


class _Budget:
    """Walks a value once, counting entries across the whole structure."""

    def __init__(self) -> None:
        self.entries = 0
        self.truncated = False
        self._bson: tuple[type, ...] | None = None

    def spend(self) -> bool:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            self.truncated = True
            return False
        return True

    def mapping(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not self.spend():
                break
            out[redact(str(key))[:MAX_STRING_CHARS]] = self.copy(item, depth + 1)
        return out

    def sequence(self, value: Any, depth: int) -> list[Any]:
        out: list[Any] = []
        for item in value:
            if not self.spend():
                break
            out.append(self.copy(item, depth + 1))
        return out

    def copy(self, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, (bool, float)):
            return value
        if isinstance(value, int):
            return value if -(2**63) <= value < 2**63 else str(value)
        if isinstance(value, str):
            text, cut = clip(redact(value), MAX_STRING_CHARS)
            self.truncated |= cut
            return text
        if isinstance(value, dt.datetime):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.binary(value)
        if isinstance(value, BaseException):
            return self.error(value)
        if self.is_bson(value):
            return value
        if depth > MAX_DEPTH and isinstance(value, (Mapping, list, tuple, set, frozenset)):
            self.truncated = True
            return "[depth limit]"
        if isinstance(value, Mapping):
            return self.mapping(value, depth)
        if isinstance(value, (list, tuple, set, frozenset)):
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            return self.sequence(items, depth)
        import re

        if isinstance(value, re.Pattern):
            return value
        return self.copy(_describe(value), depth)

    def binary(self, value: bytes | bytearray | memoryview) -> Any:
        from bson.binary import Binary

        data = bytes(value)
        subtype = value.subtype if isinstance(value, Binary) else 0
        if len(data) > MAX_BYTES:
            self.truncated = True
            data = data[:MAX_BYTES]
        return Binary(data, subtype)

    def error(self, error: BaseException) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": type(error).__name__,
            "message": self.copy(str(error), MAX_DEPTH),
        }
        code = getattr(error, "code", None)
        if isinstance(code, (str, int)) and not isinstance(code, bool):
            out["code"] = code
        details = getattr(error, "details", None)
        code_name = details.get("codeName") if isinstance(details, Mapping) else None
        if isinstance(code_name, str):
            out["codeName"] = code_name
        return out

    def is_bson(self, value: Any) -> bool:
        if self._bson is None:
            from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
            from bson.code import Code

            self._bson = (ObjectId, Decimal128, Int64, Timestamp, Regex, MinKey, MaxKey, Code,
                          DBRef)
        return isinstance(value, self._bson)


def _describe(value: Any) -> str:
    """Anything else (dates, UUIDs, decimals, objects) as text."""
    if isinstance(value, dt.date):
        return value.isoformat()
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"

