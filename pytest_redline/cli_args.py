"""What every ``redline`` subcommand shares: argument types, the outcome options, loading
an outcome CSV, one-line usage errors and JSON output.

Both :mod:`pytest_redline.cli` (select, sample-size) and :mod:`pytest_redline.lab.commands`
(the analyses) build on this module, and it imports neither of them.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_redline.checks import CORRECTIONS, FAMILIES, probability_arg

if TYPE_CHECKING:  # imported when a command loads an outcome CSV (load_outcomes)
    from pytest_redline.outcomes import OutcomeTable

EXIT_OK = 0
EXIT_USAGE = 4  # the gate's usage status (pytest.ExitCode.USAGE_ERROR); 2 before issue 29


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 4."""

    def __init__(self, message: str, prog: str = "redline") -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) that main() turns into exit status 4.

    argparse's own ``error`` prints the usage and exits 2; every usage error of the command
    (a missing or unknown argument, a bad value, an unknown subcommand) comes through here."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, self.prog)


# ---------------------------------------------------------------------- argument types

#: An argparse type: a number strictly inside (0, 1).
probability = probability_arg()


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got '{text}'") from None
    if x < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got '{text}'")
    return x


def config_list(text: str) -> list[str]:
    """An argparse type: comma-separated config names."""
    names = [name.strip() for name in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated config names, got '{text}'")
    return names


# ---------------------------------------------------------------------- shared by outcome commands


def add_outcome_arguments(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """The options of every command that works on recorded outcome CSVs (one, or ``several``)."""
    parser.add_argument(
        "outcomes",
        metavar="OUTCOMES.csv",
        nargs="+" if several else None,
        help="outcome CSV: config,prompt,correct,tokens,forwards[,...]",
    )
    parser.add_argument("--reference", required=True, metavar="NAME", help="the reference (lossless) config")
    parser.add_argument("--cost", default="tpf", metavar="tpf|apf|COLUMN", help="cost to rank by (default tpf)")
    parser.add_argument(
        "--lower-is-better", action="store_true", help="lower cost is better (implied for memory* columns)"
    )
    parser.add_argument("--configs", type=config_list, metavar="a,b,...", help="configs to use, in this order")
    parser.add_argument("--delta", type=probability, default=0.10, help="family-wise error level (default 0.10)")
    parser.add_argument("--correction", choices=CORRECTIONS, default="holm")
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        default="all",
        help="'all' counts the reference in the family (the paper); 'candidates' leaves it out",
    )


@dataclass(frozen=True)
class Outcomes:
    """A loaded outcome CSV, ready for the risk functions."""

    table: OutcomeTable  # restricted to --configs
    cost: np.ndarray
    cost_kind: str
    reference: int
    lower_is_better: bool

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        """Keyword arguments for risk.certify / sweep / alpha_min."""
        return {
            "names": self.table.configs,
            "lower_is_better": self.lower_is_better,
            "correction": args.correction,
            "family": args.family,
        }


def load_outcomes(args: argparse.Namespace) -> Outcomes:
    """Read args.outcomes, apply --configs, --reference and --cost; raises OutcomeError."""
    from pytest_redline.outcomes import OutcomeError, OutcomeTable, cost_direction

    table = OutcomeTable.read_csv(args.outcomes)
    if args.configs:
        table = table.select(args.configs)
    if args.reference not in table.configs:
        raise OutcomeError(
            f"{args.outcomes}: reference '{args.reference}' is not among the configs: {', '.join(table.configs)}"
        )
    cost = table.cost(args.cost)
    if not np.all(cost > 0):
        raise OutcomeError(f"{args.outcomes}: cost '{args.cost}' must be positive for every config, got {cost.tolist()}")
    lower = args.lower_is_better or cost_direction(args.cost) == "lower"
    return Outcomes(table, cost, args.cost, table.index(args.reference), lower)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))
