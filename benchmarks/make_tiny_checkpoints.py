"""Tiny random checkpoints in the published folder layouts of SDAR, Dream, LLaDA and DiffusionGemma.

    python benchmarks/make_tiny_checkpoints.py OUT_DIR        # writes OUT_DIR/{sdar,dream,llada,llada2,llada21,diffusion_gemma}

Each folder carries the published ``config.json`` fields (model_type, architectures, auto_map,
block_size, mask_token_id, ...) with tiny sizes, and the weights under the published names:

- ``sdar``: SDAR-4B-Chat's config.json, tokenizer files (Qwen2 BPE, vocabulary 151,670),
  chat template, generation config and remote code, copied from
  ``../shared/reference/peers/sdar/SDAR-4B-Chat`` (required); Qwen3 weight names (SDAR's own).
- ``dream``: Dream-v0-Instruct's config.json fields (model_type ``Dream``, ``DreamModel``,
  auto_map, mask_token_id), Qwen2 weight names with q/k/v biases, the character tokenizer.
- ``llada``: LLaDA-8B-Instruct's config.json fields (model_type ``llada``, ``LLaDAModelLM``,
  OLMo-style names ``model.transformer.blocks.N.q_proj`` ...), the character tokenizer.
- ``llada2`` / ``llada21``: LLaDA2.0-mini's / LLaDA2.1-mini's config.json fields (model_type
  ``llada2_moe`` / ``llada21_moe``, ``LLaDA2MoeModelLM``, auto_map, the MoE and RoPE fields) with
  tiny sizes, built with our own model (``engines/llada2_model.py``) and saved under the
  published names in sharded safetensors with an index; ``generation_config.json`` (EOS 156892);
  a character tokenizer whose specials sit at the published ids (``<|endoftext|>`` = EOS = pad
  156892, ``<|mask|>`` 156895; vocabulary rows 157,184) and an ``<role>`` chat template. With
  ``base`` small (the parity tests) the same specials follow the characters directly.
- ``diffusion_gemma``: a ``DiffusionGemmaForBlockDiffusion`` with a tiny ``Gemma4VisionConfig``
  (with ``vision_config=None`` it would build a 167M-parameter vision tower) and a MoE-only text
  config (``num_experts``, ``top_k_experts``, ``moe_intermediate_size``), save_pretrained.

``peak`` scales the output head so that distributions are peaked (confidences near 1 happen),
which the parity tests need for a threshold to matter. Nothing here is committed; tests build
these in temporary folders.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
# beside the checkout (CI, /work/main), or one level up for a worktree in a folder of worktrees
PEERS = next((base / "shared" / "reference" / "peers" for base in (ROOT.parent, ROOT.parent.parent)
              if (base / "shared" / "reference" / "peers").is_dir()), ROOT.parent / "shared" / "reference" / "peers")
SDAR_PUBLISHED = PEERS / "sdar" / "SDAR-4B-Chat"
SDAR_FILES = (
    "config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "chat_template.jinja", "configuration_sdar.py", "modeling_sdar.py",
    "tokenization_qwen2.py", "tokenization_qwen2_fast.py",
)
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1}


def _randomize(model, std: float, peak: float, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() == 2:
                torch.nn.init.normal_(weight, std=std)
            elif weight.dim() == 1 and "norm" not in name:
                torch.nn.init.normal_(weight, std=std)  # biases
        model.get_output_embeddings().weight.mul_(peak)


def _save_weights(state: dict, folder: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _write_config(folder: Path, config: dict) -> None:
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def sdar(folder: str | Path, seed: int = 0, std: float = 0.4, peak: float = 1.0, **config_changes) -> Path:
    """SDAR-4B-Chat's folder, tiny: its config.json with tiny sizes, its tokenizer files, Qwen3 weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if not SDAR_PUBLISHED.is_dir():
        raise FileNotFoundError(f"{SDAR_PUBLISHED}: the published SDAR folder (tokenizer files) is needed")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in SDAR_FILES:
        shutil.copy(SDAR_PUBLISHED / name, folder / name)
    config = json.loads((SDAR_PUBLISHED / "config.json").read_text())
    config.update(TINY, head_dim=16, max_window_layers=2, **config_changes)
    _write_config(folder, config)
    stock = {k: v for k, v in config.items() if k not in ("auto_map", "model_type", "architectures", "attn_implementation", "torch_dtype")}
    model = Qwen3ForCausalLM(Qwen3Config(**stock))
    _randomize(model, std, peak, seed)
    _save_weights(model.state_dict(), folder)
    return folder


def _char_tokenizer(folder: str | Path):
    """Create ``folder`` and save the character tokenizer into it: ``(folder, tokenizer)``."""
    if str(ROOT) not in sys.path:  # training/ is not installed; run as a script, this folder is on sys.path
        sys.path.insert(0, str(ROOT))
    from training.tokenizer import build_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def dream(folder: str | Path, seed: int = 0, std: float = 0.4, peak: float = 1.0, **config_changes) -> Path:
    """Dream-v0-Instruct's config.json fields, tiny; Qwen2 weight names; the character tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder, tokenizer = _char_tokenizer(folder)
    config = {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "hidden_act": "silu", **TINY, "initializer_range": 0.02,
        "mask_token_id": tokenizer.mask_token_id, "max_position_embeddings": 1024, "max_window_layers": 2,
        "model_type": "Dream", "pad_token_id": tokenizer.pad_token_id, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "float32", "use_cache": True, "use_sliding_window": False, "vocab_size": 96,
    }
    config.update(config_changes)
    _write_config(folder, config)
    stock = {k: v for k, v in config.items() if k not in ("auto_map", "model_type", "architectures", "torch_dtype")}
    model = Qwen2ForCausalLM(Qwen2Config(**stock))
    _randomize(model, std, peak, seed)
    _save_weights(model.state_dict(), folder)
    return folder


def llada(folder: str | Path, seed: int = 0, std: float = 0.4, peak: float = 1.0, **config_changes) -> Path:
    """LLaDA-8B-Instruct's config.json fields, tiny; LLaDA's weight names; the character tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pytest_redline.engines.checkpoints import LLADA_NAMES

    folder, tokenizer = _char_tokenizer(folder)
    config = {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 32,
        "embedding_dropout": 0.0, "embedding_size": 96, "eos_token_id": tokenizer.eos_token_id,
        "flash_attention": False, "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None,
        "init_device": "cpu", "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
        "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": tokenizer.mask_token_id,
        "max_sequence_length": 1024, "mlp_hidden_size": 64, "mlp_ratio": 4, "model_type": "llada",
        "multi_query_attention": None, "n_heads": 2, "n_kv_heads": 2, "n_layers": 2,
        "pad_token_id": tokenizer.pad_token_id, "precision": "amp_bf16", "residual_dropout": 0.0,
        "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
        "scale_logits": False, "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 96,
        "weight_tying": False,
    }
    config.update(config_changes)
    _write_config(folder, config)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False))
    _randomize(model, std, peak, seed)
    inverse = {}
    for source, target in LLADA_NAMES.items():
        for i in range(2) if "{i}" in source else [None]:
            inverse[target.format(i=i)] = source.format(i=i)
    _save_weights({inverse[k]: v for k, v in model.state_dict().items() if k in inverse}, folder)
    return folder


def diffusion_gemma(folder: str | Path, seed: int = 0, canvas_length: int = 8) -> Path:
    """A ~0.4M-parameter DiffusionGemmaForBlockDiffusion (tiny vision tower, MoE-only text), save_pretrained."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, Gemma4VisionConfig
    from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig

    folder, tokenizer = _char_tokenizer(folder)
    text = DiffusionGemmaTextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, global_head_dim=16, num_experts=4, top_k_experts=2,
        moe_intermediate_size=32, max_position_embeddings=1024, sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1, head_dim=8)
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length,
                                  image_token_id=95, boi_token_id=94, eoi_token_id=93)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    return folder


LLADA2_BASE, LLADA2_VOCAB = 156892, 157184  # the published EOS id (the first special) and vocabulary rows
LLADA2_SPECIALS = ("<|endoftext|>", "<role>", "</role>", "<|mask|>")  # ids base .. base + 3
LLADA2_TEMPLATE = (
    "{% for m in messages %}<role>{{ {'user': 'HUMAN', 'assistant': 'ASSISTANT', 'system': 'SYSTEM'}[m['role']] }}</role>"
    "{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)
LLADA2_TINY = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "intermediate_size": 64, "num_experts": 16, "num_experts_per_tok": 4, "num_shared_experts": 1,
    "moe_intermediate_size": 16, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
}


def llada2_config(version: str = "2.0", vocab_size: int = LLADA2_VOCAB, eos: int = LLADA2_BASE, **sizes) -> dict:
    """LLaDA2.0-mini's (or LLaDA2.1-mini's) published config.json fields, with ``sizes`` replacing the sizes."""
    kind = "llada2_moe" if version == "2.0" else "llada21_moe"
    config = {
        "architectures": ["LLaDA2MoeModelLM"],
        "auto_map": {"AutoConfig": f"configuration_{kind}.LLaDA2MoeConfig", "AutoModel": f"modeling_{kind}.LLaDA2MoeModel",
                     "AutoModelForCausalLM": f"modeling_{kind}.LLaDA2MoeModelLM"},
        "model_type": kind, "hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 128, "partial_rotary_factor": 0.5, "rope_theta": 600000,
        "first_k_dense_replace": 1, "intermediate_size": 5120, "num_experts": 256, "num_experts_per_tok": 8,
        "num_shared_experts": 1, "moe_intermediate_size": 512, "n_group": 8, "topk_group": 4,
        "score_function": "sigmoid", "routed_scaling_factor": 2.5, "norm_topk_prob": True, "use_qk_norm": True,
        "use_qkv_bias": False, "use_bias": False, "moe_router_enable_expert_bias": True, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False, "vocab_size": vocab_size, "pad_token_id": eos, "hidden_act": "silu",
        "max_position_embeddings": 16384, "rope_scaling": None, "torch_dtype": "bfloat16", "use_cache": False,
        "max_window_layers": 20, "use_sliding_window": False, "output_router_logits": False,
    }
    config.update(sizes)
    return config


def llada2_tokenizer(folder: Path, base: int = LLADA2_BASE):
    """A character tokenizer with LLaDA2's specials at ``base`` .. ``base + 3`` (ids between the
    characters and ``base`` are unused fillers) and an ``<role>`` chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from training.tokenizer import CHARACTERS

    vocab = {token: i for i, token in enumerate(("<unk>",) + tuple(CHARACTERS))}
    if base < len(vocab):
        raise ValueError(f"base: expected at least {len(vocab)} (the characters), got {base}")
    vocab.update({f"<|filler_{i}|>": i for i in range(len(vocab), base)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(LLADA2_SPECIALS))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                        unk_token="<unk>", padding_side="left", model_max_length=16384)
    tokenizer.chat_template = LLADA2_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def save_sharded(state: dict, folder: Path, shards: int) -> None:
    """The published layout: ``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    names = list(state)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n].contiguous() for n in names[i * per : (i + 1) * per]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def published_state(model) -> dict:
    """Our model's tensors under the published names (the stacked experts split per expert)."""
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up"):
            prefix, inner = name[: -len("gate_up")], tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                state[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :inner]
                state[f"{prefix}{e}.up_proj.weight"] = tensor[e, inner:]
        elif name.endswith("mlp.experts.down"):
            for e in range(tensor.shape[0]):
                state[f"{name[: -len('down')]}{e}.down_proj.weight"] = tensor[e]
        elif not (name == "lm_head.weight" and model.config.tie_word_embeddings):
            state[name] = tensor
    return state


def llada2(folder: str | Path, version: str = "2.0", seed: int = 0, std: float = 0.4, peak: float = 1.0,
           base: int = LLADA2_BASE, vocab_size: int = LLADA2_VOCAB, shards: int = 2, dtype: str = "float32",
           **config_changes) -> Path:
    """A tiny LLaDA2.0 (``version="2.0"``) or LLaDA2.1 (``"2.1"``) folder in the published layout."""
    from pytest_redline.engines import llada2_config as checks
    from pytest_redline.engines.llada2_load import build

    folder = Path(folder)
    llada2_tokenizer(folder, base)
    config = llada2_config(version, vocab_size, base, **{**LLADA2_TINY, **config_changes})
    _write_config(folder, config)
    generation = {"bos_token_id": base, "eos_token_id": base, "pad_token_id": base, "mask_token_id": None}
    (folder / "generation_config.json").write_text(json.dumps({k: v for k, v in generation.items() if v is not None}, indent=2) + "\n")
    model = build(checks.model_config(config, folder / "config.json"), dtype=getattr(torch, dtype))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" in name:
                tensor.fill_(1.0)
            else:
                torch.nn.init.normal_(tensor, std=std)
        for name, tensor in model.named_buffers():
            torch.nn.init.normal_(tensor, std=0.1)  # expert_bias: it changes the choice, not the weights
        model.lm_head.weight.mul_(peak)
    state = {k: v.to(getattr(torch, dtype)) for k, v in published_state(model).items()}
    save_sharded(state, folder, shards)
    return folder


def llada2_published(folder: str | Path, version: str = "2.0", shards: int = 4, **sizes) -> Path:
    """LLaDA2.0-mini's (or 2.1-mini's) published config.json, generation config and tokenizer
    layout, and shards holding every published tensor's safetensors header but no data (sparse
    files of the published sizes, ~32 GB each folder in bf16, ~0 on disk): enough for every
    model-free check, nothing to load. ``sizes`` replace published sizes (a smoke run on a CPU)."""
    import struct

    from pytest_redline.engines import llada2_config as checks

    folder = Path(folder)
    llada2_tokenizer(folder)
    config = llada2_config(version, **sizes)
    _write_config(folder, config)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": LLADA2_BASE, "pad_token_id": LLADA2_BASE}) + "\n")
    shapes = checks.expected_shapes(checks.model_config(config, folder / "config.json"))
    names = sorted(shapes)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {}, 0
        for name in names[i * per : (i + 1) * per]:
            size = 2 * int(torch.tensor(shapes[name]).prod())
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = file
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / file, "wb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            handle.truncate(8 + len(raw) + offset)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}) + "\n")
    return folder


def llada21(folder: str | Path, **kwargs) -> Path:
    return llada2(folder, version="2.1", **kwargs)


BUILDERS = {"sdar": sdar, "dream": dream, "llada": llada, "llada2": llada2, "llada21": llada21, "diffusion_gemma": diffusion_gemma}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output folder (one subfolder per family)")
    parser.add_argument("--families", nargs="+", default=list(BUILDERS), choices=list(BUILDERS))
    args = parser.parse_args()
    for family in args.families:
        try:
            print(BUILDERS[family](Path(args.out) / family))
        except FileNotFoundError as e:  # SDAR without the peers folder: build the others
            print(f"{family}: skipped: {e}")


if __name__ == "__main__":
    main()
