"""The ``migronaut`` command line.

:func:`main` is the whole contract: it parses ``argv``, runs one command and *returns* the exit
code (reference core §2.4); it never calls :func:`sys.exit`. The console script and
``python -m migronaut`` wrap it. Importing this package imports neither click nor pymongo, so
``migronaut --version`` and ``--help`` stay fast; each layer is imported when it is needed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["entry", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):  # what scripts call most: answer without click
        from migronaut._version import __version__

        try:
            sys.stdout.write(f"migronaut {__version__}\n")
            sys.stdout.flush()
        except BrokenPipeError:
            pass
        return 0
    from migronaut.cli.app import run

    return run(args)


def entry() -> None:
    """The console script and ``python -m migronaut``: :func:`main`, then a prompt exit.

    Every client is closed by then; pymongo's exit hook would still wait up to half a second for
    its monitor threads to notice, on every command that connected. Those are daemon threads of
    closed clients, so the process skips that wait (nothing else registered at exit is skipped).
    """
    code = main()
    monitor = sys.modules.get("pymongo.synchronous.monitor")
    shutdown = getattr(monitor, "_shutdown_resources", None)
    if shutdown is not None:
        import atexit

        atexit.unregister(shutdown)
    sys.exit(code)
