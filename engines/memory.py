"""Memory accounting for the quantized engine: weight bytes with their scales, and peak tensor memory.

**Weight memory** (the ``memory`` cost) = the storage of every parameter of the model as it is
held (packed 4-bit bytes, int8 bytes, or floats for what is not quantized: embeddings, norms,
the output head) + the quantization state that dequantization needs: for 4-bit layers the
``quant_state`` (block ``absmax`` scales, the 16-entry code book, and with double quantization
the nested scales, code book and offset), for int8 layers the per-row scales ``SCB``. Tied
parameters count once; non-persistent buffers (rotary frequencies) do not count.
transformers' ``get_memory_footprint()`` counts parameters and buffers only, so it leaves out the
``quant_state`` and ``SCB`` tensors, which on small layers are over 10 % of the packed weight.

**Peak memory** = the most bytes held by tensors at once while generating, weights included.
On CUDA it is ``torch.cuda.max_memory_allocated``. Elsewhere :class:`TensorPeak` measures the
same quantity: a dispatch mode sees every tensor an operator returns, counts each new storage
until it is freed, and adds the storages that existed before (the weights). Scratch memory that
a kernel allocates and frees internally is not seen.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def quant_state_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The quantization-state tensors of a bitsandbytes layer (none for other modules)."""
    weight = getattr(module, "weight", None)
    found: list[torch.Tensor] = []
    state = getattr(weight, "quant_state", None)  # 4-bit: Params4bit.quant_state
    while state is not None:
        found += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if torch.is_tensor(t)]
        state = getattr(state, "state2", None) if getattr(state, "nested", False) else None
    for scb in (getattr(weight, "SCB", None), getattr(getattr(module, "state", None), "SCB", None)):  # int8 row scales
        if torch.is_tensor(scb):
            found.append(scb)
    return found


def weight_memory(model: torch.nn.Module) -> dict[str, int]:
    """``{"weights": bytes, "scales": bytes, "total": bytes}`` as defined in the module docstring."""
    weights = sum(_tensor_bytes(p) for p in model.parameters())
    seen: set[int] = set()
    scales = 0
    for module in model.modules():
        for t in quant_state_tensors(module):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                scales += _tensor_bytes(t)
    return {"weights": weights, "scales": scales, "total": weights + scales}


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct storages the model holds (parameters, buffers, quantization state)."""
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [t for m in model.modules() for t in quant_state_tensors(m)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


class TensorPeak(TorchDispatchMode):
    """``with TensorPeak(model) as peak: ...``; then ``peak.peak`` = the most tensor bytes alive at once.

    Storages that existed on entry (the model's) count as ``base``; a new storage counts from the
    operator that first returns a tensor on it until the storage is freed (a finalizer on the
    storage's Python object, which lives exactly as long as the storage).
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.base = resident_bytes(model)
        self._old = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
        self._old |= {t.untyped_storage().data_ptr() for m in model.modules() for t in quant_state_tensors(m)}
        self._live: dict[int, int] = {}  # storage pointer -> bytes, while the storage is alive
        self.current = self.peak = self.base

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()  # one preserved Python object per storage: it dies with the memory
        ptr = storage.data_ptr()
        if ptr in self._old or ptr in self._live or ptr == 0:
            return
        self._live[ptr] = storage.nbytes()
        self.current += self._live[ptr]
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._release, ptr)

    def _release(self, ptr: int) -> None:
        self.current -= self._live.pop(ptr, 0)
