"""pytest-redline: certify lossy LLM serving configs with the Redline test.

Kept minimal: importing the package (as pytest does for the plugin) loads nothing heavy.
The statistics live in :mod:`pytest_redline.risk`, recorded outcomes in
:mod:`pytest_redline.outcomes`.
"""

__version__ = "0.1.0"
