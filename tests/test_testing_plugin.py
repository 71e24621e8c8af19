"""The ``migronaut.testing`` pytest plugin, run by pytester on a small user project.

Each test writes a user project (``migronaut.toml``, three migrations — one with a ``down`` that
restores nothing —, a ``pytest.ini`` and test files using the fixtures), runs pytest on it in a
subprocess with ``-p migronaut.testing.plugin`` and checks what the user sees. The inner runs use
this session's server (``MIGRONAUT_TEST_URI``), so no second dev server starts, except in the one
test of the dev-server fallback.

The project's own ``MIGRONAUT_URI``/``MIGRONAUT_DB`` point at a "production" server that does not
exist, so any fixture that reached for them would fail.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers.testing_project import INDEX, NORMALISE, SPLIT, USERS, write_migrations

pytest_plugins = ["pytester"]

PRODUCTION_URI = "mongodb://production.invalid:27017/?serverSelectionTimeoutMS=200"
PLUGIN = ("-p", "migronaut.testing.plugin")
#: Inner test modules import these names.
HEADER = f"""
from pathlib import Path

from migronaut.testing import assert_all_reversible, assert_reversible, migrate_before, snapshot

INDEX, SPLIT, NORMALISE = {INDEX!r}, {SPLIT!r}, {NORMALISE!r}
USERS = {USERS!r}


def seed(db):
    db.users.insert_many([dict(user) for user in USERS])


def record(db):
    '''Note a database name for the outer test, which checks it is dropped afterwards.'''
    with open(Path(__file__).parent / "databases.txt", "a") as names:
        names.write(db.name + "\\n")
"""


@pytest.fixture
def user_project(pytester: pytest.Pytester, mongo_uri: str, monkeypatch: pytest.MonkeyPatch
                 ) -> pytest.Pytester:
    """A user project in ``pytester.path``, its tests pointed at this session's server."""
    write_migrations(pytester.path / "migrations")
    pytester.makefile(".toml", migronaut='db_name = "production"\nmigrations_dir = "migrations"\n')
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv("MIGRONAUT_TEST_URI", mongo_uri)
    monkeypatch.setenv("MIGRONAUT_URI", PRODUCTION_URI)
    monkeypatch.setenv("MIGRONAUT_DB", "production")
    return pytester


def write_tests(pytester: pytest.Pytester, body: str, name: str = "test_user") -> None:
    pytester.makepyfile(**{name: HEADER + textwrap.dedent(body)})


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args, timeout=180)


def recorded_databases(pytester: pytest.Pytester) -> list[str]:
    return (pytester.path / "databases.txt").read_text().split()


def assert_dropped(client: Any, names: list[str]) -> None:
    assert names, "the inner tests recorded no database"
    left = set(names) & set(client.list_database_names())
    assert not left, f"test databases left behind: {sorted(left)}"


# ----------------------------------------------------------------------------- fixtures


def test_migronaut_db_is_a_fresh_database_per_test_with_every_migration_applied(
    user_project: pytest.Pytester, client: Any
) -> None:
    write_tests(user_project, """
        def test_migrated(migronaut_db, migronaut_migrator):
            record(migronaut_db)
            assert migronaut_db.name.startswith("migronaut_test_")
            assert migronaut_migrator.db.name == migronaut_db.name
            assert migronaut_db.users.index_information()["email_unique"]["unique"] is True
            assert migronaut_db.settings.find_one() == {"_id": "theme", "value": "dark"}
            assert [(r.file, r.status) for r in migronaut_migrator.status()] == [
                (INDEX, "applied"), (SPLIT, "applied"), (NORMALISE, "applied")]
            migronaut_db.users.insert_one({"_id": 1, "email": "a@example.com"})

        def test_isolated_from_the_previous_test(migronaut_db):
            record(migronaut_db)
            assert migronaut_db.users.count_documents({}) == 0

        def test_the_migrator_alone_has_nothing_applied(migronaut_migrator):
            record(migronaut_migrator.db)
            assert [r.file for r in migronaut_migrator.pending()] == [INDEX, SPLIT, NORMALISE]
            assert "users" not in migronaut_migrator.db.list_collection_names()

        def test_the_config_is_the_projects_aimed_at_the_test_server(
            migronaut_config, migronaut_uri, migronaut_client
        ):
            assert "production" not in migronaut_uri
            assert migronaut_config.uri == migronaut_uri
            assert migronaut_config.client is migronaut_client
            assert migronaut_config.db_name is None
            assert migronaut_config.migrations_path == (Path.cwd() / "migrations").resolve()
    """)
    result = run(user_project)
    result.assert_outcomes(passed=4)
    names = recorded_databases(user_project)
    assert len(set(names)) == 3
    assert_dropped(client, names)
    assert "production" not in client.list_database_names()


def test_the_project_config_file_applies_but_never_its_server(
    user_project: pytest.Pytester
) -> None:
    """Hooks and collection names come from the project; uri, db_name and client never do."""
    (user_project.path / "migronaut.toml").unlink()
    user_project.makeini("[pytest]\nmigronaut_config_file = settings/migronaut_config.py\n")
    (user_project.path / "settings").mkdir()
    (user_project.path / "settings" / "migronaut_config.py").write_text(textwrap.dedent(f"""
        from pymongo import MongoClient


        def after_each(name, duration_ms, ctx, info):
            ctx.db.hook_calls.insert_one({{"migration": name}})


        def config():
            return {{
                "uri": {PRODUCTION_URI!r},
                "db_name": "production",
                "client": MongoClient({PRODUCTION_URI!r}, connect=False),
                "migrations_collection": "changelog",
                "hooks": {{"after_each": after_each}},
            }}
    """))
    write_tests(user_project, """
        def test_project_settings(migronaut_db, migronaut_client):
            assert migronaut_db.client is migronaut_client
            assert [c["migration"] for c in migronaut_db.hook_calls.find()] == [
                INDEX, SPLIT, NORMALISE]
            assert migronaut_db.changelog.count_documents({"status": "applied"}) == 3
            assert "hook_calls" in snapshot(migronaut_db).collections
    """)
    run(user_project).assert_outcomes(passed=1)


def test_the_plugin_is_inert_for_tests_that_do_not_use_it(
    user_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No server, no config read, no pymongo import: even with no server and no migrations."""
    monkeypatch.delenv("MIGRONAUT_TEST_URI")
    monkeypatch.setenv("MIGRONAUT_DEVSERVER_PYTHON", "/nonexistent/python")
    (user_project.path / "migronaut.toml").write_text('migrations_dir = "nowhere"\n')
    user_project.makepyfile(test_plain="""
        import sys

        def test_plain(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("migronaut.testing.plugin")
            loaded = {name for name in sys.modules if name.startswith(("migronaut", "pymongo"))}
            assert loaded <= {"migronaut", "migronaut._redact", "migronaut._version",
                              "migronaut.errors", "migronaut.testing",
                              "migronaut.testing.plugin"}, loaded
    """)
    run(user_project).assert_outcomes(passed=1)


# ------------------------------------------------------------------------- reversibility


def test_reversibility_helpers_pass_and_a_down_that_restores_nothing_fails_readably(
    user_project: pytest.Pytester
) -> None:
    write_tests(user_project, """
        def test_index_is_reversible(migronaut_migrator):
            assert_reversible(migronaut_migrator, INDEX)

        def test_split_is_reversible(migronaut_migrator):
            assert_reversible(migronaut_migrator, SPLIT, seed=seed)

        def test_split_against_seeded_data(migronaut_migrator):
            migrate_before(migronaut_migrator, SPLIT)
            seed(migronaut_migrator.db)
            migronaut_migrator.up(SPLIT)
            assert migronaut_migrator.db.users.find_one({"_id": 2}) == {
                "_id": 2, "email": "plato@example.com", "first": "Plato", "last": ""}

        def test_all_but_the_one_way_migration(migronaut_migrator):
            assert_all_reversible(migronaut_migrator, seeds={SPLIT: seed}, skip=[NORMALISE])

        def test_normalise_is_reversible(migronaut_migrator):
            assert_reversible(migronaut_migrator, NORMALISE, seed=seed)
    """)
    result = run(user_project)
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_normalise_is_reversible _*",
        "*assert_reversible(migronaut_migrator, NORMALISE, seed=seed)",
        f"E*AssertionError: {NORMALISE} is not reversible: down did not restore the data up "
        "changed",
        "E*collection 'users': documents differ (1 changed, of 2)",
        "E*first difference, _id 1:",
        "E*before up : {'_id': 1, 'name': 'Ada Lovelace', 'email': 'Ada@Example.COM'}",
        "E*after down: {'_id': 1, 'name': 'Ada Lovelace', 'email': 'ada@example.com'}",
        "E*fields: 'email' changed",
    ])
    assert "reversible.py" not in result.stdout.str()  # the helpers' frames are hidden


def test_the_readme_example_runs_as_written(user_project: pytest.Pytester) -> None:
    """The README's testing example is self-contained: copied into a test file of a project
    with that migration, it passes (and it fails once the migration's down restores nothing)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", readme, re.MULTILINE | re.DOTALL)
    (example,) = [block for block in blocks if "assert_reversible(" in block]
    user_project.makepyfile(test_readme=example)
    run(user_project).assert_outcomes(passed=1)

    split = user_project.path / "migrations" / SPLIT
    split.write_text(split.read_text("utf-8").split("def down(ctx):")[0]
                     + "def down(ctx):\n    pass\n", "utf-8")
    result = run(user_project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E*AssertionError: {SPLIT} is not reversible*"])


# ------------------------------------------------------------------------ scope, template


def test_the_template_gives_each_test_an_exact_copy_of_a_migrated_database(
    user_project: pytest.Pytester, client: Any
) -> None:
    user_project.makeini("[pytest]\nmigronaut_template = true\n")
    write_tests(user_project, """
        def test_copy(migronaut_db, migronaut_migrator, migronaut_client, request):
            template = request.getfixturevalue("_migronaut_template")
            record(migronaut_db)
            record(migronaut_client[template])
            assert migronaut_db.name != template
            assert snapshot(migronaut_db) == snapshot(migronaut_client[template])
            assert migronaut_db.users.index_information()["email_unique"]["unique"] is True
            assert migronaut_migrator.pending() == []
            assert [r.status for r in migronaut_migrator.status()] == ["applied"] * 3
            migronaut_db.users.insert_one({"_id": 1, "email": "a@example.com"})

        def test_another_copy(migronaut_db, migronaut_migrator):
            record(migronaut_db)
            assert migronaut_db.users.count_documents({}) == 0
            migronaut_migrator.down()  # the copied changelog is a real one
            assert len(migronaut_migrator.pending()) == 3
    """)
    run(user_project).assert_outcomes(passed=2)
    names = recorded_databases(user_project)
    assert len(set(names)) == 3  # two copies and the template
    assert_dropped(client, names)


def test_a_wider_scope_shares_one_migrated_database(
    user_project: pytest.Pytester, client: Any
) -> None:
    user_project.makeini("[pytest]\nmigronaut_db_scope = module\n")
    write_tests(user_project, """
        def test_writes(migronaut_db):
            record(migronaut_db)
            migronaut_db.users.insert_one({"_id": 1, "email": "a@example.com"})

        def test_sees_the_write(migronaut_db):
            record(migronaut_db)
            assert migronaut_db.users.count_documents({}) == 1

        def test_the_migrator_keeps_its_own_database(migronaut_db, migronaut_migrator):
            record(migronaut_migrator.db)
            assert migronaut_migrator.db.name != migronaut_db.name
            assert len(migronaut_migrator.pending()) == 3
    """)
    write_tests(user_project, """
        def test_other_module(migronaut_db):
            record(migronaut_db)
            assert migronaut_db.users.count_documents({}) == 0
    """, name="test_other")
    run(user_project).assert_outcomes(passed=4)
    names = recorded_databases(user_project)
    assert len(set(names)) == 3  # one per module, one for the migrator
    assert_dropped(client, names)


# ------------------------------------------------------------------------------ bad input

NO_SERVER = {"MIGRONAUT_TEST_URI": None, "MIGRONAUT_DEVSERVER_PYTHON": "/nonexistent/python"}
#: case -> (files to write, environment changes, pytest arguments, the line the user sees)
BAD_INPUT: dict[str, tuple[dict[str, str], dict[str, str | None], tuple[str, ...], str]] = {
    "missing migrations directory": (
        {"migronaut.toml": 'migrations_dir = "db/migrations"\n'}, {}, (),
        "migronaut: migrations directory not found: */db/migrations (migrations_dir from "
        "migronaut.toml or MIGRONAUT_MIGRATIONS_DIR) — point --migronaut-migrations-dir or ini "
        "migronaut_migrations_dir or migrations_dir in the migronaut config at your migrations",
    ),
    "missing migrations directory from the ini file": (
        {"pytest.ini": "[pytest]\nmigronaut_migrations_dir = elsewhere\n"}, {}, (),
        "migronaut: migrations directory not found: */elsewhere (set by "
        "--migronaut-migrations-dir or ini migronaut_migrations_dir)*",
    ),
    "missing config file": (
        {}, {}, ("--migronaut-config-file", "conf/migronaut.toml"),
        "migronaut: Config file not found: conf/migronaut.toml",
    ),
    "unknown config key": (
        {"migronaut.toml": 'migrations_dri = "migrations"\n'}, {}, (),
        "migronaut: Invalid configuration: migrations_dri (migronaut.toml): unknown config key "
        "(did you mean 'migrations_dir'?)",
    ),
    "unreachable server": (
        {}, {},
        ("--migronaut-uri", "mongodb://tester:s3cret@127.0.0.1:9/?serverSelectionTimeoutMS=300"),
        "migronaut: cannot reach the test server mongodb://tester:****@127.0.0.1:9/"
        "?serverSelectionTimeoutMS=300: ServerSelectionTimeoutError: *",
    ),
    "no server and no dev server": (
        {}, NO_SERVER, (),
        "migronaut: no MongoDB server for the tests: set MIGRONAUT_TEST_URI (or "
        "--migronaut-uri) to a test server, or make the embedded dev server available — "
        "cannot run the dev server interpreter '/nonexistent/python': *",
    ),
    "a failing migration": (
        {"migrations/20260104000000_broken.py": "def up(ctx):\n    1 / 0\n\n\n"
                                                "def down(ctx):\n    pass\n"}, {}, (),
        "migronaut: could not apply the migrations: Migration up failed: "
        "20260104000000_broken.py, line 2: ZeroDivisionError: division by zero",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_fails_the_tests_using_the_fixtures_with_one_readable_line(
    user_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, client: Any, case: str
) -> None:
    files, env, args, expected = BAD_INPUT[case]
    for relative, text in files.items():
        (user_project.path / relative).write_text(text)
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    before = set(client.list_database_names())
    write_tests(user_project, """
        def test_uses_the_database(migronaut_db):
            record(migronaut_db)

        def test_does_not(tmp_path):
            assert tmp_path.is_dir()
    """)
    result = run(user_project, *args)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*_ ERROR at setup of test_uses_the_database _*", expected])
    output = result.stdout.str()
    assert "s3cret" not in output
    assert "migronaut/api.py\", line" not in output and "migronaut/core" not in output
    if case == "a failing migration":  # the user's own frame, and only that one
        result.stdout.fnmatch_lines(['*20260104000000_broken.py", line 2, in up', "*1 / 0"])
    else:
        assert "Traceback" not in output
    assert set(client.list_database_names()) <= before  # the failed test database is dropped


def test_a_bad_db_scope_is_a_usage_error(user_project: pytest.Pytester) -> None:
    user_project.makeini("[pytest]\nmigronaut_db_scope = weekly\n")
    write_tests(user_project, "def test_nothing():\n    pass\n")
    result = run(user_project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: migronaut: ini option migronaut_db_scope must be one of function, class, "
        "module, package, session (got 'weekly')",
    ])


# ------------------------------------------------------------------------------ loading


ENTRY_POINT = "[pytest11]\nmigronaut = migronaut.testing.plugin\n"


@pytest.mark.parametrize(
    "load",
    ["entry point only", "entry point and -p", "entry point and pytest_plugins",
     "entry point, -p and -p migronaut"],
)
def test_loading_the_plugin_twice_is_harmless(
    user_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, load: str
) -> None:
    """As in CI, where migronaut is installed (its entry point autoloads the plugin) and a
    project also names the module; the entry point is simulated by a dist-info on the path."""
    dist = user_project.path / "site" / "migronaut_entry_point-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: migronaut-entry-point\n"
                                   "Version: 0.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(dist.parent),
                                                      os.environ.get("PYTHONPATH", "")]))
    args: tuple[str, ...] = {
        "entry point only": (),
        "entry point and -p": PLUGIN,
        "entry point and pytest_plugins": (),
        "entry point, -p and -p migronaut": (*PLUGIN, "-p", "migronaut"),
    }[load]
    if load == "entry point and pytest_plugins":
        user_project.makeconftest('pytest_plugins = ["migronaut.testing.plugin"]\n')
    write_tests(user_project, """
        def test_fixtures_available(migronaut_uri, pytestconfig):
            assert migronaut_uri.startswith("mongodb://")
            plugins = pytestconfig.pluginmanager
            assert plugins.has_plugin("migronaut")
            assert plugins.has_plugin("migronaut.testing.plugin")
    """)
    result = user_project.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=180)
    result.assert_outcomes(passed=1)


# ---------------------------------------------------------------------------- dev server


@pytest.mark.slow
def test_without_a_test_uri_the_session_starts_a_dev_server(
    user_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mongo_uri: str
) -> None:
    monkeypatch.delenv("MIGRONAUT_TEST_URI")
    write_tests(user_project, f"""
        def test_on_the_dev_server(migronaut_db, migronaut_uri):
            assert migronaut_uri.startswith("mongodb://127.0.0.1:")
            assert migronaut_uri != {mongo_uri!r}
            assert migronaut_db.settings.count_documents({{}}) == 1
    """)
    run(user_project).assert_outcomes(passed=1)


def test_a_migration_in_doubt_surfaces_as_its_typed_error(user_project: pytest.Pytester) -> None:
    write_tests(user_project, """
        import datetime

        import pytest

        from migronaut import MigrationInDoubtError


        def test_in_doubt(migronaut_migrator):
            record(migronaut_migrator.db)
            migronaut_migrator.db["_migronaut_migrations"].insert_one({
                "name": NORMALISE, "status": "running",
                "intent": {"runId": "gone", "lockOwner": "gone", "host": "h", "pid": 1,
                           "startedAt": datetime.datetime.now(datetime.UTC)}})
            with pytest.raises(MigrationInDoubtError) as info:
                migrate_before(migronaut_migrator, NORMALISE)
            assert info.value.code == "MIGRATION_IN_DOUBT" and info.value.exit_code == 36
            assert info.value.context["name"] == NORMALISE
            with pytest.raises(MigrationInDoubtError):
                assert_reversible(migronaut_migrator, INDEX)
    """)
    result = run(user_project)
    result.assert_outcomes(passed=1)
