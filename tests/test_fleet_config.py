"""The ``[fleet]`` table: every source, every policy key, every bad input refused as
``CONFIG_INVALID`` naming ``fleet.<key>`` before anything connects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from migronaut.core.config import load_config
from migronaut.errors import ConfigInvalidError
from migronaut.fleet.config import DEFAULT_CLUSTER, FleetConfig


def _load(tmp_path: Path, text: str, *, name: str = "migronaut.toml") -> Any:
    (tmp_path / "migrations").mkdir(exist_ok=True)
    (tmp_path / name).write_text(text, encoding="utf-8")
    return load_config(cwd=tmp_path, environ={}, require_db=False)


def test_no_fleet_table_is_none(tmp_path: Path) -> None:
    assert _load(tmp_path, 'uri = "mongodb://h/"\n').fleet is None


def test_a_top_level_source_is_the_default_cluster_with_the_policy_defaults(
        tmp_path: Path) -> None:
    config = _load(tmp_path, 'uri = "mongodb://h/"\n[fleet]\npattern = "tenant_*"\n')
    fleet = config.fleet
    assert isinstance(fleet, FleetConfig)
    (cluster,) = fleet.clusters
    assert (cluster.name, cluster.uri, cluster.source.kind, cluster.source.pattern) == \
        (DEFAULT_CLUSTER, None, "pattern", "tenant_*")
    assert (fleet.admin_db, fleet.concurrency, fleet.canary, fleet.max_failures, fleet.order,
            fleet.on_lock) == ("migronaut_fleet", 4, 0, None, "name", "skip")


def test_every_source_kind_and_several_clusters_in_pyproject(tmp_path: Path) -> None:
    config = _load(tmp_path, """
[tool.migronaut]
uri = "mongodb://h/"
[tool.migronaut.fleet]
names = ["a", "b"]
concurrency = 8
per_cluster_concurrency = 2
canary = 1
max_failures = 0
order = "size"
on_lock = "wait"
admin_db = "ops"
[tool.migronaut.fleet.clusters.eu]
uri = "mongodb://eu/"
regex = "^t_[0-9]+$"
[tool.migronaut.fleet.clusters.us]
uri = "mongodb://us/"
registry = { db = "control", collection = "tenants", field = "db", filter = { active = true } }
[tool.migronaut.fleet.clusters.asia]
uri = "mongodb://asia/"
callable = "tenants_module:list_tenants"
""", name="pyproject.toml")
    fleet = config.fleet
    assert [(c.name, c.source.kind) for c in fleet.clusters] == [
        ("default", "names"), ("eu", "regex"), ("us", "registry"), ("asia", "callable")]
    registry = fleet.cluster("us").source.registry
    assert (registry.db, registry.collection, registry.field, dict(registry.filter)) == \
        ("control", "tenants", "db", {"active": True})
    assert (fleet.concurrency, fleet.per_cluster_concurrency, fleet.canary, fleet.max_failures,
            fleet.order, fleet.on_lock, fleet.admin_db) == (8, 2, 1, 0, "size", "wait", "ops")
    assert config.public_view()["fleet"]["clusters"]["eu"] == {
        "uri": "mongodb://eu/", "regex": "^t_[0-9]+$"}


BAD = [
    ("concurrency = 0", "fleet.concurrency", "integer from 1 to 256"),
    ("concurrency = true", "fleet.concurrency", "integer from 1 to 256"),
    ('concurrency = "4"', "fleet.concurrency", "integer from 1 to 256"),
    ("max_failures = -1", "fleet.max_failures", "integer from 0"),
    ('order = "alpha"', "fleet.order", "'name', 'size', 'random'"),
    ('on_lock = "block"', "fleet.on_lock", "'skip', 'wait'"),
    ('admin_db = "my db"', "fleet.admin_db", "valid database name"),
    ("concurency = 2", "fleet.concurency", "did you mean 'concurrency'"),
    ('regex = "("', "fleet.regex", "not a valid regular expression"),
    ('callable = "no_colon"', "fleet.callable", "'module:function'"),
    ("names = []", "fleet.names", "non-empty array"),
    ('registry = { db = "c", collection = "t" }', "fleet.registry.field", "field holding"),
    ('registry = { db = "a.b", collection = "t", field = "x" }', "fleet.registry.db",
     "valid database name"),
    ('registry = { db = "c", collection = "t", field = "x", fliter = {} }',
     "fleet.registry.fliter", "did you mean 'filter'"),
    ('clusters = { eu = { uri = "http://x", names = ["a"] } }', "fleet.clusters.eu.uri",
     "mongodb://"),
    ('clusters = { default = { uri = "mongodb://x/", names = ["a"] } }',
     "fleet.clusters.default", "top-level source's cluster"),
    ('clusters = { eu = { uri = "mongodb://x/" } }', "fleet.clusters.eu",
     "exactly one tenant source"),
    ('clusters = { eu = { uri = "mongodb://x/", names = ["a"], nmes = 1 } }',
     "fleet.clusters.eu.nmes", "did you mean 'names'"),
]


@pytest.mark.parametrize(("line", "path", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_fleet_key_is_config_invalid_naming_it(
        tmp_path: Path, line: str, path: str, message: str) -> None:
    source = "" if line.startswith(("names", "regex", "callable", "registry", "clusters")) \
        else 'pattern = "t_*"\n'
    with pytest.raises(ConfigInvalidError) as raised:
        _load(tmp_path, f'uri = "mongodb://h/"\n[fleet]\n{source}{line}\n')
    error = raised.value
    assert (error.code, error.exit_code) == ("CONFIG_INVALID", 6)
    assert f"{path} (migronaut.toml)" in error.message and message in error.message, \
        error.message


def test_two_sources_or_none_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalidError, match=r"exactly one tenant source .*got names, "
                                                 r"pattern"):
        _load(tmp_path, '[fleet]\nnames = ["a"]\npattern = "t_*"\n')
    with pytest.raises(ConfigInvalidError, match="names no tenant source"):
        _load(tmp_path, "[fleet]\nconcurrency = 2\n")
    with pytest.raises(ConfigInvalidError, match=r"fleet \(migronaut.toml\): must be a table"):
        _load(tmp_path, 'fleet = "tenant_*"\n')


def test_a_python_config_may_give_the_callable_itself(tmp_path: Path) -> None:
    config = _load(tmp_path, "def tenants():\n    return ['a']\n\n"
                             "config = {'fleet': {'callable': tenants}}\n",
                   name="migronaut_config.py")
    source = config.fleet.clusters[0].source
    assert source.kind == "callable" and source.function() == ["a"]
