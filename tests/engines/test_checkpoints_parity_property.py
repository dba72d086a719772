"""Parity as a property (hypothesis), in float64, of our block-diffusion engine with Fast-dLLM's
dual cache (LLaDA and Dream) and with SDAR's ``generate.py``, at every setting.

Drawn per example: the block length B (2, 4, 8, 16), the threshold (0.5 to 0.99), one or two of
the first 24 arithmetic calibration prompts (every length: the rows of a batch are left-padded)
and the tiny model's seed; ``gen_length`` is 1 to 3 blocks under the dual cache (Fast-dLLM decodes
whole blocks: other lengths are refused with exit 4, tests/engines/test_dual_cache.py) and 1 to
40 tokens for SDAR (below the block, a multiple of it and not). ``steps`` is one per position
(``denoising_steps=B``; Fast-dLLM: ``steps=gen_length``), as the engines decode.

- Fast-dLLM LLaDA: ``schedule: fast_dllm`` against ``generate_with_dual_cache(threshold)``, as published;
- Fast-dLLM Dream: ``schedule: fast_dllm`` against its Dream block generation with ``dual_cache``;
- SDAR: ``buffer_size: 1`` against ``block_diffusion_generate(low_confidence_dynamic,
  confidence_threshold)`` with its sampler greedy (tests/support/peers.greedy_sampler).

Answers are compared up to the first EOS within ``gen_length``; MASK and the embedding's padding
ids are never predicted by either (tests/support/peers.Banned). The adaptations of the peers are
those of tests/engines/test_checkpoints_parity.py (tests/support/peers.py).
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import peers  # noqa: E402  (tests/support/peers.py)
from peers import one_thread  # noqa: E402,F401  (an autouse fixture)
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine  # noqa: E402
from pytest_redline.engines.common import encode  # noqa: E402
from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402
from tests.engines.test_checkpoints_parity import _answer  # noqa: E402

pytestmark = pytest.mark.slow  # tiny LLaDA, Dream and SDAR folders and their official decoders, 3 x 16 examples: 19 s of CPU

PEAKS = {0: 3.0, 1: 1.0}  # seed -> head scale (3: steps commit several tokens; 1: mostly one)
PROMPTS = ArithmeticSuite(n=24, seed=0).prompts()
# per property (REDLINE_PARITY_EXAMPLES runs more); every counterexample ever found is pinned with @example
EXAMPLES = int(os.environ.get("REDLINE_PARITY_EXAMPLES", "16"))

blocks = st.sampled_from([2, 4, 8, 16])
thresholds = st.floats(0.5, 0.99)
prompt_sets = st.lists(st.integers(0, len(PROMPTS) - 1), min_size=1, max_size=2, unique=True)
seeds = st.sampled_from(sorted(PEAKS))
bounded = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def patch():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def models(tmp_path_factory, patch):
    """``models(family, seed)``: (engine, peer), built once per folder."""
    peers.need_peers("Fast-dLLM's LLaDA and Dream decoders and SDAR's generate.py")
    built = {}
    build = peers.builder()

    def get(family: str, seed: int):
        if (family, seed) not in built:
            folder = tmp_path_factory.mktemp(f"{family}-{seed}")
            if family == "sdar":
                folder = build.sdar(folder, seed=seed, peak=20.0 / (1 + seed))
            else:
                folder = getattr(build, family)(folder, seed=seed, peak=PEAKS[seed])
            engine = BlockDiffusionEngine(model=folder, device="cpu", dtype="float64")
            banned = peers.banned_ids(engine)
            if family == "llada":
                peer = peers.Banned(peers.llada_peer(folder, torch.float64), banned)
            elif family == "dream":
                peer = peers.dream_peer(folder, torch.float64)
                peers.ban_logits(patch, peer, banned)
            else:
                peer = peers.StoreKV(engine.model, banned)
            built[family, seed] = engine, peer
        return built[family, seed]

    return get


def _ours(engine, prompts, config) -> list[str]:
    return [g.text for g in engine.generate(prompts, config)]


def _dual(block: int, gen: int, threshold: float) -> dict:
    return {"schedule": "fast_dllm", "block_size": block, "accept_threshold": threshold, "max_new_tokens": gen}


@settings(bounded)
@given(block=blocks, n_blocks=st.integers(1, 3), threshold=thresholds, chosen=prompt_sets, seed=seeds)
def test_equivalent_llada_dual_cache_property(models, block, n_blocks, threshold, chosen, seed):
    engine, peer = models("llada", seed)
    generate = peers.peer_module("llada")
    prompts, gen = [PROMPTS[i] for i in chosen], block * n_blocks
    theirs = []
    for prompt in prompts:
        ids = torch.tensor([encode(engine.tokenizer, prompt, "test")])
        x, _ = generate.generate_with_dual_cache(peer, ids, steps=gen, gen_length=gen, block_length=block, temperature=0.0,
                                                 remasking="low_confidence", mask_id=engine.mask_id, threshold=threshold)
        theirs.append(_answer(engine, x[0, ids.shape[1] :].tolist()))
    assert _ours(engine, prompts, _dual(block, gen, threshold)) == theirs


@settings(bounded)
@given(block=blocks, n_blocks=st.integers(1, 3), threshold=thresholds, chosen=prompt_sets, seed=seeds)
def test_equivalent_dream_dual_cache_property(models, patch, block, n_blocks, threshold, chosen, seed):
    engine, peer = models("dream", seed)
    prompts, gen = [PROMPTS[i] for i in chosen], block * n_blocks
    theirs = [
        _answer(engine, peers.dream_block_generate(peer, patch, encode(engine.tokenizer, prompt, "test"), engine.mask_id,
                                                   min(engine.eos_ids), engine.pad_id, gen, block, threshold, dual_cache=True))
        for prompt in prompts
    ]
    assert _ours(engine, prompts, _dual(block, gen, threshold)) == theirs


@settings(bounded)
@given(block=blocks, gen=st.integers(1, 40), threshold=thresholds, chosen=prompt_sets, seed=seeds)
def test_equivalent_sdar_generate_property(models, patch, block, gen, threshold, chosen, seed):
    engine, model = models("sdar", seed)
    generate = peers.peer_module("sdar")
    patch.setattr(generate, "sample_with_temperature_topk_topp", peers.greedy_sampler)
    prompts = [PROMPTS[i] for i in chosen]
    theirs = []
    for prompt in prompts:
        ids = encode(engine.tokenizer, prompt, "test")
        x = generate.block_diffusion_generate(
            model, {"input_ids": torch.tensor([ids])}, engine.mask_id, gen_length=gen, block_length=block,
            denoising_steps=block, remasking_strategy="low_confidence_dynamic", confidence_threshold=threshold,
        )
        theirs.append(_answer(engine, x[0, len(ids) : len(ids) + gen].tolist()))
    config = {"block_size": block, "buffer_size": 1, "accept_threshold": threshold, "max_new_tokens": gen}
    assert _ours(engine, prompts, config) == theirs
