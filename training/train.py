"""Train the embedded block-diffusion Llama on the arithmetic suite's train split.

    python -m training train --out engines/models/bd-tiny --steps 1000 --causal-warmup 500 --seed 0

Read top to bottom: the config, the data, the objective, the loop. Deterministic for a seed on a
given machine (fixed thread count, seeded data stream, seeded noise).

The block-diffusion objective (``objective = "bd"``) trains every block of a sequence at once:
the input is ``[noised copy | clean copy]`` (2L tokens, duplicated position ids) under
``training.model.two_copy_mask``, so noised block k sees itself and the clean blocks before it, which
is "prefix clean, block noised, suffix absent" for each block. Per batch the block size is drawn
from ``block_sizes``; per block the masking ratio is U(0, 1); answer tokens are masked with that
ratio (prompt tokens never are), and a share ``edit_prob`` of the still-visible answer tokens is
replaced by random characters (the token-editing term). The loss is the cross-entropy at the
masked and the edited positions, up to the end of the block holding the first EOS; positions
after the EOS hold EOS, so the model learns to close a block.

The first ``causal_warmup`` steps use block size 1 with every answer token masked: next-token
prediction from the clean prefix, where fetching operand digits is learnt quickly; the
block-diffusion phase then starts from a model that already reads the prompt.

Self-distillation (``python -m training distill``, ``training/distill.py``) runs
this loop on engine-decoded targets (``targets``), with mostly masked blocks (``mask_floor``) and a
certainty term (``confidence_weight``); all three are off by default.

Another objective plugs in as one more entry of ``OBJECTIVES`` (a function of model, batch,
config and generator returning the loss). ``objective = "ar"`` is the ordinary next-token loss
of autoregressive models (the speculative target and draft) on the same data.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from pytest_redline.suites.arithmetic import Problem, stream
from training.model import ModelConfig, build_model, two_copy_mask
from training.tokenizer import SPECIALS, build_tokenizer


@dataclass
class TrainConfig:
    out: str = "engines/models/bd-tiny"
    init: str = ""  # continue from this save_pretrained folder (its weights; a fresh optimizer)
    objective: str = "bd"
    seed: int = 0
    steps: int = 1000
    batch_size: int = 64
    pool_batches: int = 16  # draw this many batches at once and group them by length
    lr: float = 3e-3
    min_lr: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    block_sizes: tuple[int, ...] = (4, 8, 16)
    causal_warmup: int = 500  # first steps: block size 1, every answer token masked (= next-token training)
    edit_prob: float = 0.05
    targets: str = ""  # a JSONL of decoded targets (training/distill.py) that replaces the train stream
    mask_floor: float = 0.0  # per-block masking ratio from U(mask_floor, 1) instead of U(0, 1)
    confidence_weight: float = 0.0  # weight of the certainty term (entropy where the argmax is right)
    eval_every: int = 200
    threads: int = 1  # one thread: deterministic, and robust on a shared CPU
    model: ModelConfig = field(default_factory=ModelConfig)


# ---------------------------------------------------------------------------------------------
# Data


@dataclass
class Batch:
    ids: torch.Tensor  # (batch, L) prompt + answer + EOS, then EOS up to L
    prompt_len: torch.Tensor  # (batch,)
    end: torch.Tensor  # (batch,) index just past the first EOS


def batches(tokenizer, cfg: TrainConfig, split: str = "train", seed: int | None = None):
    """Endless batches of the split (or, for "train", of ``cfg.targets`` when set), each grouped by
    length so that little padding is computed."""
    seed = cfg.seed if seed is None else seed
    problems = target_stream(cfg.targets, seed) if cfg.targets and split == "train" else stream(split, seed)
    rng = random.Random(cfg.seed + 1)
    quantum = max(cfg.block_sizes)
    while True:
        pool = []
        for _ in range(cfg.batch_size * cfg.pool_batches):
            p = next(problems)
            prompt = tokenizer(p.prompt, add_special_tokens=False).input_ids
            answer = tokenizer(p.solution, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            pool.append((prompt, answer))
        pool.sort(key=lambda pa: len(pa[0]) + len(pa[1]))
        groups = [pool[i : i + cfg.batch_size] for i in range(0, len(pool), cfg.batch_size)]
        rng.shuffle(groups)
        for group in groups:
            longest = max(len(p) + len(a) for p, a in group)
            length = math.ceil(longest / quantum) * quantum
            ids = torch.full((len(group), length), tokenizer.eos_token_id, dtype=torch.long)
            for row, (p, a) in enumerate(group):
                ids[row, : len(p) + len(a)] = torch.tensor(p + a)
            yield Batch(
                ids=ids,
                prompt_len=torch.tensor([len(p) for p, _ in group]),
                end=torch.tensor([len(p) + len(a) for p, a in group]),
            )


def target_stream(path: str, seed: int):
    """An endless stream of the decoded targets in ``path`` (one JSON object per line with the
    fields of ``Problem``), every pass in a fresh seeded order."""
    with open(path) as handle:
        targets = [Problem(**json.loads(line)) for line in handle if line.strip()]
    if not targets:
        raise ValueError(f"{path}: --targets: expected at least one decoded target, got none")
    rng = random.Random(seed)
    while True:
        order = list(targets)
        rng.shuffle(order)
        yield from order


# ---------------------------------------------------------------------------------------------
# Objectives


def certainty(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The mean entropy of the predictions whose argmax is already the target (dParallel's
    certainty forcing): lowering it makes right predictions confident enough to commit together."""
    logp = logits.float().log_softmax(-1)
    right = logits.argmax(-1) == target
    entropy = -(logp.exp() * logp).sum(-1)
    return (entropy * right).sum() / right.sum().clamp(min=1)


def bd_loss(model, batch: Batch, cfg: TrainConfig, gen: torch.Generator, mask_id: int, n_special: int, vocab: int):
    """The block-diffusion loss with the token-editing term, over all blocks at once."""
    ids = batch.ids
    n, length = ids.shape
    block_size = cfg.block_sizes[int(torch.randint(len(cfg.block_sizes), (1,), generator=gen))]
    pos = torch.arange(length)
    block = pos // block_size
    answer = pos[None, :] >= batch.prompt_len[:, None]
    last = (torch.div(batch.end - 1, block_size, rounding_mode="floor") + 1) * block_size
    in_loss = answer & (pos[None, :] < last[:, None])

    ratio = torch.rand(n, length // block_size, generator=gen)[:, block]  # per block, U(0, 1)
    if cfg.mask_floor:  # distillation: mostly masked blocks, as the engine sees a newly admitted one
        ratio = cfg.mask_floor + (1 - cfg.mask_floor) * ratio
    if block_size == 1:  # the causal warm-up: each token predicted from the clean tokens before it
        ratio = torch.ones_like(ratio)
    masked = answer & (torch.rand(n, length, generator=gen) < ratio)
    edited = answer & ~masked & (torch.rand(n, length, generator=gen) < cfg.edit_prob)
    noise = torch.randint(n_special, vocab, (n, length), generator=gen)
    noised = torch.where(masked, mask_id, torch.where(edited, noise, ids))

    inputs = torch.cat([noised, ids], dim=1)
    positions = torch.cat([pos, pos])[None].expand(n, -1)
    attn = two_copy_mask(length, block_size, torch.float32).expand(n, -1, -1, -1)
    logits = model(input_ids=inputs, attention_mask=attn, position_ids=positions).logits[:, :length]
    target = (masked | edited) & in_loss
    loss = F.cross_entropy(logits[target], ids[target])
    if cfg.confidence_weight:
        loss = loss + cfg.confidence_weight * certainty(logits[target], ids[target])
    return loss


def ar_loss(model, batch: Batch, cfg: TrainConfig, gen: torch.Generator, *_):
    """The ordinary next-token loss (causal attention) on the answer and its EOS; the prompt is context."""
    ids = batch.ids
    logits = model(input_ids=ids[:, :-1]).logits
    pos = torch.arange(1, ids.shape[1])
    target = (pos[None, :] >= batch.prompt_len[:, None]) & (pos[None, :] < batch.end[:, None])
    return F.cross_entropy(logits[target], ids[:, 1:][target])


OBJECTIVES = {"bd": bd_loss, "ar": ar_loss}


# ---------------------------------------------------------------------------------------------
# Loop


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def save(model, tokenizer, cfg: TrainConfig, step: int, history: list[dict]) -> None:
    """Write the checkpoint folder atomically enough: a sibling temp folder, then a swap."""
    out = Path(cfg.out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {"config": dataclasses.asdict(cfg), "step": step, "torch": torch.__version__, "history": history}
    (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    keep = [f for f in ("MODEL_CARD.md", "SHA256SUMS") if (out / f).exists()]
    for name in keep:  # hand-written files survive a re-save
        shutil.copy(out / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


@torch.no_grad()
def estimate_loss(model, loss_fn, data, cfg: TrainConfig, args) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(cfg.seed + 2)  # the same noise at every evaluation
    losses = [float(loss_fn(model, batch, cfg, gen, *args)) for batch in data]
    model.train()
    return sum(losses) / len(losses)


def train(cfg: TrainConfig) -> None:
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"--objective: expected one of {sorted(OBJECTIVES)}, got {cfg.objective!r}")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = build_tokenizer()
    model = build_model(cfg.model, tokenizer)
    if cfg.init:
        model = AutoModelForCausalLM.from_pretrained(cfg.init, local_files_only=True, dtype=torch.float32)
    model.train()
    loss_fn = OBJECTIVES[cfg.objective]
    args = (tokenizer.mask_token_id, len(SPECIALS), len(tokenizer))
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters; objective {cfg.objective}; seed {cfg.seed}", flush=True)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    data = batches(tokenizer, cfg)
    held_out = [b for _, b in zip(range(4), batches(tokenizer, cfg, split="test", seed=cfg.seed + 3))]
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    start = time.time()
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        phase = dataclasses.replace(cfg, block_sizes=(1,)) if step < cfg.causal_warmup else cfg
        loss = loss_fn(model, next(data), phase, gen, *args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {lr_at(step, cfg):.2e} {time.time() - start:.0f}s", flush=True)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            val = estimate_loss(model, loss_fn, held_out, cfg, args)
            history.append({"step": step + 1, "train_loss": round(loss.item(), 4), "val_loss": round(val, 4),
                            "seconds": round(time.time() - start)})
            print(f"eval step {step + 1} val {val:.4f}", flush=True)
            save(model, tokenizer, cfg, step + 1, history)


def parse_args(argv=None, defaults: TrainConfig | None = None, prog: str | None = None) -> TrainConfig:
    """The command line over ``defaults`` (the bd-tiny recipe's when None)."""
    cfg = defaults or TrainConfig()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model":
            continue
        default = getattr(cfg, f.name)
        if isinstance(default, tuple):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int, nargs="+", default=list(default))
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default)
    for f in dataclasses.fields(ModelConfig):
        default = getattr(cfg.model, f.name)
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default)
    ns = vars(parser.parse_args(argv))
    model = ModelConfig(**{f.name: ns.pop(f.name) for f in dataclasses.fields(ModelConfig)})
    ns["block_sizes"] = tuple(ns["block_sizes"])
    return TrainConfig(**ns, model=model)



def main(argv=None) -> None:
    train(parse_args(argv, prog="python -m training train"))
