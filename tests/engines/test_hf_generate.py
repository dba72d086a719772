"""The generate-driven engine: DiffusionGemma's and other transformers models' own generate().

- DiffusionGemma (tiny, random, built by benchmarks/make_tiny_checkpoints.py): the engine gives
  exactly what ``model.generate(**same kwargs)`` gives with the same seed, and its hooked decoder
  count equals the model's own step count; grids/diffusion_gemma.yaml gates with exit 0, the
  duplicate of the reference giving V = 0 (per-prompt seeds).
- The embedded autoregressive ar-target: prompt lookup and assisted generation (ar-draft) are
  greedy-lossless, so their text equals plain greedy generate while target forwards drop;
  assisted generation runs at batch size 1, which the engine records.
- ``cache_implementation: quantized`` needs optimum-quanto or hqq: checked before any model loads,
  run only where one is installed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import peers
from peers import one_thread  # noqa: F401  (an autouse fixture)
from pytest_redline.engines.hf_generate import HFGenerateEngine, check_params, prompt_seed, quantized_cache_backend

torch = pytest.importorskip("torch")  # imported before pytester's in-process runs snapshot sys.modules

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # engine decodes with models: out of the inner loop (pytest -m 'not slow'), which must stay under 60 s
ROOT = Path(__file__).resolve().parents[2]
AR_TARGET = ROOT / "engines" / "models" / "ar-target"
AR_DRAFT = ROOT / "engines" / "models" / "ar-draft"
DG_CONFIG = {"max_new_tokens": 16, "max_denoising_steps": 6, "confidence_threshold": 0.005, "stability_threshold": 1,
             "t_min": 0.4, "t_max": 0.8, "sampler_config": {"entropy_bound": 0.1}}


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    pytest.importorskip("transformers.models.diffusion_gemma", reason="DiffusionGemma needs transformers 5.x")
    return peers.builder().diffusion_gemma(tmp_path_factory.mktemp("dg") / "diffusion_gemma")


@pytest.fixture(scope="module")
def prompts():
    from pytest_redline.suites.arithmetic import ArithmeticSuite

    return ArithmeticSuite(n=6, seed=0).prompts()


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
def test_equivalent_engine_model_generate_diffusion_gemma(gemma_folder, prompts):
    from pytest_redline.engines.common import encode
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    engine = HFGenerateEngine(model=gemma_folder, device="cpu", dtype="float32", seed=7)
    ours = engine.generate(prompts, DG_CONFIG)
    kwargs = {**DG_CONFIG, "sampler_config": EntropyBoundSamplerConfig(entropy_bound=0.1)}
    for prompt, generation in zip(prompts, ours):
        ids = torch.tensor([encode(engine.tokenizer, prompt, "test")])
        torch.manual_seed(prompt_seed(prompt.id, 7))
        out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        new = out.sequences[0, ids.shape[1]:].tolist()
        assert engine._generation(new, generation.forwards, dict(generation.extra), prompt) == generation
        valid = sum(t != engine.model.generation_config.pad_token_id for t in new)
        assert generation.extra["denoising_forwards"] == pytest.approx(valid / float(out.tokens_per_forward[0]))
        assert generation.forwards > generation.extra["denoising_forwards"]  # + one encoder forward per canvas
        assert generation.extra["batch_size"] == 1.0
    other_seed = HFGenerateEngine(model=gemma_folder, device="cpu", dtype="float32", seed=8).generate(prompts, DG_CONFIG)
    assert [g.text for g in other_seed] != [g.text for g in ours]  # the seed matters (random canvas)


@pytest.mark.slow  # a gate that decodes, over 5 s
def test_gate_certifies_diffusion_gemma(pytester, run_gate, gemma_folder):
    grid = yaml.safe_load((ROOT / "grids" / "diffusion_gemma.yaml").read_text())
    grid["engine_args"]["model"] = str(gemma_folder)
    pytester.makefile(".yaml", dg=yaml.safe_dump(grid, sort_keys=False))
    result = run_gate("--redline-alpha=0.1", "--redline-grid=dg.yaml", "--redline-full", "--redline-no-cache",
                      "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["checkpoints"]["dg/steps8"]["family"] == "diffusion_gemma"
    assert report["checkpoints"]["dg/steps8"]["declared_block_size"] == 8  # the canvas length
    configs = {c["name"]: c for c in report["configs"]}
    assert configs["dg/steps8-again"]["violations"] == 0
    assert report["outcomes"] == {"reused": 0, "decoded": 4 * 40}  # the duplicate was decoded again
    assert configs["dg/steps8-again"]["cost"] == configs["dg/steps8"]["cost"]


@pytest.fixture(scope="module")
def ar_engine():
    return HFGenerateEngine(model=AR_TARGET, device="cpu", dtype="float32")


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
@pytest.mark.parametrize("knob", [{"prompt_lookup_num_tokens": 3}, {"assistant_model": str(AR_DRAFT)}], ids=["prompt-lookup", "assisted"])
def test_equivalent_greedy_transformers_knobs(ar_engine, prompts, knob):
    plain = ar_engine.generate(prompts, {"max_new_tokens": 24})
    tuned = ar_engine.generate(prompts, {"max_new_tokens": 24, **knob})
    assert [g.text for g in tuned] == [g.text for g in plain]
    assert sum(g.forwards for g in tuned) < sum(g.forwards for g in plain)
    assert all(g.extra["batch_size"] == 1.0 for g in tuned)
    if "assistant_model" in knob:
        assert all(g.extra["draft_forwards"] > 0 for g in tuned)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_denoising_step": 4}, "unknown config key 'max_denoising_step'"),
        ({"max_new_tokens": 0}, "max_new_tokens: expected int >= 1, got 0"),
        ({"sampler_config": 0.1}, "sampler_config: expected a mapping"),
        ({"assistant_model": "no/such/model"}, "assistant_model: expected a model folder with config.json"),
    ],
)
def test_usage_error_check_params(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_params(params)


def test_usage_error_quantized_cache_without_backend(monkeypatch):
    """As where neither backend is installed (the test extra installs optimum-quanto)."""
    import pytest_redline.engines.hf_generate as hf_generate

    monkeypatch.setattr(hf_generate, "quantized_cache_backend", lambda: None)
    with pytest.raises(ValueError, match="needs optimum-quanto or hqq"):
        check_params({"cache_implementation": "quantized"})


def test_equivalent_quantized_cache_runs(ar_engine, prompts):
    if quantized_cache_backend() is None:
        pytest.skip("cache_implementation: quantized needs optimum-quanto or hqq (pip install 'pytest-redline[kvquant]')")
    backend = "quanto" if quantized_cache_backend() == "optimum.quanto" else "hqq"
    out = ar_engine.generate(prompts[:2], {"max_new_tokens": 8, "cache_implementation": "quantized",
                                           "cache_config": {"backend": backend, "nbits": 4}})
    assert all(g.tokens >= 1 for g in out)


def test_stop_strings_cut_hf_generate(ar_engine, prompts):
    """A stop string ends the request: the text before it, tokens through the cut, fewer forwards."""
    import dataclasses

    plain = ar_engine.generate(prompts[:3], {"max_new_tokens": 24})
    stopped = ar_engine.generate([dataclasses.replace(p, stop=(",",)) for p in prompts[:3]], {"max_new_tokens": 24})
    for before, after in zip(plain, stopped):
        assert "," in before.text
        assert after.text == before.text.split(",")[0]
        assert after.finish_reason == "stop"
        assert after.tokens < before.tokens and after.forwards < before.forwards


def test_equivalent_identity_built_hf_generate(gemma_folder):
    """The model-free identity (a warm rerun's outcome key) is what the built engine reports."""
    args = {"model": str(gemma_folder), "device": "cpu", "dtype": "auto", "seed": 3}
    engine = HFGenerateEngine(**args)
    built = {"fingerprint": engine.fingerprint(), "runtime": {k: str(v) for k, v in engine.describe().items()}}
    assert HFGenerateEngine.identity(args) == built
    assert built["runtime"]["seed"] == "3" and built["runtime"]["family"] == "diffusion_gemma"
