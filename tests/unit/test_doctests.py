"""Every docstring example of the package and of the simulator's (k3sim) runs, so it stays true: the modules are found
by walking ``k3deploy`` and ``k3sim`` (no list to keep), and a module whose source shows an example the doctest finder does not reach fails too."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import k3deploy
import k3sim


def package_modules() -> list[str]:
    """Every module of the packages (the simulated nodes' tools are scripts of the nodes, not modules of them)."""
    names = [package.__name__ for package in (k3deploy, k3sim)]
    names += [m.name for package in (k3deploy, k3sim)
              for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    return sorted(name for name in names if ".node_tools" not in name)


def shows_examples(module: ModuleType) -> bool:
    """Whether a line of the module's source starts with ``>>>`` (an example, found by the finder or not)."""
    source = module.__loader__.get_source(module.__name__) if module.__loader__ else None  # type: ignore[attr-defined]
    return source is not None and re.search(r"^\s*>>> ", source, re.M) is not None


MODULES = package_modules()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(module) if t.examples]
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} fail (output above)"
    if shows_examples(module):  # examples marked ``+SKIP`` are found, not run
        assert tests, f"{name} shows '>>> ' examples the doctest finder does not reach"


def test_the_walk_finds_the_package():
    assert {"k3deploy.facts.base", "k3deploy.model.secrets", "k3deploy.recipe.lint", "k3sim.faults"} <= set(MODULES)
    assert not any("node_tools" in name for name in MODULES)
