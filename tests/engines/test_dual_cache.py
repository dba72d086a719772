"""``schedule: fast_dllm`` (engines/dual_cache.py): its model-free checks and its laws.

Parity with Fast-dLLM's own decoders (LLaDA, Dream) is in tests/engines/test_checkpoints_parity.py. Here,
on the tiny random Llama of conftest.py (float64): a batch of mixed prompt lengths (left-padded)
decodes what each prompt decodes alone, forwards equal the model's calls, every block starts with
a refresh followed by at least one block step, and a stop string ends a request. A config the
schedule cannot run is refused before any model loads (exit 4), naming the key.
"""
import json

import pytest
import yaml

from pytest_redline.contracts import Prompt
from pytest_redline.engines.diffusion_spec import BlockBatchSpec, BlockDiffusionSpec, DecodeConfig
from pytest_redline.suites.arithmetic import ArithmeticSuite

torch = pytest.importorskip("torch")  # imported before pytester's in-process runs snapshot sys.modules

pytestmark = pytest.mark.slow  # the dual-cache engine: imports torch and transformers, loads the tiny model

pytest_plugins = ["pytester"]
DUAL = {"schedule": "fast_dllm", "block_size": 4, "accept_threshold": 0.6, "max_new_tokens": 12}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"max_new_tokens": 10}, "max_new_tokens: expected a multiple of block_size 4 under schedule fast_dllm"),
        ({"max_new_tokens": None}, "max_new_tokens: expected a value under schedule fast_dllm"),
        ({"block_size": None}, "block_size: expected a value under schedule fast_dllm"),
        ({"buffer_size": 1}, "buffer_size: does not apply to schedule fast_dllm"),
        ({"use_cache": False}, "use_cache: schedule fast_dllm is the dual cache"),
    ],
)
def test_clear_errors_fast_dllm_config(change, message):
    params = {k: v for k, v in {**DUAL, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        DecodeConfig.from_params(params)


def test_decode_mode_model_free():
    assert BlockDiffusionSpec.decode_mode(DUAL).startswith("fast_dllm: dual cache, full attention")
    assert "generate_with_dual_cache" in BlockDiffusionSpec.decode_mode(DUAL)
    assert BlockDiffusionSpec.decode_mode({}).startswith("diffulex: block-causal cache")
    assert BlockBatchSpec.decode_mode({}).startswith("block-causal cache per branch")


def test_usage_error_length_not_whole_blocks(pytester, run_gate):
    pytester.makefile(".yaml", grid=yaml.safe_dump({
        "name": "dual", "suite": "arithmetic", "suite_args": {"n": 40}, "engine": "block_diffusion", "cost": "tpf",
        "reference": "a", "configs": {"a": {**DUAL, "max_new_tokens": 10}, "b": dict(DUAL)},
    }))
    result = run_gate("--redline-alpha=0.1", "--redline-grid=grid.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*grid.yaml: configs.a.max_new_tokens: *expected a multiple of block_size 4*got 10*"])
    assert not (pytester.path / ".redline").exists()  # nothing decoded


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    from pytest_redline.engines.block_diffusion import BlockDiffusionEngine

    return BlockDiffusionEngine(model=tiny_folder, device="cpu", dtype="float64")


@pytest.mark.slow  # the tiny engine's first load is over 5 s in a cold session
def test_equivalent_batched_left_padded_and_alone(tiny):
    prompts = ArithmeticSuite(n=8, seed=3).prompts()
    assert len({len(tiny.tokenizer(p.text).input_ids) for p in prompts}) > 1
    batched = tiny.generate(prompts, DUAL)
    alone = [tiny.generate([p], DUAL)[0] for p in prompts]
    assert [(g.text, g.tokens, g.forwards) for g in batched] == [(g.text, g.tokens, g.forwards) for g in alone]


@pytest.mark.slow  # the tiny engine's first load is over 5 s in a cold session
def test_counts_and_block_life_cycle(tiny, tmp_path):
    """Forwards = the decoder's calls (a batched call counts once per row); each block: one
    refresh, then block steps until it has no MASK (at least one, as in Fast-dLLM)."""
    from pytest_redline.engines.block_diffusion import BlockDiffusionEngine

    prompts = ArithmeticSuite(n=6, seed=4).prompts()
    rows = []
    count = lambda module, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0])  # noqa: E731
    hook = tiny.model.base_model.register_forward_hook(count, with_kwargs=True)
    try:
        gens = tiny.generate(prompts, DUAL)
    finally:
        hook.remove()
    assert sum(g.forwards for g in gens) == sum(rows)
    traced = BlockDiffusionEngine(model=tiny.path, device="cpu", dtype="float64", trace=tmp_path / "trace.jsonl")
    assert [g.text for g in traced.generate(prompts, DUAL)] == [g.text for g in gens]
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    for prompt, gen in zip(prompts, gens):
        steps = [e for e in trace if e["prompt"] == prompt.id]
        assert len(steps) == gen.forwards == gen.extra["refresh_forwards"] + sum(e["forward"] == "block" for e in steps)
        for block in {e["block"] for e in steps}:
            kinds = [e["forward"] for e in steps if e["block"] == block]
            assert kinds[0] == "refresh" and kinds.count("refresh") == 1
            assert len(kinds) >= 2 or steps[-1]["finished"] is not None
        assert gen.tokens <= DUAL["max_new_tokens"] and gen.extra["blocks"] == -(-max(gen.tokens, 1) // 4)


@pytest.mark.slow  # the tiny engine's first load is over 5 s in a cold session
def test_stop_string_ends_request(tiny):
    prompt = ArithmeticSuite(n=1, seed=5).prompts()[0]
    full = tiny.generate([prompt], DUAL)[0]
    assert len(full.text) >= 3
    stop = full.text[1:3]
    cut = tiny.generate([Prompt(prompt.id, prompt.text, prompt.messages, prompt.meta, (stop,))], DUAL)[0]
    assert cut.finish_reason == "stop" and stop not in cut.text and full.text.startswith(cut.text)
    assert cut.forwards <= full.forwards
