"""The shipped ``server:`` grids (grids/server_*.yaml) prepare model-free: schema, placeholders,
engine arguments, suites, and an outcome key per config that holds its launch flags.

The SGLang and vLLM grids cannot run here (no GPU): their model folders are stand-ins and
``vllm`` is a stand-in program on PATH, so that every check the gate makes before it starts a
server runs on them as shipped otherwise.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pytest_redline.calibration import Level, prepare
from pytest_redline.decode.enginebook import EngineBook, key_args
from pytest_redline.grid import load_grid

GRIDS = Path(__file__).resolve().parents[2] / "grids"
SHIPPED = sorted(p.name for p in GRIDS.glob("server_*.yaml"))
LEVEL = Level(alpha=0.1, delta=0.1, grids_in_session=1, correction="holm", deploy_override=None)


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """A copy of grids/ whose /models/ folders exist, and a ``vllm`` program on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    copy = tmp_path / "grids"
    shutil.copytree(GRIDS / "server_configs", copy / "server_configs")
    for name in SHIPPED:
        text = (GRIDS / name).read_text().replace("../engines/models/", f"{GRIDS.parent}/engines/models/")
        (copy / name).write_text(text.replace(" /models/", f" {tmp_path}/models/"))
    for folder in ("LLaDA2.0-mini", "LLaDA2.1-mini", "SDAR-8B-Chat", "DiffusionGemma", "Qwen2.5-7B-Instruct"):
        (tmp_path / "models" / folder).mkdir(parents=True)
        (tmp_path / "models" / folder / "config.json").write_text(f'{{"name": "{folder}"}}')
    return copy


def test_the_server_grids_are_shipped():
    assert SHIPPED == ["server_sglang_llada2.yaml", "server_sglang_sdar.yaml", "server_transformers.yaml",
                       "server_vllm_diffusion_gemma.yaml", "server_vllm_speculative.yaml"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_server_grid_prepares_model_free_with_a_key_per_launch_flag(stand_ins, name):
    cal = prepare(load_grid(stand_ins / name), name, LEVEL, EngineBook())
    identities = []
    for config in cal.configs:
        engine, args = cal.engines[config]
        assert engine == "openai" and "{port}" in args["base_url"] and args["server"]["port"] == "auto"
        assert any("{model}" in arg for arg in args["server"]["command"])
        identity = key_args(engine, args)["server"]
        assert "{port}" in identity["command"] and not any(str(stand_ins.parent) in arg for arg in identity["command"])
        identities.append(identity)
    assert len({repr(i) for i in identities}) == len(identities)  # no two configs share a key
    assert cal.grid.max_servers in (1, 2)


def test_a_dllm_algorithm_config_enters_the_key_by_content(stand_ins):
    cal = prepare(load_grid(stand_ins / "server_sglang_llada2.yaml"), "g", LEVEL, EngineBook())
    before = key_args(*cal.engines["lowconf95"])["server"]["command"]
    (stand_ins / "server_configs" / "lowconf95.yaml").write_text("threshold: 0.96\nblock_size: 32\n")
    assert key_args(*cal.engines["lowconf95"])["server"]["command"] != before
