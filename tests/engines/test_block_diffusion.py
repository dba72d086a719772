"""Invariants of the multi-block block-diffusion engine.

Equivalence tests (cached vs recomputed, batched vs alone, buffer 1 vs the single-block decoder)
run in float64 on a tiny random Llama with large weights (``tiny_folder`` in conftest.py), so that
predictions depend on the input, confidences spread over (0, 1) and steps commit several tokens.
Laws about real decodes use the embedded model.
"""
import dataclasses

import pytest
import torch
from transformers import DynamicCache

from pytest_redline.contracts import BlockLifecycle, Engine, cut_at_stop
from pytest_redline.engines import modeling, runtime
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine
from pytest_redline.engines.diffusion_spec import DEFAULTS
from pytest_redline.engines.blockbatch import BlockBatchEngine
from pytest_redline.engines.flowblock import FlowBlockEngine
from pytest_redline.engines.modeling import block_causal_mask
from pytest_redline.suites.arithmetic import ArithmeticSuite

import reference_decoders

pytestmark = pytest.mark.slow  # every test builds the tiny model or loads the embedded one: transformers' model classes, ~5 s of CPU

PROMPTS = ArithmeticSuite(n=6, seed=11).prompts()
SHORT = {"max_new_tokens": 20}


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return BlockDiffusionEngine(model=tiny_folder, device="cpu", dtype="float64")


@pytest.fixture(scope="module")
def embedded():
    return BlockDiffusionEngine(device="cpu")


def _key(gens):
    return [(g.text, g.tokens, g.forwards) for g in gens]


CONFIGS = [
    {},
    {"schedule": "eager"},
    {"accept_threshold": 0.5, "semi_complete_threshold": 0.5, "buffer_size": 3, "add_block_threshold": 0.0},
    {"accept_threshold": 0.7, "skip_masked_blocks": True, "block_size": 4},
]


@pytest.mark.slow  # decodes: several seconds
@pytest.mark.parametrize("config", CONFIGS)
def test_exact_cache_tokens(tiny, config):
    cached = tiny.generate(PROMPTS, {**config, **SHORT})
    recomputed = tiny.generate(PROMPTS, {**config, **SHORT, "use_cache": False})
    assert _key(cached) == _key(recomputed)


def test_exact_cache_logits_and_folded_store(tiny):
    model = tiny.model
    ids = torch.randint(5, 40, (2, 32))
    pos = torch.arange(32)[None].expand(2, -1)

    def forward(lo, hi, cache):
        kpos = pos[:, : hi] if cache is not None else pos[:, lo:hi]
        mask = block_causal_mask(pos[:, lo:hi], kpos, 8, model.dtype)
        return model(input_ids=ids[:, lo:hi], attention_mask=mask, position_ids=pos[:, lo:hi], cache=cache).logits

    full = forward(0, 32, None)
    cache = DynamicCache(config=model.config)
    forward(0, 16, cache)
    torch.testing.assert_close(forward(16, 32, cache), full[:, 16:], rtol=0, atol=1e-10)
    cache.crop(-8)  # folded store: keep block 2 from the forward that also computed block 3
    store = DynamicCache(config=model.config)
    forward(0, 24, store)
    for folded, stored in zip(cache.layers, store.layers):
        torch.testing.assert_close(folded.keys, stored.keys, rtol=0, atol=1e-10)
        torch.testing.assert_close(folded.values, stored.values, rtol=0, atol=1e-10)


@pytest.mark.parametrize("config", CONFIGS[:2])
@pytest.mark.slow  # over 5 s
def test_equivalent_batched_and_alone(tiny, config):
    batched = tiny.generate(PROMPTS, {**config, **SHORT})
    alone = [tiny.generate([p], {**config, **SHORT})[0] for p in PROMPTS]
    assert _key(batched) == _key(alone)


DIFFULEX = [  # (block, buffer, accept, semi, add): buffer 1 (store forwards), 2 and 3; P % B = 0 and not
    (8, 2, 0.6, 0.7, 0.3),
    (4, 1, 0.7, 0.9, 0.1),
    (4, 3, 0.5, 0.5, 0.0),
    (6, 3, 0.7, 0.95, 0.5),
]
PROMPTS_P8 = PROMPTS + [p for p in ArithmeticSuite(n=16, seed=5).prompts() if len(p.text) in (8, 10)][:2]


@pytest.mark.parametrize("block, buffer, accept, semi, add", DIFFULEX)
@pytest.mark.slow  # over 5 s each
def test_equivalent_diffulex_reference(tiny, block, buffer, accept, semi, add):
    """The default schedule equals an uncached re-implementation of Diffulex multi_bd written from
    engines.md (tests/support/reference_decoders.py): text, tokens and forwards, prompts with P % B = 0
    (pure prefill) and without (the padded tail block starts ACTIVE)."""
    config = {"block_size": block, "buffer_size": buffer, "accept_threshold": accept,
              "semi_complete_threshold": semi, "add_block_threshold": add, **SHORT}
    gens = tiny.generate(PROMPTS_P8, config)
    lengths = set()
    for prompt, gen in zip(PROMPTS_P8, gens):
        ids = tiny.tokenizer(prompt.text).input_ids
        lengths.add(len(ids) % block == 0)
        out, forwards = reference_decoders.diffulex(tiny, ids, block, buffer, accept, semi, add, SHORT["max_new_tokens"])
        assert (gen.tokens, gen.forwards) == (len(out), forwards)
        assert gen.text == tiny.tokenizer.decode([t for t in out if t not in tiny.eos_ids])
        assert gen.finish_reason == ("eos" if out[-1] in tiny.eos_ids else "length")
    assert lengths == {True, False}


@pytest.mark.parametrize("accept, block_size", [(0.9, 4), (1.5, 8)])
@pytest.mark.slow  # over 5 s each
def test_equivalent_eager_buffer_one_single_block(tiny, accept, block_size):
    """``schedule: eager`` at buffer 1 is single-block threshold decoding without store forwards."""
    config = {"buffer_size": 1, "accept_threshold": accept, "block_size": block_size, "schedule": "eager", **SHORT}
    gens = tiny.generate(PROMPTS, config)
    for prompt, gen in zip(PROMPTS, gens):
        ids = tiny.tokenizer(prompt.text).input_ids
        out, forwards = reference_decoders.single_block(tiny, ids, block_size, accept, SHORT["max_new_tokens"], complete_block=False)
        assert (gen.tokens, gen.forwards) == (len(out), forwards)
        assert gen.text == tiny.tokenizer.decode([t for t in out if t not in tiny.eos_ids])


@pytest.mark.slow  # decodes: several seconds
@pytest.mark.parametrize("schedule", ["diffulex", "eager"])
def test_one_commit_per_denoising_forward_accept_above_one(tiny, schedule):
    """Buffer 1 and accept > 1: every forward that denoises commits exactly one position; the
    others are Diffulex's pure prefill and store forwards. TPF is below 1, not 1: positions after
    the EOS in its block are committed too (and the store forwards add forwards)."""
    config = {"buffer_size": 1, "accept_threshold": 1.01, "schedule": schedule, **SHORT}
    gens, trace = tiny.decode(PROMPTS, config, record=True)
    assert all(len(step["committed"]) <= 1 for step in trace)
    idle = [s for s in trace if not s["committed"]]  # eager: none; Diffulex: prefill and store steps
    assert (not idle) if schedule == "eager" else all(s["stored"][1] > s["stored"][0] for s in idle)
    assert len(trace) == sum(g.forwards for g in gens)
    assert sum(g.tokens for g in gens) < sum(g.forwards for g in gens)


@pytest.mark.slow  # decodes: several seconds
def test_equivalent_skip_placeholders_fewer_flops(tiny):
    """Placeholders never change earlier blocks' logits: skipping them changes FLOPs only."""
    config = {"add_block_threshold": 2.0, "buffer_size": 3, **SHORT}  # only one block ever in flight
    computed = tiny.generate(PROMPTS, config)
    skipped = tiny.generate(PROMPTS, {**config, "skip_masked_blocks": True})
    assert _key(computed) == _key(skipped)
    assert all(s.extra["flops"] < c.extra["flops"] for s, c in zip(skipped, computed))


REAL = ArithmeticSuite(n=16, seed=5).prompts()
REAL_CONFIGS = [{}, {"accept_threshold": 0.8, "semi_complete_threshold": 0.7, "buffer_size": 3}, {"skip_masked_blocks": True}]


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
@pytest.mark.parametrize("config", REAL_CONFIGS)
def test_maximal_commit_rule_and_scheduler_laws(embedded, config):
    cfg = {**DEFAULTS, **config}
    gens, trace = embedded.decode(REAL, config, record=True)
    previous = {}
    for step in trace:
        in_flight = step["in_flight"]
        # maximal: the oldest block in flight is never fully resolved (it would have become final)
        assert not in_flight or in_flight[0][1] < 1.0
        assert len(in_flight) <= cfg["buffer_size"]
        assert step["final"] % cfg["block_size"] == 0 and step["stored"][1] <= step["final"]
        before = previous.get(step["prompt"])
        if before and before["in_flight"]:
            newest = before["in_flight"][-1]
            admitted = [b for b, _ in in_flight if b > newest[0]]
            assert not admitted or newest[1] >= cfg["add_block_threshold"]
        # the oldest block makes progress, unless the step only prefills or stores (Diffulex)
        assert step["committed"] or not in_flight or step["stored"][1] > step["stored"][0]
        previous[step["prompt"]] = step
    assert sum(g.forwards for g in gens) == len(trace)


@pytest.mark.slow  # the embedded model's real decode: 12.9 s in the inner loop
def test_committed_tokens_never_change(embedded):
    gens, trace = embedded.decode(REAL, {"accept_threshold": 0.7, "buffer_size": 3}, record=True)
    for prompt, gen in zip(REAL, gens):
        committed = [(p, t) for s in trace if s["prompt"] == prompt.id for p, t in s["committed"]]
        positions = [p for p, _ in committed]
        assert len(positions) == len(set(positions))  # each position committed once
        start = len(prompt.text)
        final = embedded.tokenizer(gen.text).input_ids
        for p, t in committed:
            if start <= p < start + len(final):
                assert final[p - start] == t


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
def test_counts_match_model_calls(embedded):
    rows = []
    hook = embedded.model.get_decoder().register_forward_hook(lambda m, a, k, out: rows.append(k["input_ids"].shape[0]), with_kwargs=True)
    try:
        gens = embedded.generate(REAL, {})
    finally:
        hook.remove()
    assert sum(g.forwards for g in gens) == sum(rows)
    for gen in gens:
        text_tokens = len(embedded.tokenizer(gen.text).input_ids)
        assert gen.tokens in (text_tokens, text_tokens + 1)  # + the EOS when one was produced
        assert gen.extra["flops"] > 0 and gen.extra["blocks"] >= 1


@pytest.mark.slow  # decodes: several seconds
def test_deterministic_real_decode(embedded):
    assert _key(embedded.generate(REAL, {})) == _key(embedded.generate(REAL, {}))


def test_protocol_describe_fingerprint(embedded):
    assert isinstance(embedded, Engine)
    info = embedded.describe()
    assert {"device", "dtype", "torch", "model"} <= set(info) and info["dtype"] == "float32"
    assert embedded.fingerprint() == runtime.fingerprint(runtime.EMBEDDED_MODEL)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"accept": 0.9}, "unknown config key 'accept'; known keys: block_size"),
        ({"block_size": 0}, "block_size: expected int >= 1"),
        ({"accept_threshold": "high"}, "accept_threshold: expected a number"),
        ({"skip_masked_blocks": 1}, "skip_masked_blocks: expected true or false"),
    ],
)
def test_clear_errors_bad_config(tiny, config, message):
    with pytest.raises(ValueError, match=message):
        tiny.generate(PROMPTS[:1], config)


ENGINES = {"block_diffusion": BlockDiffusionEngine, "flowblock": FlowBlockEngine, "blockbatch": BlockBatchEngine}
LIFECYCLE_CONFIGS = {
    "block_diffusion": {"buffer_size": 3, "accept_threshold": 0.6, "add_block_threshold": 0.0},
    "flowblock": {"window": 3, "spawn_threshold": 0.3, "accept_threshold": 0.6, "edit_threshold": 0.5},
    "blockbatch": {"block_sizes": [4, 8], "accept_threshold": 0.6, "merge_threshold": 0.3, "sync_lag": 3, "refresh_interval": 4},
}


@pytest.fixture(scope="module")
def tiny_engines(tiny_folder, tiny):
    return {
        "block_diffusion": tiny,
        "flowblock": FlowBlockEngine(model=tiny_folder, device="cpu", dtype="float64"),
        "blockbatch": BlockBatchEngine(model=tiny_folder, device="cpu", dtype="float64"),
    }


def _final_end(state) -> int:
    """The end of the final prefix: a request's ``final``, a BlockBatch branch's ``start``."""
    return state.final if hasattr(state, "final") else state.start


@pytest.mark.slow  # decodes: several seconds
@pytest.mark.parametrize("name", ENGINES)
def test_protocol_block_lifecycle(tiny_engines, monkeypatch, name):
    """Each engine implements the block life cycle and overrides no private method of the
    multi-block engine. Observed through the four calls: admitted and retired blocks come in
    increasing order, commits never land in the final prefix, and an ended request (or branch)
    sees no further call."""
    engine, cls = tiny_engines[name], ENGINES[name]
    assert isinstance(engine, BlockLifecycle)
    private = {n for n in vars(cls) if n.startswith("_") and not n.startswith("__") and hasattr(BlockDiffusionEngine, n)}
    assert cls is BlockDiffusionEngine or not private, private
    events = {}

    def spy(method):
        original = getattr(engine, method)

        def wrapped(state, *args):
            log = events.setdefault(id(state), {"admit": [], "retire": [], "ended": False})
            assert not log["ended"] or method == "commit" and not args[0], (method, log)
            if method == "commit":
                end = _final_end(state)
                committed = original(state, *args)
                assert all(p >= end for p, _ in committed)
                return committed
            out = original(state, *args)
            if method in ("admit", "retire"):
                log[method] += out
                assert log[method] == sorted(set(log[method]))
            if method == "retire":
                log["ended"] = state.result is not None
            return out

        monkeypatch.setattr(engine, method, wrapped)

    for method in ("admit", "step", "commit", "retire"):
        spy(method)
    gens = engine.generate(PROMPTS, {**LIFECYCLE_CONFIGS[name], **SHORT})
    assert all(g.finish_reason in ("eos", "length") for g in gens)
    assert sum(len(log["retire"]) for log in events.values()) > len(PROMPTS)


@pytest.mark.slow  # decodes: several seconds
@pytest.mark.parametrize("name", ENGINES)
def test_stop_string_cuts_output_tokens_forwards(tiny_engines, name):
    """With a stop string taken from each prompt's own output, the request ends at its first
    occurrence: the text before it, finish_reason "stop", tokens up to the stop string's last
    token (a character tokenizer: one token per character), no more forwards than without stop;
    where the output cannot change once resolved (all but BlockBatch, whose winner may change),
    the text is the unstopped text cut at the stop."""
    engine, config = tiny_engines[name], {**LIFECYCLE_CONFIGS[name], **SHORT}
    plain = engine.generate(PROMPTS, config)
    stops = [(g.text[3:5],) for g in plain]
    stopped = engine.generate([dataclasses.replace(p, stop=s) for p, s in zip(PROMPTS, stops)], config)
    for g, s, p in zip(stopped, stops, plain):
        assert s[0] not in g.text and g.finish_reason == "stop" and g.forwards <= p.forwards
        assert g.tokens == len(g.text) + len(s[0])
        if name != "blockbatch":
            assert g.text == cut_at_stop(p.text, s)[0]
