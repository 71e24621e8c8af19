"""Configuration: one resolved, validated :class:`Config` per migrator.

Precedence is fixed: flags (or the ``Migrator(...)`` keyword arguments) > ``MIGRONAUT_*``
environment > config file > defaults. A layer only sets the keys it names, so a partial source
never erases a lower one. Every value is checked where it enters, and a bad one fails closed with
``CONFIG_INVALID`` naming the key, the variable or the file it came from; unknown keys are errors
too (with a suggestion), because a typo in a migration tool's config should never be ignored.

Config files, first found in the working directory unless ``--config`` names one:
``migronaut.toml`` (top-level keys), ``migronaut_config.py`` (a ``config`` mapping, or a sync or
async function returning one — the only way to pass hooks, a logger, a client or telemetry), and
``pyproject.toml`` (its ``[tool.migronaut]`` table).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from migronaut._names import validate_collection_name, validate_db_name
from migronaut._suggest import suggest
from migronaut._values import is_int
from migronaut.errors import ConfigInvalidError, MigronautError
from migronaut.fleet.config import FleetConfig, parse_fleet
from migronaut.observability.telemetry_values import telemetry_issue

__all__ = [
    "CONFIG_FILE_NAMES",
    "KEYS",
    "Config",
    "Issue",
    "KeySpec",
    "load_config",
    "validate_collection_name",
]

CONFIG_FILE_NAMES = ("migronaut.toml", "migronaut_config.py", "pyproject.toml")
#: The command-line flag of each config key the global flags set (for :meth:`Config.origin`).
FLAG_NAMES = {"uri": "--uri", "db_name": "--db", "migrations_dir": "--dir",
              "log_format": "--log-format", "env_file": "--env-file"}
MAX_ENV_FILE_BYTES = 1024 * 1024

Kind = Literal[
    "str", "uri", "dbname", "collection", "posint", "bool", "enum", "env_file", "extensions",
    "mapping", "code", "definitions", "fleet",
]


@dataclass(frozen=True)
class KeySpec:
    """One config key: its type, default and environment variable (``None`` = file/API only)."""

    name: str
    kind: Kind
    default: Any = None
    env: str | None = None
    choices: tuple[str, ...] = ()
    node_name: str = ""


def _k(name: str, kind: Kind, default: Any = None, env: str | None = "", **kw: Any) -> KeySpec:
    if env == "":
        env = "MIGRONAUT_" + name.upper()
    return KeySpec(name, kind, default, env, **kw)


#: Every key of reference core §3.4 (plus the background and collections keys), Python-named.
KEYS: tuple[KeySpec, ...] = (
    _k("uri", "uri", None),
    _k("db_name", "dbname", None, "MIGRONAUT_DB"),
    _k("migrations_dir", "str", "./migrations"),
    _k("migrations_collection", "collection", "_migronaut_migrations", "MIGRONAUT_COLLECTION"),
    _k("lock_collection", "collection", "_migronaut_locks"),
    _k("converge_log_collection", "collection", "_migronaut_converge"),
    _k("lock_ttl_seconds", "posint", 60, "MIGRONAUT_LOCK_TTL"),
    _k("strict", "bool", False),
    _k("use_transaction", "bool", False),
    _k("file_extensions", "extensions", (".py",), None),
    _k("sequential", "bool", False),
    _k("template_path", "str", None),
    _k("environment", "str", None),
    _k("on_lock_lost", "enum", "abort", choices=("abort", "warn")),
    _k("on_out_of_order", "enum", "warn", choices=("warn", "error", "allow")),
    _k("env_file", "env_file", ".env"),
    _k("ensure_indexes", "bool", True),
    _k("timeout_ms", "posint", None),
    _k("connect_timeout_ms", "posint", None),
    _k("server_selection_timeout_ms", "posint", None),
    _k("reload_migrations", "bool", False),
    _k("client_options", "mapping", None, None),
    # the Celery executor's table; its keys are checked by migronaut.executors.celery.settings
    _k("celery", "mapping", None, None),
    # the fleet's table, parsed into a FleetConfig by migronaut.fleet.config
    _k("fleet", "fleet", None, None),
    _k("client", "code", None, None),
    _k("hooks", "code", None, None),
    _k("logger", "code", None, None),
    _k("generate_id", "code", None, None),
    _k("telemetry", "code", None, None),
    _k("collections", "definitions", None, None),
    _k("collections_dir", "str", None),
    _k("converge_after_up", "bool", False),
    _k("on_search_unavailable", "enum", "fail", choices=("fail", "skip")),
    _k("wait_for_search_indexes", "bool", False),
    _k("search_index_wait_timeout_ms", "posint", 600_000),
    _k("background_collection", "collection", "_migronaut_background"),
    _k("background_inline", "bool", False),
    _k("background_on_drift", "enum", "reopen", choices=("reopen", "report")),
    _k("background_drift", "enum", "poll", choices=("poll", "stream", "both")),
    _k("background_shard_aware", "enum", "auto", choices=("auto", "off")),
    _k("runs_collection", "collection", "_migronaut_runs"),
    _k("record_runs", "bool", True),
    _k("log_format", "enum", "text", choices=("text", "json")),
)
_BY_NAME = {spec.name: spec for spec in KEYS}
_CODE_ONLY = frozenset(spec.name for spec in KEYS if spec.kind == "code")


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


#: Marks "the user did not configure a logger" (``None`` means "silence").
DEFAULT_LOGGER: Any = _Unset()


@dataclass(frozen=True)
class Config:
    """The resolved configuration. Field names are the config keys."""

    uri: str | None = None
    db_name: str | None = None
    migrations_dir: str = "./migrations"
    migrations_collection: str = "_migronaut_migrations"
    lock_collection: str = "_migronaut_locks"
    converge_log_collection: str = "_migronaut_converge"
    lock_ttl_seconds: int = 60
    strict: bool = False
    use_transaction: bool = False
    file_extensions: tuple[str, ...] = (".py",)
    sequential: bool = False
    template_path: str | None = None
    environment: str | None = None
    on_lock_lost: str = "abort"
    on_out_of_order: str = "warn"
    env_file: str | bool = ".env"
    ensure_indexes: bool = True
    timeout_ms: int | None = None
    #: The driver's ``connectTimeoutMS`` (unset: pymongo's 20 s).
    connect_timeout_ms: int | None = None
    #: The driver's ``serverSelectionTimeoutMS`` (unset: 10 s; 3 s for the CLI's read-only
    #: commands).
    server_selection_timeout_ms: int | None = None
    reload_migrations: bool = False
    client_options: Mapping[str, Any] | None = None
    celery: Mapping[str, Any] | None = None
    #: The ``[fleet]`` table (:mod:`migronaut.fleet`), parsed; ``None`` when there is none.
    fleet: FleetConfig | None = None
    client: Any = None
    hooks: Any = None
    logger: Any = DEFAULT_LOGGER
    generate_id: Callable[[], str] | None = None
    telemetry: Any = None
    collections: Any = None
    collections_dir: str | None = None
    converge_after_up: bool = False
    on_search_unavailable: str = "fail"
    wait_for_search_indexes: bool = False
    search_index_wait_timeout_ms: int = 600_000
    background_collection: str = "_migronaut_background"
    background_inline: bool = False
    background_on_drift: str = "reopen"
    background_drift: str = "poll"
    background_shard_aware: str = "auto"
    runs_collection: str = "_migronaut_runs"
    record_runs: bool = True
    log_format: str = "text"
    #: Where things were read from (for ``--verbose``); not a config key.
    source: str | None = field(default=None, compare=False)
    cwd: str = field(default=".", compare=False)
    #: Which layer set each key that is not a default (:meth:`origin`); not a config key.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def migrations_path(self) -> Path:
        return (Path(self.cwd) / self.migrations_dir).resolve()

    @property
    def resolved_environment(self) -> str:
        return self.environment or "production"

    def origin(self, key: str) -> str:
        """Where ``key``'s value came from, for an error that must say what to fix: ``the --uri
        flag``, ``the MIGRONAUT_URI environment variable``, ``MIGRONAUT_URI from the .env
        file``, ``migronaut.toml``, ``the default`` …"""
        where = self.origins.get(key, "default")
        kind, _, detail = where.partition(":")
        if kind == "flag":
            flag = FLAG_NAMES.get(key)
            return f"the {flag} flag" if flag else f"the {key} argument"
        if kind == "argument":
            return f"the {key} argument"
        if kind == "env":
            return f"the {detail} environment variable"
        if kind == "dotenv":
            return f"{detail} from the .env file"
        if kind == "file":
            return detail
        return "the default"

    def with_overrides(self, **values: Any) -> Config:
        """A copy with some keys replaced (``config.with_overrides(db_name="admin")``),
        validated like flags: ``CONFIG_INVALID`` on an unknown key or a bad value."""
        return with_overrides(self, **values)

    def public_view(self) -> dict[str, Any]:
        """The config as plain data with live objects shown as ``[injected]`` (for debug logs)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _CODE_ONLY or f.name == "logger":
                if value is not None and value is not DEFAULT_LOGGER:
                    out[f.name] = "[injected]"
                continue
            out[f.name] = value.to_json() if isinstance(value, FleetConfig) \
                else list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class Issue:
    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


def _fail(issues: list[Issue]) -> ConfigInvalidError:
    first = issues[0]
    message = f"Invalid configuration: {first.path}: {first.message}"
    if len(issues) > 1:
        message += f" (and {len(issues) - 1} more)"
    return ConfigInvalidError(message, {"issues": [i.as_dict() for i in issues]})


URI_SCHEMES = ("mongodb://", "mongodb+srv://")


def _check_value(spec: KeySpec, value: Any, *, from_text: bool) -> tuple[Any, str | None]:
    """Coerce (only from environment text) and check one value; returns (value, problem)."""
    kind = spec.kind
    if kind == "bool":
        if from_text:
            text = str(value).strip().lower()
            if text in ("true", "1", "yes"):
                return True, None
            if text in ("false", "0", "no"):
                return False, None
            return value, "must be a boolean (true/false, 1/0, yes/no)"
        return value, None if isinstance(value, bool) else "must be a boolean"
    if kind == "posint":
        if from_text:
            text = str(value).strip()
            if not text.isdigit() or int(text) <= 0:
                return value, "must be a positive integer"
            return int(text), None
        ok = is_int(value) and value > 0
        return value, None if ok else "must be a positive integer"
    if kind == "str":
        if isinstance(value, str) and value.strip():
            return value, None
        return value, "must be a non-empty string"
    if kind == "uri":
        if not isinstance(value, str) or not value.strip():
            return value, "must be a non-empty string"
        if not value.strip().lower().startswith(URI_SCHEMES):
            return value, "must be a mongodb:// or mongodb+srv:// connection string"
        return value, None
    if kind == "dbname":
        return value, validate_db_name(value)
    if kind == "collection":
        return value, validate_collection_name(value)
    if kind == "enum":
        text = value.strip() if from_text and isinstance(value, str) else value
        if text in spec.choices:
            return text, None
        return value, "must be one of " + ", ".join(repr(c) for c in spec.choices)
    if kind == "env_file":
        if value is False or (isinstance(value, str) and value.strip()):
            return value, None
        return value, "must be a non-empty string or false"
    if kind == "extensions":
        ok = bool(
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, str) and v.strip() for v in value)
        )
        if not ok:
            return value, "must be a non-empty array of non-empty strings"
        return tuple(v if v.startswith(".") else "." + v for v in value), None
    if kind == "mapping":
        return value, None if isinstance(value, Mapping) else "must be a table/object"
    if kind == "definitions":  # each definition is checked once the config is merged
        ok = isinstance(value, (list, tuple))
        return value, None if ok else "must be a list of collection definitions"
    return value, None


# ------------------------------------------------------------------------------ telemetry

def _layer(
    values: Mapping[str, Any], where: str, issues: list[Issue], *, allow_code: bool
) -> dict[str, Any]:
    """Validate one config layer (file or flags); unknown keys and bad values become issues."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("__proto__", "constructor", "prototype"):
            continue
        spec = _BY_NAME.get(key)
        if spec is None:
            suggestion = suggest(key, _BY_NAME, aliases=_KEY_ALIASES)
            msg = "unknown config key" + (f" (did you mean '{suggestion}'?)" if suggestion else "")
            issues.append(Issue(f"{key} ({where})", msg))
            continue
        if value is None:
            if key == "logger":  # an explicit None silences the logger
                out[key] = None
            continue
        if spec.kind == "code" and not allow_code:
            issues.append(Issue(f"{key} ({where})", "can only be set in migronaut_config.py"))
            continue
        if spec.kind == "fleet":
            if isinstance(value, FleetConfig):  # already parsed (with_overrides, the API)
                out[key] = value
                continue
            fleet, problems = parse_fleet(value, allow_code=allow_code)
            for path, message in problems:
                issues.append(Issue(f"fleet{'.' + path if path else ''} ({where})", message))
            if fleet is not None:
                out[key] = fleet
            continue
        checked, problem = _check_value(spec, value, from_text=False)
        if problem:
            issues.append(Issue(f"{key} ({where})", problem))
            continue
        out[key] = checked
    return out


#: Names of the Node original (and of the environment variables) for a key named otherwise here.
_KEY_ALIASES = {"db": "db_name", "dbName": "db_name", "lock_ttl": "lock_ttl_seconds",
                "lockTtl": "lock_ttl_seconds"}


def _env_layer(environ: Mapping[str, str], issues: list[Issue]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in KEYS:
        if spec.env is None:
            continue
        raw = environ.get(spec.env)
        if raw is None or raw.strip() == "":
            continue
        if spec.kind == "env_file" and raw.strip().lower() in ("false", "0", "no"):
            out[spec.name] = False
            continue
        checked, problem = _check_value(spec, raw, from_text=True)
        if problem:
            issues.append(Issue(spec.env, f"{problem} (got {raw!r})"))
            continue
        out[spec.name] = checked
    return out


def load_env_file(path: Path, environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """Load a ``.env`` file into ``environ`` without overriding a variable already set.

    Parsed as the reference's ``.env`` (core §3.2): ``KEY=VALUE`` lines, ``export``, comments,
    values in ``'``, ``"`` (multi-line) or backtick quotes. A line that does not parse — an
    unterminated quote, a line without ``=`` — is ``CONFIG_INVALID`` naming the file and line,
    checked before any variable is set: half a ``.env`` never configures a run.
    """
    if not path.exists():
        return []
    if not path.is_file():
        raise ConfigInvalidError(
            f"Invalid configuration: env_file: {path} is not a regular file",
            {"issues": [{"path": "env_file", "message": "not a regular file"}]},
        )
    if path.stat().st_size > MAX_ENV_FILE_BYTES:
        raise ConfigInvalidError(
            f"Invalid configuration: env_file: {path} is larger than 1 MB",
            {"issues": [{"path": "env_file", "message": "larger than 1 MB"}]},
        )
    values = parse_env_file(path)
    loaded: list[str] = []
    for key, value in values.items():
        if key not in environ:
            environ[key] = value
            loaded.append(key)
    return loaded


def parse_env_file(path: Path) -> dict[str, str]:
    """The variables of a ``.env`` file (python-dotenv's parser, which never writes to stderr
    this way), with backtick quotes stripped as the reference's parser does."""
    import io

    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise _env_file_error(path, None, f"cannot be read as UTF-8 text ({error})") from error
    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        line = binding.original.line
        if binding.error:
            raise _env_file_error(path, line, _unparsed(binding.original.string))
        if binding.key is None:  # a blank or comment line
            continue
        value = binding.value
        if value is not None and value.startswith("`"):
            value = _backticked(binding.original.string)
            if value is None:
                raise _env_file_error(path, line, f"{binding.key}: a ` quote that never closes")
        if value is None:
            raise _env_file_error(path, line, f"{binding.key}: not KEY=VALUE")
        values[binding.key] = value
    return values


def _unparsed(original: str) -> str:
    """Why python-dotenv refused a statement, in a user's words."""
    first = original.splitlines()[0] if original.strip() else original
    _, equals, value = first.partition("=")
    quote = value.strip()[:1]
    if equals and quote in ("'", '"'):
        return f"{first.partition('=')[0].strip()}: a {quote} quote that never closes"
    return "not KEY=VALUE (a line is `KEY=VALUE`, `export KEY=VALUE` or a `# comment`)"


def _backticked(original: str) -> str | None:
    """The value of a ``KEY=`value``` line between its backticks, or ``None`` when the
    closing one is missing."""
    raw = original.partition("=")[2].strip()
    closing = raw.find("`", 1)
    return raw[1:closing] if closing > 0 else None


def _env_file_error(path: Path, line: int | None, problem: str) -> ConfigInvalidError:
    where = f"{path}, line {line}" if line is not None else str(path)
    return ConfigInvalidError(
        f"Invalid configuration: env_file: {where}: {problem}",
        {"issues": [{"path": "env_file", "message": problem}], "envFile": str(path),
         "envLine": line},
    )


def find_config_file(cwd: Path) -> Path | None:
    for name in CONFIG_FILE_NAMES:
        candidate = cwd / name
        if not candidate.is_file():
            continue
        if name == "pyproject.toml" and _pyproject_table(candidate) is None:
            continue
        return candidate
    return None


def _pyproject_table(path: Path) -> dict[str, Any] | None:
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        return None
    table = data.get("tool", {}).get("migronaut")
    return table if isinstance(table, dict) else None


def read_config_file(path: Path) -> dict[str, Any]:
    """Read one config file into a mapping (a Python config module is executed)."""
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigInvalidError(
                f"Config file is not valid TOML: {path.name}: {error}",
                {"path": str(path)},
                cause=error,
            ) from error
        if path.name == "pyproject.toml":
            table = data.get("tool", {}).get("migronaut", {})
            if not isinstance(table, dict):
                raise ConfigInvalidError(
                    "Config file: [tool.migronaut] in pyproject.toml must be a table",
                    {"path": str(path)},
                )
            return dict(table)
        return data
    if path.suffix == ".py":
        return _read_python_config(path)
    raise ConfigInvalidError(
        f"Config file must be .toml or .py: {path.name}", {"path": str(path)}
    )


def _read_python_config(path: Path) -> dict[str, Any]:
    from migronaut.core.files import load_module

    try:
        module = load_module(path, f"migronaut_config_{abs(hash(str(path)))}")
    except MigronautError:
        raise
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ConfigInvalidError(
            f"Config file failed to load: {path.name}: {error}", {"path": str(path)}, cause=error
        ) from error
    exported = getattr(module, "config", None)
    if exported is None:
        raise ConfigInvalidError(
            f"Config file {path.name} must define `config` "
            "(a mapping, or a function returning one)",
            {"path": str(path)},
        )
    if callable(exported):
        try:
            from migronaut.core._calls import call_user

            # call_user awaits an async factory, also when called from a running event loop
            exported = call_user(exported)
        except MigronautError:
            raise
        except Exception as error:
            raise ConfigInvalidError(
                f"Config factory function failed to resolve: {path.name}: {error}",
                {"path": str(path)},
                cause=error,
            ) from error
    if not isinstance(exported, Mapping):
        raise ConfigInvalidError(
            f"Config file {path.name}: `config` must be a mapping (got {type(exported).__name__})",
            {"path": str(path)},
        )
    return dict(exported)


def load_config(
    flags: Mapping[str, Any] | None = None,
    *,
    config_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    require_db: bool = True,
    lenient: bool = False,
    environ: os._Environ[str] | dict[str, str] | None = None,
    warnings: list[str] | None = None,
    flags_origin: Literal["flag", "argument"] = "argument",
) -> Config:
    """Resolve flags > env > file > defaults into a validated :class:`Config`.

    ``lenient`` (``create``) skips a config file that fails to load, with a warning appended to
    ``warnings``, so an unreachable secret manager never blocks writing a new migration file.
    ``flags_origin`` says what the flags tier is (the CLI's flags, or API arguments), so that
    :meth:`Config.origin` can tell a user which setting to fix.
    """
    env = os.environ if environ is None else environ
    root = Path(cwd or os.getcwd()).resolve()
    flags = dict(flags or {})
    issues: list[Issue] = []
    flag_layer = _layer(flags, "flags", issues, allow_code=True)
    if issues:
        raise _fail(issues)

    env_file = flag_layer.get("env_file", env.get("MIGRONAUT_ENV_FILE") or ".env")
    if isinstance(env_file, str) and env_file.strip().lower() in ("false", "0", "no"):
        env_file = False
    from_dotenv: list[str] = []
    if env_file is not False:
        from_dotenv = load_env_file(root / str(env_file), env)

    source: Path | None = None
    file_layer: dict[str, Any] = {}
    if config_path is not None:
        source = (root / config_path).resolve()
        if not source.is_file():
            raise ConfigInvalidError(
                f"Config file not found: {config_path}", {"path": str(config_path)}
            )
    else:
        source = find_config_file(root)
    if source is not None:
        try:
            raw = read_config_file(source)
        except ConfigInvalidError as error:
            if not lenient:
                raise
            if warnings is not None:
                warnings.append(
                    f"Could not resolve {source.name} — continuing without it ({error})"
                )
            raw = {}
            source = None
        if source is not None:
            file_layer = _layer(
                raw, source.name, issues, allow_code=source.suffix == ".py"
            )
    env_layer = _env_layer(env, issues)
    if issues:
        raise _fail(issues)

    merged: dict[str, Any] = {spec.name: spec.default for spec in KEYS}
    merged["logger"] = DEFAULT_LOGGER
    origins: dict[str, str] = {}
    shown = source.name if source is not None and source.parent == root else str(source)
    for layer, origin in ((file_layer, f"file:{shown}"), (env_layer, "env"),
                          (flag_layer, flags_origin)):
        merged.update(layer)
        for key in layer:
            variable = _BY_NAME[key].env or ""
            origins[key] = origin if origin != "env" else \
                f"dotenv:{variable}" if variable in from_dotenv else f"env:{variable}"
    config = Config(**merged, source=str(source) if source else None, cwd=str(root),
                    origins=origins)

    if require_db:
        if not config.uri and config.client is None:
            issues.append(Issue("uri", "uri is required (set --uri, MIGRONAUT_URI or uri)"))
        if not config.db_name:
            issues.append(
                Issue("db_name", "db_name is required (set --db, MIGRONAUT_DB or db_name)")
            )
    if config.generate_id is not None and not callable(config.generate_id):
        issues.append(Issue("generate_id", "must be a function"))
    telemetry = telemetry_issue(config.telemetry)
    if telemetry is not None:
        issues.append(Issue(*telemetry))
    if issues:
        raise _fail(issues)
    try:
        check_inline_definitions(config)
    except ConfigInvalidError as error:
        if not lenient:
            raise
        if warnings is not None:
            warnings.append(f"Inline collections ignored: {error}")
        config = replace(config, collections=None)
    return config


def check_inline_definitions(config: Config) -> None:
    """Validate the inline ``collections`` — pure data, checked with the rest of the config
    (``collections[2].indexes[0].uniqe``). Definition *files* are not read here: they load only
    when something needs them (``migronaut.declared.sources.load_definitions``)."""
    if config.collections is None:
        return
    from migronaut.declared.inline import reserved_names, validate_inline
    from migronaut.declared.issues import Issues as DefinitionIssues
    from migronaut.declared.issues import invalid_definitions

    issues = DefinitionIssues()
    validate_inline(config.collections, issues, reserved_names(
        migrations_collection=config.migrations_collection,
        lock_collection=config.lock_collection,
        converge_log_collection=config.converge_log_collection,
        background_collection=config.background_collection,
        runs_collection=config.runs_collection,
    ))
    if issues:
        raise invalid_definitions(issues)


def with_overrides(config: Config, **values: Any) -> Config:
    """A copy with some keys replaced, validated like flags."""
    issues: list[Issue] = []
    checked = _layer(values, "flags", issues, allow_code=True)
    if issues:
        raise _fail(issues)
    updated = replace(config, **checked,
                      origins={**config.origins, **dict.fromkeys(checked, "argument")})
    check_inline_definitions(updated)
    return updated
