"""The CI and release workflows (``.github/workflows``), read as files: what they promise is true.

* every marker that makes a test depend on the server (``pyproject.toml``'s markers, the skip
  logic of ``tests/conftest.py``) is run by some entry of ci.yml's matrix: the dev server, or a
  real replica set or sharded cluster named by ``MIGRONAUT_TEST_URI`` — so nothing that skips on
  the dev server is skipped everywhere;
* ci.yml runs the README's test command (``scripts/test.sh``) and the rest of ``.ci/run``, the
  real servers are the versions and topologies it names, with test commands, and the bench runs
  on the 8.0 replica set;
* release.yml builds with ``python -m build`` (what ``tests/test_packaging.py`` builds here),
  twine-checks, smoke-tests every extra, checks the tag and publishes by trusted publishing.

``actionlint`` (run by ``scripts/test.sh``) checks the syntax and the expressions; these tests
check the meaning.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import conftest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
#: The user extras (``dev`` and ``docs`` are for working on migronaut itself).
CONTRIBUTOR_EXTRAS = {"dev", "docs"}


def workflow(name: str) -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text("utf-8"))
    if True in loaded:  # YAML 1.1 reads the key `on` as a boolean
        loaded["on"] = loaded.pop(True)
    return loaded


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = job["steps"]
    return found


def runs(job: dict[str, Any]) -> list[str]:
    """The ``run:`` scripts of a job's steps, stripped."""
    return [str(step["run"]).strip() for step in steps(job) if "run" in step]


def uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in steps(job) if str(step.get("uses", "")).split("@")[0] == action]


def suite_job() -> dict[str, Any]:
    """ci.yml's job that runs the test suite."""
    jobs = [job for job in workflow("ci.yml")["jobs"].values()
            if "bash scripts/test.sh" in runs(job)]
    assert len(jobs) == 1, "one ci.yml job runs `bash scripts/test.sh`"
    return jobs[0]


def matrix() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = suite_job()["strategy"]["matrix"]["include"]
    return entries


def function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
             and node.name == name]
    assert len(found) == 1, f"one {name}() in tests/conftest.py"
    return found[0]


def strings_compared_to(node: ast.AST, variable: str) -> set[str]:
    """The string constants ``variable`` is compared with (``variable == "x"``) inside ``node``."""
    return {comparator.value for compare in ast.walk(node) if isinstance(compare, ast.Compare)
            and isinstance(compare.left, ast.Name) and compare.left.id == variable
            for comparator in compare.comparators
            if isinstance(comparator, ast.Constant) and isinstance(comparator.value, str)}


def marker_calls(node: ast.AST) -> set[str]:
    """The marker names of ``get_closest_marker("x")`` calls inside ``node``."""
    return {call.args[0].value for call in ast.walk(node) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr == "get_closest_marker"
            and call.args and isinstance(call.args[0], ast.Constant)}


# ------------------------------------------------------------------------------------- markers


def test_every_declared_marker_has_its_skip_logic_in_conftest() -> None:
    markers = PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]
    declared = {line.split(":")[0] for line in markers}
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text("utf-8"))
    by_server = strings_compared_to(function(tree, "_unserved"), "marker")
    by_interpreter = marker_calls(function(tree, "pytest_collection_modifyitems"))
    assert by_server == set(conftest.MARKER_SERVERS), \
        "_unserved() and MARKER_SERVERS name the same server markers"
    assert by_interpreter == {"slow", "one_interpreter"}
    assert declared == by_server | by_interpreter, \
        "a marker of pyproject.toml that skips on some server needs an entry in MARKER_SERVERS"


def test_every_server_marker_runs_in_some_entry_of_the_ci_matrix() -> None:
    job = suite_job()
    assert job["env"]["MIGRONAUT_TEST_TOPOLOGY"] == "${{ matrix.topology }}"
    assert job["env"]["MIGRONAUT_TEST_URI"] == "${{ matrix.uri }}"
    entries = matrix()
    for entry in entries:
        assert entry["topology"] in conftest.TOPOLOGIES, entry
        if entry["topology"] == "dev_server":
            assert entry["uri"] == "", "the dev-server entry starts its own dev server"
        else:
            assert entry["uri"].startswith("mongodb://127.0.0.1:27017/"), entry
    topologies = {entry["topology"] for entry in entries}
    for marker, servers in conftest.MARKER_SERVERS.items():
        assert servers & topologies, f"no ci.yml entry runs the {marker!r} tests"
    # the markers that skip on the dev server are exactly those a real server runs
    real = {marker for marker, servers in conftest.MARKER_SERVERS.items()
            if "dev_server" not in servers}
    assert real == {"real_mongodb", "replica_set", "sharded_cluster"}


def test_the_real_servers_are_the_versions_and_topologies_named() -> None:
    real = {(entry["mongodb"], entry["topology"]) for entry in matrix()
            if entry["topology"] != "dev_server"}
    assert real == {("6.0", "replica_set"), ("7.0", "replica_set"), ("8.0", "replica_set"),
                    ("8.0", "sharded_cluster")}
    start = next(step for step in steps(suite_job()) if "mongodb-runner" in str(step.get("run"))
                 or "MONGODB_RUNNER" in str(step.get("run")))
    script = str(start["run"])
    assert "--setParameter enableTestCommands=1" in script, "the failpoint tests need it"
    assert "--secondaries 2" in script and "--shards 2" in script
    assert "--replSet rs0" in script and "--port 27017" in script
    assert all("replicaSet=rs0" in entry["uri"] for entry in matrix()
               if entry["topology"] == "replica_set")
    assert workflow("ci.yml")["env"]["MIGRONAUT_TEST_REQUIRE_TOOLS"] == "1"


def test_no_test_decides_in_its_body_to_skip_on_the_servers_topology() -> None:
    """A test that cannot run on a replica set or a mongos says so in a marker (``standalone``),
    where CI's ``MIGRONAUT_TEST_TOPOLOGY`` sees it."""
    offenders = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        source = path.read_text("utf-8")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.If):
                continue
            condition = ast.get_source_segment(source, node.test) or ""
            skips = any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "skip" for child in node.body
                        for call in ast.walk(child))
            if skips and ("setName" in condition or "isdbgrid" in condition):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


# ------------------------------------------------------------------------------------------ ci


def test_ci_runs_the_readme_test_command_and_what_ci_run_runs() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    commands = re.findall(r"^(bash scripts/test\.sh)\b", readme, flags=re.M)
    assert commands == ["bash scripts/test.sh"], "the README's test command"
    job = suite_job()
    assert commands[0] in runs(job)
    ci_run = (ROOT / ".ci" / "run").read_text("utf-8")
    assert "bash scripts/docs.sh build" in ci_run and "exec bash scripts/test.sh" in ci_run
    docs = next(step for step in steps(job) if step.get("run") == "bash scripts/docs.sh build")
    assert docs["if"] == "matrix.docs"
    assert [entry["topology"] for entry in matrix() if entry["docs"]] == ["dev_server"]
    test_sh = (ROOT / "scripts" / "test.sh").read_text("utf-8")
    assert '"$bin313/actionlint"' in test_sh, "scripts/test.sh lints the workflows"
    on = workflow("ci.yml")["on"]
    assert {"push", "pull_request"} <= set(on)


def test_ci_has_the_services_tools_and_pythons_the_suite_needs() -> None:
    job = suite_job()
    ports = {port for service in job["services"].values() for port in service["ports"]}
    assert ports == {"6379:6379", "5672:5672"}  # Redis and RabbitMQ, as the Celery tests dial
    pythons = str(uses(job, "actions/setup-python")[0]["with"]["python-version"]).split()
    assert pythons == ["3.11", "3.13"]
    assert uses(job, "actions/setup-node")
    chrome = uses(job, "browser-actions/setup-chrome")[0]
    assert chrome["with"]["install-chromedriver"] is True
    linking = next(script for script in runs(job) if "chromedriver" in script)
    assert '"$RUNNER_TEMP/bin/chromium"' in linking and "GITHUB_PATH" in linking


def test_the_bench_runs_on_the_8_0_replica_set_and_keeps_its_tables() -> None:
    job = suite_job()
    assert [(entry["mongodb"], entry["topology"]) for entry in matrix() if entry["bench"]] == [
        ("8.0", "replica_set")]
    bench = next(step for step in steps(job) if "bench/run.py" in str(step.get("run")))
    assert "--quick" in bench["run"]
    assert bench["env"]["MIGRONAUT_BENCH_URI"] == "${{ matrix.uri }}"
    assert "MIGRONAUT_BENCH_URI" in (ROOT / "bench" / "run.py").read_text("utf-8")
    kept = [step for step in uses(job, "actions/upload-artifact")
            if "bench/results" in step["with"]["path"]]
    assert len(kept) == 1 and kept[0]["if"] == bench["if"]


# ------------------------------------------------------------------------------------- release


def test_release_builds_checks_smoke_tests_and_publishes_with_oidc() -> None:
    release = workflow("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert release["permissions"] == {"contents": "read"}
    jobs = release["jobs"]
    build = runs(jobs["build"])
    assert "python -m build" in build, "what tests/test_packaging.py builds (--no-isolation)"
    assert any(script.startswith("python -m twine check --strict") for script in build)
    tag_check = next(script for script in build if "TAG#v" in script)
    assert "dist/migronaut-$version.tar.gz" in tag_check
    assert "dist/migronaut-$version-py3-none-any.whl" in tag_check

    smoke = jobs["smoke"]
    assert smoke["needs"] == "build"
    extras = set(PYPROJECT["project"]["optional-dependencies"]) - CONTRIBUTOR_EXTRAS
    assert set(smoke["strategy"]["matrix"]["extra"]) == extras | {""}
    assert 'bash scripts/smoke-dist.sh dist "$EXTRA"' in runs(smoke)
    smoke_sh = (ROOT / "scripts" / "smoke-dist.sh").read_text("utf-8")
    for extra in extras:
        assert f"\n  {extra}) modules=" in smoke_sh, f"smoke-dist.sh imports the {extra} extra"

    publish = jobs["publish"]
    assert set(publish["needs"]) == {"build", "smoke"}
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    (step,) = uses(publish, "pypa/gh-action-pypi-publish")
    assert "with" not in step, "trusted publishing: no password, no token"
    text = (WORKFLOWS / "release.yml").read_text("utf-8")
    assert "secrets." not in text and "password" not in text


def test_the_version_comes_from_one_place() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "src/migronaut/_version.py"


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_every_action_is_pinned_to_a_version_and_every_script_fails_on_a_pipe(name: str) -> None:
    pinned = re.compile(r"^[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})$")
    found = re.findall(r"uses:\s*(\S+)", (WORKFLOWS / name).read_text("utf-8"))
    assert found
    assert [action for action in found if not pinned.match(action)] == []
    # an explicit `shell: bash` is `bash -eo pipefail`; the implicit default has no pipefail
    assert workflow(name)["defaults"] == {"run": {"shell": "bash"}}
