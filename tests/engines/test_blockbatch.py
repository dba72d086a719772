"""Invariants of the BlockBatch engine.

Everything runs in float64 on the tiny random model (``tiny_folder`` in conftest.py), whose
confident, input-dependent predictions make branches disagree, merge and sync. Nothing here
depends on the embedded model's accuracy.
"""
import json
from pathlib import Path

import pytest
import torch

from pytest_redline.contracts import Engine
from pytest_redline.engines.blockbatch import BlockBatchEngine, Branch, BranchedRequest
from pytest_redline.engines.diffusion_spec import BatchConfig, DecodeConfig
from pytest_redline.engines import runtime
from pytest_redline.engines.modeling import block_mask
from pytest_redline import registry
from pytest_redline.grid import load_grid
from pytest_redline.suites.arithmetic import ArithmeticSuite

import reference_decoders

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # engine decodes with models: out of the inner loop (pytest -m 'not slow'), which must stay under 60 s

PROMPTS = ArithmeticSuite(n=6, seed=11).prompts()
SHORT = {"max_new_tokens": 20}
BRANCHY = {"block_sizes": [4, 8, 16], "accept_threshold": 0.7, "merge_threshold": 0.3, "sync_lag": 3, **SHORT}
GRID = Path(__file__).resolve().parents[2] / "grids" / "blockbatch.yaml"


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    threads = torch.get_num_threads()
    yield BlockBatchEngine(model=tiny_folder, device="cpu", dtype="float64", threads=1)
    torch.set_num_threads(threads)  # threads are process-wide: leave them as found


def _key(gens):
    return [(g.text, g.tokens, g.forwards, dict(g.extra)) for g in gens]


@pytest.mark.parametrize(
    "accept, block_size, inert",
    [(0.6, 8, {}), (0.9, 4, {"merge_threshold": 0.0, "sync_lag": 0}), (0.0, 16, {})],
)
def test_equivalent_one_branch_single_block(tiny, accept, block_size, inert):
    """One branch (no merge or sync partner, no refresh) is single-block threshold decoding with
    top-1 fallback that ends after the block holding the EOS, against an uncached float64 decoder
    written from engines.md (tests/support/reference_decoders.py): text, tokens, forwards."""
    one = tiny.generate(PROMPTS, {"block_sizes": [block_size], "accept_threshold": accept, **inert, **SHORT})
    for prompt, gen in zip(PROMPTS, one):
        ids = tiny.tokenizer(prompt.text).input_ids
        out, forwards = reference_decoders.single_block(tiny, ids, block_size, accept, SHORT["max_new_tokens"])
        assert (gen.text, gen.tokens, gen.forwards) == (tiny.tokenizer.decode([t for t in out if t not in tiny.eos_ids]), len(out), forwards)
    assert all(g.extra["row_forwards"] == g.forwards and g.extra["merges"] == g.extra["syncs"] == 0 for g in one)


def test_exact_cache_refresh_from_scratch(tiny, monkeypatch):
    """The cache is exact (syncs and merges included): a refresh that recomputes every branch's
    prefix from scratch commits exactly what it commits from the cached rows."""
    config = {**BRANCHY, "refresh_interval": 3}
    scratch = tiny.generate(PROMPTS, config)
    monkeypatch.setattr(tiny, "refresh_from_scratch", False)
    cached = tiny.generate(PROMPTS, config)
    assert sum(g.extra["merges"] for g in scratch) > 0 and sum(g.extra["syncs"] for g in scratch) > 0
    assert all(g.extra["refreshes"] > 0 for g in scratch)
    keys = ("merges", "syncs", "refreshes", "row_forwards")
    assert [(g.text, g.tokens, g.forwards, [g.extra[k] for k in keys]) for g in scratch] == [
        (g.text, g.tokens, g.forwards, [g.extra[k] for k in keys]) for g in cached
    ]


def test_equivalent_batched_and_alone(tiny):
    batched = tiny.generate(PROMPTS, {**BRANCHY, "refresh_interval": 5})
    alone = [tiny.generate([p], {**BRANCHY, "refresh_interval": 5})[0] for p in PROMPTS]
    assert _key(batched) == _key(alone)


def _recomputed(engine, tokens, blocks, position, token):
    """The probability of ``token`` at ``position`` from a cache-free forward over ``[0, end)``."""
    n = len(tokens)
    pos = torch.arange(n)[None]
    ids = torch.tensor(blocks)[None]
    mask = block_mask(ids, ids, engine.model.dtype)
    logits = engine.model(input_ids=torch.tensor([tokens]), attention_mask=mask, position_ids=pos).logits[0, position].float()
    logits[engine.mask_id] = float("-inf")
    logits[len(engine.tokenizer) :] = float("-inf")
    return float(logits.softmax(-1)[token])


def test_merges_fill_masks_the_destination_accepts(tiny, monkeypatch):
    """Every merge fills a masked position of the destination's current block with a token that a
    compatible branch strictly behind it proposed there (probability above the proposal cut in
    its own forward), and the destination's own probability of it, recomputed without any cache
    from its inputs at that step's forward, exceeds merge_threshold."""
    inputs, checked = {}, []
    forward, merge = tiny._forward_rows, tiny._merge

    def spy_forward(branches, steps, rows):
        for br in branches:
            inputs[id(br)] = (br.tokens[: br.end], br.blocks[: br.end])
        return forward(branches, steps, rows)

    def spy_merge(req, probs, index, first_row, cfg):
        before = [(list(br.tokens), br.start, br.end, tiny._decoded(br), dict(br.proposals)) for br in req.branches]
        merged = merge(req, probs, index, first_row, cfg)
        for d, p, t, prob in merged:
            tokens, start, end, decoded, _ = before[d]
            assert tokens[p] == tiny.mask_id and start <= p < end
            behind = [b for b, other in enumerate(before) if other[3] < decoded]
            assert any(t in before[b][4].get(p, ()) for b in behind)
            assert prob > cfg.merge_threshold
            assert _recomputed(tiny, *inputs[id(req.branches[d])], p, t) == pytest.approx(prob, abs=1e-6)
            checked.append(prob)
        return merged

    monkeypatch.setattr(tiny, "_forward_rows", spy_forward)
    monkeypatch.setattr(tiny, "_merge", spy_merge)
    tiny.generate(PROMPTS, BRANCHY)
    assert checked


def _branch(tokens, start, end, proposals=None, size=4):
    br = Branch(size, list(tokens), [p // size * size for p in range(len(tokens))], start, end, 0, 2, len(tokens))
    br.proposals = proposals or {}
    return br


@pytest.mark.parametrize("gate, expected", [(0.5, [(0, 3, 6, 0.95)]), (0.95, [])])
def test_merge_rule_proposals_from_behind_destination_gate(tiny, gate, expected):
    """The rule on hand-made branches (M = MASK, prompt = the first two positions, current blocks
    [2, 6)): the destination takes, among the proposals of the compatible branches strictly behind
    it, the token it rates highest, only strictly above the gate. A branch level with it, one
    ahead of it and one that clashes with it offer nothing."""
    M = tiny.mask_id
    dst = _branch([9, 9, 5, M, M, 3], 2, 6)  # 2 decoded answer positions
    behind = _branch([9, 9, M, M, M, M], 2, 6, {3: [6, 7], 4: [8]})  # 0 decoded, compatible
    level = _branch([9, 9, 5, M, M, 3], 2, 6, {3: [4]})  # 2 decoded: not behind
    clash = _branch([9, 9, 6, M, M, M], 2, 6, {3: [4]})  # behind, but holds 6 where dst holds 5
    ahead = _branch([9, 9, 5, 7, 8, 4], 2, 6, {})  # 4 decoded: ahead, and complete
    req = BranchedRequest(prompt=PROMPTS[0], branches=[dst, behind, level, clash, ahead])
    cfg = BatchConfig.from_params({"merge_threshold": gate})
    probs = torch.zeros(2, tiny.model.config.vocab_size, dtype=torch.float64)
    probs[0, 7], probs[0, 6], probs[0, 4] = 0.9, 0.95, 0.99  # dst's own probabilities at 3
    probs[1, 8] = 0.4  # at 4: below every gate
    merged = tiny._merge(req, probs, {(0, 3): 0, (0, 4): 1}, 0, cfg)
    assert merged == expected  # behind offers 6 and 7 at 3; dst rates 6 highest; 4 (0.99) is never offered
    assert dst.tokens == [9, 9, 5, expected[0][2] if expected else M, M, 3]
    assert behind.tokens == [9, 9, M, M, M, M]


def test_sync_follower_state_equals_leader(tiny, monkeypatch):
    """After a sync, the follower's tokens, block ids, block bounds, cached length and cache row
    (K/V, positions, validity) equal the leader's."""
    sync, pairs = tiny._sync, []

    def spy_sync(req, first_row, rows, cfg):
        synced = sync(req, first_row, rows, cfg)
        for f, lead in synced:
            a, b = req.branches[f], req.branches[lead]
            assert (a.tokens, a.blocks, a.start, a.end, a.cached) == (b.tokens, b.blocks, b.start, b.end, b.cached)
            rf, rl = first_row + f, first_row + lead
            assert torch.equal(rows.pos[rf], rows.pos[rl]) and torch.equal(rows.valid[rf], rows.valid[rl])
            assert all(torch.equal(layer.keys[rf], layer.keys[rl]) for layer in rows.cache.layers)
            assert all(torch.equal(layer.values[rf], layer.values[rl]) for layer in rows.cache.layers)
            pairs.append((f, lead))
        return synced

    monkeypatch.setattr(tiny, "_sync", spy_sync)
    tiny.generate(PROMPTS, BRANCHY)
    assert pairs


def test_winner_best_eos_probability_blocks_on_own_grid(tiny, monkeypatch):
    """The run ends when a branch's fully decoded block holds an EOS (or it reached the limit):
    among the branches ending with an EOS, the one that gave its EOS the highest probability wins;
    every block a branch opens ends on its own grid (after a sync too)."""
    admit, end, checked = tiny.admit, tiny._end, []

    def spy_admit(br, cfg):
        opened = admit(br, cfg)
        assert not opened or br.end % br.size == 0
        return opened

    def spy_end(req, cfg):
        end(req, cfg)
        ended = [br for br in req.branches if br.result is not None]
        if req.winner is not None:
            eos = [br for br in ended if br.finish_reason == "eos"]
            if eos:
                assert req.winner.eos_prob == max(br.eos_prob for br in eos) and 0 < req.winner.eos_prob <= 1
                assert tiny.mask_id not in req.winner.tokens[req.winner.prompt_len : req.winner.start]
            checked.append(len(ended))

    monkeypatch.setattr(tiny, "admit", spy_admit)
    monkeypatch.setattr(tiny, "_end", spy_end)
    tiny.generate(PROMPTS, BRANCHY)
    assert len(checked) == len(PROMPTS) and max(checked) > 1  # branches ending in the same step


@pytest.mark.parametrize("config", [BRANCHY, {**BRANCHY, "refresh_interval": 4}])
def test_counts_match_model_calls(tiny, config):
    """Alone, a request's forwards are the model calls and its row-forwards their rows; batched,
    the rows add up (refresh forwards, whose idle rows are not counted, aside)."""
    calls = []

    def record(module, args, kwargs, out):
        calls.append(kwargs["input_ids"].shape[0])  # the call's rows

    hook = tiny.model.get_decoder().register_forward_hook(record, with_kwargs=True)
    try:
        for prompt in PROMPTS[:3]:
            calls.clear()
            gen = tiny.generate([prompt], config)[0]
            assert gen.forwards == len(calls) and gen.extra["row_forwards"] == sum(calls) == 3 * len(calls)
        calls.clear()
        gens = tiny.generate(PROMPTS, {**config, "refresh_interval": 0})
    finally:
        hook.remove()
    assert sum(g.extra["row_forwards"] for g in gens) == sum(calls) == 3 * sum(g.forwards for g in gens)
    for gen in gens:
        assert 1 <= gen.tokens <= SHORT["max_new_tokens"] and gen.extra["block_size"] in (4, 8, 16)
        assert gen.extra["flops"] > 0 and gen.extra["blocks"] >= 1


def test_trace_one_entry_per_request_and_step(tiny):
    """Every branch commits at least one token per step; the trace adds up to the counts."""
    gens, trace = tiny.decode(PROMPTS, {**BRANCHY, "refresh_interval": 4}, record=True)
    json.dumps(trace)  # the engine's trace file is JSON lines
    for prompt, gen in zip(PROMPTS, gens):
        steps = [e for e in trace if e["prompt"] == prompt.id]
        assert len(steps) == gen.forwards - gen.extra["refreshes"] == steps[-1]["step"] + 1
        assert [e["winner"] is None for e in steps] == [True] * (len(steps) - 1) + [False]
        assert all(commits for e in steps for commits in e["committed"])
        assert sum(len(e["merged"]) for e in steps) == gen.extra["merges"]
        assert sum(len(e["synced"]) for e in steps) == gen.extra["syncs"]
        assert sum(e["refreshed"] for e in steps) == gen.extra["refreshes"]


def test_deterministic_and_protocol(tiny):
    assert isinstance(tiny, Engine) and tiny.describe()["engine"] == "blockbatch"
    assert _key(tiny.generate(PROMPTS, BRANCHY)) == _key(tiny.generate(PROMPTS, BRANCHY))
    spec = registry.factory(registry.ENGINES, "blockbatch")  # the model-free spec; calling it builds BlockBatchEngine
    assert issubclass(BlockBatchEngine, spec) and type(spec.__new__(spec)) is BlockBatchEngine


@pytest.mark.parametrize(
    "config, message",
    [
        ({"block_size": 8}, "blockbatch: unknown config key 'block_size'; known keys: block_sizes"),
        ({"block_sizes": []}, r"block_sizes: expected a non-empty list of distinct ints >= 1, got \[\]"),
        ({"block_sizes": [8, 8]}, "block_sizes: expected a non-empty list of distinct ints >= 1"),
        ({"block_sizes": [4, 0]}, "block_sizes: expected a non-empty list"),
        ({"block_sizes": 8}, "block_sizes: expected a non-empty list"),
        ({"block_sizes": [True]}, "block_sizes: expected a non-empty list"),
        ({"sync_lag": -1}, "blockbatch: sync_lag: expected int >= 0, got -1"),
        ({"refresh_interval": 1.5}, "refresh_interval: expected int >= 0, got 1.5"),
        ({"max_new_tokens": 0}, "max_new_tokens: expected int >= 1"),
        ({"merge_threshold": "high"}, "merge_threshold: expected a number >= 0"),
        ({"proposal_threshold": -1}, "proposal_threshold: expected a number >= 0, got -1"),
        ({"accept_threshold": -0.1}, "accept_threshold: expected a number >= 0"),
    ],
)
def test_clear_errors_bad_config(tiny, config, message):
    with pytest.raises(ValueError, match=message):
        tiny.generate(PROMPTS[:1], config)


def test_grid_reference_is_multi_block_default_and_configs_valid():
    grid = load_grid(GRID)
    specs = {spec.name: spec for spec in grid.configs}
    reference = specs[grid.reference]
    assert reference.engine == "block_diffusion" and grid.engine == "blockbatch"
    assert DecodeConfig.from_params(reference.params) == DecodeConfig.from_params({})
    candidates = [BatchConfig.from_params(s.params) for name, s in specs.items() if name != grid.reference]
    assert BatchConfig.from_params({}) in candidates  # the engine defaults are one of them


def test_gate_runs_a_blockbatch_grid_end_to_end(pytester, run_gate):
    """Through the entry point, with a block_diffusion reference; selection mode exits 0 whatever
    the embedded checkpoint's accuracy."""
    pytester.makefile(".yaml", bb=GATE_GRID.format(model=runtime.EMBEDDED_MODEL))
    result = run_gate("--redline-alpha=0.1", "--redline-grid", "bb.yaml", "--redline-full")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*n=32 prompts, m=2 configs, cost tpf*", "R* multi *32 *", "* bs4-8 *32 *", "*CERTIFIED (blockbatch-tiny, select)*"])


GATE_GRID = """\
name: blockbatch-tiny
suite: arithmetic
suite_args: {{split: calibration, n: 32, seed: 0}}
engine: blockbatch
engine_args: {{model: {model}, device: cpu, dtype: float32, threads: 1}}
cost: tpf
reference: multi
configs:
  multi: {{engine: block_diffusion, engine_args: {{model: {model}, device: cpu, dtype: float32}}}}
  bs4-8: {{block_sizes: [4, 8], max_new_tokens: 48}}
deploy: fastest
batch_size: 32
"""
