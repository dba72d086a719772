"""The import graph of the package: no loops, and the gate never reaches the lab.

What counts as an import of module A by module B: every ``import`` / ``from ... import``
statement in B's source, wherever it stands - at module level, inside a function (a lazy
import), or under ``if TYPE_CHECKING:``. A lazy or type-only import still ties the two
modules together for a reader and for every refactoring, so a loop through one is a loop.
The one exception is a ``if __name__ == "__main__":`` block: it runs only when the file is a
script, under the name ``__main__``, never on import. ``from pkg import name`` counts as an
import of ``pkg.name`` when that is a module, else of ``pkg``.

The graph is read with :mod:`ast` from the source files of ``pytest_redline`` and of the
folders it installs as subpackages (``engines/`` and ``suites/``), without importing them.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGES = ("pytest_redline", "pytest_redline.engines", "pytest_redline.suites")
SKIP_FOLDERS = {"models", "data", "__pycache__"}


def _modules() -> dict[str, Path]:
    """Every module of the packages: dotted name -> source file."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        folder = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if SKIP_FOLDERS & set(parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.setdefault(".".join([package, *parts]), path)
    return found


def _is_main_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports, by the rule of the module docstring."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), filename=str(path))]
    while stack:
        node = stack.pop()
        if _is_main_block(node):
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
        stack.extend(ast.iter_child_nodes(node))
    return {t for t in targets if t in known and t != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_acyclic_package_imports():
    graph = import_graph()
    assert {"pytest_redline.plugin", "pytest_redline.lab.analysis", "pytest_redline.engines.base"} <= set(graph)
    assert loops(graph) == []


def test_finds_known_loops_loops():
    """The loop finder itself: the two loops the package had (issue 19) are found."""
    graph = {
        "cli": {"cli_analyses"}, "cli_analyses": {"cli", "analysis"}, "analysis": {"risk"}, "risk": set(),
        "session": {"nodes"}, "nodes": {"session", "decode"}, "decode": set(),
    }
    assert sorted(loops(graph)) == [["cli", "cli_analyses"], ["nodes", "session"]]
    assert loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_counts_lazy_and_type_only_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg import a\n"
        "def f():\n    from pkg.b import thing\n"
        "from . import c\n"
        'if __name__ == "__main__":\n    import pkg.d\n'
    )
    known = {"pkg", "pkg.mod", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    assert _imports("pkg.mod", source, known) == {"pkg.a", "pkg.b", "pkg.c"}


def test_never_reaches_lab_gate():
    """The pytest plugin and everything it imports stay clear of the paper's analyses."""
    graph = import_graph()
    gate = reachable(graph, "pytest_redline.plugin")
    assert "pytest_redline.session" in gate
    assert not {m for m in gate if m.startswith("pytest_redline.lab")}


def test_old_names_warn_contracts():
    """The names that moved to ``pytest_redline.contracts`` still import from where third-party
    engines found them (until pytest-redline 0.2), with a DeprecationWarning that names the new place."""
    import pytest

    from pytest_redline import contracts
    from pytest_redline.engines import base as engines_base
    from pytest_redline.suites import base as suites_base

    for module, names in ((suites_base, ("Prompt", "Suite", "Judgement", "Judged", "judge", "cut_at_stop", "SCORED")),
                          (engines_base, ("Generation", "Engine", "FINISH_REASONS"))):
        for name in names:
            with pytest.warns(DeprecationWarning, match=rf"{module.__name__}\.{name} moved to pytest_redline\.contracts\.{name}"):
                assert getattr(module, name) is getattr(contracts, name)
    with pytest.warns(DeprecationWarning, match="suites.base.Prompt moved"):
        from pytest_redline.suites.base import Prompt
    assert Prompt("1", "one") == contracts.Prompt("1", "one")
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        suites_base.Nothing
