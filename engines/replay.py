"""The ``replay`` engine: recorded outcomes played back as if decoded now.

It reads an outcome CSV (``config,prompt,correct,tokens,forwards[,extra...]``, the format
of the paper's published data and of ``--redline-outcomes``), so any recorded run can be
gated through pytest exactly as a live one. It records its own prompts and configs, so a
replay grid needs no suite:

    engine: replay
    engine_args: {outcomes: tests/data/redline/llada2_math.csv}

Each config's parameters are ``{"config": <name in the file>}``; a grid may rename them
(``configs: {fast: {config: acc85/semi70}}``). Generations carry ``correct`` (so no suite
scores them), no text, and ``None`` for an empty ``tokens``/``forwards`` cell.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_redline.contracts import ConfigError, Generation, Prompt
from pytest_redline.outcomes import OutcomeTable


class ReplayEngine:
    name = "replay"
    batch_invariant = True  # one recorded answer per prompt, whatever the batch

    def __init__(self, outcomes: str) -> None:
        self.path = Path(outcomes)
        self.table = OutcomeTable.read_csv(self.path)
        self._fingerprint = hashlib.sha256(self.path.read_bytes()).hexdigest()
        self._column = {prompt: j for j, prompt in enumerate(self.table.prompts)}

    @classmethod
    def check_config(cls, params: Mapping[str, Any]) -> None:
        """A replayed config's parameters are ``{config: NAME}``; checked without the file."""
        unknown = sorted(set(params) - {"config"})
        if unknown:
            raise ConfigError(unknown[0], f"replay: unknown config key {unknown[0]!r}; known keys: config", ("config",))
        if not isinstance(params.get("config"), str):
            raise ConfigError("config", f"replay: config: expected the name of a recorded config, got {params.get('config')!r}")

    def fingerprint(self) -> str:
        """The SHA-256 of the outcome file."""
        return self._fingerprint

    def prompts(self) -> list[Prompt]:
        """The recorded prompts, in file order (the prompt id is also its text)."""
        return [Prompt(id=p, text=p) for p in self.table.prompts]

    def configs(self) -> dict[str, dict[str, Any]]:
        """The recorded configs, in file order, with their parameters."""
        return {name: {"config": name} for name in self.table.configs}

    def generate(self, prompts: Sequence[Prompt], config: Mapping[str, Any]) -> list[Generation]:
        if "config" not in config:
            raise ValueError(f"{self.path}: replay parameters need 'config' (a config name), got {dict(config)!r}")
        row = self.table.index(str(config["config"]))
        out = []
        for prompt in prompts:
            if prompt.id not in self._column:
                raise ValueError(f"{self.path}: no recorded prompt {prompt.id!r}")
            j = self._column[prompt.id]
            out.append(Generation(
                text="",
                tokens=_cell(self.table.tokens[row, j]),
                forwards=_cell(self.table.forwards[row, j]),
                extra={name: float(col[row, j]) for name, col in self.table.extra.items() if not math.isnan(col[row, j])},
                correct=bool(self.table.correct[row, j]),
            ))
        return out


def _cell(x: float) -> int | float | None:
    if math.isnan(x):
        return None
    return int(x) if x == int(x) else float(x)
