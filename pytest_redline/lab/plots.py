"""Figures of the analyses, written as PNG (matplotlib: the optional ``plots`` extra).

matplotlib is imported on first use, and its absence is a clear error. Figures are built
with the object-oriented API (``matplotlib.figure.Figure``), never pyplot: nothing global
changes (no backend switch, no figures left open).
"""
from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = ["baselines_plot", "sweep_plot", "validity_plot", "SIZE", "DPI"]

#: Figure size in inches and resolution: the PNG is 6.4 x 4.0 in at 150 dpi (960 x 600 pixels).
SIZE = (6.4, 4.0)
DPI = 150


def _figure() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'pytest-redline[plots]'") from None
    return Figure(figsize=SIZE, dpi=DPI)


def _save(fig: Any, path: str | os.PathLike) -> None:
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png", dpi=DPI)


def _gain_label(kinds: set[str], what: str) -> str:
    if len(kinds) > 1:
        raise ValueError("cannot draw percent gains and reduction factors on one axis; plot them separately.")
    return f"{what} (%)" if kinds == {"percent"} else f"{what} (x, reduction factor)"


def sweep_plot(results: Sequence[Any], path: str | os.PathLike) -> None:
    """Step curves of the deployed gain against the budget alpha, one per grid (SweepResult)."""
    fig = _figure()
    ax = fig.subplots()
    for r in results:
        ax.step(r.alphas, r.gain, where="post", label=f"{r.label} (alpha_min {'-' if r.alpha_min is None else format(r.alpha_min, 'g')})")
    ax.set_xlabel("risk budget alpha")
    ax.set_ylabel(_gain_label({r.gain_kind for r in results}, "deployed gain over the reference"))
    ax.set_title(f"Redline sweep, delta = {results[0].delta:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def baselines_plot(result: Any, path: str | os.PathLike) -> None:
    """Held-out exceedance against mean held-out gain (BaselinesResult).

    The mean-accuracy rule is a curve over its tolerances; Redline, the plug-in rule and
    Redline without correction are markers; the dashed line is the nominal level delta.
    """
    from pytest_redline.lab.analysis import PLUG_IN, UNCORRECTED

    fig = _figure()
    ax = fig.subplots()
    curve = result.mean_accuracy()
    ax.plot([r.mean_gain for r in curve], [r.exceedance for r in curve], "o-", color="tab:gray", label="mean-accuracy rule (t points)")
    labels: dict[tuple[float, float], list[str]] = {}  # tolerances that land on the same point share a label
    for r, t in zip(curve, result.tolerances):
        labels.setdefault((r.mean_gain, r.exceedance), []).append(f"{t:g}")
    for point, names in labels.items():
        ax.annotate(",".join(names), point, textcoords="offset points", xytext=(3, 4), fontsize=7)
    markers = [("redline", "*", "tab:red", 14, "Redline"), (PLUG_IN, "s", "tab:blue", 7, "plug-in (risk <= alpha)"),
               (UNCORRECTED, "^", "tab:orange", 8, "Redline without correction")]
    for name, marker, color, size, label in markers:
        r = result.rule(name)
        ax.plot([r.mean_gain], [r.exceedance], marker, color=color, markersize=size, label=label, linestyle="none")
    ax.axhline(result.delta, linestyle="--", color="black", linewidth=1, label=f"nominal level delta = {result.delta:g}")
    ax.set_xlabel(_gain_label({result.gain_kind}, "mean held-out gain"))
    ax.set_ylabel(f"held-out exceedance: share of splits, test risk > {result.alpha:g}")
    ax.set_ylim(bottom=0.0, top=max(2 * result.delta, max(r.exceedance for r in result.rules) * 1.1))
    ax.set_title(f"{result.label}: alpha = {result.alpha:g}, {result.splits} splits")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)


def validity_plot(results: Sequence[Any], path: str | os.PathLike) -> None:
    """Histogram of the family-wise error over (calibration size, alpha), per grid (ValidityResult)."""
    fig = _figure()
    ax = fig.subplots()
    top = max(max(float(r.fwer.max()) for r in results), results[0].delta) * 1.2 + 1e-3
    bins = [top * i / 30 for i in range(31)]
    ax.hist([r.fwer.ravel() for r in results], bins=bins, label=[r.label for r in results], stacked=True)
    ax.axvline(results[0].delta, linestyle="--", color="black", linewidth=1, label=f"delta = {results[0].delta:g}")
    ax.set_xlabel("family-wise error: share of splits where a valid config has test risk > alpha")
    ax.set_ylabel("(calibration size, alpha) combinations")
    ax.set_title(f"Validity study, {results[0].splits} splits per combination")
    ax.legend(fontsize=8)
    _save(fig, path)
