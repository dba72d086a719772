"""Helpers every model engine shares: the prompt's token ids, the EOS ids, torch's threads.

Imports no torch at module level, so a model-free module (a spec, or ``hf_generate``'s
model-free half) may import it without loading torch.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from pytest_redline.contracts import Prompt


def set_threads(threads: int | None, engine: str) -> None:
    """``engine_args.threads``: torch's intra-op threads for the process (None leaves them alone).

    Small models decode fastest on one thread: on a shared 2-core CPU the default two threads
    cost 7x the CPU time of one (measured with the embedded ar-target), spent waiting in barriers.
    """
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{engine}: engine_args.threads: expected int >= 1 or null, got {threads!r}")
    import torch  # only when an engine is built (see the module docstring)

    torch.set_num_threads(threads)


def encode(tokenizer, prompt: Prompt, engine: str, plain_ids: Sequence[int] | None = None) -> list[int]:
    """The prompt's token ids: its chat messages through the chat template when the tokenizer has
    one, else its text's (``plain_ids`` when the caller tokenized it already)."""
    if getattr(tokenizer, "chat_template", None) and prompt.messages:
        ids = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
    else:
        ids = tokenizer(prompt.text).input_ids if plain_ids is None else plain_ids
    if not ids:
        raise ValueError(f"{engine}: prompt {prompt.id!r} encodes to no tokens")
    return list(ids)


def eos_ids(model, tokenizer, where: str) -> frozenset[int]:
    """The tokenizer's EOS and the generation config's EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    ids.discard(None)
    if not ids:
        raise ValueError(f"{where}: no EOS token id in the tokenizer or generation config")
    return frozenset(int(i) for i in ids)
