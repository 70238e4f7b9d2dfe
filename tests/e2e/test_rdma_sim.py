"""`k3deploy preflight` against simulated clusters in these RDMA situations: a GB300 tray on a Spectrum-X
RoCE fabric, whose BlueField-3 is Ethernet like its GPU NICs, and rails, one subnet each, with a node
on rail switches without a spine under expert parallelism across nodes."""

from __future__ import annotations

import pytest

from helpers import k3_here, preflight, result
from helpers.simulated import Sim

pytestmark = pytest.mark.sim


def test_a_spectrum_x_tray_keeps_its_bluefield_out_of_nccl_ib_hca():
    sim = Sim("e26h3a", "gb300", 2, "--fault", "0:spectrum-x", "--fault", "1:spectrum-x")
    try:
        rc, report = preflight(sim.inventory)
    finally:
        sim.down()
    assert rc == 0, report
    for host in ("e26h3a-node1", "e26h3a-node2"):
        rdma = result(report, host, "rdma.devices")
        assert rdma["status"] == "pass" and "Ethernet" in rdma["observed"]
        assert "not mlx5_4:1 (BlueField-3 DPU (vendor_part_id 41692))" in rdma["observed"]
        assert report["hosts"][host]["settings"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"


def test_expert_parallelism_across_a_rail_only_node_fails_naming_the_cross_rail_pairs():
    sim = Sim("e26h3b", "gb300", 3, "--strategy", "multi_node_tep", "--fault", "1:rail-only")
    sim.set_vars("k3_rdma_reach: true\n")   # the reachability round is opt-in
    try:
        routes = sim.ssh(0, "ip -o -4 addr show ib1; ibdev2netdev")
        rc, report = preflight(sim.inventory)
        k3_here("sim", "fault", "--name", "e26h3b", "--clear", "1:rail-only", check=True)
        rc_clear, cleared = preflight(sim.inventory)
    finally:
        sim.down()
    assert "10.201." in routes.stdout and "mlx5_1 port 1 ==> ib1 (Up)" in routes.stdout
    assert rc == 1
    lonely = result(report, "e26h3b-node2", "rdma.reach")
    assert lonely["status"] == "fail" and lonely["observed"].startswith("24 of 32 port pairs unreachable")
    peer = result(report, "e26h3b-node1", "rdma.reach")
    assert peer["status"] == "fail" and peer["observed"].startswith("12 of 32 port pairs unreachable")
    assert "mlx5_0:1 -> e26h3b-node2 mlx5_1:1 (10.201." in peer["observed"]
    assert "e26h3b-node3" not in peer["observed"]          # node1 and node3 reach each other across rails
    assert "mlx5_0:1 -> e26h3b-node2 mlx5_0:1 " not in peer["observed"]   # rail 0 to rail 0 answers
    assert rc_clear == 0 and {result(cleared, h, "rdma.reach")["status"] for h in cleared["hosts"]} == {"pass"}


def test_no_reach_round_without_expert_parallelism_across_nodes():
    sim = Sim("e26h3c", "gb300", 2, "--strategy", "multi_node_tp", "--fault", "1:rail-only")
    sim.set_vars("k3_rdma_reach: true\n")   # the reachability round is opt-in
    try:
        rc, report = preflight(sim.inventory)
    finally:
        sim.down()
    assert rc == 0, report
    assert not [r for h in report["hosts"].values() for r in h["results"] if r["check"] == "rdma.reach"]


def test_p_d_pools_are_checked_each_within_itself():
    """h200 P/D, two prefill and two decode nodes (TEP and DEP pools): the all-to-all runs within a pool, so a
    rail-only prefill node fails its pool and the decode pool passes."""
    sim = Sim("e26h3d", "h200", 4, "--layout", "pd:2,2", "--fault", "0:rail-only")
    sim.set_vars("k3_rdma_reach: true\n")   # the reachability round is opt-in
    try:
        rc, report = preflight(sim.inventory)
    finally:
        sim.down()
    assert rc == 1
    status = {h: result(report, h, "rdma.reach") for h in report["hosts"]}
    assert status["e26h3d-node1"]["observed"].startswith("56 of 64 port pairs unreachable")
    assert "e26h3d-node3" not in status["e26h3d-node1"]["observed"]   # pings stay in the pool
    assert status["e26h3d-node2"]["status"] == "fail"
    assert status["e26h3d-node3"]["status"] == status["e26h3d-node4"]["status"] == "pass"
