"""Decoding engines behind one protocol (see pytest_redline/contracts.py)."""
