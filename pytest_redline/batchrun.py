"""Moved to :mod:`pytest_redline.decode.batchrun`; the old name is kept for one release."""
from pytest_redline.contracts import moved

__getattr__ = moved(__name__, ("BatchRunner", "BatchTimeout", "paused_gc"), "pytest_redline.decode.batchrun")
