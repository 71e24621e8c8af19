"""One CLI invocation: the merged global options and the one wrapper every command runs through.

:meth:`Session.run` is the shared envelope of all data commands (reference core §2.5): build a
:class:`~migronaut.api.Migrator` from the global flags → run the command's API call (with the
spinner, and graceful signals for mutating commands) → close the migrator → render the result
(human) or print it (``--json``) → pick the exit code. Commands themselves only parse their
flags, run preflight checks and prompts, and choose what to call and how to render it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from migronaut.cli.output import DEBUG, ERROR, INFO, Output, SpinnerProgress
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.cli.signals import GracefulStop

__all__ = ["GLOBAL_KEYS", "GlobalOptions", "Session", "parse_int"]

T = TypeVar("T")


@dataclass(frozen=True)
class GlobalOptions:
    """The global flags, accepted before and after the command name."""

    uri: str | None = None
    db: str | None = None
    dir: str | None = None
    config: str | None = None
    env_file: str | None = None
    no_env: bool = False
    verbose: bool = False
    quiet: bool = False
    no_color: bool = False
    json: bool = False
    log_format: str | None = None

    def merge(self, later: GlobalOptions) -> GlobalOptions:
        """These options overridden by ``later`` (given after the command name)."""
        values: dict[str, Any] = {}
        for f in fields(self):
            before, after = getattr(self, f.name), getattr(later, f.name)
            if isinstance(before, bool):
                values[f.name] = before or after
            else:
                values[f.name] = after if after is not None else before
        return GlobalOptions(**values)

    def validate(self) -> None:
        for first, second in (("verbose", "quiet"), ("env_file", "no_env")):
            if getattr(self, first) and getattr(self, second):
                flags = [f"--{name.replace('_', '-')}" for name in (first, second)]
                raise ConfigInvalidError(
                    f"{flags[0]} and {flags[1]} cannot be combined", {"options": flags}
                )
        if self.log_format is not None and self.log_format not in LOG_FORMATS:
            raise ConfigInvalidError(
                f"--log-format must be 'text' or 'json' (got {self.log_format!r})",
                {"option": "--log-format"},
            )

    @property
    def level(self) -> int:
        if self.verbose:
            return DEBUG
        return ERROR if self.quiet else INFO

    def config_flags(self) -> dict[str, Any]:
        """The flags tier of the configuration (config keys)."""
        flags: dict[str, Any] = {"uri": self.uri, "db_name": self.db, "migrations_dir": self.dir,
                                 "log_format": self.log_format}
        if self.no_env:
            flags["env_file"] = False
        elif self.env_file is not None:
            flags["env_file"] = self.env_file
        return {key: value for key, value in flags.items() if value is not None}


GLOBAL_KEYS = tuple(f.name for f in fields(GlobalOptions))
LOG_FORMATS = ("text", "json")


def early_log_format(options: GlobalOptions) -> str:
    """The log format before the config is read: ``--log-format``, else a valid
    ``MIGRONAUT_LOG_FORMAT``, else text (the resolved config decides once it is loaded)."""
    import os

    for value in (options.log_format, os.environ.get("MIGRONAUT_LOG_FORMAT", "").strip()):
        if value in LOG_FORMATS:
            return value
    return "text"


def parse_int(value: str | None, flag: str) -> int | None:
    """A numeric flag as an ``int`` (range checks are the engine's); not a number → exit 6."""
    if value is None:
        return None
    text = value.strip()
    try:
        return int(text, 10)
    except ValueError:
        raise ConfigInvalidError(
            f"{flag} must be a positive integer (got {value!r})", {"option": flag}
        ) from None


class Session:
    """The state of one command: options, output, and (during :meth:`run`) the signal guard."""

    def __init__(self, options: GlobalOptions) -> None:
        self.options = options
        self.out = Output(
            json_mode=options.json, level=options.level, no_color_flag=options.no_color,
            log_format=early_log_format(options),
        )
        if not options.json and options.level == INFO and self.out.log_format == "text":
            try:
                if self.out.stderr.isatty():
                    self.out.spinner.enable()
            except (AttributeError, ValueError, OSError):
                pass
        self.guard: GracefulStop | None = None

    # -- preflight helpers --------------------------------------------------------------------
    def confirm(self, question: str, *, action: str) -> bool:
        """Ask ``question``; in ``--json`` mode refuse instead (``CONFIG_INVALID``, exit 6)."""
        if self.options.json:
            raise ConfigInvalidError(
                f"{action} needs a confirmation and --json is non-interactive: pass --yes",
                {"option": "yes"},
            )
        from migronaut.cli.prompts import confirm

        with self.guard.paused() if self.guard is not None else nullcontext():
            return confirm(self.out, question)

    def aborted(self) -> int:
        """A declined prompt: ``Aborted``, exit 0, nothing changed."""
        self.out.info("Aborted")
        return 0

    def check_stop(self) -> None:
        """Refuse to start work outside a run (``unlock``) once a signal asked to stop."""
        if self.guard is not None:
            self.guard.raise_if_requested()

    # -- the shared envelope ------------------------------------------------------------------
    def run(
        self,
        action: Callable[[Migrator], T],
        *,
        render: Callable[[T, Output], None] | None = None,
        to_json: Callable[[T], Any] | None = None,
        exit_code: Callable[[T, Output], int] | None = None,
        mutating: bool = False,
        connects: bool = True,
        lenient: bool = False,
        read_only: bool = False,
    ) -> int:
        """Build the migrator, run ``action`` on it, close it, then render and pick the exit code.

        Errors propagate (the command wrapper turns them into the error envelope) after the
        migrator is closed and the signal handlers are restored. ``read_only`` (``status``,
        ``audit`` …): a server that does not answer fails in 3 s unless a timeout is configured.
        """
        from migronaut.cli.signals import GracefulStop

        guard = GracefulStop(self.out) if mutating else None
        self.guard = guard
        with guard if guard is not None else nullcontext():
            migrator = self._migrator(lenient=lenient, read_only=read_only)
            try:
                self._adopt_log_format(migrator)
                if guard is not None:
                    guard.bind(migrator)
                if connects:
                    self.out.spinner.show("Connecting to MongoDB…")
                result = action(migrator)
            finally:
                self.out.spinner.stop()
                migrator.close()
        if self.options.json:
            if to_json is not None:
                self.out.json(to_json(result))
        elif render is not None:
            render(result, self.out)
        return exit_code(result, self.out) if exit_code is not None else 0

    def _adopt_log_format(self, migrator: Migrator) -> None:
        """The configured log format, once the config loads; a config that cannot load is
        left to the action (it raises it, or ``audit`` reports it as a check)."""
        from migronaut.errors import MigronautError

        try:
            self.out.log_format = migrator.config.log_format
        except MigronautError:
            return
        if self.out.log_format == "json":
            self.out.spinner.disable()

    def _migrator(self, *, lenient: bool, read_only: bool = False) -> Migrator:
        from migronaut.api import Migrator

        progress = SpinnerProgress(self.out.spinner)
        flags = self.options.config_flags()
        if not lenient:
            return Migrator(flags, config_path=self.options.config, progress=progress,
                            _flags_origin="flag", _quick_connect=read_only)
        # create: never connects, needs no uri/db, and survives a config file that cannot load.
        from migronaut.core.config import load_config

        warnings: list[str] = []
        config = load_config(
            flags, config_path=self.options.config, require_db=False, lenient=True,
            warnings=warnings, flags_origin="flag",
        )
        for warning in warnings:
            self.out.warn(f"⚠ {warning}")
        return Migrator(config, progress=progress)
