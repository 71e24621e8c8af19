"""``migronaut dashboard``: serve the web dashboard (extra ``dashboard``) until stopped.

stdout carries one line, the URL with the access token (like Jupyter's), so scripts can read
it; the rest goes to stderr. The socket is bound before the URL is printed, so ``--port 0``
prints the port it got. SIGINT/SIGTERM stop the server (uvicorn's handling; exit 0).
"""

from __future__ import annotations

import ipaddress
import signal
import socket
from typing import TYPE_CHECKING, Any

import click

from migronaut.cli.app import command
from migronaut.cli.session import Session, parse_int
from migronaut.errors import ConfigInvalidError, ExtraMissingError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.core.config import Config

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means every interface (``0.0.0.0``, ``::``): no browser can open it."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def link_host(host: str) -> str:
    """The host of the printed URL: on every interface, the loopback address of the same
    family (this machine can open it; others use its name); else ``host`` as given, an IPv6
    address in brackets."""
    bare = host.strip("[]")
    if is_wildcard(bare):
        bare = "::1" if ":" in bare else "127.0.0.1"
    return f"[{bare}]" if ":" in bare else bare


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``; a refusal is ``CONFIG_INVALID`` naming the flag."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bare, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise ConfigInvalidError(
            f"cannot listen on {host}:{port}: {error.strerror or error} — pass another --port "
            "(0: any free port) or --host", {"flag": "--port", "host": host, "port": port},
        ) from error
    return sock


@command(
    "dashboard",
    help="Serve the web dashboard (needs the 'dashboard' extra): migrations, the lock, runs, "
    "audit, drift and live background migrations — and, with a [fleet], every tenant's state "
    "and pages (with no db configured, the fleet page is the home page). Prints its URL with "
    "an access token. "
    "Binds to 127.0.0.1 unless --host; pause/resume/cancel/retry only with --allow-controls.",
    short_help="Serve the web dashboard.",
)
@click.option("--host", default=DEFAULT_HOST, show_default=True, metavar="HOST",
              help="Interface to listen on (a warning when it is not loopback).")
@click.option("--port", metavar="N", help=f"Port (default {DEFAULT_PORT}; 0: any free port).")
@click.option("--allow-controls", is_flag=True,
              help="Offer pause, resume, cancel and retry (token and same-site checks apply).")
def dashboard(session: Session, host: str, port: str | None, allow_controls: bool) -> int:
    number = parse_int(port, "--port")
    if number is not None and not 0 <= number <= 65535:
        raise ConfigInvalidError(f"--port must be between 0 and 65535 (got {port!r})",
                                 {"option": "--port"})
    if not host.strip():
        raise ConfigInvalidError("--host must not be empty", {"option": "--host"})
    out = session.out

    def serve(migrator: Migrator) -> dict[str, Any]:
        from migronaut.dashboard import create_app  # CONFIG_INVALID without the extra
        from migronaut.dashboard.guard import Guard

        try:
            import uvicorn
        except ImportError as missing:
            raise ExtraMissingError.of("dashboard", "the dashboard", missing) from missing

        token = Guard.new_token()
        fleet_home = _fleet_without_db(session)
        if fleet_home is not None:  # the fleet page is the home page
            app = create_app(config=fleet_home, allow_controls=allow_controls, token=token)
            migrator = app.state.migrator
        # an unreachable database fails here (CONNECTION_FAILED, its exit code), not with a
        # "ready" server whose every page is a 503
        migrator.connect()
        if fleet_home is None:
            app = create_app(migrator, allow_controls=allow_controls, token=token)
        sock = bind(host, DEFAULT_PORT if number is None else number)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        # A stop from here on is a clean exit 0: before the server runs it is noted (and the
        # server not started); one that lands after that check but before uvicorn installs its
        # own handlers tells the server to exit as soon as it has started; while it runs
        # uvicorn shuts down gracefully, then re-raises the signal under the handler it found —
        # this one, which only notes it again.
        stops: list[int] = []

        def stop(sig: int, frame: Any) -> None:
            stops.append(sig)
            server.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            url = _announce(host, sock.getsockname()[1], token)
            if not stops:
                server.run(sockets=[sock])
        finally:
            sock.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return {"url": url}

    def _announce(host: str, port: int, token: str) -> str:
        """Warn off loopback, print the URL (stdout's one line), say it is ready."""
        url = f"http://{link_host(host)}:{port}/?token={token}"
        if is_wildcard(host):
            out.note(f"Listening on all interfaces ({host}): from another machine use "
                     f"http://{socket.gethostname()}:{port}/ with the same token")
        if not is_loopback(host):
            out.warn(f"⚠ Listening on {host}, not on loopback: anyone who can reach this host "
                     "and has the token can read the dashboard"
                     + (" and pause, resume, cancel or retry migrations" if allow_controls
                        else "") + "; there is no TLS — put it behind a proxy that adds it")
        if out.json_mode:
            out.json({"url": url, "controls": allow_controls}, compact=True)
        else:
            out.result_line(url)
        out.note("Dashboard ready" + (" (controls on)" if allow_controls else "")
                 + " — press Ctrl-C to stop")
        return url

    return session.run(serve)


def _fleet_without_db(session: Session) -> Config | None:
    """The configuration when it declares a ``[fleet]`` but no ``db``: the dashboard then
    serves the fleet page and its tenants' pages, with no database of its own."""
    from migronaut.core.config import load_config

    options = session.options
    config = load_config(options.config_flags(), config_path=options.config, require_db=False,
                         flags_origin="flag")
    return config if config.fleet is not None and not config.db_name else None
