"""Hostile and oversized values on a simulated 2-node cluster: a ``k3_ip`` that carries a shell command, and a
64 KiB served model name, are refused by ``k3deploy plan`` and by the deploy in one line (exit 2) before any host
is changed; nothing the value carries runs on a node."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import deploy, k3, why
from helpers.simulated import Sim

pytestmark = [pytest.mark.sim, pytest.mark.faults]

HOSTILE_IP = "10.0.0.2/29501' ; touch /tmp/pwned ; echo '"
UNTOUCHED = ("test ! -e /tmp/pwned && test ! -e /etc/k3deploy && test ! -e /etc/systemd/system/k3-engine.service "
             "&& ! systemctl is-active --quiet k3-stage-peers")


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    s = Sim("fiinputs", "h200", 2)
    s.set_vars("k3_strategy: multi_node_tp_dp\n")
    try:
        yield s
    finally:
        s.down()


def refused_in_one_line(sim: Sim, needle: str) -> None:
    """``plan`` and the deploy both refuse, in one line, before anything on the nodes changes."""
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 2, plan.stdout[-800:] + plan.stderr
    assert needle in plan.stderr and len(plan.stderr.strip().splitlines()) == 1, plan.stderr
    assert "Traceback" not in plan.stderr and len(plan.stderr) < 600
    run = deploy(sim.inventory, timeout=120)
    assert run.returncode == 2, why(run)
    assert needle in run.stdout and "Traceback" not in run.stdout, why(run)
    assert sum(needle in line for line in run.stdout.splitlines()) == 1, why(run)
    for rank in (0, 1):
        left = sim.ssh(rank, UNTOUCHED)
        assert left.returncode == 0, f"node {rank} was changed: {left.stdout}{left.stderr}"


def test_a_k3_ip_that_carries_a_command_is_refused(sim):
    inventory = Path(sim.inventory)
    text = inventory.read_text()
    ip = sim.info["nodes"][1]["ip"]
    hostile = re.sub(rf"'k3_ip': '{re.escape(ip)}'", lambda _: f"'k3_ip': {HOSTILE_IP!r}", text)
    assert hostile != text
    inventory.write_text(hostile)
    try:
        refused_in_one_line(sim, "variable k3_ip: Value error, \"10.0.0.2/29501' ; touch /tmp/pwned ; echo '\" is "
                                 "not an IP address or host name")
    finally:
        inventory.write_text(text)


def test_a_64_kib_served_model_name_is_refused(sim):
    before = sim.group_vars.read_text()
    sim.set_vars('k3_extra_args: ["--served-model-name", "' + "x" * 65536 + '"]\n')
    try:
        refused_in_one_line(sim, "variable k3_extra_args: Value error, item 1 is 65536 characters long, over the "
                                 "limit of 4096")
    finally:
        sim.group_vars.write_text(before)


def test_a_served_name_with_backslashes_serves_and_status_says_so(sim):
    """The readiness probe (its script on stdin) and ``status`` (``printf``, not dash's ``echo``) see the served
    model name as it is: the deploy serves and ``status`` says serving, not degraded."""
    sim.set_vars('k3_extra_args: ["--served-model-name", "org\\\\Kimi\\\\nK3"]\n')
    run = deploy(sim.inventory, timeout=240)
    assert run.returncode == 0, why(run)
    status = k3("status", sim.inventory, check=False)
    assert status.returncode == 0, status.stdout[-1500:] + status.stderr
    assert "cluster: serving" in status.stdout and "lists org\\Kimi\\nK3" in status.stdout, status.stdout[-1500:]
