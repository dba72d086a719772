"""The documentation site builds with no warning: a broken link, a missing page or an
unresolvable API reference fails the suite (``mkdocs build --strict``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # mkdocs build: 8-12 s
def test_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_readme_is_short_and_every_docs_link_exists():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    import re

    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).exists(), target


def test_no_citation_of_the_design_file_outside_the_repository():
    """The project cites only itself: docs/contributing/architecture.md holds the contracts, not a design file
    beside the repository."""
    needle = "DESIGN" + ".md"  # spelled apart, so this file does not cite it either
    folders = ("pytest_redline", "engines", "suites", "training", "docs", "tests", "benchmarks", "grids")
    files = [p for d in folders for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md", ".yml", ".yaml", ".toml")]
    files += [ROOT / name for name in ("README.md", "pyproject.toml", "mkdocs.yml", "redline.yaml", "conftest.py")]
    cited = [str(p.relative_to(ROOT)) for p in files if needle in p.read_text(errors="replace")]
    assert cited == []


def test_no_page_mentions_an_issue_number():
    """Pages describe the present; what changed, and when, is CHANGELOG.md's."""
    import re

    pattern = re.compile(r"\bissues?\s*#?\d+|\bchanged in (?:issue|#|v?\d)|(?<![\w&/])#\d+\b", re.I)
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    found = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)}" for p in pages
             for i, line in enumerate(p.read_text().splitlines(), 1) for m in pattern.finditer(line)]
    assert found == []


def test_options_page_lists_every_option_and_ini_key():
    """docs/reference/options.md has one row per option that pytest_redline/options.py declares,
    with its ini key (or none), and nothing else."""
    import re

    from pytest_redline import options

    parser = pytest.Parser(_ispytest=True)
    options.add_options(parser)
    declared = {opt.names()[0] for opt in parser.getgroup("redline").options}
    ini = set(parser._inidict)
    page = (ROOT / "docs/reference/options.md").read_text()
    rows = re.findall(r"^\| `(--redline-[a-z-]+)(?:[^|]|\\\|)*\| (?:`(redline_[a-z_]+)`|–) \|", page, re.M)
    assert sorted(name for name, _ in rows) == sorted(declared)
    assert {key for _, key in rows if key} == ini
    assert all(not key or key == name[2:].replace("-", "_") for name, key in rows)
