"""Self-distillation of a block-diffusion checkpoint toward committing more tokens per forward.

    python -m training distill --out engines/models/bd-tiny-distilled

The paper's recipe ("distilled toward committing more tokens in each forward, on multi-block
targets that the engine decodes with its own confidence rule"), in four steps:

1. **Decode.** The multi-block engine (``engines/block_diffusion.py``) decodes ``n`` distinct
   problems of the arithmetic suite's *train* split with the teacher checkpoint, with the decoding
   settings given as arguments (``--params``, the engine's config parameters as in a grid; default:
   the reference of ``redline.yaml``, acc95/semi90, block 8, buffer 2), in batches of
   ``--decode-batch-size`` (default 64, that grid's), in prompt order. The train split is disjoint from calibration and
   test by construction: ``suites/arithmetic.py`` puts a problem in a split by a hash of its text
   (80 % train, 10 % calibration, 10 % test), and ``ArithmeticSuite(split="train")`` draws only
   problems whose hash says train; this command checks that hash again for every target.
2. **Keep** the decoded answers as targets: ``--keep correct`` (the default) keeps those whose
   final answer is right, ``--keep all`` every answer that ended with an EOS. Correct-only is the
   default because the certainty term below sharpens whatever it is trained on: on a wrong target
   it would make the teacher's mistakes confident, and a confident mistake is committed at every
   threshold, which is exactly a violation of the gate.
3. **Fine-tune** from the teacher with ``training/train.py``'s loop and its block-diffusion loss,
   on the targets (``TrainConfig.targets``), at the decode config's block size, with mostly
   masked blocks (``mask_floor``: the masking ratio is U(floor, 1), as a block the engine has just
   admitted is all MASK) and the certainty term (``confidence_weight``: the entropy of the
   predictions that are already right, dParallel's certainty forcing). Both push the model to be
   sure of several positions of a block at once, which is what lets a confidence rule commit
   them in one forward.
4. **Write** the checkpoint folder (``save_pretrained``) with ``training.json`` (the teacher and
   its weights' sha256, the decoding settings, the engine's source and git commit, the data and the
   training record) and ``SHA256SUMS``. ``MODEL_CARD.md`` is written by hand and survives reruns.

Any ``TrainConfig`` option (``--steps``, ``--lr``, ``--mask-floor``, ...) may follow; the defaults
here are the recipe of the shipped ``bd-tiny-distilled``. Deterministic on a given machine: the
decode is greedy in fixed batches, training is seeded on one thread.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pytest_redline import contracts
from pytest_redline.engines import block_diffusion, common, diffusion_spec, modeling, runtime
from pytest_redline.engines.block_diffusion import BlockDiffusionEngine
from pytest_redline.engines.diffusion_spec import DecodeConfig
from pytest_redline.suites.arithmetic import ArithmeticSuite, split_of
from training import train

KEEP = ("correct", "all")
# redline.yaml's reference config acc95/semi90 (the engine's defaults), which decoded the shipped targets
REFERENCE_PARAMS = {"accept_threshold": 0.95, "semi_complete_threshold": 0.90}
# The modules a block-diffusion decode runs, by their path in the repository (training.json's
# decode.source; bd-tiny-distilled's record predates engines/common.py and lists autoregressive.py)
ENGINE_SOURCES = {
    "engines/block_diffusion.py": block_diffusion, "engines/diffusion_spec.py": diffusion_spec,
    "engines/modeling.py": modeling, "engines/common.py": common, "pytest_redline/contracts.py": contracts,
}


@dataclass
class DistillConfig:
    out: str = "engines/models/bd-tiny-distilled"
    teacher: str = ""  # default: the shipped engines/models/bd-tiny
    params: dict = field(default_factory=lambda: dict(REFERENCE_PARAMS))  # the decoding settings
    decode_batch_size: int = 64
    device: str = "auto"
    n: int = 2048  # distinct train-split problems decoded
    data_seed: int = 0  # of the train-split problems (--seed is the training seed)
    keep: str = "correct"


HELP = {
    "out": "the checkpoint folder to write (default %(default)s)",
    "teacher": "the checkpoint to decode with and start from (default: the shipped engines/models/bd-tiny)",
    "params": "the decoding settings, a JSON object of the block_diffusion engine's parameters as a "
              "grid config gives them (default: %(default)s, redline.yaml's reference)",
    "decode_batch_size": "prompts decoded per batch (default %(default)s)",
    "device": "auto, cpu or cuda (default %(default)s)",
    "n": "distinct train-split problems to decode (default %(default)s)",
    "data_seed": "seed of the train-split problems (default %(default)s; --seed seeds training)",
    "keep": "correct: right answers only (default); all: every answer that ended with an EOS",
}

# The training recipe of bd-tiny-distilled (train.py's options override it).
RECIPE = train.TrainConfig(
    steps=200, lr=5e-4, min_lr=1e-4, warmup=20, causal_warmup=0, mask_floor=0.5,
    confidence_weight=0.5, eval_every=100, seed=0,
)


@dataclass(frozen=True)
class Targets:
    """The kept targets, as ``Problem`` records with the decoded text as the solution."""

    rows: list[dict]
    decoded: int
    correct: int
    ended: int  # answers that ended with an EOS (not cut at max_new_tokens)
    tokens: int
    forwards: int


def decode_targets(engine: BlockDiffusionEngine, params: dict, cfg: DistillConfig, batch_size: int) -> Targets:
    """Step 1 and 2: decode the train split's problems and keep the targets ``cfg.keep`` names."""
    suite = ArithmeticSuite(split="train", n=cfg.n, seed=cfg.data_seed)
    problems, prompts = suite.problems(), suite.prompts()
    leaked = [p.prompt for p in problems if split_of(p.prompt) != "train"]
    if leaked:  # the suite's own guarantee, checked again: no calibration or test problem is a target
        raise AssertionError(f"arithmetic: train split holds non-train problems {leaked[:3]}")
    limit = DecodeConfig.from_params(params).max_new_tokens
    rows, correct, ended, tokens, forwards = [], 0, 0, 0, 0
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        for problem, prompt, gen in zip(problems[start:], batch, engine.generate(batch, params)):
            right = suite.score(prompt, gen.text)
            eos = gen.finish_reason in ("eos", "stop") or (gen.finish_reason is None and gen.tokens < limit)
            correct, ended = correct + right, ended + eos
            tokens, forwards = tokens + gen.tokens, forwards + gen.forwards
            if right if cfg.keep == "correct" else eos:
                rows.append({**dataclasses.asdict(problem), "solution": gen.text})
    return Targets(rows, len(prompts), correct, ended, tokens, forwards)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def engine_source() -> dict:
    """The engine code that decoded the targets: the sha256 of each module as imported, the last
    commit touching them in the git checkout at the working directory, and whether the imported
    files are exactly that checkout's committed ones."""
    files = {name: Path(module.__file__) for name, module in ENGINE_SOURCES.items()}
    record: dict = {name: sha256_file(path) for name, path in files.items()}

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    record["commit"] = git("log", "-1", "--format=%H", "--", *files) or "unknown (not a git checkout)"
    record["files_match_commit"] = all(
        git("hash-object", str(path)) == git("rev-parse", f"HEAD:{name}") != "" for name, path in files.items()
    )
    return record


def relative(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (records stay portable)."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def write_sums(folder: Path) -> None:
    """SHA256SUMS: every file of the folder but itself and the hand-written model card."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in ("SHA256SUMS", "MODEL_CARD.md"))
    (folder / "SHA256SUMS").write_text("".join(f"{sha256_file(folder / n)}  {n}\n" for n in names))


def distill(cfg: DistillConfig, recipe: train.TrainConfig) -> dict:
    """Decode, keep, fine-tune, write; returns the ``distillation`` record of training.json."""
    if cfg.keep not in KEEP:
        raise ValueError(f"distill: --keep: expected one of {list(KEEP)}, got {cfg.keep!r}")
    params = dict(cfg.params)
    DecodeConfig.from_params(params)  # a bad setting fails here, before the teacher loads
    torch.set_num_threads(recipe.threads)
    engine = BlockDiffusionEngine(model=cfg.teacher or runtime.EMBEDDED_MODEL, device=cfg.device, threads=recipe.threads)
    targets = decode_targets(engine, params, cfg, cfg.decode_batch_size)
    print(f"decoded {targets.decoded} train problems: {targets.correct} correct, kept {len(targets.rows)} "
          f"({cfg.keep}); TPF {targets.tokens / targets.forwards:.3f}", flush=True)

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "targets.jsonl"
        path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in targets.rows))
        recipe = dataclasses.replace(
            recipe, out=cfg.out, init=relative(engine.path), targets=str(path),
            block_sizes=(DecodeConfig.from_params(params).block_size,),
        )
        train.train(recipe)
        data_sha = sha256_file(path)
    record = {
        "teacher": {"model": relative(engine.path), "weights_sha256": engine.fingerprint()},
        "decode": {"engine": engine.name, "params": params, "batch_size": cfg.decode_batch_size,
                   "source": engine_source()},
        "data": {"suite": "arithmetic", "split": "train", "n": cfg.n, "seed": cfg.data_seed, "keep": cfg.keep,
                 "decoded": targets.decoded, "correct": targets.correct, "ended_with_eos": targets.ended,
                 "kept": len(targets.rows), "teacher_tpf": round(targets.tokens / targets.forwards, 4),
                 "targets_sha256": data_sha},
        "command": dataclasses.asdict(cfg),
    }
    out = Path(cfg.out)
    training = json.loads((out / "training.json").read_text())
    training["config"]["targets"] = "decoded to a temporary file: distillation.data"
    (out / "training.json").write_text(json.dumps({"distillation": record, **training}, indent=1) + "\n")
    write_sums(out)
    return record


def json_object(text: str) -> dict:
    """``--params``: a JSON object (argparse turns the error into a usage message, exit 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training distill",
                                     description=__doc__.split("\n\n")[0], add_help=False)
    for f in dataclasses.fields(DistillConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if f.name == "params":
            parser.add_argument(flag, type=json_object, default=json.dumps(REFERENCE_PARAMS), help=HELP[f.name])
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=HELP[f.name],
                                **({"choices": KEEP} if f.name == "keep" else {}))
    ns, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # the distill options, then train.py's (its parser exits)
        parser.print_help()
        print("\ntraining options (training/train.py; defaults: this recipe's):")
    cfg = DistillConfig(**vars(ns))
    try:
        DecodeConfig.from_params(cfg.params)
    except ValueError as error:  # the engine's own message names the key and what it expects
        parser.error(f"--params: {error}")
    recipe = train.parse_args(rest, defaults=RECIPE, prog=parser.prog + " [distill options]")
    distill(cfg, recipe)

