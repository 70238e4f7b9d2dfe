"""Tests of the simulated cluster (a package, so that its conftest.py does not shadow tests/conftest.py)."""
