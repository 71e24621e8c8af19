"""The import graph of ``src/migronaut``: no cycle, and no lower layer importing a higher one.

Layers, low to high, a module's being that of its longest prefix in :data:`LAYERS`: the bottom
helpers (``errors``, ``_redact``, ``_version``, ``_names``, ``_suggest``, ``_json``, ``_values``)
→ ``observability`` → ``declared`` and ``versioning`` → ``core`` and ``fleet.config`` (the
``[fleet]`` table the configuration parses) → ``declared.sources`` (it loads definition files
through ``core.files``), ``background`` and ``integrations`` → ``commands`` → ``api``/``aio`` →
everything else (``cli``, ``dashboard``, ``fleet``, ``executors``, ``testing``, the dev server
package ``devserver``, the package's lazy ``__init__``). Every import counts, inside functions and
under ``TYPE_CHECKING`` too, and there is no list of exceptions. The dev server imports nothing
of ours but ``errors``, ``_redact``, ``_names`` (MongoDB's name rules) and ``_values``; only
``devserver/mongoeco_internals.py`` reaches into mongoeco's private surface; the dashboard reads
through the public API, never ``core``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS = (
    ("migronaut.errors", 0), ("migronaut._redact", 0), ("migronaut._version", 0),
    ("migronaut._names", 0), ("migronaut._suggest", 0), ("migronaut._json", 0),
    ("migronaut._values", 0), ("migronaut._ensured", 0),
    ("migronaut.observability", 1),
    ("migronaut.declared", 2), ("migronaut.versioning", 2),
    ("migronaut.core", 3), ("migronaut.fleet.config", 3),
    ("migronaut.declared.sources", 4), ("migronaut.background", 4),
    ("migronaut.integrations", 4),
    ("migronaut.commands", 5),
    ("migronaut.api", 6), ("migronaut.aio", 6),
)
#: Everything not in :data:`LAYERS`: the CLI, the dashboard, the fleet, the executors, the dev
#: server, the testing plugin, the package's lazy ``__init__``.
TOP = 7
#: What the dev server may import of ours besides its own modules: the top layer, it stands on
#: nothing but the error tree, redaction, MongoDB's name rules and the integer checks.
DEVSERVER_IMPORTS = frozenset({"migronaut.errors", "migronaut._redact", "migronaut._names",
                               "migronaut._values"})
#: mongoeco's public modules; any other is its internals.
MONGOECO_PUBLIC = frozenset({"mongoeco", "mongoeco.engines", "mongoeco.wire", "mongoeco.errors"})
#: The one module allowed to reach into mongoeco's private surface.
MONGOECO_INTERNALS = "migronaut.devserver.mongoeco_internals"


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "migronaut").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("migronaut."):
                    found = resolve(target)
                    if found not in (None, name, "migronaut"):
                        graph[name].add(found)  # type: ignore[arg-type]
    return graph


def _layer(name: str) -> int:
    """The layer of the longest prefix of ``name`` in :data:`LAYERS`; anything else is on top."""
    matches = [(len(prefix), layer) for prefix, layer in LAYERS
               if name == prefix or name.startswith(prefix + ".")]
    return max(matches)[1] if matches else TOP


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
    return groups


def test_no_lower_layer_imports_a_higher_one() -> None:
    graph = _graph()
    upward = {(name, target) for name, targets in graph.items() for target in targets
              if _layer(name) < _layer(target)}
    assert sorted(upward) == []


def test_no_new_import_cycle() -> None:
    assert [sorted(group) for group in _cycles(_graph())] == []


def test_the_checks_see_the_graph() -> None:
    """The graph is read (a broken walk would pass the two tests above vacuously)."""
    graph = _graph()
    assert "migronaut.core.lock" in graph["migronaut.core.locked_run"]
    assert "migronaut.core.run_loop" in graph["migronaut.commands.migrate"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _layer("migronaut.cli.app") > _layer("migronaut.api") > _layer("migronaut.commands")
    assert _layer("migronaut.declared.sources") > _layer("migronaut.core.files") \
        > _layer("migronaut.declared.definition") > _layer("migronaut.observability.history") \
        > _layer("migronaut._json")
    assert MONGOECO_INTERNALS in graph["migronaut.devserver.wire"]
    assert "migronaut.devserver" in graph["migronaut.cli.commands.dev_server"]
    assert "migronaut.devserver.serve" in graph["migronaut.devserver"]
    assert _layer("migronaut.devserver.wire") > _layer("migronaut.api")
    assert _private_reaches(MONGOECO_INTERNALS), "the reach check below would see nothing"


def test_the_dev_server_stands_on_errors_and_redaction_only() -> None:
    graph = _graph()
    outside = {(name, target) for name, targets in graph.items()
               if name.startswith("migronaut.devserver") for target in targets
               if not target.startswith("migronaut.devserver") and target not in DEVSERVER_IMPORTS}
    assert sorted(outside) == []


def test_the_dashboard_reads_through_the_public_api_never_the_core() -> None:
    """The dashboard is a user of the package like any other: results and configuration come
    from ``migronaut``'s curated surface and the JSON helpers of ``_json``, never from
    ``migronaut.core`` (nor the CLI above it)."""
    graph = _graph()
    reaches = {(name, target) for name, targets in graph.items()
               if name.startswith("migronaut.dashboard") for target in targets
               if target.startswith(("migronaut.core", "migronaut.cli"))}
    assert "migronaut._json" in graph["migronaut.dashboard.board"], "the walk sees the package"
    assert sorted(reaches) == []


def test_only_one_module_reaches_into_mongoeco_internals() -> None:
    """A private mongoeco module imported, or a ``_name`` read off an object that is not the
    module's own (``self``/``cls``), anywhere in the dev server but
    ``devserver/mongoeco_internals.py``: a mongoeco upgrade could break it unseen."""
    reaches = {name: found for name in _modules() if name.startswith("migronaut.devserver")
               and name != MONGOECO_INTERNALS and (found := _private_reaches(name))}
    private_imports = {name: found for name in _modules() if name != MONGOECO_INTERNALS
                       and (found := [reach for reach in _private_reaches(name)
                                      if reach.startswith("import ")])}
    assert reaches == {}
    assert private_imports == {}


def _private_reaches(name: str) -> list[str]:
    """What module ``name`` reaches of another object's or package's private surface."""
    tree = ast.parse(_modules()[name].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            targets = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""])
            found += [f"import {target}" for target in targets
                      if target.split(".")[0] == "mongoeco" and target not in MONGOECO_PUBLIC]
        elif _reads_a_private_name(node):
            found.append(f"{ast.unparse(node)} (line {getattr(node, 'lineno', '?')})")
    return found


def _reads_a_private_name(node: ast.AST) -> bool:
    """``obj._name`` with ``obj`` not ``self``/``cls``, or ``getattr(obj, "_name", ...)`` (and
    ``hasattr``/``setattr``)."""
    if isinstance(node, ast.Attribute):
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        return _private(node.attr) and not own
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value))


def _private(attribute: str) -> bool:
    return attribute.startswith("_") and not attribute.startswith("__")
