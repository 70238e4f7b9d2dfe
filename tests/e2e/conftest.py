"""Fixtures of the end-to-end tests: real pyinfra over real SSH to simulated nodes with a real systemd (helpers:
``helpers``, ``helpers.simulated``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from helpers.simulated import Sim


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., Sim]]:
    """Makes simulated clusters (``make(name, hardware, nodes, *sim_up_args)``); brings them all down at the end."""
    made: list[Sim] = []

    def make(name: str, hardware: str, nodes: int, *args: str) -> Sim:
        s = Sim(name, hardware, nodes, *args)
        made.append(s)
        return s

    yield make
    for s in made:
        s.down()
