"""Test shims around the official decoders in ../shared/reference/peers (never copied into the project).

The peer files are imported from where they are; everything that adapts them to transformers 5.x
or to a stock model lives here:

- :func:`peer_module` imports a peer file under a unique module name (``generate.py`` exists twice);
- :class:`StoreKV` is SDAR's model call (``store_kv``, a 3-D 0/1 mask) over a stock Qwen3: it
  converts the mask to the additive 4-D form and crops the cache back when ``store_kv`` is false;
- :func:`greedy_sampler` replaces SDAR's ``torch.multinomial`` sampler: the argmax token, with its
  probability from the unfiltered softmax (``top_k=1`` would make every confidence 1.0);
- :class:`Banned` sets the logits of MASK and of ids beyond the tokenizer to -inf: our engines
  never predict those (the one sampling rule that differs), the peers would;
- :func:`llada_peer` builds Fast-dLLM's ``LLaDAModelLM`` from the published modeling code and loads
  a tiny LLaDA folder into it (strict names: the folder is in the published layout);
- :func:`block_causal_llada` and :func:`block_causal_sdpa` make the peers' attention block-causal
  (blocks of ``B`` from position 0): the rule in which Fast-dLLM's prefix cache differs from ours;
- :func:`dream_peer` / :func:`dream_block_generate`: Dream's published model and Fast-dLLM's Dream
  block generation, with the shims transformers 5.x needs.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
# beside the checkout (CI, /work/main), or one level up for a worktree in a folder of worktrees
PEERS = next((base / "shared" / "reference" / "peers" for base in (ROOT.parent, ROOT.parent.parent)
              if (base / "shared" / "reference" / "peers").is_dir()), ROOT.parent / "shared" / "reference" / "peers")
BUILDER = ROOT / "benchmarks" / "make_tiny_checkpoints.py"


@pytest.fixture(autouse=True)
def one_thread():
    """torch on one thread for the test (restored after); autouse where a test module imports it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Why a fresh clone has no peers: they are upstream code under its own licences (SDAR: MIT;
# Fast-dLLM, LLaDA2: Apache-2.0) and SDAR-4B-Chat's published files (4.5 MB of tokenizer), kept
# outside the project and never copied into it.
ABSENT = ("which is absent: the peers are upstream code under their own licences (SDAR: MIT; Fast-dLLM: Apache-2.0) "
          "and SDAR-4B-Chat's published config and tokenizer files (4.5 MB), kept outside the project and never "
          "copied into it, so neither the repository nor the wheel ships them; CI has the folder")


def need_peers(compares: str) -> Path:
    """The peers folder, or a skip that says what the test compares against (``compares``) and
    why the peers are not shipped."""
    if not PEERS.is_dir():
        pytest.skip(f"compares against {compares}, read from {PEERS}, {ABSENT}")
    return PEERS


def load_file(name: str, path: Path, search: Path | None = None):
    """Import ``path`` as module ``name`` (cached in sys.modules); ``search`` goes on sys.path."""
    if name in sys.modules:
        return sys.modules[name]
    if search is not None and str(search) not in sys.path:
        sys.path.insert(0, str(search))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def builder():
    """benchmarks/make_tiny_checkpoints.py as a module."""
    return load_file("make_tiny_checkpoints", BUILDER)


PEER_DECODERS = {
    "sdar": "SDAR's official decoder (generate.py, block_diffusion_generate)",
    "llada": "Fast-dLLM's LLaDA decoder (llada/generate.py, generate_with_prefix_cache) and LLaDA's published modeling code",
}


def peer_module(name: str):
    """``sdar``: SDAR's generate.py; ``llada``: Fast-dLLM's llada/generate.py (needs einops)."""
    peers = need_peers(PEER_DECODERS[name])
    if name == "sdar":
        return load_file("peer_sdar_generate", peers / "sdar" / "generate.py")
    pytest.importorskip("einops", reason="Fast-dLLM's LLaDA modeling imports einops (pip install pytest-redline[test])")
    return load_file("peer_llada_generate", peers / "fast-dllm" / "llada" / "generate.py", search=peers / "fast-dllm" / "llada")


def banned_ids(engine):
    """The ids our engines never predict: MASK and the embedding's padding rows."""
    import torch

    banned = torch.zeros(engine.model.config.vocab_size, dtype=torch.bool)
    banned[len(engine.tokenizer):] = True
    banned[engine.mask_id] = True
    return banned


class Banned:
    """A model whose logits at banned ids are -inf (``model(...)`` otherwise unchanged)."""

    def __init__(self, model, banned):
        self.model, self.banned = model, banned
        self.device = model.device

    def eval(self):
        return self

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        out.logits = out.logits.masked_fill(self.banned.to(out.logits.device), float("-inf"))
        return out


class StoreKV(Banned):
    """SDAR's ``model(x, attention_mask, position_ids, past_key_values, use_cache, store_kv)`` over a
    stock Qwen3ForCausalLM: K/V are kept only when ``store_kv`` (else the cache is cropped back)."""

    def __call__(self, input_ids, attention_mask, position_ids, past_key_values, use_cache=True, store_kv=False):
        import torch

        before = past_key_values.get_seq_length()
        dtype = self.model.get_input_embeddings().weight.dtype
        additive = torch.zeros(attention_mask.shape, dtype=dtype).masked_fill(attention_mask == 0, torch.finfo(dtype).min)
        out = self.model(input_ids=input_ids, attention_mask=additive[:, None], position_ids=position_ids,
                         cache=past_key_values, use_cache=True)
        added = past_key_values.get_seq_length() - before
        if not store_kv and added:
            past_key_values.crop(-added)  # transformers 5.x: a negative count drops that many tokens
        return SimpleNamespace(logits=out.logits.masked_fill(self.banned, float("-inf")))


def greedy_sampler(logits, temperature=1.0, top_k=0, top_p=1.0):
    """SDAR's sampler made greedy: the argmax token and its unfiltered softmax probability."""
    probs = logits.softmax(-1)
    token = probs.argmax(-1)
    return token, probs.gather(-1, token[..., None])[..., 0]


def llada_peer(folder: Path, dtype):
    """Fast-dLLM's LLaDAModelLM with the weights of a tiny published-layout LLaDA folder."""
    import torch
    from safetensors.torch import load_file as load_tensors

    peer_module("llada")
    config_module = sys.modules["model.configuration_llada"]
    modeling = sys.modules["model.modeling_llada"]
    raw = json.loads((folder / "config.json").read_text())
    config = config_module.LLaDAConfig(**{k: v for k, v in raw.items() if k not in ("auto_map", "architectures")})
    config.use_cache = False  # shim: transformers 5.x no longer sets it on every config
    model = modeling.LLaDAModelLM(config, init_params=True)
    model.load_state_dict(load_tensors(folder / "model.safetensors"), strict=True)
    return model.to(dtype).eval()


def block_causal_llada(monkeypatch, block_size: int):
    """Make the peer LLaDA's attention block-causal, blocks of ``block_size`` from position 0 (its
    keys always start at position 0: the prefix cache, then the input)."""
    modeling = sys.modules["model.modeling_llada"]
    original = modeling.LLaDABlock._scaled_dot_product_attention

    def attend(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        return original(self, q, k, v, attn_mask=block_bias(q, k, block_size), dropout_p=dropout_p, is_causal=False)

    monkeypatch.setattr(modeling.LLaDABlock, "_scaled_dot_product_attention", attend)


def block_bias(q, k, block_size: int):
    """The additive block-causal bias (queries, keys) for keys at positions 0.. and the queries last."""
    import torch

    n_keys, n_queries = k.shape[-2], q.shape[-2]
    k_block = torch.arange(n_keys, device=q.device) // block_size
    q_block = torch.arange(n_keys - n_queries, n_keys, device=q.device) // block_size
    bias = torch.zeros(n_queries, n_keys, dtype=q.dtype, device=q.device)
    return bias.masked_fill_(k_block[None, :] > q_block[:, None], torch.finfo(q.dtype).min)

def dream_peer(folder: Path, dtype):
    """Fast-dLLM's DreamModel (published modeling code) with the weights of a tiny Dream folder."""
    import importlib
    import types

    from safetensors.torch import load_file as load_tensors

    package = "peer_dream_model"
    if package not in sys.modules:
        module = types.ModuleType(package)
        compares = "Dream's published modeling code and Fast-dLLM's Dream block generation (fast-dllm/dream/model)"
        module.__path__ = [str(need_peers(compares) / "fast-dllm" / "dream" / "model")]
        sys.modules[package] = module
    configuration = importlib.import_module(f"{package}.configuration_dream")
    modeling = importlib.import_module(f"{package}.modeling_dream")
    raw = json.loads((folder / "config.json").read_text())
    config = configuration.DreamConfig(**{k: v for k, v in raw.items() if k not in ("auto_map", "architectures", "model_type")})
    config._attn_implementation = "sdpa"
    # shim: transformers 5.x has no "default" entry in ROPE_INIT_FUNCTIONS (it moved onto the models)
    modeling.ROPE_INIT_FUNCTIONS["default"] = _default_rope
    try:
        model = modeling.DreamModel(config)
    finally:
        del modeling.ROPE_INIT_FUNCTIONS["default"]
    model.load_state_dict(load_tensors(folder / "model.safetensors"), strict=True)
    return model.to(dtype).eval()


def _default_rope(config, device=None, seq_len=None, **kwargs):
    """transformers 4.x's default RoPE frequencies: (inv_freq, attention scaling 1.0)."""
    import torch

    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


def dream_block_generate(model, monkeypatch, ids: list[int], mask_id: int, eos_id: int, pad_id: int, gen_length: int,
                         block_length: int, threshold: float, dual_cache: bool = False):
    """Fast-dLLM's Dream block generation (generation_utils_block, ``confidence_threshold``,
    greedy, prefix cache or ``dual_cache``) on ``model`` (:func:`dream_peer`), as token ids. Shims for transformers 5.x:
    the block mixin is put in front of the model's class, ``DreamGenerationConfig.validate``
    accepts the new ``user_set_attributes`` argument, and the config is passed whole."""
    import importlib

    import torch

    block = importlib.import_module("peer_dream_model.generation_utils_block")
    if not isinstance(model, block.DreamGenerationMixin):
        model.__class__ = type("BlockDream", (block.DreamGenerationMixin, type(model)), {})
    validate = block.DreamGenerationConfig.validate
    monkeypatch.setattr(block.DreamGenerationConfig, "validate", lambda self, is_init=False, **kwargs: validate(self, is_init))
    config = block.DreamGenerationConfig(
        max_new_tokens=gen_length, steps=gen_length, alg="confidence_threshold", temperature=0.0, mask_token_id=mask_id,
        pad_token_id=pad_id, eos_token_id=eos_id, return_dict_in_generate=False,
    )
    x = model.diffusion_generate(torch.tensor([ids]), generation_config=config, threshold=threshold, block_length=block_length,
                                 dual_cache=dual_cache)
    return x[0, len(ids):].tolist()


def ban_logits(monkeypatch, model, banned) -> None:
    """``model``'s own forward returns -inf logits at the banned ids (for peers that call ``self(...)``)."""
    forward = model.forward

    def banned_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits.masked_fill(banned.to(out.logits.device), float("-inf"))
        return out

    monkeypatch.setattr(model, "forward", banned_forward)


def block_causal_sdpa(monkeypatch, block_size: int) -> None:
    """torch's scaled_dot_product_attention made block-causal (blocks of ``block_size`` from
    position 0; keys start at position 0) for peers that attend with no mask (Dream)."""
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def attend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        return sdpa(q, k, v, attn_mask=block_bias(q, k, block_size), dropout_p=dropout_p, is_causal=False, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", attend)
