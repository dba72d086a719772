"""The root conftest: Hypothesis profiles, and the plugin registered once (by its entry point)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("ci", "expected"),
    [("1", "True None None 100"), ("", "False None not-none 30")],
    ids=["ci", "dev"],
)
def test_selected_by_ci_hypothesis_profile(ci, expected):
    code = (
        "import runpy; runpy.run_path('conftest.py'); from hypothesis import settings; s = settings.default; "
        "print(s.derandomize, s.deadline, 'not-none' if s.database is not None else None, s.max_examples)"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = ci
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == expected.split()


def test_once_by_entry_point_plugin(request):
    manager = request.config.pluginmanager
    plugins = [p for p in manager.get_plugins() if getattr(p, "__name__", None) == "pytest_redline.plugin"]
    assert len(plugins) == 1
    assert manager.get_name(plugins[0]) == "redline"  # the pytest11 entry point's name
    root = manager.get_plugin(str(ROOT / "conftest.py"))
    assert root is not None and not hasattr(root, "pytest_plugins")
