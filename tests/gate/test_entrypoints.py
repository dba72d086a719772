"""End-to-end: a third-party engine and suite, pip-installed, gated exactly like ours.

The package below knows nothing of pytest-redline's internals: it only declares entry
points in the ``redline.engines`` and ``redline.suites`` groups.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import redline_fakes  # noqa: F401  (loads numpy & co. before pytester's in-process run)

pytest_plugins = ["pytester"]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "redline-echo"
version = "0.1"

[project.entry-points."redline.engines"]
echo = "redline_echo:EchoEngine"

[project.entry-points."redline.suites"]
countdown = "redline_echo:Countdown"

[tool.setuptools]
py-modules = ["redline_echo"]
"""

MODULE = '''\
"""An engine that echoes the number in the prompt, and a suite that checks it."""
from pytest_redline.contracts import Generation, Prompt


class Countdown:
    name = "countdown"

    def __init__(self, n=50):
        self.n = n

    def prompts(self):
        return [Prompt(id=f"n{i}", text=f"Say {i}.", meta={"answer": str(i)}) for i in range(self.n)]

    def score(self, prompt, text):
        return text == prompt.meta["answer"]


class EchoEngine:
    name = "echo"

    def __init__(self, mumble=0):
        self.mumble = mumble  # every mumble-th answer comes out garbled in "fast" mode

    def fingerprint(self):
        return "echo-v1"

    def generate(self, prompts, config):
        out = []
        for k, p in enumerate(prompts):
            text = p.text.split()[1].rstrip(".")
            if config.get("fast") and self.mumble and int(text) % self.mumble == 0:
                text = "?"
            out.append(Generation(text=text, tokens=4, forwards=2 if config.get("fast") else 4))
        return out
'''

GRID = """\
name: echo
suite: countdown
suite_args: {n: 100}
engine: echo
engine_args: {mumble: 50}
reference: careful
configs:
  careful: {}
  fast: {fast: true}
deploy: fast
"""


@pytest.mark.slow  # builds and installs a package with pip
def test_third_party_engine_via_entry_points(pytester: pytest.Pytester, tmp_path: Path) -> None:
    source = tmp_path / "redline-echo"
    source.mkdir()
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "redline_echo.py").write_text(MODULE)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    assert (site / "redline_echo-0.1.dist-info" / "entry_points.txt").exists()
    pytester.syspathinsert(site)
    pytester.makefile(".yaml", redline=GRID)
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                                "--redline-alpha=0.1")
    assert result.ret == 0
    assert result.parseoutcomes() == {"passed": 198, "regressed": 2}  # n0 and n50 garbled
    result.stdout.fnmatch_lines([
        "*fast*0.9800*2*", "*fast*valid*+100.0%*",  # the table's two blocks
        "*CERTIFIED (echo, gate): fast is certified; deploy fast (+100.0% tpf, -2.0 accuracy points)*",  # no check_config: fine
    ])
