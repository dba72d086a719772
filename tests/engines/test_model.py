"""Laws of the model plumbing: masks, positions, loading, fingerprints, the training objective."""
import hashlib

import pytest
import torch

from pytest_redline.engines import modeling, runtime
from pytest_redline.engines.modeling import block_causal_mask
from training.model import ModelConfig, build_model, two_copy_mask
from training.tokenizer import build_tokenizer
from training.train import TrainConfig, train

pytestmark = pytest.mark.slow  # training: builds Llama models (torch and transformers' model classes, ~5 s of CPU)

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(TINY, tokenizer).double().eval()
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, folder


def _logits(model, ids, block_size):
    pos = torch.arange(ids.shape[1])[None]
    mask = block_causal_mask(pos, pos, block_size, model.dtype)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def test_complete_mask_shape_values_no_empty_row():
    q_pos = torch.tensor([[0, 0, 3, 4, 5], [5, 6, 7, 8, 9]])
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    mask = block_causal_mask(q_pos, q_pos, 4, torch.float32, valid)
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.float32
    assert set(mask.unique().tolist()) <= {0.0, torch.finfo(torch.float32).min}
    assert (mask == 0).any(dim=-1).all()  # no fully blocked row
    assert mask[0, 0, 2, 0] != 0  # padding is never attended by a real query
    assert mask[1, 0, 0, 2] == 0 and mask[1, 0, 2, 3] != 0  # bidirectional inside block 1, causal across


def test_block_causal_logits(tiny):
    model, _ = tiny
    ids = torch.randint(5, 40, (1, 24))
    changed = ids.clone()
    changed[0, 17] = 7 if ids[0, 17] != 7 else 8  # a token of block 2 (block size 8)
    before, after = _logits(model, ids, 8), _logits(model, changed, 8)
    assert torch.equal(before[:, :16], after[:, :16])
    assert not torch.allclose(before[:, 16:], after[:, 16:])


def test_equivalent_two_copy_objective_per_block(tiny):
    """Noised block k in the 2L layout has the logits of "clean prefix, noised block k, no suffix"."""
    model, _ = tiny
    length, block_size = 24, 8
    clean = torch.randint(5, 40, (1, length))
    noised = clean.clone()
    noised[0, ::3] = 1
    pos = torch.arange(length)
    both = model(
        input_ids=torch.cat([noised, clean], 1),
        attention_mask=two_copy_mask(length, block_size, model.dtype),
        position_ids=torch.cat([pos, pos])[None],
    ).logits[:, :length]
    for k in range(length // block_size):
        lo, hi = k * block_size, (k + 1) * block_size
        alone = _logits(model, torch.cat([clean[:, :lo], noised[:, lo:hi]], 1), block_size)[:, lo:hi]
        torch.testing.assert_close(both[:, lo:hi], alone, rtol=0, atol=1e-10)


def test_left_pad_positions_start_at_first_token():
    valid = torch.tensor([[False, False, True, True], [True, True, True, True]])
    assert modeling.left_pad_positions(valid).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_roundtrip_save_load_keeps_weights_exactly_and_logits_closely(tiny):
    model, folder = tiny
    loaded, tokenizer = modeling.load(folder, device="cpu", dtype="float64")
    saved, reloaded = model.state_dict(), loaded.state_dict()
    assert saved.keys() == reloaded.keys()
    for name in saved:  # the weights round-trip exactly ...
        assert torch.equal(saved[name].to(torch.float64), reloaded[name]), name
    ids = torch.tensor([tokenizer("12+34=").input_ids])
    # ... the logits only to a tolerance: two models may reduce in another order (5.6e-17 seen).
    torch.testing.assert_close(_logits(model, ids, 4), _logits(loaded, ids, 4), rtol=1e-12, atol=1e-12)
    assert loaded.config.mask_token_id == tokenizer.mask_token_id == 1


def test_fingerprint_is_sha256_of_weights(tiny, tmp_path):
    _, folder = tiny
    digest = hashlib.sha256(b"model.safetensors" + (folder / "model.safetensors").read_bytes()).hexdigest()
    assert runtime.fingerprint(folder) == digest
    with pytest.raises(FileNotFoundError, match="no weight files"):
        runtime.fingerprint(tmp_path)


def test_auto_device_dtype_selection():
    assert modeling.select_dtype("auto", torch.device("cpu")) == torch.float32
    assert modeling.select_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert modeling.select_dtype("float64") == torch.float64
    with pytest.raises(ValueError, match="engine_args.dtype"):
        modeling.select_dtype("int8")
    with pytest.raises(FileNotFoundError, match="engine_args.model"):
        modeling.load("/nonexistent/folder")


@pytest.mark.slow  # trains
def test_deterministic_training_for_seed(tmp_path):
    weights = []
    for run in ("a", "b"):
        cfg = TrainConfig(out=str(tmp_path / run), steps=2, causal_warmup=1, batch_size=4, pool_batches=2, eval_every=2, model=TINY)
        train(cfg)
        weights.append((tmp_path / run / "model.safetensors").read_bytes())
    assert weights[0] == weights[1]
    with pytest.raises(ValueError, match="--objective"):
        train(TrainConfig(out=str(tmp_path / "c"), objective="nope", model=TINY))
