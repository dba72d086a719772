"""The gate's command-line and ini options, and their resolved values.

Only ``--redline-alpha`` activates the gate. For the other settings the command line wins
over the ini file, which wins over the grid file (for ``delta``).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

CORRECTIONS = ("holm", "bonferroni")
DEFAULT_GRID = "redline.yaml"
DEFAULT_CACHE_DIR = ".redline"


def open_unit(option: str):
    """An argparse ``type`` accepting a number in the open interval (0, 1)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0.0 < value < 1.0:
            raise argparse.ArgumentTypeError(f"{option}: expected a number in (0, 1), got {text!r}")
        return value

    return parse


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("redline", "Redline gate (certify lossy serving configs)")
    group.addoption("--redline-alpha", type=open_unit("--redline-alpha"), default=None, metavar="ALPHA",
                    help="activate the gate: certify configs whose risk against the reference is below ALPHA")
    group.addoption("--redline-delta", type=open_unit("--redline-delta"), default=None, metavar="DELTA",
                    help="family-wise error level (default: the grid's delta, else 0.10)")
    group.addoption("--redline-grid", action="append", default=[], metavar="PATH",
                    help=f"a grid file to gate (repeatable; default: {DEFAULT_GRID} at the rootdir)")
    group.addoption("--redline-deploy", default=None, metavar="NAME",
                    help="override the grid's deploy: 'fastest' or the name of the config that must be certified")
    group.addoption("--redline-report", default=None, metavar="PATH", help="write the JSON report to PATH")
    group.addoption("--redline-outcomes", default=None, metavar="PATH",
                    help="write the per-prompt outcome CSV to PATH (the replay engine reads it back)")
    group.addoption("--redline-correction", choices=CORRECTIONS, default=None,
                    help="multiple-testing correction (default: holm)")
    group.addoption("--redline-cache-dir", default=None, metavar="DIR",
                    help=f"folder of the outcome store (default: {DEFAULT_CACHE_DIR} at the rootdir)")
    group.addoption("--redline-no-cache", action="store_true", default=False,
                    help="neither reuse nor keep stored outcomes: decode everything into a temporary store")
    parser.addini("redline_grid", "grid files to gate when --redline-grid is not given", type="paths", default=[])
    parser.addini("redline_delta", "default family-wise error level", default="")
    parser.addini("redline_correction", "default correction: holm or bonferroni", default="")
    parser.addini("redline_cache_dir", "folder of the outcome store", default="")
    parser.addini("redline_report", "default path of the JSON report", default="")
    parser.addini("redline_outcomes", "default path of the outcome CSV", default="")
