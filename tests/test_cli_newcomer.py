"""A newcomer's first fifteen minutes through the CLI: every dead end says what to do next.

``init`` leaves a project every command runs in, an unknown command or key suggests the one
meant, an edited applied migration is said by a plain ``up``, a refused local connection points
at the dev server, a broken ``.env`` line is named, the status table shows descriptions and the
converge plan says what a validator change does.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pymongo import monitoring

from helpers.engine import make_migrator, write_simple
from helpers.markers import needs_embedded

# ------------------------------------------------------------------------------------- init


def test_init_makes_the_migrations_directory_and_every_command_runs_at_once(
    cli: Any, project: Any
) -> None:
    project.migrations.rmdir()
    result = cli("init", "--uri", project.uri, "--db", project.db_name, "--dir", "db/migrations")
    assert result.exit_code == 0, result.stderr
    assert (project.path / "db" / "migrations").is_dir()
    assert "✔ Created  db/migrations/" in result.stdout
    for step in ("migronaut create", "migronaut status", "migronaut up", "migronaut dev-server"):
        assert step in result.stdout
    status = cli("status")
    assert (status.exit_code, status.stdout) == (0, "No migrations found\n"), status.stderr
    up = cli("up")
    assert up.exit_code == 0 and "Nothing to migrate" in up.stdout, up.stderr
    assert cli("audit").exit_code in (0, 22)  # 22 only for a finding, never CONFIG_INVALID


def test_init_leaves_an_existing_directory_alone(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a")
    result = cli("init", "--uri", project.uri, "--db", project.db_name)
    assert result.exit_code == 0
    assert "Created  migrations/" not in result.stdout
    assert (project.migrations / "0001_a.py").is_file()


def test_a_missing_directory_says_how_to_create_it(cli: Any, project: Any) -> None:
    project.write("migronaut.toml", 'migrations_dir = "db/migrations"\n')
    result = cli("status")
    assert result.exit_code == 6
    line = result.stderr.strip()
    assert "(set by migronaut.toml)" in line
    assert "`migronaut create NAME` writes the first migration there" in line
    assert f"`mkdir -p {(project.path / 'db' / 'migrations').resolve()}`" in line
    assert cli("create", "first").exit_code == 0  # what the message says works
    assert cli("status").exit_code == 0


# --------------------------------------------------------------------------- unknown names


@pytest.mark.parametrize(("typed", "meant"), [
    ("rollback", "down"), ("migrate", "up"), ("rolback", "down"), ("statsu", "status"),
])
def test_an_unknown_command_suggests_the_one_meant(cli: Any, typed: str, meant: str) -> None:
    result = cli(typed)
    assert result.exit_code == 1
    assert result.stderr == (f"✖ No such command '{typed}'. Did you mean '{meant}'? "
                             "(see 'migronaut --help')\n")
    as_json = cli("--json", typed)
    assert as_json.json == {"error": {"message": f"No such command '{typed}'. Did you mean "
                                                 f"'{meant}'?"}}


def test_an_unknown_subcommand_suggests_within_its_group(cli: Any) -> None:
    result = cli("background", "stauts")
    assert result.exit_code == 1
    assert "Did you mean 'status'?" in result.stderr
    assert "Did you mean" not in cli("xyzzy").stderr


@pytest.mark.parametrize(("table", "typo", "meant"), [
    ('indexes = [{ key = { email = 1 }, uniqe = true }]', "indexes[0].uniqe", "unique"),
    ('indexes = [{ key = { at = 1 }, expireAfterSecond = 60 }]',
     "indexes[0].expireAfterSecond", "expireAfterSeconds"),
    ("versioning = { curent = 2 }", "versioning.curent", "current"),
])
def test_a_typo_in_an_index_or_versioning_option_suggests_the_option(
    cli: Any, project: Any, table: str, typo: str, meant: str
) -> None:
    project.write("migronaut.toml", f'[[collections]]\nname = "users"\n{table}\n')
    result = cli("converge", "--dry-run")
    assert result.exit_code == 6
    assert f"collections[0].{typo}" in result.stderr
    assert f"did you mean '{meant}'?" in result.stderr


# ------------------------------------------------------------------- an edited applied file


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_a_plain_up_warns_of_an_edited_applied_migration(cli: Any, project: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    assert cli("up").exit_code == 0
    path = project.migrations / "0001_a.py"
    path.write_text(path.read_text() + "# edited\n")
    result = cli("up")
    assert result.exit_code == 0, result.stderr
    assert "Nothing to migrate" in result.stdout
    warning = [line for line in result.stderr.splitlines() if "changed since" in line]
    assert len(warning) == 1
    assert "0001_a.py" in warning[0] and "0002_b.py" not in warning[0]
    assert "`migronaut up FILE --force`" in warning[0] and "`git checkout`" in warning[0]

    strict = cli("up", "--strict")
    assert strict.exit_code == 4
    assert ("✖ CHECKSUM_MISMATCH: Checksum mismatch for 0001_a.py: the file changed after it "
            "was applied.") in strict.stderr
    assert "`migronaut up 0001_a.py --force`" in strict.stderr
    assert cli("up", "--strict", "--json").json["error"]["context"]["name"] == "0001_a.py"


def test_the_drift_warning_costs_no_round_trip(project: Any) -> None:
    write_simple(project, "0001_a", "0002_b")
    with make_migrator(project) as migrator:
        migrator.up()

    def commands_of_a_plain_up() -> list[str]:
        listener = _Commands()
        with make_migrator(project, client_options={"event_listeners": [listener]}) as migrator:
            migrator.up()
        return listener.names

    unchanged = commands_of_a_plain_up()
    path = project.migrations / "0002_b.py"
    path.write_text(path.read_text() + "# edited\n")
    assert commands_of_a_plain_up() == unchanged


# ------------------------------------------------------------------------------- connecting


def test_a_refused_local_connection_suggests_the_dev_server_and_fails_fast(
    cli: Any, project: Any
) -> None:
    import socket

    with socket.socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"mongodb://127.0.0.1:{port}/"
    result = cli("status", "--uri", uri)
    assert result.exit_code == 5
    assert "`migronaut dev-server`" in result.stderr
    assert "Timeout: 3.0s" in result.stderr  # read-only: 3 s, not 10
    configured = cli("lock", "--uri", uri, env={"MIGRONAUT_SERVER_SELECTION_TIMEOUT_MS": "200"})
    assert configured.exit_code == 5 and "Timeout: 0.2s" in configured.stderr
    remote = cli("status", "--uri", "mongodb://db.invalid/?serverSelectionTimeoutMS=100")
    assert remote.exit_code == 5 and "dev-server" not in remote.stderr


@needs_embedded
def test_a_dev_server_port_in_use_says_to_pick_another(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "migronaut", "dev-server", "--port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )
    assert result.returncode == 6, result.stderr
    assert "Pass another --port N, or --port 0 for any free port" in result.stderr


# ------------------------------------------------------------------------------------- .env


@pytest.mark.parametrize(("line", "problem"), [
    ('MIGRONAUT_DB="app', 'MIGRONAUT_DB: a " quote that never closes'),
    ("MIGRONAUT_DB='app", "MIGRONAUT_DB: a ' quote that never closes"),
    ("MIGRONAUT_DB=`app", "MIGRONAUT_DB: a ` quote that never closes"),
])
def test_an_unterminated_quote_in_dotenv_names_the_file_and_line(
    cli: Any, project: Any, line: str, problem: str
) -> None:
    project.write(".env", f"# settings\n{line}\n")
    result = cli("status", env={"MIGRONAUT_DB": None})
    assert result.exit_code == 6
    env_file = (project.path / ".env").resolve()
    assert result.stderr == (f"✖ CONFIG_INVALID: Invalid configuration: env_file: {env_file}, "
                             f"line 2: {problem}\n")  # and nothing from python-dotenv


def test_dotenv_backticks_are_quotes(cli: Any, project: Any) -> None:
    project.write(".env", "MIGRONAUT_DB=`from_backticks`\n")
    result = cli("status", "--json", env={"MIGRONAUT_DB": None})
    assert result.exit_code == 0, result.stderr
    from migronaut.core.config import load_config

    environ: dict[str, str] = {}
    assert load_config(cwd=project.path, environ=environ, require_db=False).db_name == \
        "from_backticks"
    assert environ["MIGRONAUT_DB"] == "from_backticks"


# ------------------------------------------------------------------------------ status table


def test_the_status_table_shows_descriptions_and_shortens_long_cells(
    cli: Any, project: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_name = "0001_" + "a_very_long_migration_name_" * 3
    write_simple(project, long_name)
    assert cli("up").exit_code == 0
    wide = cli("status")
    assert f"Migration {long_name}." in wide.stdout  # the description column

    from migronaut.cli.output import Output
    from migronaut.cli.render import status_table
    from migronaut.core.results import StatusRow

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(Output, "stdout", property(lambda self: terminal))
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    row = StatusRow(file=f"{long_name}.py", status="applied", batch=1, checksum_ok=True,
                    description="Backfill the email of every user from their profile " * 2)
    status_table([row], Output())
    lines = terminal.getvalue().splitlines()
    assert all(len(line) <= 100 for line in lines)
    body = lines[3]
    assert body.count("…") == 2 and "applied" in body and "ok" in body


# ------------------------------------------------------------------------------- converge


def test_the_plan_says_what_versioning_requires_and_check_prints_its_verdict(
    cli: Any, project: Any, db: Any
) -> None:
    project.write("migronaut.toml", '[[collections]]\nname = "orders"\n'
                  "versioning = { current = 2, min = 1 }\n")
    plan = cli("converge", "--check")
    assert plan.exit_code == 28
    row = next(line for line in plan.stdout.splitlines() if "validator" in line)
    assert "every insert must carry __v, __rev (without: rejected)" in row
    assert "level moderate" in row
    assert ("✖ COLLECTIONS_DRIFT: 3 change(s) pending in 1 of 1 collection(s): orders — run "
            "`migronaut converge` to apply them") in plan.stderr
    assert cli("converge", "--yes").exit_code == 0
    assert cli("converge", "--check").stderr == ""

    project.write("migronaut.toml", '[[collections]]\nname = "orders"\n'
                  "versioning = { current = 2, min = 1 }\n"
                  'validator = { "$jsonSchema" = { required = ["total"], properties = '
                  '{ total = { bsonType = "int" } } } }\nvalidation_level = "strict"\n')
    changed = cli("converge", "--dry-run")
    row = next(line for line in changed.stdout.splitlines() if "validator" in line)
    assert "every insert must carry total" in row
    assert "+properties.total" in row and "level moderate → strict" in row
    assert "validator  │" not in row.split("│")[-2]  # the detail is never the bare word


def test_the_plan_json_is_unchanged_by_the_detail(cli: Any, project: Any) -> None:
    project.write("migronaut.toml", '[[collections]]\nname = "orders"\n'
                  "versioning = { current = 2, min = 1 }\n")
    document = cli("converge", "--dry-run", "--json").json
    (validator,) = [row for row in document["collections"][0]["actions"]
                    if row["target"] == "validator"]
    assert validator["to"]["validator"]["$jsonSchema"]["required"] == ["__v", "__rev"]


# --------------------------------------------------------------------------- integrations


@pytest.mark.parametrize(("module", "extra", "blocked"), [
    ("migronaut.integrations.beanie", "beanie", "beanie"),
    ("migronaut.integrations.mongoengine", "mongoengine", "mongoengine"),
])
def test_an_integration_without_its_extra_names_the_extra(
    module: str, extra: str, blocked: str
) -> None:
    script = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"  # as if not installed
        "from migronaut.errors import ExtraMissingError\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as error:\n"
        "    assert isinstance(error, ExtraMissingError), type(error)\n"
        "    print(error.code, error.context['extra'], error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"CONFIG_INVALID {extra} ")
    assert f"pip install 'migronaut[{extra}]'" in result.stdout
