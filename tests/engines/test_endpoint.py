"""The ``openai`` engine: a served model gated through its OpenAI-compatible API.

The fault tests run against a small in-process fake (tests/support/fake_openai.py) that can fail on
demand; one test gates a real ``transformers serve`` that a fixture starts and stops.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the endpoint extra is not installed: pip install -e '.[endpoint]'")

# Imported out here: pytester's in-process runs drop the modules they import, and numpy's
# and torch's C extensions cannot load twice (redline_fakes imports the gate's own).
import redline_fakes  # noqa: E402,F401
import torch  # noqa: E402,F401
from fake_openai import FakeOpenAI  # noqa: E402

from pytest_redline.contracts import Prompt  # noqa: E402
from pytest_redline.engines.endpoint import OpenAIEngine, check_endpoint  # noqa: E402
from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
N = 16
SECRET = "sk-redline-test-0123456789abcdef"


@pytest.fixture(scope="module")
def answers() -> dict[str, str]:
    """The suite's own solutions: a fake that answers every calibration prompt correctly."""
    return {p.prompt: p.solution for p in ArithmeticSuite(split="calibration", n=N, seed=0).problems()}


def _grid(folder: Path, base_url: str, model: str, configs: str, extra: str = "", engine_extra: str = "") -> Path:
    path = folder / "endpoint.yaml"
    lines = [
        "name: endpoint",
        "suite: arithmetic",
        f"suite_args: {{split: calibration, n: {N}, seed: 0}}",
        "engine: openai",
        f'engine_args: {{base_url: "{base_url}", model: {model}, label: test-endpoint, retries: 1, backoff: 0.01, '
        f"timeout: 20, concurrency: 4{engine_extra}}}",
        "cost: latency_s",
        "direction: lower",
        "reference: greedy",
        "configs:",
        *("  " + line for line in configs.strip().splitlines()),
        "deploy: fastest",
        "batch_size: 8",
    ]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


CONFIGS = """\
greedy: {max_tokens: 64, temperature: 0}
again: {max_tokens: 64, temperature: 0, seed: 1}
"""


def _report(pytester) -> dict:
    return json.loads((pytester.path / "report.json").read_text())


def test_check_endpoint_names_the_key_and_refuses_a_key_in_the_grid():
    good = dict(base_url="http://x/v1", model="m", label="l")
    check_endpoint(good)
    with pytest.raises(ValueError, match="engine_args.label"):
        check_endpoint({**good, "label": ""})
    with pytest.raises(ValueError, match="engine_args.api: expected one of completions, chat"):
        check_endpoint({**good, "api": "responses"})
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        check_endpoint({**good, "api_key_env": SECRET.replace("-", " ")})
    with pytest.raises(ValueError, match="unknown config key 'max_token'"):
        OpenAIEngine.check_config({"max_token": 5})


def test_the_outcome_key_names_the_label_not_the_url_or_the_transport():
    args = dict(base_url="http://127.0.0.1:5555/v1", model="m", label="prod", server_revision="r2",
                concurrency=8, timeout=3, retries=2, backoff=1.0, api_key_env="KEY")
    assert OpenAIEngine.key_args(args) == {"model": "m", "label": "prod", "server_revision": "r2", "api_key_env": "KEY"}


def test_stop_strings_are_sent_and_cut_even_when_the_server_returns_them(answers):
    prompt_text, solution = next(iter(answers.items()))
    with FakeOpenAI(answers) as fake:
        engine = OpenAIEngine(base_url=fake.base_url, model="fake-model", label="t", stream=False)
        [plain] = engine.generate([Prompt(id="p", text=prompt_text)], {"max_tokens": 64})
        [cut] = engine.generate([Prompt(id="p", text=prompt_text, stop=("#",))], {"max_tokens": 64})
        [streamed] = OpenAIEngine(base_url=fake.base_url, model="fake-model", label="t").generate(
            [Prompt(id="p", text=prompt_text, stop=("#",))], {"max_tokens": 64})
    assert plain.text == solution and plain.finish_reason == "eos"
    assert cut.text == streamed.text == solution[: solution.index("#")]
    assert cut.finish_reason == streamed.finish_reason == "stop"
    assert plain.forwards is None and plain.tokens == len(solution.split())
    assert streamed.extra["ttft_s"] <= streamed.extra["latency_s"]


@pytest.mark.slow  # in-process pytester gate run(s): 0.29 s CPU, over the inner loop's 50 s budget (issue 25)
def test_a_gate_over_a_fake_endpoint_certifies_a_rerun_of_the_reference_with_v_zero(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        _grid(pytester.path, fake.base_url, "fake-model", CONFIGS)
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = _report(pytester)
    again = next(c for c in report["configs"] if c["name"] == "again")
    assert again["violations"] == 0 and again["valid"] and report["certified"]


@pytest.mark.slow  # in-process pytester gate run(s): 0.26 s CPU, over the inner loop's 50 s budget (issue 25)
def test_a_server_that_fails_every_request_the_same_way_stops_after_its_first_wave(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        fake.status = 500
        _grid(pytester.path, fake.base_url, "fake-model", CONFIGS)
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json", "-v")
        sent = fake.completions
    assert result.ret == 1
    out = result.stdout.str()
    assert "the first 4 requests all failed with HTTP 500" in out and "configuration error" in out
    assert 4 <= sent <= 7  # the first wave of `concurrency`, once, and no more than it again while it failed
    assert _report(pytester)["certified"] is False


@pytest.mark.slow  # waits for the grid's timeout to pass, once per round of requests: about 9 s of wall
def test_a_request_that_hangs_past_the_grid_timeout_is_an_item_error(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        fake.hang_s = 60.0
        _grid(pytester.path, fake.base_url, "fake-model", CONFIGS, extra="timeout: 1\n")
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json")
        deadline = time.monotonic() + 5
        while fake.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        left = fake.in_flight
    assert result.ret == 1
    assert "timed out after 1 s" in result.stdout.str()
    assert _report(pytester)["certified"] is False
    # each timed-out request's connection closed (the fake notices a close within 50 ms, so its own
    # count of requests in flight can briefly pass concurrency while the next request arrives)
    assert left == 0


@pytest.mark.slow  # in-process pytester gate run(s): 0.47 s CPU, over the inner loop's 50 s budget (issue 25)
def test_a_server_that_dies_mid_run_certifies_nothing_and_a_rerun_reuses_every_stored_outcome(pytester, run_gate, answers):
    with FakeOpenAI(answers) as fake:
        fake.answer_limit = N + 8  # the reference and one batch of one candidate, then the server is gone
        _grid(pytester.path, fake.base_url, "fake-model", CONFIGS)
        first = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json")
    assert first.ret == 1
    assert _report(pytester)["certified"] is False
    stored = _report(pytester)["outcomes"]["decoded"]
    assert stored == N + 8
    with FakeOpenAI(answers) as back:  # back on another port, under the same label
        _grid(pytester.path, back.base_url, "fake-model", CONFIGS)
        second = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json")
        sent = back.completions
    assert second.ret == 0, second.stdout.str()[-3000:]
    assert _report(pytester)["outcomes"] == {"reused": N + 8, "decoded": 2 * N - (N + 8)}
    assert sent == 2 * N - (N + 8)


@pytest.mark.slow  # in-process pytester gate run(s): 0.26 s CPU, over the inner loop's 50 s budget (issue 25)
def test_the_api_key_appears_in_no_report_property_log_or_store_row(pytester, run_gate, answers, monkeypatch):
    monkeypatch.setenv("REDLINE_TEST_API_KEY", SECRET)
    monkeypatch.setenv("REDLINE_TEST_HEADER", SECRET + "-header")
    with FakeOpenAI(answers) as fake:
        _grid(pytester.path, fake.base_url, "fake-model", CONFIGS,
              engine_extra=", api_key_env: REDLINE_TEST_API_KEY, headers_env: {X-Gateway-Token: REDLINE_TEST_HEADER}")
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml", "--redline-report=report.json",
                          "--junitxml=junit.xml", "-vv", "--redline-cache-dir=store")
        seen = list(fake.authorizations)
        tokens = [h.get("x-gateway-token") for h in fake.headers]
    assert result.ret == 0
    assert seen and all(a == f"Bearer {SECRET}" for a in seen)  # the key was used ...
    assert set(tokens) == {SECRET + "-header"}  # ... and the header
    written = [result.stdout.str(), result.stderr.str()]
    written += [p.read_bytes().decode("latin-1") for p in pytester.path.rglob("*") if p.is_file()]
    assert not any(SECRET in text for text in written)  # ... and written nowhere


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_ar_target():
    """``transformers serve`` on a free localhost port, serving the embedded ar-target model."""
    cli = shutil.which("transformers")
    if cli is None:
        pytest.skip("the transformers CLI is not installed (pip install 'transformers[serving]')")
    model = str(ROOT / "engines" / "models" / "ar-target")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([cli, "serve", model, "--port", str(port), "--device", "cpu"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not start: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
        yield f"{base}/v1", model
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.mark.slow  # a transformers serve subprocess
def test_a_gate_over_a_real_transformers_serve_certifies_a_rerun_and_rejects_a_truncating_config(
        pytester, run_gate, served_ar_target):
    base_url, model = served_ar_target
    configs = CONFIGS + "short: {max_tokens: 12, temperature: 0}\n"
    _grid(pytester.path, base_url, model, configs)
    result = run_gate("--redline-alpha=0.2", "--redline-grid=endpoint.yaml", "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = _report(pytester)
    by_name = {c["name"]: c for c in report["configs"]}
    assert report["n"] == N and by_name["greedy"]["accuracy"] > 0.5
    assert by_name["again"]["violations"] == 0 and by_name["again"]["valid"]  # deterministic at temperature 0
    assert not by_name["short"]["valid"]  # cut at 12 tokens, before the answer


@pytest.mark.slow  # in-process pytester gate run(s): 0.57 s CPU, over the inner loop's 50 s budget (issue 25)
def test_two_deployments_under_one_label_are_warned_about_because_they_share_outcomes(pytester, run_gate, answers):
    with FakeOpenAI(answers) as one, FakeOpenAI(answers) as two:
        configs = f"""\
greedy: {{max_tokens: 64, temperature: 0}}
here: {{max_tokens: 32, temperature: 0}}
there: {{max_tokens: 32, temperature: 0, engine_args: {{base_url: "{two.base_url}", model: fake-model, label: test-endpoint}}}}
"""
        _grid(pytester.path, one.base_url, "fake-model", configs)
        result = run_gate("--redline-alpha=0.3", "--redline-grid=endpoint.yaml")
    assert "configs 'here' and 'there' resolve to the same outcome key" in result.stdout.str() + result.stderr.str()
