"""Which RDMA ports NCCL and UCX get beside a BlueField DPU: a GB300 tray on a Spectrum-X
RoCE fabric has its GPU NICs (ConnectX-8 SuperNICs) and a BlueField-3 all on Ethernet, every NIC ``SYS`` to every
GPU, so neither the link layer nor ``nvidia-smi topo -m`` tells them apart: ``ibv_devinfo``'s ``vendor_part_id``
does. And a chosen port count that differs from the GPU count is said, unless ``k3_ib_hca`` chose them."""

from __future__ import annotations

from helpers import FIXTURES
from k3deploy.facts.host import AddressInterface, Ipv4Address
from k3deploy.facts.rdma import DmabufSupport, RdmaDevice, RdmaDevices, RdmaPort, choose_ports
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.preflight.settings import derive_settings
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.nvidia.checks import NvidiaFacts
from k3deploy.vendors.nvidia.facts import GpuFabric, NvidiaGpu, parse_topo

UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"
CX8, BF3 = 4131, 41692   # vendor_part_id: ConnectX-8 (0x1023), BlueField-3 (0xa2dc)
BF4 = 41695              # BlueField-4 integrated ConnectX-8 (0xa2df; pci.ids, Linux mlx5_core's PCI table)


def sel(hw: str, nodes: int = 2, **kw) -> Requirements:
    return Requirements(hardware=hardware()[hw], variant="default", vram_minimum_gb=None, nodes=nodes,
                        multi_node=nodes > 1, **kw)


def port(state: str = "PORT_ACTIVE", layer: str = "Ethernet") -> RdmaPort:
    return RdmaPort(1, state, layer, 4096)


def spectrum_x_tray(name: str = "gb300-0", address: str = "10.77.0.11", gpu_nics: int = 4) -> NvidiaFacts:
    """A GB300 tray on Spectrum-X: four ConnectX-8 SuperNICs (RoCE) and a dual-port BlueField-3 (one port up),
    every NIC SYS to every GPU (a real GB200's matrix)."""
    rdma = [RdmaDevice(f"mlx5_{i}", ports=[port()], vendor_part_id=CX8) for i in range(gpu_nics)]
    rdma.append(RdmaDevice("mlx5_4", ports=[port(), RdmaPort(2, "PORT_DOWN", "Ethernet", 1024)], vendor_part_id=BF3))
    return NvidiaFacts(
        host=name, address=address,
        interface=AddressInterface(address, "eth0", "eth0", [Ipv4Address("eth0", address, 24)]),
        gpus=[NvidiaGpu("NVIDIA GB300", 284208, "580.95.05") for _ in range(4)],
        fabric=[GpuFabric(f"0000000{i}:06:00.0", "Completed", "Success", "32766", UUID, "Healthy") for i in range(4)],
        rdma=rdma,
        topology=parse_topo((FIXTURES / "nvidia/topo-m-gb200.txt").read_text().splitlines()),
        dmabuf=DmabufSupport("6.14.0-1007-nvidia-64k", True, True, True, True, [], "25.04-0.6.1"),
    )


def rdma_result(results, host: str):
    (r,) = [r for r in results if (r.host, r.check) == (host, "rdma.devices")]
    return r


def test_vendor_part_id_is_read_from_a_real_bluefield3():
    """``ibv_devinfo -v | grep`` of a BlueField-3 B3220 (tests/fixtures/README.md): vendor_part_id 41692."""
    lines = (FIXTURES / "rdma/ibv_devinfo-v-grep-bluefield3.txt").read_text().splitlines()
    devs = RdmaDevices().process([*lines, "K3_EXIT=0"])
    assert isinstance(devs, list)
    assert [(d.name, d.vendor_part_id, d.dpu) for d in devs] == [("mlx5_0", BF3, "BlueField-3"),
                                                                   ("mlx5_1", BF3, "BlueField-3")]
    assert RdmaDevice("mlx5_0", vendor_part_id=CX8).dpu is None


def test_a_spectrum_x_tray_leaves_its_bluefield_out_of_nccl_and_ucx():
    tray = spectrum_x_tray()
    s = derive_settings(sel("gb300", strategy="pd_cluster", pd=True), tray)
    assert s.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert s.env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert "mlx5_4:1 (BlueField-3 DPU (vendor_part_id 41692))" in s.reasons["NCCL_IB_HCA"]
    r = rdma_result(run_checks(sel("gb300"), [tray, spectrum_x_tray("gb300-1", "10.77.0.12")]), "gb300-0")
    assert r.status == "pass" and "not mlx5_4:1 (BlueField-3 DPU" in r.observed
    # k3_ib_hca still has the last word
    tray.ib_hca = "mlx5_4:1"
    assert derive_settings(sel("gb300"), tray).env["NCCL_IB_HCA"] == "=mlx5_4:1"


def test_bluefield_ports_alone_are_kept():
    """BlueField-3 SuperNICs as the GPU NICs (an HGX Spectrum-X node) report the same part id: nothing else is up,
    so they stay."""
    devs = [RdmaDevice(f"mlx5_{i}", ports=[port()], vendor_part_id=BF3) for i in range(8)]
    choice = choose_ports(devs)
    assert len(choice.ports) == 8 and not choice.excluded


def test_a_bluefield4_beside_the_gpu_nics_is_left_out_as_a_bluefield3_is():
    """BlueField-4 (PCI device 15b3:a2df, ``vendor_part_id`` 41695) is a DPU too: its port stays out of NCCL and UCX
    where the GPU NICs are up, and the check names it."""
    tray = spectrum_x_tray()
    assert isinstance(tray.rdma, list)
    tray.rdma = [*tray.rdma[:4], RdmaDevice("mlx5_4", ports=[port()], vendor_part_id=BF4)]
    s = derive_settings(sel("gb300", strategy="pd_cluster", pd=True), tray)
    assert s.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert "mlx5_4:1 (BlueField-4 DPU (vendor_part_id 41695))" in s.reasons["NCCL_IB_HCA"]
    r = rdma_result(run_checks(sel("gb300"), [tray, spectrum_x_tray("gb300-1", "10.77.0.12")]), "gb300-0")
    assert r.status == "pass" and "not mlx5_4:1 (BlueField-4 DPU" in r.observed
    # a BlueField-4 read from ibv_devinfo's own lines is named by its part id alone
    lines = [ln.replace("41692", "41695") for ln in
             (FIXTURES / "rdma/ibv_devinfo-v-grep-bluefield3.txt").read_text().splitlines()]
    devs = RdmaDevices().process([*lines, "K3_EXIT=0"])
    assert isinstance(devs, list) and [d.dpu for d in devs] == ["BlueField-4", "BlueField-4"]


def test_a_port_count_other_than_the_gpu_count_warns_unless_k3_ib_hca_chose_them():
    tray = spectrum_x_tray()
    assert isinstance(tray.rdma, list)
    tray.rdma = [*tray.rdma[:3], RdmaDevice("mlx5_3", ports=[port("PORT_DOWN")], vendor_part_id=CX8),
                 *tray.rdma[4:]]
    peer = spectrum_x_tray("gb300-1", "10.77.0.12")
    r = rdma_result(run_checks(sel("gb300"), [tray, peer]), "gb300-0")
    assert r.status == "warn" and r.observed.startswith("3 ports chosen for 4 GPUs: mlx5_0:1 Ethernet")
    assert "k3_ib_hca" in r.fix and "one GPU NIC port per GPU (4)" in r.required
    assert rdma_result(run_checks(sel("gb300"), [tray, peer]), "gb300-1").status == "pass"
    tray.ib_hca = "mlx5_0,mlx5_1,mlx5_2"
    assert rdma_result(run_checks(sel("gb300"), [tray, peer]), "gb300-0").status == "pass"
    # more ports than GPUs (a storage port nothing tells apart) warns too
    extra = spectrum_x_tray()
    assert isinstance(extra.rdma, list)
    extra.rdma = [*extra.rdma, RdmaDevice("mlx5_5", ports=[port()], vendor_part_id=CX8)]
    r = rdma_result(run_checks(sel("gb300"), [extra, peer]), "gb300-0")
    assert r.status == "warn" and r.observed.startswith("5 ports chosen for 4 GPUs")
