"""Fixtures and hooks of the whole suite (plain helpers: ``tests/helpers/``): the simulated-cluster tests skipped
where no cluster can run, the modules in the order of ``helpers.order`` (the longest first), and
``--record-module-seconds``, which writes each module's measured seconds for that order."""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from gevent import monkey

from helpers import order, sim_missing
from k3deploy import load_recipe
from k3deploy.recipe import Recipe

# The suite runs in parallel processes (pytest-xdist, tools/test.sh), whose link to the controller is a thread:
# gevent's monkey-patching (pyinfra_cli patches on import, as pyinfra's API asks of scripts) would turn that
# thread's locks into greenlet locks and hang the worker. Tests that use pyinfra's API in this process read their
# hosts one after another; every command a test runs (k3deploy, pyinfra) patches its own process first.
monkey.patch_all = lambda *args, **kwargs: True

# Every k3deploy, pyinfra and simulator command a test runs is an interpreter of its own that imports the package
# (about 0.6 s of CPU each): where the environment keeps Python from writing bytecode (PYTHONDONTWRITEBYTECODE, set
# on this machine kind), each of them compiled every module it imports again, a quarter more CPU per command
# (docs/testing.md). The commands the tests start keep their compiled modules outside the repository, under the
# system's temporary directory (bytecode is checked against its source's time and size before use).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "k3deploy-tests-pycache"))

#: seconds per module of this run (setup, call and teardown of its tests), for ``--record-module-seconds``
_measured: defaultdict[str, float] = defaultdict(float)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-module-seconds", action="store_true",
                     help="write the seconds each module of this run took into tests/module-seconds.json (the "
                          "order of the modules: the longest first)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules the longest first (``helpers.order``: tools/test.sh's two processes take a module at a time, in
    this order); ``@pytest.mark.sim``: the test needs the simulated cluster; skipped, saying why, where it cannot
    run."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(order.module_of(item.nodeid), []).append(item)
    items[:] = [item for m in order.longest_first(by_module, order.load()) for item in by_module[m]]
    reason = sim_missing()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("sim") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _measured[order.module_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("--record-module-seconds") and not hasattr(config, "workerinput") and _measured:
        order.save(_measured)


@pytest.fixture(scope="session")
def recipe() -> Recipe:
    return load_recipe()
