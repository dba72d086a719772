"""Forward speed of our native LLaDA2 model against the published modeling code, on CPU.

    python benchmarks/bench_llada2_forward.py [--threads 1] [--repeats 5]

One random LLaDA2.0 folder in the published layout (64 experts, 8 per token, 8 groups, top 4
groups, one shared expert, 1 dense + 3 MoE layers, hidden 256) is loaded by our loader and,
strictly, by the published ``LLaDA2MoeModelLM`` (through the test shim tests/support/peers_llada2.py,
which needs ../shared/reference/peers). Both run float32, under ``torch.no_grad``, on a batch
of 16 x 64 tokens with a block-causal mask (blocks of 32). The two forwards alternate; each
side's best of ``--repeats`` is kept, in wall time and in the process's CPU time, and the ratio
ours / peer is printed for both (target <= 1.05). The logits are compared first.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

SHAPE = {
    "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 128, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 1,
}
BATCH, LENGTH, BLOCK = 16, 64, 32


def best_of(calls: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Each callable's best (wall, CPU) seconds over ``repeats`` rounds, the callables alternating
    within a round. CPU time (the process's) is the fairer figure on a shared machine: other
    processes' load stretches the wall clock, not this process's CPU time."""
    best = {name: (float("inf"), float("inf")) for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import make_tiny_checkpoints
    import peers_llada2

    from pytest_redline.engines import checkpoints
    from pytest_redline.engines.modeling import block_causal_mask

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_checkpoints.llada2(Path(tmp) / "llada2", base=100, vocab_size=1024, std=0.05, **SHAPE)
        ours, _ = checkpoints.load(checkpoints.read_checkpoint(folder), "cpu", "float32")
        peer = peers_llada2.peer_model(folder, "2.0", torch.float32)
    ids = torch.randint(0, 100, (BATCH, LENGTH), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(LENGTH).expand(BATCH, -1)
    mask = block_causal_mask(pos, pos, BLOCK, torch.float32)
    with torch.no_grad():
        mine, theirs = ours(ids, attention_mask=mask, position_ids=pos).logits, peer(ids, attention_mask=mask, position_ids=pos).logits
        difference = (mine - theirs).abs().max().item()
        best = best_of({
            "ours": lambda: ours(ids, attention_mask=mask, position_ids=pos),
            "peer": lambda: peer(ids, attention_mask=mask, position_ids=pos),
        }, args.repeats)
    print(f"torch {torch.__version__}  threads {args.threads}  float32  batch {BATCH} x {LENGTH}  "
          f"{SHAPE['num_experts']} experts, top-{SHAPE['num_experts_per_tok']}, {SHAPE['num_hidden_layers']} layers")
    print(f"max |logit difference| {difference:.2e}")
    for i, what in enumerate(("wall", "CPU")):
        ours_s, peer_s = best["ours"][i], best["peer"][i]
        print(f"{what:>4}: ours {ours_s * 1000:.1f} ms   peer {peer_s * 1000:.1f} ms   ours / peer {ours_s / peer_s:.3f} "
              f"(best of {args.repeats}, alternating)")

if __name__ == "__main__":
    main()
