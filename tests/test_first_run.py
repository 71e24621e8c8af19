"""First-run friction: what a newcomer following the README quickstart meets.

The dev server listens on MongoDB's port by default (so the README's URI is the same in every
shell), says what to do when that port is taken, and reads no configuration; a connection failure
names the URI (masked) and the setting it came from, with the driver's topology dump only under
``--verbose``. (``init`` writing the environment's URI: tests/test_cli_files.py; a failing
migration naming its file and line: tests/test_preflight.py.)
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

needs_embedded = pytest.mark.skipif(
    sys.version_info < (3, 13), reason="dev-server needs Python 3.13+ with migronaut[embedded]"
)
QUICKSTART_URI = "mongodb://127.0.0.1:27017/?directConnection=true"
UNREACHABLE = "mongodb://alice:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=200"


@contextlib.contextmanager
def port_taken(port: int) -> Iterator[None]:
    """Make sure ``port`` is in use on 127.0.0.1 for the block (ours, or already someone's)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(OSError):  # already in use: fine, it is taken
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        yield
    finally:
        sock.close()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# ------------------------------------------------------------------------------- dev-server


@pytest.mark.slow
@needs_embedded
def test_the_dev_server_listens_on_27017_by_default(cli_process: Any) -> None:
    if not port_free(27017):
        pytest.skip("port 27017 is in use on this machine (see the next test)")
    process = cli_process.start("dev-server")
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    try:
        assert line == QUICKSTART_URI, line or process.stderr.read()
    finally:
        process.send_signal(signal.SIGTERM)
        result = cli_process.wait(process, timeout=30)
    assert result.exit_code == 0, result.stderr


@pytest.mark.slow
@needs_embedded
def test_a_taken_default_port_says_what_to_do(cli_process: Any) -> None:
    with port_taken(27017):
        process = cli_process.start("dev-server", "--json")
        try:
            result = cli_process.wait(process, timeout=30)  # exits at once: it cannot listen
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    assert result.exit_code == 6, result.stdout + result.stderr
    message = result.json["error"]["message"]
    assert message.startswith("dev server cannot listen on 127.0.0.1:27017")
    assert "Pass --port N, or --port 0 for any free port" in message


@pytest.mark.parametrize("flags", [("--uri", "mongodb://x/"), ("--db", "app"), ("--dir", "m"),
                                   ("--config", "migronaut.toml"), ("--no-env",)])
def test_the_dev_server_refuses_configuration_flags(
    cli_process: Any, flags: tuple[str, ...]
) -> None:
    # a real process: a dev server that ignored the flag would serve until stopped
    result = cli_process(*flags, "dev-server", "--port", "0", timeout=30)
    assert result.exit_code == 6
    assert result.stderr.startswith(f"✖ CONFIG_INVALID: {flags[0]} does not apply to dev-server")


# ------------------------------------------------------------------------ connection failed


@pytest.mark.parametrize(("how", "origin"), [
    ("flag", "the --uri flag"),
    ("env", "the MIGRONAUT_URI environment variable"),
    ("file", "migronaut.toml"),
    ("dotenv", "MIGRONAUT_URI from the .env file"),
])
def test_connection_failed_names_the_masked_uri_and_where_it_came_from(
    cli: Any, project: Any, how: str, origin: str
) -> None:
    args: tuple[str, ...] = ("status",)
    env: dict[str, str | None] = {"MIGRONAUT_URI": None}
    if how == "flag":
        args += ("--uri", UNREACHABLE)
    elif how == "env":
        env["MIGRONAUT_URI"] = UNREACHABLE
    elif how == "file":
        project.write("migronaut.toml", f'uri = "{UNREACHABLE}"\n')
    else:
        project.write(".env", f"MIGRONAUT_URI={UNREACHABLE}\n")
    result = cli(*args, env=env)
    assert result.exit_code == 5, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("✖")]
    assert line.startswith(
        "✖ CONNECTION_FAILED: Failed to connect to MongoDB at "
        f"mongodb://alice:****@127.0.0.1:1/?serverSelectionTimeoutMS=200 (uri from {origin}): ")
    assert "Topology Description" not in result.stdout + result.stderr
    assert "s3cret" not in result.stdout + result.stderr


def test_the_topology_dump_shows_only_with_verbose(cli: Any) -> None:
    quiet = cli("status", "--json", "--uri", UNREACHABLE)
    assert quiet.exit_code == 5
    error = quiet.json["error"]
    assert error["context"]["uri"] == (
        "mongodb://alice:****@127.0.0.1:1/?serverSelectionTimeoutMS=200")
    assert error["context"]["uriFrom"] == "the --uri flag"
    assert "Topology Description" not in quiet.stdout + quiet.stderr
    verbose = cli("status", "--verbose", "--uri", UNREACHABLE)
    assert verbose.exit_code == 5
    assert "Topology Description" in verbose.stderr
    assert "s3cret" not in verbose.stdout + verbose.stderr


@pytest.mark.parametrize(("flag", "value", "fragment"), [
    ("--uri", "localhost", "must be a mongodb:// or mongodb+srv:// connection string"),
    ("--uri", "0", "must be a mongodb:// or mongodb+srv:// connection string"),
    ("--db", "my.app", "must be a valid database name (no '.')"),
    ("--db", "a/b", "must be a valid database name (no '/')"),
    ("--db", "x" * 64, "at most 63 bytes"),
])
def test_a_uri_or_database_name_mongodb_cannot_use_is_config_invalid(
    cli: Any, flag: str, value: str, fragment: str
) -> None:
    result = cli("status", flag, value)
    assert result.exit_code == 6, result.stderr
    assert fragment in result.stderr and "(flags)" in result.stderr
