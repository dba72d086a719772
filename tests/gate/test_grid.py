"""The grid schema: what a valid grid reads as, and the message of each bad one."""
from __future__ import annotations

import os
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from pytest_redline.grid import KEYS, GridError, load_grid, parse_grid

GRID = """\
name: tiny
suite: arithmetic
suite_args: {n: 64, data: prompts.jsonl}
engine: block_diffusion
engine_args: {model: models/tiny, device: cpu, cache_path: ../cache, seed: 3}
cost: tpf
reference: acc95/semi90
configs:
  acc95/semi90: {accept_threshold: 0.95}
  acc85/semi70: {accept_threshold: 0.85}
  spec/eps0.1: {engine: speculative, engine_args: {draft: drafts/small}, eps: 0.1}
deploy: fastest
delta: 0.05
batch_size: 8
"""


def parse(text: str, path: Path = Path("/grids/g.yaml")):
    return parse_grid(text, path)


def error_of(text: str) -> str:
    with pytest.raises(GridError) as info:
        parse(text)
    return str(info.value)


def test_fields_of_valid_grid() -> None:
    grid = parse(GRID)
    assert (grid.name, grid.suite, grid.engine, grid.cost, grid.direction) == ("tiny", "arithmetic", "block_diffusion", "tpf", "higher")
    assert (grid.reference, grid.deploy, grid.delta, grid.batch_size, grid.timeout) == ("acc95/semi90", "fastest", 0.05, 8, None)
    assert [c.name for c in grid.configs] == ["acc95/semi90", "acc85/semi70", "spec/eps0.1"]  # order kept
    spec = grid.configs[2]
    assert (spec.engine, spec.params) == ("speculative", {"eps": 0.1})  # engine keys are not parameters
    assert grid.configs[0].engine is None and grid.configs[0].engine_args == {}


def test_resolves_paths_against_grid_folder() -> None:
    grid = parse(GRID, Path("/work/grids/g.yaml"))
    assert grid.engine_args == {"model": "/work/grids/models/tiny", "device": "cpu", "cache_path": "/work/cache", "seed": 3}
    assert grid.suite_args == {"n": 64, "data": "/work/grids/prompts.jsonl"}
    assert grid.configs[2].engine_args == {"draft": "/work/grids/drafts/small"}
    home = parse(GRID.replace("models/tiny", "~/m"))
    assert home.engine_args["model"] == os.path.expanduser("~/m")
    absolute = parse(GRID.replace("models/tiny", "/abs/model"))
    assert absolute.engine_args["model"] == "/abs/model"


def test_defaults_of_minimal_grid(tmp_path: Path) -> None:
    path = tmp_path / "redline-small.yml"
    path.write_text("engine: replay\nengine_args: {outcomes: o.csv}\nreference: a\n")
    grid = load_grid(path)
    assert (grid.name, grid.cost, grid.direction, grid.batch_size, grid.configs, grid.deploy, grid.delta) == (
        "redline-small", "tpf", "higher", 16, None, None, None)
    assert grid.engine_args == {"outcomes": str(tmp_path / "o.csv")}


def test_config_list_names_recorded_configs() -> None:
    grid = parse("engine: replay\nreference: b\nconfigs: [b, a]\n")
    assert [(c.name, c.params) for c in grid.configs] == [("b", None), ("a", None)]


def test_memory_cost_is_lower_is_better() -> None:
    grid = parse(GRID.replace("cost: tpf", "cost: memory"))
    assert (grid.direction, grid.lower_is_better) == ("lower", True)
    custom = parse(GRID.replace("cost: tpf", "cost: latency_ms\ndirection: lower"))
    assert custom.lower_is_better


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("name: tiny", "name: [tiny", "line 2, column 6: malformed YAML: expected ',' or ']', but got ':'"),
        ("reference:", "refrence:", "refrence: unknown key; did you mean 'reference'? (valid keys: name, suite, *"),
        ("deploy:", "zzz:", "zzz: unknown key (valid keys: name, suite, *"),
        ("delta: 0.05", "delta: 1.0", "delta: expected a number in (0, 1), got 1.0 (float)"),
        ("delta: 0.05", "delta: true", "delta: expected a number in (0, 1), got True (bool)"),
        ("batch_size: 8", "batch_size: 8.0", "batch_size: expected an integer >= 1, got 8.0 (float)"),
        ("batch_size: 8", "timeout: -1", "timeout: expected a number of seconds > 0, got -1 (int)"),
        ("cost: tpf", "cost: tpf\ndirection: lower", "direction: cost 'tpf' is higher-is-better, got 'lower'"),
        ("cost: tpf", "cost: x\ndirection: up", "direction: expected 'higher' or 'lower', got 'up' (str)"),
        ("suite_args: {n: 64, data: prompts.jsonl}", "suite_args: [64]", "suite_args: expected a mapping of arguments, got [[]64] (list)"),
        ("reference: acc95/semi90", "reference: acc99", "reference: expected one of the configs (acc95/semi90, acc85/semi70, spec/eps0.1), got 'acc99'"),
        ("reference: acc95/semi90\n", "", "reference: expected the name of the reference config"),
        ("engine: block_diffusion\n", "", "engine: expected an engine name (here, or an `engine:` in every config)"),
        ("deploy: fastest", "deploy: acc99", "deploy: expected 'fastest' or one of the configs (acc95/semi90, acc85/semi70, spec/eps0.1), got 'acc99'"),
        ("  acc85/semi70: {accept_threshold: 0.85}", "  acc85/semi70: 0.85", "configs.acc85/semi70: expected a mapping of engine parameters, got 0.85 (float)"),
        ("  acc85/semi70: {accept_threshold: 0.85}", "  acc95/semi90: {}", "configs.acc95/semi90: duplicate config name (lines 9 and 10); expected each once"),
        ("suite_args: {n: 64, data: prompts.jsonl}", "suite_args: {n: 64, n: 65}", "suite_args.n: duplicate key (lines 3 and 3); expected each once"),
        ("{engine: speculative,", "{engine: 7,", "configs.spec/eps0.1.engine: expected an engine name, got 7 (int)"),
    ],
)
def test_error_names_file_key_and_expectation(old: str, new: str, message: str) -> None:
    assert old in GRID
    text = error_of(GRID.replace(old, new))
    assert fnmatch(text, "/grids/g.yaml: " + message), text


def test_error_for_non_mapping_file() -> None:
    assert error_of("- a\n- b\n") == "/grids/g.yaml: expected a mapping of grid keys at the top level, got list"
    assert error_of("") == "/grids/g.yaml: expected a mapping of grid keys at the top level, got an empty file"


def test_error_for_config_list_problems() -> None:
    assert error_of("engine: replay\nreference: a\nconfigs: [a, a]\n") == (
        "/grids/g.yaml: configs[1]: expected distinct config names, got 'a' twice")
    assert error_of("engine: replay\nreference: a\nconfigs: []\n") == (
        "/grids/g.yaml: configs: expected at least one config name, got an empty list")


def test_error_for_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GridError, match="nope.yaml: no such grid file"):
        load_grid(tmp_path / "nope.yaml")


@given(st.text(st.characters(categories=["L", "N"], include_characters="_"), min_size=1, max_size=12))
@example("configurations")
def test_rejects_any_unknown_key(key: str) -> None:
    if key in KEYS or not isinstance(yaml.safe_load(key), str):  # YAML reads `12`, `no`, `null` as non-strings
        return
    text = error_of(f"{key}: 1\n" + GRID)
    assert text.startswith(f"/grids/g.yaml: {key}: unknown key")


@given(st.floats(allow_nan=False, allow_infinity=False))
@example(0.0)
@example(1.0)
@example(1e-300)
def test_delta_accepted_exactly_in_open_unit_interval(delta: float) -> None:
    text = GRID.replace("delta: 0.05", f"delta: {delta:.16e}")  # YAML 1.1 floats need a dot and a signed exponent
    if 0.0 < delta < 1.0:
        assert parse(text).delta == delta
    else:
        assert "delta: expected a number in (0, 1)" in error_of(text)


def test_error_for_missing_input_path(tmp_path: Path) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "prompts.jsonl").write_text("")
    grid = parse(GRID, tmp_path / "g.yaml")
    with pytest.raises(GridError) as info:
        grid.check_paths()
    assert str(info.value) == (
        f"{tmp_path / 'g.yaml'}: configs.spec/eps0.1.engine_args.draft: expected an existing file or folder, got "
        f"{tmp_path / 'drafts' / 'small'} (no such file or folder; relative paths resolve against the grid file's folder)"
    )
    (tmp_path / "drafts" / "small").mkdir(parents=True)
    grid.check_paths()  # cache_path names a file to write: it need not exist


def test_valid_mixed_grid_configs_for_their_engines() -> None:
    """grids/mixed.yaml: the multi-block defaults as the reference, candidates of all three
    block-diffusion engines, each config valid for its own engine (parsing only: no model loads)."""
    from pytest_redline.engines.diffusion_spec import BatchConfig, DecodeConfig, FlowConfig

    checks = {"block_diffusion": DecodeConfig, "flowblock": FlowConfig, "blockbatch": BatchConfig}
    grid = load_grid(Path(__file__).resolve().parents[2] / "grids" / "mixed.yaml")
    grid.check_paths()
    specs = {spec.name: spec for spec in grid.configs}
    reference = specs[grid.reference]
    assert grid.engine == "block_diffusion" and reference.engine is None
    assert DecodeConfig.from_params(reference.params) == DecodeConfig.from_params({})
    configs = {engine: [] for engine in checks}
    for spec in grid.configs:
        engine = spec.engine or grid.engine
        engine_args = spec.engine_args if spec.engine else grid.engine_args
        assert engine_args == grid.engine_args  # the same model, device, dtype and threads: 1
        configs[engine].append(checks[engine].from_params(spec.params))
    assert grid.engine_args["threads"] == 1
    assert FlowConfig.from_params({}) in configs["flowblock"]  # each engine's defaults are a candidate
    assert BatchConfig.from_params({}) in configs["blockbatch"]
    assert all(len(found) >= 2 for found in configs.values())


OUR_ENGINES = ("block_diffusion", "flowblock", "blockbatch", "speculative", "quantized", "replay")


@pytest.mark.parametrize("name", OUR_ENGINES)
def test_model_free_check_config_every_engine(name: str) -> None:
    """Each engine class the registry returns checks a config without a model: its defaults
    pass, an unknown key is a ValueError naming it and listing the known keys."""
    from pytest_redline import registry

    engine = registry.factory(registry.ENGINES, name)
    engine.check_config({"config": "acc95/semi90"} if name == "replay" else {})
    with pytest.raises(ValueError, match=rf"^{name}: unknown config key 'accept_treshold'; known keys: "):
        engine.check_config({"accept_treshold": 0.9})


def test_shipped_grids_pass_check_config() -> None:
    """Every config of every shipped grid passes its engine's check (the gate runs it too)."""
    from pytest_redline import registry

    for path in sorted((Path(__file__).resolve().parents[2] / "grids").glob("*.yaml")):
        grid = load_grid(path)
        for spec in grid.configs or ():
            engine = registry.factory(registry.ENGINES, spec.engine or grid.engine)
            if hasattr(engine, "check_config") and spec.params:
                engine.check_config(dict(spec.params))
