import json
from pathlib import Path

import pytest
from gevent import monkey

from k3deploy import load_recipe

# The suite runs in parallel processes (pytest-xdist, tools/test.sh), whose link to the controller is a thread:
# gevent's monkey-patching (pyinfra_cli patches on import, as pyinfra's API asks of scripts) would turn that
# thread's locks into greenlet locks and hang the worker. Tests that use pyinfra's API in this process read their
# hosts one after another; every command a test runs (k3deploy, pyinfra) patches its own process first.
monkey.patch_all = lambda *args, **kwargs: True

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(scope="session")
def recipe():
    return load_recipe()


def golden(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())
