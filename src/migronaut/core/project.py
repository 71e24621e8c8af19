"""The project a migrator works on, before any database: its configuration and its files.

Owns the configuration as resolved once (flags > ``MIGRONAUT_*`` environment > config file >
defaults, see :mod:`migronaut.core.config`), the logger, hooks and telemetry it names, the
migrations directory (files in run order, checksums cached by file stamp), run ids and who runs.

Invariant: the configuration is resolved at most once per project and every command sees the same
one; its "not supported yet" warning is logged once, whichever command reads it first. ``create``
alone may work from a lenient resolution (a config file that fails to load is skipped with a
warning), which is never kept.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from migronaut.core.config import DEFAULT_LOGGER, Config, load_config
from migronaut.core.files import ChecksumCache, discover, load_migrations
from migronaut.core.hooks import Hooks, normalise_hooks
from migronaut.errors import ConfigInvalidError, describe_exception
from migronaut.observability.telemetry import Telemetry, resolve_telemetry

if TYPE_CHECKING:
    from collections.abc import Sequence

    from migronaut.core.files import MigrationModule

__all__ = ["Project", "executed_by", "logger_of"]


def executed_by() -> str:
    """``MIGRONAUT_USER``, else the OS user, else ``unknown`` (distroless containers)."""
    override = os.environ.get("MIGRONAUT_USER")
    if override:
        return override
    try:
        return getpass.getuser()
    except Exception:
        return os.environ.get("USER") or os.environ.get("USERNAME") or "unknown"


def _null_logger() -> logging.Logger:
    logger = logging.getLogger("migronaut.null")
    logger.propagate = False
    logger.disabled = True
    return logger


def logger_of(config: Config) -> logging.Logger:
    """The configured logger: ``migronaut``'s by default, a silenced one for ``None``."""
    configured = config.logger
    if configured is DEFAULT_LOGGER:
        return logging.getLogger("migronaut")
    if configured is None:
        return _null_logger()
    return configured  # type: ignore[no-any-return]


class Project:
    """The configuration of one migrator (resolved on first use) and its migrations directory.

    ``config`` is a resolved :class:`Config` or a mapping of config keys (the flags tier);
    ``overrides`` are config keys too and win over the mapping.
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None,
        overrides: Mapping[str, Any],
        *,
        config_path: str | os.PathLike[str] | None,
        cwd: str | os.PathLike[str] | None,
        flags_origin: Literal["flag", "argument"],
    ) -> None:
        self._flags: dict[str, Any] = {}
        self._flags_origin = flags_origin
        self._config: Config | None = None
        if isinstance(config, Config):
            self._config = config
        elif config is not None:
            self._flags.update(config)
        self._flags.update(overrides)
        self._config_path = config_path
        self._cwd = cwd
        self._logger: logging.Logger | None = None
        self._directory: Path | None = None
        self._checksums = ChecksumCache()
        #: Problems that did not stop a command (e.g. a config file skipped by ``create``).
        self.warnings: list[str] = []
        #: A short read-only command (the CLI's ``status``, ``audit`` …): unless configured,
        #: server selection gives up after 3 s instead of 10 s.
        self.quick_connect = False

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self._flags, config_path=self._config_path, cwd=self._cwd,
                                       flags_origin=self._flags_origin)
        return self._config

    def lenient_config(self) -> Config:
        """The configuration for a command that needs no database (``create``): the resolved
        one if there is one, else a lenient resolution (not kept) that skips a config file which
        fails to load, with a warning in :attr:`warnings`."""
        config = self._config or load_config(
            self._flags, config_path=self._config_path, cwd=self._cwd, require_db=False,
            lenient=True, warnings=self.warnings, flags_origin=self._flags_origin,
        )
        return config

    @property
    def logger(self) -> logging.Logger:
        if self._logger is None:
            self._logger = logger_of(self.config)
        return self._logger

    @property
    def hooks(self) -> Hooks:
        return normalise_hooks(self.config.hooks)

    @functools.cached_property
    def telemetry(self) -> Telemetry:
        """The ``telemetry`` config resolved (OpenTelemetry spans and metrics; no-op unset)."""
        return resolve_telemetry(self.config.telemetry, namespace=self.config.db_name)

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = self.config.migrations_path  # resolved once: hot in status/up
        return self._directory

    def files(self) -> list[str]:
        """The migration files on disk, in run order (a missing directory is CONFIG_INVALID)."""
        return discover(self.directory, self.config.file_extensions,
                        origin=self.config.origin("migrations_dir"))

    def checksum(self, name: str) -> str | None:
        return self._checksums.checksum(os.path.join(self.directory, name))

    def load(self, names: Sequence[str]) -> list[MigrationModule]:
        """Load and validate the named files before a run; each read also fills the checksum
        cache, so recording a file's checksum costs a ``stat``, not a second read."""
        return load_migrations(self.directory, names, reload=self.config.reload_migrations,
                               checksums=self._checksums)

    def generate_id(self) -> str:
        """A run id: the ``generate_id`` config's (checked), else a UUID4."""
        generator = self.config.generate_id
        if generator is None:
            return str(uuid.uuid4())
        try:
            value = generator()
        except Exception as error:
            raise ConfigInvalidError(
                f"generate_id failed: {describe_exception(error)}", {"option": "generate_id"},
                cause=error,
            ) from error
        if not isinstance(value, str) or not value or len(value) > 128:
            raise ConfigInvalidError(
                "generate_id must return a non-empty string of at most 128 characters",
                {"option": "generate_id"},
            )
        return value

    def warn_out_of_order(self, late: Sequence[str], newest: str | None) -> None:
        """Pending migrations that sort before the newest applied one (``up`` and its preview)."""
        if late:
            self.logger.warning(
                "⚠ Out-of-order: %d pending migration(s) sort before the newest applied one "
                "(%s): %s", len(late), newest, ", ".join(late)
            )
