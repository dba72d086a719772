"""The analyses as ``redline`` subcommands, on any outcome CSV.

    redline sweep OUTCOMES.csv [MORE.csv ...] --reference R [--alphas 0.01:0.30:0.01] [--plot FILE.png]
    redline heldout OUTCOMES.csv --reference R --alpha A [--splits K] [--seed S] [--cal-fraction F]
                    [--rank full|calibration]
    redline baselines OUTCOMES.csv --reference R --alpha A [--tolerances 0,1,...] [--plot FILE.png]
                      (and the split options of heldout)
    redline validity OUTCOMES.csv [MORE.csv ...] --reference R [--sizes n//2,200,100,50,25]
                     [--splits K] [--alphas ...] [--plot FILE.png]
    redline intervals OUTCOMES.csv --reference R --alpha A [--boot B] [--seed S] [--confidence C]

Every command also takes the shared outcome options of :mod:`pytest_redline.cli_args`
(``--cost``, ``--lower-is-better``, ``--configs``, ``--delta``, ``--correction``, ``--family``)
and ``--json``. With several files, ``--reference`` is one name for all or one per file,
comma-separated. ``validity`` exits 1 when some combination is flagged.

:func:`add_subcommands` declares them all; :mod:`pytest_redline.cli` calls it with its subparsers.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_redline import cli_args
from pytest_redline.cli_args import EXIT_OK, UsageError, positive_int, probability

if TYPE_CHECKING:  # the analyses import scipy: a command imports them when it runs
    from pytest_redline.lab.procedure import Procedure

EXIT_FLAGGED = 1


# ---------------------------------------------------------------------- argument types


def alpha_grid(text: str) -> list[float]:
    """An argparse type: ``START:STOP:STEP`` (inclusive) or comma-separated budgets in (0, 1)."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int(round((stop - start) / step)) + 1
            values = [round(start + i * step, 10) for i in range(count)]
        else:
            values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP:STEP or comma-separated budgets, got '{text}'") from None
    for x in values:
        probability(repr(x))
    return values


def size_list(text: str) -> list[int | str]:
    """An argparse type: calibration sizes, comma-separated integers or ``n//2``."""
    sizes: list[int | str] = []
    for item in text.split(","):
        item = item.strip()
        if item == "n//2":
            sizes.append(item)
        elif item.isdigit() and int(item) >= 1:
            sizes.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"expected comma-separated sizes (integers >= 1 or n//2), got '{text}'")
    return sizes


def tolerance_list(text: str) -> list[float]:
    """An argparse type: comma-separated accuracy points >= 0."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = [-1.0]
    if any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated accuracy points >= 0, got '{text}'")
    return values


def seed(text: str) -> int:
    """An argparse type: an integer >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'")
    return int(text)


def png_path(text: str) -> str:
    """An argparse type: a path ending in .png."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"expected a .png path, got '{text}'")
    return text


# ---------------------------------------------------------------------- shared


def _outcome_parser(subparsers: Any, name: str, help: str, several: bool = False) -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help=help)
    cli_args.add_outcome_arguments(p, several=several)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    return p


def _alpha(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=probability, required=True, help="risk budget")


def _split_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--splits", type=positive_int, default=1000, metavar="K", help="random splits (default 1000)")
    p.add_argument("--seed", type=seed, default=20260918, help="seed of the one generator that draws the splits")
    p.add_argument("--cal-fraction", type=probability, default=0.5, help="share of prompts that calibrate (default 0.5)")
    p.add_argument(
        "--rank", choices=("full", "calibration"), default="full",
        help="rank configs by full-sample cost (the paper) or by the calibration part's cost",
    )


def _procedure(args: argparse.Namespace) -> Procedure:
    from pytest_redline.lab.procedure import Procedure

    return Procedure(args.delta, args.correction, args.family)


def _grids(args: argparse.Namespace) -> list[Any]:
    """Load every file of args.outcomes as a GridData, with its reference."""
    from pytest_redline.lab.analysis import GridData

    files = args.outcomes if isinstance(args.outcomes, list) else [args.outcomes]
    references = args.reference.split(",") if len(files) > 1 else [args.reference]
    if len(references) == 1:
        references = references * len(files)
    if len(references) != len(files):
        raise UsageError(
            f"argument --reference: expected one name or one per file ({len(files)} files), got '{args.reference}'",
            f"redline {args.command}",
        )
    grids = []
    for path, reference in zip(files, references):
        data = cli_args.load_outcomes(argparse.Namespace(**{**vars(args), "outcomes": path, "reference": reference}))
        grids.append(GridData.from_table(data.table, reference, data.cost_kind, data.lower_is_better, label=Path(path).stem))
    return grids


def _print(args: argparse.Namespace, results: list[Any]) -> None:
    if args.json:
        objects = [r.to_dict() for r in results]
        cli_args.print_json(objects[0] if len(objects) == 1 else {"grids": objects})
    else:
        print("\n\n".join(str(r) for r in results))


def _plot(args: argparse.Namespace, draw: Any, results: Any) -> None:
    if not args.plot:
        return
    try:
        draw(results, args.plot)
    except ImportError as e:
        raise UsageError(f"argument --plot: {e}", f"redline {args.command}") from None
    if not args.json:
        print(f"wrote {args.plot}")


# ---------------------------------------------------------------------- sweep


def add_sweep(subparsers: Any) -> None:
    p = _outcome_parser(subparsers, "sweep", "deployed config, gain and accuracy at each budget, and alpha_min", several=True)
    p.add_argument("--alphas", type=alpha_grid, default=None, metavar="0.01:0.30:0.01", help="budgets (default 0.01:0.30:0.01)")
    p.add_argument("--plot", type=png_path, metavar="FILE.png", help="step curve of the deployed gain against alpha")
    p.set_defaults(run=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    from pytest_redline import risk
    from pytest_redline.lab import analysis, plots

    alphas = args.alphas or risk.DEFAULT_ALPHAS
    results = [analysis.sweep(g, alphas, _procedure(args)) for g in _grids(args)]
    _print(args, results)
    _plot(args, plots.sweep_plot, results)
    return EXIT_OK


# ---------------------------------------------------------------------- heldout


def add_heldout(subparsers: Any) -> None:
    p = _outcome_parser(subparsers, "heldout", "calibrate on random parts, measure gain and exceedance on the rest")
    _alpha(p)
    _split_options(p)
    p.set_defaults(run=run_heldout)


def run_heldout(args: argparse.Namespace) -> int:
    from pytest_redline.lab import analysis

    (grid,) = _grids(args)
    result = analysis.heldout(grid, args.alpha, _procedure(args), args.splits, args.seed, args.cal_fraction, args.rank)
    _print(args, [result])
    return EXIT_OK


# ---------------------------------------------------------------------- baselines


def add_baselines(subparsers: Any) -> None:
    p = _outcome_parser(subparsers, "baselines", "Redline against mean-accuracy, plug-in and uncorrected rules on the same splits")
    _alpha(p)
    _split_options(p)
    p.add_argument(
        "--tolerances", type=tolerance_list, default=None, metavar="0,1,...,8,10",
        help="accuracy points of the mean-accuracy rule (default 0,1,2,3,4,5,6,7,8,10)",
    )
    p.add_argument("--plot", type=png_path, metavar="FILE.png", help="held-out exceedance against mean held-out gain")
    p.set_defaults(run=run_baselines)


def run_baselines(args: argparse.Namespace) -> int:
    from pytest_redline.lab import analysis, plots

    (grid,) = _grids(args)
    tolerances = analysis.MEAN_ACCURACY_TOLERANCES if args.tolerances is None else args.tolerances
    result = analysis.baselines(
        grid, args.alpha, _procedure(args), args.splits, args.seed, args.cal_fraction, args.rank, tolerances
    )
    _print(args, [result])
    _plot(args, plots.baselines_plot, result)
    return EXIT_OK


# ---------------------------------------------------------------------- validity


def add_validity(subparsers: Any) -> None:
    p = _outcome_parser(subparsers, "validity", "family-wise error and coverage over random splits (exit 1 if flagged)", several=True)
    p.add_argument("--sizes", type=size_list, default=None, metavar="n//2,200,100,50,25", help="calibration sizes")
    p.add_argument("--splits", type=positive_int, default=1000, metavar="K", help="splits; split s uses default_rng(s)")
    p.add_argument("--alphas", type=alpha_grid, default=None, metavar="0.01:0.30:0.01", help="budgets (default 0.01:0.30:0.01)")
    p.add_argument("--plot", type=png_path, metavar="FILE.png", help="histogram of the family-wise error")
    p.set_defaults(run=run_validity)


def run_validity(args: argparse.Namespace) -> int:
    from pytest_redline import risk
    from pytest_redline.lab import analysis, plots

    sizes = analysis.VALIDITY_SIZES if args.sizes is None else args.sizes
    alphas = args.alphas or risk.DEFAULT_ALPHAS
    results = [analysis.validity(g, alphas, sizes, args.splits, _procedure(args)) for g in _grids(args)]
    _print(args, results)
    _plot(args, plots.validity_plot, results)
    return EXIT_FLAGGED if any(r.flagged.any() for r in results) else EXIT_OK


# ---------------------------------------------------------------------- intervals


def add_intervals(subparsers: Any) -> None:
    p = _outcome_parser(subparsers, "intervals", "bootstrap gain and accuracy intervals, exact risk interval, for the deployed config")
    _alpha(p)
    p.add_argument("--boot", type=positive_int, default=10_000, metavar="B", help="bootstrap resamples (default 10000)")
    p.add_argument("--seed", type=seed, default=20260920, help="seed of the bootstrap weights")
    p.add_argument("--confidence", type=probability, default=0.95, help="two-sided confidence (default 0.95)")
    p.set_defaults(run=run_intervals)


def run_intervals(args: argparse.Namespace) -> int:
    from pytest_redline.lab import analysis

    (grid,) = _grids(args)
    result = analysis.intervals(grid, args.alpha, _procedure(args), args.boot, args.seed, args.confidence)
    _print(args, [result])
    return EXIT_OK


# ---------------------------------------------------------------------- registration


def add_subcommands(subparsers: Any) -> None:
    """Declare sweep, heldout, baselines, validity and intervals on ``redline``'s subparsers."""
    for add in (add_sweep, add_heldout, add_baselines, add_validity, add_intervals):
        add(subparsers)
