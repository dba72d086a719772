"""The ``redline`` command: Redline on outcomes recorded elsewhere.

    redline select OUTCOMES.csv --reference NAME --alpha A [--delta D] [--cost tpf|apf|COLUMN]
                   [--lower-is-better] [--configs a,b,...] [--correction holm|bonferroni]
                   [--family all|candidates] [--json]
    redline sample-size --alpha A --risk R --configs M [--delta D] [--power P] [--json]

Each subcommand is a pair: ``add_<name>(subparsers)`` declares its parser and sets
``run=<function(args) -> int>``; list it in ``SUBCOMMANDS``. The analyses (sweep,
heldout, baselines, validity, intervals) are declared in :mod:`pytest_redline.lab.commands`.
Commands on recorded outcomes declare the shared options with
:func:`~pytest_redline.cli_args.add_outcome_arguments` and load them with
:func:`~pytest_redline.cli_args.load_outcomes`. Bad input is one line on stderr and exit
status 4 (the gate's usage status), never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from pytest_redline.cli_args import (
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    UsageError,
    add_outcome_arguments,
    load_outcomes,
    positive_int,
    print_json,
    probability,
)
from pytest_redline.lab.commands import add_subcommands as add_analyses


# ---------------------------------------------------------------------- select


def add_select(subparsers: Any) -> None:
    p = subparsers.add_parser("select", help="certify the configs of an outcome CSV and pick the one to deploy")
    add_outcome_arguments(p)
    p.add_argument("--alpha", type=probability, required=True, help="risk budget")
    p.add_argument("--json", action="store_true", help="print the JSON report object instead of the table")
    p.set_defaults(run=run_select)


def run_select(args: argparse.Namespace) -> int:
    from pytest_redline import risk
    from pytest_redline.report import redline_table

    data = load_outcomes(args)
    # One sweep: the chosen budget first, then the alpha_min grid.
    alphas = (args.alpha,) + risk.DEFAULT_ALPHAS
    result, *grid = risk.sweep(data.table.correct, data.cost, data.reference, alphas, args.delta, **data.options(args))
    amin = risk.alpha_min_of(grid)
    if args.json:
        print_json({**result.to_dict(alpha_min=amin), "cost": data.cost_kind})
    else:
        print(f"{args.outcomes}: cost {data.cost_kind}")
        print(redline_table.render(result))
        print(f"alpha_min: {amin if amin is not None else 'none on 0.01 .. 0.30'}")
    return EXIT_OK


# ---------------------------------------------------------------------- sample-size


def add_sample_size(subparsers: Any) -> None:
    p = subparsers.add_parser("sample-size", help="prompts needed to certify a config of a given true risk")
    p.add_argument("--alpha", type=probability, required=True, help="risk budget")
    p.add_argument("--risk", type=float, required=True, help="true risk of the config, in [0, alpha)")
    p.add_argument("--configs", type=positive_int, required=True, metavar="M", help="configs in the family")
    p.add_argument("--delta", type=probability, default=0.10, help="family-wise error level (default 0.10)")
    p.add_argument("--power", type=probability, default=0.8, help="target power (default 0.8)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(run=run_sample_size)


def run_sample_size(args: argparse.Namespace) -> int:
    from pytest_redline import planning, risk

    if not 0.0 <= args.risk < args.alpha:
        raise UsageError(f"argument --risk: expected a number in [0, alpha = {args.alpha:g}), got {args.risk:g}", "redline sample-size")
    n = planning.prompts_needed(args.alpha, args.risk, args.configs, args.delta, args.power)
    level = args.delta / args.configs
    report = {
        "alpha": args.alpha,
        "risk": args.risk,
        "configs": args.configs,
        "delta": args.delta,
        "power": args.power,
        "level": level,
        "prompts_needed": n,
        "critical_count": risk.critical_count(n, args.alpha, level),
    }
    if args.json:
        print_json(report)
    else:
        print(
            f"{n} prompts: from n = {n} on, a config of true risk {args.risk:g} passes Holm's first step "
            f"(level delta/m = {level:.4g}) at alpha = {args.alpha:g} with probability >= {args.power:g} "
            f"(at n = {n}: at most {report['critical_count']} violations pass)"
        )
    return EXIT_OK


# ---------------------------------------------------------------------- entry point

#: Each declares subcommands on the subparsers (the analyses live in lab/commands.py).
SUBCOMMANDS: list[Callable[[Any], None]] = [add_select, add_sample_size, add_analyses]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="redline", description="Redline certification of recorded LLM serving outcomes.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (4 with one line on stderr for bad input)."""
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (UsageError, ValueError) as e:  # OutcomeError is a ValueError
        prog = e.prog if isinstance(e, UsageError) else "redline"
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
