"""Published checkpoint folders: family detection, declared values, refusals (exit 4), and gates.

- Detection and the declared values are read model-free, from the published SDAR-4B-Chat folder
  itself (../shared/reference/peers) and from config dictionaries.
- A bad checkpoint (a typo'd path, a LLaDA2 config without its sizes, a missing mask token, an unusable block size) is a
  usage error (exit 4) before any model loads, naming the file and the field.
- The repository's grids/sdar.yaml, dream.yaml and llada.yaml gate a tiny folder in the published
  layout (built by benchmarks/make_tiny_checkpoints.py in a temporary folder) with exit 0; the
  JSON report shows the block size and mask id read from the checkpoint, and the duplicate of the
  reference, decoded again, has V = 0.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import peers
from peers import one_thread  # noqa: F401  (an autouse fixture)
from pytest_redline.engines import checkpoints

torch = pytest.importorskip("torch")  # imported before pytester's in-process runs snapshot sys.modules

pytestmark = pytest.mark.slow  # engine checkpoints: imports torch and transformers, loads or builds models

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
SDAR = peers.PEERS / "sdar" / "SDAR-4B-Chat"
PUBLISHED = "the published SDAR-4B-Chat folder's "  # what these tests compare against


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"model_type": "sdar", "architectures": ["SDARForCausalLM"]}, "sdar"),
        ({"model_type": "Dream", "architectures": ["DreamModel"]}, "dream"),
        ({"model_type": "llada", "architectures": ["LLaDAModelLM"]}, "llada"),
        ({"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"]}, "llada2"),
        ({"architectures": ["LLaDA2MoeModelLM"]}, "llada2"),
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "native"),
        ({}, "native"),
    ],
)
def test_detect_family(config, family):
    assert checkpoints.detect(config) == family


def test_declared_values_published_sdar_folder():
    peers.need_peers(PUBLISHED + "config.json and tokenizer (block size 4, mask token 151669, chat template)")
    checkpoint = checkpoints.read_checkpoint(SDAR)
    assert (checkpoint.family, checkpoint.block_size, checkpoint.mask_token_id) == ("sdar", 4, 151669)
    assert checkpoint.mask_source == "config.json:mask_token_id"
    assert checkpoint.chat_template is not None
    assert checkpoints.read_checkpoint(SDAR, mask_token_id=7).mask_token_id == 7  # engine_args.mask_token_id wins


def test_declared_mask_from_tokenizer_when_config_has_none(tmp_path):
    peers.need_peers(PUBLISHED + "tokenizer files (its mask token, 151669, when config.json names none)")
    shutil.copytree(SDAR, tmp_path / "sdar")
    _edit(tmp_path / "sdar", drop="mask_token_id")
    checkpoint = checkpoints.read_checkpoint(tmp_path / "sdar")
    assert (checkpoint.mask_token_id, checkpoint.mask_source) == (151669, "tokenizer:mask_token")


def _edit(folder: Path, drop: str | None = None, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.pop(drop, None)
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _llada_config(folder: Path, **changes) -> Path:
    """A config.json-only LLaDA folder (enough for the model-free checks)."""
    folder.mkdir(parents=True)
    config = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 32, "n_layers": 2, "n_heads": 2,
              "block_type": "llama", "mask_token_id": 1, "vocab_size": 96, "embedding_size": 96}
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize(
    ("make", "patterns"),
    [
        pytest.param(lambda d: d / "SDAR-4B-Chta", ["*bad.yaml: engine_args.model: expected an existing file or folder*SDAR-4B-Chta*"], id="typo"),
        pytest.param(lambda d: (d / "models").mkdir() or d / "models",
                     ["*bad.yaml: engine_args: *models/config.json: engine_args.model: expected a checkpoint folder with config.json*"], id="no-config"),
        pytest.param(lambda d: _llada_config(d / "llada2", model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"]),
                     ["*bad.yaml: engine_args: *llada2/config.json: hidden_size: expected an int >= 1, got None*"], id="llada2"),
        pytest.param(lambda d: _llada_config(d / "nomask", mask_token_id=None),
                     ["*bad.yaml: engine_args: *nomask/config.json: mask_token_id: missing*"], id="missing-mask"),
        pytest.param(lambda d: _llada_config(d / "bs", block_size=0),
                     ["*bad.yaml: engine_args: *bs/config.json: block_size: expected an int >= 1*got 0*"], id="block-size"),
        pytest.param(lambda d: _llada_config(d / "gelu", activation_type="gelu"),
                     ["*bad.yaml: engine_args: *gelu/config.json: activation_type: the stock Llama mapping supports 'silu', got 'gelu'*"], id="llada-unsupported"),
    ],
)
def test_usage_error_bad_checkpoint(pytester, run_gate, make, patterns):
    folder = make(pytester.path)
    pytester.makefile(".yaml", bad=yaml.safe_dump({
        "name": "bad", "suite": "arithmetic", "suite_args": {"n": 40}, "engine": "block_diffusion",
        "engine_args": {"model": str(folder)}, "cost": "tpf", "reference": "a",
        "configs": {"a": {"max_new_tokens": 4}, "b": {"max_new_tokens": 4, "engine": "blockbatch", "engine_args": {"model": str(folder)}}},
    }))
    result = run_gate("--redline-alpha=0.1", "--redline-grid=bad.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(patterns)
    assert not (pytester.path / ".redline").exists()  # nothing decoded


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The three published layouts, tiny, in a temporary folder (SDAR needs the peers folder)."""
    out = tmp_path_factory.mktemp("tiny")
    build = peers.builder()
    folders = {"dream": build.dream(out / "dream"), "llada": build.llada(out / "llada")}
    if peers.PEERS.is_dir():
        folders["sdar"] = build.sdar(out / "sdar")
    return folders


def _grid_on(pytester, family: str, folder: Path) -> str:
    """grids/FAMILY.yaml with every engine_args.model pointing at ``folder``."""
    grid = yaml.safe_load((ROOT / "grids" / f"{family}.yaml").read_text())
    grid["engine_args"]["model"] = str(folder)
    for spec in grid["configs"].values():
        if "engine_args" in spec:
            spec["engine_args"]["model"] = str(folder)
    pytester.makefile(".yaml", **{family: yaml.safe_dump(grid, sort_keys=False)})
    return f"{family}.yaml"


@pytest.mark.slow  # a gate per family, over 5 s
@pytest.mark.parametrize(("family", "block", "mask", "reference", "mode"), [
    ("sdar", 4, 151669, "bd/acc90", "diffulex: block-causal"),
    ("dream", None, 1, "dual/acc90", "fast_dllm: dual cache"),
    ("llada", None, 1, "dual/acc90", "fast_dllm: dual cache"),
])
def test_gate_certifies_unedited_checkpoint(pytester, run_gate, tiny, family, block, mask, reference, mode):
    """SDAR's grid gates in the block-causal mode, Dream's and LLaDA's in the dual-cache mode
    (schedule fast_dllm); the report names each config's mode."""
    if family not in tiny:
        peers.need_peers(PUBLISHED + "tokenizer files, which the tiny SDAR folder is built with")
    grid = _grid_on(pytester, family, tiny[family])
    result = run_gate("--redline-alpha=0.1", f"--redline-grid={grid}", "--redline-full", "--redline-no-cache",
                      "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = json.loads((pytester.path / "report.json").read_text())
    declared = report["checkpoints"][reference]
    assert (declared["family"], declared["declared_block_size"], declared["mask_token_id"]) == (family, block, mask)
    assert declared["block_size_used"] == 4  # SDAR: its declared 4 (the grid sets none); Dream, LLaDA: the grid's 4
    assert declared["decode_mode"].startswith(mode)
    assert report["checkpoints"]["bd/acc90"]["decode_mode"].startswith("diffulex: block-causal")
    assert report["checkpoints"]["blockbatch/bs4-8"]["block_size_used"] == [4, 8]
    assert report["checkpoints"]["blockbatch/bs4-8"]["decode_mode"].startswith("block-causal cache per branch")
    configs = {c["name"]: c for c in report["configs"]}
    assert configs[f"{reference}-again"]["violations"] == 0
    assert report["outcomes"] == {"reused": 0, "decoded": len(configs) * 40}  # the duplicate was decoded again
    assert configs[f"{reference}-again"]["cost"] == configs[reference]["cost"]  # decoded again, same forwards


def test_equivalent_cached_recomputed_dream_shifted_logits(tiny):
    """Dream's shifted logits through the cache (the wrapper's stashed hidden states) equal a
    recompute of the whole prefix at every step, in float64."""
    from pytest_redline.engines.block_diffusion import BlockDiffusionEngine
    from pytest_redline.suites.arithmetic import ArithmeticSuite

    engine = BlockDiffusionEngine(model=tiny["dream"], device="cpu", dtype="float64")
    prompts = ArithmeticSuite(n=8, seed=1).prompts()
    config = {"block_size": 4, "buffer_size": 2, "accept_threshold": 0.5, "max_new_tokens": 12}
    cached = engine.generate(prompts, config)
    recomputed = engine.generate(prompts, {**config, "use_cache": False})
    assert [g.text for g in cached] == [g.text for g in recomputed]
    assert engine.describe()["family"] == "dream"


@pytest.mark.slow  # loads and decodes two stock models: 1.2 s of CPU here
@pytest.mark.parametrize("family", ["dream", "llada"])
def test_equivalent_uncached_references_stock_loaders(tiny, family):
    """Through the stock loaders (LLaDA's renamed weights; Dream's shifted logits, cached by the
    ShiftedDecoder), the multi-block engine equals the uncached Diffulex reference and a one-branch
    BlockBatch the uncached single-block reference (tests/support/reference_decoders.py), in float64:
    text, tokens and forwards."""
    import reference_decoders
    from pytest_redline.engines.block_diffusion import BlockDiffusionEngine
    from pytest_redline.engines.blockbatch import BlockBatchEngine
    from pytest_redline.suites.arithmetic import ArithmeticSuite

    prompts = ArithmeticSuite(n=6, seed=2).prompts()
    multi = BlockDiffusionEngine(model=tiny[family], device="cpu", dtype="float64")
    config = {"block_size": 4, "buffer_size": 2, "accept_threshold": 0.5, "semi_complete_threshold": 0.7,
              "add_block_threshold": 0.25, "max_new_tokens": 12}
    for prompt, gen in zip(prompts, multi.generate(prompts, config)):
        ids = multi.tokenizer(prompt.text).input_ids
        out, forwards = reference_decoders.diffulex(multi, ids, 4, 2, 0.5, 0.7, 0.25, 12)
        assert (gen.text, gen.tokens, gen.forwards) == (multi.tokenizer.decode([t for t in out if t not in multi.eos_ids]), len(out), forwards)
    branch = BlockBatchEngine(model=tiny[family], device="cpu", dtype="float64")
    for prompt, gen in zip(prompts, branch.generate(prompts, {"block_sizes": [4], "accept_threshold": 0.5, "max_new_tokens": 12})):
        ids = branch.tokenizer(prompt.text).input_ids
        out, forwards = reference_decoders.single_block(branch, ids, 4, 0.5, 12)
        assert (gen.text, gen.tokens, gen.forwards) == (branch.tokenizer.decode([t for t in out if t not in branch.eos_ids]), len(out), forwards)


def test_block_size_used_declared_grid_or_engine_default(tmp_path):
    """The report's block size: the config's own, else the checkpoint's declared one, else the
    engine's default (model-free, as the gate prepares a grid)."""
    from pytest_redline.calibration import _check_engine_args
    from pytest_redline.engines.block_diffusion import BlockDiffusionEngine

    dream = tmp_path / "dream"
    dream.mkdir()
    (dream / "config.json").write_text(json.dumps({"model_type": "Dream", "architectures": ["DreamModel"], "mask_token_id": 1}))
    peers.need_peers(PUBLISHED + "config.json (its declared block size, 4)")
    engines = {"own": ("block_diffusion", {"model": str(dream)}), "default": ("block_diffusion", {"model": str(dream)}),
               "sdar": ("block_diffusion", {"model": str(SDAR)})}
    classes = dict.fromkeys(engines, BlockDiffusionEngine)
    params = {"own": {"block_size": 4}, "default": {}, "sdar": {}}
    used = {name: entry["block_size_used"] for name, entry in _check_engine_args(None, engines, classes, params).items()}
    assert used == {"own": 4, "default": 8, "sdar": 4}


def test_tokenizer_custom_class_loads_without_remote_code(tmp_path):
    """A tokenizer whose class needs remote code (Dream's DreamTokenizer, a Qwen2 BPE) loads as the
    stock Qwen2 tokenizer from its vocab.json and merges.txt, with the same ids and chat template."""
    peers.need_peers(PUBLISHED + "Qwen2 tokenizer files (vocab, merges, chat template)")
    folder = tmp_path / "dream-tokenizer"
    folder.mkdir()
    for name in ("vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json"):
        shutil.copy(SDAR / name, folder / name)
    config = json.loads((SDAR / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="DreamTokenizer", auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": "Dream", "architectures": ["DreamModel"]}))
    tokenizer = checkpoints.load_tokenizer(folder)
    published = checkpoints.load_tokenizer(SDAR)
    text = "Compute 12+30 and say <|MASK|>."
    assert tokenizer(text).input_ids == published(text).input_ids
    assert tokenizer.mask_token_id == 151669 and tokenizer.chat_template == published.chat_template


def test_equivalent_shifted_decoder_model_forward(tiny):
    """Dream: the head over the ShiftedDecoder's hidden states equals the model's own (shifted)
    logits under the same block-causal mask, in float64."""
    from pytest_redline.engines.modeling import block_causal_mask

    model, _ = checkpoints.load(checkpoints.read_checkpoint(tiny["dream"]), "cpu", "float64")
    x = torch.randint(5, 80, (2, 9), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(9).expand(2, -1)
    mask = block_causal_mask(pos, pos, 4, torch.float64)
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=x, attention_mask=mask, position_ids=pos).last_hidden_state
        torch.testing.assert_close(model.get_output_embeddings()(hidden), model(input_ids=x, attention_mask=mask, position_ids=pos).logits,
                                   rtol=0, atol=1e-12)
