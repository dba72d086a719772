"""Exact Redline certification: a few pure functions over an m x n boolean matrix.

Row ``i`` of ``correct`` says which of the n calibration prompts config ``i`` answers
correctly; one row is the reference (the lossless config). For each config lambda:

- the violation count ``V(lambda) = #(reference correct and lambda wrong)``, an integer;
- the p-value ``p(lambda) = P[Bin(n, alpha) <= V(lambda)]`` of the null "risk > alpha",
  where the risk is ``R(lambda) = P(reference correct and lambda wrong)``;
- Holm's step-down (or Bonferroni) at family-wise level delta: the configs whose null is
  rejected are *valid*, and with probability at least 1 - delta every valid config has
  risk at most alpha;
- the deployed config has the best cost among the valid configs and the reference.

How many prompts a grid needs (power, sample size) is :mod:`pytest_redline.planning`.

numpy and ``scipy.special`` only: this module never imports torch or pytest, nor
``scipy.stats`` (whose import breaks when torch is blocked with ``sys.modules["torch"] = None``).
The modules: :mod:`~pytest_redline.risk.binomial` (counts, p-values, bounds),
:mod:`~pytest_redline.risk.corrections` (Holm, Bonferroni), :mod:`~pytest_redline.risk.result`
(:class:`RedlineResult`), :mod:`~pytest_redline.risk.certification` and
:mod:`~pytest_redline.risk.reverse` (the reverse test: "exceeds budget", and the three statuses),
:mod:`~pytest_redline.risk.grid` (all three for one grid in one pass: what the gate's verdict calls).
Every public name is importable from here; the text table of a result is :mod:`pytest_redline.report.redline_table`.
"""
from __future__ import annotations

from pytest_redline.risk.binomial import (
    ConfidenceInterval,
    binom_logpvalue,
    binom_pvalue,
    clopper_pearson_interval,
    clopper_pearson_upper,
    critical_count,
    critical_counts,
    lower_tail,
    violations,
)
from pytest_redline.risk.certification import (
    DEFAULT_ALPHAS,
    alpha_min,
    alpha_min_of,
    certify,
    certify_counts,
    gains,
    reaches,
    select_deployed,
    sweep,
)
from pytest_redline.risk.grid import GridCertificate, certify_grid
from pytest_redline.risk.corrections import bonferroni, family_mask, holm, holm_adjusted, reject_rows
from pytest_redline.risk.result import RedlineResult
from pytest_redline.risk.reverse import (
    CERTIFIED,
    EXCEEDS,
    INCONCLUSIVE,
    STATUSES,
    Reverse,
    exceeds_budget,
    reverse_pvalue,
    statuses,
    upper_tail,
)

__all__ = [
    "CERTIFIED",
    "EXCEEDS",
    "INCONCLUSIVE",
    "STATUSES",
    "ConfidenceInterval",
    "Reverse",
    "GridCertificate",
    "RedlineResult",
    "DEFAULT_ALPHAS",
    "alpha_min",
    "alpha_min_of",
    "binom_logpvalue",
    "binom_pvalue",
    "bonferroni",
    "certify",
    "certify_counts",
    "certify_grid",
    "clopper_pearson_interval",
    "clopper_pearson_upper",
    "critical_count",
    "critical_counts",
    "exceeds_budget",
    "family_mask",
    "gains",
    "reaches",
    "holm",
    "holm_adjusted",
    "lower_tail",
    "reject_rows",
    "reverse_pvalue",
    "select_deployed",
    "statuses",
    "sweep",
    "upper_tail",
    "violations",
]
