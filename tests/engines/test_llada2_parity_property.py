"""LLaDA2.0 and LLaDA2.1: our engines decode the tokens of the official ``generate`` at every
setting, as a property (hypothesis), in float64.

Drawn per example: the block length B (2, 4, 8, 16), ``gen_length`` (1 to 40: below the block,
a multiple of it and not), the threshold (0.5 to 0.99), for 2.1 the ``editing_threshold`` (0.5 to
0.99) and ``max_post_steps`` (0 to 6), ``eos_early_stop`` both ways, one or two of the first 24
arithmetic calibration prompts (their lengths vary: the prompt's last block is full or partial),
and the tiny model's seed (each seed with its own head scale, so that steps commit several
tokens, or mostly one through the fallback; seed 3's EOS row is scaled x3 so that answers end at
an EOS often, elsewhere rarely). ``steps`` is the block length, as the engines decode.

- LLaDA2.0: ``block_diffusion`` (``buffer_size: 1``, both schedules) against ``generate(threshold,
  block_length=B, steps=B, gen_length, eos_early_stop)``;
- LLaDA2.1: FlowBlock (``window: 1``) against ``generate(threshold, editing_threshold,
  max_post_steps, ...)``.

The answers compared are the official output cut at ``gen_length``: with ``eos_early_stop`` the
official LLaDA2.0 returns up to the first EOS even when it lies in the last block's positions past
``gen_length`` (at most B - 1 more tokens), which ``max_new_tokens`` never lets an engine return;
up to ``gen_length`` the tokens are the same. MASK and the embedding's padding ids are never
predicted by either (tests/support/peers_llada2.peer_forward_shim bans them in the peer).
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, event, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import peers  # noqa: E402  (tests/support/peers.py)
import peers_llada2  # noqa: E402
from peers import one_thread  # noqa: E402,F401  (an autouse fixture)
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine  # noqa: E402
from pytest_redline.engines.common import encode  # noqa: E402
from pytest_redline.engines.flowblock import FlowBlockEngine  # noqa: E402
from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402

pytestmark = pytest.mark.slow  # tiny MoE folders, the published model and its generate, 2 x 16 examples and the EOS pin: 18 s of CPU

PEAKS = {0: 10.0, 1: 3.0, 2: 1.0, 3: 3.0}  # seed -> head scale (10: confident steps commit several; 1: the fallback decides)
EOS_PRONE = {3: 3.0}  # seed -> scale of the head's EOS row
SMALL = {"base": 100, "vocab_size": 128}  # specials at 100..103: EOS 100, <|mask|> 103
PROMPTS = ArithmeticSuite(n=24, seed=0).prompts()
# per property (REDLINE_PARITY_EXAMPLES runs more); every counterexample ever found is pinned with @example
EXAMPLES = int(os.environ.get("REDLINE_PARITY_EXAMPLES", "16"))

blocks = st.sampled_from([2, 4, 8, 16])
thresholds = st.floats(0.5, 0.99)
gen_lengths = st.integers(1, 40)
prompt_sets = st.lists(st.integers(0, len(PROMPTS) - 1), min_size=1, max_size=2, unique=True)
seeds = st.sampled_from(sorted(PEAKS))
bounded = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``models(version, seed)``: (engine, shimmed peer), built once per folder."""
    peers.need_peers("the published LLaDA2.0 / LLaDA2.1 modeling code and official generate")
    built, patch = {}, pytest.MonkeyPatch()
    build = peers.builder()

    def get(version: str, seed: int):
        if (version, seed) not in built:
            maker = build.llada2 if version == "2.0" else build.llada21
            folder = maker(tmp_path_factory.mktemp(f"llada{version}-{seed}"), seed=seed, peak=PEAKS[seed], **SMALL)
            if seed in EOS_PRONE:
                _scale_head_row(folder, SMALL["base"], EOS_PRONE[seed])
            engine_class = BlockDiffusionEngine if version == "2.0" else FlowBlockEngine
            engine = engine_class(model=folder, device="cpu", dtype="float64")
            peer = peers_llada2.peer_model(folder, version, torch.float64)
            peers_llada2.peer_forward_shim(patch, peer, peers.banned_ids(engine))
            built[version, seed] = engine, peer
        return built[version, seed]

    yield get
    patch.undo()


def _scale_head_row(folder, row: int, factor: float) -> None:
    """Scale one row of the folder's output head, in its shard (the published layout kept)."""
    import json

    from safetensors.torch import load_file, save_file

    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    state = load_file(shard)
    state["lm_head.weight"] = state["lm_head.weight"].clone()
    state["lm_head.weight"][row] *= factor
    save_file(state, str(shard), metadata={"format": "pt"})


def _generate(engine, peer, prompt, gen: int, block: int, **kwargs) -> list[int]:
    """The official answer's token ids, whole."""
    ids = encode(engine.tokenizer, prompt, "test")
    with torch.no_grad():
        out = peer.generate(torch.tensor([ids]), temperature=0.0, block_length=block, steps=block, gen_length=gen,
                            eos_id=min(engine.eos_ids), mask_id=engine.mask_id, **kwargs)
    return out[0].tolist()


def _seen(engine, answer: list[int]) -> tuple[str, int]:
    """An answer as our Generation reports it: its text (EOS dropped) and its token count."""
    return engine.tokenizer.decode([t for t in answer if t not in engine.eos_ids], skip_special_tokens=False), len(answer)


def _official(engine, peer, prompts, gen: int, block: int, **kwargs) -> list[tuple[str, int]]:
    """The official answers, cut at ``gen`` tokens, as our Generation reports them (text, tokens)."""
    return [_seen(engine, _generate(engine, peer, prompt, gen, block, **kwargs)[:gen]) for prompt in prompts]


def _ours(engine, prompts, config) -> list[tuple[str, int]]:
    """Our answers (text, tokens); the statistics (--hypothesis-show-statistics) count what they met."""
    generations = engine.generate(prompts, config)
    event("an answer ends at an EOS" if any(g.finish_reason == "eos" for g in generations) else "no EOS")
    if "edits" in generations[0].extra:
        event("edits" if any(g.extra["edits"] for g in generations) else "no edit")
    return [(g.text, g.tokens) for g in generations]


@settings(bounded)
@given(block=blocks, gen=gen_lengths, threshold=thresholds, eos_early_stop=st.booleans(), chosen=prompt_sets, seed=seeds)
# found on the engine before the LLaDA2.0 step cap (gen_length below the block: the official top-k fallback)
@example(block=16, gen=1, threshold=0.75, eos_early_stop=False, chosen=[9], seed=0)
def test_equivalent_llada20_official_generate_property(models, block, gen, threshold, eos_early_stop, chosen, seed):
    engine, peer = models("2.0", seed)
    event("gen_length below the block" if gen < block else "gen_length whole blocks" if gen % block == 0 else "gen_length part blocks")
    prompts = [PROMPTS[i] for i in chosen]
    theirs = _official(engine, peer, prompts, gen, block, threshold=threshold, eos_early_stop=eos_early_stop)
    for schedule in ("diffulex", "eager"):
        config = {"block_size": block, "buffer_size": 1, "accept_threshold": threshold, "max_new_tokens": gen, "schedule": schedule}
        assert _ours(engine, prompts, config) == theirs, schedule


@settings(bounded)
@given(block=blocks, gen=gen_lengths, threshold=thresholds, edit=thresholds, post=st.integers(0, 6),
       eos_early_stop=st.booleans(), chosen=prompt_sets, seed=seeds)
def test_equivalent_llada21_official_generate_property(models, block, gen, threshold, edit, post, eos_early_stop, chosen, seed):
    engine, peer = models("2.1", seed)
    prompts = [PROMPTS[i] for i in chosen]
    theirs = _official(engine, peer, prompts, gen, block, threshold=threshold, editing_threshold=edit,
                       max_post_steps=post, eos_early_stop=eos_early_stop)
    config = {"block_size": block, "window": 1, "accept_threshold": threshold, "edit_threshold": edit,
              "max_post_steps": post, "max_new_tokens": gen}
    assert _ours(engine, prompts, config) == theirs


def test_llada20_eos_early_stop_past_gen_length(models):
    """The official behaviour no engine reproduces: with ``eos_early_stop`` LLaDA2.0's ``generate``
    returns up to an EOS in the last block's positions past ``gen_length``; ours returns the first
    ``max_new_tokens`` tokens, which are the official answer's."""
    engine, peer = models("2.0", 3)
    past = 0
    for block, gen in ((16, 9), (8, 16)):
        config = {"block_size": block, "buffer_size": 1, "accept_threshold": 0.9, "max_new_tokens": gen}
        ours = engine.generate(PROMPTS, config)
        for prompt, generation in zip(PROMPTS, ours):
            theirs = _generate(engine, peer, prompt, gen, block, threshold=0.9, eos_early_stop=True)
            past += len(theirs) > gen
            assert (generation.text, generation.tokens) == _seen(engine, theirs[:gen])
            assert theirs[:gen] == _generate(engine, peer, prompt, gen, block, threshold=0.9)[:gen]
    assert past > 0
