"""The test harness: one MongoDB-compatible server per session, a fresh database per test.

Where the server comes from:

* ``MIGRONAUT_TEST_URI`` set: that server (a real MongoDB replica set, typically) is used as is.
* otherwise the embedded dev server is started once per session in a subprocess
  (:func:`migronaut.devserver.start_subprocess`; ``MIGRONAUT_DEVSERVER_PYTHON`` picks its
  interpreter when the tests themselves do not run on Python 3.13 with mongoeco).

Fixtures:

``mongo_uri``, ``client``, ``server_hello`` (session)
    the URI, a pymongo ``MongoClient`` on it, and the server's ``hello`` reply.
``db_name``, ``db``
    a unique database name per test (``t_<12 hex>``) and its pymongo ``Database``; dropped after.
``sharded_uri``, ``sharded_client`` (session, started only when a test asks)
    a second dev server that answers like a mongos (``--sharded``) and a client on it; tests put
    shard metadata into its ``config`` database (``tests/helpers/sharding.py``).
``project``
    a project directory under ``tmp_path`` (:class:`Project`) wired to ``mongo_uri``/``db_name``.
``cli``
    runs ``migronaut.cli.main(argv)`` in-process in the project directory (:class:`CliResult`).
``cli_process``
    runs ``python -m migronaut`` as a real subprocess in the project directory; ``.start()``
    returns the ``Popen`` for race and kill tests.

Isolation: every test runs with the ``MIGRONAUT_*`` variables of the developer's environment
removed (only the harness's own :data:`HARNESS_VARIABLES` stay), so a real configuration never
leaks into a test; ``project`` then sets ``MIGRONAUT_URI``/``MIGRONAUT_DB`` to the test's values.

Markers (declared in ``pyproject.toml``): ``real_mongodb`` tests are skipped unless
``MIGRONAUT_TEST_URI`` is set; ``replica_set`` tests are skipped when ``hello`` has no ``setName``;
``sharded_cluster`` tests are skipped unless ``MIGRONAUT_TEST_URI`` is a real mongos;
``standalone`` tests (a server without change streams) are skipped on a replica set or a mongos.
CI names the server behind each job in ``MIGRONAUT_TEST_TOPOLOGY`` (:data:`MARKER_SERVERS`): a
test whose marker that server must serve fails instead of skipping, so no job passes by skipping
what it exists to run (``tests/test_workflows.py`` checks that every marker has such a job).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from helpers.wire_audit import AUDIT

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.database import Database

#: Points the suite at an existing server instead of starting the dev server.
TEST_URI_VARIABLE = "MIGRONAUT_TEST_URI"
#: Set by scripts/test.sh for its second interpreter: the ``one_interpreter`` and ``slow``
#: scenarios (real processes killed, restarted, raced) ran on the first; the rest runs on both.
SECOND_INTERPRETER_VARIABLE = "MIGRONAUT_TEST_SECOND_INTERPRETER"
#: Variables of the harness itself, kept when the developer's ``MIGRONAUT_*`` are stripped
#: (``MIGRONAUT_TEST_REQUIRE_TOOLS``: see ``helpers/tools.py``).
#: Set by CI: the server the job runs against (a key of :data:`TOPOLOGIES`).
TOPOLOGY_VARIABLE = "MIGRONAUT_TEST_TOPOLOGY"
HARNESS_VARIABLES = frozenset(
    {TEST_URI_VARIABLE, "MIGRONAUT_DEVSERVER_PYTHON", "MIGRONAUT_TEST_REQUIRE_TOOLS",
     SECOND_INTERPRETER_VARIABLE, TOPOLOGY_VARIABLE}
)
#: The markers that depend on the server, and the servers (``MIGRONAUT_TEST_TOPOLOGY`` values)
#: that run them: ``dev_server`` is the embedded dev server (no ``MIGRONAUT_TEST_URI``),
#: ``replica_set`` and ``sharded_cluster`` a real MongoDB of that topology.
MARKER_SERVERS: dict[str, frozenset[str]] = {
    "real_mongodb": frozenset({"replica_set", "sharded_cluster"}),
    "replica_set": frozenset({"replica_set"}),
    "sharded_cluster": frozenset({"sharded_cluster"}),
    "standalone": frozenset({"dev_server"}),
}
TOPOLOGIES = frozenset().union(*MARKER_SERVERS.values())

#: Environment overrides: a string sets the variable, ``None`` removes it.
EnvOverrides = Mapping[str, "str | None"]


# ------------------------------------------------------------------------------------ server


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    """``MIGRONAUT_TEST_URI``, or the URI of a dev server started for this session."""
    configured = os.environ.get(TEST_URI_VARIABLE, "").strip()
    if configured:
        yield configured
        return
    from migronaut.devserver import start_subprocess
    from migronaut.errors import MigronautError

    try:
        server = start_subprocess()
    except MigronautError as error:
        pytest.fail(
            f"cannot start the dev server: {error.message} "
            f"(or set {TEST_URI_VARIABLE} to a MongoDB URI)",
            pytrace=False,
        )
    with server:
        yield server.uri


def _session_client(uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo client for a session fixture: yielded, closed at the end of the session."""
    from pymongo import MongoClient

    mongo: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=15_000)
    try:
        yield mongo
    finally:
        mongo.close()


@pytest.fixture(scope="session")
def client(mongo_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo client on the session's server."""
    yield from _session_client(mongo_uri)


@pytest.fixture(scope="session")
def server_hello(client: MongoClient[dict[str, Any]]) -> dict[str, Any]:
    """The server's ``hello`` reply (``setName`` present only on a replica set)."""
    reply: dict[str, Any] = client.admin.command("hello")
    return reply


@pytest.fixture(scope="session")
def sharded_uri() -> Iterator[str]:
    """The URI of a dev server answering like a mongos, started the first time a test asks."""
    from migronaut.devserver import start_subprocess
    from migronaut.errors import MigronautError

    try:
        server = start_subprocess(sharded=True)
    except MigronautError as error:
        if os.environ.get(TEST_URI_VARIABLE, "").strip():  # a real server, maybe no mongoeco
            pytest.skip(f"cannot start the sharded dev server: {error.message}")
        pytest.fail(f"cannot start the sharded dev server: {error.message}", pytrace=False)
    with server:
        # without directConnection the driver discovers the mongos (a Sharded topology)
        yield server.uri.replace("directConnection=true", "directConnection=false")


@pytest.fixture(scope="session")
def sharded_client(sharded_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo client on the simulated mongos."""
    yield from _session_client(sharded_uri)


#: Seconds a search index build spends PENDING, then BUILDING, on the ``search_uri`` server.
SEARCH_DELAY = 0.2


@pytest.fixture(scope="session")
def search_uri() -> Iterator[str]:
    """The URI of a dev server in ``--search`` mode (Atlas's search-index commands, builds of
    ``2 * SEARCH_DELAY`` seconds), started the first time a test asks."""
    yield from search_server(search_delay=SEARCH_DELAY)


#: Seconds before the ``lagged_search_uri`` server lists a search-index create or update.
SEARCH_LAG = 0.6


def search_server(**options: Any) -> Iterator[str]:
    from migronaut.devserver import start_subprocess
    from migronaut.errors import MigronautError

    try:
        server = start_subprocess(search=True, **options)
    except MigronautError as error:
        if os.environ.get(TEST_URI_VARIABLE, "").strip():  # a real server, maybe no mongoeco
            pytest.skip(f"cannot start the search dev server: {error.message}")
        pytest.fail(f"cannot start the search dev server: {error.message}", pytrace=False)
    with server:
        yield server.uri


@pytest.fixture(scope="session")
def lagged_search_uri() -> Iterator[str]:
    """A ``--search`` dev server whose ``$listSearchIndexes`` shows a create or an update only
    ``SEARCH_LAG`` seconds later (``--search-lag``: Atlas's list is eventually consistent)."""
    yield from search_server(search_delay=SEARCH_DELAY, search_lag=SEARCH_LAG)


@pytest.fixture(scope="session")
def search_client(search_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo client on the ``--search`` dev server."""
    yield from _session_client(search_uri)


@pytest.fixture(scope="session")
def failpoint_uri() -> Iterator[str]:
    """A server that serves mongod's ``configureFailPoint`` ``failCommand``:
    ``MIGRONAUT_TEST_URI`` (a mongod started with ``enableTestCommands``; tests skip where it
    refuses the command — ``helpers/failpoints.py``), else a dev server started with
    ``--enable-test-commands``."""
    configured = os.environ.get(TEST_URI_VARIABLE, "").strip()
    if configured:
        yield configured
        return
    from migronaut.devserver import start_subprocess
    from migronaut.errors import MigronautError

    try:
        server = start_subprocess(test_commands=True)
    except MigronautError as error:
        pytest.fail(f"cannot start the failpoint dev server: {error.message}", pytrace=False)
    with server:
        yield server.uri


@pytest.fixture(scope="session")
def failpoint_client(failpoint_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo client on the ``failpoint_uri`` server."""
    yield from _session_client(failpoint_uri)


@pytest.fixture
def db_name(client: MongoClient[dict[str, Any]]) -> Iterator[str]:
    """A database name unique to this test; the database is dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    client.drop_database(name)


@pytest.fixture
def tenant_prefix(client: MongoClient[dict[str, Any]]) -> Iterator[str]:
    """A database-name prefix unique to this test (fleet tenants); every database under it is
    dropped after the test."""
    prefix = f"f{uuid.uuid4().hex[:8]}_"
    yield prefix
    for name in client.list_database_names():
        if name.startswith(prefix):
            client.drop_database(name)


@pytest.fixture
def db(client: MongoClient[dict[str, Any]], db_name: str) -> Database[dict[str, Any]]:
    """The test's database."""
    return client[db_name]


# ------------------------------------------------------------------------ isolation, markers


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove the developer's ``MIGRONAUT_*`` variables for the duration of each test."""
    for name in list(os.environ):
        if name.startswith("MIGRONAUT_") and name not in HARNESS_VARIABLES:
            monkeypatch.delenv(name)


def _unserved(marker: str, request: pytest.FixtureRequest) -> str | None:
    """Why the current server cannot serve a test marked ``marker``, or ``None`` when it can."""
    real = bool(os.environ.get(TEST_URI_VARIABLE, "").strip())
    if marker == "real_mongodb" and not real:
        return f"needs a real MongoDB: set {TEST_URI_VARIABLE} (the dev server is not one)"
    if marker == "sharded_cluster" and not real:
        return f"needs a real sharded cluster: set {TEST_URI_VARIABLE} to a mongos"
    hello: dict[str, Any] = request.getfixturevalue("server_hello")
    if marker == "replica_set" and not hello.get("setName"):
        return "needs a replica set: the server's hello reports no setName"
    if marker == "sharded_cluster" and hello.get("msg") != "isdbgrid":
        return f"needs a real sharded cluster: {TEST_URI_VARIABLE} is not a mongos"
    if marker == "standalone" and (hello.get("setName") or hello.get("msg") == "isdbgrid"):
        return "needs a server without change streams (the dev server, a standalone mongod)"
    return None


@pytest.fixture(autouse=True)
def _server_requirements(request: pytest.FixtureRequest) -> None:
    """Skip the tests of :data:`MARKER_SERVERS` the current server cannot serve — or fail them
    where ``MIGRONAUT_TEST_TOPOLOGY`` says this server exists to serve them."""
    topology = os.environ.get(TOPOLOGY_VARIABLE, "").strip()
    if topology and topology not in TOPOLOGIES:
        pytest.fail(f"{TOPOLOGY_VARIABLE}={topology!r} is none of {sorted(TOPOLOGIES)}",
                    pytrace=False)
    for marker, servers in MARKER_SERVERS.items():
        if not request.node.get_closest_marker(marker):
            continue
        reason = _unserved(marker, request)
        if reason is None:
            continue
        if topology in servers:
            pytest.fail(f"{reason} ({TOPOLOGY_VARIABLE}={topology} promises this server "
                        f"runs every {marker!r} test)", pytrace=False)
        pytest.skip(reason)


# ----------------------------------------------------------------------------------- project


@dataclass
class Project:
    """A migronaut project directory for one test, configured through the environment."""

    path: Path
    uri: str
    db_name: str
    migrations: Path = field(init=False)

    def __post_init__(self) -> None:
        self.migrations = self.path / "migrations"
        self.migrations.mkdir(parents=True, exist_ok=True)

    def write(self, relative: str, text: str) -> Path:
        """Write ``text`` (dedented) to a file under the project; returns its path."""
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text), encoding="utf-8")
        return target

    def write_migration(self, name: str, body: str) -> Path:
        """Write a migration module (``.py`` added when missing) into ``migrations/``."""
        file_name = name if name.endswith(".py") else f"{name}.py"
        return self.write(f"{self.migrations.name}/{file_name}", body)

    def env(self, **extra: str | None) -> dict[str, str]:
        """The environment of a CLI run in this project: the (isolated) process environment,
        ``MIGRONAUT_URI``/``MIGRONAUT_DB`` set to the test's values, then ``extra`` (``None``
        removes a variable)."""
        env = dict(os.environ)
        env["MIGRONAUT_URI"] = self.uri
        env["MIGRONAUT_DB"] = self.db_name
        _apply(env, extra)
        return env


def _apply(env: dict[str, str], overrides: EnvOverrides) -> None:
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


@pytest.fixture
def project(
    tmp_path: Path, mongo_uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> Project:
    """A project dir in ``tmp_path`` whose environment points at the test's database."""
    return project_on(tmp_path, mongo_uri, db_name, monkeypatch)


def project_on(
    tmp_path: Path, uri: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> Project:
    """A project dir in ``tmp_path`` whose environment points at ``uri``/``db_name`` (test
    modules on another server override the ``project`` fixture with it)."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.setenv("MIGRONAUT_URI", uri)
    monkeypatch.setenv("MIGRONAUT_DB", db_name)
    return Project(path=root, uri=uri, db_name=db_name)


# ------------------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class CliResult:
    """What one CLI run produced; ``json`` is the parsed stdout, or ``None`` when not JSON."""

    exit_code: int
    stdout: str
    stderr: str
    json: Any = None

    @classmethod
    def of(cls, exit_code: int, stdout: str, stderr: str) -> CliResult:
        try:
            parsed: Any = json.loads(stdout)
        except ValueError:
            parsed = None
        return cls(exit_code, stdout, stderr, parsed)


class CliRunner:
    """Runs ``migronaut.cli.main`` in-process with the project as working directory."""

    def __init__(self, project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
        self._project = project
        self._monkeypatch = monkeypatch

    def __call__(
        self, *args: str, input: str | None = None, env: EnvOverrides | None = None
    ) -> CliResult:
        from migronaut.cli import main

        stdout, stderr = io.StringIO(), io.StringIO()
        with self._monkeypatch.context() as patch:
            patch.chdir(self._project.path)
            for name, value in (env or {}).items():
                if value is None:
                    patch.delenv(name, raising=False)
                else:
                    patch.setenv(name, value)
            patch.setattr(sys, "stdin", io.StringIO(input or ""))
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    exit_code = main(list(args))
                except SystemExit as exit_:
                    raise AssertionError(
                        f"migronaut.cli.main called sys.exit({exit_.code!r}); "
                        "its contract is to return the exit code"
                    ) from exit_
        return CliResult.of(exit_code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture
def cli(project: Project, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """``cli(*args, input=None, env=None) -> CliResult``: the CLI in-process, in the project."""
    return CliRunner(project, monkeypatch)


class CliProcess:
    """Runs ``python -m migronaut`` as a subprocess in the project; kills leftovers at teardown."""

    def __init__(self, project: Project) -> None:
        self._project = project
        self._started: list[subprocess.Popen[str]] = []

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "migronaut", *args]

    def start(
        self, *args: str, env: EnvOverrides | None = None, input: str | None = None
    ) -> subprocess.Popen[str]:
        """Start the CLI without waiting; stdout/stderr are text pipes, stdin reads ``input``
        (empty when ``None``)."""
        with tempfile.TemporaryFile("w+", encoding="utf-8") as stdin:
            stdin.write(input or "")
            stdin.seek(0)
            process = subprocess.Popen(
                self.argv(*args),
                cwd=self._project.path,
                env=self._project.env(**(env or {})),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        self._started.append(process)
        return process

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        env: EnvOverrides | None = None,
        timeout: float = 120.0,
    ) -> CliResult:
        process = self.start(*args, env=env, input=input)
        return self.wait(process, timeout=timeout)

    def wait(self, process: subprocess.Popen[str], timeout: float = 120.0) -> CliResult:
        """Wait for a started process and collect its result (killed after ``timeout`` s)."""
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"migronaut did not finish within {timeout:g} s\nstdout:\n{stdout}\n"
                f"stderr:\n{stderr}"
            ) from None
        return CliResult.of(process.returncode, stdout, stderr)

    def close(self) -> None:
        for process in self._started:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(Exception):
                process.communicate(timeout=10)


@pytest.fixture
def cli_process(project: Project) -> Iterator[CliProcess]:
    """``cli_process(*args, input=None, env=None) -> CliResult`` through a real subprocess;
    ``cli_process.start(*args)`` returns the ``Popen`` and ``cli_process.wait(p)`` its result."""
    runner = CliProcess(project)
    try:
        yield runner
    finally:
        runner.close()


# -------------------------------------------------------------------------------- wire audit


#: Modules the second interpreter's pass skips: the dev server's own tests (it runs under Python
#: 3.13 in both passes), packaging (the same wheel), and the junk-for-every-option sweep (every
#: command's flags through click; the same refusals are also tested per command on both).
ONE_INTERPRETER_MODULES = frozenset({
    "test_devserver.py", "test_devserver_collmod.py", "test_devserver_search.py",
    "test_devserver_strict.py", "test_devserver_failpoints.py", "test_dev_server_modes.py",
    "test_devserver_internals.py", "test_packaging.py", "test_cli_junk.py",
    "test_dev_server_seed.py", "test_devserver_equivalence.py", "test_devserver_fast_paths.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under :data:`SECOND_INTERPRETER_VARIABLE`, skip the long scenarios (markers ``slow``,
    ``one_interpreter``) before any of their fixtures is set up."""
    if not os.environ.get(SECOND_INTERPRETER_VARIABLE):
        return
    skip = pytest.mark.skip(reason="a long real-process scenario: scripts/test.sh runs it on "
                            f"its first interpreter only ({SECOND_INTERPRETER_VARIABLE} is set)")
    for item in items:
        if (item.get_closest_marker("one_interpreter") or item.get_closest_marker("slow")
                or item.path.name in ONE_INTERPRETER_MODULES):
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    """Register the wire audit before any test creates a client (listeners registered later
    do not reach clients that already exist)."""
    from pymongo import monitoring

    monitoring.register(AUDIT)


@pytest.fixture(autouse=True)
def _wire_audit() -> Iterator[None]:
    """Fail the test whose code sent a command mongod refuses (``tests/helpers/wire_audit.py``)."""
    mark = AUDIT.mark()
    yield
    found = AUDIT.since(mark)
    if found:
        listed = "\n".join(f"  - {finding}" for finding in found[:20])
        pytest.fail(f"the wire audit refused {len(found)} command(s):\n{listed}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts = AUDIT.counts
    checked = ", ".join(f"{name} {counts[name]}" for name in
                        ("update", "findAndModify", "aggregate", "insert") if counts[name])
    terminalreporter.write_line(
        f"wire audit: {sum(counts.values())} commands checked ({checked}); "
        f"{len(AUDIT.findings)} refused"
    )


# ------------------------------------------------------------------------------ Celery


@pytest.fixture(scope="session")
def redis_db() -> Iterator[int]:
    """A Redis database number (1–15) of this test run's own (skips without Redis)."""
    from helpers.celery_worker import claimed_redis_db

    with claimed_redis_db() as number:
        yield number


@pytest.fixture
def celery_project(
    project: Project, redis_db: int, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """``project`` served through Celery on Redis: see :class:`helpers.celery_worker.CeleryProject`.

    The test's own queue names and broker are set as ``MIGRONAUT_CELERY_*`` variables (here and
    in every worker); the Redis database is emptied before and after the test; every worker
    started through it is killed at the end."""
    from helpers.celery_worker import CeleryProject, queue_names, redis_client

    redis_client(redis_db).flushdb()
    queue, background = queue_names()
    url = f"redis://127.0.0.1:6379/{redis_db}"
    celery = CeleryProject(project.path, project.env(), url, url, queue, background)
    for name, value in celery.env_variables().items():
        monkeypatch.setenv(name, value)
    try:
        yield celery
    finally:
        celery.kill_all()
        redis_client(redis_db).flushdb()
