"""The options of one ``converge`` call (collections.md §2.2) and their checks.

Invariant: every option is checked here before any config is resolved or any connection made,
so a bad option is ``CONFIG_INVALID`` even when the server is unreachable. Importing this module
imports no driver (the CLI checks options with it before building a migrator).
"""

from __future__ import annotations

from dataclasses import dataclass

from migronaut.errors import ConfigInvalidError

__all__ = ["ConvergeOptions", "validate_converge_options"]


@dataclass(frozen=True)
class ConvergeOptions:
    """The call's options (§2.2); ``trigger`` is ``converge`` or ``up``."""

    dry_run: bool = False
    prune: bool = False
    no_lock: bool = False
    ordered: bool = False
    rebuild_unique: bool = False
    wait_for_search_indexes: bool | None = None
    requested_by: str | None = None
    reason: str | None = None
    trigger: str = "converge"


def validate_converge_options(options: ConvergeOptions) -> None:
    """Every check that needs no config and no connection (``CONFIG_INVALID``)."""
    for key in ("dry_run", "prune", "no_lock", "ordered", "rebuild_unique"):
        if not isinstance(getattr(options, key), bool):
            raise ConfigInvalidError(f"{key} must be a boolean", {"option": key})
    wait = options.wait_for_search_indexes
    if wait is not None and not isinstance(wait, bool):
        raise ConfigInvalidError("wait_for_search_indexes must be a boolean",
                                 {"option": "wait_for_search_indexes"})
    if options.dry_run and wait:
        raise ConfigInvalidError("wait_for_search_indexes cannot be combined with dry_run",
                                 {"option": "wait_for_search_indexes"})
    for key, limit in (("requested_by", 128), ("reason", 512)):
        value = getattr(options, key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise ConfigInvalidError(f"{key} must be a string of at most {limit} characters",
                                     {"option": key})
