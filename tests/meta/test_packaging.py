"""Every package folder of the checkout is listed in pyproject's ``[tool.setuptools] packages``:
a package left out installs from a wheel without its modules (an editable install hides it)."""
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheel():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {v: k for k, v in setup["package-dir"].items()}  # "engines" -> "pytest_redline.engines"
    found = set()
    for top in ("pytest_redline", *folders):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            found.add(".".join([folders.get(parts[0], parts[0]), *parts[1:]]))
    assert found == set(setup["packages"])
