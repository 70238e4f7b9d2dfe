"""Fixtures shared by the simulated-engine, docker and router tests (utilities: ``helpers.engine``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import engine as harness
from helpers.engine import Outside, Procs


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


@pytest.fixture(scope="session")
def outside_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outside]:
    """The simulated outside (4 MiB images, 4 MiB checkpoints) for the host's "nodes" (K3SIM_OUTSIDE)."""
    srv = Outside(tmp_path_factory.mktemp("outside"), f"127.{random.randint(16, 250)}.{random.randint(1, 250)}.254")
    harness.OUTSIDE_ADDR = srv.addr
    yield srv
    harness.OUTSIDE_ADDR = None
    srv.stop()
