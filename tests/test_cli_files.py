"""``migronaut init`` and ``create``: the file-writing commands, which never connect."""

from __future__ import annotations

import datetime as dt
import tomllib
from pathlib import Path
from typing import Any

import pytest

UNREACHABLE = {"MIGRONAUT_URI": "mongodb://nowhere.invalid:1/?serverSelectionTimeoutMS=1"}


# ------------------------------------------------------------------------------------- init


def test_init_writes_toml_prefilled_from_flags(cli: Any, project: Any) -> None:
    result = cli("init", "--uri", "mongodb://db.example:27017", "--db", "shop", "--dir", "./mig")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("✔ Created  migronaut.toml\n✔ Created  mig/\nNext:\n")
    assert (project.path / "mig").is_dir()
    data = tomllib.loads((project.path / "migronaut.toml").read_text())
    assert (data["uri"], data["db_name"], data["migrations_dir"]) == (
        "mongodb://db.example:27017", "shop", "./mig"
    )


def test_init_defaults_without_flags_or_environment(cli: Any, project: Any) -> None:
    result = cli("init", env={"MIGRONAUT_URI": None, "MIGRONAUT_DB": None})
    assert result.exit_code == 0
    data = tomllib.loads((project.path / "migronaut.toml").read_text())
    assert (data["uri"], data["db_name"], data["migrations_dir"]) == (
        "mongodb://localhost:27017", "myapp", "./migrations"
    )


def test_init_writes_the_uri_and_database_of_the_environment(cli: Any, project: Any) -> None:
    result = cli("init", env={**UNREACHABLE, "MIGRONAUT_DB": "shop",
                              "MIGRONAUT_MIGRATIONS_DIR": "db/migrations"})  # never connects
    assert result.exit_code == 0, result.stderr
    data = tomllib.loads((project.path / "migronaut.toml").read_text())
    assert (data["uri"], data["db_name"], data["migrations_dir"]) == (
        UNREACHABLE["MIGRONAUT_URI"], "shop", "db/migrations"
    )
    flags_win = cli("init", "--force", "--db", "other", env=UNREACHABLE)
    assert flags_win.exit_code == 0
    data = tomllib.loads((project.path / "migronaut.toml").read_text())
    assert (data["uri"], data["db_name"]) == (UNREACHABLE["MIGRONAUT_URI"], "other")
    # a new shell (no MIGRONAUT_* variables) finds the same server and database in the file
    (project.migrations / "0001_a.py").write_text("def up(ctx): pass\ndef down(ctx): pass\n")
    project.write("migronaut.toml", (project.path / "migronaut.toml").read_text().replace(
        UNREACHABLE["MIGRONAUT_URI"], project.uri).replace('"other"', f'"{project.db_name}"'))
    fresh = cli("status", "--json", env={"MIGRONAUT_URI": None, "MIGRONAUT_DB": None})
    assert fresh.exit_code == 0, fresh.stderr
    assert [row["file"] for row in fresh.json] == ["0001_a.py"]


@pytest.mark.parametrize(
    ("args", "marker"),
    [
        (("--format", "py"), '"hooks"'),
        (("--format", "py", "--secret-provider"), "load_mongo_secret"),
    ],
)
def test_init_python_formats(cli: Any, project: Any, args: tuple[str, ...], marker: str) -> None:
    result = cli("init", *args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("✔ Created  migronaut_config.py\n")
    assert (project.path / "migrations").is_dir()
    text = (project.path / "migronaut_config.py").read_text()
    assert marker in text
    compile(text, "migronaut_config.py", "exec")


def test_init_refuses_to_overwrite_without_force(cli: Any, project: Any) -> None:
    assert cli("init", "--db", "first").exit_code == 0
    again = cli("init", "--db", "second")
    assert again.exit_code == 16
    assert "✖ CONFIG_FILE_EXISTS: Config file already exists: migronaut.toml" in again.stderr
    assert tomllib.loads((project.path / "migronaut.toml").read_text())["db_name"] == "first"
    forced = cli("init", "--db", "second", "--force")
    assert forced.exit_code == 0
    assert tomllib.loads((project.path / "migronaut.toml").read_text())["db_name"] == "second"


def test_init_rejects_json_and_points_to_format(cli: Any, project: Any) -> None:
    result = cli("init", "--json")
    assert result.exit_code == 6
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert "--format toml|py" in result.json["error"]["message"]
    assert "✖ CONFIG_INVALID:" in result.stderr
    assert not (project.path / "migronaut.toml").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "json"), "--format must be 'toml' or 'py' (got 'json')"),
        (("--secret-provider",), "--secret-provider needs --format py"),
    ],
)
def test_init_bad_options(cli: Any, project: Any, args: tuple[str, ...], message: str) -> None:
    result = cli("init", *args)
    assert result.exit_code == 6
    assert f"✖ CONFIG_INVALID: {message}" in result.stderr
    assert list(project.path.glob("migronaut*")) == []


def test_init_masks_a_uri_password_and_warns(cli: Any, project: Any) -> None:
    result = cli("init", "--uri", "mongodb://app:s3cr3t@db.example:27017/?authSource=admin")
    assert result.exit_code == 0
    text = (project.path / "migronaut.toml").read_text()
    assert "s3cr3t" not in text
    assert "mongodb://app:****@db.example:27017/?authSource=admin" in text
    assert "⚠ The URI contains credentials — they were masked in the file" in result.stderr
    assert "s3cr3t" not in result.stdout + result.stderr


def test_init_masks_query_string_secrets_and_warns(cli: Any, project: Any) -> None:
    result = cli("init", "--uri", "mongodb://db.example/?tlsCertificateKeyFilePassword=pw123")
    assert result.exit_code == 0
    assert "pw123" not in (project.path / "migronaut.toml").read_text()
    assert "tlsCertificateKeyFilePassword=****" in (project.path / "migronaut.toml").read_text()
    assert "⚠ The URI contains credentials — they were masked in the file" in result.stderr
    assert "pw123" not in result.stdout + result.stderr


# ----------------------------------------------------------------------------------- create


def test_create_prints_the_created_file(cli: Any, project: Any) -> None:
    result = cli("create", "Add users index", env=UNREACHABLE)
    assert result.exit_code == 0, result.stderr
    files = list(project.migrations.iterdir())
    assert len(files) == 1
    assert files[0].name.endswith("_add_users_index.py")
    assert result.stdout == f"✔ Created  {files[0].name}\n"
    compile(files[0].read_text(), files[0].name, "exec")


def test_create_json_prints_the_absolute_path(cli: Any, project: Any) -> None:
    result = cli("create", "second", "--json")
    assert result.exit_code == 0
    path = Path(result.json["path"])
    assert path.is_absolute() and path.is_file()
    assert path.parent == project.migrations.resolve()
    assert result.stdout.endswith("}\n")


def test_create_needs_no_uri_or_db(cli: Any, project: Any) -> None:
    result = cli("create", "x", env={"MIGRONAUT_URI": None, "MIGRONAUT_DB": None})
    assert result.exit_code == 0, result.stderr


def test_create_survives_a_broken_config_module(cli: Any, project: Any) -> None:
    project.write("migronaut_config.py", "raise RuntimeError('secret manager unreachable')\n")
    result = cli("create", "x")
    assert result.exit_code == 0, result.stderr
    assert "⚠ Could not resolve migronaut_config.py — continuing without it" in result.stderr
    assert len(list(project.migrations.iterdir())) == 1


def test_create_with_a_template_copies_it(cli: Any, project: Any) -> None:
    template = project.write("tpl/migration.py", "# house template\ndef up(ctx): pass\n"
                             "def down(ctx): pass\n")
    result = cli("create", "from template", "--template", "tpl/migration.py")
    assert result.exit_code == 0, result.stderr
    (created,) = project.migrations.iterdir()
    assert created.read_text() == template.read_text()


def test_create_with_a_missing_template_exits_8(cli: Any, project: Any) -> None:
    result = cli("create", "x", "--template", "nope.py", "--json")
    assert result.exit_code == 8
    assert result.json["error"]["code"] == "MIGRATION_FILE_NOT_FOUND"
    assert "Template not found" in result.json["error"]["message"]
    assert list(project.migrations.iterdir()) == []


@pytest.mark.parametrize("name", ["!!!", "   ", "--- ---"])
def test_create_with_an_empty_slug_exits_6(cli: Any, project: Any, name: str) -> None:
    result = cli("create", "--", name)
    assert result.exit_code == 6
    assert "✖ CONFIG_INVALID: Migration name must contain at least one letter or digit" in (
        result.stderr
    )
    assert list(project.migrations.iterdir()) == []


def test_create_collision_exits_18_and_keeps_the_existing_file(cli: Any, project: Any) -> None:
    # occupy the names of this second and the next two, whenever create runs
    now = dt.datetime.now()
    occupied = []
    for offset in range(3):
        stamp = (now + dt.timedelta(seconds=offset)).strftime("%Y%m%d%H%M%S")
        occupied.append(project.write_migration(f"{stamp}_taken", "# original\n"))
    result = cli("create", "taken", "--json")
    assert result.exit_code == 18
    assert result.json["error"]["code"] == "MIGRATION_FILE_EXISTS"
    assert "Migration file already exists" in result.json["error"]["message"]
    assert all(path.read_text() == "# original\n" for path in occupied)
    assert len(list(project.migrations.iterdir())) == 3
