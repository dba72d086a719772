"""Child processes that a test interrupts with Ctrl-C (SIGINT).

A shell that starts the test run in the background without job control (``cmd &`` in a script,
``nohup``) leaves SIGINT ignored, and an ignored signal stays ignored across ``exec``: the child
would never see the test's Ctrl-C. GNU env's ``--default-signal`` restores it before ``exec``.
"""
from __future__ import annotations

import functools
import subprocess
from typing import Sequence


@functools.cache
def _env_restores_signals() -> bool:
    try:
        return subprocess.run(["env", "--default-signal=INT", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def interruptible(command: Sequence[str]) -> list[str]:
    """``command`` with SIGINT at its default disposition, so Python turns it into KeyboardInterrupt."""
    return ["env", "--default-signal=INT", *command] if _env_restores_signals() else list(command)
