"""Published block-diffusion checkpoint folders: which family, what they declare, how they load.

A folder is read as published, never edited. :func:`read_checkpoint` reads ``config.json`` (and
``generation_config.json`` / ``tokenizer_config.json`` for the mask token) without loading a
model, detects the family from ``model_type`` and ``architectures``, and refuses what the
engines cannot serve with a :class:`CheckpointError` that names the file and the field. The gate
calls it (through :func:`check_engine_args`) while preparing a grid, so a bad checkpoint is a
usage error (exit 4) before anything decodes. :func:`load` then builds the model:

========  =========================================  ==========================================
family    detected by                                loads as
========  =========================================  ==========================================
sdar      model_type ``sdar`` / ``SDARForCausalLM``  stock ``Qwen3ForCausalLM`` (same weight names)
dream     model_type ``Dream`` / ``DreamModel``      stock ``Qwen2ForCausalLM``, full attention,
                                                     Dream's shifted logits (:class:`ShiftedDecoder`)
llada     model_type ``llada`` / ``LLaDAModelLM``    stock ``LlamaForCausalLM``, weights renamed
                                                     (:data:`LLADA_NAMES`), full attention
llada2    ``llada2_moe`` / ``llada21_moe`` /         the native model of ``llada2_model`` (no stock
          ``LLaDA2MoeModelLM``                       class exists; checks in ``llada2_config``)
native    anything else                              the Auto classes (``trust_remote_code`` as given)
========  =========================================  ==========================================

The remote code of SDAR, Dream, LLaDA and LLaDA2 is never run: SDAR's and LLaDA2's import
``transformers.modeling_attn_mask_utils`` (gone in transformers 5.x). Declared values:
``block_size`` (SDAR's config; none for Dream and LLaDA, which were trained without blocks;
LLaDA2: its official generate's 32), ``mask_token_id`` (config.json, else generation_config.json,
else the tokenizer's mask token; LLaDA2: the tokenizer's ``<|mask|>``), LLaDA2's EOS
(generation_config.json, else the tokenizer's) and the chat template (the tokenizer's). A grid
may override the block size (a config's ``block_size``), the mask id
(``engine_args.mask_token_id``) and the EOS (``engine_args.eos_token_id``);
:meth:`Checkpoint.describe` is what the engines report, and the JSON report shows it.

Decoding LLaDA or Dream with a block-causal cache is Fast-dLLM's prefix-cache approximation: both
were trained with full attention over the whole canvas (docs/how-to/checkpoints.md).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

FAMILIES = ("sdar", "dream", "llada", "llada2", "native")
REFUSED: dict[str, str] = {}  # family -> why no engine can serve it
# config.json keys of the published folders that the stock classes must not see
REMOTE_KEYS = ("auto_map", "model_type", "architectures", "attn_implementation", "torch_dtype", "dtype", "transformers_version")

# LLaDA (OLMo-style) weight names -> stock Llama names; {i} is the layer index
LLADA_NAMES = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
    "model.transformer.blocks.{i}.q_proj.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "model.transformer.blocks.{i}.k_proj.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "model.transformer.blocks.{i}.v_proj.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "model.transformer.blocks.{i}.attn_out.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "model.transformer.blocks.{i}.ff_proj.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "model.transformer.blocks.{i}.up_proj.weight": "model.layers.{i}.mlp.up_proj.weight",
    "model.transformer.blocks.{i}.ff_out.weight": "model.layers.{i}.mlp.down_proj.weight",
    "model.transformer.blocks.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "model.transformer.blocks.{i}.ff_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
}
# LLaDA config fields the Llama mapping supports, with the only value it supports
LLADA_REQUIRED = {
    "block_type": "llama", "layer_norm_type": "rms", "include_bias": False, "include_qkv_bias": False,
    "alibi": False, "input_emb_norm": False, "scale_logits": False, "attention_layer_norm": False,
    "rope": True, "activation_type": "silu", "block_group_size": 1,
}


class CheckpointError(ValueError):
    """A checkpoint the engines cannot serve; the message names the file, the field and the value."""


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint folder declares, read without loading a model."""

    folder: Path
    family: str
    config: Mapping[str, Any]
    block_size: int | None  # declared (config.json), None when the family has none
    mask_token_id: int | None  # the value used: the override, else the declared one
    mask_source: str  # where mask_token_id came from
    chat_template: str | None  # sha256 of the tokenizer's chat template, None without one
    eos_token_id: int | None = None  # LLaDA2, or engine_args.eos_token_id: the EOS the engines use
    eos_source: str = ""
    block_source: str = "config.json:block_size"

    @property
    def logit_shift(self) -> int:
        """1 when the logits at position i predict token i + 1 (Dream), else 0."""
        return 1 if self.family == "dream" else 0

    @property
    def loader(self) -> str:
        return {
            "sdar": "Qwen3ForCausalLM (stock)",
            "dream": "Qwen2ForCausalLM (stock) + full attention + shifted logits",
            "llada": "LlamaForCausalLM (stock, LLaDA names mapped) + full attention",
            "llada2": "LLaDA2MoeLM (native, engines/llada2_model.py; no remote code)",
        }.get(self.family, "AutoModelForCausalLM")

    def describe(self) -> dict[str, Any]:
        """The declared values, for the engines' ``describe()`` (outcome key) and the JSON report."""
        return {
            "family": self.family,
            "loader": self.loader,
            "declared_block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "mask_token_source": self.mask_source,
            "chat_template": self.chat_template or "none",
            **({"remote_code": "ignored: the native loader never runs the folder's code (trust_remote_code has no effect)"}
               if self.family == "llada2" else {}),
            **({"declared_block_source": self.block_source, "eos_token_id": self.eos_token_id,
                "eos_token_source": self.eos_source} if self.eos_token_id is not None else {}),
        }


# ---------------------------------------------------------------------------------------------
# Model-free: detection and declared values


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def detect(config: Mapping[str, Any]) -> str:
    """The family from ``model_type`` and ``architectures`` (see the module table)."""
    kind = str(config.get("model_type", "")).lower()
    archs = " ".join(config.get("architectures") or []).lower()
    if kind in ("llada2_moe", "llada21_moe", "bailing_moe_v2", "llada2") or "llada2" in archs or "bailingmoev2" in archs:
        return "llada2"
    if kind == "sdar" or "sdarforcausallm" in archs:
        return "sdar"
    if kind == "dream" or "dreammodel" in archs:
        return "dream"
    if kind == "llada" or "lladamodellm" in archs:
        return "llada"
    return "native"


def read_checkpoint(path: str | Path, mask_token_id: int | None = None, eos_token_id: int | None = None) -> Checkpoint:
    """Read a checkpoint folder's declared values; a :class:`CheckpointError` names what is wrong."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: engine_args.model: expected a checkpoint folder with config.json, got {str(folder)!r}")
    config = read_json(config_file)
    family = detect(config)
    if family in REFUSED:
        raise CheckpointError(f"{config_file}: model_type: {config.get('model_type')!r}: {REFUSED[family]}")
    if family == "llada":
        _check_llada(config, config_file)
    block_size = _block_size(config, config_file)
    extra: dict[str, Any] = {}
    if family == "llada2":
        extra = _llada2(folder, config, config_file, block_size, eos_token_id)
        block_size = extra.pop("block_size")
    elif eos_token_id is not None:
        extra = {"eos_token_id": _id(eos_token_id, Path("engine_args"), "eos_token_id"), "eos_source": "engine_args.eos_token_id"}
    declared_mask = extra.pop("mask", None)
    if mask_token_id is None and declared_mask is not None:
        mask, source = declared_mask
    else:
        mask, source = _mask(folder, config, mask_token_id, family)
    vocab = config.get("vocab_size") if family != "llada" else config.get("embedding_size") or config.get("vocab_size")
    if mask is not None and isinstance(vocab, int) and not 0 <= mask < vocab:
        raise CheckpointError(f"{folder / source.split(':')[0]}: mask_token_id: expected an id below vocab_size {vocab}, got {mask}")
    return Checkpoint(folder, family, config, block_size, mask, source, _chat_template(folder), **extra)


def _llada2(folder: Path, config: Mapping[str, Any], config_file: Path, block_size: int | None,
            eos_override: int | None) -> dict[str, Any]:
    """LLaDA2's checks (config flags, every weight's name and shape) and declared values: the
    block length of the official generate, the tokenizer's <|mask|>, the generation config's EOS."""
    from pytest_redline.engines import llada2_config

    try:
        llada2_config.check_weights(folder, llada2_config.model_config(config, config_file), config_file)
    except llada2_config.FolderError as e:
        raise CheckpointError(str(e)) from None
    values: dict[str, Any] = {"block_size": block_size}
    if block_size is None:
        values.update(block_size=llada2_config.GENERATE_BLOCK, block_source="LLaDA2 generate() default block_length")
    mask, where = llada2_config.declared_mask(folder)
    if mask is not None:
        values["mask"] = (mask, where)
    if eos_override is not None:
        values.update(eos_token_id=_id(eos_override, Path("engine_args"), "eos_token_id"), eos_source="engine_args.eos_token_id")
    else:
        eos, where = llada2_config.declared_eos(folder, config)
        if eos is None:
            raise CheckpointError(f"{folder / 'generation_config.json'}: eos_token_id: missing (nor the tokenizer's eos_token "
                                  "or config.json's eos_token_id); pass engine_args.eos_token_id")
        values.update(eos_token_id=eos, eos_source=where)
    return values


def _block_size(config: Mapping[str, Any], config_file: Path) -> int | None:
    value = config.get("block_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{config_file}: block_size: expected an int >= 1 (the block the model was trained with), got {value!r}")
    return value


def _mask(folder: Path, config: Mapping[str, Any], override: int | None, family: str) -> tuple[int | None, str]:
    """The mask id: ``engine_args.mask_token_id``, config.json, generation_config.json, the tokenizer."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override < 0:
            raise CheckpointError(f"engine_args.mask_token_id: expected an int >= 0, got {override!r}")
        return override, "engine_args.mask_token_id"
    if config.get("mask_token_id") is not None:
        return _id(config["mask_token_id"], folder / "config.json"), "config.json:mask_token_id"
    generation = folder / "generation_config.json"
    if generation.is_file() and read_json(generation).get("mask_token_id") is not None:
        return _id(read_json(generation)["mask_token_id"], generation), "generation_config.json:mask_token_id"
    token = _tokenizer_mask(folder)
    if token is not None:
        return token, "tokenizer:mask_token"
    if family in ("sdar", "dream", "llada", "llada2"):
        raise CheckpointError(
            f"{folder / 'config.json'}: mask_token_id: missing (nor in generation_config.json or the tokenizer's "
            f"mask_token); a {family} checkpoint must declare its mask token, or pass engine_args.mask_token_id"
        )
    return None, "none (the engine reads the tokenizer's)"


def _id(value: Any, file: Path, key: str = "mask_token_id") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"{file}: {key}: expected an int >= 0, got {value!r}")
    return value


def _tokenizer_mask(folder: Path) -> int | None:
    """The id of tokenizer_config.json's ``mask_token`` among its added tokens, model-free."""
    file = folder / "tokenizer_config.json"
    if not file.is_file():
        return None
    data = read_json(file)
    token = data.get("mask_token")
    token = token.get("content") if isinstance(token, Mapping) else token
    if not token:
        return None
    for key, entry in (data.get("added_tokens_decoder") or {}).items():
        if entry.get("content") == token:
            return int(key)
    tokens = folder / "tokenizer.json"
    if tokens.is_file():
        for entry in read_json(tokens).get("added_tokens", []):
            if entry.get("content") == token:
                return int(entry["id"])
    return None


def _chat_template(folder: Path) -> str | None:
    template = None
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    elif (folder / "tokenizer_config.json").is_file():
        template = read_json(folder / "tokenizer_config.json").get("chat_template")
    return hashlib.sha256(template.encode()).hexdigest()[:16] if isinstance(template, str) else None


def _check_llada(config: Mapping[str, Any], config_file: Path) -> None:
    for key, wanted in LLADA_REQUIRED.items():
        if key in config and config[key] != wanted and not (key == "block_group_size" and config[key] is None):
            raise CheckpointError(f"{config_file}: {key}: the stock Llama mapping supports {wanted!r}, got {config[key]!r}")
    for key in ("d_model", "n_layers", "n_heads"):
        if not isinstance(config.get(key), int):
            raise CheckpointError(f"{config_file}: {key}: expected an int (a LLaDA config), got {config.get(key)!r}")


def check_engine_args(engine_args: Mapping[str, Any]) -> Checkpoint | None:
    """The gate's model-free check of an engine's ``model`` (None: the engine's embedded model)."""
    model = engine_args.get("model")
    if model is None:
        return None
    return read_checkpoint(model, engine_args.get("mask_token_id"), engine_args.get("eos_token_id"))


# ---------------------------------------------------------------------------------------------
# Loading


def load(checkpoint: Checkpoint, device: str = "auto", dtype: str | Any = "auto", trust_remote_code: bool = False):
    """Model (eval mode, on the device) and tokenizer of a checkpoint read by :func:`read_checkpoint`; no remote code
    runs for sdar, dream and llada."""
    from pytest_redline.engines import modeling

    if checkpoint.family == "native":
        return modeling.load(checkpoint.folder, device, dtype, trust_remote_code)
    import torch

    dev = modeling.select_device(device)
    dt = modeling.select_dtype(dtype, dev)
    if checkpoint.family == "llada2":
        from pytest_redline.engines import llada2_config, llada2_load

        try:
            return llada2_load.load(checkpoint, dev, dt), load_tokenizer(checkpoint.folder)
        except llada2_config.FolderError as e:
            raise CheckpointError(str(e)) from None
    config = stock_config(checkpoint)
    tokenizer = load_tokenizer(checkpoint.folder)
    if checkpoint.family == "llada":
        model = _llada(checkpoint, config, dt)
    else:
        cls = _stock_class(checkpoint.family)
        model = cls.from_pretrained(checkpoint.folder, config=config, local_files_only=True, dtype=dt)
    with torch.no_grad():
        model = model.to(dev).eval()
    return model, tokenizer


def load_tokenizer(folder: Path):
    """The folder's tokenizer without remote code: the Auto class, else (a custom class such as
    Dream's ``DreamTokenizer``, which needs remote code) the stock fast tokenizer of its
    ``tokenizer.json``, else the stock Qwen2 byte-level BPE of its vocab.json and merges.txt
    (Dream's and SDAR's tokenizers are Qwen2's)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except ValueError as e:
        if "custom code" not in str(e) and "trust_remote_code" not in str(e):
            raise
    if (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return Qwen2Tokenizer.from_pretrained(folder, local_files_only=True)
    raise CheckpointError(f"{folder}: tokenizer_config.json: tokenizer_class needs remote code and the folder has "
                          "neither tokenizer.json nor vocab.json + merges.txt to load a stock tokenizer from")


def stock_config(checkpoint: Checkpoint):
    """The stock transformers config equivalent to the checkpoint's config.json."""
    from transformers import Qwen2Config, Qwen3Config

    raw = {k: v for k, v in checkpoint.config.items() if k not in REMOTE_KEYS}
    if checkpoint.family == "sdar":
        config = Qwen3Config(**raw)
    elif checkpoint.family == "dream":
        config = Qwen2Config(**raw)
    else:
        config = _llada_config(raw)
    config.mask_token_id = checkpoint.mask_token_id
    config._attn_implementation = "sdpa"
    return config


def _llada_config(raw: Mapping[str, Any]):
    from transformers import LlamaConfig

    heads = raw["n_heads"]
    kv = raw.get("n_kv_heads") or (1 if raw.get("multi_query_attention") else heads)
    hidden = raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * raw["d_model"]
    return LlamaConfig(
        vocab_size=raw.get("embedding_size") or raw["vocab_size"],
        hidden_size=raw["d_model"],
        intermediate_size=hidden,
        num_hidden_layers=raw["n_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv,
        hidden_act="silu",
        max_position_embeddings=raw.get("max_sequence_length", 4096),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
        rope_theta=raw.get("rope_theta", 10000.0),
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
        attention_bias=False,
        pad_token_id=raw.get("pad_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        bos_token_id=raw.get("bos_token_id"),
    )


def _stock_class(family: str):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

    if family == "sdar":
        return Qwen3ForCausalLM
    base = Qwen2ForCausalLM if family == "dream" else LlamaForCausalLM
    return type(f"{family.title()}AsStock", (FullAttentionMixin, base), {"logit_shift": int(family == "dream")})


def _llada(checkpoint: Checkpoint, config, dtype):
    """A stock Llama holding LLaDA's weights (renamed by :data:`LLADA_NAMES`)."""
    state = read_weights(checkpoint.folder)
    renamed = {}
    for name, tensor in state.items():
        target = rename_llada(name)
        if target is None:
            raise CheckpointError(f"{checkpoint.folder}: weight {name!r}: not a LLaDA (llama block) weight name")
        renamed[target] = tensor
    model = _stock_class("llada")(config)
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"{checkpoint.folder}: weights: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype)


def rename_llada(name: str) -> str | None:
    match = re.match(r"model\.transformer\.blocks\.(\d+)\.(.*)$", name)
    if match:
        template = f"model.transformer.blocks.{{i}}.{match.group(2)}"
        target = LLADA_NAMES.get(template)
        return target.format(i=match.group(1)) if target else None
    return LLADA_NAMES.get(name)


def read_weights(folder: Path) -> dict[str, Any]:
    """Every tensor of a folder's safetensors (or .bin) files."""
    import torch
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        state.update(load_file(file))
    if not files:
        for file in sorted(folder.glob("*.bin")):
            state.update(torch.load(file, map_location="cpu", weights_only=True))
    if not state:
        raise CheckpointError(f"{folder}: no weight files (*.safetensors, *.bin)")
    return state


# ---------------------------------------------------------------------------------------------
# Full attention and Dream's shifted logits


class FullAttentionMixin:
    """Full (non-causal) attention when no 4-D mask is given, as in LLaDA's and Dream's own code
    (the engines always pass their explicit 4-D mask). With ``logit_shift = 1`` (Dream: position
    i predicts token i + 1), ``forward`` returns Dream's ``cat([logits[:, :1], logits[:, :-1]])``
    so that ``logits[:, i]`` predicts token ``i``, and ``get_decoder()`` is a
    :class:`ShiftedDecoder` for the block-diffusion engines."""

    logit_shift = 0

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        import torch

        if attention_mask is None or attention_mask.dim() == 2:
            attention_mask = full_mask(input_ids, attention_mask, kwargs.get("cache") or kwargs.get("past_key_values"),
                                       self.get_input_embeddings().weight.dtype)
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if self.logit_shift and getattr(out, "logits", None) is not None:
            out.logits = torch.cat([out.logits[:, :1], out.logits[:, :-1]], dim=1)
        return out

    def get_decoder(self):
        decoder = super().get_decoder()
        if not self.logit_shift:
            return decoder
        if "_shifted_decoder" not in self.__dict__:
            self.__dict__["_shifted_decoder"] = ShiftedDecoder(decoder)  # not a submodule: no new weights
        return self.__dict__["_shifted_decoder"]


def full_mask(input_ids, valid, cache, dtype):
    """The additive 4-D mask of full attention over the cache and the input (``valid``: a 2-D
    padding mask over the input, or None)."""
    import torch

    batch, width = input_ids.shape
    cached = cache.get_seq_length() if cache is not None else 0
    keep = torch.ones(batch, width, dtype=torch.bool, device=input_ids.device) if valid is None else valid.bool()[:, -width:]
    keys = torch.cat([torch.ones(batch, cached, dtype=torch.bool, device=keep.device), keep], 1)
    mask = torch.zeros(batch, 1, width, cached + width, dtype=dtype, device=keep.device)
    return mask.masked_fill_(~keys[:, None, None, :], torch.finfo(dtype).min)


class ShiftedDecoder:
    """A decoder whose ``last_hidden_state[:, j]`` is the hidden state that predicts the token at
    query ``j``'s position: the one at position ``p - 1`` (Dream). That position is found among
    the keys query ``j`` may attend (the explicit 4-D mask): in this forward's queries, or in the
    cache, where this wrapper keeps every computed position's hidden state as one extra cache
    layer (keys: the hidden states; values: their positions), so that the engines' cache edits
    (crop, per-row gathers) keep it in step with the K/V. A query with no attendable predecessor
    (position 0, padding) keeps its own state, as Dream's ``logits[:, :1]``."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.layers = decoder.layers

    def forward(self, input_ids, attention_mask, position_ids, cache=None, use_cache=True, **kwargs):
        import torch
        from transformers.cache_utils import DynamicCache, DynamicLayer

        cache = DynamicCache() if cache is None else cache  # None: a throwaway (shift within this forward)
        n_layers = len(self.layers)
        extra = cache.layers[n_layers:]
        del cache.layers[n_layers:]
        try:
            out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=cache, use_cache=use_cache, **kwargs)
        finally:
            cache.layers.extend(extra)
        hidden = out.last_hidden_state
        batch, width, size = hidden.shape
        q_pos = position_ids.to(torch.float32)
        if extra:
            stash = extra[0]
            keys_h, keys_p = torch.cat([stash.keys[:, 0], hidden], 1), torch.cat([stash.values[:, 0, :, 0], q_pos], 1)
        else:
            stash = DynamicLayer()
            cache.layers.append(stash)
            keys_h, keys_p = hidden, q_pos
        allowed = attention_mask[:, 0] == 0  # (batch, width, keys)
        source = allowed & (keys_p[:, None, :] == (q_pos - 1)[:, :, None])
        column = source.int().argmax(-1)
        shifted = keys_h.gather(1, column[..., None].expand(-1, -1, size))
        stash.update(hidden[:, None], q_pos[:, None, :, None].expand(batch, 1, width, size).contiguous())
        out.last_hidden_state = torch.where(source.any(-1)[..., None], shifted, hidden)
        return out

    __call__ = forward
