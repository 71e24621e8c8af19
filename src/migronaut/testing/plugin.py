"""The pytest plugin: fixtures giving each test a database with the project's migrations applied.

Loaded by pytest only — through the ``pytest11`` entry point ``migronaut`` when migronaut is
installed, or with ``-p migronaut.testing.plugin`` / ``pytest_plugins`` — so pytest is never a
runtime dependency of migronaut. It is inert until a test asks for one of its fixtures: importing
it imports pytest and :mod:`migronaut.errors`, nothing else, and no server starts.

Fixtures (the user guide is <https://migronaut.readthedocs.io/en/latest/testing/>):

* ``migronaut_uri`` (session): ``--migronaut-uri``, else ``MIGRONAUT_TEST_URI``, else an
  embedded dev server started for the session. Never the project's own ``MIGRONAUT_URI``.
* ``migronaut_client`` (session): a pymongo ``MongoClient`` on that server, shared by every
  fixture.
* ``migronaut_config`` (session): the project's :class:`~migronaut.Config` aimed at the test
  server (``db_name`` is ``None``); override it in a ``conftest.py`` to change settings for the
  tests.
* ``migronaut_migrator``: a :class:`~migronaut.Migrator` on a fresh, uniquely named database,
  nothing applied; the database is dropped after the test.
* ``migronaut_db``: a pymongo ``Database`` with every migration applied: by default
  ``migronaut_migrator``'s database (per test); with the ini option ``migronaut_db_scope`` one
  database shared by the tests of a class, module, package or the session.

Options: ``--migronaut-uri``; ``--migronaut-config-file`` / ini ``migronaut_config_file``;
``--migronaut-migrations-dir`` / ini ``migronaut_migrations_dir``; ini ``migronaut_db_scope``;
ini ``migronaut_template`` (migrate a template database once per session and copy it into each
``migronaut_db`` instead of migrating each one).

Problems a user can fix (no server, bad config, missing migrations directory, a failing
migration) fail the tests that use the fixtures with a message naming the fix, without
migronaut's internal traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, cast

import pytest

from migronaut.errors import MigronautError

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.database import Database

    from migronaut.api import Migrator
    from migronaut.core.config import Config

#: Points the fixtures at an existing MongoDB instead of the embedded dev server.
TEST_URI_VARIABLE: Final = "MIGRONAUT_TEST_URI"
#: The names this module can be registered under: its entry point's, and its own.
_ENTRY_POINT: Final = "migronaut"
_TEST_DB_PREFIX: Final = "migronaut_test_"
_TEMPLATE_DB_PREFIX: Final = "migronaut_template_"
_ScopeName = Literal["session", "package", "module", "class", "function"]
_SCOPES: Final = ("function", "class", "module", "package", "session")


# ---------------------------------------------------------------------------- registration


class _Alias:
    """Holds this module's other name in pytest's plugin registry (it has no hooks)."""

    def __repr__(self) -> str:
        return f"<alias of {__name__}>"


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    """Make a second registration of this module harmless.

    pytest refuses to register one module under two names, and this module has two: the entry
    point's (``migronaut``, autoloaded when migronaut is installed, or ``-p migronaut``) and its
    own (``-p migronaut.testing.plugin`` or ``pytest_plugins``). Whichever comes first takes the
    other name with a hook-less placeholder, so pytest sees that name as loaded and skips it.
    """
    if plugin is not sys.modules[__name__]:
        return
    registered_as = manager.get_name(plugin)
    for alias in (_ENTRY_POINT, __name__):
        if alias != registered_as and manager.get_plugin(alias) is None:
            manager.register(_Alias(), name=alias)  # a blocked name (-p no:…) stays blocked


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("migronaut", "migronaut database fixtures")
    group.addoption(
        "--migronaut-uri",
        dest="migronaut_uri",
        metavar="URI",
        help=f"MongoDB server for the migronaut fixtures (default: ${TEST_URI_VARIABLE}, "
        "else an embedded dev server)",
    )
    group.addoption(
        "--migronaut-config-file",
        dest="migronaut_config_file",
        metavar="PATH",
        help="the project's migronaut config file (default: ini migronaut_config_file, else "
        "migronaut.toml / migronaut_config.py / pyproject.toml in the rootdir)",
    )
    group.addoption(
        "--migronaut-migrations-dir",
        dest="migronaut_migrations_dir",
        metavar="DIR",
        help="migrations directory (default: ini migronaut_migrations_dir, else the config's)",
    )
    parser.addini("migronaut_config_file", "migronaut config file, relative to the rootdir")
    parser.addini("migronaut_migrations_dir", "migrations directory, relative to the rootdir")
    parser.addini(
        "migronaut_db_scope",
        "scope of migronaut_db: function (default: a database per test), class, module, "
        "package or session (shared by those tests)",
        default="function",
    )
    parser.addini(
        "migronaut_template",
        "migrate a template database once per session and copy it into each migronaut_db",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    """Refuse a bad ``migronaut_db_scope`` up front, as a usage error naming the option."""
    value = str(config.getini("migronaut_db_scope")).strip()
    if value not in _SCOPES:
        raise pytest.UsageError(
            f"migronaut: ini option migronaut_db_scope must be one of {', '.join(_SCOPES)} "
            f"(got {value!r})"
        )


def _db_scope(fixture_name: str, config: pytest.Config) -> _ScopeName:
    return cast(_ScopeName, str(config.getini("migronaut_db_scope")).strip())


def _setting(config: pytest.Config, name: str) -> tuple[str | None, str]:
    """A path setting's value (the command line wins over the ini file) and where to set it."""
    flag = "--" + name.replace("_", "-")
    value = config.getoption(name)
    if value:
        return str(value), flag
    ini = config.getini(name)
    return (str(ini) if ini else None), f"{flag} or ini {name}"


def _fail(message: str) -> NoReturn:
    """Fail the test with one readable line: no traceback, no chained exception."""
    raise pytest.fail.Exception(f"migronaut: {message}", pytrace=False) from None


def _user_traceback(error: BaseException) -> str:
    """``error``'s traceback without migronaut's own frames: the lines of the migration file."""
    import traceback

    package = str(Path(__file__).resolve().parents[1]) + os.sep
    shown = traceback.TracebackException.from_exception(error)
    shown.stack = traceback.StackSummary.from_list(
        [frame for frame in shown.stack if not frame.filename.startswith(package)]
    )
    return "".join(shown.format())


# -------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def migronaut_uri(pytestconfig: pytest.Config) -> Iterator[str]:
    """The test server: ``--migronaut-uri``, ``$MIGRONAUT_TEST_URI``, or a session dev server."""
    configured = pytestconfig.getoption("migronaut_uri") or os.environ.get(TEST_URI_VARIABLE)
    if configured and configured.strip():
        yield configured.strip()
        return
    from migronaut.devserver import start_subprocess

    try:
        server = start_subprocess()
    except MigronautError as error:
        _fail(
            f"no MongoDB server for the tests: set {TEST_URI_VARIABLE} (or --migronaut-uri) to "
            f"a test server, or make the embedded dev server available — {error.message}"
        )
    with server:
        yield server.uri


@pytest.fixture(scope="session")
def migronaut_client(migronaut_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo client on the test server (pinged once, so a wrong URI fails clearly)."""
    import pymongo
    from pymongo.errors import PyMongoError

    from migronaut._redact import redact
    from migronaut.errors import describe_exception

    query = migronaut_uri.partition("?")[2].lower()  # the URI's own timeout wins
    options: dict[str, Any] = (
        {} if "serverselectiontimeoutms=" in query else {"serverSelectionTimeoutMS": 10_000}
    )
    try:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            migronaut_uri, **options
        )
        client.admin.command("ping")
    except (PyMongoError, ValueError, TypeError) as error:
        reason = describe_exception(error).split(", Topology Description:")[0]
        _fail(f"cannot reach the test server {redact(migronaut_uri)}: {reason}")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def migronaut_config(
    pytestconfig: pytest.Config, migronaut_uri: str, migronaut_client: MongoClient[dict[str, Any]]
) -> Config:
    """The project's migronaut config, aimed at the test server; ``db_name`` is set per test."""
    from migronaut.testing._project import load_project_config

    config_file, _ = _setting(pytestconfig, "migronaut_config_file")
    migrations_dir, where = _setting(pytestconfig, "migronaut_migrations_dir")
    try:
        return load_project_config(
            pytestconfig.rootpath,
            uri=migronaut_uri,
            client=migronaut_client,
            config_file=config_file,
            migrations_dir=migrations_dir,
            migrations_dir_option=where,
        )
    except MigronautError as error:
        _fail(error.message)


@pytest.fixture
def migronaut_migrator(
    migronaut_config: Config, migronaut_client: MongoClient[dict[str, Any]]
) -> Iterator[Migrator]:
    """A ``Migrator`` on a fresh database of this test (nothing applied; dropped afterwards)."""
    with _fresh_database(migronaut_config, migronaut_client, _TEST_DB_PREFIX) as migrator:
        yield migrator


@pytest.fixture(scope=_db_scope)
def migronaut_db(
    request: pytest.FixtureRequest,
    migronaut_config: Config,
    migronaut_client: MongoClient[dict[str, Any]],
) -> Iterator[Database[dict[str, Any]]]:
    """A database with every migration applied: this test's own (``migronaut_migrator``'s), or
    shared by the tests of the ``migronaut_db_scope`` ini option."""
    if request.scope == "function":
        migrator: Migrator = request.getfixturevalue("migronaut_migrator")
        _apply_migrations(request, migrator, migronaut_client)
        yield migrator.db
        return
    with _fresh_database(migronaut_config, migronaut_client, _TEST_DB_PREFIX) as migrator:
        _apply_migrations(request, migrator, migronaut_client)
        yield migrator.db


@pytest.fixture(scope="session")
def _migronaut_template(
    migronaut_config: Config, migronaut_client: MongoClient[dict[str, Any]]
) -> Iterator[str]:
    """The name of a database migrated once for the session (ini ``migronaut_template``)."""
    with _fresh_database(migronaut_config, migronaut_client, _TEMPLATE_DB_PREFIX) as migrator:
        _migrate(migrator)
        migrator.close()  # the tests only read it, through copy_database
        yield str(migrator.config.db_name)


@contextmanager
def _fresh_database(
    config: Config, client: MongoClient[dict[str, Any]], prefix: str
) -> Iterator[Migrator]:
    """A ``Migrator`` on a new, uniquely named database, dropped on exit."""
    import dataclasses

    from migronaut.api import Migrator
    from migronaut.testing._databases import unique_name

    name = unique_name(prefix)
    migrator = Migrator(dataclasses.replace(config, db_name=name))
    try:
        yield migrator
    finally:
        migrator.close()
        client.drop_database(name)


def _apply_migrations(
    request: pytest.FixtureRequest, migrator: Migrator, client: MongoClient[dict[str, Any]]
) -> None:
    """Every migration, by running them or (ini ``migronaut_template``) by copying a template."""
    if request.config.getini("migronaut_template"):
        from migronaut.testing._databases import copy_database

        template: str = request.getfixturevalue("_migronaut_template")
        # before the migrator connects: connecting creates the changelog that the copy brings
        copy_database(client, template, str(migrator.config.db_name))
    else:
        _migrate(migrator)


def _migrate(migrator: Migrator) -> None:
    """``up``; a failure is reported as its message and the migration's own traceback only."""
    try:
        migrator.up()
        return
    except MigronautError as error:
        shown = _user_traceback(error.__cause__) if error.__cause__ is not None else ""
        message = f"could not apply the migrations: {error.message}\n\n{shown}".rstrip()
    _fail(message)  # outside the except block: no "during handling…" chain in the report
