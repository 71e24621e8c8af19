"""The import graph of ``src/migronaut``: no new cycle, and no lower layer importing a higher one.

Layers, low to high: ``errors``/``_redact``/``_version``/``_mongod_rules`` → ``core`` and
``observability`` (one level: a DAG of modules) → ``background`` → ``commands`` → ``api``/``aio``
→ everything else (``cli``, ``testing``, the dev server, the package's lazy ``__init__``).
Every import counts: inside functions and under ``TYPE_CHECKING`` too. Issue 11 removed the
last ones that were there when this test was written: there are none, and none may come back.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS = (
    ("migronaut.errors", 0), ("migronaut._redact", 0), ("migronaut._version", 0),
    ("migronaut._mongod_rules", 0), ("migronaut.core", 1), ("migronaut.declared", 1),
    ("migronaut.observability", 1), ("migronaut.versioning", 1),
    ("migronaut.background", 2), ("migronaut.commands", 3), ("migronaut.api", 4),
    ("migronaut.aio", 4), ("migronaut.integrations", 2), ("migronaut.dashboard", 5),
)


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
    for prefix, layer in LAYERS:
        if name == prefix or name.startswith(prefix + "."):
            return layer
    return 5


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


def test_architecture_md_names_only_files_that_exist() -> None:
    """Every module path ARCHITECTURE.md names (``core/lock.py``, ``cli/commands/*.py``) exists,
    so the map cannot drift from the tree silently."""
    import re

    text = (SRC.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/*]+(?:\.py|/))", text))
    assert len(named) > 30, "the map names too few files for this check to mean anything"
    root = SRC.parent
    missing = sorted(
        path for path in named
        if not any(list(base.glob(path.rstrip("/"))) for base in (SRC / "migronaut", root))
    )
    assert missing == [], f"ARCHITECTURE.md names files that do not exist: {missing}"
