"""Every line of the gate's terminal summary fits 120 columns: the table in blocks of columns
that fit, its notes under it, the prose wrapped. A multi-grid session: the embedded grid's twelve
configs (redline.yaml, on 32 of its prompts, at alpha 0.2) beside the published LLaDA2 math outcomes' first 100
GSM8K prompts; tests/gate/test_replay.py checks the whole published grid's runs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from terminal_text import summary_lines, too_wide

import redline_fakes  # noqa: F401  (numpy and the gate's modules loaded once, for pytester's in-process runs)
import torch  # noqa: F401

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "data" / "redline" / "llada2_math.csv"


@pytest.mark.slow  # decodes the tiny model (32 prompts x 12 configs) and replays 700 items: 9 s wall at load 4.5 on 2 shared cores
def test_every_summary_line_of_a_multi_grid_session_fits_120_columns(pytester, run_gate):
    embedded = yaml.safe_load((ROOT / "redline.yaml").read_text())
    embedded.update(suite_args={**embedded["suite_args"], "n": 32}, batch_size=32,
                    engine_args={**embedded["engine_args"], "model": str(ROOT / "engines" / "models" / "bd-tiny")})
    (pytester.path / "embedded.yaml").write_text(yaml.safe_dump(embedded, sort_keys=False))
    rows = PUBLISHED.read_text().splitlines()
    keep = {f"gsm8k/{i}" for i in range(100)}
    (pytester.path / "outcomes.csv").write_text("\n".join([rows[0]] + [r for r in rows[1:] if r.split(",")[1] in keep]) + "\n")
    (pytester.path / "published.yaml").write_text(
        "name: llada2-published-gsm8k100\nengine: replay\nengine_args: {outcomes: outcomes.csv}\ncost: tpf\n"
        "reference: acc95/semi90\ndeploy: fastest\n")
    result = run_gate("--redline-alpha=0.2", "--redline-grid=embedded.yaml", "--redline-grid=published.yaml", "-v")
    lines = summary_lines(result)
    assert any(line.startswith("notes:") for line in lines) and sum(" redline: " in line for line in lines) == 2
    assert too_wide(result) == [], "\n".join(too_wide(result))
