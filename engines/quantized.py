"""Weight quantization with bitsandbytes, through transformers' ``BitsAndBytesConfig``; greedy decoding.

The config parameter ``quantization`` picks how the one checkpoint is loaded:

- ``none``: unquantized, the reference (``dtype: auto`` is bfloat16 on a GPU, float32 on the CPU);
- ``int8``: LLM.int8 (``load_in_8bit``), int8 weights with one float scale per output row;
- ``nf4`` / ``fp4``: 4-bit weights (``load_in_4bit``, ``bnb_4bit_quant_type``) with one absmax
  scale per block of 64 weights, computing in the reference dtype.

bitsandbytes quantizes the ``nn.Linear`` layers of the decoder; embeddings, norms and the output
head (tied to the embeddings here) stay in the reference dtype. bitsandbytes >= 0.48 runs all
three modes on the CPU. Decoding is greedy (``autoregressive.greedy``), batched over the prompts.

Costs, in ``Generation.extra`` (the same weight values on every prompt of a config; definitions in
``engines.memory``): ``memory`` = weight bytes including the quantization scales (the grid's
``cost: memory``, lower is better), ``memory_scales`` = the scales' share of it, and
``memory_peak`` = peak tensor bytes while the prompt's batch was generated, weights included.
``forwards`` = one per generated token (the first is the prefill), ``tokens`` up to the first EOS.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from pytest_redline.contracts import Generation, Prompt
from pytest_redline.engines import memory, modeling, runtime
from pytest_redline.engines.autoregressive import ARRequest, generation, greedy, new_requests, token_count
from pytest_redline.engines.autoregressive_spec import QuantizedSpec, absmax_dtype, quantization_runtime, quantized_config
from pytest_redline.engines.common import eos_ids, set_threads
from pytest_redline.engines.runtime import AR_TARGET

def bnb_config(mode: str, compute_dtype: torch.dtype) -> BitsAndBytesConfig:
    if mode == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode, bnb_4bit_compute_dtype=compute_dtype)


class QuantizedEngine(QuantizedSpec):
    """``QuantizedEngine(model=PATH, device="auto", dtype="auto", measure_peak=True, threads=None)``;
    the model defaults to the embedded ``ar-target``. One quantization is loaded at a time (the
    last used). ``threads`` sets torch's intra-op threads (see ``common.set_threads``)."""

    # name, config check and model-free methods: autoregressive_spec.QuantizedSpec

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        measure_peak: bool = True,
        threads: int | None = None,
        trust_remote_code: bool = False,
    ):
        set_threads(threads, self.name)
        if not isinstance(measure_peak, bool):
            raise ValueError(f"quantized: engine_args.measure_peak: expected true or false, got {measure_peak!r}")
        self.path = Path(model) if model is not None else AR_TARGET
        self.measure_peak, self.trust_remote_code = measure_peak, trust_remote_code
        reference, self.tokenizer = modeling.load(self.path, device, dtype, trust_remote_code)
        self.device = next(reference.parameters()).device
        self.dtype = next(reference.parameters()).dtype
        self.eos = eos_ids(reference, self.tokenizer, str(self.path))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos)
        self.tokens = token_count(self.tokenizer, reference)  # ids from here on are embedding padding: never picked
        self._mode, self._model = "none", reference
        self._memory = memory.weight_memory(reference)
        self._fingerprint: str | None = None

    # -- protocol ---------------------------------------------------------------------------

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = runtime.fingerprint(self.path)
        return self._fingerprint

    def describe(self) -> dict[str, str]:
        return runtime.describe(self.name, self.device, self.dtype, model=self.path, **quantization_runtime(str(self.device)))

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        cfg = quantized_config(config)
        model = self.model(cfg["quantization"])
        requests = new_requests(self.tokenizer, prompts, cfg["max_new_tokens"], self.eos, self.name)
        peak = self._decode(model, requests)
        extra = {"memory": float(self._memory["total"]), "memory_scales": float(self._memory["scales"])}
        if peak is not None:
            extra["memory_peak"] = float(peak)
        return [generation(r, extra) for r in requests]

    # -- loading ----------------------------------------------------------------------------

    def model(self, mode: str):
        """The model loaded with quantization ``mode`` (kept until another mode is asked for)."""
        if mode != self._mode:
            self._model = None  # release the previous one first
            self._model = self._load(mode)
            self._mode = mode
            with torch.no_grad(), _quiet_int8_casts():  # on the CPU, bitsandbytes repacks 4-bit weights
                self._model(input_ids=torch.tensor([[self.pad_id]], device=self.device))  # (bf16 scales) at the first forward
            self._check_absmax(mode)
            self._memory = memory.weight_memory(self._model)
        return self._model

    def _load(self, mode: str):
        if mode == "none":
            return modeling.load(self.path, str(self.device), self.dtype, self.trust_remote_code)[0]
        model = AutoModelForCausalLM.from_pretrained(
            self.path,
            local_files_only=True,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            quantization_config=bnb_config(mode, self.dtype),
            device_map={"": self.device},
            attn_implementation="sdpa",
        )
        quantized = sum(bool(memory.quant_state_tensors(m)) for m in model.modules())
        if quantized == 0:
            raise ValueError(f"quantized: {self.path}: bitsandbytes quantized no layer in mode {mode!r}")
        return model.eval()

    def _check_absmax(self, mode: str) -> None:
        """The 4-bit scales have the dtype the outcome key recorded (:func:`absmax_dtype`)."""
        states = [m.weight.quant_state for m in self._model.modules() if getattr(getattr(m, "weight", None), "quant_state", None)]
        found = {str(s.absmax.dtype).removeprefix("torch.") for s in states}
        expected = absmax_dtype(str(self.device))
        if found and found != {expected}:
            raise RuntimeError(
                f"quantized: {self.path}: mode {mode!r}: bitsandbytes keeps the absmax scales in {', '.join(sorted(found))}, "
                f"but the outcome key records {expected} (engines/autoregressive_spec.py absmax_dtype)"
            )

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, model, requests: list[ARRequest]) -> int | None:
        """Greedy decoding in place; returns the peak tensor bytes (None unless measured)."""
        with _quiet_int8_casts():
            if not self.measure_peak:
                greedy(model, requests, self.pad_id, tokens=self.tokens)
                return None
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                greedy(model, requests, self.pad_id, tokens=self.tokens)
                return torch.cuda.max_memory_allocated(self.device)
            with memory.TensorPeak(model) as tracker:
                greedy(model, requests, self.pad_id, tokens=self.tokens)
            return tracker.peak


@contextlib.contextmanager
def _quiet_int8_casts():
    """bitsandbytes logs "inputs will be cast ... to float16" at every int8 matmul with float32 inputs."""
    logger = logging.getLogger("bitsandbytes.autograd._functions")
    drop = logging.Filter()
    drop.filter = lambda record: not str(record.msg).startswith("MatMul8bitLt: inputs will be cast")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
