"""`k3deploy preflight` against simulated NVIDIA clusters in these situations: HGX GPUs stuck In Progress
in the NVSwitch fabric while Fabric Manager runs, a GB300 tray whose NVLink fabric reports degraded
bandwidth, an IMEX domain formed on the trays' management network, and two replicas in two
NVL72 racks (each replica's trays in one NVLink domain, not every planned tray)."""

from __future__ import annotations

import pytest

from helpers import k3_here, preflight, result
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


def test_two_replicas_in_two_racks_pass_and_a_replica_split_across_them_is_refused():
    """Two replicas of two GB300 trays each, replica 1's trays in another NVL72 rack (their fabric reports another
    ClusterUUID): each replica is in one NVLink domain, so preflight passes; a tray of replica 1 back in the first
    rack splits that replica across two domains: refused, naming the group, its trays and their domains."""
    other = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
    sim = Sim("lenvl", "gb300", 4, "--replicas", "2", "--fault", f"2:cluster-uuid={other}",
              "--fault", f"3:cluster-uuid={other}")
    try:
        sim.set_vars("k3_strategy: multi_node_tp\n")
        rc, report = preflight(sim.inventory)
        k3_here("sim", "fault", "--name", sim.name, "--clear", "3", check=True)
        rc_split, split = preflight(sim.inventory)
    finally:
        sim.down()
    node1, node2, node3, node4 = (f"lenvl-node{i}" for i in range(1, 5))
    assert rc == 0, report
    assert f"ClusterUUID {other}" in result(report, node3, "nvlink.fabric")["observed"]
    assert f"ClusterUUID {other}" not in result(report, node1, "nvlink.fabric")["observed"]
    assert rc_split == 1 and split["failed_hosts"] == [node4], split["failed_hosts"]
    bad = result(split, node4, "nvlink.fabric")
    assert "group engine-r1 is split across 2 NVLink domains" in bad["observed"]
    assert f"{node3}: ClusterUUID {other}" in bad["observed"] and f"{node4}: ClusterUUID " in bad["observed"]
    assert result(split, node2, "nvlink.fabric")["status"] == "pass"
