"""Invariants of the FlowBlock engine.

Equivalences (window 1 vs the multi-block engine with buffer 1, gate 1 vs serial decoding, cached
vs recomputed, batched vs alone) run in float64 on the tiny random model (``tiny_folder`` in
conftest.py). Laws about real decodes (retired blocks never change, the gate, the edit budget,
progress, counts) check every step of the embedded model's traces; none depends on its accuracy.
"""
from pathlib import Path

import pytest

from pytest_redline.contracts import Engine
from pytest_redline.engines.diffusion_spec import FLOW_DEFAULTS as DEFAULTS, DecodeConfig, FlowConfig
from pytest_redline.engines.flowblock import FlowBlockEngine
from pytest_redline import registry
from pytest_redline.grid import load_grid
from pytest_redline.suites.arithmetic import ArithmeticSuite

import reference_decoders

pytestmark = pytest.mark.slow  # the flowblock engine: imports torch and transformers (engine and reference decoders)

PROMPTS = ArithmeticSuite(n=6, seed=11).prompts()
SHORT = {"max_new_tokens": 20}
NO_EDITS = [{"edit_threshold": 1.0}, {"edit_threshold": 1.5, "max_post_steps": 0}]
GRID = Path(__file__).resolve().parents[2] / "grids" / "flowblock.yaml"


@pytest.fixture(scope="module")
def tiny(tiny_folder):
    return FlowBlockEngine(model=tiny_folder, device="cpu", dtype="float64")


@pytest.fixture(scope="module")
def embedded():
    return FlowBlockEngine(device="cpu")


def _key(gens):
    return [(g.text, g.tokens, g.forwards, g.extra.get("edits", 0.0)) for g in gens]


@pytest.mark.slow  # over 5 s
@pytest.mark.parametrize("accept, block_size, no_edit", [(0.6, 8, NO_EDITS[0]), (0.9, 4, NO_EDITS[1]), (1.5, 8, NO_EDITS[0])])
def test_equivalent_window_one_llada20(tiny, no_edit, accept, block_size):
    """Window 1 without editing is LLaDA2.0 (threshold, top-1 fallback, no check forward), against
    an uncached float64 decoder written from engines.md: text, tokens, forwards."""
    gens = tiny.generate(PROMPTS, {"window": 1, "accept_threshold": accept, "block_size": block_size, **no_edit, **SHORT})
    for prompt, gen in zip(PROMPTS, gens):
        ids = tiny.tokenizer(prompt.text).input_ids
        out, forwards = reference_decoders.single_block(tiny, ids, block_size, accept, SHORT["max_new_tokens"])
        assert (gen.text, gen.tokens, gen.forwards) == (_text(tiny, out), len(out), forwards)


LLADA21 = [  # (accept, edit, max_post_steps, block): oscillating edits at a low edit threshold, caps 16 / 3 / 0
    (0.7, 0.5, 16, 8),
    (0.9, 0.6, 3, 4),
    (0.5, 0.4, 0, 8),
    (0.95, 0.9, 16, 4),
]


@pytest.mark.slow  # over 5 s
@pytest.mark.parametrize("accept, edit, post, block_size", LLADA21)
def test_equivalent_window_one_editing_llada21(tiny, accept, edit, post, block_size):
    """Window 1 with editing is LLaDA2.1 (M2T threshold with top-1 fallback, T2T edits in every
    step, at most max_post_steps check forwards per block), against an uncached float64 decoder
    written from engines.md: text, tokens, forwards; edits happen."""
    config = {"window": 1, "accept_threshold": accept, "edit_threshold": edit, "max_post_steps": post,
              "block_size": block_size, **SHORT}
    gens = tiny.generate(PROMPTS, config)
    for prompt, gen in zip(PROMPTS, gens):
        ids = tiny.tokenizer(prompt.text).input_ids
        out, forwards = reference_decoders.llada21(tiny, ids, block_size, accept, edit, post, SHORT["max_new_tokens"])
        assert (gen.text, gen.tokens, gen.forwards) == (_text(tiny, out), len(out), forwards)
    assert sum(g.extra["edits"] for g in gens) > 0


def _text(engine, out):
    return engine.tokenizer.decode([t for t in out if t not in engine.eos_ids])


@pytest.mark.slow  # float64 decodes against the uncached reference, as block_diffusion's (5-15 s)
@pytest.mark.parametrize("window", [2, 4])
@pytest.mark.parametrize("accept", [0.5, 0.8])
def test_equivalent_gate_one_serial(tiny, window, accept):
    """Gate at 1 and no editing: a block starts only once its predecessor is final (serial)."""
    config = {"spawn_threshold": 1.0, "edit_threshold": 1.0, "accept_threshold": accept, **SHORT}
    assert _key(tiny.generate(PROMPTS, {**config, "window": window})) == _key(tiny.generate(PROMPTS, {**config, "window": 1}))


WAVEFRONT = [  # blocks in flight together, and edits, on the tiny model
    {"window": 2, "spawn_threshold": 0.5, "accept_threshold": 0.7, "edit_threshold": 0.5},
    {"window": 3, "spawn_threshold": 0.3, "accept_threshold": 0.5, "edit_threshold": 0.6, "max_post_steps": 3, "block_size": 4},
]


@pytest.mark.slow  # float64 decodes against the uncached reference, as block_diffusion's (5-15 s)
@pytest.mark.parametrize("config", WAVEFRONT)
def test_exact_cache_tokens_with_wavefront_and_edits(tiny, config):
    gens, trace = tiny.decode(PROMPTS, {**config, **SHORT}, record=True)
    assert max(len(step["in_flight"]) for step in trace) > 1 and sum(g.extra["edits"] for g in gens) > 0
    assert _key(gens) == _key(tiny.generate(PROMPTS, {**config, **SHORT, "use_cache": False}))


@pytest.mark.slow  # float64 decodes against the uncached reference, as block_diffusion's (5-15 s)
@pytest.mark.parametrize("config", WAVEFRONT[:1])
def test_equivalent_batched_and_alone(tiny, config):
    batched = tiny.generate(PROMPTS, {**config, **SHORT})
    alone = [tiny.generate([p], {**config, **SHORT})[0] for p in PROMPTS]
    assert _key(batched) == _key(alone)


REAL = ArithmeticSuite(n=16, seed=5).prompts()
REAL_CONFIGS = [
    {},
    {"window": 2, "spawn_threshold": 0.9, "accept_threshold": 0.9, "edit_threshold": 1.0},
    {"window": 2, "spawn_threshold": 0.0, "accept_threshold": 0.8, "edit_threshold": 0.5, "max_post_steps": 3},
]


@pytest.fixture(scope="module", params=REAL_CONFIGS, ids=["defaults", "spawn90-no-edits", "edits"])
def real_decode(request, embedded):
    config = {**DEFAULTS, **request.param}
    gens, trace = embedded.decode(REAL, request.param, record=True)
    return config, gens, trace


def _steps_by_prompt(trace):
    steps = {}
    for step in trace:
        steps.setdefault(step["prompt"], []).append(step)
    return steps


def _replay(engine, prompt, steps, config):
    """The prompt's ids and the token states before each step and after the last, rebuilt from
    the trace's commits and edits."""
    ids = engine.tokenizer(prompt.text).input_ids
    tokens = ids + [engine.mask_id] * (config["max_new_tokens"] + 2 * config["block_size"])
    states = [list(tokens)]
    for step in steps:
        for p, t in step["committed"] + step["edited"]:
            tokens[p] = t
        states.append(list(tokens))
    return ids, states


@pytest.mark.slow  # real decodes of the embedded model at three configs (shared fixture): 12 s
def test_retired_blocks_never_change(embedded, real_decode):
    """Replaying a trace's commits and edits gives the output; commits fill MASKs, edits replace
    drafted tokens; no change ever lands in a retired block or on a prompt token, and a retired
    block is never computed again."""
    config, gens, trace = real_decode
    size, mask = config["block_size"], embedded.mask_id
    steps = _steps_by_prompt(trace)
    for prompt, gen in zip(REAL, gens):
        ids, states = _replay(embedded, prompt, steps[prompt.id], config)
        final = len(ids) // size * size
        for step, before, after in zip(steps[prompt.id], states, states[1:]):
            assert min(step["computed"]) * size >= step["stored"][0]  # the cached prefix is read, not recomputed
            assert all(before[p] == mask for p, _ in step["committed"])
            assert all(before[p] not in (mask, t) for p, t in step["edited"])
            changed = [p for p, (a, b) in enumerate(zip(before, after)) if a != b]
            assert all(p >= max(final, len(ids)) for p in changed)  # not retired, not the prompt
            final = step["final"]
        out = states[-1][len(ids) : len(ids) + gen.tokens]
        assert embedded.tokenizer.decode([t for t in out if t not in embedded.eos_ids]) == gen.text
        assert sum(len(step["edited"]) for step in steps[prompt.id]) == gen.extra["edits"]


@pytest.mark.slow  # real decodes of the embedded model at three configs (shared fixture): 12 s
def test_readiness_share_of_frontier_masks_committed(embedded, real_decode):
    """rho = the share of the frontier's masked positions above accept_threshold, which are exactly
    its threshold commits; a frontier without MASK has rho 1; the top-1 fallback is the head's alone."""
    config, _, trace = real_decode
    size, mask = config["block_size"], embedded.mask_id
    steps = _steps_by_prompt(trace)
    for prompt in REAL:
        _, states = _replay(embedded, prompt, steps[prompt.id], config)
        for step, before in zip(steps[prompt.id], states):
            active = [b for b in step["computed"] if b * size >= step["stored"][1]]  # the rest: folded store
            frontier = active[-1]
            masked = before[frontier * size : (frontier + 1) * size].count(mask)
            commits = sum(p // size == frontier for p, _ in step["committed"])
            if masked == 0:
                assert step["readiness"] == 1.0
            elif step["readiness"] > 0:
                assert step["readiness"] * masked == pytest.approx(commits)
            else:  # nothing passed: the head falls back to its top-1, another block waits
                assert commits == (frontier == active[0])


@pytest.mark.slow  # real decodes of the embedded model at three configs (shared fixture): 12 s
def test_scheduler_laws_gate_window_post_cap_progress(embedded, real_decode):
    """At most `window` blocks; a block is admitted only after the frontier's readiness reached the
    gate; a head gets at most `max_post_steps` check forwards (forwards that saw it complete);
    every step but a request's last commits, edits or retires something; a block retires only
    when stable (editing off, a check forward changed nothing in it or before it, or the cap)."""
    config, gens, trace = real_decode
    size, mask = config["block_size"], embedded.mask_id
    editing = config["edit_threshold"] < 1
    steps_of = _steps_by_prompt(trace)
    for prompt, gen in zip(REAL, gens):
        steps, checks, heads = steps_of[prompt.id], {}, {}
        _, states = _replay(embedded, prompt, steps, config)
        for before, step, state in zip([None] + steps, steps, states):
            assert len(step["in_flight"]) <= config["window"]
            if before and before["in_flight"]:
                admitted = [b for b, _ in step["in_flight"] if b > before["in_flight"][-1][0]]
                assert not admitted or before["readiness"] >= config["spawn_threshold"]
            active = [b for b in step["computed"] if b * size >= step["stored"][1]]
            complete = {b for b in active if mask not in state[b * size : (b + 1) * size]}
            for b in complete:
                checks[b] = checks.get(b, 0) + 1
            if active and active[0] in complete:  # the head: at most the cap (blocks behind it wait)
                heads[active[0]] = heads.get(active[0], 0) + 1
                assert heads[active[0]] <= config["max_post_steps"] or not editing
            assert step["committed"] or step["edited"] or step["became_final"] or step is steps[-1]
            changed = min((p // size for p, _ in step["committed"] + step["edited"]), default=float("inf"))
            for b in step["became_final"]:
                assert not editing or (b in complete and changed > b) or checks.get(b, 0) >= config["max_post_steps"]
    assert sum(g.forwards for g in gens) == len(trace)


@pytest.mark.slow  # over 5 s
def test_counts_match_model_calls(embedded):
    rows = []
    hook = embedded.model.get_decoder().register_forward_hook(
        lambda m, a, k, out: rows.append(k["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        gens = embedded.generate(REAL, REAL_CONFIGS[2])
    finally:
        hook.remove()
    assert sum(g.forwards for g in gens) == sum(rows)
    for gen in gens:
        text_tokens = len(embedded.tokenizer(gen.text).input_ids)
        assert gen.tokens in (text_tokens, text_tokens + 1)  # + the EOS when one was produced
        assert gen.extra["flops"] > 0 and gen.extra["blocks"] >= 1 and gen.extra["edits"] >= 0


def test_protocol_name_and_entry_point(embedded):
    assert isinstance(embedded, Engine)
    assert embedded.describe()["engine"] == "flowblock"
    spec = registry.factory(registry.ENGINES, "flowblock")  # the model-free spec; calling it builds FlowBlockEngine
    assert issubclass(FlowBlockEngine, spec) and type(spec.__new__(spec)) is FlowBlockEngine


def test_valid_example_grid():
    """grids/flowblock.yaml: the multi-block reference and FlowBlock candidates, valid for their engines."""
    grid = load_grid(GRID)
    grid.check_paths()
    assert grid.engine == "flowblock"
    for spec in grid.configs:
        engine = spec.engine or grid.engine
        (DecodeConfig if engine == "block_diffusion" else FlowConfig).from_params(spec.params)
    reference = next(spec for spec in grid.configs if spec.name == grid.reference)
    assert reference.engine == "block_diffusion" and "model" in reference.engine_args


@pytest.mark.parametrize(
    "config, message",
    [
        ({"buffer_size": 2}, "flowblock: unknown config key 'buffer_size'; known keys: block_size, window"),
        ({"window": 0}, "flowblock: window: expected int >= 1, got 0"),
        ({"max_post_steps": -1}, "max_post_steps: expected int >= 0, got -1"),
        ({"spawn_threshold": "high"}, "spawn_threshold: expected a number >= 0"),
        ({"use_cache": 1}, "use_cache: expected true or false"),
    ],
)
def test_clear_errors_bad_config(tiny, config, message):
    with pytest.raises(ValueError, match=message):
        tiny.generate(PROMPTS[:1], config)
