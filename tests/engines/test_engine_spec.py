"""The model-free half of our engines (engines/spec.py): the entry points name specs that import
no torch, each spec agrees with the engine class it builds, and a warm rerun of a grid whose
outcomes are all stored imports neither torch nor transformers."""
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_redline import registry
from pytest_redline.engines.spec import EngineSpec

ROOT = Path(__file__).resolve().parents[2]
SPECS = [name for name in registry.known(registry.ENGINES) if isinstance(registry.factory(registry.ENGINES, name), type)
         and issubclass(registry.factory(registry.ENGINES, name), EngineSpec)]


def test_every_model_engine_registers_a_spec():
    assert set(SPECS) == {"block_diffusion", "flowblock", "blockbatch", "speculative", "quantized"}


@pytest.mark.slow  # imports each engine class: torch and transformers, ~2 s of CPU
@pytest.mark.parametrize("name", SPECS)
def test_spec_agrees_with_engine_class(name: str):
    spec = registry.factory(registry.ENGINES, name)
    engine = type(spec.__new__(spec))  # what calling the spec builds, not initialised (no model loads)
    assert engine is not spec and issubclass(engine, spec)
    assert engine.name == spec.name == name
    assert engine.Config is spec.Config and getattr(engine, "rules", None) == getattr(spec, "rules", None)
    parameters = inspect.signature(engine).parameters
    assert {key: p.default for key, p in parameters.items()} == dict(spec.engine_args)


@pytest.mark.parametrize("name", SPECS)
def test_unknown_engine_argument_is_refused_by_spec(name: str):
    spec = registry.factory(registry.ENGINES, name)
    with pytest.raises(TypeError, match="'modle'"):
        spec.identity({"modle": "x"})


def test_no_torch_for_specs_in_fresh_process():
    code = textwrap.dedent("""
        import sys
        from pytest_redline import registry
        for name in registry.known(registry.ENGINES):
            spec = registry.factory(registry.ENGINES, name)
            if hasattr(spec, "identity") and name in ("block_diffusion", "flowblock", "blockbatch", "speculative", "quantized"):
                spec.check_config({})
                spec.identity({}) if name != "speculative" else spec.check_engine_args({})
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[]"]


GRID = """\
name: warm
suite: arithmetic
suite_args: {{split: calibration, n: 24, seed: 0}}
engine: block_diffusion
engine_args: {{device: auto, dtype: auto, threads: 1}}
reference: ref
configs:
  ref: {{}}
  fast: {{accept_threshold: 0.7, max_new_tokens: 24}}
deploy: fastest
batch_size: 24
"""
PROBE = """
import sys, pytest
from _pytest.unraisableexception import gc_collect_iterations_key

class Probe:
    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        print("EXIT_COLLECTIONS", config.stash.get(gc_collect_iterations_key, "default"))

rc = pytest.main(sys.argv[1:], plugins=[Probe()])
print("IMPORTED", sorted(m for m in ("torch", "transformers") if m in sys.modules))
sys.exit(rc)
"""


@pytest.mark.slow  # subprocess gates
def test_warm_rerun_imports_no_torch_or_transformers(tmp_path: Path):
    """Run from the repository root, as `pytest --redline-alpha=...` is: the root conftest is loaded."""
    grid = tmp_path / "warm.yaml"
    grid.write_text(GRID.format())
    args = ["-q", "-p", "no:cacheprovider", "--redline-alpha=0.3", f"--redline-grid={grid}", f"--redline-cache-dir={tmp_path / 'store'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def gate(report: str) -> tuple[list[str], dict]:
        run = subprocess.run([sys.executable, "-c", PROBE, *args, f"--redline-report={tmp_path / report}"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode in (0, 1), run.stdout[-2000:] + run.stderr[-2000:]
        lines = [line for line in run.stdout.splitlines() if line.startswith(("IMPORTED", "EXIT_COLLECTIONS"))]
        return lines, json.loads((tmp_path / report).read_text())

    cold_lines, cold = gate("cold.json")
    assert "'torch'" in cold_lines[1]  # the cold run decoded
    assert cold_lines[0] == "EXIT_COLLECTIONS default"  # an engine ran: pytest's five passes at exit
    warm_lines, warm = gate("warm.json")
    assert warm["outcomes"]["decoded"] == 0 and warm["outcomes"]["reused"] == cold["outcomes"]["decoded"] > 0
    assert warm_lines == ["EXIT_COLLECTIONS 1", "IMPORTED []"]  # only settled items ran: one pass


@pytest.mark.parametrize("gpu_node", [False, True], ids=["no-gpu-driver", "gpu-driver-node"])
@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("dtype", ["auto", "float32", "float64", "bfloat16", "float16", "half"])
@pytest.mark.slow  # imports torch and builds engine specs over 24 cases: 1.27 s CPU, over the inner loop's 50 s budget (issue 25)
def test_model_free_device_and_dtype_are_what_loading_picks(device: str, dtype: str, gpu_node: bool, monkeypatch, tmp_path: Path):
    """runtime's names equal what modeling.load would pick; with a GPU driver node present
    (faked here) the decision goes to torch, which on this machine still finds no GPU."""
    from pytest_redline.engines import modeling, runtime

    if gpu_node:
        monkeypatch.setattr(runtime, "GPU_NODES", (str(tmp_path),))
    loaded = modeling.loaded_device(device)
    assert runtime.device_name(device) == str(loaded)
    assert runtime.dtype_name(dtype, runtime.device_name(device)) == str(modeling.select_dtype(dtype, loaded)).removeprefix("torch.")


def test_unknown_dtype_is_refused_without_a_model():
    from pytest_redline.engines import runtime

    with pytest.raises(ValueError, match="engine_args.dtype: expected auto, float32"):
        runtime.dtype_name("int8", "cpu")


BAD_CONFIGS = [
    ("block_diffusion", {"blok_size": 4}, "blok_size", r"^block_diffusion: unknown config key 'blok_size'; known keys: block_size, "),
    ("block_diffusion", {"buffer_size": 0}, "buffer_size", r"^block_diffusion: buffer_size: expected int >= 1, got 0$"),
    ("block_diffusion", {"schedule": "lazy"}, "schedule", r"^block_diffusion: schedule: expected one of diffulex, eager, fast_dllm, got 'lazy'$"),
    ("flowblock", {"use_cache": 1}, "use_cache", r"^flowblock: use_cache: expected true or false, got 1$"),
    ("blockbatch", {"block_sizes": [4, 4]}, "block_sizes", r"^blockbatch: block_sizes: expected a non-empty list of distinct ints"),
    ("speculative", {"posterior_alpha": 0.2}, "posterior_alpha", r"^speculative: posterior_alpha: applies only to acceptance: typical"),
    ("speculative", {"acceptance": "typical", "temperature": -1}, "temperature", r"^speculative: temperature: expected a number in"),
    ("quantized", {"quantization": "int4"}, "quantization", r"^quantized: quantization: expected one of none, int8, nf4, fp4, got 'int4'$"),
]


@pytest.mark.parametrize("name, params, key, message", BAD_CONFIGS)
def test_structured_config_errors_check_config(name: str, params: dict, key: str, message: str):
    """A spec's check raises ConfigError: the key it is about, the message a user reads, and
    (for an unknown key) the keys the engine knows, declared once by its Config's fields."""
    from pytest_redline.contracts import ConfigError

    spec = registry.factory(registry.ENGINES, name)
    with pytest.raises(ConfigError, match=message) as raised:
        spec.check_config(params)
    assert raised.value.key == key and str(raised.value) == raised.value.message
    if "unknown config key" in raised.value.message:
        import dataclasses

        assert raised.value.known == tuple(f.name for f in dataclasses.fields(spec.Config))
    else:
        assert raised.value.known == ()


def test_gate_reads_the_fields_of_a_config_error():
    """The gate names configs.<config>.<key> from ConfigError.key and suggests from .known,
    whatever the message says; an engine's plain ValueError names the config."""
    from pytest_redline.calibration import _check_configs
    from pytest_redline.contracts import ConfigError
    from pytest_redline.grid import GridError

    class Grid:
        def error(self, key, message):
            return GridError("redline.yaml", key, message)

    class Structured:
        @classmethod
        def check_config(cls, params):
            raise ConfigError("spead", "toy: no such knob (the text names no key)", ("speed", "size"))

    class Plain:
        @classmethod
        def check_config(cls, params):
            raise ValueError("toy: 'speed' is wrong")

    with pytest.raises(GridError, match=r"^redline.yaml: configs.fast.spead: toy: no such knob \(the text names no key\) \(did you mean 'speed'\?\)$"):
        _check_configs(Grid(), {"fast": {"spead": 1}}, {"fast": Structured})
    with pytest.raises(GridError, match=r"^redline.yaml: configs.fast: toy: 'speed' is wrong$"):
        _check_configs(Grid(), {"fast": {"speed": 1}}, {"fast": Plain})


def test_engine_reports_the_values_it_uses_check_engine_args(tmp_path: Path):
    """check_engine_args(engine_args, params) reports, per config, what the engine will use; the
    gate copies each mapping into the report without reading it (an engine whose check takes only
    engine_args is called once per distinct arguments)."""
    from pytest_redline.calibration import _check_engine_args

    dream = tmp_path / "dream"
    dream.mkdir()
    (dream / "config.json").write_text(json.dumps({"model_type": "Dream", "architectures": ["DreamModel"], "mask_token_id": 1}))
    spec = registry.factory(registry.ENGINES, "block_diffusion")
    batch = registry.factory(registry.ENGINES, "blockbatch")
    assert spec.check_engine_args({"model": str(dream)}, {"block_size": 4})["block_size_used"] == 4
    assert spec.check_engine_args({"model": str(dream)}, {})["block_size_used"] == 8  # Dream declares none: the default
    assert batch.check_engine_args({"model": str(dream)}, {})["block_size_used"] == [4, 8, 16]
    assert spec.check_engine_args({}, {"block_size": 4}) is None  # the embedded model: nothing to report

    calls = []

    class Opaque:
        @staticmethod
        def check_engine_args(engine_args, params):
            calls.append(dict(params))
            return {"anything": params.get("knob"), "at": engine_args["at"]}

    class Once:
        @staticmethod
        def check_engine_args(engine_args):
            calls.append(None)
            return {"seen": engine_args["at"]}

    engines = {"a": ("opaque", {"at": 1}), "b": ("opaque", {"at": 1}), "c": ("once", {"at": 2}), "d": ("once", {"at": 2})}
    classes = {"a": Opaque, "b": Opaque, "c": Once, "d": Once}
    params = {"a": {"knob": "x"}, "b": {}, "c": {"knob": "y"}, "d": {}}
    reported = _check_engine_args(None, engines, classes, params)
    assert reported == {"a": {"anything": "x", "at": 1}, "b": {"anything": None, "at": 1}, "c": {"seen": 2}, "d": {"seen": 2}}
    assert calls == [{"knob": "x"}, {}, None]


def test_structured_config_errors_replay_endpoint_and_hf_generate():
    from pytest_redline.contracts import ConfigError

    for name, params, key, known in (("replay", {"confg": "a"}, "confg", ("config",)), ("replay", {"config": 3}, "config", ()),
                                     ("hf_generate", {"top_k": 0}, "top_k", ()), ("openai", {"max_token": 5}, "max_token", None)):
        with pytest.raises(ConfigError) as raised:
            registry.factory(registry.ENGINES, name).check_config(params)
        assert raised.value.key == key and (known is None or raised.value.known == known)
    assert "max_tokens" in raised.value.known
