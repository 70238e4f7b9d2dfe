"""A RoCE-only B300 pair (8 GPU NICs + a front-end/storage NIC near no GPU): preflight keeps the storage HCA out of
NCCL_IB_HCA by GPU affinity, and the opt-in NCCL probe (k3_nccl_probe) runs a two-node all-reduce in the image that
passes with GPUDirect RDMA and fails the node whose GPUDirect RDMA is broken (no-dmabuf: errno 524)."""

from __future__ import annotations

import pytest

from helpers import k3_here, preflight

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def pair():
    from helpers.simulated import Sim

    sim = Sim("e8p", "b300", 2)
    yield sim
    sim.down()


def result(report: dict, host: str, check: str) -> dict:
    return next(r for r in report["hosts"][host]["results"] if r["check"] == check)


def test_the_storage_nic_is_left_out_of_nccl_by_gpu_affinity(pair):
    rc, report = preflight(pair.inventory)
    assert rc == 0, report["failed_hosts"]
    for host in ("e8p-node1", "e8p-node2"):
        h = report["hosts"][host]
        # every active port would include mlx5_bond_0 (RoCE, up, not the default route): nvidia-smi topo -m shows it
        # NODE/SYS from every GPU, so it is not a GPU fabric port
        assert h["settings"]["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
        assert "mlx5_bond_0:1 (no PIX/PXB path to a GPU (nearest NODE))" in h["settings_reasons"]["NCCL_IB_HCA"]
        assert "nccl.probe" not in {r["check"] for r in h["results"]}  # opt-in


def test_nccl_probe_passes_with_gdrdma_and_fails_the_node_without(pair):
    pair.set_vars("k3_strategy: multi_node_tp\nk3_nccl_probe: true\n")
    rc, report = preflight(pair.inventory)
    missing = result(report, "e8p-node1", "nccl.probe")
    assert rc == 1 and missing["status"] == "fail" and "No such image" in missing["observed"]  # it pulls nothing
    image = missing["observed"].split("No such image: ", 1)[1].strip()
    for rank in (0, 1):
        pulled = pair.ssh(rank, f"docker pull -q {image}")
        assert pulled.returncode == 0, pulled.stderr

    rc, report = preflight(pair.inventory)
    assert rc == 0, [(r["host"] if "host" in r else h, r["check"], r["observed"]) for h in report["hosts"]
                     for r in report["hosts"][h]["results"] if r["status"] == "fail"]
    for host, peer in (("e8p-node1", "e8p-node2"), ("e8p-node2", "e8p-node1")):
        ok = result(report, host, "nccl.probe")
        assert ok["status"] == "pass" and f"with {peer} via NET/IB/0/GDRDMA" in ok["observed"], ok

    # what every active port would give NCCL (the rule before GPU affinity): the storage HCA cannot reach the peer
    before = pair.group_vars.read_text()
    pair.set_vars("k3_ib_hca: " + ",".join(f"mlx5_{i}:1" for i in range(8)) + ",mlx5_bond_0:1\n")
    try:
        rc, report = preflight(pair.inventory)
    finally:
        pair.group_vars.write_text(before)
    assert rc == 1 and report["failed_hosts"] == ["e8p-node1", "e8p-node2"]
    hang = result(report, "e8p-node1", "nccl.probe")
    assert "Got completion from peer" in hang["observed"] and "hca mlx5_bond_0" in hang["observed"]
    assert "k3_ib_hca" in hang["fix"]

    k3_here("sim", "fault", "--name", "e8p", "1:no-dmabuf", check=True)
    try:
        rc, report = preflight(pair.inventory)
    finally:
        k3_here("sim", "fault", "--name", "e8p", "--clear", check=True)
    assert rc == 1 and report["failed_hosts"] == ["e8p-node2"]
    bad = result(report, "e8p-node2", "nccl.probe")
    assert "via NET/IB/0/GDRDMA" not in bad["observed"] and "errno 524" in bad["observed"]
    assert "GDRDMA" in bad["required"] and "mlx5 kernel driver" in bad["fix"]
    # the host facts cannot see it: the probe is what catches it
    assert result(report, "e8p-node2", "rdma.gpudirect")["status"] == "pass"
    assert result(report, "e8p-node1", "nccl.probe")["status"] == "warn"
