"""What ``pip install migronaut`` gets: the sdist and the wheel, built with the project's backend.

Both are built as the release workflow builds them (``python -m build``: the sdist, then the wheel
from the sdist; offline here, ``--no-isolation`` with the ``dev`` extra's hatchling, the
``[build-system]`` backend), pass ``twine check``, and the wheel equals the one hatchling builds
from the working tree:

* the wheel holds every module of ``src/migronaut``, ``py.typed``, the licence and the metadata
  (``License-Expression``, ``[project.urls]``, the console script and the pytest plugin);
* the sdist holds the package, README, CHANGELOG, LICENSE and ``pyproject.toml``; neither holds
  tests, benchmarks, virtual environments or caches.
"""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "migronaut"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
#: Nothing under these names belongs in a distribution.
JUNK = ("tests/", "bench/", "scripts/", "examples/", ".venv", "__pycache__", ".pyc",
        ".mypy_cache", ".ruff_cache", "site/", ".ci/")


#: The release's build command (``.github/workflows/release.yml``; ``tests/test_workflows.py``
#: checks it runs exactly ``python -m build``), without the isolated environment it would fetch.
RELEASE_BUILD = ("-m", "build", "--no-isolation")


def build(source: Path, out: Path, *targets: str) -> None:
    args = [arg for target in targets for arg in ("-t", target)]
    subprocess.run([sys.executable, "-m", "hatchling", "build", *args, "-d", str(out)],
                   cwd=source, check=True, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, *RELEASE_BUILD, "--outdir", str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300)
    return out


def test_twine_accepts_both_distributions(dist: Path) -> None:
    files = [str(only(dist, "*.whl")), str(only(dist, "*.tar.gz"))]
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def only(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, f"{pattern} in {directory}: {found}"
    return found[0]


def modules() -> set[str]:
    return {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*.py")}


def assert_no_junk(names: list[str]) -> None:
    junk = [name for name in names if any(part in name for part in JUNK)]
    assert not junk, f"does not belong in a distribution: {junk}"


def test_the_wheel_holds_the_package_its_licence_and_its_metadata(dist: Path) -> None:
    with zipfile.ZipFile(only(dist, "*.whl")) as wheel:
        names = wheel.namelist()
        info = next(name.split("/")[0] for name in names if ".dist-info/" in name)
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        licence = wheel.read(f"{info}/licenses/LICENSE").decode()
    assert {name for name in names if name.endswith(".py")} == modules()
    assert "migronaut/py.typed" in names
    shipped = {p.relative_to(PACKAGE.parent).as_posix() for p in (PACKAGE / "dashboard").rglob("*")
               if p.is_file() and p.suffix in (".html", ".js", ".css")}
    assert shipped >= {"migronaut/dashboard/templates/overview.html",
                       "migronaut/dashboard/static/dashboard.js",
                       "migronaut/dashboard/static/dashboard.css"}
    assert shipped <= set(names), "the dashboard's templates and assets ship in the wheel"
    assert_no_junk(names)
    assert licence == (ROOT / "LICENSE").read_text("utf-8")
    assert licence.startswith("MIT License") and "The migronaut authors" in licence
    assert metadata["License-Expression"] == PYPROJECT["project"]["license"] == "MIT"
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert urls == PYPROJECT["project"]["urls"]
    assert set(urls) == {"Documentation", "Source", "Changelog"}
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "migronaut = migronaut.cli:entry" in entry_points
    assert "migronaut = migronaut.testing.plugin" in entry_points


def test_the_sdist_holds_what_builds_the_wheel_and_no_more(dist: Path, tmp_path: Path) -> None:
    sdist = only(dist, "*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = [member.name.split("/", 1)[1] for member in archive.getmembers() if member.isfile()]
        # the "data" filter (Python ≥ 3.11.4) refuses links and paths out of tmp_path
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(tmp_path, **safe)  # type: ignore[arg-type]
    for name in ("pyproject.toml", "PKG-INFO", "README.md", "CHANGELOG.md", "LICENSE",
                 "src/migronaut/py.typed"):
        assert name in names
    assert {name for name in names if name.endswith(".py")} == {f"src/{m}" for m in modules()}
    assert_no_junk(names)
    assert not [name for name in names if name.startswith("docs/")]

    # the release's wheel is built from the sdist, as pip builds one from an sdist: the same
    # files as hatchling builds from the working tree
    from_tree = tmp_path / "from-tree"
    build(ROOT, from_tree, "wheel")
    with zipfile.ZipFile(only(from_tree, "*.whl")) as tree, \
            zipfile.ZipFile(only(dist, "*.whl")) as released:
        assert sorted(tree.namelist()) == sorted(released.namelist())
        assert {name: tree.read(name) for name in tree.namelist() if "RECORD" not in name} == {
            name: released.read(name) for name in released.namelist() if "RECORD" not in name}
