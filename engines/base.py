"""Deprecated: the engine protocol and ``Generation`` moved to :mod:`pytest_redline.contracts`
(with the counting conventions every engine follows). The old names here still work until
pytest-redline 0.2, with a DeprecationWarning."""
from __future__ import annotations

from pytest_redline import contracts

__getattr__ = contracts.moved(__name__, ("Generation", "Engine", "FINISH_REASONS"), "pytest_redline.contracts")
