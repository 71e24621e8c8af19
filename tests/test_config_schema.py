"""The published JSON Schema of ``migronaut.toml`` / ``[tool.migronaut]``: generated from the
loader's own tables, and judged against the loader — what it loads the schema accepts, what it
refuses for a key's type or name the schema refuses too."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from migronaut.config_schema import config_schema, schema_text
from migronaut.core.config import KEYS, load_config
from migronaut.errors import ConfigInvalidError

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "docs" / "schema" / "migronaut.schema.json"
VALIDATOR = jsonschema.Draft202012Validator(config_schema())

#: A file a user might write: most keys set, a Celery table, an inline definition.
FULL = """
uri = "mongodb://127.0.0.1:27017/?directConnection=true"
db_name = "app"
migrations_dir = "migrations"
migrations_collection = "changelog"
lock_ttl_seconds = 120
strict = true
use_transaction = false
file_extensions = ["py"]
sequential = true
environment = "staging"
on_lock_lost = "warn"
on_out_of_order = "error"
env_file = false
timeout_ms = 60000
converge_after_up = true
on_search_unavailable = "skip"
background_drift = "both"
log_format = "json"

[client_options]
appname = "shop"

[celery]
queue = "shop-migrations"
sync_interval_s = 30
verify_interval_ms = false

[[collections]]
name = "users"
validation_level = "moderate"
indexes = [
  { key = { email = 1 }, unique = true, collation = { locale = "en", strength = 2 } },
  { key = { createdAt = -1 }, expireAfterSeconds = 3600 },
]
versioning = { current = 2, min = 1 }

[[collections]]
name = "events.archive"
search_indexes = [{ definition = { mappings = { dynamic = true } } }]
"""

#: Values the loader refuses for their type or name — the schema must refuse each too.
REFUSED = [
    ("lock_ttl_seconds", 0), ("lock_ttl_seconds", "60"), ("lock_ttl_seconds", True),
    ("strict", "yes"), ("on_lock_lost", "abort!"), ("uri", "http://example.com"),
    ("db_name", "my app"), ("db_name", "a.b"), ("migrations_collection", "system.x"),
    ("migrations_collection", "a..b"), ("file_extensions", []), ("env_file", ""),
    ("env_file", True), ("log_format", "xml"), ("lokc_ttl_seconds", 60),
    ("celery", {"slice_ms": 0}), ("celery", {"queue": "a:b"}), ("celery", {"qeueu": "x"}),
    ("collections", [{"name": "users", "indexes": [{"key": {"a": 1}, "uniqe": True}]}]),
    ("collections", [{"name": "users", "validation_level": "loose", "validator": {}}]),
    ("collections", [{"name": "users", "versioning": {"current": 0}}]),
    ("collections", [{"name": "users", "indxes": []}]),
]


def _load(tmp_path: Path, text: str) -> Any:
    (tmp_path / "migrations").mkdir(exist_ok=True)
    (tmp_path / "migronaut.toml").write_text(text, encoding="utf-8")
    return load_config(cwd=tmp_path, environ={})


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


def test_the_published_schema_is_the_generated_one() -> None:
    assert PUBLISHED.read_text(encoding="utf-8") == schema_text(), (
        "regenerate it: python -c 'from migronaut.config_schema import schema_text; "
        "open(\"docs/schema/migronaut.schema.json\", \"w\").write(schema_text())'")
    jsonschema.Draft202012Validator.check_schema(config_schema())


def test_every_key_a_file_can_hold_is_described_and_code_only_keys_are_not() -> None:
    properties = config_schema()["properties"]
    file_keys = {spec.name for spec in KEYS if spec.kind != "code"}
    assert set(properties) == file_keys
    assert {"client", "hooks", "logger"}.isdisjoint(properties)
    assert all(schema["description"].strip() for schema in properties.values())
    celery = properties["celery"]["properties"]
    assert "slice_ms" in celery and all(c["description"] for c in celery.values())


def test_the_configuration_page_lists_every_key_of_the_schema() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z_]+)`", page, flags=re.MULTILINE))
    listed |= {name for row in re.findall(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)+) \|", page,
                                          flags=re.MULTILINE)
               for name in re.findall(r"`([a-z_]+)`", row)}
    schema = config_schema()["properties"]
    assert set(schema) - listed == set()
    assert set(schema["celery"]["properties"]) - listed == set()


def test_a_full_file_the_loader_accepts_is_valid(tmp_path: Path) -> None:
    config = _load(tmp_path, FULL)
    assert config.lock_ttl_seconds == 120 and len(config.collections or ()) == 2
    assert list(VALIDATOR.iter_errors(tomllib.loads(FULL))) == []


def test_defaults_in_the_schema_are_the_loaders(tmp_path: Path) -> None:
    config = _load(tmp_path, 'uri = "mongodb://h/"\ndb_name = "app"\n')
    for name, schema in config_schema()["properties"].items():
        if "default" in schema:
            value = getattr(config, name)
            assert (list(value) if isinstance(value, tuple) else value) == schema["default"]


@pytest.mark.parametrize(("key", "value"), REFUSED, ids=[f"{k}={v!r}" for k, v in REFUSED])
def test_what_the_loader_refuses_the_schema_refuses(tmp_path: Path, key: str, value: Any) -> None:
    base = {"uri": "mongodb://h/", "db_name": "app", key: value}
    text = "\n".join(f"{k} = {_toml_value(v)}" for k, v in base.items()) + "\n"
    assert tomllib.loads(text) == base
    with pytest.raises(ConfigInvalidError) as refused:
        config = _load(tmp_path, text)
        if key == "celery":  # the Celery table is checked when the executor reads it
            from migronaut.executors.celery.settings import resolve_settings

            resolve_settings(config.celery)
    assert refused.value.exit_code == 6
    assert list(VALIDATOR.iter_errors(base)), f"the schema accepts {key} = {value!r}"
