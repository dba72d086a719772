"""Laws of the character-level tokenizer."""
import pytest
from hypothesis import given, strategies as st
from transformers import AutoTokenizer

from training.tokenizer import CHARACTERS, SPECIALS, build_tokenizer
from pytest_redline.suites.arithmetic import ArithmeticSuite

pytestmark = pytest.mark.slow  # the training tokenizer: imports transformers (and so torch), ~3 s of CPU

TOKENIZER = build_tokenizer()


def test_roundtrip_suite_prompts_and_solutions():
    for prompt in ArithmeticSuite(n=200).prompts():
        for text in (prompt.text, prompt.meta["solution"]):
            ids = TOKENIZER(text).input_ids
            assert len(ids) == len(text)  # one token per character, no specials added
            assert TOKENIZER.decode(ids) == text


@given(st.text(alphabet=CHARACTERS, max_size=60))
def test_roundtrip_any_known_characters(text):
    assert TOKENIZER.decode(TOKENIZER(text).input_ids) == text


def test_explicit_special_ids():
    ids = [TOKENIZER.pad_token_id, TOKENIZER.mask_token_id, TOKENIZER.eos_token_id, TOKENIZER.bos_token_id, TOKENIZER.unk_token_id]
    assert ids == [0, 1, 2, 3, 4]
    assert TOKENIZER.convert_ids_to_tokens(ids) == list(SPECIALS)
    assert TOKENIZER("é").input_ids == [TOKENIZER.unk_token_id]


def test_roundtrip_save_load(tmp_path):
    TOKENIZER.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "347+589=7+9+0=16#936"
    assert loaded(text).input_ids == TOKENIZER(text).input_ids
    assert (loaded.mask_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 0)
    assert loaded.decode(loaded(text).input_ids + [2], skip_special_tokens=True) == text


def test_shipped_folders_need_no_tokenizer_code():
    """The engines load each shipped folder's tokenizer.json through AutoTokenizer: the same ids as
    training/tokenizer.py builds, so nothing installed needs that module."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[2] / "engines" / "models"
    text = "347+589=7+9+0=16#936\n(12-3)*4"
    for name in ("bd-tiny", "bd-tiny-distilled", "ar-target", "ar-draft"):
        loaded = AutoTokenizer.from_pretrained(models / name, local_files_only=True)
        assert loaded(text).input_ids == TOKENIZER(text).input_ids, name
        assert loaded.convert_ids_to_tokens(list(range(5))) == list(SPECIALS), name
