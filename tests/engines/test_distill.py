"""The distillation command (training/distill.py), its training terms (training/train.py) and the
shipped checkpoint grid (grids/checkpoints.yaml). No training runs here: the decode step runs on a
fake engine, the loss terms on small tensors, and the shipped folder is checked by its files."""
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from pytest_redline.contracts import Generation
from pytest_redline.engines.diffusion_spec import DecodeConfig
from pytest_redline.grid import load_grid
from pytest_redline.suites.arithmetic import Problem, split_of
from training import distill, train

pytestmark = pytest.mark.slow  # training: imports torch and training.distill, which loads transformers' model classes (~5 s of CPU)

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "grids" / "checkpoints.yaml"
DISTILLED = ROOT / "engines" / "models" / "bd-tiny-distilled"


class Teacher:
    """Answers every other prompt with the suite's own solution, the rest with a wrong answer; the
    last prompt of each batch runs into max_new_tokens (no EOS)."""

    def __init__(self):
        self.seen = []

    def generate(self, prompts, params):
        self.seen += [p.text for p in prompts]
        gens = []
        for i, p in enumerate(prompts):
            text = p.meta["solution"] if i % 2 == 0 else p.meta["solution"] + "1"
            cut = i == len(prompts) - 1
            gens.append(Generation(text=text, tokens=96 if cut else len(text) + 1, forwards=4, extra={}))
        return gens


@pytest.mark.parametrize("keep", distill.KEEP)
def test_train_split_only_targets_keep(keep):
    teacher = Teacher()
    targets = distill.decode_targets(teacher, {}, distill.DistillConfig(n=40, data_seed=3, keep=keep), batch_size=16)
    assert all(split_of(text) == "train" for text in teacher.seen)  # no calibration or test prompt decoded
    assert (targets.decoded, targets.correct, targets.ended) == (40, 20, 37)
    rows = targets.rows
    if keep == "correct":
        assert len(rows) == 20 and all(r["solution"].endswith(f"#{r['answer']}") for r in rows)
    else:  # every answer that ended with an EOS, right or wrong
        assert len(rows) == 37
    assert all(Problem(**r).split == "train" for r in rows)


def test_roundtrip_target_stream(tmp_path):
    rows = [dataclasses.asdict(Problem("add", f"{a}+1=", f"s{a}", a + 1)) for a in range(10, 17)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stream = train.target_stream(str(path), seed=5)
    first, second = ([next(stream) for _ in rows] for _ in range(2))
    assert sorted(p.prompt for p in first) == sorted(r["prompt"] for r in rows) == sorted(p.prompt for p in second)
    again = train.target_stream(str(path), seed=5)
    assert [next(again) for _ in rows] == first  # seeded: the same order for the same seed
    assert first[0] == Problem(**next(r for r in rows if r["prompt"] == first[0].prompt))


def test_clear_error_empty_targets(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: --targets"):
        next(train.target_stream(str(path), seed=0))


@settings(deadline=None, max_examples=30)
@given(st.integers(2, 9), st.integers(0, 2**16))
def test_certainty_bounds(vocab, seed):
    """The certainty term is 0 for confident right predictions, ignores wrong ones, and is at most
    log(vocab)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, vocab, generator=gen, dtype=torch.float64) * 3
    target = torch.randint(vocab, (12,), generator=gen)
    value = float(train.certainty(logits, target))
    assert 0.0 <= value <= torch.log(torch.tensor(float(vocab))).item() + 1e-9
    wrong = (logits.argmax(-1) + 1) % vocab
    assert float(train.certainty(logits, wrong)) == 0.0
    sure = torch.full((12, vocab), -50.0, dtype=torch.float64).scatter(1, target[:, None], 50.0)
    assert float(train.certainty(sure, target)) < 1e-12


def test_recipe_defaults_keep_bd_tiny_objective():
    """The new terms are off by default, so bd-tiny's recorded recipe trains as before."""
    cfg = train.TrainConfig()
    assert (cfg.targets, cfg.mask_floor, cfg.confidence_weight) == ("", 0.0, 0.0)
    assert train.parse_args([]) == cfg
    assert train.parse_args(["--steps", "7"], defaults=distill.RECIPE) == dataclasses.replace(distill.RECIPE, steps=7)


def test_grid_configs_checkpoints_yaml():
    """{base, distilled} x the same thresholds; distilled configs name the distilled folder, base
    ones the grid's bd-tiny; the reference is the base checkpoint at the engine defaults."""
    grid = load_grid(GRID)
    specs = {s.name: s for s in grid.configs}
    base = {n.split("/", 1)[1] for n in specs if n.startswith("base/")}
    assert base == {n.split("/", 1)[1] for n in specs if n.startswith("distilled/")} and len(base) >= 3
    assert grid.reference.startswith("base/") and grid.deploy == "fastest"
    assert DecodeConfig.from_params(specs[grid.reference].params) == DecodeConfig.from_params({})
    for name, spec in specs.items():
        model = Path((spec.engine_args or grid.engine_args)["model"])
        assert model.name == ("bd-tiny-distilled" if name.startswith("distilled/") else "bd-tiny"), name
        DecodeConfig.from_params(spec.params)


def test_integrity_shipped_distilled_checkpoint():
    """Under 20 MB; SHA256SUMS lists every file but itself and the card, and they match; the
    training record names its teacher, its decode config and its data."""
    files = {p.name: p for p in DISTILLED.iterdir() if p.is_file()}
    assert sum(p.stat().st_size for p in files.values()) <= 20 * 2**20
    sums = dict(reversed(line.split("  ")) for line in (DISTILLED / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == set(files) - {"SHA256SUMS", "MODEL_CARD.md"}
    for name, digest in sums.items():
        assert hashlib.sha256(files[name].read_bytes()).hexdigest() == digest, name
    record = json.loads(files["training.json"].read_text())["distillation"]
    assert record["teacher"]["model"].endswith("bd-tiny") and record["decode"]["config"]
    assert record["data"]["split"] == "train" and record["data"]["kept"] > 0


@pytest.mark.slow  # trains
def test_roundtrip_distill_folder(tmp_path, monkeypatch):
    """The whole command from bd-tiny (8 problems, 2 steps of batch 4): the folder loads through
    the Auto classes, SHA256SUMS matches it, and training.json names the teacher by its weights'
    hash, the decode config and the data."""
    from transformers import AutoModelForCausalLM

    from pytest_redline.engines import runtime

    teacher = runtime.EMBEDDED_MODEL
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    cfg = distill.DistillConfig(
        out=str(tmp_path / "out"), teacher=str(teacher), params={"accept_threshold": 0.5}, decode_batch_size=4,
        device="cpu", n=8,
    )
    recipe = dataclasses.replace(distill.RECIPE, steps=2, eval_every=2, batch_size=4, pool_batches=2)
    try:
        record = distill.distill(cfg, recipe)
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "out"
    AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    saved = json.loads((out / "training.json").read_text())
    assert saved["distillation"] == json.loads(json.dumps(record))
    assert record["teacher"]["weights_sha256"] == runtime.fingerprint(teacher)
    assert record["decode"]["params"] == {"accept_threshold": 0.5} and record["decode"]["batch_size"] == 4
    source = record["decode"]["source"]
    assert all(len(source[name]) == 64 for name in distill.ENGINE_SOURCES)  # each module's sha256
    assert isinstance(source["files_match_commit"], bool) and source["commit"]
    assert record["data"]["decoded"] == 8 and record["data"]["kept"] == record["data"]["correct"] > 0
    assert saved["step"] == 2 and saved["config"]["block_sizes"] == [8]
