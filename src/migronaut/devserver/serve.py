"""Serving the dev server: mongoeco's wire server behind the layer, until SIGINT or SIGTERM.

This module owns one server's life in its own process: checking the options and the installed
mongoeco, starting mongoeco's wire server (in memory, or persisted to a SQLite file) with the
layer of :mod:`migronaut.devserver.wire` in front of its command executor, building the
connection URI (with credentials when ``auth`` is on), seeding collections when asked
(:mod:`migronaut.devserver.seed`), waiting for SIGINT/SIGTERM and closing cleanly; and
:func:`main`, the ``python -m migronaut.devserver`` command line.

Invariants:

* Importing this module imports neither mongoeco nor pymongo; :func:`serve` imports mongoeco
  lazily, and its absence (or Python < 3.13, or a mongoeco release line the dev server was not
  written against) is a :class:`~migronaut.errors.ConfigInvalidError` with a one-line message,
  never a traceback.
* The URI a server process prints on stdout is its first line and is redacted of the password
  (:func:`migronaut.devserver.start_subprocess` puts the real password back).
* ``on_ready`` is called only once the server listens and every ``--seed`` collection is filled:
  whoever waits for the URI gets a seeded server. A refused ``--seed`` value refuses the server
  before it starts.

Run it directly with ``python -m migronaut.devserver --port N [--path F] [--auth user:pass]
[--standalone | --sharded] [--no-strict] [--search [--search-delay S] [--search-lag S]]
[--enable-test-commands] [--seed DB.COLLECTION:N ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote_plus

from migronaut._redact import redact
from migronaut.devserver.seed import Seed, fill, parse_seeds
from migronaut.errors import ConfigInvalidError, MigronautError

__all__ = [
    "DEFAULT_SEARCH_DELAY",
    "INSTALL_HINT",
    "MIN_PYTHON",
    "build_uri",
    "check_search_delay",
    "main",
    "parse_auth",
    "serve",
]

# A named constant, not a literal: mypy would otherwise treat the code after a literal version
# check as unreachable under ``python_version = "3.11"`` and skip checking it.
#: The oldest Python mongoeco (and so the dev server) runs on.
MIN_PYTHON: Final = (3, 13)
#: What the dev server's refusal of a missing mongoeco or an old Python tells the user to do.
INSTALL_HINT: Final = (
    "the dev server needs Python 3.13+ with the 'embedded' extra: "
    "pip install 'migronaut[embedded]' on Python 3.13+"
)
_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
#: Seconds a search index build spends in each of PENDING and BUILDING (and a drop in DELETING).
DEFAULT_SEARCH_DELAY: Final = 1.0


def build_uri(host: str, port: int, auth: tuple[str, str] | None = None) -> str:
    """The ``mongodb://`` URI for a dev server on ``host:port``, with credentials when given."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    query = "directConnection=true"
    if auth is not None:
        user, password = auth
        netloc = f"{quote_plus(user)}:{quote_plus(password)}@{netloc}"
        query += "&authMechanism=SCRAM-SHA-256&authSource=admin"
    return f"mongodb://{netloc}/?{query}"


def parse_auth(value: str) -> tuple[str, str]:
    """Split a ``user:password`` flag value; the password may itself contain ``:``."""
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ConfigInvalidError(
            "--auth must be 'user:password' with a non-empty user and password",
            {"flag": "--auth"},
        )
    return user, password


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    path: str | None = None,
    auth: tuple[str, str] | None = None,
    standalone: bool = False,
    sharded: bool = False,
    strict: bool = True,
    search: bool = False,
    search_delay: float = DEFAULT_SEARCH_DELAY,
    search_lag: float = 0.0,
    test_commands: bool = False,
    seed: Iterable[str | Seed] | str = (),
    on_ready: Callable[[str], None],
    on_progress: Callable[[str], None] | None = None,
) -> None:
    """Serve a MongoDB-compatible endpoint until SIGINT or SIGTERM, then close it and return.

    ``port=0`` picks a free port; ``path`` persists the data to that SQLite file (memory
    otherwise); ``auth`` requires SCRAM-SHA-256 with that user and password; ``standalone``
    refuses transactions exactly as a standalone ``mongod`` does (error 20); ``sharded`` answers
    ``hello`` like a ``mongos`` (a test aid: the shard metadata is whatever is put in the
    ``config`` database, the data lives on one node); ``strict`` (the default) refuses what
    ``mongod`` refuses, with its codes (see :mod:`migronaut.devserver.wire`); ``search`` answers
    Atlas's search-index commands like Atlas, each build spending ``search_delay`` seconds in
    ``PENDING`` and again in ``BUILDING``, and listing a submitted change only ``search_lag``
    seconds later (see :mod:`migronaut.devserver.search`); ``test_commands`` serves mongod's
    ``configureFailPoint`` ``failCommand`` (a test aid, see
    :mod:`migronaut.devserver.failpoints`). ``seed`` (``"DB.COLLECTION:N"`` values, or
    :class:`~migronaut.devserver.seed.Seed`) fills each collection with N small orders through
    the server's own endpoint before ``on_ready``, reporting to ``on_progress`` (a line about
    every 10 %); a malformed value is refused before anything starts, a collection that already
    holds documents (in a ``path`` file) before anything is inserted. ``on_ready`` is
    called once with the connection URI (it carries the password: redact it before printing).
    Must run in the main thread, which receives the signals. A mongoeco outside the release
    line the dev server was written against is refused before anything starts
    (:func:`migronaut.devserver.mongoeco_internals.check_version`).
    """
    if standalone and sharded:
        raise ConfigInvalidError(
            "--standalone and --sharded exclude each other (a mongos runs transactions)",
            {"flag": "--sharded"},
        )
    seeds = parse_seeds(seed, path=path)
    if sys.version_info < MIN_PYTHON:
        found = ".".join(str(part) for part in sys.version_info[:2])
        raise ConfigInvalidError(f"{INSTALL_HINT} (this is Python {found})")
    try:
        import sqlite3

        from mongoeco.wire import AsyncMongoEcoProxyServer, WireAuthUser
    except ImportError as error:
        raise ConfigInvalidError(f"{INSTALL_HINT} (mongoeco is not installed)") from error
    from migronaut.devserver.engine_loop import EngineLoop
    from migronaut.devserver.failpoints import FailCommand
    from migronaut.devserver.mongoeco_internals import (
        check_version,
        indexed_memory_engine,
        route_requests,
    )
    from migronaut.devserver.search import SearchIndexes
    from migronaut.devserver.wire import install

    check_version()
    if not 0 <= port <= 65535:
        raise ConfigInvalidError(
            f"--port must be between 0 and 65535 (got {port})", {"flag": "--port"}
        )
    check_search_delay(search_delay)
    check_search_delay(search_lag, "--search-lag")
    if auth is not None and not (auth[0] and auth[1]):
        raise ConfigInvalidError("dev server auth needs a non-empty user and password")
    if path is not None:
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            raise ConfigInvalidError(
                f"dev server data file {path!r}: directory {str(parent)!r} does not exist",
                {"flag": "--path", "path": path},
            )

    async def run() -> None:
        if path is None:
            engine = indexed_memory_engine()
        else:  # mongoeco's SQLite engine is a large import: only a server with a file needs it
            from mongoeco.engines import SQLiteEngine

            engine = SQLiteEngine(str(Path(path).expanduser()))
        users = () if auth is None else (WireAuthUser(auth[0], auth[1]),)
        server = AsyncMongoEcoProxyServer(
            engine=engine,
            host=host,
            port=port,
            pymongo_profile="auto-installed",  # the strict profile refuses newer pymongo
            auth_users=users,
        )
        install(server, strict=strict, standalone=standalone, sharded=sharded,
                search=SearchIndexes(search_delay, lag=search_lag) if search else None,
                fail_command=FailCommand() if test_commands else None)
        commands = EngineLoop()
        route_requests(server, commands.route)
        commands.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = _install_signal_handlers(loop, stop)
        try:
            try:
                address = await server.start()
            except sqlite3.Error as error:
                raise ConfigInvalidError(
                    f"dev server data file {path!r} cannot be opened as SQLite: {error}",
                    {"flag": "--path", "path": path},
                ) from error
            except OSError as error:
                raise ConfigInvalidError(
                    f"dev server cannot listen on {host}:{port}: {error.strerror or error}",
                    {"flag": "--port", "host": host, "port": port},
                ) from error
            try:
                uri = build_uri(address.host, address.port, auth)
                if seeds and not await fill(uri, seeds, path=path, on_progress=on_progress,
                                            stop=stop):
                    return  # stopped while seeding: never ready
                on_ready(uri)
                await stop.wait()
            finally:
                await server.close()
        finally:
            commands.stop()
            _remove_signal_handlers(loop, installed)

    asyncio.run(run())


def check_search_delay(seconds: float, flag: str = "--search-delay") -> None:
    """Refuse a ``--search-delay`` (or ``--search-lag``) that is negative, not finite or over
    an hour."""
    if not 0 <= seconds <= 3600:  # also refuses NaN
        raise ConfigInvalidError(
            f"{flag} must be between 0 and 3600 seconds (got {seconds})", {"flag": flag},
        )


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event
) -> list[tuple[signal.Signals, Any]]:
    """Route SIGINT/SIGTERM to ``stop``; returns what :func:`_remove_signal_handlers` undoes."""
    installed: list[tuple[signal.Signals, Any]] = []
    for sig in _SIGNALS:
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append((sig, None))
        except NotImplementedError:  # Windows: no loop signal handlers
            previous = signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
            installed.append((sig, previous))
    return installed


def _remove_signal_handlers(
    loop: asyncio.AbstractEventLoop, installed: list[tuple[signal.Signals, Any]]
) -> None:
    for sig, previous in installed:
        if previous is None:
            loop.remove_signal_handler(sig)
        else:
            signal.signal(sig, previous)


# --------------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m migronaut.devserver``: print the redacted URI as the first stdout line, serve."""
    parser = argparse.ArgumentParser(
        prog="python -m migronaut.devserver",
        description="Serve a local MongoDB-compatible endpoint (mongoeco) until SIGINT/SIGTERM.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: a free one)")
    parser.add_argument("--path", default=None, help="persist data to this SQLite file")
    parser.add_argument("--auth", default=None, metavar="USER:PASSWORD", help="require login")
    parser.add_argument(
        "--standalone", action="store_true", help="refuse transactions like a standalone mongod"
    )
    parser.add_argument(
        "--sharded", action="store_true",
        help="answer like a mongos (test aid: shard metadata is what you put in 'config')",
    )
    parser.add_argument(
        "--no-strict", dest="strict", action="store_false",
        help="accept what mongod refuses, as mongoeco does (strict is the default)",
    )
    parser.add_argument(
        "--search", action="store_true",
        help="answer Atlas Search index commands like Atlas (builds take --search-delay)",
    )
    parser.add_argument(
        "--search-delay", type=float, default=DEFAULT_SEARCH_DELAY, metavar="SECONDS",
        help=f"time a search index build spends PENDING, then BUILDING "
        f"({DEFAULT_SEARCH_DELAY:g})",
    )
    parser.add_argument(
        "--search-lag", type=float, default=0.0, metavar="SECONDS",
        help="time before $listSearchIndexes shows a submitted change (0: at once; Atlas's "
        "list is eventually consistent)",
    )
    parser.add_argument(
        "--enable-test-commands", dest="test_commands", action="store_true",
        help="serve mongod's configureFailPoint failCommand (a test aid, never for real data)",
    )
    parser.add_argument(
        "--seed", action="append", default=[], metavar="DB.COLLECTION:N",
        help="fill that collection with N small orders before printing the URI (repeatable)",
    )
    args = parser.parse_args(argv)

    def announce(uri: str) -> None:
        print(redact(uri), flush=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        auth = None if args.auth is None else parse_auth(args.auth)
        serve(
            host=args.host,
            port=args.port,
            path=args.path,
            auth=auth,
            standalone=args.standalone,
            sharded=args.sharded,
            strict=args.strict,
            search=args.search,
            search_delay=args.search_delay,
            search_lag=args.search_lag,
            test_commands=args.test_commands,
            seed=args.seed,
            on_ready=announce,
            on_progress=progress,
        )
    except MigronautError as error:
        print(f"error: {error.message}", file=sys.stderr, flush=True)
        return error.exit_code
    except KeyboardInterrupt:  # SIGINT before the server installed its handlers
        return 130
    return 0
