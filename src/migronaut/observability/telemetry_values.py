"""The checks of a ``telemetry`` value, without importing OpenTelemetry.

The configuration checks the value when it loads (every command) and :mod:`.telemetry` again
when it resolves it; both go through :func:`telemetry_issue`, which answers a problem as
``(path, message)``, the shape of a configuration issue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_TELEMETRY_ATTRIBUTES", "RESERVED_TELEMETRY_ATTRIBUTES", "telemetry_issue",
           "telemetry_parts"]

#: At most this many user attributes on every span and metric point (reference core §10.5).
MAX_TELEMETRY_ATTRIBUTES = 20
#: Attribute names migronaut sets itself (besides every ``migronaut.*`` name).
RESERVED_TELEMETRY_ATTRIBUTES = ("db.namespace", "error.type")
_TELEMETRY_KEYS = ("tracer", "meter", "attributes")
_PROVIDER_METHODS = {"tracer": ("start_span",), "meter": ("create_histogram", "create_counter")}


def telemetry_parts(value: Any) -> dict[str, Any]:
    """The ``tracer``, ``meter`` and ``attributes`` of a ``telemetry`` value that
    :func:`telemetry_issue` accepted (``True``: the global tracer and meter)."""
    if value is None or value is False:
        return {}
    if value is True:
        return {"tracer": True, "meter": True}
    if isinstance(value, Mapping):
        return dict(value)
    return {key: getattr(value, key, None) for key in _TELEMETRY_KEYS}


def telemetry_issue(value: Any) -> tuple[str, str] | None:
    """What is wrong with a ``telemetry`` value, checked when the config loads (every command),
    without importing OpenTelemetry: ``None``/``False`` (off), ``True``, or a mapping or object
    with ``tracer`` / ``meter`` (an OpenTelemetry tracer or meter, or ``True``) and
    ``attributes`` (at most 20 names → string, number or boolean)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, Mapping):
        unknown = [key for key in value if key not in _TELEMETRY_KEYS]
        if unknown:
            return (f"telemetry.{unknown[0]}",
                    "unknown key (telemetry takes tracer, meter and attributes)")
    elif not any(hasattr(value, key) for key in _TELEMETRY_KEYS):
        return ("telemetry", "must be True, or a mapping or object with tracer, meter "
                f"and/or attributes (got {type(value).__name__})")
    parts = telemetry_parts(value)
    issue = _attributes_issue(parts.get("attributes"))
    if issue is not None:
        return issue
    for kind, methods in _PROVIDER_METHODS.items():
        provider = parts.get(kind)
        if provider is None or isinstance(provider, bool):
            continue
        missing = [m for m in methods if not callable(getattr(provider, m, None))]
        if missing:
            return (f"telemetry.{kind}", f"must be an OpenTelemetry {kind} (no "
                    f"{missing[0]}() on {type(provider).__name__})")
    return None


def _attributes_issue(value: Any) -> tuple[str, str] | None:
    if value is None:
        return None
    path = "telemetry.attributes"
    if not isinstance(value, Mapping):
        return (path, "must be a mapping of names to scalars")
    if len(value) > MAX_TELEMETRY_ATTRIBUTES:
        return (path, f"at most {MAX_TELEMETRY_ATTRIBUTES} attributes (got {len(value)})")
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            return (path, f"names must be non-empty strings (got {key!r})")
        if key.startswith("migronaut.") or key in RESERVED_TELEMETRY_ATTRIBUTES:
            return (f"{path}.{key}", "is migronaut's own attribute and cannot be overridden")
        if not isinstance(item, (str, bool, int, float)):
            return (f"{path}.{key}",
                    f"must be a string, number or boolean (got {type(item).__name__})")
    return None
