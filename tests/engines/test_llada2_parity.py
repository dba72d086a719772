"""LLaDA2.0 and LLaDA2.1: our native model and engines against the published code, in float64.

Tiny random folders in the published layout (benchmarks/make_tiny_checkpoints.py: sharded
safetensors under the published names, a tokenizer with ``<|mask|>``, a small vocabulary) are
loaded by our loader (engines/llada2_load.py, no remote code) and, strictly, by the published
``LLaDA2MoeModelLM`` (tests/support/peers_llada2.py shims the helpers transformers 5.x removed):

- the logits are equal, and so are the experts each token is routed to, layer by layer;
- LLaDA2.0: ``block_diffusion`` with ``buffer_size: 1`` gives the tokens of the official
  ``generate(temperature=0, block_length=B, steps=B, threshold=tau, eos_early_stop=False)`` up to
  the first EOS, on prompts whose length is a multiple of B and on prompts whose length is not;
- LLaDA2.1: FlowBlock with ``window: 1`` and editing gives the tokens of the official
  ``generate(threshold, editing_threshold, max_post_steps)``, with edits happening;
- both at the settings of an independent run (block 8, gen 16, threshold 0.9; 2.1 with edit
  threshold 0.8 and 4 post steps), on the first 24 arithmetic calibration prompts, with the
  official defaults (``eos_early_stop=False``) and with ``eos_early_stop=True``: 24/24;
- with ``gen_length`` below the block the official LLaDA2.0 caps its steps per block at
  ``gen_length``, so its fallback commits ``block / gen_length`` positions a step: so does ours
  on an LLaDA2.0 checkpoint (the same tokens at gen 4 and 8, block 8, on an unpeaked model).

Every other setting: tests/engines/test_llada2_parity_property.py (hypothesis). In both decoders MASK and the embedding's padding ids are never predicted (the peer's logits
there are -inf). The head is scaled (x10) so that the threshold matters: steps commit several tokens.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import peers  # noqa: E402  (tests/support/peers.py)
import peers_llada2  # noqa: E402
from peers import one_thread  # noqa: E402,F401  (an autouse fixture)
from pytest_redline.engines.common import encode  # noqa: E402
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine  # noqa: E402
from pytest_redline.engines.flowblock import FlowBlockEngine  # noqa: E402
from pytest_redline.suites.arithmetic import ArithmeticSuite  # noqa: E402

pytestmark = pytest.mark.slow  # two tiny MoE folders, the published model and its generate: 17 s of CPU in all

BLOCK, GEN, THRESHOLD = 4, 8, 0.9
SMALL = {"base": 100, "vocab_size": 128, "peak": 10.0}  # specials at 100..103: EOS 100, <|mask|> 103


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    peers.need_peers("the published LLaDA2.0 / LLaDA2.1 modeling code and official generate")
    out = tmp_path_factory.mktemp("llada2")
    build = peers.builder()
    return {"2.0": build.llada2(out / "llada2", **SMALL), "2.1": build.llada21(out / "llada21", seed=1, **SMALL)}


def _prompts(engine, n: int):
    """``n`` prompts whose length is a multiple of BLOCK and ``n`` whose length is not."""
    divisible, other = [], []
    for prompt in ArithmeticSuite(n=400, seed=3).prompts():
        (divisible if len(encode(engine.tokenizer, prompt, "test")) % BLOCK == 0 else other).append(prompt)
    assert len(divisible) >= n and len(other) >= n
    return divisible[:n] + other[:n]


def _answer(engine, ids) -> list[int]:
    """The tokens up to and including the first EOS."""
    out = []
    for token in ids:
        out.append(int(token))
        if token in engine.eos_ids:
            break
    return out


def _seen(engine, ids: list[int]) -> tuple[str, int]:
    """An answer as our Generation reports it: its text (EOS dropped) and its token count."""
    return engine.tokenizer.decode([t for t in ids if t not in engine.eos_ids], skip_special_tokens=False), len(ids)


@pytest.mark.parametrize("version", ["2.0", "2.1"])
def test_equivalent_logits_and_routing_published_model(folders, version):
    from pytest_redline.engines import checkpoints
    from pytest_redline.engines.modeling import block_causal_mask

    folder = folders[version]
    ours, _ = checkpoints.load(checkpoints.read_checkpoint(folder), "cpu", "float64")
    peer = peers_llada2.peer_model(folder, version, torch.float64)
    x = torch.randint(0, 100, (3, 13), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(13).expand(3, -1)
    mask = block_causal_mask(pos, pos, BLOCK, torch.float64)
    routes = []
    with torch.no_grad():
        logits = ours(x, attention_mask=mask, position_ids=pos, routes=routes).logits
        theirs = peer(x, attention_mask=mask, position_ids=pos, output_router_logits=True)
    torch.testing.assert_close(logits, theirs.logits, rtol=0, atol=1e-12)
    assert len(routes) == len(theirs.router_logits) == 1  # one MoE layer (first_k_dense_replace: 1)
    for (chosen, router), (their_router, their_chosen) in zip(routes, theirs.router_logits):
        assert torch.equal(chosen, their_chosen)  # the same experts, in the same order, for every token
        torch.testing.assert_close(router, their_router, rtol=0, atol=1e-12)
    assert len(chosen.unique()) > 8  # the tokens spread over the experts


@pytest.fixture(scope="module")
def llada20(folders):
    engine = BlockDiffusionEngine(model=folders["2.0"], device="cpu", dtype="float64")
    return engine, peers_llada2.peer_model(folders["2.0"], "2.0", torch.float64), _prompts(engine, 12)


def _official(engine, peer, prompts, monkeypatch, gen=GEN, block=BLOCK, **kwargs) -> list[tuple[str, int]]:
    peers_llada2.peer_forward_shim(monkeypatch, peer, peers.banned_ids(engine))
    answers = []
    for prompt in prompts:
        ids = encode(engine.tokenizer, prompt, "test")
        out = peer.generate(torch.tensor([ids]), temperature=0.0, block_length=block, steps=block, gen_length=gen,
                            eos_early_stop=False, eos_id=min(engine.eos_ids), mask_id=engine.mask_id, **kwargs)
        answers.append(_seen(engine, _answer(engine, out[0].tolist())))
    return answers


def test_equivalent_llada20_official_generate(llada20, monkeypatch):
    engine, peer, prompts = llada20
    config = {"block_size": BLOCK, "buffer_size": 1, "accept_threshold": THRESHOLD, "max_new_tokens": GEN}
    ours = engine.generate(prompts, config)
    theirs = _official(engine, peer, prompts, monkeypatch, threshold=THRESHOLD)
    assert [(g.text, g.tokens) for g in ours] == theirs
    assert len(prompts) == 24
    # the threshold mattered: the eager schedule (same tokens, no prefill or store forwards) commits
    # well above one token per forward
    eager = engine.generate(prompts, {**config, "schedule": "eager"})
    assert [(g.text, g.tokens) for g in eager] == theirs
    assert sum(g.tokens for g in eager) > 1.5 * sum(g.forwards for g in eager)
    assert any(g.finish_reason == "eos" for g in ours) and any(g.finish_reason == "length" for g in ours)


def test_equivalent_llada20_gen_length_below_block(tmp_path, monkeypatch):
    """With gen_length < block the official generate caps its steps per block at gen_length, so a
    step where fewer than block / gen_length positions pass the threshold commits that many (its
    top-k fallback): ours does the same on an LLaDA2.0 checkpoint. On an unpeaked model (the
    fallback decides most steps) the tokens agree at gen_length 4 and 8, block 8; with the
    single top-1 fallback of the other checkpoints they differ at 4."""
    folder = peers.builder().llada2(tmp_path / "flat", **{**SMALL, "peak": 1.0})
    engine = BlockDiffusionEngine(model=folder, device="cpu", dtype="float64")
    peer = peers_llada2.peer_model(folder, "2.0", torch.float64)
    prompts = ArithmeticSuite(n=8, seed=3).prompts()
    theirs = {gen: _official(engine, peer, prompts, monkeypatch, gen=gen, block=8, threshold=THRESHOLD) for gen in (4, 8)}
    for gen in (4, 8):
        config = {"block_size": 8, "buffer_size": 1, "accept_threshold": THRESHOLD, "max_new_tokens": gen}
        assert [(g.text, g.tokens) for g in engine.generate(prompts, config)] == theirs[gen]
    monkeypatch.setattr(engine, "transfer_count", lambda step, cfg: 1)
    config = {"block_size": 8, "buffer_size": 1, "accept_threshold": THRESHOLD, "max_new_tokens": 4}
    assert [(g.text, g.tokens) for g in engine.generate(prompts, config)] != theirs[4]


def _defaults(engine, peer, prompts, monkeypatch, gen, block, **kwargs) -> list[tuple[str, int]]:
    """The official generate with its own defaults but the settings given (``eos_early_stop``
    False unless given), its answer cut at ``gen`` tokens (with ``eos_early_stop`` it may run into
    the last block's positions past ``gen_length``)."""
    peers_llada2.peer_forward_shim(monkeypatch, peer, peers.banned_ids(engine))
    answers = []
    for prompt in prompts:
        ids = encode(engine.tokenizer, prompt, "test")
        out = peer.generate(torch.tensor([ids]), temperature=0.0, block_length=block, steps=block, gen_length=gen,
                            eos_id=min(engine.eos_ids), mask_id=engine.mask_id, **kwargs)
        answers.append(_seen(engine, out[0].tolist()[:gen]))
    return answers


@pytest.mark.parametrize("eos_early_stop", [None, True])
def test_equivalent_llada20_block8_gen16(llada20, monkeypatch, eos_early_stop):
    """block 8, gen 16, threshold 0.9, the first 24 calibration prompts: 24/24."""
    engine, peer, _ = llada20
    prompts = ArithmeticSuite(n=24, seed=0).prompts()
    stop = {} if eos_early_stop is None else {"eos_early_stop": eos_early_stop}
    theirs = _defaults(engine, peer, prompts, monkeypatch, 16, 8, threshold=0.9, **stop)
    ours = engine.generate(prompts, {"block_size": 8, "buffer_size": 1, "accept_threshold": 0.9, "max_new_tokens": 16})
    assert sum((g.text, g.tokens) == t for g, t in zip(ours, theirs)) == 24
    assert sum(g.tokens for g in ours) > sum(g.forwards for g in ours)  # the threshold mattered


@pytest.mark.parametrize("eos_early_stop", [None, True])
def test_equivalent_llada21_edit08_post4(folders, monkeypatch, eos_early_stop):
    """2.1 at block 8, gen 16, threshold 0.9, edit threshold 0.8, 4 post steps: 24/24, with edits."""
    engine = FlowBlockEngine(model=folders["2.1"], device="cpu", dtype="float64")
    peer = peers_llada2.peer_model(folders["2.1"], "2.1", torch.float64)
    prompts = ArithmeticSuite(n=24, seed=0).prompts()
    stop = {} if eos_early_stop is None else {"eos_early_stop": eos_early_stop}
    theirs = _defaults(engine, peer, prompts, monkeypatch, 16, 8, threshold=0.9, editing_threshold=0.8, max_post_steps=4, **stop)
    config = {"block_size": 8, "window": 1, "accept_threshold": 0.9, "edit_threshold": 0.8, "max_post_steps": 4, "max_new_tokens": 16}
    ours = engine.generate(prompts, config)
    assert sum((g.text, g.tokens) == t for g, t in zip(ours, theirs)) == 24
    assert sum(g.extra["edits"] for g in ours) > 0


def test_equivalent_llada21_official_generate_flowblock_editing(folders, monkeypatch):
    engine = FlowBlockEngine(model=folders["2.1"], device="cpu", dtype="float64")
    peer = peers_llada2.peer_model(folders["2.1"], "2.1", torch.float64)
    prompts = _prompts(engine, 12)
    edit, post = 0.5, 3
    config = {"block_size": BLOCK, "window": 1, "accept_threshold": THRESHOLD, "edit_threshold": edit,
              "max_post_steps": post, "max_new_tokens": GEN}
    ours = engine.generate(prompts, config)
    theirs = _official(engine, peer, prompts, monkeypatch, threshold=THRESHOLD, editing_threshold=edit, max_post_steps=post)
    assert [(g.text, g.tokens) for g in ours] == theirs
    assert sum(g.extra["edits"] for g in ours) > 0  # editing happened
