"""Decoding engines behind one protocol (see engines/base.py)."""
