"""Writing new files: migration files (``create``) and config files (``init``). Never connects.

Invariant: nothing is ever overwritten by accident — files are created exclusively, and a
collision is ``MIGRATION_FILE_EXISTS`` / ``CONFIG_FILE_EXISTS``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

from migronaut._redact import redact
from migronaut.core.files import directory_os_error, unusable_directory
from migronaut.errors import (
    ConfigFileExistsError,
    ConfigInvalidError,
    MigrationFileExistsError,
    MigrationFileNotFoundError,
)

__all__ = ["MIGRATION_TEMPLATE", "slugify", "write_config", "write_migration"]

MAX_TEMPLATE_BYTES = 1024 * 1024

MIGRATION_TEMPLATE = '''"""{title}"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migronaut import MigrationContext

# use_transaction = True  # run up/down and the changelog write in one transaction
# timeout_ms = 60_000     # stop waiting for this migration after a minute


def up(ctx: MigrationContext) -> None:
    db = ctx.db
    # db.users.update_many({{}}, {{"$set": {{"active": True}}}}, session=ctx.session)


def down(ctx: MigrationContext) -> None:
    db = ctx.db
    # db.users.update_many({{}}, {{"$unset": {{"active": ""}}}}, session=ctx.session)
'''


def slugify(name: str) -> str:
    """Lower-case, every run of non-letters/digits (Unicode-aware) becomes ``_``."""
    slug = re.sub(r"[^\w]+|_+", "_", name.strip().lower()).strip("_")
    if not slug:
        raise ConfigInvalidError(
            f"Migration name must contain at least one letter or digit: {name!r}",
            {"option": "name"},
        )
    return slug


def _prefix(directory: Path, extensions: tuple[str, ...], sequential: bool) -> str:
    if not sequential:
        return dt.datetime.now().strftime("%Y%m%d%H%M%S")
    highest = 0
    if directory.is_dir():
        for entry in directory.iterdir():
            match = re.match(r"^(\d+)[_-]", entry.name)
            if match and entry.name.endswith(extensions):
                highest = max(highest, int(match.group(1)))
    return f"{highest + 1:04d}"


def write_migration(
    directory: Path,
    name: str,
    *,
    extensions: tuple[str, ...] = (".py",),
    sequential: bool = False,
    template_path: Path | None = None,
    template: str | None = None,
    origin: str | None = None,
) -> Path:
    """Write ``<prefix>_<slug>.py``: ``template_path``'s content, else ``template`` (a
    ``str.format`` template taking ``title``), else the built-in migration template.
    ``origin`` names the setting that chose ``directory`` (for the error when it is a file)."""
    slug = slugify(name)
    if template_path is not None:
        if template_path.suffix != ".py":
            raise ConfigInvalidError(
                f"Template must be a .py file: {template_path}",
                {"templatePath": str(template_path)},
            )
        if not template_path.is_file():
            raise MigrationFileNotFoundError(
                f"Template not found: {template_path}", {"templatePath": str(template_path)}
            )
        if template_path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise ConfigInvalidError(
                f"Template is larger than 1 MB: {template_path}",
                {"templatePath": str(template_path)},
            )
        try:
            content = template_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigInvalidError(
                f"Template cannot be read as UTF-8 text: {template_path}: {error}",
                {"templatePath": str(template_path)},
            ) from error
    else:
        content = (template or MIGRATION_TEMPLATE).format(
            title=name.strip().replace('"""', "'''")
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:  # a file where a directory should be
        raise unusable_directory(directory, origin) from error
    except OSError as error:
        raise directory_os_error(directory, "cannot be created", error) from error
    path = directory / f"{_prefix(directory, extensions, sequential)}_{slug}.py"
    try:
        with path.open("x", encoding="utf-8") as handle:
            handle.write(content)
    except FileExistsError as error:
        raise MigrationFileExistsError(
            f"Migration file already exists: {path.name}", {"path": str(path)}
        ) from error
    except OSError as error:
        raise ConfigInvalidError(
            f"Cannot write {path}: {error.strerror or error}", {"path": str(path)}
        ) from error
    return path


_TOML_TEMPLATE = """# migronaut configuration. Every key can also be set as a MIGRONAUT_*
# environment variable (which wins over this file) or a command-line flag (which wins over both).

uri = {uri}              # MIGRONAUT_URI
db_name = {db}            # MIGRONAUT_DB
migrations_dir = {dir}    # MIGRONAUT_MIGRATIONS_DIR

# Bookkeeping collections (shared with the Node.js migronaut when both point here).
migrations_collection = "_migronaut_migrations"  # MIGRONAUT_COLLECTION
lock_collection = "_migronaut_locks"             # MIGRONAUT_LOCK_COLLECTION

lock_ttl_seconds = 60        # MIGRONAUT_LOCK_TTL: a crashed run's lock frees itself after this
strict = false               # MIGRONAUT_STRICT: refuse to run when an applied file was edited
use_transaction = false      # MIGRONAUT_USE_TRANSACTION: needs a replica set
on_out_of_order = "warn"     # MIGRONAUT_ON_OUT_OF_ORDER: warn | error | allow
# timeout_ms = 600000        # MIGRONAUT_TIMEOUT_MS: per-migration timeout
# sequential = false         # MIGRONAUT_SEQUENTIAL: 0001_ names instead of timestamps

# Hooks, a logger, an injected client or telemetry need Python: use migronaut_config.py
# (`migronaut init --format py`).
"""

_PY_TEMPLATE = '''"""migronaut configuration as Python: how to pass hooks, a logger or a client."""

from __future__ import annotations

import os


def before_all(ctx):
    ctx.logger.info("starting migrations")


config = {{
    "uri": os.environ.get("MIGRONAUT_URI", {uri}),
    "db_name": {db},
    "migrations_dir": {dir},
    "lock_ttl_seconds": 60,
    "strict": False,
    "use_transaction": False,
    "hooks": {{"before_all": before_all}},
}}
'''

_SECRET_TEMPLATE = '''"""migronaut configuration read from a secret manager at start-up.

`config` may be a function (sync or async): migronaut calls it once per command and keeps the
secret in memory only. Environment variables and flags still override what it returns.
"""

from __future__ import annotations

import json
import os


async def load_mongo_secret() -> dict[str, str]:
    """Example with AWS Secrets Manager (pip install boto3); any provider works the same way."""
    import boto3  # type: ignore[import-not-found]

    secret_id = os.environ.get("MONGO_SECRET_ID", "prod/myapp/mongo")
    client = boto3.client("secretsmanager")
    value = client.get_secret_value(SecretId=secret_id)["SecretString"]
    return json.loads(value)  # {{"uri": "...", "db_name": "..."}}


async def config() -> dict[str, object]:
    secret = await load_mongo_secret()
    return {{
        "uri": secret["uri"],
        "db_name": secret.get("db_name", {db}),
        "migrations_dir": {dir},
    }}
'''


def _mask_uri(uri: str) -> tuple[str, bool]:
    """The URI with its password and secret query parameters masked; whether anything was."""
    masked = redact(uri)
    return masked, masked != uri


def write_config(
    directory: Path,
    *,
    fmt: str = "toml",
    secret_provider: bool = False,
    force: bool = False,
    uri: str | None = None,
    db_name: str | None = None,
    migrations_dir: str | None = None,
) -> tuple[Path, Path | None, list[str]]:
    """Write ``migronaut.toml`` or ``migronaut_config.py`` and make the migrations directory it
    names; returns the file, the directory when it was made (``None``: it existed) and
    warnings."""
    if fmt not in ("toml", "py"):
        raise ConfigInvalidError(
            f"--format must be 'toml' or 'py' (got {fmt!r})", {"option": "format"}
        )
    if secret_provider and fmt != "py":
        raise ConfigInvalidError(
            "--secret-provider needs --format py (a TOML file cannot call code)",
            {"option": "secret-provider"},
        )
    warnings: list[str] = []
    masked, had_secret = _mask_uri(uri or "mongodb://localhost:27017")
    if had_secret:
        warnings.append(
            "The URI contains credentials — they were masked in the file; "
            "set MIGRONAUT_URI in the environment instead"
        )
    values = {
        "uri": json.dumps(masked),
        "db": json.dumps(db_name or "myapp"),
        "dir": json.dumps(migrations_dir or "./migrations"),
    }
    if fmt == "toml":
        path, text = directory / "migronaut.toml", _TOML_TEMPLATE.format(**values)
    else:
        template = _SECRET_TEMPLATE if secret_provider else _PY_TEMPLATE
        path, text = directory / "migronaut_config.py", template.format(**values)
    if path.exists() and not force:
        raise ConfigFileExistsError(
            f"Config file already exists: {path.name} (use --force to overwrite)",
            {"path": str(path)},
        )
    created = _make_directory(directory / (migrations_dir or "./migrations"))
    path.write_text(text, encoding="utf-8")
    return path, created, warnings


def _make_directory(directory: Path) -> Path | None:
    """The migrations directory ``init`` names, made when missing (its path then, else
    ``None``): every command after ``init`` — ``status``, ``up``, ``audit`` — can run at once,
    also for a project that declares collections and has no migration yet."""
    if directory.is_dir():
        return None
    try:
        directory.mkdir(parents=True)
    except (FileExistsError, NotADirectoryError) as error:  # a file where a directory should be
        raise unusable_directory(directory, "migronaut init") from error
    except OSError as error:
        raise directory_os_error(directory, "cannot be created", error) from error
    return directory
