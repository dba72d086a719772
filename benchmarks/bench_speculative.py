"""Speculative decoding, measured in one run on the embedded target and draft.

    python benchmarks/bench_speculative.py [--n 512] [--peer-n 128] [--threads 1]

1. Each config of grids/speculative.yaml against ``lossless``: accepted tokens per target forward,
   target forwards, draft forwards and wall time (batches of the grid's batch size), as ratios.
2. The draft's agreement with the target: the share of positions of the target's greedy outputs
   where the draft's argmax (given the same prefix) is the target's token.
3. Our ``lossless`` engine against transformers' assisted generation
   (``target.generate(..., assistant_model=draft)``, greedy, the same number of draft tokens, a
   constant schedule and no confidence cut-off), on the same models and prompts: the outputs must
   be identical; we print the wall-time ratio for our batched engine and for ours one prompt at a
   time (transformers' assisted generation takes one prompt per call).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from pytest_redline.engines.speculative import SpeculativeEngine
from pytest_redline.grid import load_grid
from pytest_redline.suites.arithmetic import ArithmeticSuite
from timing import generate_timed

GRID = Path(__file__).resolve().parents[1] / "grids" / "speculative.yaml"


run = generate_timed


def agreement(engine, prompts, outputs) -> tuple[int, int]:
    """Positions of the target's greedy outputs where the draft's argmax is the target's token."""
    agree = total = 0
    with torch.no_grad():
        for prompt, gen in zip(prompts, outputs):
            ids = engine.tokenizer(prompt.text).input_ids
            out = engine.tokenizer(gen.text).input_ids + [engine.tokenizer.eos_token_id]
            out = out[: gen.tokens]
            logits = engine.draft(torch.tensor([ids + out[:-1]], device=engine.device)).logits[0, len(ids) - 1 :]
            agree += int((logits.argmax(-1).cpu() == torch.tensor(out)).sum())
            total += len(out)
    return agree, total


def assisted(engine, prompts, gamma: int, max_new_tokens: int):
    """transformers' assisted generation, one prompt per call; returns texts and wall time."""
    tok = engine.tokenizer
    engine.draft.generation_config.num_assistant_tokens = gamma
    engine.draft.generation_config.num_assistant_tokens_schedule = "constant"
    engine.draft.generation_config.assistant_confidence_threshold = 0.0
    texts = []
    start = time.perf_counter()
    for prompt in prompts:
        ids = tok(prompt.text, return_tensors="pt").input_ids
        out = engine.target.generate(
            ids,
            assistant_model=engine.draft,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )[0, ids.shape[1] :].tolist()
        texts.append(tok.decode(out[: out.index(tok.eos_token_id)] if tok.eos_token_id in out else out))
    return texts, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="calibration prompts for the config sweep")
    parser.add_argument("--peer-n", type=int, default=128, help="prompts for the comparison with assisted generation")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    grid = load_grid(GRID)
    engine = SpeculativeEngine(**{**grid.engine_args, "threads": args.threads})
    prompts = ArithmeticSuite(split="calibration", n=args.n, seed=0).prompts()
    print(f"{grid.name}: {args.n} prompts, batch {grid.batch_size}, {engine.describe()['device']}, {args.threads} threads")

    results = {c.name: run(engine, prompts, c.params, grid.batch_size) for c in grid.configs}
    ref_gens, ref_wall = results[grid.reference]
    ref_fwd = sum(g.forwards for g in ref_gens)
    print(f"{'config':<10} {'apf':>6} {'target fwd':>11} {'ratio':>6} {'draft fwd':>10} {'wall s':>7} {'ratio':>6} {'same text':>9}")
    for name, (gens, wall) in results.items():
        apf = sum(g.tokens / g.forwards for g in gens) / len(gens)
        fwd = sum(g.forwards for g in gens)
        draft = sum(g.extra["draft_forwards"] for g in gens)
        same = sum(g.text == r.text for g, r in zip(gens, ref_gens)) / len(gens)
        print(f"{name:<10} {apf:6.3f} {fwd:11d} {fwd / ref_fwd:6.3f} {draft:10.0f} {wall:7.2f} {wall / ref_wall:6.3f} {same:9.1%}")

    agree, total = agreement(engine, prompts, ref_gens)
    print(f"draft agrees with the target's greedy token at {agree}/{total} positions ({agree / total:.1%})")

    lossless = next(c.params for c in grid.configs if c.name == grid.reference)
    gamma = lossless.get("num_draft_tokens", 4)
    peers = prompts[: args.peer_n]
    theirs, their_wall = assisted(engine, peers, gamma, max_new_tokens=96)
    ours, our_wall = run(engine, peers, lossless, grid.batch_size)
    single, single_wall = run(engine, peers, lossless, 1)
    same = sum(a.text == b for a, b in zip(ours, theirs))
    print(f"\nlossless vs transformers assisted generation (gamma {gamma}, {len(peers)} prompts):")
    print(f"  identical outputs: {same}/{len(peers)}")
    print(f"  wall: assisted {their_wall:.2f}s, ours batched {our_wall:.2f}s (ratio {our_wall / their_wall:.3f}), "
          f"ours one prompt at a time {single_wall:.2f}s (ratio {single_wall / their_wall:.3f})")
    if same != len(peers) or [g.text for g in single] != theirs:
        raise SystemExit("lossless output differs from transformers' assisted generation")


if __name__ == "__main__":
    main()
