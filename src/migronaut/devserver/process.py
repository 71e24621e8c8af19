"""The dev server as a child process: the one way tests, the demo and tooling run it.

:func:`start_subprocess` runs ``python -m migronaut.devserver`` under :func:`default_python` (or a
given interpreter), waits for the URI line the server prints first and returns a
:class:`DevServerProcess` that stops it. The printed URI is redacted; the returned one carries the
real password again. A server that refuses its options or its interpreter is a
:class:`~migronaut.errors.ConfigInvalidError` naming the server's own one-line error.

Imports neither mongoeco nor pymongo: the child process does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import IO, Final
from urllib.parse import quote_plus

from migronaut._redact import MASK, redact
from migronaut.devserver.seed import Seed, parse_seeds
from migronaut.devserver.serve import INSTALL_HINT, MIN_PYTHON
from migronaut.errors import (
    EXIT_CODES,
    ConfigInvalidError,
    ConnectionFailedError,
    MigronautError,
)

__all__ = [
    "PYTHON_ENV_VAR",
    "SEED_TIMEOUT_PER_DOCUMENT",
    "START_TIMEOUT",
    "DevServerProcess",
    "default_python",
    "start_subprocess",
]

#: Environment variable naming the interpreter (with ``migronaut[embedded]``) that runs the server.
PYTHON_ENV_VAR: Final = "MIGRONAUT_DEVSERVER_PYTHON"
#: Seconds :func:`start_subprocess` waits for the URI line by default, plus
#: :data:`SEED_TIMEOUT_PER_DOCUMENT` per document seeded (in memory; 100 times that into a
#: ``--path`` file, whose inserts read the whole collection).
START_TIMEOUT: Final = 30.0
#: The dev server inserts several thousand documents a second; this allows for a slow machine.
SEED_TIMEOUT_PER_DOCUMENT: Final = 0.002


def default_python() -> str:
    """The interpreter that runs the dev server: ``$MIGRONAUT_DEVSERVER_PYTHON``, else this one
    when it is Python 3.13+ with mongoeco installed."""
    configured = os.environ.get(PYTHON_ENV_VAR, "").strip()
    if configured:
        return configured
    if sys.version_info >= MIN_PYTHON and importlib.util.find_spec("mongoeco") is not None:
        return sys.executable
    raise ConfigInvalidError(
        f"{INSTALL_HINT}, or set {PYTHON_ENV_VAR} to such an interpreter "
        f"(this is {sys.executable})"
    )


class DevServerProcess:
    """A dev server running as a child process; ``uri`` carries the real credentials.

    Use it as a context manager, or call :meth:`stop`. Its stdout past the URI line is drained
    and discarded; its stderr goes to a temporary file readable with :meth:`read_stderr`.
    """

    def __init__(self, process: subprocess.Popen[bytes], uri: str, stderr: IO[bytes]) -> None:
        self.process = process
        self.uri = uri
        self._stderr = stderr

    @property
    def pid(self) -> int:
        return self.process.pid

    def read_stderr(self) -> str:
        """Everything the server wrote to stderr so far."""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, SIGKILL if still running; the exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode

    def close(self) -> None:
        """Stop the server and release the stderr file."""
        self.stop()
        self._stderr.close()

    def __enter__(self) -> DevServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DevServerProcess(pid={self.pid}, uri={redact(self.uri)!r})"


def start_subprocess(
    python: str | None = None,
    *,
    port: int = 0,
    path: str | None = None,
    auth: tuple[str, str] | None = None,
    standalone: bool = False,
    sharded: bool = False,
    strict: bool = True,
    search: bool = False,
    search_delay: float | None = None,
    search_lag: float | None = None,
    test_commands: bool = False,
    seed: Iterable[str | Seed] | str = (),
    timeout: float | None = None,
) -> DevServerProcess:
    """Start ``python -m migronaut.devserver`` and wait (up to ``timeout`` s) for its URI line.

    ``python`` defaults to :func:`default_python`. That interpreter must have
    ``migronaut[embedded]`` installed. Raises :class:`ConfigInvalidError` when the server refuses
    its options or its interpreter, :class:`ConnectionFailedError` when it fails otherwise or does
    not print its URI in time. ``search``/``search_delay``/``search_lag``: Atlas Search index
    commands served; ``test_commands``: the ``failCommand`` failpoint; ``seed``: collections
    filled before the URI is printed, ``"DB.COLLECTION:N"`` values checked here before anything
    starts (see :func:`serve`). ``timeout`` defaults to :data:`START_TIMEOUT` s plus
    :data:`SEED_TIMEOUT_PER_DOCUMENT` s per document seeded (100 times that with ``path``).
    """
    seeds = parse_seeds(seed, path=path)
    if timeout is None:
        per_document = SEED_TIMEOUT_PER_DOCUMENT * (1 if path is None else 100)
        timeout = START_TIMEOUT + per_document * sum(one.count for one in seeds)
    interpreter = python or default_python()
    argv = [interpreter, "-m", "migronaut.devserver", "--port", str(port)]
    if path is not None:
        argv += ["--path", str(path)]
    if standalone:
        argv.append("--standalone")
    if sharded:
        argv.append("--sharded")
    if not strict:
        argv.append("--no-strict")
    if search:
        argv.append("--search")
    if search_delay is not None:
        argv += ["--search-delay", repr(float(search_delay))]
    if search_lag is not None:
        argv += ["--search-lag", repr(float(search_lag))]
    if test_commands:
        argv.append("--enable-test-commands")
    for one in seeds:
        argv += ["--seed", str(one)]
    shown = list(argv)  # for error messages: the password masked
    if auth is not None:
        argv += ["--auth", f"{auth[0]}:{auth[1]}"]
        shown += ["--auth", f"{auth[0]}:{MASK}"]
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by the DevServerProcess
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr
        )
    except OSError as error:
        stderr.close()
        raise ConfigInvalidError(
            f"cannot run the dev server interpreter {interpreter!r}: {error.strerror or error}",
            {"python": interpreter},
        ) from error
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=_drain, args=(process.stdout, lines), name="devserver-stdout", daemon=True
    ).start()
    timed_out = False
    try:
        first = lines.get(timeout=timeout)
    except queue.Empty:
        first, timed_out = "", True
    server = DevServerProcess(process, "", stderr)
    uri = first.strip()
    if not uri.startswith("mongodb://"):
        if not timed_out:  # stdout ended or was not a URI: let the process finish on its own
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5.0)
        server.stop(timeout=5.0)
        if timed_out:
            fallback = f"no URI line within {timeout:g} s"
        elif uri:
            fallback = f"it printed {redact(uri)!r} instead of its URI"
        else:
            fallback = f"it exited with code {process.returncode}"
        detail = _last_line(server.read_stderr()).removeprefix("error: ") or fallback
        stderr.close()
        refused = not timed_out and process.returncode == EXIT_CODES[ConfigInvalidError.code]
        error_type = ConfigInvalidError if refused else ConnectionFailedError
        raise error_type(f"dev server did not start: {detail}", {"argv": " ".join(shown)})
    if auth is not None:
        try:
            uri = _with_password(uri, *auth)
        except MigronautError:
            server.close()
            raise
    server.uri = uri
    return server


def _drain(stream: IO[bytes], lines: queue.Queue[str]) -> None:
    """Hand the first stdout line to ``lines`` and discard the rest, so the pipe never fills."""
    first = True
    for raw in stream:
        if first:
            lines.put(raw.decode("utf-8", "replace"))
            first = False
    if first:
        lines.put("")  # EOF before any line: the process ended


def _last_line(text: str) -> str:
    stripped = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return stripped[-1] if stripped else ""


def _with_password(uri: str, user: str, password: str) -> str:
    """Put ``password`` back into a URI whose userinfo password was redacted."""
    userinfo = re.compile(r"^(?P<scheme>mongodb://)(?P<user>[^:/@]*):[^@/]*@")
    if not userinfo.match(uri):
        raise ConnectionFailedError(
            "dev server printed a URI without credentials although --auth was given",
            {"uri": redact(uri)},
        )
    return userinfo.sub(
        lambda m: f"{m['scheme']}{quote_plus(user)}:{quote_plus(password)}@", uri, count=1
    )
