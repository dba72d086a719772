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
    [path] = (folder / "store").rglob("outcomes.sqlite")
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


def verdict(pytester) -> dict:
    data = report(pytester)
    keep = ("name", "valid", "violations", "status", "stopped", "violations_bound")
    return {"certified": data["certified"], "deploy": data.get("deploy"), "skipped": data.get("skipped"),
            "configs": [{k: c.get(k) for k in keep} for c in data["configs"]]}


def wrong_on(answers, reference_wrong: int, candidate_wrong: int):
    """The reference (no seed) wrong on the first prompts, the candidate on a few others."""
    names = sorted(answers)
    ref, cand = set(names[:reference_wrong]), set(names[-candidate_wrong:]) if candidate_wrong else set()
    return lambda body, text: "no idea" if body.get("prompt") in (cand if body.get("seed") else ref) else text


@pytest.mark.slow  # nine in-process gate runs: about 12 s
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_reference_fault_never_certifies_what_the_healthy_run_would_not(pytester, run_gate, answers, seed):
    import random

    rng = random.Random(seed)
    respond = wrong_on(answers, 2, 1)
    with FakeOpenAI(answers) as healthy:
        healthy.respond = respond
        grid(pytester.path, healthy.base_url)
        gate(run_gate, "--redline-cache-dir=healthy")
    expected = verdict(pytester)
    faulty = rng.sample(sorted(answers), rng.randint(1, 4))
    with FakeOpenAI(answers) as fake:
        fake.respond, fake.retry_after = respond, "0"
        fault = rng.choice(["empty", "notext", "malformed", "503", "drop"])
        fake.faults = {p: [fault, fault] for p in faulty}  # both of the reference's attempts
        grid(pytester.path, fake.base_url)
        first = gate(run_gate)
    assert first.ret == 1 and report(pytester)["certified"] is False
    stored = stored_texts(pytester.path)
    assert not any(c == "greedy" and t not in set(answers.values()) | {"no idea"} for c, t in stored)
    assert sum(c == "greedy" for c, _ in stored) == N - len(faulty)  # no fault stored as a (wrong) answer
    with FakeOpenAI(answers) as back:
        back.respond = respond
        grid(pytester.path, back.base_url)
        second = gate(run_gate)
        resent = back.sent_prompts()
    assert second.ret == (0 if expected["certified"] else 1)
    assert verdict(pytester) == expected
    # exactly the missing prompts: the outcome key holds no batch, so the rerun's scheduled batches
    # find what the faulty run's prompt-order batches stored
    assert resent == {p: 1 for p in faulty}


def test_each_configs_length_stops_are_counted_and_a_config_over_5_percent_is_warned_about(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        fake.faults = {p: [None, "length"] for p in sorted(answers)[:4]}  # 4 of 16 candidate answers at the limit
        grid(pytester.path, fake.base_url)
        first = gate(run_gate, "--redline-markdown=summary.md")
        counts = {c["name"]: c["length_stops"] for c in report(pytester)["configs"]}
        summary = (pytester.path / "summary.md").read_text()
        again = gate(run_gate)  # from the store: the stored finish reasons count the same
    for result in (first, again):
        out = " ".join(line.strip() for line in result.stdout.lines)  # the terminal's lines, unwrapped
        assert "stopped at the token limit (finish_reason length): again 4 of 16 warning:" in out, out[-3000:]
        assert out.count("outcomes stopped at the token limit") == 1, out[-3000:]  # greedy has none
        assert ("warning: config 'again': 4 of 16 outcomes stopped at the token limit (over 5%); raise its max_tokens "
                "if the answers are cut") in out
    assert counts == {"greedy": {"count": 0, "outcomes": N, "warning": False},
                      "again": {"count": 4, "outcomes": N, "warning": True}}
    assert {c["name"]: c["length_stops"] for c in report(pytester)["configs"]} == counts
    assert report(pytester)["outcomes"] == {"reused": 2 * N, "decoded": 0}
    assert "warning: config 'again': 4 of 16 outcomes stopped at the token limit" in summary  # the pull request's page


@pytest.mark.slow  # an in-process gate run against three servers: about 3 s
def test_replicas_in_the_grid_and_a_candidates_own_replicas_merge_key_by_key(pytester, run_gate, answers):
    with FakeOpenAI(answers) as one, FakeOpenAI(answers) as two, FakeOpenAI(answers) as three:
        configs = f"""\
greedy: {{max_tokens: 64, temperature: 0}}
elsewhere: {{max_tokens: 64, temperature: 0, engine_args: {{base_url: ["{three.base_url}"], label: other-deployment}}}}
"""
        (pytester.path / "endpoint.yaml").write_text("\n".join([
            "name: endpoint", "suite: arithmetic", f"suite_args: {{split: calibration, n: {N}, seed: 0}}", "engine: openai",
            f'engine_args: {{base_url: ["{one.base_url}", "{two.base_url}"], model: fake-model, label: test-endpoint, '
            "concurrency: 4}", "cost: latency_s", "direction: lower", "reference: greedy", "configs:",
            *("  " + line for line in configs.strip().splitlines()), "deploy: fastest", "batch_size: 8"]) + "\n")
        result = gate(run_gate)
        counts = [one.sent_prompts(), two.sent_prompts(), three.sent_prompts()]
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert sum(counts[0].values()) + sum(counts[1].values()) == N and counts[0] and counts[1]  # the reference, on both
    assert sum(counts[2].values()) == N  # the candidate on its own replica, with the grid's model and concurrency
    assert not (set(counts[0]) | set(counts[1])) - set(answers) and set(counts[2]) == set(answers)
