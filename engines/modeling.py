"""Model plumbing shared by the engines and the training script.

- block-causal 4-D additive attention masks (decoding with a block size or with explicit block
  ids, and the two-copy training layout);
- position ids for left-padded batches;
- building a small stock ``LlamaForCausalLM`` and loading model + tokenizer from a local folder,
  offline, through the Auto classes;
- device / dtype selection (CUDA + bf16 when available, else CPU float32);
- the fingerprint of a checkpoint (sha256 of its weight files, cached by path, size and mtime)
  and an engine's model-free identity (what ``fingerprint()`` and ``describe()`` return once built).

Conventions for block-diffusion models here: blocks are counted from position 0 of each row's
first real token (``block(p) = p // block_size``); logits at position ``i`` predict the token at
position ``i`` (no shift), as in SDAR and LLaDA.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

EMBEDDED_MODEL = Path(__file__).resolve().parent / "models" / "bd-tiny"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


# ---------------------------------------------------------------------------------------------
# Masks and positions


def block_causal_mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    block_size: int,
    dtype: torch.dtype,
    k_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The additive mask ``(batch, 1, q_len, k_len)``: 0 where a query may attend, finfo.min elsewhere.

    ``q_pos`` (batch, q_len) and ``k_pos`` (batch, k_len) are absolute positions (keys: the cache,
    then the input). A query attends a key iff ``block(key) <= block(query)`` and the key is valid
    (``k_valid``, False for left padding). A query whose row would be fully blocked (a padding
    query) attends the invalid keys instead, so no row is ever empty.
    """
    return block_mask(q_pos // block_size, k_pos // block_size, dtype, k_valid)


def block_mask(
    q_block: torch.Tensor,
    k_block: torch.Tensor,
    dtype: torch.dtype,
    k_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``block_causal_mask`` from explicit block ids instead of a fixed block size.

    ``q_block`` (batch, q_len) and ``k_block`` (batch, k_len) are any ids that increase with the
    position (blocks of mixed sizes: e.g. each block's start position). A query attends a key iff
    ``k_block <= q_block`` and the key is valid; a fully blocked query row attends the invalid keys.
    """
    allowed = k_block[:, None, :] <= q_block[:, :, None]
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :]
        empty = ~allowed.any(dim=-1, keepdim=True)
        allowed = allowed | (empty & ~k_valid[:, None, :])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def two_copy_mask(length: int, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The training mask over ``[noised (L) | clean (L)]``, shape ``(1, 1, 2L, 2L)``.

    Noised block k attends itself (bidirectionally) and the clean blocks before k; clean tokens
    attend clean tokens block-causally. Per block this equals "prefix clean, block noised, suffix
    absent" (the BD3-LM / SDAR objective), for every block of the sequence at once.
    """
    block = torch.arange(length) // block_size
    noised_to_noised = block[:, None] == block[None, :]
    noised_to_clean = block[None, :] < block[:, None]
    clean_to_clean = block[None, :] <= block[:, None]
    top = torch.cat([noised_to_noised, noised_to_clean], dim=1)
    bottom = torch.cat([torch.zeros_like(clean_to_clean), clean_to_clean], dim=1)
    allowed = torch.cat([top, bottom], dim=0)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def left_pad_positions(valid: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded batch: each row counts from 0 at its first real token."""
    return (valid.long().cumsum(dim=-1) - 1).clamp(min=0)


# ---------------------------------------------------------------------------------------------
# Building, loading, fingerprinting


@dataclass
class ModelConfig:
    vocab_size: int = 96  # the tokenizer's 83 ids, padded to a multiple of 32
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 256
    rope_theta: float = 10000.0


def build_model(cfg: ModelConfig, tokenizer) -> LlamaForCausalLM:
    """A fresh stock Llama whose config records the tokenizer's special ids."""
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def select_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def select_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; otherwise a torch dtype name."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"engine_args.dtype: expected auto, float32, float64, bfloat16 or float16, got {dtype!r}")
    return value


def load(path: str | Path, device: str = "auto", dtype: str | torch.dtype = "auto", trust_remote_code: bool = False):
    """Model (eval mode) and tokenizer from a local folder, offline; returns ``(model, tokenizer)``."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"engine_args.model: expected a save_pretrained folder with config.json, got {str(folder)!r}")
    dev = select_device(device)
    dt = select_dtype(dtype, dev)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        local_files_only=True,
        trust_remote_code=trust_remote_code,
        dtype=dt,
        attn_implementation="sdpa",
    )
    return model.to(dev).eval(), tokenizer


class WeightHashes:
    """sha256 of a checkpoint folder's weight files (names and contents, sorted by name), cached
    by the folder's path and each file's size and modification time, so that a large checkpoint
    is hashed once and not every session. ``path``: a JSON file kept beside the outcome store
    (None: in memory only). A changed, added or removed weight file invalidates the entry."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self._entries: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.is_file():
            try:
                self._entries = dict(json.loads(self.path.read_text()))
            except (OSError, ValueError, TypeError):
                self._entries = {}  # unreadable: rebuilt as folders are hashed

    def sha256(self, folder: str | Path) -> str:
        folder = Path(folder)
        files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()) if folder.is_dir() else []
        if not files:
            raise FileNotFoundError(f"{folder}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
        stats = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
        key = str(folder.resolve())
        entry = self._entries.get(key)
        if entry is not None and entry.get("files") == stats:
            return entry["sha256"]
        digest = hashlib.sha256()
        for file in files:
            digest.update(file.name.encode())
            with open(file, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        self._entries[key] = {"files": stats, "sha256": digest.hexdigest()}
        self._save()
        return digest.hexdigest()

    def _save(self) -> None:
        if self.path is None:
            return
        try:  # atomic: concurrent sessions (xdist workers) each write a whole file
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._entries, sort_keys=True, indent=1))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache folder: the hashes stay in memory


_HASHES = WeightHashes()


WEIGHT_HASHES = "weight-hashes.json"


def cache_weight_hashes(folder: str | Path | None) -> None:
    """Keep this process's weight hashes in ``folder``/weight-hashes.json (None: leave as is)."""
    global _HASHES
    if folder is not None and _HASHES.path != Path(folder) / WEIGHT_HASHES:
        _HASHES = WeightHashes(Path(folder) / WEIGHT_HASHES)


def fingerprint(*paths: str | Path) -> str:
    """sha256 over the weight files of a checkpoint folder (names and contents, sorted by name);
    of several folders, the sha256 of their fingerprints joined by ':'. Cached (:class:`WeightHashes`)."""
    parts = [_HASHES.sha256(path) for path in paths]
    return parts[0] if len(parts) == 1 else hashlib.sha256(":".join(parts).encode()).hexdigest()


def loaded_device(device: str | torch.device = "auto") -> torch.device:
    """The device a model's parameters land on when loaded with ``device`` (``cuda`` means the
    current CUDA device, as ``model.to("cuda")`` does), without loading one."""
    dev = select_device(device) if isinstance(device, str) else device
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def engine_arguments(cls: type, engine_args: Mapping[str, Any], cache_dir: str | Path | None = None) -> dict[str, Any]:
    """For an engine's model-free ``identity``: ``engine_args`` bound to the engine class's
    constructor, its defaults filled in (a TypeError names an unknown argument); weight hashes
    are cached in ``cache_dir`` from now on (:func:`cache_weight_hashes`)."""
    cache_weight_hashes(cache_dir)
    bound = inspect.signature(cls).bind(**engine_args)
    bound.apply_defaults()
    return dict(bound.arguments)


def identity(engine: str, device: str, dtype: str, weights: Sequence[str | Path], **paths_and_more) -> dict[str, Any]:
    """What a built engine's ``fingerprint()`` and ``describe()`` return, without loading a model:
    ``{"fingerprint": ..., "runtime": ...}``, for the outcome key of a warm rerun. ``weights``: the
    checkpoint folders, in the order the engine's fingerprint joins them."""
    dev = loaded_device(device)
    return {"fingerprint": fingerprint(*weights), "runtime": describe(engine, dev, select_dtype(dtype, dev), **paths_and_more)}


def active_layer_params(model) -> float:
    """Parameters of the decoder layers that one token runs through: every parameter, except that
    a mixture-of-experts layer's experts count ``num_experts_per_tok / num_experts`` of theirs
    (the router and any shared expert count in full). For the FLOPs estimate (2 per parameter
    per token): counting every expert of an MoE model overstates it (4.3x on a tiny Qwen3-MoE)."""
    cfg = model.config.get_text_config()
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    active = getattr(cfg, "num_experts_per_tok", None)
    share = active / experts if experts and active else 1.0
    total = 0.0
    for name, p in model.get_decoder().layers.named_parameters():
        routed = ".experts." in f".{name}" and "shared_expert" not in name
        total += p.numel() * (share if routed else 1.0)
    return total


def describe(engine: str, device, dtype, **paths_and_more) -> dict[str, str]:
    """Where and how an engine runs, for the outcome store's key: the engine, its model paths,
    the device, the dtype and the library versions (outcomes never mix CPU and GPU runs)."""
    return {
        "engine": engine,
        **{key: str(value) for key, value in paths_and_more.items()},
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def with_defaults(engine: str, params: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A config's parameters over the engine's defaults; an unknown key is a ValueError that
    names it and lists the known ones."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"{engine}: unknown config key {unknown[0]!r}; known keys: {', '.join(defaults)}")
    return {**defaults, **params}
