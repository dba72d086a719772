"""The quantized engine: every bitsandbytes mode loads, its weight memory counts the scales, greedy
decoding is plain greedy, and the peak-memory tracker measures what is alive."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_redline.engines import memory
from pytest_redline.engines.runtime import AR_TARGET
from pytest_redline.engines.autoregressive_spec import MODES, quantized_config as check_config
from pytest_redline.engines.quantized import QuantizedEngine
from pytest_redline.suites.arithmetic import ArithmeticSuite

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # engine decodes with models: out of the inner loop (pytest -m 'not slow'), which must stay under 60 s

QUANTIZED = [m for m in MODES if m != "none"]


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    yield QuantizedEngine(model=AR_TARGET, device="cpu", dtype="float32", threads=1)
    torch.set_num_threads(threads)  # threads are process-wide: leave them as found


@pytest.fixture(scope="module")
def prompts():
    return ArithmeticSuite(split="calibration", n=16, seed=0).prompts()


def linear_layers(model) -> list[torch.nn.Module]:
    return [m for name, m in model.model.layers.named_modules() if name and hasattr(m, "in_features")]


@pytest.mark.slow  # over 5 s
@pytest.mark.parametrize("mode", QUANTIZED)
def test_every_decoder_linear_is_quantized_and_its_scales_are_counted(engine, mode) -> None:
    model = engine.model(mode)
    layers = linear_layers(model)
    assert layers and all(memory.quant_state_tensors(m) for m in layers)
    weights = sum(m.in_features * m.out_features for m in layers)
    counted = memory.weight_memory(model)
    if mode == "int8":
        assert counted["scales"] == 4 * sum(m.out_features for m in layers)  # one float32 per output row
        packed = weights
    else:
        blocks = weights // 64
        absmax = sum(m.weight.quant_state.absmax.element_size() for m in layers[:1]) * blocks
        assert counted["scales"] == absmax + 16 * 4 * len(layers)  # block scales + the 16-entry code book
        packed = weights // 2
    assert counted["scales"] > 0.02 * packed
    assert counted["total"] == counted["weights"] + counted["scales"]


@pytest.mark.parametrize("mode", QUANTIZED)
def test_transformers_footprint_leaves_out_exactly_the_scales(engine, mode) -> None:
    model = engine.model(mode)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    counted = memory.weight_memory(model)
    assert model.get_memory_footprint() - buffers == counted["weights"]
    assert counted["total"] - (model.get_memory_footprint() - buffers) == counted["scales"] > 0


def test_memory_shrinks_with_the_bits(engine) -> None:
    total = {mode: memory.weight_memory(engine.model(mode))["total"] for mode in MODES}
    assert total["none"] > total["int8"] > total["nf4"] == total["fp4"]
    assert memory.weight_memory(engine.model("none"))["scales"] == 0


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
@pytest.mark.parametrize("mode", MODES)
def test_generation_reports_memory_of_its_mode_on_every_prompt(engine, prompts, mode) -> None:
    gens = engine.generate(prompts, {"quantization": mode})
    weight = memory.weight_memory(engine.model(mode))
    assert {g.extra["memory"] for g in gens} == {float(weight["total"])}
    assert {g.extra["memory_scales"] for g in gens} == {float(weight["scales"])}
    assert len({g.extra["memory_peak"] for g in gens}) == 1
    assert gens[0].extra["memory_peak"] > weight["total"]  # weights plus the cache and activations
    assert all(g.forwards == g.tokens for g in gens)  # one forward per greedy token


def test_reference_mode_is_the_target_greedy_output(engine, prompts) -> None:
    model, tok = engine.model("none"), engine.tokenizer
    got = [g.text for g in engine.generate(prompts, {"quantization": "none"})]
    batch = tok([p.text for p in prompts], return_tensors="pt", padding=True)
    ids = model.generate(**batch, do_sample=False, max_new_tokens=96, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    expected = []
    for row in ids[:, batch.input_ids.shape[1] :].tolist():
        expected.append(tok.decode(row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row))
    assert got == expected


def test_stop_string_ends_greedy_decoding_at_the_cut(engine, prompts) -> None:
    """Prompt.stop: the text before the first stop string, tokens and forwards through the token
    that completes it (one per greedy token), finish_reason stop; else eos or length."""
    full = engine.generate(prompts, {"quantization": "none"})
    cut = engine.generate([dataclasses.replace(p, stop=(",",)) for p in prompts], {"quantization": "none"})
    assert {g.finish_reason for g in full} <= {"eos", "length"} and any(g.finish_reason == "stop" for g in cut)
    for whole, g in zip(full, cut):
        if g.finish_reason == "stop":
            assert g.text == whole.text.split(",")[0] and g.forwards == g.tokens < whole.tokens
            assert "," in engine.tokenizer.decode(engine.tokenizer(whole.text).input_ids[: g.tokens])
        else:
            assert (g.text, g.tokens, g.finish_reason) == (whole.text, whole.tokens, whole.finish_reason)


def test_a_padding_id_is_never_picked(engine, prompts) -> None:
    """ar-target's embedding has 96 rows for 83 tokens: with its head rigged to score padding id 95
    highest, greedy decoding still picks tokens only (no empty text), as unrigged."""
    model = engine.model("none")
    assert engine.tokens == len(engine.tokenizer) < model.get_output_embeddings().weight.shape[0]
    clean = engine.generate(prompts[:8], {"quantization": "none"})

    def rig(module, args, out):
        out = out.clone()
        out[..., 95] = out.max() + 100.0
        return out

    hook = model.get_output_embeddings().register_forward_hook(rig)
    try:
        rigged = engine.generate(prompts[:8], {"quantization": "none"})
    finally:
        hook.remove()
    assert [(g.text, g.tokens) for g in rigged] == [(g.text, g.tokens) for g in clean] and all(g.text for g in rigged)


def test_tensor_peak_counts_what_is_alive_at_once(engine) -> None:
    model = engine.model("none")
    with memory.TensorPeak(model) as tracker:
        a = torch.ones(1000, dtype=torch.float64)  # 8000 bytes
        b = a * 2  # another 8000
        view = b[10:]
        del a
        c = b + 1  # 8000 while b is alive
        del b, c
        after = tracker.current
        assert view.sum() > 0
    assert tracker.base == memory.resident_bytes(model)
    assert tracker.peak == tracker.base + 16000  # two of the three at any time
    assert after == tracker.base + 8000  # b's storage lives on through the view


@pytest.mark.parametrize(
    "params, words",
    [
        ({"quantization": "int4"}, ["quantization", "none, int8, nf4, fp4", "'int4'"]),
        ({"bits": 4}, ["'bits'", "quantization", "max_new_tokens"]),
        ({"max_new_tokens": 0}, ["max_new_tokens", ">= 1"]),
    ],
)
def test_bad_config_is_a_value_error_naming_the_key(params, words) -> None:
    with pytest.raises(ValueError) as info:
        check_config(params)
    for word in words:
        assert word in str(info.value)


def test_describe_reports_the_runtime_and_bitsandbytes(engine) -> None:
    import bitsandbytes

    info = engine.describe()
    assert info["model"] == str(AR_TARGET) and info["device"] == "cpu" and info["dtype"] == "float32"
    assert bitsandbytes.__version__ in info["quantization"]
    assert len(engine.fingerprint()) == 64


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
def test_gate_certifies_a_quantization_grid_end_to_end(pytester, run_gate) -> None:
    pytester.makefile(".yaml", quant=GATE_GRID.format(model=AR_TARGET))
    result = run_gate("--redline-alpha=0.1", "--redline-grid", "quant.yaml")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*cost memory (lower is better)*", "R* fp32 *", "* nf4 *", "*CERTIFIED (quantization-tiny, select)*"])


GATE_GRID = """\
name: quantization-tiny
suite: arithmetic
suite_args: {{split: calibration, n: 32, seed: 0}}
engine: quantized
engine_args: {{model: {model}, device: cpu, dtype: float32, threads: 1}}
cost: memory
reference: fp32
configs:
  fp32: {{quantization: none}}
  nf4: {{quantization: nf4}}
deploy: fastest
batch_size: 32
"""
