"""The API reference's Griffe extension and its check: no private parameter in a signature."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_extension_hides_private_parameters_and_keeps_the_rest(tmp_path: Path) -> None:
    griffe = pytest.importorskip("griffe")  # the docs extra
    package = tmp_path / "demo"
    package.mkdir()
    (package / "__init__.py").write_text(
        "class Runner:\n"
        "    def __init__(self, config=None, *, cwd=None, _origin='argument', **overrides):\n"
        "        pass\n\n"
        "def run(name, __dunder__=0, _make=None):\n"
        "    pass\n"
    )
    extensions = griffe.load_extensions(f"{SCRIPTS / 'griffe_private_parameters.py'}"
                                        ":HidePrivateParameters")
    loaded = griffe.load("demo", search_paths=[tmp_path], extensions=extensions)
    init = loaded["Runner"]["__init__"]
    assert [p.name for p in init.parameters] == ["self", "config", "cwd", "overrides"]
    assert [p.name for p in loaded["run"].parameters] == ["name", "__dunder__"]


def test_the_build_check_finds_a_private_parameter_in_a_rendered_signature(
    tmp_path: Path
) -> None:
    check = _script("check_api_signatures")
    page = tmp_path / "reference" / "api" / "index.html"
    page.parent.mkdir(parents=True)
    shown = ('<span class="n">config_path</span><span class="p">:</span> '
             '<span class="n">_flags_origin</span><span class="p">:</span> '
             '<span class="n">__dunder__</span><span class="o">=</span>')
    page.write_text(shown)
    assert check.findings(tmp_path) == ["reference/api/index.html: _flags_origin"]
    assert check.main([str(tmp_path)]) == 1
    page.write_text(shown.replace("_flags_origin", "flags_origin"))
    assert check.main([str(tmp_path)]) == 0
