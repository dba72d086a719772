"""Shared test configuration: hypothesis profiles.

``dev`` (the default) is cheap for quick local runs; ``ci`` is loaded when the CI
environment variable is set (derandomized, no deadline, no example database).
Pick one explicitly with ``--hypothesis-profile``.
"""
import os

from hypothesis import settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
