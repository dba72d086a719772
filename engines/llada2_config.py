"""LLaDA2 (``llada2_moe``, ``llada21_moe``) folders, model-free: the config checks, the declared
values and the weight layout, read without torch from ``config.json``, the tokenizer files,
``generation_config.json`` and the safetensors headers (``model.safetensors.index.json`` and its
shards, or one ``model.safetensors``).

Refused (a ``FolderError`` naming the file and the field, exit 4 at the gate):

- a flag that contradicts the published modeling code, which never reads it: that code always
  normalises the chosen scores when top-k > 1 (``norm_topk_prob``), always uses sigmoid scores
  (``score_function``) and always adds ``expert_bias`` to the choice
  (``moe_router_enable_expert_bias``);
- what the published code cannot run either (an activation other than silu, a RoPE scaling,
  LLaDA2.0 with ``num_key_value_heads: 0``, experts that do not split into ``n_group`` groups);
- weights that disagree with the config: a shard the index names that is missing, a missing or
  unexpected tensor, a wrong shape, an expert count other than ``num_experts``.

Declared values: the mask id is the tokenizer's ``<|mask|>`` (published: 156895), EOS the
generation config's ``eos_token_id``, else the tokenizer's EOS (published: 156892), the block
length the official ``generate``'s default, 32.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any, Mapping

MODEL_TYPES = ("llada2_moe", "llada21_moe", "bailing_moe_v2")
MASK_TOKEN = "<|mask|>"
GENERATE_BLOCK = 32  # the official generate's block_length default (LLaDA2.0 and LLaDA2.1)
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# flags the published code never reads, with the only value its behaviour matches
FIXED_FLAGS = {"score_function": "sigmoid", "moe_router_enable_expert_bias": True}
EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")


class FolderError(ValueError):
    """A LLaDA2 folder the native model cannot load; the message names the file and the field
    (``checkpoints`` raises it again as its ``CheckpointError``)."""


def _error(message: str) -> FolderError:
    return FolderError(message)


_REQUIRED = object()


def _int(config: Mapping[str, Any], key: str, file: Path, minimum: int = 1, default: Any = _REQUIRED) -> Any:
    value = config.get(key, default)
    if value is None and default is None:
        return None
    if value is _REQUIRED or isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _error(f"{file}: {key}: expected an int >= {minimum}, got {config.get(key)!r}")
    return value


def model_config(config: Mapping[str, Any], file: Path) -> dict[str, Any]:
    """The fields the native model reads, with the published code's defaults, checked."""
    hidden = _int(config, "hidden_size", file)
    heads = _int(config, "num_attention_heads", file)
    kv = _int(config, "num_key_value_heads", file, minimum=0, default=0)
    if kv == 0 and config.get("model_type") == "llada21_moe":
        kv = heads  # LLaDA2.1's configuration maps 0 to the query heads
    if kv == 0 or heads % kv:
        raise _error(f"{file}: num_key_value_heads: expected a divisor of num_attention_heads {heads}, got {kv!r}")
    if config.get("hidden_act", "silu") != "silu":
        raise _error(f"{file}: hidden_act: the native LLaDA2 model supports 'silu', got {config['hidden_act']!r}")
    scaling = config.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        raise _error(f"{file}: rope_scaling: the native LLaDA2 model supports the default RoPE only, got {scaling!r}")
    fields = {
        "vocab_size": _int(config, "vocab_size", file),
        "hidden_size": hidden,
        "num_hidden_layers": _int(config, "num_hidden_layers", file),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": _int(config, "head_dim", file, default=None) or hidden // heads,
        "partial_rotary_factor": float(config.get("partial_rotary_factor", 0.5)),
        "rope_theta": float(config.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(config.get("rms_norm_eps", 1e-5)),
        "use_qkv_bias": bool(config.get("use_qkv_bias", False)),
        "use_qk_norm": bool(config.get("use_qk_norm", True)),
        "use_bias": bool(config.get("use_bias", True)),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "first_k_dense_replace": _int(config, "first_k_dense_replace", file, minimum=0, default=0),
        "intermediate_size": _int(config, "intermediate_size", file, default=None),
        "num_experts": None if config.get("num_experts", 16) is None else _int(config, "num_experts", file, default=16),
        "pad_token_id": config.get("pad_token_id"),
    }
    rotary = fields["head_dim"] * fields["partial_rotary_factor"]
    if rotary != int(rotary) or int(rotary) % 2 or not 0 < rotary <= fields["head_dim"]:
        raise _error(f"{file}: partial_rotary_factor: head_dim {fields['head_dim']} x {fields['partial_rotary_factor']} must be an even int")
    if fields["num_experts"] is not None:
        fields.update(_moe_fields(config, file, fields["num_experts"]))
    dense = fields["num_experts"] is None or fields["first_k_dense_replace"] > 0
    if dense and fields["intermediate_size"] is None:
        raise _error(f"{file}: intermediate_size: expected an int >= 1 (the dense layers' MLP), got None")
    return fields


def _moe_fields(config: Mapping[str, Any], file: Path, experts: int) -> dict[str, Any]:
    top_k = _int(config, "num_experts_per_tok", file, default=2)
    groups = _int(config, "n_group", file, default=8)
    topk_group = _int(config, "topk_group", file, default=4)
    for key, wanted in FIXED_FLAGS.items():
        if key in config and config[key] != wanted:
            raise _error(f"{file}: {key}: the published LLaDA2 code always behaves as {key}: {json.dumps(wanted)} "
                         f"(it never reads the flag), got {json.dumps(config[key])}")
    if "norm_topk_prob" in config and bool(config["norm_topk_prob"]) != (top_k > 1):
        raise _error(f"{file}: norm_topk_prob: the published LLaDA2 code normalises the chosen scores exactly when "
                     f"num_experts_per_tok > 1 (it never reads the flag); with num_experts_per_tok {top_k}, got "
                     f"{json.dumps(config['norm_topk_prob'])}")
    if experts % groups or experts // groups < 2:
        raise _error(f"{file}: n_group: expected a divisor of num_experts {experts} leaving >= 2 experts per group, got {groups}")
    if topk_group > groups or top_k > topk_group * (experts // groups):
        raise _error(f"{file}: topk_group: {topk_group} of {groups} groups cannot hold num_experts_per_tok {top_k}")
    return {
        "num_experts_per_tok": top_k, "n_group": groups, "topk_group": topk_group,
        "routed_scaling_factor": float(config.get("routed_scaling_factor", 2.5)),
        "moe_intermediate_size": _int(config, "moe_intermediate_size", file),
        "num_shared_experts": _int(config, "num_shared_experts", file, minimum=0, default=0) or 0,
    }


def expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every published weight name with its shape, from the checked config."""
    hidden, vocab, head = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * head
    shapes: dict[str, tuple[int, ...]] = {"model.word_embeddings.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "attention.query_key_value.weight": (qkv, hidden),
                       p + "attention.dense.weight": (hidden, cfg["num_attention_heads"] * head)})
        if cfg["use_qkv_bias"]:
            shapes[p + "attention.query_key_value.bias"] = (qkv,)
        if cfg["use_bias"]:
            shapes[p + "attention.dense.bias"] = (hidden,)
        if cfg["use_qk_norm"]:
            shapes[p + "attention.query_layernorm.weight"] = shapes[p + "attention.key_layernorm.weight"] = (head,)
        if cfg["num_experts"] is None or i < cfg["first_k_dense_replace"]:
            shapes.update(_mlp(p + "mlp.", hidden, cfg["intermediate_size"]))
            continue
        experts, inner = cfg["num_experts"], cfg["moe_intermediate_size"]
        shapes.update({p + "mlp.gate.weight": (experts, hidden), p + "mlp.gate.expert_bias": (experts,)})
        for e in range(experts):
            shapes.update(_mlp(f"{p}mlp.experts.{e}.", hidden, inner))
        if cfg["num_shared_experts"]:
            shapes.update(_mlp(p + "mlp.shared_experts.", hidden, inner * cfg["num_shared_experts"]))
    return shapes


def _mlp(prefix: str, hidden: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (inner, hidden), prefix + "up_proj.weight": (inner, hidden),
            prefix + "down_proj.weight": (hidden, inner)}


# ---------------------------------------------------------------------------------------------
# Weights: safetensors headers, read without torch


def read_header(file: Path) -> dict[str, Any]:
    """A safetensors file's header: ``{name: {"dtype", "shape", "data_offsets"}}`` plus
    ``"__data__"``, the byte offset where the data starts."""
    try:
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise _error(f"{file}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    header.pop("__metadata__", None)
    header["__data__"] = 8 + size
    return header


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the shard that holds it: from the index (every shard it names must exist),
    else the single ``model.safetensors``."""
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise _error(f"{index}: weight_map: expected {{tensor: shard file}} ({type(e).__name__}: {e})") from None
        for name, shard in weight_map.items():
            if not (folder / shard).is_file():
                raise _error(f"{index}: weight_map: {name} is in {shard}, which is missing from {folder}")
        return {name: folder / shard for name, shard in weight_map.items()}
    if (folder / SINGLE).is_file():
        return dict.fromkeys(read_header(folder / SINGLE).keys() - {"__data__"}, folder / SINGLE)
    raise _error(f"{folder}: {INDEX}: missing (nor {SINGLE}): a LLaDA2 folder holds its weights in safetensors")


def check_weights(folder: Path, cfg: Mapping[str, Any], config_file: Path) -> dict[str, tuple[Path, dict[str, Any], int]]:
    """Every expected tensor, found with its shape: ``{name: (file, header entry, data start)}``."""
    files = weight_files(folder)
    headers = {file: read_header(file) for file in set(files.values())}
    experts = {int(m.group(2)) for name in files if (m := EXPERT.match(name))}
    if experts and cfg["num_experts"] is not None and max(experts) + 1 != cfg["num_experts"]:
        name = next(n for n in sorted(files) if (m := EXPERT.match(n)) and int(m.group(2)) == max(experts))
        raise _error(f"{config_file}: num_experts: {cfg['num_experts']}, but {files[name]} holds {name} "
                     f"({max(experts) + 1} experts per layer)")
    expected = expected_shapes(cfg)
    found: dict[str, tuple[Path, dict[str, Any], int]] = {}
    for name, shape in expected.items():
        if name not in files:
            raise _error(f"{folder}: {name}: missing from the weights (config.json: {config_file.name} expects it, shape {list(shape)})")
        header = headers[files[name]]
        if name not in header:
            raise _error(f"{files[name]}: {name}: missing from the shard ({INDEX} says it is there)")
        if tuple(header[name]["shape"]) != shape:
            raise _error(f"{files[name]}: {name}: expected shape {list(shape)} (from {config_file.name}), got {header[name]['shape']}")
        found[name] = (files[name], header[name], header["__data__"])
    unexpected = sorted(set(files) - set(expected))
    if unexpected:
        raise _error(f"{files[unexpected[0]]}: {unexpected[0]}: not a weight of this config ({config_file.name}); "
                     f"{len(unexpected)} unexpected tensor(s)")
    return found


# ---------------------------------------------------------------------------------------------
# Declared values


def _added_tokens(folder: Path) -> dict[str, int]:
    """The tokenizer's added tokens (content -> id), from tokenizer_config.json and tokenizer.json."""
    tokens: dict[str, int] = {}
    if (folder / "tokenizer.json").is_file():
        for entry in json.loads((folder / "tokenizer.json").read_text()).get("added_tokens", []):
            tokens[entry["content"]] = int(entry["id"])
    if (folder / "tokenizer_config.json").is_file():
        for key, entry in (json.loads((folder / "tokenizer_config.json").read_text()).get("added_tokens_decoder") or {}).items():
            tokens[entry["content"]] = int(key)
    return tokens


def declared_mask(folder: Path) -> tuple[int | None, str]:
    token = _added_tokens(folder).get(MASK_TOKEN)
    return (token, f"tokenizer:{MASK_TOKEN}") if token is not None else (None, "")


def declared_eos(folder: Path, config: Mapping[str, Any]) -> tuple[int | None, str]:
    """EOS: generation_config.json, else the tokenizer's eos_token, else config.json."""
    generation = folder / "generation_config.json"
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int):
            return value, "generation_config.json:eos_token_id"
    if (folder / "tokenizer_config.json").is_file():
        token = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
        token = token.get("content") if isinstance(token, Mapping) else token
        if token in _added_tokens(folder):
            return _added_tokens(folder)[token], "tokenizer:eos_token"
    if isinstance(config.get("eos_token_id"), int):
        return config["eos_token_id"], "config.json:eos_token_id"
    return None, ""
