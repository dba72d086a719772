"""Calibration suites: prompt sets and their scorers (see pytest_redline/contracts.py)."""
