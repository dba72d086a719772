"""Moved to :mod:`pytest_redline.decode.enginebook`; the old name is kept for one release."""
from pytest_redline.contracts import moved

__getattr__ = moved(__name__, ("EngineBook", "EngineBuildError", "describe", "key_args", "args_key"), "pytest_redline.decode.enginebook")
