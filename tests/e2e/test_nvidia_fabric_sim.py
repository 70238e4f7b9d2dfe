"""`k3deploy preflight` against simulated NVIDIA clusters in the situations of issue 26: HGX GPUs stuck In Progress
in the NVSwitch fabric while Fabric Manager runs (finding 3), a GB300 tray whose NVLink fabric reports degraded
bandwidth (finding 7), and an IMEX domain formed on the trays' management network (finding 2)."""

from __future__ import annotations

import pytest

from helpers import preflight, result
from helpers.simulated import Sim

pytestmark = pytest.mark.sim


def test_hgx_gpus_in_progress_fail_preflight_though_fabric_manager_is_active():
    sim = Sim("e26h2a", "h200", 2, "--fault", "1:fabric=In Progress")
    try:
        rc, report = preflight(sim.inventory)
    finally:
        sim.down()
    assert rc == 1 and report["failed_hosts"] == ["e26h2a-node2"]
    assert result(report, "e26h2a-node2", "nvidia.fabricmanager")["status"] == "pass"
    stuck = result(report, "e26h2a-node2", "nvswitch.fabric")
    assert stuck["status"] == "fail" and "8 of 8 GPU(s) not registered" in stuck["observed"]
    assert "State In Progress" in stuck["observed"] and "FABRIC_MODE" in stuck["fix"]
    assert result(report, "e26h2a-node1", "nvswitch.fabric")["status"] == "pass"


def test_imex_on_the_management_network_passes_and_a_degraded_tray_warns():
    sim = Sim("e26h2b", "gb300", 2, "--fault", "0:imex-mgmt", "--fault", "1:imex-mgmt",
              "--fault", "1:fabric-health=degraded-bandwidth")
    try:
        listed = sim.ssh(0, "nvidia-imex-ctl -N; ip -o -4 addr show mgmt0")
        rc, report = preflight(sim.inventory)
    finally:
        sim.down()
    assert listed.returncode == 0 and "192.168." in listed.stdout and "mgmt0" in listed.stdout
    assert rc == 0, report
    for host in ("e26h2b-node1", "e26h2b-node2"):
        assert result(report, host, "nvidia.imex.domain")["status"] == "pass"
    assert result(report, "e26h2b-node1", "nvlink.fabric")["status"] == "pass"
    slow = result(report, "e26h2b-node2", "nvlink.fabric")
    assert slow["status"] == "warn" and "Bandwidth Degraded" in slow["observed"]
