"""`k3deploy preflight` against a simulated MI355X pair: healthy it passes, with one amdgpu version and the amdkfd
peer-memory interface on both nodes; `1:driver=6.0.0` fails that node (below the ROCm 7 image's floor) and the group
(two amdgpu versions), `1:no-peer-memory` fails its GPUDirect RDMA (RCCL would stage through host memory),
`1:no-amd-smi` (amdgpu-dkms alone, no RAS counters a simulated node can show) makes its health unknown: a warning,
never a pass."""

from __future__ import annotations

import pytest

from helpers import k3, k3_here, preflight

pytestmark = pytest.mark.sim

NAME = "e26h4a"


def results(report: dict) -> dict[tuple[str, str], dict]:
    return {(host, r["check"]): r for host, h in report["hosts"].items() for r in h["results"]} | {
        ("cluster", r["check"]): r for r in report.get("cluster", [])}


def failing(report: dict) -> set[tuple[str, str]]:
    return {key for key, r in results(report).items() if r["status"] == "fail"}


@pytest.fixture(scope="module")
def pair():
    from helpers.simulated import Sim

    sim = Sim(NAME, "mi355x", 2)
    yield sim
    sim.down()


def test_a_healthy_mi355x_pair_passes_with_peer_memory_and_one_driver(pair):
    rc, report = preflight(pair.inventory)
    assert rc == 0 and failing(report) == set(), failing(report)
    shown = results(report)
    for node in (f"{NAME}-node1", f"{NAME}-node2"):
        assert shown[(node, "rdma.gpudirect")]["observed"].startswith("/sys/kernel/mm/memory_peers/amdkfd/version")
        assert shown[(node, "rocm.driver")]["observed"] == "amdgpu 6.14.14"
    assert pair.ssh(1, "cat /sys/kernel/mm/memory_peers/amdkfd/version").stdout.strip() == "1.0"


def test_an_old_amdgpu_on_one_node_fails_it_and_the_group(pair):
    """Before: `PASS amdgpu 6.0.0`, no floor and no comparison with the other node's 6.14.14."""
    k3_here("sim", "fault", "--name", NAME, "1:driver=6.0.0", check=True)
    try:
        rc, report = preflight(pair.inventory)
    finally:
        k3_here("sim", "fault", "--name", NAME, "--clear", check=True)
    bad = failing(report)
    assert rc == 1
    assert {(f"{NAME}-node2", "rocm.driver"), (f"{NAME}-node2", "rocm.driver.group")} <= bad, bad
    assert not any(host == f"{NAME}-node1" for host, _ in bad), bad


def test_no_peer_memory_fails_that_nodes_gpudirect_and_clearing_it_brings_it_back(pair):
    k3_here("sim", "fault", "--name", NAME, "1:no-peer-memory", check=True)
    try:
        rc, report = preflight(pair.inventory)
    finally:
        k3_here("sim", "fault", "--name", NAME, "--clear", check=True)
    assert rc == 1 and failing(report) == {(f"{NAME}-node2", "rdma.gpudirect")}
    gdr = results(report)[(f"{NAME}-node2", "rdma.gpudirect")]
    assert "host memory" in gdr["observed"] and gdr["fix"]
    rc, report = preflight(pair.inventory)
    assert rc == 0, failing(report)


def test_a_partitioned_gpu_count_points_to_spx_and_nps1(pair):
    """64 devices on an 8-GPU MI355X node is what CPX/NPS4 partitions show: the fix names SPX/NPS1, not
    CUDA_VISIBLE_DEVICES or MIG (before: the NVIDIA wording on every vendor)."""
    k3_here("sim", "fault", "--name", NAME, "1:gpu-count=64", check=True)
    try:
        rc, report = preflight(pair.inventory)
    finally:
        k3_here("sim", "fault", "--name", NAME, "--clear", check=True)
    count = results(report)[(f"{NAME}-node2", "gpu.count")]
    assert rc == 1 and count["status"] == "fail" and count["observed"] == "64 devices"
    assert "SPX" in count["fix"] and "NPS1" in count["fix"] and "MIG" not in count["fix"]


def test_without_amd_smi_the_health_is_unknown_a_warning_not_a_pass(pair):
    k3_here("sim", "fault", "--name", NAME, "1:no-amd-smi", check=True)
    try:
        rc, report = preflight(pair.inventory)
        status = k3("status", pair.inventory)
    finally:
        k3_here("sim", "fault", "--name", NAME, "--clear", check=True)
    assert rc == 0 and failing(report) == set(), failing(report)
    health = results(report)[(f"{NAME}-node2", "hardware.health")]
    assert health["status"] == "warn", health
    assert health["observed"] == ("health unknown on node (nothing reads the GPUs' errors: no amd-smi, no amdgpu RAS "
                                  "counters in sysfs)")
    assert results(report)[(f"{NAME}-node1", "hardware.health")]["status"] == "pass"
    assert f"health: {NAME}-node2: health unknown on node" in status.stdout, status.stdout
