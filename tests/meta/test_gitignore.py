"""The files the README's and the docs' commands write at the rootdir are ignored by git, so a
quick start leaves the checkout clean."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = re.compile(r"--(?:redline-(?:html|report|outcomes|markdown)|junitxml)=([A-Za-z0-9_./-]+)\b")


def test_command_outputs_are_ignored():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    names = sorted({name for page in pages for name in OUTPUT.findall(page.read_text()) if name != "PATH" and not name.startswith("/")})  # an absolute path is outside the checkout
    assert "redline.html" in names
    check = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert sorted(check.stdout.split()) == names
