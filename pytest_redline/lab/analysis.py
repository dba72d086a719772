"""The paper's evaluation on recorded outcomes: budget sweeps, held-out splits, baselines,
the validity study and bootstrap intervals.

Everything is vectorized over splits and budgets. K splits of n prompts are a (K, n)
boolean calibration mask; one matrix product of that mask with the stacked (configs x
prompts) arrays gives every split's calibration counts and costs, and the test part's are
the totals minus those. Nothing loops over prompts.

The paper's protocols are the defaults:

- held-out splits (:func:`heldout`, :func:`baselines`): one generator
  ``numpy.random.default_rng(20260918)`` draws K permutations; the calibration part is the
  first ``round(cal_fraction * n)`` indices of each; configs are ranked by full-sample cost;
- the validity study (:func:`validity`): split s is ``default_rng(s).permutation(n)``, and
  every calibration size takes the first n_cal indices of the same permutation;
- the bootstrap (:func:`intervals`): ``default_rng(20260920).multinomial(n, [1/n]*n, size=B)``
  weight vectors, the same weights for the deployed config and the reference.

One module per analysis, each name importable from here: :mod:`~pytest_redline.lab.procedure`
(:class:`Procedure`, :class:`GridData`), :mod:`~pytest_redline.lab.splits` (permutations,
masks, weights, a split's measures), :mod:`~pytest_redline.lab.sweep`,
:mod:`~pytest_redline.lab.heldout`, :mod:`~pytest_redline.lab.baselines`,
:mod:`~pytest_redline.lab.validity` and :mod:`~pytest_redline.lab.intervals`.

numpy and scipy only (through :mod:`pytest_redline.risk`); never torch. Validity, the
deployment rule and the text tables are the gate's own (:func:`risk.reject_rows`,
:func:`risk.select_deployed`, :mod:`pytest_redline.report.text`), so an analysis measures the
procedure the gate runs.
"""
from __future__ import annotations

from pytest_redline.lab.baselines import (
    MEAN_ACCURACY_TOLERANCES,
    PLUG_IN,
    UNCORRECTED,
    BaselinesResult,
    baselines,
    mean_accuracy_rule,
)
from pytest_redline.lab.heldout import HeldoutResult, heldout
from pytest_redline.lab.intervals import IntervalsResult, intervals
from pytest_redline.lab.procedure import PROCEDURE_CORRECTIONS, GridData, Procedure
from pytest_redline.lab.splits import (
    BOOTSTRAP_SEED,
    HELDOUT_SEED,
    MIN_PART,
    RANKS,
    VALIDITY_SIZES,
    SplitOutcomes,
    Spread,
    bootstrap_weights,
    calibration_mask,
    calibration_sizes,
    heldout_permutations,
    validity_permutations,
)
from pytest_redline.lab.sweep import SweepResult, sweep
from pytest_redline.lab.validity import MC_Z, ValidityResult, validity

__all__ = [
    "BOOTSTRAP_SEED",
    "HELDOUT_SEED",
    "MC_Z",
    "MEAN_ACCURACY_TOLERANCES",
    "MIN_PART",
    "PLUG_IN",
    "PROCEDURE_CORRECTIONS",
    "RANKS",
    "UNCORRECTED",
    "VALIDITY_SIZES",
    "BaselinesResult",
    "GridData",
    "HeldoutResult",
    "IntervalsResult",
    "Procedure",
    "Spread",
    "SplitOutcomes",
    "SweepResult",
    "ValidityResult",
    "baselines",
    "bootstrap_weights",
    "calibration_mask",
    "calibration_sizes",
    "heldout",
    "heldout_permutations",
    "intervals",
    "mean_accuracy_rule",
    "sweep",
    "validity",
    "validity_permutations",
]
