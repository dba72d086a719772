"""The report files' helpers: an atomic write, the check that a report path is writable before any
decoding, a file's SHA-256, and the provenance of a run that the review page and the summary record."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from pytest_redline.calibration import Calibration
    from pytest_redline.decode.enginebook import EngineBook


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, with the permissions
    an ordinary new file gets (mkstemp's are owner-only, which CI artifact upload can trip on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise



def check_writable(path: str | Path) -> str | None:
    """Why ``path`` cannot be written (checked before any decoding), or None."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        return f"{target} is a folder"
    if not folder.is_dir():
        return f"its folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{target} is not writable"
    return None



def file_sha256(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None



def provenance(command: Sequence[str], calibrations: Sequence[Calibration], engines: EngineBook) -> dict[str, Any]:
    """What the page records of this run: the command line, package versions, and per grid
    and config the engine identity and the config's key, where this process computed them
    (under xdist the workers decode, and the controller knows only the grid)."""
    from importlib import metadata
    import platform
    import shlex

    from pytest_redline.decode.store import content_key

    versions = {}
    for package in ("pytest-redline", "torch", "transformers", "bitsandbytes", "pytest"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    grids = {}
    for cal in calibrations:
        configs = {}
        for name in cal.configs:
            identity = engines.known_identity(*cal.engines[name])
            key = content_key({"engine": identity, "params": cal.params[name]}) if identity else None
            configs[name] = {"identity": identity, "key": key}
        grids[cal.label] = {"configs": configs}
    return {"command": shlex.join(command), "versions": versions, "python": platform.python_version(), "grids": grids}
