"""The figures: each is a PNG of the documented size, not blank, from real vendored outcomes."""
from pathlib import Path

import numpy as np
import pytest

from pytest_redline import cli
from pytest_redline.lab import analysis, plots
from pytest_redline.lab.analysis import GridData
from pytest_redline.lab.commands import add_subcommands
from pytest_redline.outcomes import OutcomeTable

pytestmark = pytest.mark.slow  # matplotlib renders every figure: 5.5 s of CPU here

image = pytest.importorskip("matplotlib.image")

DATA = Path(__file__).resolve().parents[1] / "data" / "redline"
PIXELS = (round(plots.SIZE[1] * plots.DPI), round(plots.SIZE[0] * plots.DPI))  # (height, width)


def grid(name, reference="acc95/semi90", cost="tpf"):
    return GridData.from_table(OutcomeTable.read_csv(DATA / f"{name}.csv"), reference, cost, label=name)


def assert_drawn_png(path):
    """A PNG of the documented size with real content: many non-white pixels, several colours."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(path)[..., :3]
    assert pixels.shape[:2] == PIXELS
    ink = np.any(pixels < 0.95, axis=-1)
    assert 0.02 < ink.mean() < 0.9
    assert len(np.unique(pixels.reshape(-1, 3).round(1), axis=0)) >= 4  # axes, text and coloured marks


def test_drawn_sweep_plot(tmp_path):
    results = [analysis.sweep(grid(name)) for name in ("llada2_math", "llada2_code")]
    plots.sweep_plot(results, tmp_path / "sweep.png")
    assert_drawn_png(tmp_path / "sweep.png")


def test_drawn_baselines_plot(tmp_path):
    result = analysis.baselines(grid("llada2_code"), 0.10, splits=100)
    plots.baselines_plot(result, tmp_path / "baselines.png")
    assert_drawn_png(tmp_path / "baselines.png")


def test_drawn_validity_plot(tmp_path):
    results = [analysis.validity(grid(name), splits=50) for name in ("llada2_math", "llada2_code")]
    plots.validity_plot(results, tmp_path / "validity.png")
    assert_drawn_png(tmp_path / "validity.png")


def test_bad_input_mixed_gain_kinds(tmp_path):
    quant = OutcomeTable.read_csv(DATA / "quant_llama_gsm8k.csv").with_column("memory_gb", [16.061, 8.03, 4.015, 4.015])
    results = [analysis.sweep(grid("llada2_math")), analysis.sweep(GridData.from_table(quant, "bf16", "memory_gb"))]
    with pytest.raises(ValueError, match="cannot draw percent gains and reduction factors on one axis"):
        plots.sweep_plot(results, tmp_path / "mixed.png")


def test_drawn_cli_plot(tmp_path, monkeypatch, capsys):
    """--plot goes through one helper for sweep, baselines and validity; sweep is the cheapest."""
    if add_subcommands not in cli.SUBCOMMANDS:
        monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, add_subcommands])
    path = tmp_path / "sweep.png"
    status = cli.main(["sweep", str(DATA / "llada2_code.csv"), "--reference", "acc95/semi90", "--plot", str(path)])
    assert status == 0 and f"wrote {path}" in capsys.readouterr().out
    assert_drawn_png(path)
