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

**The layering** (``docs/contributing/architecture.md``, *Contracts*). Here an import is a static one: every
``import`` statement outside ``if TYPE_CHECKING:`` (a type-only import loads nothing at run time),
lazy ones included; loading an entry point or ``importlib.import_module`` is not one.

1. Engines and suites do not import each other.
2. From the gate package, engines and suites import only ``pytest_redline.contracts``; the
   recorded-outcome engines (:data:`RECORDED`) may also import ``pytest_redline.outcomes``.
3. The gate (every other module of ``pytest_redline``, contracts included) imports neither
   engines nor suites: it loads them through their entry points. Contracts imports nothing of
   the package.

Each rule failed on the code before issue 25 (commit 6d5fd4b): :func:`layering` lists the
violations of a checkout, e.g. ``python tests/meta/test_imports.py /tmp/pre25``.

**The output code** (``pytest_redline/report/``):

4. No renderer (:data:`RENDERERS`) imports another: each reads the verdict, the report document
   (``report.document``) and the shared words, text and file helpers.
5. The report files' helpers (:data:`FILE_HELPERS`) are defined in ``report/files.py`` alone, and
   imported from there.

Both failed on the code before the package (commit 2e7674c, where ``review`` and ``step_summary``
imported ``report``, and the helpers sat in ``report.py`` and ``review.py``): :func:`output_rules`
lists the violations of a checkout, and the command above prints them too.

6. No private name (``_name``) is imported from outside the importer's own package: a package's
   modules may share their private helpers, another package uses public names only. It failed
   on 2e7674c, where ``planning`` imported ``_critical``, ``_pvalue``, ``_scalar`` and ``_upper``
   from ``pytest_redline.risk``: :func:`private_imports`.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path

PACKAGES = ("pytest_redline", "pytest_redline.engines", "pytest_redline.suites")
FOLDERS = {"pytest_redline": "pytest_redline", "pytest_redline.engines": "engines", "pytest_redline.suites": "suites"}
SKIP_FOLDERS = {"models", "data", "__pycache__"}
CONTRACTS = "pytest_redline.contracts"
RECORDED = {"pytest_redline.engines.replay"}  # engines that read recorded outcomes: may import outcomes
# Imports the rules allow for now, each with the change that removes it.
PENDING: set[tuple[str, str]] = set()  # imports that break a rule until a branch in flight lands
# The modules that render an output. Before the report package (2e7674c) they were the four
# listed last, which are named so that the rules read an old checkout too.
RENDERERS = {
    "pytest_redline.report.terminal", "pytest_redline.report.outcome_csv", "pytest_redline.report.review",
    "pytest_redline.report.summary", "pytest_redline.report.redline_table",
    "pytest_redline.report", "pytest_redline.review", "pytest_redline.step_summary", "pytest_redline.redline_table",
}
FILES = "pytest_redline.report.files"
FILE_HELPERS = {"atomic_write", "check_writable", "file_sha256", "provenance"}


def _modules(root: Path | None = None) -> dict[str, Path]:
    """Every module of the packages: dotted name -> source file (of the checkout at ``root``,
    else of the packages as installed)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        if root is None:
            folder = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        else:
            folder = root / FOLDERS[package]
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


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


@functools.lru_cache(maxsize=None)
def _parse(path: Path, mtime_ns: int) -> ast.Module:
    """A source file's tree, parsed once per version: each rule reads the whole package again."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(name: str, path: Path, known: set[str], type_only: bool = True) -> set[str]:
    """The modules of ``known`` that ``name`` imports, by the rule of the module docstring
    (without the imports under ``if TYPE_CHECKING:`` unless ``type_only``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    stack: list[ast.AST] = [_parse(path, path.stat().st_mtime_ns)]
    while stack:
        node = stack.pop()
        if _is_main_block(node):
            continue
        if not type_only and _is_type_checking(node):
            stack.extend(node.orelse)
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


def import_graph(root: Path | None = None, type_only: bool = True) -> dict[str, set[str]]:
    modules = _modules(root)
    known = set(modules)
    return {name: _imports(name, path, known, type_only) for name, path in modules.items()}


def _side(module: str) -> str:
    for side in ("engines", "suites"):
        if module == f"pytest_redline.{side}" or module.startswith(f"pytest_redline.{side}."):
            return side
    return "gate"


def layering(root: Path | None = None) -> dict[str, list[str]]:
    """The violations of each layering rule (module docstring): ``"importer -> imported"``."""
    graph = import_graph(root, type_only=False)
    edges = [(a, b) for a in sorted(graph) for b in sorted(graph[a]) if (a, b) not in PENDING]
    apart = [(a, b) for a, b in edges if {_side(a), _side(b)} == {"engines", "suites"}]
    contracts_only = [
        (a, b) for a, b in edges
        if _side(a) != "gate" and _side(b) == "gate" and b != CONTRACTS
        and not (a in RECORDED and b == "pytest_redline.outcomes")
    ]
    gate_alone = [(a, b) for a, b in edges if _side(a) == "gate" and (_side(b) != "gate" or a == CONTRACTS)]
    found = {"apart": apart, "contracts_only": contracts_only, "gate_alone": gate_alone}
    return {rule: [f"{a} -> {b}" for a, b in pairs] for rule, pairs in found.items()}


def _from_imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str]]:
    """Every ``from MODULE import NAME`` of a module, as ``(MODULE, NAME)`` with MODULE resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(_parse(path, path.stat().st_mtime_ns)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(base, alias.name) for alias in node.names]
    return found


def output_rules(root: Path | None = None) -> dict[str, list[str]]:
    """The violations of the output rules (module docstring, 4 and 5)."""
    modules = _modules(root)
    known = set(modules)
    graph = import_graph(root)
    renderers = sorted(RENDERERS & known)
    apart = [f"{a} -> {b}" for a in renderers for b in sorted(graph[a]) if b in RENDERERS and b != a]
    helpers = []
    for name, path in sorted(modules.items()):
        if name == FILES:
            continue
        tree = _parse(path, path.stat().st_mtime_ns)
        helpers += [f"{name} defines {node.name}" for node in tree.body
                    if isinstance(node, ast.FunctionDef) and node.name in FILE_HELPERS]
        helpers += [f"{name} imports {helper} from {module}" for module, helper in _from_imports(name, path, known)
                    if helper in FILE_HELPERS and module != FILES]
    return {"renderers_apart": apart, "file_helpers": helpers}


def private_imports(root: Path | None = None) -> list[str]:
    """Rule 6's violations: ``"importer imports _name from module"``."""
    modules = _modules(root)
    known = set(modules)
    found = []
    for name, path in sorted(modules.items()):
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, imported in _from_imports(name, path, known):
            if not imported.startswith("_") or imported.startswith("__"):
                continue
            home = module if module in known and modules[module].name == "__init__.py" else module.rpartition(".")[0]
            if home != own:
                found.append(f"{name} imports {imported} from {module}")
    return found


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


def test_engines_and_suites_apart():
    """Rule 1: no engine imports a suite, no suite an engine (6d5fd4b: 11 engine modules did: 9
    for Prompt and cut_at_stop, the training scripts train.py and distill.py for the arithmetic suite)."""
    assert layering()["apart"] == []


def test_engines_and_suites_import_only_contracts():
    """Rule 2: from the gate package, engines and suites import only contracts (recorded-outcome
    engines also outcomes). 6d5fd4b: engines/distill.py imported pytest_redline.grid."""
    assert layering()["contracts_only"] == []
    graph = import_graph(type_only=False)
    assert [(a, b) for a, b in sorted(PENDING) if b not in graph[a]] == [], "the change came: remove it from PENDING"


def test_gate_imports_no_engine_or_suite():
    """Rule 3: the gate loads engines and suites only through entry points, and contracts imports
    nothing of the package. 6d5fd4b: scoring.py imported suites.base."""
    assert layering()["gate_alone"] == []


def test_layering_sees_each_kind_of_import(tmp_path):
    """The rules' reading of a module: lazy imports count, type-only ones do not, and a gate
    module's import of an engine, a suite's of the gate and an engine's of a suite are each found."""
    for folder, source in {
        "pytest_redline": "", "engines": "", "suites": "",
        "pytest_redline/contracts.py": "import json\n",
        "pytest_redline/scoring.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_redline.suites import base\n"
            "def f():\n    from pytest_redline.engines import replay\n"
        ),
        "engines/replay.py": "from pytest_redline import outcomes, contracts\n",
        "engines/greedy.py": "from pytest_redline.outcomes import OutcomeTable\nimport pytest_redline.suites.base\n",
        "suites/base.py": "from pytest_redline.contracts import Prompt\nfrom pytest_redline.grid import load_grid\n",
        "pytest_redline/outcomes.py": "", "pytest_redline/grid.py": "",
    }.items():
        path = tmp_path / folder
        if not source and "." not in folder:
            path.mkdir()
            (path / "__init__.py").write_text("")
        else:
            path.write_text(source)
    assert layering(tmp_path) == {
        "apart": ["pytest_redline.engines.greedy -> pytest_redline.suites.base"],
        "contracts_only": ["pytest_redline.engines.greedy -> pytest_redline.outcomes",
                           "pytest_redline.suites.base -> pytest_redline.grid"],
        "gate_alone": ["pytest_redline.scoring -> pytest_redline.engines.replay"],
    }


def test_renderers_import_no_other_renderer():
    """Rule 4. 2e7674c: review imported report (grid_report, atomic_write, best_cost, session_line),
    step_summary imported report and review (file_sha256)."""
    assert {"pytest_redline.report.terminal", "pytest_redline.report.summary"} <= set(import_graph())
    assert output_rules()["renderers_apart"] == []


def test_file_helpers_live_in_report_files():
    """Rule 5. 2e7674c: atomic_write sat in report.py, check_writable, file_sha256 and provenance
    in review.py, and session, review and step_summary imported them from there."""
    assert output_rules()["file_helpers"] == []


def test_output_rules_see_each_violation(tmp_path):
    """The output rules' reading: a renderer's lazy import of another, a helper defined outside
    files.py and one imported from elsewhere are each found; imports of the shared modules are not."""
    for folder, source in {
        "pytest_redline": "", "pytest_redline/report": "", "engines": "", "suites": "",
        "pytest_redline/report/files.py": "def atomic_write(path, text):\n    pass\n",
        "pytest_redline/report/document.py": "from pytest_redline.report.files import atomic_write\n",
        "pytest_redline/report/terminal.py": "from pytest_redline.report import document\n",
        "pytest_redline/report/summary.py": (
            "def f():\n    from pytest_redline.report.terminal import grid_lines\n"
            "    from .document import atomic_write\n"
        ),
        "pytest_redline/session.py": "def check_writable(path):\n    pass\n",
    }.items():
        path = tmp_path / folder
        if not source and "." not in folder:
            path.mkdir()
            (path / "__init__.py").write_text("")
        else:
            path.write_text(source)
    assert output_rules(tmp_path) == {
        "renderers_apart": ["pytest_redline.report.summary -> pytest_redline.report.terminal"],
        "file_helpers": ["pytest_redline.report.summary imports atomic_write from pytest_redline.report.document",
                         "pytest_redline.session defines check_writable"],
    }


def test_no_private_name_leaves_its_package():
    """Rule 6 (2e7674c: planning imported four private names from the risk package)."""
    assert private_imports() == []


def test_private_imports_are_found(tmp_path):
    for folder, source in {
        "pytest_redline": "", "pytest_redline/risk": "", "engines": "", "suites": "",
        "pytest_redline/risk/binomial.py": "def _pvalue():\n    pass\n",
        "pytest_redline/risk/grid.py": "from pytest_redline.risk.binomial import _pvalue\nfrom .binomial import __doc__\n",
        "pytest_redline/planning.py": "def f():\n    from pytest_redline.risk.binomial import _pvalue\n",
    }.items():
        path = tmp_path / folder
        if not source and "." not in folder:
            path.mkdir()
            (path / "__init__.py").write_text("")
        else:
            path.write_text(source)
    assert private_imports(tmp_path) == ["pytest_redline.planning imports _pvalue from pytest_redline.risk.binomial"]


def test_never_reaches_lab_gate():
    """The pytest plugin and everything it imports stay clear of the paper's analyses."""
    graph = import_graph()
    gate = reachable(graph, "pytest_redline.plugin")
    assert "pytest_redline.session" in gate
    assert not {m for m in gate if m.startswith("pytest_redline.lab")}


def test_old_names_warn_contracts():
    """The names that moved to ``pytest_redline.contracts`` still import from where third-party
    engines found them (until pytest-redline 0.2), with a DeprecationWarning that names the new
    place (the engine helpers that moved to ``engines/common.py``: test_speculative.py)."""
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


if __name__ == "__main__":  # the rules against another checkout: python tests/meta/test_imports.py ROOT
    root = Path(sys.argv[1])
    for rule, violations in {**layering(root), **output_rules(root), "private_imports": private_imports(root)}.items():
        print(f"{rule}: {len(violations)} violations", *violations, sep="\n  ")
