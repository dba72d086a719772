"""Moved to :mod:`pytest_redline.decode.store`; the old name is kept for one release."""
from pytest_redline.contracts import moved

__getattr__ = moved(__name__, ("OutcomeStore", "StoredOutcome", "StoreError", "content_key", "FILENAME", "SCHEMA_VERSION"), "pytest_redline.decode.store")
