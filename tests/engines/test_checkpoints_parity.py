"""Parity, in float64, of our block-diffusion engine with the official decoders (../shared/reference/peers).

Tiny random checkpoints in each published layout (benchmarks/make_tiny_checkpoints.py) are decoded
by our engine, loaded through engines.checkpoints (stock classes, no remote code), and by the
peers' own decoders. Every adaptation of a peer lives in tests/support/peers.py, never in the project:

- SDAR: ``block_diffusion_generate`` (``low_confidence_dynamic``) with its sampler patched to greedy
  (the argmax token, with its probability from the unfiltered softmax: SDAR always samples with
  ``torch.multinomial``, and ``top_k=1`` would make every confidence 1.0, so the threshold would
  never be tested), on a wrapper that honours ``store_kv`` over the same stock Qwen3 weights,
  with a peaked output head so that the threshold matters.
- LLaDA: Fast-dLLM's ``generate_with_prefix_cache`` with a threshold, on Fast-dLLM's own
  ``LLaDAModelLM`` holding the tiny folder's weights. The one rule that differs is attention:
  Fast-dLLM attends fully (the cached prefix was computed with the masked canvas in view, and
  the block sees the masked suffix); our cache is block-causal. With the peer's attention made
  block-causal the tokens are equal; as published they differ (pinned below). Block alignment
  differs too (Fast-dLLM: from the prompt's end; ours: from position 0), so the prompts are
  those whose length is a multiple of the block.
- Dream: Dream's published model and our stock Qwen2 + shifted logits give the same logits.
  Against Fast-dLLM's Dream block generation (``confidence_threshold``), two rules differ: the
  attention (as for LLaDA) and Dream's first-position rule: each block's first forward commits
  the block's first position, whatever its confidence (``x[:, start] = x0[:, start]``), where
  ours commits every position above the threshold, else the most confident one. With the peer's
  attention block-causal and that one rule given to our engine (a subclass in this test, through
  the engine's ``commit`` hook), the tokens are equal; with our own rule they differ (pinned).

In both decoders MASK and the embedding's padding ids are never predicted (tests/peers.Banned):
our engines ban them, the peers would not. Engine-side stop strings are off (no Prompt.stop).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import peers  # noqa: E402  (tests/support/peers.py)
from peers import one_thread  # noqa: E402,F401  (an autouse fixture)
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine  # noqa: E402
from pytest_redline.engines.common import encode  # noqa: E402
from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402

pytestmark = pytest.mark.slow  # float64 decodes by ours and the peers: 12 s of CPU in all
BLOCK, GEN, THRESHOLD = 4, 8, 0.9


def _engine(folder):
    return BlockDiffusionEngine(model=folder, device="cpu", dtype="float64")


def _ours(engine, prompts):
    config = {"block_size": BLOCK, "buffer_size": 1, "accept_threshold": THRESHOLD, "max_new_tokens": GEN}
    return engine.generate(prompts, config)


def _answer(engine, ids: list[int]) -> str:
    """The peer's answer tokens up to (not including) the first EOS, as text."""
    for i, token in enumerate(ids):
        if token in engine.eos_ids:
            ids = ids[:i]
            break
    return engine.tokenizer.decode(ids)


@pytest.fixture(scope="module")
def sdar_engine(tmp_path_factory):
    peers.need_peers("SDAR's official decoder (generate.py) on a tiny folder built with SDAR-4B-Chat's published tokenizer files")
    folder = peers.builder().sdar(tmp_path_factory.mktemp("sdar"), peak=20.0)
    return _engine(folder)


def test_equivalent_sdar_block_diffusion_generate(sdar_engine, monkeypatch):
    generate = peers.peer_module("sdar")
    monkeypatch.setattr(generate, "sample_with_temperature_topk_topp", peers.greedy_sampler)
    model = peers.StoreKV(sdar_engine.model, peers.banned_ids(sdar_engine))
    prompts = ArithmeticSuite(n=32, seed=0).prompts()
    ours = _ours(sdar_engine, prompts)
    for prompt, generation in zip(prompts, ours):
        ids = encode(sdar_engine.tokenizer, prompt, "test")
        x = generate.block_diffusion_generate(
            model, {"input_ids": torch.tensor([ids])}, sdar_engine.mask_id, gen_length=GEN, block_length=BLOCK,
            denoising_steps=BLOCK, remasking_strategy="low_confidence_dynamic", confidence_threshold=THRESHOLD,
        )
        assert generation.text == _answer(sdar_engine, x[0, len(ids) : len(ids) + GEN].tolist()), prompt.id
    tokens, forwards = sum(g.tokens for g in ours), sum(g.forwards for g in ours)
    # the threshold mattered: some steps committed several tokens, others one
    assert forwards < tokens < 3 * forwards


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    folder = peers.builder().llada(tmp_path_factory.mktemp("llada"), peak=3.0)
    engine = _engine(folder)
    peer = peers.llada_peer(folder, torch.float64)
    aligned = [p for p in ArithmeticSuite(n=200, seed=0).prompts() if len(encode(engine.tokenizer, p, "test")) % BLOCK == 0]
    return engine, peers.Banned(peer, peers.banned_ids(engine)), aligned[:32]


def _fast_dllm(engine, peer, prompts):
    generate = peers.peer_module("llada")
    answers = []
    for prompt in prompts:
        ids = encode(engine.tokenizer, prompt, "test")
        x, _ = generate.generate_with_prefix_cache(
            peer, torch.tensor([ids]), steps=GEN, gen_length=GEN, block_length=BLOCK, temperature=0.0,
            remasking="low_confidence", mask_id=engine.mask_id, threshold=THRESHOLD,
        )
        answers.append(_answer(engine, x[0, len(ids) :].tolist()))
    return answers


def test_equivalent_llada_prefix_cache_with_block_causal_attention(llada, monkeypatch):
    engine, peer, prompts = llada
    assert len(prompts) == 32
    peers.block_causal_llada(monkeypatch, BLOCK)
    assert [g.text for g in _ours(engine, prompts)] == _fast_dllm(engine, peer, prompts)


def test_differs_llada_prefix_cache_full_attention(llada):
    """The documented difference: Fast-dLLM's prefix cache as published attends fully."""
    engine, peer, prompts = llada
    ours = [g.text for g in _ours(engine, prompts[:8])]
    assert ours != _fast_dllm(engine, peer, prompts[:8])


def test_equivalent_dream_logits_stock_qwen2(tmp_path):
    from pytest_redline.engines import checkpoints

    folder = peers.builder().dream(tmp_path / "dream")
    peer = peers.dream_peer(folder, torch.float64)
    ours, _ = checkpoints.load(checkpoints.read_checkpoint(folder), "cpu", "float64")
    x = torch.randint(5, 80, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = peer(x).logits
        theirs = torch.cat([theirs[:, :1], theirs[:, :-1]], dim=1)  # Dream's own shift (generation_utils)
        torch.testing.assert_close(ours(x).logits, theirs, rtol=0, atol=1e-12)


class DreamFirstPosition(BlockDiffusionEngine):
    """Our engine with Dream's rule for a block's first forward: commit its first position only."""

    def commit(self, req, reads, cfg):
        if req.active:
            block = req.active[0]
            span = range(block * cfg.block_size, (block + 1) * cfg.block_size)
            if reads.get(block) and all(req.tokens[p] == self.mask_id for p in span):
                position, _, token = min(reads[block])
                req.tokens[position] = token
                return [(position, token)]
        return super().commit(req, reads, cfg)


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    folder = peers.builder().dream(tmp_path_factory.mktemp("dream"), peak=3.0)
    engine = DreamFirstPosition(model=folder, device="cpu", dtype="float64")
    aligned = [p for p in ArithmeticSuite(n=200, seed=0).prompts() if len(encode(engine.tokenizer, p, "test")) % BLOCK == 0]
    return engine, peers.dream_peer(folder, torch.float64), aligned[:32], _engine(folder)


def _dream_block(engine, peer, prompts, monkeypatch, threshold):
    peers.ban_logits(monkeypatch, peer, peers.banned_ids(engine))
    return [
        _answer(engine, peers.dream_block_generate(
            peer, monkeypatch, encode(engine.tokenizer, prompt, "test"), engine.mask_id, min(engine.eos_ids), engine.pad_id,
            GEN, BLOCK, threshold,
        ))
        for prompt in prompts
    ]


@pytest.mark.parametrize("threshold", [0.9, 0.5])
def test_equivalent_dream_block_generation_first_position_rule(dream, monkeypatch, threshold):
    engine, peer, prompts, plain = dream
    assert len(prompts) == 32
    config = {"block_size": BLOCK, "buffer_size": 1, "accept_threshold": threshold, "max_new_tokens": GEN}
    ours = [g.text for g in engine.generate(prompts, config)]
    with monkeypatch.context() as patch:
        peers.block_causal_sdpa(patch, BLOCK)
        theirs = _dream_block(engine, peer, prompts, patch, threshold)
    assert ours == theirs
    # with our own commit rule: the documented difference
    assert [g.text for g in plain.generate(prompts, config)] != ours


# ---------------------------------------------------------------------------------------------
# schedule fast_dllm: Fast-dLLM's dual cache, as LLaDA's and Dream's users serve them

DUAL = {"schedule": "fast_dllm", "block_size": BLOCK, "accept_threshold": THRESHOLD, "max_new_tokens": GEN}


def _batches_of_8(engine, prompts, config):
    """Our generations in batches of 8 (the grids' batch size), each batch of mixed prompt
    lengths, so that its rows are left-padded."""
    out = []
    for i in range(0, len(prompts), 8):
        batch = prompts[i : i + 8]
        assert len({len(encode(engine.tokenizer, p, "test")) for p in batch}) > 1
        out += engine.generate(batch, config)
    return out


def _forwards_match(generation, nfe: int) -> bool:
    """Fast-dLLM decodes the whole length; we stop once the answer is resolved up to an EOS."""
    return generation.forwards == nfe if generation.finish_reason == "length" else generation.forwards <= nfe


@pytest.fixture(scope="module")
def llada_all(llada):
    """The LLaDA engine and peer, with 32 prompts of every length (blocks count from the prompt's end)."""
    engine, peer, _ = llada
    return engine, peer, ArithmeticSuite(n=32, seed=0).prompts()


def test_equivalent_llada_dual_cache_batched(llada_all):
    """``schedule: fast_dllm`` = Fast-dLLM's ``generate_with_dual_cache`` with a threshold, as
    published (full attention, no shim but the banned ids): the same tokens on 32 prompts of
    mixed lengths, ours in left-padded batches of 8, Fast-dLLM's one at a time; the same forwards
    (Fast-dLLM's nfe) up to our EOS stop. A full recompute (Fast-dLLM's uncached ``generate``)
    differs on some of them: the equality holds the cache's stale suffix, not just the attention."""
    engine, peer, prompts = llada_all
    generate = peers.peer_module("llada")
    ours = _batches_of_8(engine, prompts, DUAL)
    kwargs = dict(steps=GEN, gen_length=GEN, block_length=BLOCK, temperature=0.0, remasking="low_confidence",
                  mask_id=engine.mask_id, threshold=THRESHOLD)
    recomputed = 0
    for i, (prompt, generation) in enumerate(zip(prompts, ours)):
        ids = torch.tensor([encode(engine.tokenizer, prompt, "test")])
        x, nfe = generate.generate_with_dual_cache(peer, ids, **kwargs)
        assert generation.text == _answer(engine, x[0, ids.shape[1] :].tolist()), prompt.id
        assert _forwards_match(generation, nfe), (prompt.id, generation.forwards, nfe)
        if i < 8:
            full, _ = generate.generate(peer, ids, **kwargs)
            recomputed += generation.text != _answer(engine, full[0, ids.shape[1] :].tolist())
    assert recomputed > 0
    assert {g.finish_reason for g in ours} == {"eos", "length"}
    tokens, forwards = sum(g.tokens for g in ours), sum(g.forwards for g in ours)
    assert forwards < tokens < 3 * forwards  # the threshold mattered: several commits per forward, and single ones


def test_differs_llada_dual_cache_block_causal(llada_all):
    """The block-causal mode stays, and is another decoder: it differs from the dual cache."""
    engine, _, prompts = llada_all
    config = {"block_size": BLOCK, "buffer_size": 1, "accept_threshold": THRESHOLD, "max_new_tokens": GEN}
    assert [g.text for g in engine.generate(prompts[:8], config)] != [g.text for g in engine.generate(prompts[:8], DUAL)]


def _dream_dual(engine, peer, prompts, monkeypatch, threshold):
    """Fast-dLLM's Dream block generation with ``dual_cache``: answers and model calls per prompt."""
    calls = []
    peers.ban_logits(monkeypatch, peer, peers.banned_ids(engine))
    forward = peer.forward

    def counted(*args, **kwargs):
        calls[-1] += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(peer, "forward", counted)
    answers = []
    for prompt in prompts:
        calls.append(0)
        ids = encode(engine.tokenizer, prompt, "test")
        answers.append(_answer(engine, peers.dream_block_generate(
            peer, monkeypatch, ids, engine.mask_id, min(engine.eos_ids), engine.pad_id, GEN, BLOCK, threshold, dual_cache=True,
        )))
    return answers, calls


@pytest.mark.parametrize("threshold", [0.9, 0.5])
def test_equivalent_dream_dual_cache_batched(dream, monkeypatch, threshold):
    """``schedule: fast_dllm`` on Dream = Fast-dLLM's Dream block generation with ``dual_cache``,
    as published: shifted logits, and each block's refresh commits the block's first position
    whatever its confidence. The same tokens on 32 prompts of mixed lengths (ours in left-padded
    batches of 8), the same model calls up to our EOS stop."""
    _, peer, _, plain = dream
    prompts = ArithmeticSuite(n=32, seed=0).prompts()
    ours = _batches_of_8(plain, prompts, {**DUAL, "accept_threshold": threshold})
    answers, calls = _dream_dual(plain, peer, prompts, monkeypatch, threshold)
    assert [g.text for g in ours] == answers
    assert all(_forwards_match(g, n) for g, n in zip(ours, calls)), [(g.forwards, n) for g, n in zip(ours, calls)]


def test_differs_dream_dual_cache_without_first_position_rule(dream, monkeypatch):
    """The pinned rule difference: with LLaDA's refresh rule (the threshold rule) instead of
    Dream's first-position rule, our tokens differ from Fast-dLLM's Dream block generation."""
    from pytest_redline.engines import dual_cache

    _, peer, _, plain = dream
    prompts = ArithmeticSuite(n=32, seed=0).prompts()[:8]
    answers, _ = _dream_dual(plain, peer, prompts, monkeypatch, THRESHOLD)
    monkeypatch.setattr(dual_cache, "FIRST_POSITION", frozenset())
    assert [g.text for g in plain.generate(prompts, DUAL)] != answers
