"""The repository's root conftest: Hypothesis profiles for every test run from this checkout.

- ``dev`` (the default): 30 examples per property and no deadline, cheap for local runs;
- ``ci`` (loaded when the ``CI`` environment variable is set): derandomized, no deadline, no
  example database and the reproduction blob printed, as Hypothesis recommends for CI.

Pick one explicitly with ``--hypothesis-profile NAME``. Tests that need more examples say so
with ``@settings(max_examples=...)``.

This file does not register the Redline plugin: the ``pytest11`` entry point of the installed
distribution does, once (``tests/meta/test_conftest.py`` checks it). It stays light on purpose,
because ``pytest --redline-alpha=...`` from the repository root loads it too; the fixtures
that build models live in ``tests/conftest.py``.
"""
import os

from hypothesis import settings

# Both from Hypothesis' defaults, not from whatever profile is loaded now (Hypothesis loads its
# own "ci" profile when it sees a CI variable).
DEFAULT = settings.get_profile("default")
settings.register_profile("dev", parent=DEFAULT, max_examples=30, deadline=None)
settings.register_profile("ci", parent=DEFAULT, derandomize=True, deadline=None, database=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
