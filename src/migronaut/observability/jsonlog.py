"""Machine logs: one JSON object per line (``--log-format json``, ``log_format = "json"``).

Invariant: every line is one complete JSON object on one line —
``{"timestamp", "level", "logger", "msg", ...the record's structured fields}`` — and no string in
it carries a credential. The CLI writes these to stderr; applications can use
:class:`JsonFormatter` on their own handlers for the same shape.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

from migronaut._redact import redact, redact_value
from migronaut.observability.migration_log import RECORD_ATTRIBUTES, level_name

__all__ = ["BASE_KEYS", "JsonFormatter", "json_log_line", "record_fields"]

#: The keys every line has; a structured field never replaces one of them.
BASE_KEYS = ("timestamp", "level", "logger", "msg")


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        from migronaut._json import iso

        return iso(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return redact(str(value))


def json_log_line(
    *,
    level: int,
    logger: str,
    msg: str,
    fields: Mapping[str, Any] | None = None,
    at: dt.datetime | None = None,
    traceback: str | None = None,
) -> str:
    """One line of machine log (no trailing newline)."""
    from migronaut._json import iso

    line: dict[str, Any] = {
        "timestamp": iso(at or dt.datetime.now(dt.UTC)),
        "level": level_name(level),
        "logger": logger,
        "msg": redact(msg),
    }
    for key, value in (fields or {}).items():
        if key not in line:
            line[key] = redact_value(value)
    if traceback:
        line["traceback"] = redact(traceback)
    return json.dumps(line, default=_default, ensure_ascii=False)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a call passed in ``extra`` (``runId``, ``migration``, ``event``…)."""
    return {k: v for k, v in record.__dict__.items() if k not in RECORD_ATTRIBUTES}


class JsonFormatter(logging.Formatter):
    """A :class:`logging.Formatter` writing :func:`json_log_line` lines (with the traceback of
    ``exc_info`` unless ``tracebacks=False``)."""

    def __init__(self, *, tracebacks: bool = True) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        trace = None
        if record.exc_info and self.tracebacks:
            trace = self.formatException(record.exc_info)
        return json_log_line(
            level=record.levelno, logger=record.name, msg=record.getMessage(),
            fields=record_fields(record),
            at=dt.datetime.fromtimestamp(record.created, dt.UTC), traceback=trace,
        )
