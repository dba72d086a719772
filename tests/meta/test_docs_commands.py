"""Every command of the tutorial and of docs/how-to/recorded-runs.md, run as written in a fresh copy
of the checkout (its git-tracked files): each ``$`` line of a ``console`` block, in page order,
from the copy's root. The copy starts with the checkout's own outcome store (``.redline/``) when
there is one (CI's first command, the gate on the embedded grid, leaves it): keys hold inputs by
content, not by place, so the copy reuses it, as a second clone would, and only what it lacks is
decoded. The lines a block shows after a command must
appear in its output (``...`` stands for anything; paths into the copy read as relative); the
exit status is 4 when the block shows ``ERROR:``, 1 when it shows ``NOT CERTIFIED``, else 0.
``bash`` blocks (a GPU, your own runs) are not run. The tutorial's second page writes its grid
from the page's ``yaml`` block first, as the page asks."""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["tutorial/first-verdict.md", "tutorial/your-model.md", "how-to/recorded-runs.md"]


def commands(page: str) -> list[tuple[str, list[str]]]:
    """The page's console commands, each with the lines shown after it."""
    found = []
    for block in re.findall(r"^```console\n(.*?)^```$", (ROOT / "docs" / page).read_text(), re.S | re.M):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif line.strip() and line.strip() != "...":
                found[-1][1].append(line)
    return found


def shown(line: str) -> re.Pattern:
    parts = [r"\s+".join(map(re.escape, piece.split())) for piece in line.split("...")]
    return re.compile(".*".join(parts))


def fresh_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "clone"
    for name in subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    store = ROOT / ".redline" / "outcomes.sqlite"
    if store.is_file():  # copied through sqlite's backup API: consistent even beside a writer
        (copy / ".redline").mkdir()
        with closing(sqlite3.connect(store)) as source, closing(sqlite3.connect(copy / ".redline" / "outcomes.sqlite")) as target:
            source.backup(target)
    return copy


@pytest.mark.parametrize("page", PAGES)
def test_pages_show_commands(page):
    assert commands(page), f"{page}: no console command"


@pytest.mark.slow  # the embedded grid cold (about 45 s of CPU), the replay, the own-model grid (35 s), real lm-eval and inspect (45 s)
@pytest.mark.parametrize("page", PAGES)
def test_page_commands_run_as_written(page, tmp_path):
    copy = fresh_copy(tmp_path)
    text = (ROOT / "docs" / page).read_text()
    grid = re.search(r"Save this as `([^`]+)`", text)
    if grid:
        (copy / grid.group(1)).write_text(re.search(r"^```yaml\n(.*?)^```$", text, re.S | re.M).group(1))
    shims = tmp_path / "bin"  # `pytest` and `python` are this interpreter's, as in the reader's venv
    shims.mkdir()
    for name, run in (("pytest", f'"{sys.executable}" -m pytest'), ("python", f'"{sys.executable}"')):
        (shims / name).write_text(f'#!/bin/sh\nexec {run} "$@"\n')
        (shims / name).chmod(0o755)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    env.pop("GITHUB_STEP_SUMMARY", None)
    for command, lines in commands(page):
        done = subprocess.run(command, shell=True, cwd=copy, capture_output=True, text=True, timeout=900, env=env)
        output = (done.stdout + done.stderr).replace(f"{copy}/", "")
        expected = 4 if any("ERROR:" in line for line in lines) else 1 if any("NOT CERTIFIED" in line for line in lines) else 0
        assert done.returncode == expected, f"{page}: {command}: exit {done.returncode}\n{output[-3000:]}"
        for line in lines:
            assert shown(line).search(output), f"{page}: {command}: not in the output: {line}\n{output[-3000:]}"
