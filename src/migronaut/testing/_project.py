"""The user's project configuration, aimed at the test server.

Invariant: a test never reaches the project's real database. The project's own ``uri``,
``db_name`` and injected ``client`` (from ``migronaut.toml``, ``pyproject.toml``,
``migronaut_config.py``, ``MIGRONAUT_*`` or ``.env``) are always replaced by the test server's;
everything else — migrations directory, collection names, hooks, transactions, timeouts — is the
project's, so tests run the migrations the way production does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.core.config import Config

__all__ = ["load_project_config"]

#: Satisfies the "db_name is required" check while loading; every test sets its own.
_PLACEHOLDER_DB: Final = "migronaut_test"


def load_project_config(
    root: Path,
    *,
    uri: str,
    client: Any,
    config_file: str | None = None,
    migrations_dir: str | None = None,
    migrations_dir_option: str = "migrations_dir",
) -> Config:
    """Resolve the project's config in ``root`` with the test server's ``uri`` and ``client``.

    ``config_file`` and ``migrations_dir`` are the plugin's overrides (relative to ``root``, as
    the CLI's are relative to its working directory); ``migrations_dir_option`` names where the
    override can be set, for the error message. The result has ``db_name=None``: each test
    database gets its own name. A migrations directory that does not exist is
    ``CONFIG_INVALID`` (the engine alone would see "no migrations" and every test would pass on
    an empty database).
    """
    from migronaut.core.config import load_config

    flags: dict[str, Any] = {"uri": uri, "client": client, "db_name": _PLACEHOLDER_DB}
    if migrations_dir:
        flags["migrations_dir"] = migrations_dir
    config = load_config(flags, config_path=config_file, cwd=root)
    path = config.migrations_path
    if not path.is_dir():
        if migrations_dir:
            origin = f"set by {migrations_dir_option}"
        elif config.source:
            origin = f"migrations_dir from {Path(config.source).name} or MIGRONAUT_MIGRATIONS_DIR"
        else:
            origin = f"the default: no migronaut config file in {root}"
        raise ConfigInvalidError(
            f"migrations directory not found: {path} ({origin}) — point {migrations_dir_option} "
            "or migrations_dir in the migronaut config at your migrations",
            {"path": str(path), "option": migrations_dir_option},
        )
    return dataclasses.replace(config, db_name=None)
