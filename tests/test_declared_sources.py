"""Declared collections from their sources: inline ``collections`` checked with the config, the
files of ``collections_dir`` (``.py`` modules, the original's ``.json``) loaded only on demand,
and every issue of every source in one ``CONFIG_INVALID`` (reference collections.md §1.1)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers.engine import make_migrator, write_simple
from migronaut.core.config import Config, load_config, with_overrides
from migronaut.declared.sources import load_definitions
from migronaut.errors import ConfigInvalidError

#: A Node project's definitions, byte for byte as the original's docs and examples write them.
NODE_PLANS = """{
  "versioning": { "current": 2, "min": 1 },
  "indexes": [{ "key": { "seats": 1 } }],
  "searchIndexes": [{ "definition": { "mappings": { "dynamic": true } } }],
  "validator": {
    "$jsonSchema": {
      "bsonType": "object",
      "required": ["seats"],
      "properties": { "seats": { "bsonType": "number", "minimum": 1 } }
    }
  }
}
"""
NODE_USERS = """{
  "name": "users",
  "indexes": [
    { "key": { "email": 1 }, "unique": true },
    { "key": { "createdAt": 1 }, "expireAfterSeconds": 2592000 },
    { "key": { "name": 1 }, "name": "name_ci", "collation": { "locale": "en", "strength": 2 } },
    { "key": { "title": "text", "body": "text" }, "weights": { "title": 10 },
      "default_language": "english", "background": true },
    { "key": { "tenant": 1, "at": -1 },
      "partialFilterExpression": { "deleted": { "$exists": false } }, "sparse": false }
  ],
  "validator": { "$jsonSchema": { "required": ["email"] } },
  "validationLevel": "moderate",
  "validationAction": "warn",
  "prune": true
}
"""
PY_ORDERS = '''
"""Orders: one definition per file, module-level names like a migration file."""
import re
from datetime import datetime

from bson import Regex
from pymongo import ASCENDING, DESCENDING

RETENTION = 3600  # an UPPER_CASE constant is not part of the definition
_helper = {"ignored": True}

indexes = [
    {"key": [("customer", ASCENDING), ("at", DESCENDING)]},
    {"key": {"ref": 1}, "unique": True,
     "partialFilterExpression": {"ref": {"$type": "string"}}},
    {"key": {"at": 1}, "expireAfterSeconds": RETENTION},
]
search_indexes = [{"name": "by_text", "definition": {"mappings": {"dynamic": True}}}]
validator = {"email": {"$regex": re.compile("@", re.IGNORECASE)}, "kind": Regex("^a", "m")}
validation_level = "strict"
versioning = {"current": 1, "min": 0, "revision_field": "rev"}
'''


def config_for(root: Path, **flags: Any) -> Config:
    return load_config(flags, cwd=root, require_db=False, environ={})


def write(root: Path, relative: str, text: str) -> Path:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(text) if relative.endswith(".py") else text,
                      encoding="utf-8")
    return target


def write_all(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        write(root, relative, text)


def load_error(config: Config) -> ConfigInvalidError:
    with pytest.raises(ConfigInvalidError) as caught:
        load_definitions(config)
    error = caught.value
    assert error.code == "CONFIG_INVALID" and error.exit_code == 6
    return error


def issue_map(error: ConfigInvalidError) -> dict[str, str]:
    return {issue["path"]: issue["message"] for issue in error.context["issues"]}


# ------------------------------------------------------------------------- files


def test_node_json_definitions_load_unchanged(tmp_path: Path) -> None:
    write(tmp_path, "collections/plans.json", NODE_PLANS)
    write(tmp_path, "collections/users.json", NODE_USERS)
    plans, users = load_definitions(config_for(tmp_path, collections_dir="collections"))
    assert plans.name == "plans" and plans.source == "plans.json"
    assert plans.versioning is not None and plans.versioning.current == 2
    assert plans.indexes is not None and [i.name for i in plans.indexes] == ["seats_1"]
    assert plans.search_indexes is not None and plans.search_indexes[0].name == "default"
    assert users.name == "users" and users.prune is True
    assert (users.validation_level, users.validation_action) == ("moderate", "warn")
    assert users.indexes is not None
    assert [i.name for i in users.indexes] == ["email_1", "createdAt_1", "name_ci",
                                               "title_text_body_text", "tenant_1_at_-1"]
    text = users.indexes[3]
    assert text.server_key == (("_fts", "text"), ("_ftsx", 1))
    assert dict(text.options) == {"weights": {"title": 10}, "default_language": "english"}
    assert "sparse" not in users.indexes[4].options


def test_a_python_definition_file(tmp_path: Path) -> None:
    write(tmp_path, "collections/orders.py", PY_ORDERS)
    (orders,) = load_definitions(config_for(tmp_path, collections_dir="collections"))
    assert orders.name == "orders" and orders.source == "orders.py"
    assert orders.indexes is not None
    assert [i.name for i in orders.indexes] == ["customer_1_at_-1", "ref_1", "at_1"]
    assert orders.indexes[2].options["expireAfterSeconds"] == 3600
    assert orders.search_indexes is not None and orders.search_indexes[0].name == "by_text"
    assert orders.validator is not None and set(orders.validator) == {"email", "kind"}
    assert orders.versioning is not None and orders.versioning.revision_field == "rev"


def test_a_python_file_may_set_its_name(tmp_path: Path) -> None:
    write(tmp_path, "collections/x.py", 'name = "audit_log"\nindexes = []\n')
    (definition,) = load_definitions(config_for(tmp_path, collections_dir="collections"))
    assert definition.name == "audit_log"


def test_a_function_or_class_defined_in_a_python_file_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "collections/users.py", """
        class User:
            pass

        def make():
            return []

        indexes = []
    """)
    error = load_error(config_for(tmp_path, collections_dir="collections"))
    found = issue_map(error)
    assert set(found) == {"users.py: User", "users.py: make"}
    assert found["users.py: User"].startswith("is a class: a definition file holds data")
    assert found["users.py: make"].startswith("is a function: a definition file holds data")


def test_typos_in_a_python_file_are_reported(tmp_path: Path) -> None:
    write(tmp_path, "collections/users.py", "indexs = [{'key': {'a': 1}}]\n")
    found = issue_map(load_error(config_for(tmp_path, collections_dir="collections")))
    assert found["users.py: indexs"].endswith("did you mean 'indexes'?")
    assert found["users.py"].startswith("has nothing to manage")


def test_every_issue_of_every_file_in_one_error(tmp_path: Path) -> None:
    write_all(tmp_path, {
        "collections/a.py": "indexes = [{'key': {'a': 1}, 'uniqe': True}]\n",
        "collections/b.json": "{}",
        "collections/bad.json": '{"indexes": [{"key": {}}]}',
        "collections/broken.json": '{"indexes": [}',
        "collections/crash.py": "raise RuntimeError('boom')\n",
        "collections/syntax.py": "indexes = [\n",
        "collections/good.json": '{"indexes": []}',
    })
    error = load_error(config_for(tmp_path, collections_dir="collections"))
    assert error.message == ("Invalid collection definition(s): a.py: indexes[0].uniqe: is not "
                             "a supported index option (expected key, name, unique, sparse, "
                             "hidden, expireAfterSeconds, partialFilterExpression, collation, "
                             "wildcardProjection, weights, default_language, language_override, "
                             "bits, min, max, storageEngine, textIndexVersion, "
                             "2dsphereIndexVersion, background) — did you mean 'unique'? "
                             "(and 5 more)")
    found = issue_map(error)
    assert list(found) == ["a.py: indexes[0].uniqe", "b.json", "bad.json: indexes[0].key",
                           "broken.json", "crash.py", "syntax.py"]
    assert found["b.json"].startswith("has nothing to manage")
    assert found["bad.json: indexes[0].key"] == "must name at least one field"
    assert found["broken.json"].startswith("is not valid JSON: Expecting value (line 1")
    assert found["crash.py"] == "failed to load: RuntimeError: boom"
    assert found["syntax.py"].startswith("failed to load: SyntaxError:")
    assert "cause" in error.context


def test_a_json_file_must_hold_one_object(tmp_path: Path) -> None:
    write(tmp_path, "collections/list.json", "[]")
    assert issue_map(load_error(config_for(tmp_path, collections_dir="collections"))) == {
        "list.json": "must be a mapping (got list)"}


def test_directory_scanning_rules(tmp_path: Path) -> None:
    base = tmp_path / "collections"
    write_all(tmp_path, {
        "collections/b.json": '{"indexes": []}',
        "collections/a.py": "indexes = []\n",
        "collections/.hidden.json": "not json",
        "collections/README.md": "# not a definition",
        "collections/notes.pyi": "x: int\n",
        "collections/__init__.py": "raise RuntimeError('never imported')\n",
        "collections/.json": "not json",  # the name must be longer than .json
        "collections/nested/c.json": '{"indexes": []}',
    })
    (base / "dir.json").mkdir()
    names = [d.name for d in load_definitions(config_for(tmp_path,
                                                           collections_dir="collections"))]
    assert names == ["a", "b"]


def test_the_configured_python_extensions_count(tmp_path: Path) -> None:
    write(tmp_path, "collections/a.defn.py", "indexes = []\n")
    write(tmp_path, "collections/b.py", "indexes = []\n")
    config = config_for(tmp_path, collections_dir="collections", file_extensions=["defn.py"])
    assert [d.name for d in load_definitions(config)] == ["a"]


def test_duplicates_across_sources_name_where_it_was_declared(tmp_path: Path) -> None:
    write(tmp_path, "collections/a.json", '{"name": "users", "indexes": []}')
    write(tmp_path, "collections/b.py", "name = 'users'\nindexes = []\n")
    write(tmp_path, "collections/orders.json", '{"indexes": []}')
    config = config_for(tmp_path, collections_dir="collections",
                        collections=[{"name": "orders", "indexes": []}])
    found = issue_map(load_error(config))
    assert found == {"b.py: name": '"users" is already declared in a.json',
                     "orders.json: name": '"orders" is already declared in collections[0]'}


def test_inline_first_then_files_in_name_order(tmp_path: Path) -> None:
    write(tmp_path, "collections/z.json", '{"indexes": []}')
    write(tmp_path, "collections/m.py", "indexes = []\n")
    config = config_for(tmp_path, collections_dir="collections",
                        collections=[{"name": "q", "validator": {}},
                                     {"name": "b", "indexes": []}])
    assert [d.name for d in load_definitions(config)] == ["q", "b", "m", "z"]


def test_reserved_names_in_files_follow_the_config(tmp_path: Path) -> None:
    write(tmp_path, "collections/history.json", '{"indexes": []}')
    config = config_for(tmp_path, collections_dir="collections",
                        converge_log_collection="history")
    assert issue_map(load_error(config)) == {
        "history.json: name": "the file name gives 'history', which \"history\" is one of "
                              "migronaut's own collections and cannot be declared; set name "
                              "explicitly in the definition"}


def test_a_missing_collections_dir(tmp_path: Path) -> None:
    error = load_error(config_for(tmp_path, collections_dir="nowhere"))
    assert error.message == f"collections_dir not found: {tmp_path / 'nowhere'}"
    write(tmp_path, "file.json", "{}")
    error = load_error(config_for(tmp_path, collections_dir="file.json"))
    assert error.message.startswith("collections_dir not found:")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs permissions")
def test_an_unreadable_collections_dir(tmp_path: Path) -> None:
    base = tmp_path / "collections"
    base.mkdir()
    base.chmod(0)
    try:
        error = load_error(config_for(tmp_path, collections_dir="collections"))
    finally:
        base.chmod(0o755)
    assert error.message.startswith("collections_dir could not be read:")


def test_nothing_set_means_no_definitions(tmp_path: Path) -> None:
    assert load_definitions(config_for(tmp_path)) == ()


def test_reload_reads_an_edited_python_file_again(tmp_path: Path) -> None:
    path = write(tmp_path, "collections/a.py", "indexes = []\n")
    config = config_for(tmp_path, collections_dir="collections", reload_migrations=True)
    assert load_definitions(config)[0].indexes == ()
    path.write_text("indexes = [{'key': {'b': 1}}]\n", encoding="utf-8")
    indexes = load_definitions(config)[0].indexes
    assert indexes is not None and [i.name for i in indexes] == ["b_1"]


# ------------------------------------------------------------------------- config wiring


def test_inline_collections_are_validated_when_the_config_resolves(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalidError) as caught:
        config_for(tmp_path, collections=[
            {"name": "a", "indexes": []}, {"name": "b", "indexes": []},
            {"name": "c", "indexes": [{"key": {"a": 1}, "uniqe": True}, {"key": {}}]}])
    error = caught.value
    assert error.exit_code == 6
    assert error.message.startswith("Invalid collection definition(s): "
                                    "collections[2].indexes[0].uniqe: is not a supported")
    assert error.message.endswith(" (and 1 more)")
    assert [i["path"] for i in error.context["issues"]] == [
        "collections[2].indexes[0].uniqe", "collections[2].indexes[1].key"]


def test_inline_collections_in_migronaut_toml(tmp_path: Path) -> None:
    write(tmp_path, "migronaut.toml", textwrap.dedent("""
        [[collections]]
        name = "users"
        validation_level = "moderate"
        validator = { "$jsonSchema" = { required = ["email"] } }

        [[collections.indexes]]
        key = { email = 1 }
        unique = true
    """))
    config = config_for(tmp_path)
    (users,) = load_definitions(config)
    assert users.indexes is not None and users.indexes[0].options == {"unique": True}
    write(tmp_path, "migronaut.toml", 'collections = "users"\n')
    with pytest.raises(ConfigInvalidError) as caught:
        config_for(tmp_path)
    assert caught.value.context["issues"] == [{
        "path": "collections (migronaut.toml)",
        "message": "must be a list of collection definitions"}]
    write(tmp_path, "migronaut.toml", '[[collections]]\nname = "_migronaut_locks"\n'
                                      "indexes = []\n")
    with pytest.raises(ConfigInvalidError) as caught:
        config_for(tmp_path)
    assert caught.value.context["issues"][0]["path"] == "collections[0].name"


def test_overrides_are_validated_too(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    with pytest.raises(ConfigInvalidError) as caught:
        with_overrides(config, collections=[{"name": "a"}])
    assert caught.value.context["issues"][0]["path"] == "collections[0]"


def test_create_is_not_blocked_by_bad_inline_collections(tmp_path: Path) -> None:
    warnings: list[str] = []
    config = load_config({"collections": [{"name": "a"}]}, cwd=tmp_path, require_db=False,
                         environ={}, lenient=True, warnings=warnings)
    assert config.collections is None
    assert warnings and warnings[0].startswith("Inline collections ignored:")


def test_the_environment_sets_collections_dir(tmp_path: Path) -> None:
    write(tmp_path, "defs/a.json", '{"indexes": []}')
    config = load_config({}, cwd=tmp_path, require_db=False,
                         environ={"MIGRONAUT_COLLECTIONS_DIR": "defs"})
    assert config.collections_dir == "defs"
    assert config.origin("collections_dir") == \
        "the MIGRONAUT_COLLECTIONS_DIR environment variable"
    assert [d.name for d in load_definitions(config)] == ["a"]


def test_resolving_the_config_never_reads_definition_files(tmp_path: Path) -> None:
    write(tmp_path, "collections/boom.py", "raise RuntimeError('imported too early')\n")
    write(tmp_path, "collections/bad.json", "{")
    config = config_for(tmp_path, collections_dir="collections")
    assert config.collections_dir == "collections"
    found = issue_map(load_error(config))
    assert found["bad.json"].startswith("is not valid JSON")
    assert found["boom.py"] == "failed to load: RuntimeError: imported too early"


# ------------------------------------------------------------------------- lazy, end to end


def test_a_broken_definition_file_does_not_block_status_or_up(project: Any, cli: Any) -> None:
    write_simple(project, "0001_a")
    project.write("collections/users.py", "raise RuntimeError('broken definition')\n")
    project.write("collections/orders.json", "{ not json")
    with make_migrator(project, collections_dir="collections") as migrator:
        assert [row.file for row in migrator.status()] == ["0001_a.py"]
        migrator.up()
        assert [row.status for row in migrator.status()] == ["applied"]
        with pytest.raises(ConfigInvalidError) as caught:
            load_definitions(migrator.config)
    assert [i["path"] for i in caught.value.context["issues"]] == ["orders.json", "users.py"]
    result = cli("status", "--json", env={"MIGRONAUT_COLLECTIONS_DIR": "collections"})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)[0]["file"] == "0001_a.py"


def test_bad_inline_collections_fail_the_cli_with_every_issue(project: Any, cli: Any) -> None:
    write_simple(project, "0001_a")
    project.write("migronaut.toml", '[[collections]]\nname = "users"\n'
                                    '[[collections.indexes]]\nkey = { email = 1 }\n'
                                    "uniqe = true\n")
    result = cli("status")
    assert result.exit_code == 6
    assert "CONFIG_INVALID: Invalid collection definition(s): collections[0].indexes[0].uniqe: " \
           "is not a supported index option" in result.stderr
