"""Errors as they may leave a worker: to the broker, the result backend, a task's state.

Outbound redaction (reference core §2.x "outbound"): credentials are masked as everywhere, and
the values a duplicate-key error quotes are masked too, because a queue's result backend is read
by people and tools that never see the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migronaut._redact import redact
from migronaut.errors import MigronautError, describe_exception

__all__ = ["outbound_error", "outbound_value"]


def outbound_value(value: Any) -> Any:
    """Deep-copy of a JSON-like value with every string redacted outbound."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {str(k): outbound_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [outbound_value(v) for v in value]
    return value


def outbound_error(error: BaseException) -> MigronautError:
    """``error`` as a :class:`MigronautError` of the same class (a foreign error becomes the
    base class with a one-line description), message and context redacted outbound, with no
    ``__cause__``/``__context__`` chain left to serialise."""
    if isinstance(error, MigronautError):
        message, context = error.message, error.context
        cls: type[MigronautError] = type(error)
    else:
        message, context, cls = describe_exception(error), {}, MigronautError
    clean = cls.__new__(cls)
    MigronautError.__init__(clean, redact(message), outbound_value(context))
    clean.__cause__ = clean.__context__ = None
    clean.__suppress_context__ = True
    return clean
