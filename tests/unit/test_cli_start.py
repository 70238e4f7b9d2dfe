"""What a ``k3deploy`` process imports before it answers: the offline commands (``resolve``, ``options``, ``lint``
without ``--inventory``) start without gevent, pyinfra, paramiko, rich or jinja2, and are not patched for gevent; the
command list (``--help``, the simulator's ``sim`` included) starts without the recipe's models either (pydantic, yaml);
a command line that may reach hosts is patched first thing. The cold start itself is a figure of
``benchmarks/cold_start.py``, not a test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT

HEAVY = ("gevent", "pyinfra", "pyinfra_cli", "paramiko", "rich", "jinja2")
#: what the recipe's models import: a command that reads no recipe starts without them
MODELS = ("pydantic", "pydantic_core", "yaml")

#: runs the console entry point as the installed script does, and reports at exit which of HEAVY (a format field)
#: the process had imported
PROBE = """
import atexit, json, sys

def report():
    monkey = sys.modules.get("gevent.monkey")
    print(json.dumps({{
        "heavy": sorted({{name.split(".")[0] for name in sys.modules}} & set({heavy!r})),
        "patched": bool(monkey and monkey.is_module_patched("socket")),
    }}), file=sys.stderr)

atexit.register(report)
from k3deploy.cli import main
main()
"""


def started(*args: str, heavy: tuple[str, ...] = HEAVY) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=heavy), *args], cwd=ROOT, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    data: dict[str, object] = json.loads(last)
    return data


@pytest.mark.parametrize("args", [
    ("resolve", "--hardware", "gb300", "--json"),
    ("resolve", "--hardware", "b300"),
    ("options", "--json"),
    ("lint", "--json"),
    ("--version",),
])
def test_offline_commands_import_no_host_machinery(args):
    assert started(*args) == {"heavy": [], "patched": False}


def test_the_command_list_imports_neither_host_machinery_nor_the_recipe_models():
    assert started("--help", heavy=HEAVY + MODELS) == {"heavy": [], "patched": False}


@pytest.mark.parametrize("args", [
    ("resolve", "--inventory", "inventories/gb300.py", "--json"),
    ("resolve", "--inventory=inventories/gb300.py"),
    ("plan", "inventories/no-such-inventory.py"),
])
def test_a_command_line_that_may_reach_hosts_is_patched_for_gevent_first(args):
    assert started(*args)["patched"] is True
