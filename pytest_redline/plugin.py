"""The pytest hooks of the Redline gate. Thin: the logic lives in plain classes.

Without ``--redline-alpha`` the plugin only adds its options.
"""
from __future__ import annotations

import pytest

from pytest_redline.options import add_options


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
