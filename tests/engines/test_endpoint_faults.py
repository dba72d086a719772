"""The ``openai`` engine against a fault-injecting loopback server: no fault becomes an answer,
every answer received is kept, retries wait as the server asks, a cancelled request ends on the
server, and the transport's extras (replicas, headers, TLS, proxies, idle timeout, readiness)."""
from __future__ import annotations

import asyncio
import random
import subprocess
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

from pytest_redline.contracts import PartialBatch, Prompt
from pytest_redline.engines.endpoint import OpenAIEngine, RequestFailed
from pytest_redline.engines.endpoint_faults import Backoff, Fault, parse_retry_after
from pytest_redline.engines.http_client import EndpointError, proxy_for

ANSWERS = {f"q{i}": f"answer {i}" for i in range(12)}
PROMPTS = [Prompt(id=f"p{i}", text=f"q{i}") for i in range(12)]
CONFIG = {"max_tokens": 32, "temperature": 0}


def _engine(fake: FakeOpenAI, **kw) -> OpenAIEngine:
    args = dict(base_url=fake.base_url, model="fake-model", label="t", retries=2, backoff=0.001, timeout=10, concurrency=4)
    return OpenAIEngine(**{**args, **kw})


FAULTS = ["500", "503", "429", "drop", "cut", "malformed", "empty", "notext", "short", "hang"]


@pytest.mark.parametrize(("fault", "stream"), [(f, s) for s in (True, False) for f in FAULTS if s or f != "cut"])  # a cut is a stream's
def test_each_retried_fault_is_retried_and_never_becomes_an_answer(fault, stream):
    with FakeOpenAI(ANSWERS) as fake:
        fake.retry_after = "0"
        fake.faults = {"q0": [fault], "q1": [fault, fault, fault]}  # q0 recovers, q1 fails every attempt
        engine = _engine(fake, stream=stream, timeout=0.5 if fault == "hang" else 10)
        with pytest.raises(PartialBatch) as caught:
            engine.generate(PROMPTS[:4], CONFIG)
    batch = caught.value
    assert sorted(batch.generations) == [0, 2, 3]  # every answer received is kept
    assert [batch.generations[i].text for i in (0, 2, 3)] == ["answer 0", "answer 2", "answer 3"]
    assert list(batch.errors) == [1] and isinstance(batch.errors[1], RequestFailed)
    assert batch.errors[1].attempts == 3 and "failed for good after 3 attempts" in str(batch.errors[1])
    assert fake.attempts["q0"] == 2 and fake.attempts["q1"] == 3


def test_a_status_not_worth_retrying_fails_at_once_with_its_real_attempt_count():
    with FakeOpenAI(ANSWERS) as fake:
        fake.faults = {"q1": ["400"]}
        engine = _engine(fake)
        engine.generate(PROMPTS[:1], CONFIG)  # a success first: the 400 is the prompt's, not the endpoint's
        with pytest.raises(RequestFailed, match="after 1 attempt: HTTP 400"):
            asyncio.run(engine.complete(PROMPTS[1], CONFIG))
    assert fake.attempts["q1"] == 1


def test_a_true_length_stop_is_an_answer_and_asks_the_server_for_usage():
    with FakeOpenAI(ANSWERS) as fake:
        fake.faults = {"q0": ["length"]}
        [answer] = _engine(fake).generate(PROMPTS[:1], {"max_tokens": 8})
        body = fake.bodies[0]
    assert answer.text == "answer 0" and answer.finish_reason == "length" and answer.tokens == 8
    assert fake.attempts["q0"] == 1 and answer.extra["output_tokens"] == 8.0
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_retry_after_is_honoured_up_to_its_cap_and_the_first_retry_waits_too():
    with FakeOpenAI(ANSWERS) as fake:
        fake.retry_after = "0.3"
        fake.faults = {"q0": ["429"], "q1": ["503"]}
        engine = _engine(fake, backoff=0.05)
        engine.generate(PROMPTS[:2], CONFIG)
        sent = {p: [t for b, t in zip(fake.bodies, fake.times) if b["prompt"] == p] for p in ("q0", "q1")}
    assert sent["q0"][1] - sent["q0"][0] >= 0.3  # Retry-After: 0.3
    assert sent["q1"][1] - sent["q1"][0] >= 0.025  # the first retry's backoff, at least half of 0.05
    capped = Backoff(0.01, cap=2.0, rng=random.Random(0))
    assert capped.wait(1, Fault("x", True, 429, retry_after=60)) == 2.0
    waits = [Backoff(1.0, 100, random.Random(s)).wait(3, Fault("x", True)) for s in range(20)]
    assert all(2.0 <= w <= 4.0 for w in waits) and len(set(waits)) == 20  # 2**2 with jitter in [0.5, 1]


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after("3") == 3.0 and parse_retry_after(None) is None and parse_retry_after("soon") is None
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= parse_retry_after(later) <= 31


def test_a_cancelled_request_closes_its_connection_and_the_server_sees_it_end():
    with FakeOpenAI(ANSWERS) as fake:
        fake.hang_s = 30.0
        engine = _engine(fake, concurrency=3)

        async def cancel_after_start():
            tasks = [asyncio.ensure_future(engine.complete(p, CONFIG)) for p in PROMPTS[:6]]
            while fake.in_flight < 3:
                await asyncio.sleep(0.01)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await engine.aclose()

        asyncio.run(cancel_after_start())
        deadline = time.monotonic() + 5
        while fake.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        left, peak, sent = fake.in_flight, fake.peak, fake.completions
    assert peak == 3 and sent == 3  # never more than concurrency; the queued three were never sent
    assert left == 0  # every connection closed: the server saw each request end


def test_a_misconfigured_endpoint_stops_sending_after_its_first_prompt_fails_for_good():
    with FakeOpenAI(ANSWERS) as fake:
        fake.status = 500
        engine = _engine(fake, retries=1, concurrency=2)
        with pytest.raises(PartialBatch) as caught:
            engine.generate(PROMPTS[:8], CONFIG)
        sent = fake.sent_prompts()
    errors = caught.value.errors
    never_sent = [i for i in range(8) if f"q{i}" not in sent]
    assert never_sent and all(isinstance(errors[i], EndpointError) for i in never_sent)
    assert "configuration error" in str(errors[never_sent[0]]) and "HTTP 500" in str(errors[never_sent[0]])
    # the first wave of `concurrency` (2) requests, and at most one that went out while it failed; none retried
    assert set(sent.values()) == {1} and 2 <= len(sent) <= 3


def test_replicas_share_the_load_and_one_that_is_not_ready_is_skipped_with_a_warning():
    with FakeOpenAI(ANSWERS) as one, FakeOpenAI(ANSWERS) as two:
        one.latency_s = two.latency_s = 0.05
        dead = "http://127.0.0.1:9/v1"
        engine = OpenAIEngine(base_url=[one.base_url, dead, two.base_url], model="fake-model", label="t", concurrency=4)
        with pytest.warns(RuntimeWarning, match="replica http://127.0.0.1:9/v1 skipped"):
            answers = engine.generate(PROMPTS, CONFIG)
        counts = (one.completions, two.completions)
    assert [a.text for a in answers] == [ANSWERS[p.text] for p in PROMPTS]
    assert counts == (6, 6)  # the fewest in flight first, so an even split
    assert OpenAIEngine.key_args({"base_url": [one.base_url], "model": "m", "label": "l"}) == {"model": "m", "label": "l"}


def test_readiness_uses_health_where_the_server_has_it_else_models_and_refuses_a_model_it_does_not_serve():
    with FakeOpenAI(ANSWERS, health=False) as fake:
        [answer] = _engine(fake).generate(PROMPTS[:1], CONFIG)
        paths = list(fake.paths)
        with pytest.raises(PartialBatch, match="does not serve 'other'"):
            _engine(fake, model="other").generate(PROMPTS[:1], CONFIG)
    assert answer.text == "answer 0" and "/v1/models" in paths and "/health" in paths


def test_headers_from_the_environment_are_sent_and_never_kept_in_the_engine_args(monkeypatch):
    monkeypatch.setenv("REDLINE_TEST_TOKEN", "tok-123")
    with FakeOpenAI(ANSWERS) as fake:
        args = dict(base_url=fake.base_url, model="fake-model", label="t", headers_env={"X-Auth-Token": "REDLINE_TEST_TOKEN"})
        OpenAIEngine(**args).generate(PROMPTS[:1], CONFIG)
        seen = fake.headers
    assert all(h.get("x-auth-token") == "tok-123" for h in seen) and "tok-123" not in repr(OpenAIEngine.key_args(args))
    monkeypatch.delenv("REDLINE_TEST_TOKEN")
    with pytest.raises(ValueError, match="headers_env.X-Auth-Token: the environment variable REDLINE_TEST_TOKEN is not set"):
        OpenAIEngine(**args)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> Path:
    """A self-signed certificate for 127.0.0.1 (key and certificate in one PEM file)."""
    folder = tmp_path_factory.mktemp("tls")
    pem = folder / "server.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(folder / "key.pem"),
                    "-out", str(folder / "cert.pem")], check=True, capture_output=True)
    pem.write_text((folder / "key.pem").read_text() + (folder / "cert.pem").read_text())
    return folder


def test_tls_with_the_servers_own_ca_or_verification_off(certificate):
    with FakeOpenAI(ANSWERS, certfile=str(certificate / "server.pem")) as fake:
        with pytest.raises(PartialBatch, match="no replica is ready"):
            _engine(fake).generate(PROMPTS[:1], CONFIG)  # an unknown CA: refused
        [trusted] = _engine(fake, ca_file=str(certificate / "cert.pem")).generate(PROMPTS[:1], CONFIG)
        [unverified] = _engine(fake, verify_tls=False).generate(PROMPTS[1:2], CONFIG)
    assert fake.base_url.startswith("https://") and trusted.text == "answer 0" and unverified.text == "answer 1"


def test_proxies_come_from_the_environment_and_loopback_is_never_proxied(monkeypatch):
    with FakeOpenAI(ANSWERS) as proxy, FakeOpenAI(ANSWERS) as direct:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        [far] = OpenAIEngine(base_url="http://gpu-box.example:8000/v1", model="fake-model", label="t").generate(PROMPTS[:1], CONFIG)
        [near] = _engine(direct).generate(PROMPTS[1:2], CONFIG)
        proxied, direct_paths = list(proxy.paths), list(direct.paths)
    assert far.text == "answer 0" and near.text == "answer 1"
    assert "http://gpu-box.example:8000/v1/completions" in proxied  # the absolute URL: a proxied request
    assert direct_paths and all(p.startswith("/") for p in direct_paths) and proxy.completions == 1
    assert proxy_for("http://localhost:1/v1", {"http": "http://p:3128"}) is None
    assert proxy_for("http://h.example/v1", {"http": "http://p:3128", "no": "h.example"}) is None


def test_a_stream_that_stalls_past_its_idle_timeout_is_retried_before_the_request_timeout():
    with FakeOpenAI(ANSWERS) as fake:
        fake.faults = {"q0": ["stall"]}
        start = time.monotonic()
        [answer] = _engine(fake, stream_idle_timeout=0.3, timeout=30).generate(PROMPTS[:1], CONFIG)
        took = time.monotonic() - start
    assert answer.text == "answer 0" and fake.attempts["q0"] == 2 and took < 30


def test_the_identity_needs_no_request_and_agrees_with_the_built_engine():
    args = dict(base_url="http://127.0.0.1:9/v1", model="m", label="prod", server_revision="r2", api="chat")
    engine = OpenAIEngine(**args)  # building sends nothing either: nothing listens on port 9
    assert OpenAIEngine.identity(args) == {"fingerprint": engine.fingerprint(), "runtime": engine.describe()}
    assert OpenAIEngine.io_bound and OpenAIEngine.batch_invariant
