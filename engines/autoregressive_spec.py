"""The model-free half of the autoregressive engines (speculative decoding, quantized weights):
their configs' parameters and defaults, constructor arguments, prepare-time checks and
identity. Imports no torch (see ``spec``); the engines live in speculative.py and
quantized.py and derive from these specs.
"""
from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pytest_redline.contracts import ConfigError
from pytest_redline.engines import runtime
from pytest_redline.engines.runtime import AR_DRAFT, AR_TARGET
from pytest_redline.engines.spec import EngineSpec, defaults, with_defaults

ACCEPTANCE = ("lossless", "typical")
TYPICAL_ONLY = ("posterior_threshold", "posterior_alpha", "temperature")


@dataclass(frozen=True)
class SpecConfig:
    acceptance: str = "lossless"  # or "typical"
    num_draft_tokens: int = 4
    posterior_threshold: float = 0.09  # ε (Medusa's default)
    posterior_alpha: float | None = None  # δ; None: √ε (from_params fills it in)
    temperature: float = 1.0  # of the softmax that the typical criterion reads
    max_new_tokens: int = 96
    use_cache: bool = True  # False recomputes every forward from the first token: the reference for tests

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "SpecConfig":
        values = with_defaults("speculative", params, cls)
        if values["acceptance"] not in ACCEPTANCE:
            raise ConfigError("acceptance", f"speculative: acceptance: expected one of {', '.join(ACCEPTANCE)}, got {values['acceptance']!r}")
        if values["acceptance"] == "lossless":
            given = [key for key in TYPICAL_ONLY if key in params]
            if given:
                raise ConfigError(given[0], f"speculative: {given[0]}: applies only to acceptance: typical, got acceptance: lossless")
        for key in ("num_draft_tokens", "max_new_tokens"):
            if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < 1:
                raise ConfigError(key, f"speculative: {key}: expected int >= 1, got {values[key]!r}")
        if values["posterior_alpha"] is None:
            values["posterior_alpha"] = _checked_number(values, "posterior_threshold", 0.0, 1.0) ** 0.5
        _checked_number(values, "posterior_threshold", 0.0, 1.0)
        _checked_number(values, "posterior_alpha", 0.0, math.inf)
        _checked_number(values, "temperature", 0.0, math.inf)
        if not isinstance(values["use_cache"], bool):
            raise ConfigError("use_cache", f"speculative: use_cache: expected true or false, got {values['use_cache']!r}")
        return cls(**values)


def _checked_number(values: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(key, f"speculative: {key}: expected a number in [{low}, {high}], got {value!r}")
    return float(value)


SPEC_DEFAULTS = defaults(SpecConfig)  # the parameters as a mapping (tests read it)

MODES = ("none", "int8", "nf4", "fp4")


@dataclass(frozen=True)
class QuantizedConfig:
    quantization: str = "none"  # one of MODES
    max_new_tokens: int = 96


def quantized_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """A quantized config's parameters over the defaults; a ConfigError names a bad key or value."""
    values = with_defaults("quantized", params, QuantizedConfig)
    if values["quantization"] not in MODES:
        raise ConfigError("quantization", f"quantized: quantization: expected one of {', '.join(MODES)}, got {values['quantization']!r}")
    n = values["max_new_tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("max_new_tokens", f"quantized: max_new_tokens: expected int >= 1, got {n!r}")
    return values


def quantization_runtime(device: str) -> dict[str, str]:
    """What, besides the device, decides the quantized outcomes and their memory: bitsandbytes'
    version, and the dtype of the 4-bit layers' absmax scales (:func:`absmax_dtype`)."""
    return {
        "quantization": f"bitsandbytes {importlib.metadata.version('bitsandbytes')} ({', '.join(MODES[1:])})",
        "absmax_4bit": absmax_dtype(device),
    }


def absmax_dtype(device: str) -> str:
    """The dtype of the nf4/fp4 absmax scales once a layer has run a forward: bitsandbytes
    (``Linear4bit.forward``, 0.48+) repacks them to bfloat16 for its CPU kernel when the CPU has
    AVX512-BF16, and keeps float32 elsewhere and on CUDA. So nf4's weight memory on the embedded
    ar-target is 612,608 bytes on such a CPU and 645,376 bytes otherwise: the outcome key records
    it. Read from the CPU flags without importing bitsandbytes (the engine checks it after loading)."""
    if not str(device).startswith("cpu"):
        return "float32"
    try:
        flags = {word for line in open("/proc/cpuinfo") if line.startswith("flags") for word in line.split()}
    except OSError:
        flags = set()
    return "bfloat16" if "avx512_bf16" in flags else "float32"


def check_tokenizer_files(engine_args: Mapping[str, Any]) -> None:
    """Model-free, while the gate prepares a grid: the draft must tokenize as the target does,
    read from their tokenizer files (no model loads). Vocabulary sizes may differ by embedding
    padding only; the engine never picks a padding id (``autoregressive.only_tokens``).
    Folders whose tokenizer files are byte for byte the same pass without loading a tokenizer."""
    paths = {key: Path(engine_args[key]) if engine_args.get(key) is not None else default
             for key, default in (("target", AR_TARGET), ("draft", AR_DRAFT))}
    if _tokenizer_files(paths["target"]) == _tokenizer_files(paths["draft"]) != {}:
        return
    from transformers import AutoTokenizer

    trust = bool(engine_args.get("trust_remote_code", False))
    tokenizers = {key: AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust) for key, path in paths.items()}
    check_same_tokenizer(tokenizers["target"], tokenizers["draft"], paths["target"], paths["draft"])


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja")


def _tokenizer_files(folder: Path) -> dict[str, bytes]:
    """The contents of the tokenizer files in ``folder`` (those it has, remote code included), by name."""
    names = [*TOKENIZER_FILES, *(p.name for p in folder.glob("tokenization*.py"))] if folder.is_dir() else []
    return {name: (folder / name).read_bytes() for name in names if (folder / name).is_file()}


def check_same_tokenizer(target, draft, target_path: Path, draft_path: Path) -> None:
    """Raise ValueError unless the draft and the target tokenize alike (same vocabulary and specials)."""
    where = f"speculative: engine_args.draft: the draft's tokenizer ({draft_path}) differs from the target's ({target_path})"
    t_vocab, d_vocab = target.get_vocab(), draft.get_vocab()
    for token in sorted(set(t_vocab) | set(d_vocab)):
        if t_vocab.get(token) != d_vocab.get(token):
            raise ValueError(f"{where}: token {token!r} has id {t_vocab.get(token)} in the target, {d_vocab.get(token)} in the draft")
    for special in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(target, special) != getattr(draft, special):
            raise ValueError(f"{where}: {special} is {getattr(target, special)} in the target, {getattr(draft, special)} in the draft")


class SpeculativeSpec(EngineSpec):
    """``SpeculativeEngine(target=PATH, draft=PATH, device="auto", dtype="auto", threads=None,
    trust_remote_code=False)``; the models default to the embedded ``ar-target`` and ``ar-draft``."""

    name = "speculative"
    engine = "pytest_redline.engines.speculative:SpeculativeEngine"
    Config = SpecConfig
    engine_args = {"target": None, "draft": None, "device": "auto", "dtype": "auto", "threads": None, "trust_remote_code": False}

    @staticmethod
    def check_engine_args(engine_args: Mapping[str, Any]) -> None:
        """The gate's model-free check at prepare time: see :func:`check_tokenizer_files`."""
        check_tokenizer_files(engine_args)

    @classmethod
    def cost_bounds(cls, engine_args: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        """Model-free, per prompt: every target forward (a round; the first is the prefill) appends
        1 to γ + 1 tokens until the request ends (at the first EOS, the token completing a stop
        string, or ``max_new_tokens``), so tokens per forward is in [1, γ + 1], and both tokens
        and forwards are in [1, max_new_tokens]."""
        cfg = SpecConfig.from_params(params)
        return {"tokens": (1, cfg.max_new_tokens), "forwards": (1, cfg.max_new_tokens),
                "tokens_per_forward": (1, cfg.num_draft_tokens + 1)}

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Model-free: what ``fingerprint()`` and ``describe()`` return once built (a warm rerun's
        key); weight hashes are cached in ``cache_dir``."""
        args = cls.arguments(engine_args, cache_dir)
        target = Path(args["target"]) if args["target"] is not None else AR_TARGET
        draft = Path(args["draft"]) if args["draft"] is not None else AR_DRAFT
        return runtime.identity(
            cls.name, args["device"], args["dtype"], [target, draft], target=target, draft=draft, quantization="none"
        )


class QuantizedSpec(EngineSpec):
    """``QuantizedEngine(model=PATH, device="auto", dtype="auto", measure_peak=True, threads=None,
    trust_remote_code=False)``; the model defaults to the embedded ``ar-target``."""

    name = "quantized"
    engine = "pytest_redline.engines.quantized:QuantizedEngine"
    engine_args = {"model": None, "device": "auto", "dtype": "auto", "measure_peak": True, "threads": None, "trust_remote_code": False}

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        quantized_config(params)

    @classmethod
    def cost_bounds(cls, engine_args: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """Model-free: the weight memory (and its scales' share) is the same on every prompt of a
        config (that mode's loaded weights), so it is known once one prompt is decoded; tokens
        are in [1, max_new_tokens] (decoding ends at the first EOS or stop, each counted)."""
        return {"memory": "constant", "memory_scales": "constant", "tokens": (1, quantized_config(params)["max_new_tokens"])}

    @classmethod
    def identity(cls, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Model-free: what ``fingerprint()`` and ``describe()`` return once built (a warm rerun's
        key); weight hashes are cached in ``cache_dir``."""
        args = cls.arguments(engine_args, cache_dir)
        path = Path(args["model"]) if args["model"] is not None else AR_TARGET
        device = runtime.device_name(args["device"])
        return runtime.identity(cls.name, device, args["dtype"], [path], model=path, **quantization_runtime(device))
