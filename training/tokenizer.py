"""A character-level tokenizer (``PreTrainedTokenizerFast`` built with ``tokenizers``).

One token per character; the special tokens are declared explicitly. The same tokenizer serves
the block-diffusion model and, later, autoregressive models trained on the same data.
"""
from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, MASK, EOS, BOS, UNK = "[PAD]", "[MASK]", "[EOS]", "[BOS]", "[UNK]"
SPECIALS = (PAD, MASK, EOS, BOS, UNK)  # ids 0..4, in this order
CHARACTERS = string.digits + "+-*/=#,.:;()<> " + string.ascii_lowercase + string.ascii_uppercase + "\n"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer: specials first, then one id per character."""
    vocab = {token: i for i, token in enumerate(SPECIALS + tuple(CHARACTERS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character, newlines too
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        mask_token=MASK,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=1024,
    )
