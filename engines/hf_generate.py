"""The generate-driven engine: a transformers model's own ``generate()``, its keyword arguments a config.

This gates transformers' own serving knobs without re-implementing them:

- DiffusionGemma (``DiffusionGemmaForBlockDiffusion``, transformers 5.x): ``confidence_threshold``,
  ``stability_threshold``, ``max_denoising_steps``, ``sampler_config`` (a mapping, e.g.
  ``{entropy_bound: 0.1}``), ``t_min``/``t_max``, ``max_new_tokens``;
- any other causal LM: ``prompt_lookup_num_tokens``, ``assistant_model`` (a model folder: assisted
  generation), ``num_assistant_tokens``, ``cache_implementation`` (``quantized`` needs
  optimum-quanto or hqq: ``pip install 'pytest-redline[kvquant]'``), ``cache_config``,
  ``do_sample``/``temperature``/``top_k``/``top_p``, ``max_new_tokens``.

Each prompt is one ``generate`` call (batch size 1: assisted generation accepts no other, and
each prompt gets its own seed), recorded as ``extra["batch_size"]``. The seed of a prompt is
``prompt_seed(prompt.id, engine_args.seed)``, set with ``torch.manual_seed`` before its call:
DiffusionGemma's default sampler is random (a random canvas, temperatures 0.4-0.8), and the grid's
seed is part of ``engine_args`` and so of the outcome key; reruns are reproducible.

Counting (``engines.base``): forwards are counted by forward hooks on the modules that actually
run (``__call__``; ``generate`` calls the top-level ``forward`` directly for DiffusionGemma, so
its hooks sit on ``model.model.decoder``, one per denoising step, and ``model.model.encoder``, one
per canvas). ``forwards`` = every counted call; ``extra["denoising_forwards"]`` = decoder calls,
checked against the model's own step count (``generated tokens / tokens_per_forward``); a
mismatch is an error. An assistant's forwards go to ``extra["draft_forwards"]``. ``tokens`` = the
generated tokens up to and including the first EOS. Stop strings (``Prompt.stop``) cut the text
and the tokens; causal LMs also stop there (``generate(stop_strings=...)``), DiffusionGemma's
generate has no such option, so its forwards are those it ran.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import ConfigError, Generation, Prompt, cut_at_stop
from pytest_redline.engines import runtime
from pytest_redline.engines.common import encode, eos_ids, set_threads

DIFFUSION_KEYS = ("confidence_threshold", "stability_threshold", "max_denoising_steps", "sampler_config", "t_min", "t_max")
CAUSAL_KEYS = (
    "prompt_lookup_num_tokens", "assistant_model", "num_assistant_tokens", "cache_implementation", "cache_config",
    "do_sample", "temperature", "top_k", "top_p",
)
KEYS = ("max_new_tokens",) + DIFFUSION_KEYS + CAUSAL_KEYS
QUANTIZED_CACHE_BACKENDS = ("optimum.quanto", "hqq")


def prompt_seed(prompt_id: str, seed: int) -> int:
    """The seed of one prompt: sha256 of the grid's seed and the prompt id (63 bits)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{prompt_id}".encode()).digest()[:8], "big") >> 1


def quantized_cache_backend() -> str | None:
    """The installed backend for ``cache_implementation: quantized`` (None: neither)."""
    for name in QUANTIZED_CACHE_BACKENDS:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ModuleNotFoundError:
            continue
    return None


def check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A config's generate kwargs, checked without a model: known keys, their types."""
    unknown = sorted(set(params) - set(KEYS))
    if unknown:
        raise ConfigError(unknown[0], f"hf_generate: unknown config key {unknown[0]!r}; known keys: {', '.join(KEYS)}", KEYS)
    ints = ("max_new_tokens", "stability_threshold", "max_denoising_steps", "prompt_lookup_num_tokens", "num_assistant_tokens", "top_k")
    for key in ints:
        if key in params and (isinstance(params[key], bool) or not isinstance(params[key], int) or params[key] < 1):
            raise ConfigError(key, f"hf_generate: {key}: expected int >= 1, got {params[key]!r}")
    for key in ("confidence_threshold", "t_min", "t_max", "temperature", "top_p"):
        if key in params and (isinstance(params[key], bool) or not isinstance(params[key], (int, float)) or params[key] < 0):
            raise ConfigError(key, f"hf_generate: {key}: expected a number >= 0, got {params[key]!r}")
    if "sampler_config" in params and not isinstance(params["sampler_config"], Mapping):
        raise ConfigError("sampler_config", f"hf_generate: sampler_config: expected a mapping (e.g. {{entropy_bound: 0.1}}), got {params['sampler_config']!r}")
    if "assistant_model" in params and not (Path(str(params["assistant_model"])) / "config.json").is_file():
        raise ConfigError("assistant_model", f"hf_generate: assistant_model: expected a model folder with config.json, got {params['assistant_model']!r}")
    if params.get("cache_implementation") == "quantized" and quantized_cache_backend() is None:
        raise ConfigError("cache_implementation", "hf_generate: cache_implementation: 'quantized' needs optimum-quanto or hqq "
                         "(pip install 'pytest-redline[kvquant]'); neither is installed")
    if params.get("assistant_model") is not None and params.get("prompt_lookup_num_tokens") is not None:
        raise ConfigError("prompt_lookup_num_tokens", "hf_generate: assistant_model and prompt_lookup_num_tokens: expected one of them, got both")
    return dict(params)


class Counter:
    """Forward hooks that count calls per module name."""

    def __init__(self, modules: Mapping[str, Any]):
        self.counts = {name: 0 for name in modules}
        self.handles = [module.register_forward_hook(self._hook(name)) for name, module in modules.items()]

    def _hook(self, name: str):
        def hook(module, args, output):
            self.counts[name] += 1
        return hook

    def reset(self) -> None:
        self.counts = {name: 0 for name in self.counts}


class HFGenerateEngine:
    """``HFGenerateEngine(model=PATH, device="auto", dtype="auto", seed=0, threads=None,
    trust_remote_code=False)``: the model's own ``generate()``, driven one prompt at a time."""

    name = "hf_generate"

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        check_params(params)

    @staticmethod
    def check_engine_args(engine_args: Mapping[str, Any]) -> dict[str, Any]:
        """Model-free: the folder's config.json, its family and declared block (canvas) length."""
        from pytest_redline.engines.checkpoints import CheckpointError, read_json

        folder = Path(str(engine_args.get("model")))
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"{folder / 'config.json'}: engine_args.model: expected a model folder with config.json, got {str(folder)!r}")
        config = read_json(folder / "config.json")
        seed = engine_args.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"hf_generate: engine_args.seed: expected an int, got {seed!r}")
        return {"family": str(config.get("model_type")), "declared_block_size": config.get("canvas_length"),
                "block_size_used": config.get("canvas_length"), "mask_token_id": config.get("mask_token_id"), "seed": seed,
                "batch_size": 1}

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Model-free: what ``fingerprint()`` and ``describe()`` return once built (a warm rerun
        keys its outcomes without loading the model, nor importing torch)."""
        runtime.cache_weight_hashes(cache_dir)
        bound = inspect.signature(cls).bind(**engine_args)  # a TypeError names an unknown argument
        bound.apply_defaults()
        args = dict(bound.arguments)
        declared = cls.check_engine_args(args)
        return runtime.identity(cls.name, args["device"], args["dtype"], [args["model"]], **cls._described(Path(args["model"]), args["seed"], declared))

    @staticmethod
    def _described(path: Path, seed: int, declared: Mapping[str, Any]) -> dict[str, Any]:
        return {"model": path, "seed": seed, "seed_rule": "sha256(seed/prompt id)", "batch_size": 1, "family": declared["family"]}

    def __init__(self, model: str | Path, device: str = "auto", dtype: str = "auto", seed: int = 0,
                 threads: int | None = None, trust_remote_code: bool = False):
        import torch

        from pytest_redline.engines import modeling

        set_threads(threads, self.name)
        self.declared = self.check_engine_args({"model": model, "seed": seed})
        self.path, self.seed, self.trust_remote_code = Path(model), seed, trust_remote_code
        self.device = modeling.select_device(device)
        self.dtype = modeling.select_dtype(dtype, self.device)
        self.diffusion = self.declared["family"] == "diffusion_gemma"
        self.model, self.tokenizer = self._load(self.path)
        self.device = next(self.model.parameters()).device  # e.g. cuda:0, as the identity says
        self.eos_ids = eos_ids(self.model, self.tokenizer, str(self.path))
        if self.diffusion:  # generate() calls forward() directly: hook the submodules that run
            modules = {"decoder": self.model.model.decoder, "encoder": self.model.model.encoder}
        else:
            modules = {"model": self.model}
        self.counter = Counter(modules)
        self._assistants: dict[str, tuple[Any, Counter]] = {}
        self._fingerprint: str | None = None
        self._torch = torch

    def _load(self, folder: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=self.trust_remote_code)
        if self.diffusion:
            from transformers import DiffusionGemmaForBlockDiffusion as cls
        else:
            cls = AutoModelForCausalLM
        model = cls.from_pretrained(folder, local_files_only=True, dtype=self.dtype, trust_remote_code=self.trust_remote_code)
        return model.to(self.device).eval(), tokenizer

    # -- protocol ---------------------------------------------------------------------------

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = runtime.fingerprint(self.path)
        return self._fingerprint

    def describe(self) -> dict[str, str]:
        return runtime.describe(self.name, self.device, self.dtype, **self._described(self.path, self.seed, self.declared))

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        kwargs = self._kwargs(check_params(config))
        return [self._one(prompt, kwargs) for prompt in prompts]

    # -- one prompt -------------------------------------------------------------------------

    def _kwargs(self, params: dict[str, Any]) -> dict[str, Any]:
        """generate's keyword arguments from a config (dataclasses and models built here)."""
        kwargs = dict(params)
        if self.diffusion:
            bad = sorted(set(kwargs) & set(CAUSAL_KEYS))
            if bad:
                raise ValueError(f"hf_generate: {bad[0]}: not a DiffusionGemma generate option (it takes {', '.join(DIFFUSION_KEYS)})")
            if "sampler_config" in kwargs:
                from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

                kwargs["sampler_config"] = EntropyBoundSamplerConfig(**kwargs["sampler_config"])
        else:
            bad = sorted(set(kwargs) & set(DIFFUSION_KEYS))
            if bad:
                raise ValueError(f"hf_generate: {bad[0]}: a DiffusionGemma option; {self.path} is a {self.declared['family']}")
            if "assistant_model" in kwargs:
                kwargs["assistant_model"] = self._assistant(str(kwargs["assistant_model"]))[0]
            kwargs.setdefault("do_sample", False)
            kwargs["return_dict_in_generate"] = True
        return kwargs

    def _assistant(self, folder: str):
        if folder not in self._assistants:
            model, _ = self._load(Path(folder))
            self._assistants[folder] = (model, Counter({"assistant": model}))
        return self._assistants[folder]

    def _one(self, prompt: Prompt, kwargs: dict[str, Any]) -> Generation:
        torch = self._torch
        ids = torch.tensor([encode(self.tokenizer, prompt, self.name)], device=self.device)
        call = dict(kwargs)
        if prompt.stop and not self.diffusion:
            call.update(stop_strings=list(prompt.stop), tokenizer=self.tokenizer)
        for _, counter in self._assistants.values():
            counter.reset()
        self.counter.reset()
        torch.manual_seed(prompt_seed(prompt.id, self.seed))
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **call)
        new = out.sequences[0, ids.shape[1]:].tolist()
        extra = {"batch_size": 1.0, "seed": float(prompt_seed(prompt.id, self.seed) % 2**52)}
        if self.diffusion:
            extra["denoising_forwards"] = float(self._check_steps(out, new))
        draft = sum(c.counts["assistant"] for _, c in self._assistants.values())
        if draft:
            extra["draft_forwards"] = float(draft)
        return self._generation(new, sum(self.counter.counts.values()), extra, prompt)

    def _check_steps(self, out, new: list[int]) -> int:
        """The hooked decoder calls, checked against DiffusionGemma's own count (its
        ``tokens_per_forward`` = non-pad generated tokens / denoising forwards)."""
        hooked = self.counter.counts["decoder"]
        pad = self.model.generation_config.pad_token_id
        valid = sum(t != pad for t in new) if pad is not None else len(new)
        tpf = float(out.tokens_per_forward[0])
        if valid and tpf > 0 and round(valid / tpf) != hooked:
            raise RuntimeError(f"hf_generate: {self.path}: the decoder hook counted {hooked} denoising forwards, "
                               f"the model's own tokens_per_forward implies {valid / tpf:g}")
        return hooked

    def _generation(self, new: list[int], forwards: int, extra: dict[str, float], prompt: Prompt) -> Generation:
        out, finish = [], "length"
        for token in new:
            out.append(token)
            if token in self.eos_ids:
                finish = "eos"
                break
        body = [t for t in out if t not in self.eos_ids]
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        if prompt.stop:
            cut, hit = cut_at_stop(text, prompt.stop)
            if hit:
                kept = next(k for k in range(len(body) + 1) if cut_at_stop(self.tokenizer.decode(body[:k], skip_special_tokens=False), prompt.stop)[1])
                text, out, finish = cut, out[:kept], "stop"
        return Generation(text=text, tokens=len(out), forwards=forwards, extra=extra, finish_reason=finish)
