"""Config resolution (reference core §3): precedence, sources, .env, strict env parsing, errors.

Every test passes an explicit ``environ`` dict, so the real process environment is never read or
written.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from migronaut import Hooks
from migronaut.core.config import KEYS, Config, load_config
from migronaut.errors import ConfigInvalidError

BASE = {"uri": "mongodb://flags-host/", "db_name": "flagsdb"}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(
    tmp_path: Path,
    flags: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    **kw: Any,
) -> Config:
    return load_config(flags, cwd=tmp_path, environ={} if environ is None else environ, **kw)


def invalid(
    tmp_path: Path,
    flags: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    **kw: Any,
) -> ConfigInvalidError:
    with pytest.raises(ConfigInvalidError) as info:
        load(tmp_path, flags, environ, **kw)
    assert info.value.code == "CONFIG_INVALID" and info.value.exit_code == 6
    return info.value


def issue_paths(error: ConfigInvalidError) -> list[str]:
    return [i["path"] for i in error.context["issues"]]


# ----------------------------------------------------------------------- sources of a file

SOURCE_KINDS = ["toml", "pyproject", "py_mapping", "py_sync_factory", "py_async_factory"]


def write_source(tmp_path: Path, kind: str, values: dict[str, Any]) -> Path:
    """A config file of ``kind`` holding ``values`` (ints, bools and strings only)."""

    def toml_value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        return f'"{v}"'

    toml_body = "\n".join(f"{k} = {toml_value(v)}" for k, v in values.items())
    if kind == "toml":
        return write(tmp_path / "migronaut.toml", toml_body + "\n")
    if kind == "pyproject":
        return write(
            tmp_path / "pyproject.toml",
            '[project]\nname = "app"\n\n[tool.migronaut]\n' + toml_body + "\n",
        )
    literal = repr(values)
    if kind == "py_mapping":
        return write(tmp_path / "migronaut_config.py", f"config = {literal}\n")
    if kind == "py_sync_factory":
        return write(tmp_path / "migronaut_config.py", f"def config():\n    return {literal}\n")
    if kind == "py_async_factory":
        return write(
            tmp_path / "migronaut_config.py",
            f"import asyncio\n\nasync def config():\n    await asyncio.sleep(0)\n"
            f"    return {literal}\n",
        )
    raise AssertionError(kind)


def test_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    assert config.migrations_dir == "./migrations"
    assert config.migrations_collection == "_migronaut_migrations"
    assert config.lock_collection == "_migronaut_locks"
    assert config.lock_ttl_seconds == 60
    assert config.strict is False and config.use_transaction is False
    assert config.on_lock_lost == "abort" and config.on_out_of_order == "warn"
    assert config.ensure_indexes is True and config.timeout_ms is None
    assert config.file_extensions == (".py",)
    assert config.env_file == ".env"
    assert config.source is None
    assert config.migrations_path == (tmp_path / "migrations").resolve()


def test_a_copy_with_overrides_is_checked_like_flags(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    copy = config.with_overrides(db_name="admin")
    assert (copy.db_name, copy.origin("db_name")) == ("admin", "the db_name argument")
    assert copy.uri == config.uri and config.db_name != "admin"
    with pytest.raises(ConfigInvalidError, match="lock_ttl_seconds"):
        config.with_overrides(lock_ttl_seconds=True)
    with pytest.raises(ConfigInvalidError, match="unknown config key"):
        config.with_overrides(db="admin")


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path, kind: str) -> None:
    path = write_source(
        tmp_path,
        kind,
        {
            "uri": "mongodb://file-host/",
            "db_name": "filedb",
            "lock_ttl_seconds": 10,
            "migrations_dir": "file_migrations",
            "strict": True,
            "on_out_of_order": "error",
        },
    )
    env = {"MIGRONAUT_DB": "envdb", "MIGRONAUT_LOCK_TTL": "20", "MIGRONAUT_STRICT": "false"}
    config = load(tmp_path, {"lock_ttl_seconds": 30}, env)
    assert config.source == str(path)
    assert config.lock_ttl_seconds == 30  # flags > env > file
    assert config.db_name == "envdb"  # env > file
    assert config.strict is False  # env (false) > file (true): a falsy env value still wins
    assert config.uri == "mongodb://file-host/"  # file > default (none)
    assert config.migrations_dir == "file_migrations"
    assert config.on_out_of_order == "error"
    assert config.on_lock_lost == "abort"  # default

    # without env and flags the file wins over the defaults
    config = load(tmp_path)
    assert (config.lock_ttl_seconds, config.db_name, config.strict) == (10, "filedb", True)
    # without flags the env wins over the file
    assert load(tmp_path, None, env).lock_ttl_seconds == 20


def test_flags_that_are_none_do_not_erase_lower_layers(tmp_path: Path) -> None:
    write_source(tmp_path, "toml", {"uri": "mongodb://file/", "db_name": "filedb"})
    config = load(tmp_path, {"uri": None, "db_name": None, "lock_ttl_seconds": None})
    assert (config.uri, config.db_name, config.lock_ttl_seconds) == (
        "mongodb://file/",
        "filedb",
        60,
    )


def test_discovery_order(tmp_path: Path) -> None:
    write_source(tmp_path, "pyproject", {"db_name": "from_pyproject", "uri": "mongodb://h/"})
    assert load(tmp_path).db_name == "from_pyproject"
    write_source(tmp_path, "py_mapping", {"db_name": "from_py", "uri": "mongodb://h/"})
    assert load(tmp_path).db_name == "from_py"  # migronaut_config.py before pyproject.toml
    write_source(tmp_path, "toml", {"db_name": "from_toml", "uri": "mongodb://h/"})
    assert load(tmp_path).db_name == "from_toml"  # migronaut.toml first


def test_pyproject_without_a_migronaut_table_is_not_a_config_file(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[project]\nname = "app"\n[tool.other]\nx = 1\n')
    config = load(tmp_path, BASE)
    assert config.source is None


def test_explicit_config_path_disables_discovery(tmp_path: Path) -> None:
    write_source(tmp_path, "toml", {"db_name": "discovered", "uri": "mongodb://h/"})
    other = write(
        tmp_path / "profiles" / "seeds.toml",
        'uri = "mongodb://h/"\ndb_name = "seeds"\nmigrations_collection = "_seeds"\n',
    )
    config = load(tmp_path, config_path="profiles/seeds.toml")  # relative to cwd
    assert config.db_name == "seeds" and config.migrations_collection == "_seeds"
    assert config.source == str(other.resolve())


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    error = invalid(tmp_path, BASE, config_path="nope.toml")
    assert "Config file not found" in error.message and "nope.toml" in error.message


def test_the_cwd_anchors_discovery_and_migrations_dir(tmp_path: Path) -> None:
    project = tmp_path / "svc"
    write_source(
        project,
        "toml",
        {"uri": "mongodb://h/", "db_name": "svc", "migrations_dir": "db/migrations"},
    )
    config = load_config(None, cwd=project, environ={})
    assert config.migrations_path == (project / "db" / "migrations").resolve()


# ----------------------------------------------------------------------------- Python files


def test_python_config_can_pass_hooks_and_code_only_objects(tmp_path: Path) -> None:
    write(
        tmp_path / "migronaut_config.py",
        """
        from migronaut import Hooks

        def before_all(ctx):
            pass

        config = {
            "uri": "mongodb://h/",
            "db_name": "app",
            "hooks": Hooks(before_all=before_all),
            "generate_id": lambda: "fixed-id",
            "logger": None,
        }
    """,
    )
    config = load(tmp_path)
    assert isinstance(config.hooks, Hooks) and config.hooks.before_all is not None
    assert config.generate_id is not None and config.generate_id() == "fixed-id"
    assert config.logger is None  # explicit None silences


def test_factory_is_called_once_per_resolution_and_env_still_overrides(tmp_path: Path) -> None:
    write(
        tmp_path / "migronaut_config.py",
        """
        CALLS = []

        def config():
            CALLS.append(1)
            return {"uri": "mongodb://secret-manager/", "db_name": "fromfactory"}
    """,
    )
    config = load(tmp_path, None, {"MIGRONAUT_DB": "fromenv"})
    assert config.uri == "mongodb://secret-manager/" and config.db_name == "fromenv"
    import sys

    module = next(
        m
        for k, m in sys.modules.items()
        if k.startswith("migronaut_config_")
        and getattr(m, "CALLS", None) is not None
        and m.__file__ == str((tmp_path / "migronaut_config.py").resolve())
    )
    assert module.CALLS == [1]


def test_async_factory_works_when_called_from_running_event_loop(tmp_path: Path) -> None:
    """An application that boots from async code (e.g. an ASGI lifespan) and resolves config
    synchronously must still be able to use an async secret-provider factory."""
    import asyncio

    write_source(tmp_path, "py_async_factory", {"uri": "mongodb://h/", "db_name": "async_ok"})

    async def main() -> Config:
        return load(tmp_path)

    assert asyncio.run(main()).db_name == "async_ok"


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (
            "def config():\n    raise RuntimeError('vault unreachable')\n",
            "Config factory function failed to resolve",
        ),
        (
            "async def config():\n    raise RuntimeError('vault unreachable')\n",
            "Config factory function failed to resolve",
        ),
        ("config = {'uri': \n", "failed to load"),
        ("import missing_module_xyz\nconfig = {}\n", "failed to load"),
        ("CONFIG = {}\n", "must define `config`"),
        ("config = ['uri']\n", "must be a mapping"),
        ("def config():\n    return 42\n", "must be a mapping"),
    ],
)
def test_broken_python_config(tmp_path: Path, source: str, fragment: str) -> None:
    write(tmp_path / "migronaut_config.py", source)
    error = invalid(tmp_path, BASE)
    assert fragment in error.message
    assert "migronaut_config.py" in error.message


def test_a_failing_factory_is_skipped_in_lenient_mode(tmp_path: Path) -> None:
    write(
        tmp_path / "migronaut_config.py",
        "def config():\n    raise RuntimeError('vault unreachable')\n",
    )
    warnings: list[str] = []
    config = load(tmp_path, None, None, require_db=False, lenient=True, warnings=warnings)
    assert config.source is None
    assert config.migrations_dir == "./migrations"
    assert len(warnings) == 1 and "migronaut_config.py" in warnings[0]
    assert "continuing without it" in warnings[0]


def test_lenient_mode_does_not_hide_bad_values(tmp_path: Path) -> None:
    write(tmp_path / "migronaut.toml", "lock_ttl_seconds = -1\n")
    error = invalid(tmp_path, None, None, require_db=False, lenient=True)
    assert "lock_ttl_seconds" in error.message


def test_create_style_resolution_does_not_need_uri_or_db(tmp_path: Path) -> None:
    config = load(tmp_path, None, None, require_db=False)
    assert config.uri is None and config.db_name is None


# ------------------------------------------------------------------------- file validation


def test_invalid_toml(tmp_path: Path) -> None:
    write(tmp_path / "migronaut.toml", "uri = \n")
    error = invalid(tmp_path, BASE)
    assert "not valid TOML" in error.message and "migronaut.toml" in error.message


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        ("dbName", "db_name"),
        ("migrationsDir", "migrations_dir"),
        ("lockTTLSeconds", "lock_ttl_seconds"),
        ("stric", "strict"),
    ],
)
@pytest.mark.parametrize("where", ["toml", "pyproject", "flags"])
def test_unknown_keys_are_errors_with_a_suggestion(
    tmp_path: Path, key: str, fragment: str, where: str
) -> None:
    if where == "flags":
        error = invalid(tmp_path, {**BASE, key: "x"})
    else:
        write_source(tmp_path, where, {"uri": "mongodb://h/", "db_name": "d", key: "x"})
        error = invalid(tmp_path)
    assert key in error.message
    assert f"did you mean '{fragment}'" in error.message
    assert issue_paths(error)[0].startswith(key)


def test_unknown_key_without_a_close_match(tmp_path: Path) -> None:
    write(tmp_path / "migronaut.toml", 'uri = "mongodb://h/"\ndb_name = "d"\nzzzqqq = 1\n')
    error = invalid(tmp_path)
    assert "zzzqqq" in error.message and "unknown config key" in error.message
    assert "migronaut.toml" in error.context["issues"][0]["path"]


@pytest.mark.parametrize("key", ["hooks", "logger", "client", "generate_id", "telemetry"])
@pytest.mark.parametrize("where", ["toml", "pyproject"])
def test_code_only_keys_are_refused_in_toml(tmp_path: Path, key: str, where: str) -> None:
    write_source(tmp_path, where, {"uri": "mongodb://h/", "db_name": "d", key: "x"})
    error = invalid(tmp_path)
    assert key in error.message
    assert "migronaut_config.py" in error.message


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("lock_ttl_seconds", "60", "positive integer"),
        ("lock_ttl_seconds", 0, "positive integer"),
        ("lock_ttl_seconds", True, "positive integer"),
        ("timeout_ms", -5, "positive integer"),
        ("strict", "true", "boolean"),
        ("use_transaction", 1, "boolean"),
        ("on_lock_lost", "explode", "'abort', 'warn'"),
        ("on_out_of_order", "ignore", "'warn', 'error', 'allow'"),
        ("migrations_dir", "", "non-empty string"),
        ("uri", 5, "non-empty string"),
        ("env_file", "", "non-empty string or false"),
        ("file_extensions", [], "non-empty array"),
        ("file_extensions", [""], "non-empty array"),
        ("client_options", "tls=true", "table/object"),
    ],
)
def test_ill_typed_values_name_the_key(tmp_path: Path, key: str, value: Any, fragment: str) -> None:
    error = invalid(tmp_path, {**BASE, key: value})
    assert key in error.message and fragment in error.message
    assert issue_paths(error) == [f"{key} (flags)"]


def test_every_issue_is_reported(tmp_path: Path) -> None:
    error = invalid(tmp_path, {**BASE, "lock_ttl_seconds": 0, "strict": "yes", "dbName": "x"})
    assert len(error.context["issues"]) == 3
    assert "(and 2 more)" in error.message


@pytest.mark.parametrize("name", ["system.users", "a$b", "", "nul\x00here", 7, "abc.", ".abc",
                                  "a..b"])
@pytest.mark.parametrize("key", ["migrations_collection", "lock_collection"])
def test_invalid_collection_names(tmp_path: Path, key: str, name: Any) -> None:
    error = invalid(tmp_path, {**BASE, key: name})
    assert key in error.message
    assert error.code == "CONFIG_INVALID" and error.exit_code == 6


def test_missing_uri_and_db_name(tmp_path: Path) -> None:
    error = invalid(tmp_path)
    assert issue_paths(error) == ["uri", "db_name"]
    assert "uri is required" in error.message
    error = invalid(tmp_path, {"uri": "mongodb://h/"})
    assert issue_paths(error) == ["db_name"]


def test_an_injected_client_makes_uri_unnecessary(tmp_path: Path) -> None:
    sentinel = object()
    config = load(tmp_path, {"client": sentinel, "db_name": "d"})
    assert config.client is sentinel and config.uri is None


def test_file_extensions_are_normalised(tmp_path: Path) -> None:
    assert load(tmp_path, {**BASE, "file_extensions": ["py", ".mig"]}).file_extensions == (
        ".py",
        ".mig",
    )


def test_prototype_poisoning_keys_are_ignored(tmp_path: Path) -> None:
    config = load(tmp_path, {**BASE, "__proto__": {"strict": True}, "constructor": 1})
    assert config.strict is False


# ----------------------------------------------------------------------------------- .env


def test_env_file_is_loaded_but_never_overrides_the_real_environment(tmp_path: Path) -> None:
    write(
        tmp_path / ".env",
        """
        # comment
        MIGRONAUT_URI=mongodb://dotenv-host/
        MIGRONAUT_DB=dotenvdb
        export MIGRONAUT_LOCK_TTL=45
        OTHER_VAR="quoted value"
    """,
    )
    environ = {"MIGRONAUT_DB": "realdb"}
    config = load(tmp_path, None, environ)
    assert config.uri == "mongodb://dotenv-host/"
    assert config.db_name == "realdb"
    assert config.lock_ttl_seconds == 45
    assert environ["MIGRONAUT_DB"] == "realdb"
    assert environ["OTHER_VAR"] == "quoted value"


def test_flags_still_win_over_dotenv(tmp_path: Path) -> None:
    write(tmp_path / ".env", "MIGRONAUT_DB=dotenvdb\nMIGRONAUT_URI=mongodb://h/\n")
    assert load(tmp_path, {"db_name": "flagdb"}).db_name == "flagdb"


def test_env_file_false_loads_nothing(tmp_path: Path) -> None:
    write(tmp_path / ".env", "MIGRONAUT_DB=dotenvdb\nMIGRONAUT_URI=mongodb://h/\n")
    environ: dict[str, str] = {}
    error = invalid(tmp_path, {"env_file": False}, environ)
    assert issue_paths(error) == ["uri", "db_name"]
    assert environ == {}


@pytest.mark.parametrize("value", ["false", "0", "no"])
def test_migronaut_env_file_false_loads_nothing(tmp_path: Path, value: str) -> None:
    write(tmp_path / ".env", "MIGRONAUT_DB=dotenvdb\nMIGRONAUT_URI=mongodb://h/\n")
    environ = {"MIGRONAUT_ENV_FILE": value}
    invalid(tmp_path, None, environ)
    assert "MIGRONAUT_DB" not in environ


def test_migronaut_env_file_chooses_the_file_and_flags_win_over_it(tmp_path: Path) -> None:
    write(tmp_path / ".env", "MIGRONAUT_DB=default_env\nMIGRONAUT_URI=mongodb://h/\n")
    write(tmp_path / "ci.env", "MIGRONAUT_DB=ci_env\nMIGRONAUT_URI=mongodb://h/\n")
    write(tmp_path / "flag.env", "MIGRONAUT_DB=flag_env\nMIGRONAUT_URI=mongodb://h/\n")
    assert load(tmp_path, None, {"MIGRONAUT_ENV_FILE": "ci.env"}).db_name == "ci_env"
    assert (
        load(tmp_path, {"env_file": "flag.env"}, {"MIGRONAUT_ENV_FILE": "ci.env"}).db_name
        == "flag_env"
    )


def test_the_config_file_cannot_choose_the_env_file(tmp_path: Path) -> None:
    write(tmp_path / "custom.env", "MIGRONAUT_DB=custom\n")
    write(
        tmp_path / "migronaut.toml",
        'uri = "mongodb://h/"\ndb_name = "filedb"\nenv_file = "custom.env"\n',
    )
    environ: dict[str, str] = {}
    assert load(tmp_path, None, environ).db_name == "filedb"
    assert "MIGRONAUT_DB" not in environ


def test_a_missing_env_file_is_a_silent_no_op(tmp_path: Path) -> None:
    assert load(tmp_path, {**BASE, "env_file": "does-not-exist.env"}).db_name == "flagsdb"


def test_an_env_file_that_is_not_a_regular_file_or_too_big(tmp_path: Path) -> None:
    (tmp_path / ".env").mkdir()
    error = invalid(tmp_path, BASE)
    assert "env_file" in error.message
    big = tmp_path / "big.env"
    big.write_bytes(b"# " + b"x" * (1024 * 1024))
    error = invalid(tmp_path, {**BASE, "env_file": "big.env"})
    assert "1 MB" in error.message


# ---------------------------------------------------------------------- env var parsing

BOOL_VARS = {
    "MIGRONAUT_STRICT": "strict",
    "MIGRONAUT_USE_TRANSACTION": "use_transaction",
    "MIGRONAUT_SEQUENTIAL": "sequential",
    "MIGRONAUT_ENSURE_INDEXES": "ensure_indexes",
    "MIGRONAUT_RELOAD_MIGRATIONS": "reload_migrations",
}


@pytest.mark.parametrize("var", sorted(BOOL_VARS))
@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("true", True),
        ("1", True),
        ("yes", True),
        ("TRUE", True),
        (" Yes ", True),
        ("false", False),
        ("0", False),
        ("no", False),
        ("NO", False),
        (" False", False),
    ],
)
def test_boolean_env_vars(tmp_path: Path, var: str, raw: str, value: bool) -> None:
    assert getattr(load(tmp_path, BASE, {var: raw}), BOOL_VARS[var]) is value


@pytest.mark.parametrize("var", sorted(BOOL_VARS))
@pytest.mark.parametrize("raw", ["on", "off", "y", "2", "enabled"])
def test_bad_boolean_env_vars_fail_closed(tmp_path: Path, var: str, raw: str) -> None:
    error = invalid(tmp_path, BASE, {var: raw})
    assert var in error.message and "boolean" in error.message
    assert issue_paths(error) == [var]


def test_migronaut_strict_on_is_an_error_not_false(tmp_path: Path) -> None:
    error = invalid(tmp_path, BASE, {"MIGRONAUT_STRICT": "on"})
    assert error.message.startswith("Invalid configuration: MIGRONAUT_STRICT")
    assert "'on'" in error.message


@pytest.mark.parametrize("var", ["MIGRONAUT_LOCK_TTL", "MIGRONAUT_TIMEOUT_MS"])
@pytest.mark.parametrize("raw", ["abc", "0", "-5", "1.5", "1e3", "10s"])
def test_bad_integer_env_vars_fail_closed(tmp_path: Path, var: str, raw: str) -> None:
    error = invalid(tmp_path, BASE, {var: raw})
    assert var in error.message and "positive integer" in error.message
    assert issue_paths(error) == [var]


def test_integer_env_vars(tmp_path: Path) -> None:
    config = load(tmp_path, BASE, {"MIGRONAUT_LOCK_TTL": " 30 ", "MIGRONAUT_TIMEOUT_MS": "1500"})
    assert config.lock_ttl_seconds == 30 and config.timeout_ms == 1500


@pytest.mark.parametrize(
    ("var", "good", "bad"),
    [
        ("MIGRONAUT_ON_LOCK_LOST", "warn", "ignore"),
        ("MIGRONAUT_ON_OUT_OF_ORDER", "allow", "skip"),
    ],
)
def test_enum_env_vars(tmp_path: Path, var: str, good: str, bad: str) -> None:
    key = var.removeprefix("MIGRONAUT_").lower()
    assert getattr(load(tmp_path, BASE, {var: good}), key) == good
    error = invalid(tmp_path, BASE, {var: bad})
    assert var in error.message and bad in error.message


def test_string_and_collection_env_vars(tmp_path: Path) -> None:
    env = {
        "MIGRONAUT_URI": "mongodb://env-host/",
        "MIGRONAUT_DB": "envdb",
        "MIGRONAUT_MIGRATIONS_DIR": "db/migrations",
        "MIGRONAUT_COLLECTION": "_seeds",
        "MIGRONAUT_LOCK_COLLECTION": "_seed_locks",
        "MIGRONAUT_ENVIRONMENT": "staging",
        "MIGRONAUT_TEMPLATE_PATH": "tpl.py",
    }
    config = load(tmp_path, None, env)
    assert config.uri == "mongodb://env-host/" and config.db_name == "envdb"
    assert config.migrations_dir == "db/migrations"
    assert config.migrations_collection == "_seeds" and config.lock_collection == "_seed_locks"
    assert config.environment == "staging" and config.resolved_environment == "staging"
    assert config.template_path == "tpl.py"


def test_bad_collection_env_var_names_the_variable(tmp_path: Path) -> None:
    error = invalid(tmp_path, BASE, {"MIGRONAUT_COLLECTION": "system.profile"})
    assert "MIGRONAUT_COLLECTION" in error.message


def test_empty_env_vars_are_not_applied(tmp_path: Path) -> None:
    write(
        tmp_path / "migronaut.toml",
        'uri = "mongodb://h/"\ndb_name = "filedb"\nlock_ttl_seconds = 5\n',
    )
    config = load(
        tmp_path, None, {"MIGRONAUT_DB": "", "MIGRONAUT_LOCK_TTL": "  ", "MIGRONAUT_STRICT": ""}
    )
    assert config.db_name == "filedb" and config.lock_ttl_seconds == 5 and config.strict is False


def test_env_var_names_follow_the_naming_rule() -> None:
    """Every scalar key is MIGRONAUT_<KEY> except the three shortened ones (pinned)."""
    shortened = {
        "db_name": "MIGRONAUT_DB",
        "migrations_collection": "MIGRONAUT_COLLECTION",
        "lock_ttl_seconds": "MIGRONAUT_LOCK_TTL",
    }
    for spec in KEYS:
        if spec.kind in ("code", "mapping", "extensions", "definitions", "fleet"):
            assert spec.env is None, spec.name
        elif spec.name in shortened:
            assert spec.env == shortened[spec.name]
        else:
            assert spec.env == "MIGRONAUT_" + spec.name.upper(), spec.name


def test_the_real_environment_is_used_when_no_environ_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIGRONAUT_URI", "mongodb://real-env/")
    monkeypatch.setenv("MIGRONAUT_DB", "realenvdb")
    config = load_config(None, cwd=tmp_path)
    assert config.db_name == "realenvdb"
