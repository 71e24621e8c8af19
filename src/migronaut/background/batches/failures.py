"""How a batch's failures are told: document errors by reason, slice failures as typed errors.

Invariant: **document data never leaves the batch.** Error texts stored on partitions or emitted
in events never carry ids or values: a write error is described by its code
(:func:`write_error_message`), a server error by class and code (:func:`describe_server`), and a
user exception's text is masked for the document's ``_id`` and redacted of credentials and
duplicate-key values (:func:`user_message`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from migronaut._redact import redact
from migronaut.errors import (
    BackgroundFailedError,
    ConnectionFailedError,
    MigrationExecutionFailedError,
    MigronautError,
    describe_exception,
)

__all__ = [
    "DOCUMENT_WRITE_CODES",
    "OVERLOAD_CODES",
    "DocError",
    "SliceFailure",
    "clip",
    "describe_server",
    "over_budget_error",
    "overloaded",
    "user_message",
    "wrap",
    "write_error_message",
]

#: Write errors that fail only their document (reference Appendix A).
DOCUMENT_WRITE_CODES = frozenset({11000, 121, 72, 66, 17280})
#: Server answers that mean "too much load" to the adaptive controller.
OVERLOAD_CODES = frozenset({50, 262})
_MESSAGE_MAX = 500

_WRITE_ERROR_TEXT = {
    11000: "duplicate key (E11000)",
    121: "document failed validation (121)",
    72: "invalid options (72) — a shard-key change through mongos?",
    66: "an immutable field was changed (66)",
    17280: "an index key is too large (17280)",
}
_INDEX_NAME = re.compile(r"index: (\S+)")


class SliceFailure(Exception):
    """User code or a server answer that fails the slice (not a single document)."""


@dataclass
class DocError:
    """One document that could not be migrated: its ``_id`` (stored in ``badIds`` only), why
    (``transform``, ``write``, ``shape``, …) and a message free of document data."""

    id: Any
    reason: str
    message: str


def wrap(name: str, error: BaseException, partition: str | None = None) -> MigronautError:
    """A slice's foreign error as the typed error drivers handle (no document data in it)."""
    from pymongo.errors import ConnectionFailure, PyMongoError

    if isinstance(error, MigronautError):
        return error
    context: dict[str, Any] = {"migration": name}
    if partition is not None:
        context["partition"] = partition
    if isinstance(error, SliceFailure):
        return MigrationExecutionFailedError(f"Background migration {name}: {error}", context)
    if isinstance(error, ConnectionFailure):
        return ConnectionFailedError(
            f"Background migration {name}: lost the connection ({type(error).__name__})",
            context, cause=error)
    if isinstance(error, PyMongoError):
        return MigrationExecutionFailedError(
            f"Background migration {name}: a slice failed: {describe_server(error)}", context)
    return MigrationExecutionFailedError(
        f"Background migration {name}: a slice failed: {clip(describe_exception(error))}",
        context)


def over_budget_error(name: str, total: int, max_errors: int, last: str) -> MigronautError:
    """The migration's failure when ``total`` distinct documents failed, over the budget."""
    return BackgroundFailedError(
        f"Background migration {name} failed: {total} document(s) could "
        f"not be migrated, more than maxDocumentErrors ({max_errors}) — last: {last}",
        {"migration": name, "documentErrors": total},
    )


def overloaded(error: BaseException) -> bool:
    """Whether a failed batch tells the adaptive controller the server is overloaded."""
    from pymongo.errors import BulkWriteError, PyMongoError, WriteConcernError

    if isinstance(error, WriteConcernError):
        return True
    if isinstance(error, BulkWriteError) and error.details.get("writeConcernErrors"):
        return True
    if isinstance(error, PyMongoError):
        if error.has_error_label("TransientTransactionError") or error.has_error_label(
            "RetryableWriteError"
        ):
            return True
        return getattr(error, "code", None) in OVERLOAD_CODES
    return False


def clip(text: str) -> str:
    return text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 1] + "…"


def user_message(error: BaseException, doc_id: Any) -> str:
    """A transform error's text without the document's ``_id``, credentials or duplicate-key
    values in it: it is stored on the partition and the state for good."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = text.splitlines()[0] if text.strip() else type(error).__name__
    for shown in {repr(doc_id), str(doc_id)}:
        if len(shown) >= 4:
            text = text.replace(shown, "‹_id›")
    return clip(redact(text))


def write_error_message(item: Mapping[str, Any]) -> str:
    """A per-document write error by its code (server texts quote values: never used)."""
    code = item.get("code")
    text = _WRITE_ERROR_TEXT.get(code, f"write error {code}") if isinstance(code, int) else (
        "write error")
    if code == 11000:
        found = _INDEX_NAME.search(str(item.get("errmsg", "")))
        if found:
            text += f" on index {found.group(1)}"
    return text


def describe_server(error: BaseException) -> str:
    """A server error by class, code and code name — never its text (it may quote values)."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    name = details.get("codeName") if isinstance(details, Mapping) else None
    parts = [type(error).__name__]
    if code is not None:
        parts.append(f"code {code}" + (f" {name}" if name else ""))
    elif str(error):
        parts.append(clip(redact(str(error).splitlines()[0])))
    return " ".join(parts)
