"""The examples of docs/how-to/writing-an-engine.md and docs/how-to/writing-a-suite.md, taken from the pages
themselves: each module is under 60 lines, registers through the entry point of the page's
pyproject.toml (an installed distribution's dist-info, as pip writes it), and gates the page's
grid in a pytest subprocess."""
from __future__ import annotations

import importlib.util
import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "how-to"


def blocks(page: str) -> dict[str, str]:
    """The page's fenced code blocks by language (python, toml, yaml, json), one of each."""
    found = re.findall(r"^```(\w+)\n(.*?)^```$", (DOCS / page).read_text(), re.S | re.M)
    langs = [lang for lang, _ in found]
    assert sorted(langs) == sorted(set(langs)), f"{page}: one block per language, got {langs}"
    return dict(found)


def install(page: str, site: Path) -> dict:
    """The page's module and a dist-info with its pyproject's entry points, into ``site``."""
    code = blocks(page)
    project = tomllib.loads(code["toml"])
    (module,) = project["tool"]["setuptools"]["py-modules"]
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(code["python"])
    meta = project["project"]
    info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
        for group, points in meta["entry-points"].items()
    ))
    return code


def gate(folder: Path, site: Path, grid: dict) -> dict:
    """``pytest --redline-alpha=0.1`` in ``folder`` with ``site`` on the path; the JSON report."""
    (folder / "redline.yaml").write_text(yaml.safe_dump(grid, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--redline-alpha=0.1",
         "--redline-report", "report.json"],
        cwd=folder, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "CERTIFIED" in done.stdout
    return json.loads((folder / "report.json").read_text())


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["writing-an-engine.md", "writing-a-suite.md"])
def test_examples_short_and_in_nav(page):
    assert len(blocks(page)["python"].splitlines()) < 60
    assert page in (ROOT / "mkdocs.yml").read_text()


def test_suite_example_judges(tmp_path):
    install("writing-a-suite.md", tmp_path)
    suite_file = tmp_path / "questions.jsonl"
    suite_file.write_text(blocks("writing-a-suite.md")["json"])
    suite = load(tmp_path / "my_questions.py").QuestionFile(suite_file)
    add, sub, _ = suite.prompts()
    assert (add.id, add.text, add.meta["answer"]) == ("add-1", "99+15=", "114")
    assert dataclasses.astuple(suite.judge(add, "9+5+0=14,9+1+1=11#114", "eos")) == (True, "114", "last number")
    assert dataclasses.astuple(suite.judge(sub, "3-0-1=2#141\n\n#142", "stop")) == (False, "141", "last number")
    assert suite.judge(add, "9+5+0=14,9+1+1=11#114", "length").rule == "truncated"
    assert dataclasses.astuple(suite.judge(add, "#", None)) == (False, None, "no number")
    (tmp_path / "twice.jsonl").write_text((suite_file.read_text().splitlines()[0] + "\n") * 2)
    with pytest.raises(ValueError, match="twice.jsonl: id"):
        load(tmp_path / "my_questions.py").QuestionFile(tmp_path / "twice.jsonl")


@pytest.mark.slow  # imports torch and transformers (12 s cold at load 13)
def test_engine_example_checks_config(tmp_path):
    from pytest_redline.contracts import ConfigError

    install("writing-an-engine.md", tmp_path)
    engine = load(tmp_path / "my_greedy.py").GreedyEngine
    engine.check_config({"max_new_tokens": 8})
    with pytest.raises(ConfigError) as error:
        engine.check_config({"max_new_token": 8})
    assert (error.value.key, error.value.known) == ("max_new_token", ("max_new_tokens",))


@pytest.mark.slow  # a subprocess gate: 64 prompts x 2 configs of the embedded model
def test_suite_example_gates(tmp_path):
    from pytest_redline.suites.arithmetic import ArithmeticSuite

    install("writing-a-suite.md", tmp_path / "site")
    grid = yaml.safe_load(blocks("writing-a-suite.md")["yaml"])
    rows = [{"id": p.id, "question": p.text, "answer": p.meta["answer"]} for p in ArithmeticSuite(n=64).prompts()]
    (tmp_path / grid["suite_args"]["path"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = gate(tmp_path, tmp_path / "site", grid)
    assert report["n"] == 64 and [c["name"] for c in report["configs"]] == list(grid["configs"])
    accuracy = {c["name"]: c["accuracy"] for c in report["configs"]}
    assert accuracy[grid["reference"]] > 0.5  # bd-tiny answers ~75 % of arithmetic (a candidate may stop early)
    assert report["certified"] and report["deployed"] in accuracy


@pytest.mark.slow  # a subprocess gate: 32 prompts x 2 dtypes of the autoregressive checkpoint
def test_engine_example_gates(tmp_path):
    install("writing-an-engine.md", tmp_path / "site")
    grid = yaml.safe_load(blocks("writing-an-engine.md")["yaml"])
    grid["engine_args"]["model"] = str(ROOT / grid["engine_args"]["model"])  # the page runs from the root
    grid["suite_args"]["n"], grid["batch_size"] = 32, 32  # fewer prompts: time
    report = gate(tmp_path, tmp_path / "site", grid)
    assert report["n"] == 32 and [c["name"] for c in report["configs"]] == ["float32", "bfloat16"]
    reference = next(c for c in report["configs"] if c["name"] == grid["reference"])
    assert reference["accuracy"] > 0.5 and reference["cost"] > 0  # ~87 % of arithmetic; seconds per prompt
    assert report["certified"] and report["deployed"] in grid["configs"]
