"""The command group: global options, the command registry, errors → envelope and exit code.

Invariants:

* :func:`run` returns an exit code for every outcome and never lets an exception (or click's
  ``SystemExit``) escape: a migronaut error exits with its own ``exit_code``, a parse error or
  any other exception with 1 (reference core §2.4), a Ctrl-C of a read-only command with 130.
* Global options are accepted before and after the command name; the ones after win.
* In ``--json`` mode stdout carries exactly one JSON document, errors included
  (``{"error": {...}, "partial": [...]}``); human error lines go to stderr in every mode.
* No traceback for an expected failure; ``--verbose`` adds the cause chain (redacted).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from migronaut._redact import redact
from migronaut._version import __version__
from migronaut.cli.output import DEBUG, Output
from migronaut.cli.session import GLOBAL_KEYS, GlobalOptions, Session
from migronaut.errors import MigronautError

__all__ = ["DOCS_URL", "build_cli", "command", "group", "report_error", "run"]

#: The documentation site (mkdocs.yml ``site_url``); help footers point here, never at files of
#: the source tree, which an installed package does not have.
DOCS_URL = "https://migronaut.readthedocs.io/en/latest/"
#: The footer of every command's and group's ``--help``.
_HELP_FOOTER = f"Documentation: {DOCS_URL}cli/"

F = TypeVar("F", bound=Callable[..., Any])

#: The command modules, imported when the group is built (each registers its commands).
COMMAND_MODULES = (
    "migronaut.cli.commands.init",
    "migronaut.cli.commands.create",
    "migronaut.cli.commands.migrate",
    "migronaut.cli.commands.converge",
    "migronaut.cli.commands.inspect",
    "migronaut.cli.commands.lock",
    "migronaut.cli.commands.adopt",
    "migronaut.cli.commands.audit",
    "migronaut.cli.commands.logs",
    "migronaut.cli.commands.background",
    "migronaut.cli.commands.dev_server",
    "migronaut.cli.commands.dashboard",
    "migronaut.cli.commands.fleet",
    "migronaut.cli.commands.fleet_enqueue",
)

_REGISTRY: list[click.Command] = []

#: Words other migration tools use for our commands: an unknown command suggests ours by intent
#: (``rollback`` → ``down``), before any suggestion by spelling.
COMMAND_ALIASES = {
    "rollback": "down", "revert": "down", "undo": "down", "downgrade": "down",
    "migrate": "up", "apply": "up", "upgrade": "up", "run": "up",
    "new": "create", "generate": "create", "make": "create", "show": "status",
    "history": "logs", "stamp": "baseline", "unlock-force": "unlock", "devserver": "dev-server",
}

_GLOBAL_HELP = {
    "uri": "MongoDB connection URI (overrides MIGRONAUT_URI / uri).",
    "db": "Database name (overrides MIGRONAUT_DB / db_name).",
    "dir": "Migrations directory (overrides MIGRONAUT_MIGRATIONS_DIR / migrations_dir).",
    "config": "Config file to use (disables auto-discovery).",
    "env_file": "The .env file to load (default ./.env).",
    "no_env": "Load no .env file at all.",
    "verbose": "Debug lines, error causes and tracebacks; no spinner.",
    "quiet": "Errors only.",
    "no_color": "No ANSI colours (beats every colour variable).",
    "json": "Machine-readable output: one JSON document on stdout.",
    "log_format": "Log lines as text (default) or json: one JSON object per line on stderr.",
}


def global_options(*, hidden: bool) -> Callable[[F], F]:
    """Add the global flags (and ``-V/--version``) to a group or command."""

    def decorate(f: F) -> F:
        options = [
            click.option("--uri", metavar="URI", help=_GLOBAL_HELP["uri"], hidden=hidden),
            click.option("--db", metavar="NAME", help=_GLOBAL_HELP["db"], hidden=hidden),
            click.option("--dir", metavar="PATH", help=_GLOBAL_HELP["dir"], hidden=hidden),
            click.option("--config", metavar="PATH", help=_GLOBAL_HELP["config"], hidden=hidden),
            click.option("--env-file", metavar="PATH", help=_GLOBAL_HELP["env_file"],
                         hidden=hidden),
            click.option("--no-env", is_flag=True, help=_GLOBAL_HELP["no_env"], hidden=hidden),
            click.option("--verbose", is_flag=True, help=_GLOBAL_HELP["verbose"], hidden=hidden),
            click.option("--quiet", is_flag=True, help=_GLOBAL_HELP["quiet"], hidden=hidden),
            click.option("--no-color", is_flag=True, help=_GLOBAL_HELP["no_color"],
                         hidden=hidden),
            click.option("--json", is_flag=True, help=_GLOBAL_HELP["json"], hidden=hidden),
            click.option("--log-format", metavar="text|json", help=_GLOBAL_HELP["log_format"],
                         hidden=hidden),
            click.version_option(__version__, "-V", "--version", prog_name="migronaut",
                                 message="%(prog)s %(version)s", hidden=hidden),
        ]
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def command(
    name: str, *, help: str, short_help: str | None = None, parent: click.Group | None = None
) -> Callable[[F], click.Command]:
    """Register a CLI command whose body is ``body(session, **own_options) -> exit code``.

    The wrapper merges the global options given before and after the command name, sets up the
    output and the log bridge, and turns any error into the error envelope and its exit code.
    With ``parent`` (a :func:`group`), the command is one of that group's subcommands.
    """

    def decorate(body: F) -> click.Command:
        @functools.wraps(body)
        def callback(**kwargs: Any) -> int:
            ctx = click.get_current_context()
            local = GlobalOptions(**{key: kwargs.pop(key) for key in GLOBAL_KEYS})
            before = ctx.obj if isinstance(ctx.obj, GlobalOptions) else GlobalOptions()
            options = before.merge(local)
            return execute(options, lambda session: int(body(session, **kwargs)))

        decorated = global_options(hidden=True)(callback)
        cmd = click.command(
            name,
            help=help + "\n\nThe global options (see `migronaut --help`) are accepted here too.",
            short_help=short_help,
            epilog=_HELP_FOOTER,
        )(decorated)
        if parent is not None:
            parent.add_command(cmd)
        else:
            _REGISTRY.append(cmd)
        return cmd

    return decorate


def group(name: str, *, help: str, short_help: str | None = None) -> click.Group:
    """Register a command group (``migronaut <name> <subcommand>``); add subcommands with
    ``@command(..., parent=the_group)``. The global options are accepted on the group too."""

    @click.pass_context
    def callback(ctx: click.Context, /, **kwargs: Any) -> None:
        before = ctx.obj if isinstance(ctx.obj, GlobalOptions) else GlobalOptions()
        ctx.obj = before.merge(GlobalOptions(**kwargs))

    grp = click.group(
        name,
        help=help + "\n\nThe global options (see `migronaut --help`) are accepted here too.",
        short_help=short_help,
        epilog=_HELP_FOOTER,
        cls=SuggestingGroup,
    )(global_options(hidden=True)(callback))
    _REGISTRY.append(grp)
    return grp


def execute(options: GlobalOptions, body: Callable[[Session], int]) -> int:
    """Run one command body with its output, log bridge and error handling in place."""
    from migronaut.cli.logbridge import LogBridge

    session = Session(options)
    bridge = LogBridge(session.out)
    bridge.attach()
    try:
        options.validate()
        return body(session)
    except MigronautError as error:
        return report_error(session.out, error)
    except (click.exceptions.Exit, click.ClickException):
        raise
    except Exception as error:
        return report_error(session.out, error)
    finally:
        session.out.spinner.stop()
        bridge.detach()


def report_error(out: Output, error: BaseException) -> int:
    """The error envelope (``--json``) and the ``✖`` line; returns the exit code."""
    if isinstance(error, MigronautError):
        if out.json_mode:
            document: dict[str, Any] = {"error": error.to_dict()}
            if "results" in error.context:
                document["partial"] = error.context["results"]
            out.json(document)
        hint = ""
        if error.context.get("line") is not None and not out.enabled(DEBUG):
            hint = " (--verbose shows the traceback)"  # the error points into the user's code
        out.error(f"✖ {error.code}: {error.message}{hint}")
        _list_issues(out, error.context.get("issues"))
        _debug_causes(out, error)
        return error.exit_code
    message = (str(error).strip() or type(error).__name__).splitlines()[0]
    if out.json_mode:
        out.json({"error": {"message": redact(message)}})
    out.error(f"✖ {message}")
    if out.enabled(DEBUG):
        import traceback

        out.detail("".join(traceback.format_exception(error)).rstrip())
    return 1


def _list_issues(out: Output, issues: Any) -> None:
    """Every problem of an error that found several (a spec, a config), one line each — the
    message names only the first."""
    if not isinstance(issues, list) or len(issues) < 2:
        return
    for issue in issues:
        if isinstance(issue, dict):
            out.error(f"  • {issue.get('path')}: {issue.get('message')}")


def _debug_causes(out: Output, error: BaseException) -> None:
    """``--verbose``: the wrapped causes, outermost first, with their tracebacks (redacted)."""
    if not out.enabled(DEBUG):
        return
    import traceback

    cause = error.__cause__
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__,
                                                  chain=False)).rstrip()
        out.detail(f"caused by: {text}")
        cause = cause.__cause__


class SuggestingGroup(click.Group):
    """A group whose unknown command suggests one of its own: by intent
    (:data:`COMMAND_ALIASES`), else by spelling (:func:`~migronaut._suggest.suggest`)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = str(args[0]) if args else ""
        if (name and not name.startswith("-") and not ctx.resilient_parsing
                and self.get_command(ctx, name) is None):
            from migronaut._suggest import suggest

            close = suggest(name, self.list_commands(ctx), aliases=COMMAND_ALIASES)
            hint = f" Did you mean '{close}'?" if close else ""
            raise click.UsageError(f"No such command '{name}'.{hint}", ctx)
        return super().resolve_command(ctx, args)


class MigronautGroup(SuggestingGroup):
    """The root group; treats a closed stdout while printing help as success (``| head``)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            raise click.exceptions.Exit(0) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise click.exceptions.Exit(0) from None


@functools.cache
def build_cli() -> click.Group:
    """The ``migronaut`` group with every registered command (built once per process)."""

    @click.group(
        cls=MigronautGroup,
        name="migronaut",
        context_settings={"help_option_names": ["-h", "--help"]},
        help="MongoDB migrations with a changelog, a cluster-wide lock, checksums, rollbacks "
        "and dry runs.",
        epilog=f"Exit codes and JSON shapes: {DOCS_URL}cli/",
    )
    @global_options(hidden=False)
    @click.pass_context
    def group(ctx: click.Context, /, **kwargs: Any) -> None:
        ctx.obj = GlobalOptions(**kwargs)

    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(module)
    for cmd in _REGISTRY:
        group.add_command(cmd)
    return group


def _wants_json(args: Sequence[str]) -> bool:
    head = list(args[: list(args).index("--")]) if "--" in args else list(args)
    return "--json" in head


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the exit code (see the module invariants)."""
    args = list(sys.argv[1:] if argv is None else argv)
    group = build_cli()
    try:
        result = group.main(args, prog_name="migronaut", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as error:
        return _usage(error, args, help_text=error.ctx.get_help() if error.ctx else None)
    except click.UsageError as error:
        return _usage(error, args)
    except click.ClickException as error:
        return _usage(error, args)
    except click.Abort:
        return 130
    except SystemExit as exit_:  # click's own last-resort paths; never leave the process
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return result if isinstance(result, int) else 0


def _usage(error: click.ClickException, args: Sequence[str], help_text: str | None = None) -> int:
    """A parse error: one line on stderr (or the JSON envelope), exit 1."""
    out = Output(json_mode=_wants_json(args), no_color_flag="--no-color" in args)
    message = error.format_message().strip().splitlines()[0] if error.format_message() else ""
    if help_text is not None:
        out.write(out.stderr, help_text)
        message = "missing command"
    ctx = getattr(error, "ctx", None)
    where = ctx.command_path if isinstance(ctx, click.Context) else "migronaut"
    if out.json_mode:
        out.json({"error": {"message": message}})
    out.error(f"✖ {message} (see '{where} --help')")
    return 1
