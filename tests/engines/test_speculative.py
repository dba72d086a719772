"""The speculative engine: the laws of the acceptance rules, cache rollback, batching and counting.

Equivalence tests run in float64 on the embedded target and draft (engines/models/ar-*).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compact_row_cache import CompactRowCache
from pytest_redline.engines.autoregressive import RowCache, common_prefix, greedy, new_requests
from pytest_redline.engines.common import encode
from pytest_redline.engines.runtime import AR_DRAFT, AR_TARGET
from pytest_redline.engines.autoregressive_spec import SPEC_DEFAULTS as DEFAULTS, SpecConfig
from pytest_redline.engines.speculative import SpeculativeEngine, accepted_lengths
from pytest_redline.suites.arithmetic import ArithmeticSuite

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # engine decodes with models: out of the inner loop (pytest -m 'not slow'), which must stay under 60 s

GAMMA = 4
TYPICAL = {"acceptance": "typical", "posterior_threshold": 0.1, "num_draft_tokens": GAMMA}
LOSSLESS = {"acceptance": "lossless", "num_draft_tokens": GAMMA}


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    yield SpeculativeEngine(target=AR_TARGET, draft=AR_DRAFT, device="cpu", dtype="float64", threads=1)
    torch.set_num_threads(threads)  # threads are process-wide: leave them as found


@pytest.fixture(scope="module")
def suite() -> ArithmeticSuite:
    return ArithmeticSuite(split="calibration", n=512, seed=0)


def texts(generations) -> list[str]:
    return [g.text for g in generations]


def target_greedy(engine: SpeculativeEngine, prompts, max_new_tokens: int = DEFAULTS["max_new_tokens"]) -> list[str]:
    """The target's own greedy decoding by transformers' ``generate`` (left-padded batches)."""
    tok = engine.tokenizer
    out = []
    for i in range(0, len(prompts), 128):
        batch = tok([p.text for p in prompts[i : i + 128]], return_tensors="pt", padding=True)
        ids = engine.target.generate(
            **batch, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
        for row in ids[:, batch.input_ids.shape[1] :].tolist():
            row = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
            out.append(tok.decode(row))
    return out


# ------------------------------------------------------------------------------ the rule itself


def scalar_rule(logits: torch.Tensor, proposals: list[int], cfg: SpecConfig) -> int:
    """The acceptance rule written out token by token (Medusa's formula, exact entropy)."""
    n = 0
    for k, x in enumerate(proposals):
        row = logits[k].double()
        if cfg.acceptance == "lossless" or cfg.temperature == 0:
            ok = x == int(row.argmax())
        else:
            p = torch.softmax(row / cfg.temperature, -1)
            h = -sum(float(q) * math.log(float(q)) for q in p if q > 0)
            ok = float(p[x]) > min(cfg.posterior_threshold, cfg.posterior_alpha * math.exp(-h))
        if not ok:
            break
        n += 1
    return n


rule_cases = st.tuples(
    st.integers(1, 6),  # gamma
    st.integers(0, 2**31 - 1),  # seed of the logits and proposals
    st.sampled_from([0.0, 1e-6, 0.02, 0.1, 0.4, 1.0]),  # eps
    st.sampled_from([0.0, 0.5, 1.0, 2.0]),  # temperature
    st.floats(0.1, 8.0),  # logit scale: flat to peaked
)


def random_round(gamma: int, seed: int, scale: float, vocab: int = 7):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, gamma + 1, vocab, generator=gen, dtype=torch.float64) * scale
    greedy = logits[:, :-1].argmax(-1)
    noise = torch.randint(vocab, greedy.shape, generator=gen)
    proposals = torch.where(torch.rand(greedy.shape, generator=gen) < 0.7, greedy, noise)
    return logits, proposals


@settings(max_examples=60)
@given(rule_cases)
def test_accepted_lengths_equal_the_scalar_rule(case) -> None:
    gamma, seed, eps, temperature, scale = case
    logits, proposals = random_round(gamma, seed, scale)
    for acceptance in ("lossless", "typical"):
        params = {"acceptance": acceptance, "num_draft_tokens": gamma}
        if acceptance == "typical":
            params.update(posterior_threshold=eps, temperature=temperature)
        cfg = SpecConfig.from_params(params)
        got = accepted_lengths(logits, proposals, cfg).tolist()
        assert got == [scalar_rule(logits[r], proposals[r].tolist(), cfg) for r in range(3)]
        assert all(0 <= n <= gamma for n in got)


@settings(max_examples=60)
@given(rule_cases, st.sampled_from([0.0, 0.01, 0.1, 0.3]))
def test_raising_eps_or_alpha_never_lengthens_acceptance(case, raise_by) -> None:
    gamma, seed, eps, temperature, scale = case
    logits, proposals = random_round(gamma, seed, scale)
    base = SpecConfig.from_params({**TYPICAL, "num_draft_tokens": gamma, "posterior_threshold": eps, "temperature": temperature})
    higher_eps = SpecConfig.from_params({**TYPICAL, "num_draft_tokens": gamma, "posterior_threshold": min(1.0, eps + raise_by),
                                         "posterior_alpha": base.posterior_alpha, "temperature": temperature})
    higher_alpha = SpecConfig.from_params({**TYPICAL, "num_draft_tokens": gamma, "posterior_threshold": eps,
                                           "posterior_alpha": base.posterior_alpha + raise_by, "temperature": temperature})
    n = accepted_lengths(logits, proposals, base)
    assert (accepted_lengths(logits, proposals, higher_eps) <= n).all()
    assert (accepted_lengths(logits, proposals, higher_alpha) <= n).all()


@settings(max_examples=30)
@given(rule_cases)
def test_typical_at_temperature_zero_is_lossless_and_eps_zero_accepts_all(case) -> None:
    gamma, seed, eps, _, scale = case
    logits, proposals = random_round(gamma, seed, scale)
    lossless = SpecConfig.from_params({"acceptance": "lossless", "num_draft_tokens": gamma})
    cold = SpecConfig.from_params({**TYPICAL, "num_draft_tokens": gamma, "posterior_threshold": eps, "temperature": 0.0})
    open_ = SpecConfig.from_params({**TYPICAL, "num_draft_tokens": gamma, "posterior_threshold": 0.0})
    assert torch.equal(accepted_lengths(logits, proposals, cold), accepted_lengths(logits, proposals, lossless))
    assert accepted_lengths(logits, proposals, open_).tolist() == [gamma] * 3


def test_eps_zero_keeps_a_proposal_whose_float32_probability_underflows() -> None:
    """A logit gap of 120: p(x) = exp(-120) underflows to 0 in float32, yet ε = 0 keeps x (log space)."""
    logits = torch.zeros(1, GAMMA + 1, 8, dtype=torch.float32)
    logits[..., 0] = 120.0
    proposals = torch.full((1, GAMMA), 3)
    assert (logits[0, 0].softmax(-1)[3] == 0).item()  # the underflow
    open_ = SpecConfig.from_params({**TYPICAL, "posterior_threshold": 0.0})
    assert accepted_lengths(logits, proposals, open_).tolist() == [GAMMA]
    assert accepted_lengths(logits, proposals, SpecConfig.from_params(TYPICAL)).tolist() == [0]


def test_posterior_alpha_defaults_to_sqrt_eps() -> None:
    assert SpecConfig.from_params({**TYPICAL, "posterior_threshold": 0.09}).posterior_alpha == pytest.approx(0.3)
    assert SpecConfig.from_params({**TYPICAL, "posterior_alpha": 0.5}).posterior_alpha == 0.5


@pytest.mark.parametrize(
    "params, words",
    [
        ({"acceptance": "typical", "eps": 0.1}, ["'eps'", "posterior_threshold", "num_draft_tokens"]),
        ({"acceptance": "greedy"}, ["acceptance", "lossless, typical", "'greedy'"]),
        ({"acceptance": "lossless", "posterior_threshold": 0.1}, ["posterior_threshold", "typical"]),
        ({"acceptance": "typical", "posterior_threshold": 1.5}, ["posterior_threshold", "[0.0, 1.0]", "1.5"]),
        ({"num_draft_tokens": 0}, ["num_draft_tokens", ">= 1", "0"]),
        ({"use_cache": "yes"}, ["use_cache", "true or false"]),
    ],
)
def test_bad_config_is_a_value_error_naming_the_key(params, words) -> None:
    with pytest.raises(ValueError) as info:
        SpecConfig.from_params(params)
    for word in words:
        assert word in str(info.value)


# ------------------------------------------------------------------------------ the engine


@pytest.mark.slow  # decodes every calibration prompt, over 5 s
def test_lossless_equals_target_greedy_on_every_calibration_prompt(engine, suite) -> None:
    prompts = suite.prompts()
    got = []
    for i in range(0, len(prompts), 128):
        got += engine.generate(prompts[i : i + 128], LOSSLESS)
    assert texts(got) == target_greedy(engine, prompts)


def test_typical_with_eps_zero_accepts_every_draft_token_until_the_cap(engine, suite) -> None:
    prompts = suite.prompts()[:48]
    for gen in engine.generate(prompts, {**TYPICAL, "posterior_threshold": 0.0}):
        rounds = gen.forwards
        assert gen.extra["accepted_draft_tokens"] >= GAMMA * (rounds - 1)  # every round but the cut last one
        assert rounds == math.ceil(gen.tokens / (GAMMA + 1))


def reference_decode(engine: SpeculativeEngine, prompt, cfg: SpecConfig) -> tuple[str, int]:
    """One prompt, no cache, every forward over the whole sequence: the obviously-right loop."""
    tok, eos = engine.tokenizer, engine.eos
    seq = tok(prompt.text).input_ids
    start, limit, rounds = len(seq), len(seq) + cfg.max_new_tokens, 0
    while True:
        proposals = []
        for _ in range(cfg.num_draft_tokens):
            proposals.append(int(engine.draft(torch.tensor([seq + proposals])).logits[0, -1].argmax()))
        logits = engine.target(torch.tensor([seq + proposals])).logits[:, -(cfg.num_draft_tokens + 1) :]
        n = int(accepted_lengths(logits, torch.tensor([proposals]), cfg)[0])
        rounds += 1
        for token in proposals[:n] + [int(logits[0, n].argmax())]:
            if len(seq) == limit:
                break
            seq.append(token)
            if token in eos:
                break
        if seq[-1] in eos or len(seq) == limit:
            return tok.decode([t for t in seq[start:] if t not in eos]), rounds


# posterior_alpha >= 1 can reject the target's own argmax: the token appended is then the rejected
# proposal, whose K/V both caches hold; each keeps all but the last token (whose logits the next
# forward needs). Before, the next forward had no token to feed a row and raised.
ALPHA_ABOVE_ONE = {**TYPICAL, "posterior_threshold": 1.0, "posterior_alpha": 10.0, "max_new_tokens": 16}  # (raised before, at 16 too)


@pytest.mark.parametrize("params", [LOSSLESS, TYPICAL, {**TYPICAL, "posterior_threshold": 0.4, "num_draft_tokens": 2}, ALPHA_ABOVE_ONE],
                         ids=["lossless", "typical", "typical-eps0.4-gamma2", "typical-alpha10"])
@pytest.mark.slow  # against the uncached loop: 7 s for the three
def test_engine_equals_the_uncached_one_prompt_loop(engine, suite, params) -> None:
    prompts = suite.prompts()[:12]
    cfg = SpecConfig.from_params(params)
    got = engine.generate(prompts, params)
    assert [(g.text, g.forwards) for g in got] == [reference_decode(engine, p, cfg) for p in prompts]


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
@pytest.mark.parametrize("params", [LOSSLESS, TYPICAL, {**TYPICAL, "posterior_threshold": 0.02, "num_draft_tokens": 6}])
def test_cached_decoding_equals_recomputation(engine, suite, params) -> None:
    prompts = suite.prompts()[:32]
    cached = engine.generate(prompts, params)
    recomputed = engine.generate(prompts, {**params, "use_cache": False})
    assert cached == recomputed


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
@pytest.mark.parametrize("params", [LOSSLESS, TYPICAL])
def test_batched_equals_one_request_at_a_time_in_float64(engine, suite, params) -> None:
    prompts = suite.prompts()[:24]
    batched = engine.generate(prompts, params)
    single = [engine.generate([p], params)[0] for p in prompts]
    assert batched == single


@settings(max_examples=15)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5), st.booleans()), min_size=2, max_size=4), st.integers(0, 1000))
def test_rollback_never_lets_a_rejected_token_change_later_logits(engine, rows, seed) -> None:
    """Feed each row extra tokens, keep a prefix (dropping the rest, or the row), feed on: the
    logits equal a fresh forward over the accepted sequence alone."""
    gen = torch.Generator().manual_seed(seed)
    token = lambda: int(torch.randint(5, 60, (1,), generator=gen))  # noqa: E731
    prompts = [[token() for _ in range(3 + r)] for r in range(len(rows))]
    cache = RowCache(engine.target, len(rows), engine.pad_id)
    cache.forward(prompts, keep=1)
    extra = [[token() for _ in range(k)] for _, k, _ in rows]
    cache.forward(extra, keep=1)
    def fresh(rejected: list[int]) -> int:  # a token after the kept ones that differs from the first rejected one
        while (t := token()) in rejected[:1]:
            pass
        return t

    accepted = [p + e[:keep] + [fresh(e[keep:])] for p, e, (keep, _, _) in zip(prompts, extra, rows)]
    kept_rows = [r for r, (_, _, drop) in enumerate(rows) if not drop] or [0]
    cache.retain(accepted, kept_rows)
    feeds = [accepted[r][cache.cached(i) :] + [token()] for i, r in enumerate(kept_rows)]
    logits = cache.forward(feeds, keep=2)
    for i, r in enumerate(kept_rows):
        fresh = engine.target(torch.tensor([accepted[r] + feeds[i][-1:]])).logits[0, -2:]
        torch.testing.assert_close(logits[i], fresh, rtol=1e-9, atol=1e-9)


@settings(max_examples=15)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 4), st.integers(1, 3)), min_size=1, max_size=4))
def test_row_cache_masks_equal_block_mask_over_the_held_keys(engine, rows) -> None:
    """The masks RowCache builds from its cursors alone (no validity state) equal
    ``modeling.block_mask`` over each row's held keys (positions 0 .. cached - 1), in every forward:
    the prefill, a rollback, and one-token feeds, listed or as a tensor, alone or in a run of
    successive ones (whose masks are views of one tensor)."""
    from pytest_redline.engines import modeling

    seen = []
    hook = engine.draft.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["attention_mask"], kwargs["position_ids"])), with_kwargs=True)
    cache = RowCache(engine.draft, len(rows), engine.pad_id)
    n = len(rows)
    forwards = [  # (feeds, roll back after it)
        ([[7] * a for a, _, _ in rows], True),
        ([[9] * (c if i % 2 else 1) for i, (_, _, c) in enumerate(rows)], True),
        ([[9]] * n, False),
        (torch.full((n, 1), 11), False),
        (torch.full((n, 1), 12), False),
        (torch.full((n, 2), 13), True),
        (torch.full((n, 1), 14), True),
    ]
    try:
        for step, (feeds, roll_back) in enumerate(forwards):
            cache.forward(feeds, keep=1)
            held = [cache.cached(r) for r in range(n)]
            mask, q_pos = seen[-1]
            width = mask.shape[-1]
            k_pos = torch.arange(width)[None].expand(n, width)
            expected = modeling.block_mask(q_pos, k_pos, mask.dtype, k_pos < torch.tensor(held)[:, None])
            assert torch.equal(mask.expand_as(expected), expected), f"forward {step}"
            if roll_back:
                cache.retain([cache.tokens[r][: max(1, held[r] - k)] for r, (_, k, _) in enumerate(rows)], list(range(n)))
    finally:
        hook.remove()


@given(st.lists(st.integers(0, 2), max_size=30), st.lists(st.integers(0, 2), max_size=6), st.lists(st.integers(0, 2), max_size=6))
def test_common_prefix_is_the_length_before_the_first_difference(shared, a, b) -> None:
    a, b = shared + a, shared + b
    first_difference = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix(a, b) == common_prefix(b, a) == first_difference


@pytest.mark.parametrize("template", [None, "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"], ids=["plain", "chat-template"])
def test_requests_encoded_in_one_batch_hold_the_ids_each_prompt_encodes_to(engine, suite, template) -> None:
    tokenizer = copy.deepcopy(engine.tokenizer)
    tokenizer.chat_template = template
    prompts = suite.prompts()[:40]
    requests = new_requests(tokenizer, prompts, 8, engine.eos, "speculative")
    assert [r.tokens for r in requests] == [encode(tokenizer, p, "speculative") for p in prompts]
    assert [r.limit for r in requests] == [len(r.tokens) + 8 for r in requests]


def test_a_cache_that_outgrows_its_capacity_keeps_every_row(engine) -> None:
    """The store grows (a copy) when a forward passes its capacity: the logits equal a fresh
    forward over each row's tokens."""
    cache = RowCache(engine.target, 2, engine.pad_id, capacity=4)
    rows = [[11, 12, 13], [21, 22]]
    cache.forward(rows, keep=1)
    more = [[14, 15, 16, 17], [23, 24, 25, 26]]
    logits = cache.forward(torch.tensor(more), keep=2)
    assert cache.capacity > 4 and cache.stores[0].kv.shape[3] == cache.capacity
    for i, (first, then) in enumerate(zip(rows, more)):
        fresh = engine.target(torch.tensor([first + then])).logits[0, -2:]
        torch.testing.assert_close(logits[i], fresh, rtol=1e-9, atol=1e-9)


def test_a_refilled_slot_holds_the_moved_row_in_every_layer_and_store(engine) -> None:
    """A model's layers share one K/V store (a refill is one copy per row); a layer shaped
    otherwise gets a store of its own; a finished row's slot then holds the moved row's K/V in
    both, over the columns the row keeps."""
    cache = RowCache(engine.draft, 3, engine.pad_id, capacity=8)
    cache.forward([[7, 8], [7], [7, 8, 9]], keep=1)
    assert len(cache.stores) == 1 and all(layer.store is cache.stores[0] for layer in cache.cache.layers)
    other = RowCache(engine.draft, 3, engine.pad_id, capacity=8)
    first, second = other.cache.layers[:2]
    first.lazy_initialization(torch.zeros(3, 2, 1, 32, dtype=torch.float64), None)
    second.lazy_initialization(torch.zeros(3, 1, 1, 16, dtype=torch.float64), None)
    assert len(other.stores) == 2 and first.store is not second.store
    for layer in (first, second):
        for t in (layer.keys, layer.values):
            t.copy_(torch.arange(3.0, dtype=torch.float64).view(3, 1, 1, 1).expand_as(t))
    other._tokens = [[1, 2], [1], [1, 2, 3]]
    other.retain([t + [5] for t in other.tokens], [0, 2])  # row 1 finished: row 2 refills its slot
    assert other.tokens == [[1, 2], [1, 2, 3]]
    for layer in (first, second):
        for t in (layer.keys, layer.values):
            assert (t[1, :3] == 2).all() and (t[0, :2] == 0).all()


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
@pytest.mark.parametrize("params", [LOSSLESS, TYPICAL], ids=["lossless", "typical"])
def test_preallocated_cache_decodes_what_the_compacting_cache_decoded(engine, suite, params) -> None:
    """The speed change (preallocated buffers, cursors, slot refill) changes no token, count or
    extra against the cache it replaced (tests/support/compact_row_cache.py), in float64."""
    prompts, cfg = suite.prompts()[:64], SpecConfig.from_params(params)

    def run(row_cache) -> list:
        requests = [engine._request(p, cfg) for p in prompts]
        engine.decode(requests, cfg, row_cache=row_cache)
        return [(r.tokens, r.counts) for r in requests]

    assert run(RowCache) == run(CompactRowCache)


@pytest.mark.slow  # decodes: 1.5-7 s of CPU here, out of the inner loop's 60 s
def test_preallocated_cache_greedy_equals_the_compacting_cache(engine, suite) -> None:
    """The quantized engine's greedy loop, on the float64 target: the same tokens and forwards."""
    prompts = suite.prompts()[:64]

    def run(row_cache) -> list:
        requests = [engine._request(p, SpecConfig.from_params(LOSSLESS)) for p in prompts]
        greedy(engine.target, requests, engine.pad_id, row_cache=row_cache)
        return [(r.tokens, r.counts) for r in requests]

    assert run(RowCache) == run(CompactRowCache)


def test_forwards_equal_the_target_calls_and_tokens_stop_at_eos(engine, suite) -> None:
    calls = {"target": 0, "draft": 0}
    hooks = [
        # the engine calls each model's decoder, then its head (not the wrapping ForCausalLM)
        engine.target.get_decoder().register_forward_pre_hook(lambda *_: calls.__setitem__("target", calls["target"] + 1)),
        engine.draft.get_decoder().register_forward_pre_hook(lambda *_: calls.__setitem__("draft", calls["draft"] + 1)),
    ]
    try:
        for prompt in suite.prompts()[:6]:
            calls.update(target=0, draft=0)
            gen = engine.generate([prompt], TYPICAL)[0]
            assert gen.forwards == calls["target"]
            assert gen.extra["draft_forwards"] == calls["draft"] == GAMMA * gen.forwards
            assert gen.tokens <= (GAMMA + 1) * gen.forwards
            n = len(engine.tokenizer(gen.text).input_ids)
            assert gen.tokens == n + 1 or gen.tokens == n == DEFAULTS["max_new_tokens"]  # the text, then one EOS
    finally:
        for hook in hooks:
            hook.remove()


def test_max_new_tokens_caps_the_output(engine, suite) -> None:
    for gen in engine.generate(suite.prompts()[:8], {**TYPICAL, "max_new_tokens": 7}):
        assert gen.tokens <= 7
        assert gen.forwards <= 7


def test_draft_with_a_different_tokenizer_is_rejected(tmp_path) -> None:
    draft = tmp_path / "draft"
    shutil.copytree(AR_DRAFT, draft)
    spec = json.loads((draft / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (draft / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError) as info:
        SpeculativeEngine(target=AR_TARGET, draft=draft, device="cpu")
    message = str(info.value)
    assert "engine_args.draft" in message and str(draft) in message and "'a'" in message
    with pytest.raises(ValueError) as info:  # at prepare time, from the tokenizer files (the test is model-free)
        SpeculativeEngine.check_engine_args({"target": str(AR_TARGET), "draft": str(draft)})
    assert "engine_args.draft" in str(info.value) and "'a'" in str(info.value)
    assert SpeculativeEngine.check_engine_args({"target": str(AR_TARGET), "draft": str(AR_DRAFT)}) is None


def test_a_padding_id_is_never_picked_when_the_vocabularies_differ_only_by_padding(engine, suite, tmp_path) -> None:
    """A draft whose embedding has no padding rows (83 ids, the tokenizer's) beside the target's
    96: the target's head is rigged to score padding id 95 highest. The engine never picks a
    padding id (the draft has no row for it), and decodes what it decodes unrigged."""
    from transformers import AutoModelForCausalLM

    small = tmp_path / "draft-83"
    shutil.copytree(AR_DRAFT, small)
    model = AutoModelForCausalLM.from_pretrained(AR_DRAFT)
    model.resize_token_embeddings(len(engine.tokenizer))
    model.save_pretrained(small)
    spec = SpeculativeEngine(target=AR_TARGET, draft=small, device="cpu", dtype="float64")
    assert spec.tokens == len(engine.tokenizer) == 83 and spec.target.get_output_embeddings().weight.shape[0] == 96
    prompts = suite.prompts()[:8]
    clean = spec.generate(prompts, LOSSLESS)

    def rig(module, args, out):
        out = out.clone()
        out[..., 95] = out.max() + 100.0
        return out

    hook = spec.target.get_output_embeddings().register_forward_hook(rig)
    try:
        rigged = spec.generate(prompts, LOSSLESS)
    finally:
        hook.remove()
    assert [(g.text, g.tokens) for g in rigged] == [(g.text, g.tokens) for g in clean]
    assert all(g.text for g in rigged)


def test_bad_threads_is_a_value_error_naming_the_engine_arg() -> None:
    with pytest.raises(ValueError, match=r"speculative: engine_args.threads: expected int >= 1 or null, got 0"):
        SpeculativeEngine(device="cpu", threads=0)


def test_describe_names_both_models_and_the_runtime() -> None:
    engine = SpeculativeEngine(device="cpu")
    info = engine.describe()
    assert info["target"] == str(AR_TARGET) and info["draft"] == str(AR_DRAFT)
    assert info["device"] == "cpu" and info["dtype"] == "float32" and info["torch"] == torch.__version__
    assert len(engine.fingerprint()) == 64


def test_gate_certifies_a_speculative_grid_end_to_end(pytester, run_gate) -> None:
    pytester.makefile(".yaml", spec=GATE_GRID.format(target=AR_TARGET, draft=AR_DRAFT))
    result = run_gate("--redline-alpha=0.1", "--redline-grid", "spec.yaml")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*n=32 prompts, m=2 configs, cost apf*", "R* lossless *", "* eps0.05 *", "*CERTIFIED (speculative-tiny, select)*"])


GATE_GRID = """\
name: speculative-tiny
suite: arithmetic
suite_args: {{split: calibration, n: 32, seed: 0}}
engine: speculative
engine_args: {{target: {target}, draft: {draft}, device: cpu, dtype: float32, threads: 1}}
cost: apf
reference: lossless
configs:
  lossless: {{acceptance: lossless, num_draft_tokens: 4}}
  eps0.05: {{acceptance: typical, posterior_threshold: 0.05, num_draft_tokens: 4}}
deploy: fastest
batch_size: 32
"""


@pytest.mark.parametrize("params", [LOSSLESS, TYPICAL], ids=["lossless", "typical"])
def test_stop_string_ends_the_request_with_tokens_through_the_cut(engine, suite, params) -> None:
    """Prompt.stop: the text before the first stop string; the tokens through the one that
    completes it (one token fewer shows no stop string); finish_reason stop. Without stop
    strings the reason is eos or length."""
    prompts = suite.prompts()[:16]
    full = engine.generate(prompts, params)
    assert {g.finish_reason for g in full} <= {"eos", "length"}
    stopped = [dataclasses.replace(p, stop=(",",)) for p in prompts]
    cut = engine.generate(stopped, params)
    cfg = SpecConfig.from_params(params)
    requests = [engine._request(p, cfg) for p in stopped]
    engine.decode(requests, cfg)
    decode = engine.tokenizer.decode
    assert sum(g.finish_reason == "stop" for g in cut) >= 8
    for whole, g, req in zip(full, cut, requests):
        assert (g.tokens, g.finish_reason) == (len(req.output), req.finish_reason)
        if g.finish_reason != "stop":
            assert (g.text, g.tokens, g.forwards) == (whole.text, whole.tokens, whole.forwards) and "," not in whole.text
            continue
        assert g.text == whole.text.split(",")[0] and g.tokens <= whole.tokens and g.forwards <= whole.forwards
        assert "," in decode(req.output) and "," not in decode(req.output[:-1])


def test_old_helper_names_warn():
    """encode, eos_ids and set_threads moved to engines/common.py; the old names still import from
    autoregressive until pytest-redline 0.2, with a DeprecationWarning naming the new place."""
    from pytest_redline.engines import autoregressive, common

    for name in ("encode", "eos_ids", "set_threads"):
        with pytest.warns(DeprecationWarning, match=rf"autoregressive\.{name} moved to pytest_redline\.engines\.common\.{name}"):
            assert getattr(autoregressive, name) is getattr(common, name)
