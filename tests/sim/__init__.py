"""Tests of the simulator itself and of the simulated nodes' tools, without a whole deploy (fixtures: conftest.py)."""
