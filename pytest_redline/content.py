"""The content identity of an input path: what enters an outcome key instead of the path (a
file's bytes, a model folder's configuration and weight files, a log folder's files), with the
file hashes cached by path, size and mtime so that a warm rerun reads no weights.

Plain standard library, below every other gate module: the grid's server specs
(:mod:`pytest_redline.servers`) key a ``{model}`` folder with it too, and
:mod:`pytest_redline.keys` builds the outcome keys on it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CONTENT_HASHES = "content-hashes.json"  # beside the outcome store
MODEL_CONFIG_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".py", ".tiktoken")  # config, tokenizer, template, code
MODEL_WEIGHT_SUFFIXES = (".safetensors", ".bin")


class ContentHashes:
    """SHA-256 of files, cached by (resolved path, size, mtime_ns) in a JSON file (None: in memory
    only), so that a warm rerun reads no weights. ``hashed`` counts the files read this time."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.hashed = 0
        self._entries: dict[str, list] = self._read()
        self._dirty = False

    def _read(self) -> dict[str, list]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            entries = json.loads(self.path.read_text())
            return {str(k): list(v) for k, v in dict(entries).items()}
        except (OSError, ValueError, TypeError):
            return {}  # unreadable: rebuilt as files are hashed

    def sha256(self, file: Path) -> str:
        stat = file.stat()
        where = str(file.resolve())
        entry = self._entries.get(where)
        if entry is not None and entry[:2] == [stat.st_size, stat.st_mtime_ns]:
            return entry[2]
        digest = hashlib.sha256()
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        self.hashed += 1
        self._entries[where] = [stat.st_size, stat.st_mtime_ns, digest.hexdigest()]
        self._dirty = True
        return digest.hexdigest()

    def save(self) -> None:
        """Write the cache (merged with what other processes wrote meanwhile), atomically."""
        if self.path is None or not self._dirty:
            return
        merged = {**self._read(), **self._entries}
        try:
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(merged, sort_keys=True))
            os.replace(tmp, self.path)
            self._dirty = False
        except OSError:
            pass  # a read-only cache folder: the hashes stay in memory


def content_identity(path: str | os.PathLike, hashes: ContentHashes | None = None) -> str:
    """The content identity of an input path, ``"sha256:<hex>"``: what enters an outcome key
    instead of the path, so that the same input in another folder has the same identity.

    - a file: the SHA-256 of its bytes;
    - a model folder (``config.json`` and a weight file at its top level): the SHA-256 over the
      names and hashes of its configuration files (:data:`MODEL_CONFIG_SUFFIXES`: config,
      generation config, tokenizer, chat template, remote code) and weight files
      (:data:`MODEL_WEIGHT_SUFFIXES`), not its documentation;
    - any other folder (a recorded run's logs): the SHA-256 over the relative names and hashes of
      all its files, subfolders included, but hidden ones.

    :param path: the file or folder.
    :param hashes: the cache of file hashes (by path, size and mtime); None hashes every file.
    :raises FileNotFoundError: when ``path`` is neither a file nor a folder.
    """
    path, hashes = Path(path), hashes if hashes is not None else ContentHashes()
    if path.is_file():
        found = hashes.sha256(path)
    elif path.is_dir():
        listing = [[f.relative_to(path).as_posix(), hashes.sha256(f)] for f in _identity_files(path)]
        found = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    else:
        raise FileNotFoundError(f"{path}: no such file or folder, so it has no content identity")
    hashes.save()
    return f"sha256:{found}"


def _identity_files(folder: Path) -> list[Path]:
    top = sorted(p for p in folder.iterdir() if p.is_file())
    if (folder / "config.json").is_file() and any(p.suffix in MODEL_WEIGHT_SUFFIXES for p in top):
        return [p for p in top if p.suffix in MODEL_CONFIG_SUFFIXES + MODEL_WEIGHT_SUFFIXES]
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))
