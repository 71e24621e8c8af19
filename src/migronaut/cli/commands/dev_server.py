"""``migronaut dev-server``: serve a local MongoDB-compatible endpoint (mongoeco) until stopped.

stdout carries exactly one line, the connection URI (password redacted), so scripts can read
it; everything else goes to stderr. SIGINT/SIGTERM stop the server cleanly (exit 0).
"""

from __future__ import annotations

import click

from migronaut.cli.app import command
from migronaut.cli.session import Session, parse_int
from migronaut.errors import ConfigInvalidError

#: MongoDB's own port, so the quickstart's URI is the same in every shell (README).
DEFAULT_PORT = 27017
#: Global flags that configure a migronaut command; the dev server reads no configuration.
_CONFIG_FLAGS = (("uri", "--uri"), ("db", "--db"), ("dir", "--dir"), ("config", "--config"),
                 ("env_file", "--env-file"), ("no_env", "--no-env"))


@command(
    "dev-server",
    help="Serve a local MongoDB-compatible endpoint for development (needs the 'embedded' "
    "extra, Python 3.13+) and print its URI. In memory unless --path. Never for production.",
    short_help="Run a local development MongoDB.",
)
@click.option("--port", metavar="N",
              help=f"Port to listen on (default {DEFAULT_PORT}, MongoDB's; 0: any free port).")
@click.option("--path", "data_path", metavar="FILE", help="Persist the data to this SQLite file.")
@click.option("--auth", metavar="USER:PASS", help="Require this user and password.")
@click.option("--standalone", is_flag=True,
              help="Refuse transactions like a standalone mongod (for testing).")
@click.option("--sharded", is_flag=True,
              help="Answer like a mongos (for testing; shard metadata is whatever you put in "
              "the 'config' database, the data lives on one node).")
@click.option("--strict/--no-strict", default=True, show_default=True,
              help="Refuse what mongod refuses, with its error codes; --no-strict accepts "
              "whatever mongoeco accepts.")
@click.option("--search", is_flag=True,
              help="Answer Atlas Search index commands like Atlas (for testing; builds move "
              "PENDING → BUILDING → READY, --search-delay seconds each).")
@click.option("--search-delay", metavar="SECONDS",
              help="With --search: seconds a build spends PENDING, then BUILDING (default 1).")
@click.option("--search-lag", metavar="SECONDS",
              help="With --search: seconds before the search-index list shows a create or an "
              "update, as Atlas's eventually consistent list does (default 0).")
@click.option("--enable-test-commands", "test_commands", is_flag=True,
              help="Serve mongod's configureFailPoint failCommand (for testing failure paths).")
@click.option("--seed", "seed", multiple=True, metavar="DB.COLLECTION:N",
              help="Before printing the URI, fill that collection with N small orders "
              "({_id, __v: 1, customer, status, total}); repeatable.")
def dev_server(
    session: Session, port: str | None, data_path: str | None, auth: str | None,
    standalone: bool, sharded: bool, strict: bool, search: bool, search_delay: str | None,
    search_lag: str | None, test_commands: bool, seed: tuple[str, ...],
) -> int:
    from migronaut import devserver

    given = [flag for key, flag in _CONFIG_FLAGS
             if getattr(session.options, key) not in (None, False)]
    if given:
        raise ConfigInvalidError(
            f"{given[0]} does not apply to dev-server: it reads no configuration (its options "
            "are --port, --path, --auth, --standalone, --sharded, --no-strict, --search, "
            "--enable-test-commands, --seed)",
            {"option": given[0]},
        )
    number = parse_int(port, "--port")
    if number is not None and not 0 <= number <= 65535:
        raise ConfigInvalidError(
            f"--port must be between 0 and 65535 (got {port!r})", {"option": "--port"}
        )
    delay = _seconds(search_delay, "--search-delay", devserver.DEFAULT_SEARCH_DELAY)
    lag = _seconds(search_lag, "--search-lag", 0.0)
    credentials = devserver.parse_auth(auth) if auth is not None else None
    seeds = devserver.parse_seeds(seed, path=data_path)
    out = session.out

    def ready(uri: str) -> None:
        if out.json_mode:
            out.json({"uri": uri})
        else:
            out.result_line(uri)
        where = f"data in {data_path}" if data_path else "in memory"
        if search:
            where += ", Atlas Search index commands served"
        if test_commands:
            where += ", test failpoint served"
        if seeds:
            where += "".join(f", {one.count:,} documents in {one.namespace}" for one in seeds)
        out.note(f"Dev server ready ({where}) — press Ctrl-C to stop")

    try:
        devserver.serve(
            host="127.0.0.1",
            port=DEFAULT_PORT if number is None else number,
            path=data_path,
            auth=credentials,
            standalone=standalone,
            sharded=sharded,
            strict=strict,
            search=search,
            search_delay=delay,
            search_lag=lag,
            test_commands=test_commands,
            seed=seeds,
            on_ready=ready,
            on_progress=out.note,
        )
    except ConfigInvalidError as error:
        if error.context.get("flag") == "--port" and "port" in error.context:  # taken
            other = "another --port N" if number is not None else "--port N"
            raise ConfigInvalidError(
                f"{error.message} — is another MongoDB running there? Pass {other}, or "
                "--port 0 for any free port (and use the URI it prints)",
                error.context,
            ) from error
        raise
    return 0


def _seconds(value: str | None, flag: str, default: float) -> float:
    """A ``--search-delay``/``--search-lag`` value: a number of seconds in 0–3600."""
    from migronaut import devserver

    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigInvalidError(f"{flag} must be a number of seconds (got {value!r})",
                                 {"option": flag}) from None
    devserver.check_search_delay(seconds, flag)
    return seconds
