"""The text table of a :class:`~pytest_redline.risk.RedlineResult`: what ``pytest-redline
certify`` prints and the lab's sweeps show (the statistics themselves produce no text)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_redline.report import text

if TYPE_CHECKING:
    from pytest_redline.risk import RedlineResult


def render(result: RedlineResult) -> str:
    """Every config's figures, one row each (``R`` reference, ``*`` deployed), under a line
    naming the test and over the deployment. The words are the gate's terminal table's
    (:func:`pytest_redline.report.terminal.table_lines`): ``valid``/``NOT valid`` and ``d_acc``."""
    r = result
    header = ("", "config", "accuracy", "V", "risk", "risk_up", "p_value", "p_adj", "valid", "cost", "gain", "d_acc")
    rows = [header]
    for i, name in enumerate(r.names):
        mark = ("R" if i == r.reference_index else " ") + ("*" if i == r.deployed_index else " ")
        rows.append((
            mark,
            name,
            f"{r.accuracy[i]:.4f}",
            str(int(r.violations[i])),
            f"{r.risk[i]:.4f}",
            f"{r.risk_upper[i]:.4f}",
            text.number(r.p_values[i]),
            text.number(r.p_adjusted[i]),
            "valid" if r.valid[i] else "NOT valid",
            f"{r.cost[i]:.4g}",
            text.gain(r.gain[i], r.gain_kind),
            f"{r.net_accuracy[i]:+.1f}",
        ))
    lines = [
        f"Redline: alpha={r.alpha:g} delta={r.delta:g} {r.correction} (family: {r.family}), "
        f"n={r.n} prompts, m={r.m} configs, cost {'lower' if r.lower_is_better else 'higher'} is better"
    ]
    lines += text.table(rows, left=(1,))
    d = r.deployed_index
    if d == r.reference_index:
        verdict = f"deployed: {r.deployed} (the reference)"
    else:
        verdict = (
            f"deployed: {r.deployed} ({text.gain(r.gain[d], r.gain_kind)} vs reference {r.reference}, "
            f"{r.net_accuracy[d]:+.1f} accuracy points)"
        )
    lines.append("R reference, * deployed; d_acc: accuracy points vs the reference")
    lines.append(verdict)
    return "\n".join(lines)
