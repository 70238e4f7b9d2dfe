"""Fixtures and hooks of the whole suite (plain helpers: ``tests/helpers/``)."""

from __future__ import annotations

import pytest
from gevent import monkey

from helpers import sim_missing
from k3deploy import load_recipe
from k3deploy.recipe import Recipe

# The suite runs in parallel processes (pytest-xdist, tools/test.sh), whose link to the controller is a thread:
# gevent's monkey-patching (pyinfra_cli patches on import, as pyinfra's API asks of scripts) would turn that
# thread's locks into greenlet locks and hang the worker. Tests that use pyinfra's API in this process read their
# hosts one after another; every command a test runs (k3deploy, pyinfra) patches its own process first.
monkey.patch_all = lambda *args, **kwargs: True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.sim``: the test needs the simulated cluster; skipped, saying why, where it cannot run."""
    reason = sim_missing()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("sim") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def recipe() -> Recipe:
    return load_recipe()
