"""MongoDB's rules for database and collection names, shared by the configuration and the dev
server (which stands on nothing of ours but the error tree, redaction and this module).

Each rule returns the problem as text to follow the name of what is checked, or ``None``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DB_NAME_FORBIDDEN", "OWN_PREFIX", "validate_collection_name", "validate_db_name"]

#: Every collection migronaut keeps its own state in starts with this under its default name.
OWN_PREFIX = "_migronaut_"

#: What MongoDB refuses in a database name (pymongo raises ``InvalidName`` on these).
DB_NAME_FORBIDDEN = (" ", ".", "$", "/", "\\", "\x00", '"')


def validate_collection_name(value: Any) -> str | None:
    """The collection-name rule of reference §3.6; returns a problem or ``None``."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if "$" in value or "\x00" in value or value.startswith("system."):
        return "must be a valid collection name (no '$'/NUL, not system.*)"
    if value.startswith(".") or value.endswith(".") or ".." in value:
        return "must be a valid collection name (no empty '.' segment: not 'a.', '.a' or 'a..b')"
    return None


def validate_db_name(value: Any) -> str | None:
    """MongoDB's database-name rule; returns a problem or ``None``."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    bad = [ch for ch in DB_NAME_FORBIDDEN if ch in value]
    if bad:
        return f"must be a valid database name (no {bad[0]!r})"
    if len(value.encode("utf-8")) > 63:
        return "must be a valid database name (at most 63 bytes)"
    return None
