"""LLaDA2.0 and LLaDA2.1 folders through the gate: declared values, refusals (exit 4), gates.

- The repository's grids/llada2.yaml and grids/llada21.yaml gate tiny folders in the published
  layout (157,184 vocabulary rows, ``<|mask|>`` 156895, EOS 156892; built in a session fixture,
  not committed) with exit 0; the JSON report shows the declared values; the reference's
  duplicate, decoded again, has V = 0.
- grids/llada2_math.yaml (the paper's grid) passes every model-free check against a folder with
  LLaDA2.0-mini's published config.json, generation config and tokenizer ids, and shards holding
  every published tensor's header (sparse files, no data).
- A corrupt or mismatched folder, and a config whose flag contradicts the published code, is a
  usage error (exit 4) naming the file and the field, before anything decodes.
- bf16 loads in bf16 (``expert_bias`` stays float32); FLOPs count the active experts only.
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

pytestmark = pytest.mark.slow  # the LLaDA2 engine: imports torch and transformers, builds sparse checkpoints

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
SMALL = {"base": 100, "vocab_size": 128}


@pytest.fixture(scope="session")
def published_vocab(tmp_path_factory):
    """Tiny LLaDA2.0 and LLaDA2.1 folders with the published vocabulary (157,184 rows)."""
    out = tmp_path_factory.mktemp("llada2-gate")
    return {"llada2": peers.builder().llada2(out / "llada2"), "llada21": peers.builder().llada21(out / "llada21")}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return peers.builder().llada2(tmp_path_factory.mktemp("llada2-small") / "llada2", **SMALL)


def _grid_on(pytester, name: str, folder: Path, grid: dict | None = None) -> str:
    grid = grid or yaml.safe_load((ROOT / "grids" / f"{name}.yaml").read_text())
    grid["engine_args"]["model"] = str(folder)
    for spec in grid["configs"].values():
        if "engine_args" in spec:
            spec["engine_args"]["model"] = str(folder)
    pytester.makefile(".yaml", **{name: yaml.safe_dump(grid, sort_keys=False)})
    return f"{name}.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llada2", "llada21"])
def test_gate_certifies_unedited_llada2_checkpoint(pytester, run_gate, published_vocab, name):
    grid = _grid_on(pytester, name, published_vocab[name])
    result = run_gate("--redline-alpha=0.1", f"--redline-grid={grid}", "--redline-full", "--redline-no-cache",
                      "--redline-report=report.json")
    assert result.ret == 0, result.stdout.str()[-3000:]
    report = json.loads((pytester.path / "report.json").read_text())
    declared = report["checkpoints"]["bd/acc90"]
    assert (declared["family"], declared["mask_token_id"], declared["mask_token_source"]) == ("llada2", 156895, "tokenizer:<|mask|>")
    assert (declared["eos_token_id"], declared["eos_token_source"]) == (156892, "generation_config.json:eos_token_id")
    assert (declared["declared_block_size"], declared["block_size_used"]) == (32, 4)
    assert "no remote code" in declared["loader"] and "ignored" in declared["remote_code"]
    assert report["checkpoints"]["blockbatch/bs4-8"]["block_size_used"] == [4, 8]
    configs = {c["name"]: c for c in report["configs"]}
    assert configs["bd/acc90-again"]["violations"] == 0
    assert configs["bd/acc90-again"]["cost"] == configs["bd/acc90"]["cost"]
    assert report["outcomes"] == {"reused": 0, "decoded": 4 * 40}


def test_declared_values_enter_the_key_and_overrides_win(small):
    from pytest_redline.engines.diffusion_spec import BlockDiffusionSpec

    declared = checkpoints.read_checkpoint(small).describe()
    assert (declared["mask_token_id"], declared["eos_token_id"], declared["declared_block_size"]) == (103, 100, 32)
    override = checkpoints.read_checkpoint(small, mask_token_id=7, eos_token_id=8).describe()
    assert (override["mask_token_id"], override["mask_token_source"]) == (7, "engine_args.mask_token_id")
    assert (override["eos_token_id"], override["eos_token_source"]) == (8, "engine_args.eos_token_id")
    keys = [BlockDiffusionSpec.identity({"model": str(small), "device": "cpu", **args})["runtime"]
            for args in ({}, {"mask_token_id": 7}, {"eos_token_id": 8})]
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == 3  # each value enters the outcome key


@pytest.mark.slow  # the 157,184-entry tokenizer and 32 GB of sparse shards: 7 s alone, 18 s under load
def test_model_free_checks_pass_paper_grid_published_folder(tmp_path):
    """grids/llada2_math.yaml against LLaDA2.0-mini's published config and tokenizer ids, with
    every published tensor's header (sparse shards): the gate's whole preparation passes."""
    from pytest_redline.calibration import Level, prepare
    from pytest_redline.decode.enginebook import EngineBook
    from pytest_redline.grid import parse_grid

    folder = peers.builder().llada2_published(tmp_path / "LLaDA2.0-mini")
    grid = yaml.safe_load((ROOT / "grids" / "llada2_math.yaml").read_text())
    grid["engine_args"]["model"] = str(folder)
    cal = prepare(parse_grid(yaml.safe_dump(grid), tmp_path / "llada2_math.yaml"), "llada2_math.yaml",
                  Level(0.1, 0.1, 1, "holm", None), EngineBook())
    declared = cal.declared["acc95/semi90"]
    assert (declared["mask_token_id"], declared["eos_token_id"], declared["block_size_used"]) == (156895, 156892, 32)
    assert cal.n == 1819  # gsm8k + math500


def _bad(small: Path, tmp_path: Path, change) -> Path:
    folder = tmp_path / "bad"
    shutil.copytree(small, folder)
    change(folder)
    return folder


def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


BAD = [
    pytest.param(lambda f: (f / "model-00002-of-00002.safetensors").unlink(),
                 "*model.safetensors.index.json: weight_map: model.* is in model-00002-of-00002.safetensors, which is missing*",
                 id="missing-shard"),
    pytest.param(lambda f: _config(f, moe_intermediate_size=8),
                 "*model-0000?-of-00002.safetensors: model.layers.1.mlp.experts.0.gate_proj.weight: expected shape ?8, 32? (from config.json), got ?16, 32?",
                 id="wrong-shape"),
    pytest.param(lambda f: _config(f, num_experts=8),
                 "*config.json: num_experts: 8, but *model.layers.1.mlp.experts.15.* (16 experts per layer)*", id="expert-count"),
    pytest.param(lambda f: _config(f, norm_topk_prob=False),
                 "*config.json: norm_topk_prob: the published LLaDA2 code normalises the chosen scores*got false*", id="norm-topk"),
    pytest.param(lambda f: _config(f, score_function="softmax"),
                 "*config.json: score_function: the published LLaDA2 code always behaves as score_function: \"sigmoid\"*", id="softmax"),
    pytest.param(lambda f: _config(f, moe_router_enable_expert_bias=False),
                 "*config.json: moe_router_enable_expert_bias: *always behaves as moe_router_enable_expert_bias: true*", id="no-bias"),
    pytest.param(lambda f: (f / "model-00001-of-00002.safetensors").write_bytes(b"\x10\x00"),
                 "*model-00001-of-00002.safetensors: not a readable safetensors file*", id="corrupt-shard"),
]


@pytest.mark.parametrize(("change", "pattern"), BAD)
def test_usage_error_bad_llada2_folder(pytester, run_gate, small, change, pattern):
    folder = _bad(small, pytester.path, change)
    pytester.makefile(".yaml", bad=yaml.safe_dump({
        "name": "bad", "suite": "arithmetic", "suite_args": {"n": 40}, "engine": "block_diffusion",
        "engine_args": {"model": str(folder)}, "cost": "tpf", "reference": "a", "configs": {"a": {"max_new_tokens": 4}},
    }))
    result = run_gate("--redline-alpha=0.1", "--redline-grid=bad.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad.yaml: engine_args: *" + pattern.lstrip("*")])
    assert not (pytester.path / ".redline").exists()  # nothing decoded


def test_usage_error_device_map(pytester, run_gate, small):
    """Sharding across GPUs (``device_map``) is not supported: the argument is refused, exit 4."""
    pytester.makefile(".yaml", bad=yaml.safe_dump({
        "name": "bad", "suite": "arithmetic", "suite_args": {"n": 40}, "engine": "block_diffusion",
        "engine_args": {"model": str(small), "device_map": "auto"}, "cost": "tpf", "reference": "a",
        "configs": {"a": {"max_new_tokens": 4}},
    }))
    result = run_gate("--redline-alpha=0.1", "--redline-grid=bad.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*device_map*"])


def test_bf16_load_keeps_router_bias_float32_and_counts_active_experts(small):
    from pytest_redline.engines.modeling import active_layer_params

    model, _ = checkpoints.load(checkpoints.read_checkpoint(small), "cpu", "bfloat16")
    dtypes = {t.dtype for n, t in model.state_dict().items() if not n.endswith("expert_bias")}
    assert dtypes == {torch.bfloat16}
    bias = model.model.layers[1].mlp.gate.expert_bias
    assert bias.dtype == torch.float32
    from safetensors import safe_open

    index = json.loads((small / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.1.mlp.gate.expert_bias"
    with safe_open(small / index[name], "pt") as handle:
        assert torch.equal(bias, handle.get_tensor(name))  # not rounded through bf16
    cfg = model.config
    layers = sum(p.numel() for p in model.get_decoder().layers.parameters())
    routed = 2 * cfg.num_experts * 3 * cfg.hidden_size * cfg.moe_intermediate_size // 2  # one MoE layer
    routed = cfg.num_experts * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    assert active_layer_params(model) == layers - routed + routed * cfg.num_experts_per_tok / cfg.num_experts


def test_key_value_heads_zero_llada21_maps_llada20_refuses(tmp_path):
    """LLaDA2.1's configuration maps num_key_value_heads 0 to the query heads; LLaDA2.0's code
    would divide by it: refused, naming the field."""
    from pytest_redline.engines import llada2_config

    config = peers.builder().llada2_config("2.1", num_key_value_heads=0)
    assert llada2_config.model_config(config, tmp_path / "config.json")["num_key_value_heads"] == config["num_attention_heads"]
    with pytest.raises(llada2_config.FolderError, match=r"config.json: num_key_value_heads: expected a divisor of num_attention_heads 16, got 0"):
        llada2_config.model_config({**config, "model_type": "llada2_moe"}, tmp_path / "config.json")
