"""Gates over a fault-injecting endpoint: no fault is stored as an answer, every answer received is
stored, a partial run certifies nothing and says why, and a rerun against a healthy server sends
exactly the prompts that are missing."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the endpoint extra is not installed: pip install -e '.[endpoint]'")

import redline_fakes  # noqa: E402,F401  (imported out here: pytester's in-process runs drop modules)
import torch  # noqa: E402,F401
from fake_openai import FakeOpenAI  # noqa: E402

from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402

pytest_plugins = ["pytester"]
N = 16
CONFIGS = """\
greedy: {max_tokens: 64, temperature: 0}
again: {max_tokens: 64, temperature: 0, seed: 1}
"""


@pytest.fixture(scope="module")
def answers() -> dict[str, str]:
    return {p.prompt: p.solution for p in ArithmeticSuite(split="calibration", n=N, seed=0).problems()}


def grid(folder: Path, base_url: str, configs: str = CONFIGS, engine_extra: str = "") -> None:
    (folder / "endpoint.yaml").write_text("\n".join([
        "name: endpoint", "suite: arithmetic", f"suite_args: {{split: calibration, n: {N}, seed: 0}}", "engine: openai",
        f'engine_args: {{base_url: "{base_url}", model: fake-model, label: test-endpoint, retries: 1, backoff: 0.001, '
        f"timeout: 20, concurrency: 4{engine_extra}}}",
        "cost: latency_s", "direction: lower", "reference: greedy", "configs:",
        *("  " + line for line in configs.strip().splitlines()), "deploy: fastest", "batch_size: 8"]) + "\n")


def stored_texts(folder: Path) -> list[tuple[str, str]]:
    """(config, text) of every stored outcome."""
    [path] = folder.rglob("outcomes.sqlite")
    with sqlite3.connect(path) as db:
        return list(db.execute("SELECT config, text FROM outcomes"))


def gate(run_gate, *extra):
    return run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json",
                    "--redline-cache-dir=store", *extra)


def report(pytester) -> dict:
    return json.loads((pytester.path / "report.json").read_text())


FAULTS = ["empty", "notext", "malformed", "short", "cut", "503", "drop"]


@pytest.mark.parametrize("fault", [pytest.param(f, marks=pytest.mark.slow if f != "empty" else ()) for f in FAULTS])
def test_a_candidate_prompt_that_faults_for_good_is_an_item_error_and_a_rerun_decodes_only_it(pytester, run_gate, answers, fault):
    faulty = sorted(answers)[5]
    with FakeOpenAI(answers) as fake:
        fake.retry_after = "0"
        fake.faults = {faulty: [None, fault, fault]}  # the reference's request answers, both of the candidate's fault
        grid(pytester.path, fake.base_url)
        first = gate(run_gate, "-rA")
        sent = fake.completions
    out = first.stdout.str()
    assert first.ret == 1, out[-3000:]
    assert report(pytester)["certified"] is False
    assert "failed for good after 2 attempts" in out
    rows = stored_texts(pytester.path)
    solutions = set(answers.values())
    assert all(text in solutions or any(s.startswith(text) for s in solutions) for _, text in rows)  # no fault stored
    answered = sent - 2  # every request that got an answer, the two faulted attempts aside
    assert len(rows) == answered  # every answer received is stored
    with FakeOpenAI(answers) as healthy:
        grid(pytester.path, healthy.base_url)
        second = gate(run_gate)
        resent = healthy.sent_prompts()
    assert second.ret == 0, second.stdout.str()[-3000:]
    assert resent == {faulty: 1}  # exactly the missing prompt
    assert report(pytester)["outcomes"]["decoded"] == 1
