"""What identifies an engine's run, computed without importing torch or loading a model.

An outcome is keyed by the engine's ``fingerprint()`` (the weights) and ``describe()`` (engine,
model paths, device, dtype, library versions). A warm rerun, whose outcomes are all stored,
computes both here from the engine arguments alone (``identity``), so it imports neither torch
nor transformers: that import alone takes 3-6 s on a small CPU, more than the rest of a rerun.

- Weight hashes are cached by folder path, file sizes and modification times
  (:class:`WeightHashes`), so a 16 GB checkpoint is hashed once, not every session.
- Library versions come from the installed distributions' metadata, in ``describe`` as in
  ``identity``, so a built engine and its model-free identity always agree.
- ``device: auto`` resolves to ``cpu`` without torch when the machine has no GPU device node
  (no NVIDIA or ROCm driver: torch could not see a GPU either); otherwise, and for an explicit
  GPU device, torch is imported and asked, exactly as loading does.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any, Sequence

MODELS = Path(__file__).resolve().parent / "models"  # the embedded models
EMBEDDED_MODEL = MODELS / "bd-tiny"  # block diffusion
AR_TARGET, AR_DRAFT = MODELS / "ar-target", MODELS / "ar-draft"  # autoregressive
WEIGHT_SUFFIXES = (".safetensors", ".bin")
WEIGHT_HASHES = "weight-hashes.json"
FLOAT_DTYPES = ("float32", "float64", "bfloat16", "float16")
GPU_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")  # NVIDIA, ROCm, WSL


class WeightHashes:
    """sha256 of a checkpoint folder's weight files (names and contents, sorted by name), cached
    by the folder's path and each file's size and modification time, so that a large checkpoint
    is hashed once and not every session. ``path``: a JSON file kept beside the outcome store
    (None: in memory only). A changed, added or removed weight file invalidates the entry."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self._entries: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.is_file():
            try:
                self._entries = dict(json.loads(self.path.read_text()))
            except (OSError, ValueError, TypeError):
                self._entries = {}  # unreadable: rebuilt as folders are hashed

    def sha256(self, folder: str | Path) -> str:
        folder = Path(folder)
        files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()) if folder.is_dir() else []
        if not files:
            raise FileNotFoundError(f"{folder}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
        stats = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
        key = str(folder.resolve())
        entry = self._entries.get(key)
        if entry is not None and entry.get("files") == stats:
            return entry["sha256"]
        digest = hashlib.sha256()
        for file in files:
            digest.update(file.name.encode())
            with open(file, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        self._entries[key] = {"files": stats, "sha256": digest.hexdigest()}
        self._save()
        return digest.hexdigest()

    def _save(self) -> None:
        if self.path is None:
            return
        try:  # atomic: concurrent sessions (xdist workers) each write a whole file
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._entries, sort_keys=True, indent=1))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache folder: the hashes stay in memory


_HASHES = WeightHashes()


def cache_weight_hashes(folder: str | Path | None) -> None:
    """Keep this process's weight hashes in ``folder``/weight-hashes.json (None: leave as is)."""
    global _HASHES
    if folder is not None and _HASHES.path != Path(folder) / WEIGHT_HASHES:
        _HASHES = WeightHashes(Path(folder) / WEIGHT_HASHES)


def fingerprint(*paths: str | Path) -> str:
    """sha256 over the weight files of a checkpoint folder (names and contents, sorted by name);
    of several folders, the sha256 of their fingerprints joined by ':'. Cached (:class:`WeightHashes`)."""
    parts = [_HASHES.sha256(path) for path in paths]
    return parts[0] if len(parts) == 1 else hashlib.sha256(":".join(parts).encode()).hexdigest()


def library_version(name: str) -> str:
    """An installed library's version, from its distribution metadata (no import)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return str(importlib.import_module(name).__version__)


def describe(engine: str, device: Any, dtype: Any, **paths_and_more) -> dict[str, str]:
    """Where and how an engine runs, for the outcome store's key: the engine, its model paths,
    the device, the dtype and the library versions (outcomes never mix CPU and GPU runs)."""
    return {
        "engine": engine,
        **{key: str(value) for key, value in paths_and_more.items()},
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": library_version("torch"),
        "transformers": library_version("transformers"),
    }


def device_name(device: str) -> str:
    """The device a model lands on when loaded with ``device``, as ``str(torch.device)`` names
    it (``cuda`` is the current CUDA device, as ``model.to("cuda")`` does). Without torch for
    ``cpu``, and for ``auto`` on a machine with no GPU driver; torch decides everything else."""
    if device == "cpu" or (device == "auto" and not any(os.path.exists(node) for node in GPU_NODES)):
        return "cpu"
    from pytest_redline.engines import modeling

    return str(modeling.loaded_device(device))


def dtype_name(dtype: str, device: str) -> str:
    """``auto``: bfloat16 on CUDA, float32 elsewhere (as ``modeling.select_dtype``)."""
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype in FLOAT_DTYPES:
        return dtype
    from pytest_redline.engines import modeling  # its ValueError names the accepted dtypes

    return str(modeling.select_dtype(dtype)).removeprefix("torch.")


def identity(engine: str, device: str, dtype: str, weights: Sequence[str | Path], **paths_and_more) -> dict[str, Any]:
    """What a built engine's ``fingerprint()`` and ``describe()`` return, without loading a model:
    ``{"fingerprint": ..., "runtime": ...}``, for the outcome key of a warm rerun. ``weights``: the
    checkpoint folders, in the order the engine's fingerprint joins them."""
    where = device_name(device)
    return {"fingerprint": fingerprint(*weights), "runtime": describe(engine, where, dtype_name(dtype, where), **paths_and_more)}
