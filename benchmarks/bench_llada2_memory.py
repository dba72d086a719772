"""Peak memory of loading a bf16 LLaDA2 checkpoint: no float32 copy, no second copy of the weights.

    python benchmarks/bench_llada2_memory.py [--keep DIR]

Builds a random LLaDA2.0 folder in the published layout, bf16, sharded (4 shards and an index),
of at least 1 GiB (hidden 1024, 1 dense + 5 MoE layers of 64 experts, vocabulary 32,768), then
loads it in a fresh subprocess through the engines' loader (``checkpoints.load``, CPU, bf16).
The subprocess takes its baseline ``ru_maxrss`` after ``import torch`` and the engine modules,
loads, and reports the peak again. Printed: the checkpoint's size, the rise of the peak over the
baseline, and their ratio (target <= 1.2: the weights are read into the allocated parameters).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = {
    "hidden_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
    "intermediate_size": 2816, "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 512, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 1,
}
BUILD = """
import json, sys
sys.path.insert(0, sys.argv[2])
import make_tiny_checkpoints
make_tiny_checkpoints.llada2(sys.argv[1], base=100, vocab_size=32768, std=0.02, shards=4, dtype="bfloat16", **json.loads(sys.argv[3]))
"""
CHILD = """
import json, resource, sys
import torch
from pytest_redline.engines import checkpoints, llada2_load, llada2_model
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, tokenizer = checkpoints.load(checkpoints.read_checkpoint(sys.argv[1]), "cpu", "bfloat16")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
dtypes = sorted({str(t.dtype) for t in model.state_dict().values()})
print(json.dumps({"before_kib": before, "after_kib": after, "dtypes": dtypes}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", default=None, help="build the folder here and keep it (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp) / "llada2-1gib"
        if not (folder / "model.safetensors.index.json").is_file():
            # built in its own process: Linux carries ru_maxrss across fork and exec, so the
            # measuring process must start from this small one (which never imports torch)
            subprocess.run([sys.executable, "-c", BUILD, str(folder), str(ROOT / "benchmarks"), json.dumps(SHAPE)], check=True,
                           capture_output=True)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        out = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    rise = (result["after_kib"] - result["before_kib"]) * 1024
    print(f"checkpoint: {size / 2**30:.3f} GiB bf16 in 4 shards; loaded dtypes {result['dtypes']}")
    print(f"ru_maxrss after import torch {result['before_kib'] / 2**20:.3f} GiB, after the load {result['after_kib'] / 2**20:.3f} GiB")
    print(f"rise {rise / 2**30:.3f} GiB = {rise / size:.3f} x the checkpoint (target <= 1.2)")


if __name__ == "__main__":
    main()
