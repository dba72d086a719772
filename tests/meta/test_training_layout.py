"""The training tools live in the top-level training/ folder, outside the installed package: the
wheel's package list leaves them out, nothing installed imports them, training imports the
engines, the suites and the contracts but not the gate, train.py does not import distill.py, and
the command dispatches."""
import ast
import tomllib
from pathlib import Path

import pytest

import training.__main__ as command

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("pytest_redline.engines", "pytest_redline.suites", "pytest_redline.contracts")


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or deferred."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.slow  # inspects the install layout: 0.41 s CPU, over the inner loop's 50 s budget (issue 25)
def test_not_installed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert not any("training" in name for name in setuptools["packages"])
    assert not any("training" in name for name in setuptools.get("package-dir", {}).values())
    installed = [ROOT / d for d in ("pytest_redline", "engines", "suites")]
    for path in (p for d in installed for p in d.rglob("*.py")):
        assert not any(name.split(".")[0] == "training" for name in imports(path)), path


def test_training_imports_engines_suites_and_contracts_not_the_gate():
    for path in (ROOT / "training").glob("*.py"):
        gate = {n for n in imports(path) if n.startswith("pytest_redline.") and not n.startswith(SHARED)}
        assert gate == set(), path


def test_no_loop_train_does_not_import_distill():
    assert not any(n.startswith("training.distill") or n == "training" for n in imports(ROOT / "training" / "train.py"))


def test_command_dispatch(capsys):
    assert command.main(["--help"]) == 0 and "train" in capsys.readouterr().out
    assert command.main([]) == 2 and "expected a command, train or distill, got ''" in capsys.readouterr().err
    assert command.main(["fit"]) == 2 and "got 'fit'" in capsys.readouterr().err


@pytest.mark.slow  # imports torch, transformers and the engine (7 s cold under load)
@pytest.mark.parametrize(("params", "message"), [
    ("[1]", "--params: expected a JSON object"),
    ("{", "--params: expected a JSON object"),
    ('{"nope": 1}', "unknown config key 'nope'"),
])
def test_clear_error_bad_decoding_settings(params, message, capsys):
    with pytest.raises(SystemExit) as exit:
        command.main(["distill", "--params", params])
    assert exit.value.code == 2 and message in capsys.readouterr().err
