"""A fake engine and suite for the gate's tests (no torch), and a way to register them.

``FakeSuite(n)`` asks "what is i + 1?" for i < n. ``FakeEngine`` answers correctly except
where the config says otherwise, and costs ``forwards`` forwards per prompt:

    configs:
      ref:  {forwards: 10}
      fast: {forwards: 5, wrong: [q3]}      # one wrong answer
      rash: {forwards: 2, wrong_every: 4}   # every 4th prompt wrong
      bad:  {fail_on: q5}                   # the batch holding q5 raises

``log_path: PATH`` appends one JSON line per ``generate`` call (config, prompt ids, pid), and
``delay`` sleeps that long per call, to watch or interrupt decoding.

``TableSuite`` and ``TableEngine`` serve an outcome CSV as a *live* grid (a suite, and an
engine that does not record its prompts), so the schedule treats it as it treats a real
model, unlike ``replay``: ``suite: table``, ``engine: table``, both with ``outcomes: PATH``,
and ``configs: {name: {config: name}}``.

:func:`install` registers both under the ``redline.engines`` / ``redline.suites``
entry-point groups of a pytester directory, as an installed package would.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

# Imported here, in the outer process, so that pytester's in-process runs (which drop the
# modules they import) find them loaded: numpy's C extension cannot load twice.
import numpy  # noqa: F401
import scipy.stats  # noqa: F401
import yaml  # noqa: F401

# The gate's modules that the plugin imports only when a gate runs, too: else every in-process
# run imports (and assertion-rewrites) them again, ~3 s of CPU over the inner loop.
import pytest_redline.engines.replay  # noqa: F401
import pytest_redline.nodes  # noqa: F401
import pytest_redline.protocol  # noqa: F401
import pytest_redline.report.document  # noqa: F401
import pytest_redline.report.outcome_csv  # noqa: F401
import pytest_redline.report.sentences  # noqa: F401
import pytest_redline.report.terminal  # noqa: F401
import pytest_redline.risk  # noqa: F401
import pytest_redline.session  # noqa: F401
from pytest_redline.contracts import Generation, Prompt
from pytest_redline.suites.base import chat


class FakeSuite:
    name = "fake"

    def __init__(self, n: int = 60, crash_on: str | None = None) -> None:
        self.n, self.crash_on = n, crash_on

    def prompts(self) -> list[Prompt]:
        return [
            Prompt(id=f"q{i}", text=f"What is {i} + 1?", messages=chat(f"What is {i} + 1?"), meta={"answer": str(i + 1)})
            for i in range(self.n)
        ]

    def score(self, prompt: Prompt, text: str) -> bool:
        if prompt.id == self.crash_on:
            raise RuntimeError(f"fake scorer crashed on {prompt.id}")
        return text.strip() == prompt.meta["answer"]


class FakeEngine:
    name = "fake"

    def __init__(self, seed: int = 0, device: str = "cpu", dtype: str = "float64", log_path: str | None = None,
                 delay: float = 0.0) -> None:
        self.seed, self.device, self.dtype, self.log, self.delay = seed, device, dtype, log_path, delay

    @staticmethod
    def cost_bounds(engine_args, params):
        """What a config's ``bounds`` key declares (a test makes one lie)."""
        return params.get("bounds")

    def fingerprint(self) -> str:
        return f"fake-weights-{self.seed}"

    def describe(self) -> dict[str, str]:
        return {"device": self.device, "dtype": self.dtype}

    def generate(self, prompts, config):
        ids = [p.id for p in prompts]
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps({"config": dict(config), "prompts": ids, "pid": os.getpid()}) + "\n")
        time.sleep(self.delay)
        if config.get("fail_on") in ids:
            raise RuntimeError(f"fake engine exploded on {config['fail_on']}")
        wrong = set(config.get("wrong", ()))
        every = config.get("wrong_every")
        out = []
        for p in prompts:
            index = int(p.id[1:])
            bad = p.id in wrong or (every is not None and index % every == every - 1)
            text = "wrong" if bad else p.meta["answer"]
            out.append(Generation(text=text, tokens=10, forwards=config.get("forwards", 10),
                                  extra={"memory_gb": config.get("memory_gb", 1.0)}))
        return out


class TableSuite:
    name = "table"

    def __init__(self, outcomes: str) -> None:
        from pytest_redline.outcomes import OutcomeTable

        self.prompt_ids = OutcomeTable.read_csv(outcomes).prompts

    def prompts(self) -> list[Prompt]:
        return [Prompt(id=p, text=p) for p in self.prompt_ids]

    def score(self, prompt: Prompt, text: str) -> bool:
        raise AssertionError("the table engine sets `correct`; nothing to score")


class TableEngine:
    name = "table"

    def __init__(self, outcomes: str, bounds: bool = False) -> None:
        from pytest_redline.outcomes import OutcomeTable

        self.path, self.table = outcomes, OutcomeTable.read_csv(outcomes)

    @staticmethod
    def cost_bounds(engine_args, params):
        """With ``bounds: true``, true bounds: each field's range over the config's row (tokens,
        forwards, tokens per forward; extra columns constant per config are declared so)."""
        if not engine_args.get("bounds"):
            return None
        import numpy as np

        from pytest_redline.outcomes import OutcomeTable

        table = OutcomeTable.read_csv(engine_args["outcomes"])
        row = table.index(params["config"])
        fields = {"tokens": table.tokens[row], "forwards": table.forwards[row],
                  "tokens_per_forward": table.tokens[row] / np.maximum(table.forwards[row], 1.0)}
        # one ulp wider: a float quotient is within half an ulp of the exact one the gate checks
        out = {name: (float(np.nextafter(v.min(), -np.inf)), float(np.nextafter(v.max(), np.inf)))
               for name, v in fields.items() if not np.isnan(v).any()}
        for name, column in table.extra.items():
            values = column[row]
            out[name] = "constant" if np.all(values == values[0]) else (float(values.min()), float(values.max()))
        return out

    def fingerprint(self) -> str:
        return Path(self.path).read_text()

    def generate(self, prompts, config):
        row = self.table.index(config["config"])
        columns = [self.table.prompts.index(p.id) for p in prompts]
        return [Generation(text="", tokens=float(self.table.tokens[row, j]), forwards=float(self.table.forwards[row, j]),
                           extra={k: float(v[row, j]) for k, v in self.table.extra.items()},
                           correct=bool(self.table.correct[row, j])) for j in columns]


# Plugins the gate's tests do not need; hypothesis's and benchmark's slow down every run.
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:anyio")
DIST_INFO = "redline_fakes-0.0.dist-info"
ENTRY_POINTS = """\
[redline.engines]
fake = redline_fakes:FakeEngine
table = redline_fakes:TableEngine

[redline.suites]
fake = redline_fakes:FakeSuite
table = redline_fakes:TableSuite
"""


def install(folder: Path) -> None:
    """Make ``folder`` (on sys.path) hold this module as an installed package with entry points."""
    shutil.copy(Path(__file__), folder / "redline_fakes.py")
    info = folder / DIST_INFO
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: redline-fakes\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)


GRID = """\
name: fake-grid
suite: fake
suite_args: {n: 60}
engine: fake
engine_args: {log_path: calls.jsonl}
cost: tpf
reference: ref
batch_size: 8
configs:
  ref: {forwards: 10}
  fast: {forwards: 5, wrong: [q3]}
  rash: {forwards: 2, wrong_every: 4}
deploy: fastest
"""


class Project:
    """A pytester folder with the fakes installed and helpers to gate grids in it."""

    def __init__(self, pytester) -> None:
        self.pytester = pytester
        self.path = Path(pytester.path)
        install(self.path)
        pytester.syspathinsert()

    def grid(self, text: str = GRID, filename: str = "redline.yaml", **replace: str) -> Path:
        """Write a grid file; ``replace`` sets top-level keys (with their indented lines), DROP removes one."""
        blocks: dict[str, list[str]] = {}
        for line in text.splitlines():
            if line.startswith(" ") and blocks:
                blocks[list(blocks)[-1]].append(line)
            else:
                blocks[line.split(":", 1)[0]] = [line]
        for key, value in replace.items():
            blocks[key] = [] if value == "DROP" else [f"{key}: {value}"]
        path = self.path / filename
        path.write_text("".join(line + "\n" for lines in blocks.values() for line in lines))
        return path

    def run(self, *args: str):
        """In process (the outer process already imported pytest_redline: no rewrite warning)."""
        return self.pytester.runpytest(*QUIET, "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)

    def run_subprocess(self, *args: str, timeout: float = 300):
        """In a subprocess: for xdist (its workers take sys.path as it was when xdist was imported)."""
        return self.pytester.runpytest_subprocess(*QUIET, *args, timeout=timeout)

    def command(self, *args: str) -> list[str]:
        """A pytest command line for a subprocess in this folder."""
        return [sys.executable, "-m", "pytest", *QUIET, *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.path), os.environ.get("PYTHONPATH", "")])}

    def report(self, name: str = "report.json") -> dict:
        return json.loads((self.path / name).read_text())

    def calls(self) -> list[dict]:
        log = self.path / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
