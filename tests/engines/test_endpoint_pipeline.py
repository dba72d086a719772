"""The request pipeline of an I/O-bound engine, through the gate: ``concurrency`` requests in flight
across batches, one config at a time on the server, no prompt sent twice, and the serial verdict."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the endpoint extra is not installed: pip install -e '.[endpoint]'")

import redline_fakes  # noqa: E402,F401  (imported out here: pytester's in-process runs drop modules)
import torch  # noqa: E402,F401
from fake_openai import FakeOpenAI  # noqa: E402

from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402

pytest_plugins = ["pytester"]
N = 48
CONFIGS = """\
greedy: {max_tokens: 64, temperature: 0}
good: {max_tokens: 64, temperature: 0, seed: 1}
bad: {max_tokens: 64, temperature: 0, seed: 2}
few: {max_tokens: 64, temperature: 0, seed: 3}
"""
WRONG = {1: 0, 2: 36, 3: 2}  # seed -> how many prompts (the first ones, by text) the config answers wrongly


@pytest.fixture(scope="module")
def answers() -> dict[str, str]:
    return {p.prompt: p.solution for p in ArithmeticSuite(split="calibration", n=N, seed=0).problems()}


def respond(answers):
    wrong = {seed: set(sorted(answers)[:count]) for seed, count in WRONG.items()}
    return lambda body, text: "no idea" if body.get("prompt") in wrong.get(body.get("seed"), ()) else text


def grid(folder: Path, base_url: str, concurrency: int, batch_size: int = 8) -> None:
    (folder / "endpoint.yaml").write_text("\n".join([
        "name: endpoint", "suite: arithmetic", f"suite_args: {{split: calibration, n: {N}, seed: 0}}", "engine: openai",
        f'engine_args: {{base_url: "{base_url}", model: fake-model, label: test-endpoint, retries: 1, backoff: 0.001, '
        f"timeout: 20, concurrency: {concurrency}}}",
        "cost: latency_s", "direction: lower", "reference: greedy", "configs:",
        *("  " + line for line in CONFIGS.strip().splitlines()), "deploy: fastest", f"batch_size: {batch_size}"]) + "\n")


def per_config(fake: FakeOpenAI) -> Counter:
    """Requests per (config, prompt): the body without its prompt names the config."""
    return Counter((b.get("seed"), b.get("prompt")) for b in fake.bodies)


def verdict(pytester) -> dict:
    report = json.loads((pytester.path / "report.json").read_text())
    keep = ("name", "valid", "violations", "status", "stopped", "violations_bound", "ran_on")
    return {"certified": report["certified"], "deploy": report.get("deploy"),
            "configs": [{k: c.get(k) for k in keep} for c in report["configs"]]}


@pytest.mark.slow  # an in-process gate run of 4 configs x 48 prompts: 3.5-5.4 s of wall on the loaded 2-core machine
def test_the_server_sees_concurrency_requests_across_batches_one_config_at_a_time_none_twice(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        fake.latency_s = 0.05
        fake.respond = respond(answers)
        grid(pytester.path, fake.base_url, concurrency=16)
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json")
        peak, configs, sent = fake.peak, fake.peak_configs, per_config(fake)
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    assert peak == 16  # the pool stays full across batches of 8 (it was min(concurrency, batch_size))
    assert configs == 1  # configs one after another
    assert set(sent.values()) == {1}  # no prompt sent twice


@pytest.mark.slow  # two in-process gate runs: 5 s of wall on the loaded 2-core machine, 2.5 s alone
def test_the_pipelined_verdict_is_the_serial_one(pytester, run_gate, answers, monkeypatch):
    verdicts, sent, reports, outputs = {}, {}, {}, {}
    for way in ("pipelined", "serial"):
        if way == "serial":
            monkeypatch.setattr("pytest_redline.decode.pipeline.pipelined", lambda decoder, config: False)
        with FakeOpenAI(answers) as fake:
            fake.respond = respond(answers)
            grid(pytester.path, fake.base_url, concurrency=8, batch_size=4)
            result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json",
                              f"--redline-cache-dir={way}")
            verdicts[way], sent[way] = verdict(pytester), per_config(fake)
            reports[way] = json.loads((pytester.path / "report.json").read_text())
            outputs[way] = " ".join(line.strip() for line in result.stdout.lines)  # the terminal's lines, unwrapped
    assert verdicts["pipelined"] == verdicts["serial"]
    assert any(c["stopped"] for c in verdicts["serial"]["configs"]), verdicts  # a candidate stopped early: it is tested
    assert set(sent["serial"]) <= set(sent["pipelined"])  # past a stop, the pipeline may have sent more
    # what it sent past a stop is counted: each config's requests less the prompts it ran
    seeds = {c["name"]: c["params"].get("seed") for c in reports["pipelined"]["configs"]}
    for way in ("pipelined", "serial"):
        past = {c["name"]: c["decoded_past_stop"] for c in reports[way]["configs"]}
        sent_ahead = {name: sum(1 for seed, _ in sent[way] if seed == seeds[name]) - len(c["ran_on"])
                      for name, c in zip(seeds, reports[way]["configs"])}
        assert past == sent_ahead, (way, past, sent_ahead)
        assert reports[way]["spend"]["decoded_past_stops"] == sum(past.values())
        assert ("decoded past early stops" in outputs[way]) == any(past.values())
    assert not any(c["decoded_past_stop"] for c in reports["serial"]["configs"])


@pytest.mark.slow  # two xdist workers in a subprocess: about 15 s of wall
def test_under_xdist_the_session_keeps_concurrency_and_one_config_at_a_time_and_sends_nothing_twice(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        fake.latency_s = 0.02
        fake.respond = respond(answers)
        grid(pytester.path, fake.base_url, concurrency=6, batch_size=4)
        run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json",
                 "--redline-cache-dir=serial")
        serial = verdict(pytester)
    with FakeOpenAI(answers) as fake:
        fake.latency_s = 0.02
        fake.respond = respond(answers)
        grid(pytester.path, fake.base_url, concurrency=6, batch_size=4)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
                                               "--redline-alpha=0.3", "--redline-grid=endpoint.yaml",
                                               "--redline-report=report.json", "--redline-cache-dir=xdist")
        peak, configs, sent = fake.peak, fake.peak_configs, per_config(fake)
    assert "2 workers" in result.stdout.str(), result.stdout.str()[-3000:]
    assert peak <= 6 and configs == 1  # the whole session: concurrency, and one config at a time on the server
    assert set(sent.values()) == {1}  # no request twice
    assert verdict(pytester) == serial
    report = json.loads((pytester.path / "report.json").read_text())  # the workers' counts past stops, merged
    seeds = {c["name"]: c["params"].get("seed") for c in report["configs"]}
    assert {c["name"]: c["decoded_past_stop"] for c in report["configs"]} == {
        c["name"]: sum(1 for seed, _ in sent if seed == seeds[c["name"]]) - len(c["ran_on"]) for c in report["configs"]}


def test_a_configs_first_requests_go_out_after_one_batch_is_prepared_not_all(pytester, run_gate, answers, monkeypatch):
    """Batches are prepared (keys, the store's lookup) one at a time, each one's requests queued
    before the next: the next config's first request does not wait for all its batches' lookups."""
    from pytest_redline.decode.storage import Storage
    from pytest_redline.engines.endpoint import OpenAIEngine

    loads, at_first_request = Counter(), {}
    load, complete = Storage._load, OpenAIEngine.complete

    def counted_load(self, config, batch, keys):
        loads[config] += 1
        return load(self, config, batch, keys)

    async def noted_complete(self, prompt, params):
        at_first_request.setdefault(params.get("seed"), dict(loads))
        return await complete(self, prompt, params)

    monkeypatch.setattr(Storage, "_load", counted_load)
    monkeypatch.setattr(OpenAIEngine, "complete", noted_complete)
    with FakeOpenAI(answers) as fake:
        grid(pytester.path, fake.base_url, concurrency=64, batch_size=8)  # 6 batches a config
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-full")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    names = {None: "greedy", 1: "good", 2: "bad", 3: "few"}
    assert set(at_first_request) == set(names)
    for seed, name in names.items():
        assert at_first_request[seed].get(name, 0) <= 2, at_first_request  # was 6: every batch looked up first
        assert loads[name] == N // 8
