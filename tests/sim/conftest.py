"""Fixtures shared by the simulated-engine, docker and router tests (utilities: test_engine_harness.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_engine_harness import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Processes started by the test; all are stopped (by PID) at teardown."""
    p = Procs(tmp_path)
    yield p
    p.stop_all()


@pytest.fixture
def net() -> str:
    """A /24 on loopback of its own, so that tests never share addresses or ports."""
    return f"127.{random.randint(16, 250)}.{random.randint(1, 250)}"
