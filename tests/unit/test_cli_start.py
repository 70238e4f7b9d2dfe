"""What a ``k3deploy`` process imports before it answers: the offline commands (``resolve``, ``options``, ``lint``
without ``--inventory``) start without gevent, pyinfra, paramiko, rich or jinja2, and are not patched for gevent; a
command line that may reach hosts is patched first thing. The cold start itself is a figure of
``benchmarks/resolve_matrix.py``, not a test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT

HEAVY = ("gevent", "pyinfra", "pyinfra_cli", "paramiko", "rich", "jinja2")

#: runs the console entry point as the installed script does, and reports at exit what the process had imported
PROBE = f"""
import atexit, json, sys

def report():
    monkey = sys.modules.get("gevent.monkey")
    print(json.dumps({{
        "heavy": sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r})),
        "patched": bool(monkey and monkey.is_module_patched("socket")),
    }}), file=sys.stderr)

atexit.register(report)
from k3deploy.cli import main
main()
"""


def started(*args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
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


@pytest.mark.parametrize("args", [
    ("resolve", "--inventory", "inventories/gb300.py", "--json"),
    ("resolve", "--inventory=inventories/gb300.py"),
    ("plan", "inventories/no-such-inventory.py"),
])
def test_a_command_line_that_may_reach_hosts_is_patched_for_gevent_first(args):
    assert started(*args)["patched"] is True
