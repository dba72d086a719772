"""Calibration suites: prompt sets and their scorers (see suites/base.py)."""
