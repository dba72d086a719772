"""The gate's command-line and ini options, and their resolved values.

Only ``--redline-alpha`` activates the gate; it is also the budget of every grid that sets no
``alpha:`` of its own (a grid's own ``alpha:`` wins over it). For the other settings the command
line wins over the ini file, which wins over the grid file (for ``delta``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_redline.checks import CORRECTIONS, probability_arg
from pytest_redline.report.summary import PROMPTS as MARKDOWN_PROMPTS

DEFAULT_GRID = "redline.yaml"
DEFAULT_CACHE_DIR = ".redline"
PATH_OPTIONS = ("--redline-grid", "--redline-cache-dir", "--redline-report", "--redline-outcomes", "--redline-html",
                "--redline-markdown")


def seed_arg(text: str) -> int:
    """An argparse ``type`` accepting an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--redline-seed: expected an integer >= 0, got {text!r}")
    return value


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("redline", "Redline gate (certify lossy serving configs)")
    group.addoption("--redline-alpha", type=probability_arg("--redline-alpha"), default=None, metavar="ALPHA",
                    help="activate the gate: certify configs whose risk against the reference is below ALPHA, the "
                         "budget of every grid that sets no alpha of its own (a grid's alpha: wins)")
    group.addoption("--redline-delta", type=probability_arg("--redline-delta"), default=None, metavar="DELTA",
                    help="family-wise error level (default: the grid's delta, else 0.10)")
    group.addoption("--redline-grid", action="append", default=[], metavar="PATH",
                    help=f"a grid file to gate (repeatable; default: {DEFAULT_GRID} at the rootdir)")
    group.addoption("--redline-deploy", default=None, metavar="NAME",
                    help="override the grid's deploy: 'fastest' or the name of the config that must be certified")
    group.addoption("--redline-report", default=None, metavar="PATH", help="write the JSON report to PATH")
    group.addoption("--redline-html", default=None, metavar="PATH",
                    help="write the review page (one self-contained HTML file) to PATH")
    group.addoption("--redline-markdown", default=None, metavar="PATH",
                    help="write the pull-request summary (GitHub-flavoured Markdown) to PATH, and append it to "
                         "$GITHUB_STEP_SUMMARY when that is set")
    group.addoption("--redline-markdown-prompts", choices=MARKDOWN_PROMPTS, default=None,
                    help="what the summary shows of each regression: none (counts), ids (prompt ids and rules; the "
                         "default) or full (prompts and answers)")
    group.addoption("--redline-outcomes", default=None, metavar="PATH",
                    help="write the per-prompt outcome CSV to PATH (the replay engine reads it back)")
    group.addoption("--redline-correction", choices=CORRECTIONS, default=None,
                    help="multiple-testing correction (default: holm)")
    group.addoption("--redline-cache-dir", default=None, metavar="DIR",
                    help=f"folder of the outcome store (default: {DEFAULT_CACHE_DIR} at the rootdir)")
    group.addoption("--redline-no-cache", action="store_true", default=False,
                    help="neither reuse nor keep stored outcomes: decode everything into a temporary store")
    group.addoption("--redline-full", action="store_true", default=False,
                    help="decode every config on every prompt (no schedule): for net accuracy on all prompts "
                         "or an outcome export")
    group.addoption("--redline-plan", action="store_true", default=False,
                    help="preflight: print each grid's n, m, level, power at alpha/2 and alpha/4 and the prompts for "
                         "80%% power, then exit 0 without loading a model or decoding")
    group.addoption("--redline-seed", type=seed_arg, default=None, metavar="SEED",
                    help="seed of the candidates' prompt order (default 0)")
    parser.addini("redline_grid", "grid files to gate when --redline-grid is not given", type="paths", default=[])
    parser.addini("redline_delta", "default family-wise error level", default="")
    parser.addini("redline_correction", "default correction: holm or bonferroni", default="")
    parser.addini("redline_cache_dir", "folder of the outcome store", default="")
    parser.addini("redline_report", "default path of the JSON report", default="")
    parser.addini("redline_html", "default path of the HTML review page", default="")
    parser.addini("redline_markdown", "default path of the Markdown pull-request summary", default="")
    parser.addini("redline_markdown_prompts", "what the summary shows of regressions: none, ids or full", default="")
    parser.addini("redline_outcomes", "default path of the outcome CSV", default="")
    parser.addini("redline_seed", "seed of the candidates' prompt order (default 0)", default="")


@dataclass(frozen=True)
class GateOptions:
    """The gate's settings after the command line, the ini file and the defaults."""

    alpha: float
    delta: float | None  # None: each grid's own delta, else 0.10
    correction: str
    grids: tuple[Path, ...]  # named grids (--redline-grid, else the ini's); may be empty
    deploy: str | None
    report: Path | None
    outcomes: Path | None
    cache_dir: Path
    no_cache: bool
    full: bool = False
    seed: int = 0
    html: Path | None = None
    markdown: Path | None = None
    markdown_prompts: str = "ids"

    @classmethod
    def from_config(cls, config: pytest.Config) -> "GateOptions":
        here = Path(config.invocation_params.dir)
        root = Path(config.rootpath)
        opt = config.getoption
        return cls(
            alpha=opt("redline_alpha"),
            delta=opt("redline_delta") if opt("redline_delta") is not None else _ini_delta(config),
            correction=opt("redline_correction") or _ini_choice(config, "redline_correction", CORRECTIONS) or "holm",
            grids=tuple(here / p for p in opt("redline_grid")) or tuple(Path(p) for p in config.getini("redline_grid")),
            deploy=opt("redline_deploy"),
            report=_path(opt("redline_report"), here) or _path(config.getini("redline_report"), root),
            outcomes=_path(opt("redline_outcomes"), here) or _path(config.getini("redline_outcomes"), root),
            cache_dir=_path(opt("redline_cache_dir"), here) or _path(config.getini("redline_cache_dir"), root)
            or root / DEFAULT_CACHE_DIR,
            no_cache=bool(opt("redline_no_cache")),
            full=bool(opt("redline_full")),
            seed=opt("redline_seed") if opt("redline_seed") is not None else _ini_seed(config),
            html=_path(opt("redline_html"), here) or _path(config.getini("redline_html"), root),
            markdown=_path(opt("redline_markdown"), here) or _path(config.getini("redline_markdown"), root),
            markdown_prompts=opt("redline_markdown_prompts")
            or _ini_choice(config, "redline_markdown_prompts", MARKDOWN_PROMPTS) or "ids",
        )


def _path(value: str | None, base: Path) -> Path | None:
    return base / Path(value).expanduser() if value else None


def _ini_delta(config: pytest.Config) -> float | None:
    text = str(config.getini("redline_delta")).strip()
    if not text:
        return None
    try:
        return probability_arg("redline_delta")(text)
    except argparse.ArgumentTypeError as e:
        raise pytest.UsageError(f"{config.inipath}: ini {e}") from None


def _ini_seed(config: pytest.Config) -> int:
    text = str(config.getini("redline_seed")).strip()
    if not text:
        return 0
    try:
        return seed_arg(text)
    except argparse.ArgumentTypeError:
        raise pytest.UsageError(f"{config.inipath}: ini redline_seed: expected an integer >= 0, got {text!r}") from None


def _ini_choice(config: pytest.Config, name: str, choices: tuple[str, ...]) -> str | None:
    text = str(config.getini(name)).strip()
    if text and text not in choices:
        raise pytest.UsageError(f"{config.inipath}: ini {name}: expected one of {', '.join(choices)}, got {text!r}")
    return text or None


def check_spaced_paths(config: pytest.Config) -> None:
    """A usage error when a path option written with a space moved the rootdir.

    Pytest fixes the rootdir from the positional arguments before a plugin's options are
    known, so in ``--redline-grid /outside/grid.yaml`` it takes ``/outside/grid.yaml`` for a
    test path too, and the rootdir (the default grid, the store, the ini file) moves there.
    The option itself still gets its value, so the case is: the value after a path option
    names an existing path, and the rootdir without it would differ (or cannot be known: a
    pytest without a usable ``determine_setup``, which the start-up line names).
    """
    args = list(config.invocation_params.args)
    spaced = [(a, v) for a, v in zip(args, args[1:]) if a in PATH_OPTIONS and Path(config.invocation_params.dir, v).exists()]
    if not spaced:
        return
    intended = _rootdir_without(config, {v for _, v in spaced})
    if intended is not None and intended == Path(config.rootpath):
        return
    option, value = spaced[0]
    if intended is None:
        raise pytest.UsageError(
            f"{option} {value}: pytest fixes the rootdir before plugin options are known, so it also took {value} "
            f"as a test path and the rootdir (now {config.rootpath}) may have moved. Write {option}={value} (with '=')"
        )
    raise pytest.UsageError(
        f"{option} {value}: pytest fixes the rootdir before plugin options are known, so it also took {value} "
        f"as a test path and the rootdir moved to {config.rootpath}; without it the rootdir is {intended}. "
        f"Write {option}={value} (with '=')"
    )


def _rootdir_without(config: pytest.Config, values: set[str]) -> Path | None:
    """The rootdir pytest finds from the real positional arguments (None where this pytest's
    ``determine_setup`` is missing or changed: ``pytest_internals`` said so at start-up)."""
    from pytest_redline import pytest_internals

    determine_setup = pytest_internals.checked(config).determine_setup
    if determine_setup is None:
        return None
    return Path(pytest_internals.call_determine_setup(
        determine_setup, inifile=config.getoption("inifilename", None), override_ini=config.getoption("override_ini", None),
        args=[a for a in config.getoption("file_or_dir", None) or () if a not in values],
        rootdir_cmd_arg=config.getoption("rootdir", None) or None, invocation_dir=Path(config.invocation_params.dir),
    )[0])
