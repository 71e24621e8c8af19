"""The JSON values every result, record and log line is shaped into.

Datetimes render as ISO-8601 UTC text with milliseconds and a ``Z`` (pymongo's naive datetimes
are UTC); results render through their ``to_dict()``; a result dataclass's fields render as
camelCase keys. The CLI's ``--json``, the dashboard, the run history and the machine log all go
through this module, which imports nothing of ours but redaction: every layer may use it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import fields
from typing import Any

__all__ = ["iso", "json_default", "json_document", "naive_utc", "render_fields", "to_json_value"]


def naive_utc(value: dt.datetime) -> dt.datetime:
    """``value`` as pymongo returns dates by default: naive, in UTC."""
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value


def iso(value: dt.datetime | None) -> str | None:
    """ISO-8601 with milliseconds and ``Z`` (naive datetimes from pymongo are UTC)."""
    if value is None:
        return None
    return naive_utc(value).isoformat(timespec="milliseconds") + "Z"


def to_json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    return value


def json_default(value: Any) -> Any:
    """``json.dumps``' ``default`` for ``--json`` documents: dates as :func:`iso`, results by
    their ``to_dict()``, sets and tuples as lists, anything else (``ObjectId``…) as text."""
    if isinstance(value, dt.datetime):
        return iso(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def json_document(document: Any) -> Any:
    """``document`` as ``--json`` prints it, as plain JSON values: results by their
    ``to_dict()``, dates as ISO text, every string redacted (the CLI and the dashboard)."""
    import json

    from migronaut._redact import redact_value

    return redact_value(json.loads(json.dumps(to_json_value(document), default=json_default)))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


_LAYOUTS: dict[type, tuple[tuple[str, str, bool], ...]] = {}


def _layout(cls: type) -> tuple[tuple[str, str, bool], ...]:
    """(attribute, JSON key, only-when-true) per field, computed once per class."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        layout = _LAYOUTS[cls] = tuple(
            (f.name, f.metadata.get("json", _camel(f.name)), bool(f.metadata.get("only_true")))
            for f in fields(cls)
        )
    return layout


def render_fields(obj: Any, always: tuple[str, ...]) -> dict[str, Any]:
    """A result dataclass as its JSON object: camelCase keys (or a field's ``json`` metadata),
    ``None`` fields left out unless named in ``always``, ``only_true`` fields left out when
    false, values through :func:`to_json_value`."""
    out: dict[str, Any] = {}
    for name, key, only_true in _layout(type(obj)):
        value = getattr(obj, name)
        if value is None and name not in always:
            continue
        if value is False and only_true:
            continue
        out[key] = to_json_value(value)
    return out
