"""Preflight checks and derived settings over synthetic fact sets: each injected fault fails the right
host with the right check, and only that host."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import FIXTURES, present, read
from k3deploy.facts.base import FactError
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, Ipv4Address, KernelRelease
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, RdmaPort
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.preflight.settings import derive_settings
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.amd.checks import AmdFacts
from k3deploy.vendors.amd.facts import AmdGpu, AmdSmiVersions, RocmDriver
from k3deploy.vendors.ascend.checks import AscendFacts, peer_checks, peer_targets
from k3deploy.vendors.ascend.facts import AscendVersionInfo, NpuChip, NpuInfo, NpuPort
from k3deploy.vendors.nvidia import facts as nvidia
from k3deploy.vendors.nvidia.checks import NvidiaFacts
from k3deploy.vendors.nvidia.facts import (
    FabricManagerState,
    GpuFabric,
    ImexDomainState,
    ImexNode,
    ImexState,
    NvidiaGpu,
    ToolkitVersion,
)

FIX = FIXTURES
GIB = 1024**3
UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"


def space(path: str, free_gib: float, size_gib: float | None = None) -> DiskSpace:
    size = size_gib if size_gib is not None else free_gib * 2
    return DiskSpace(path=path, filesystem="/dev/nvme0n1p2", size_bytes=int(size * GIB),
                     available_bytes=int(free_gib * GIB), mount="/")


def not_nvidia(facts: dict) -> dict:
    """The facts of :func:`common` another vendor's host has: not NVIDIA's kernel modules and DMA-BUF."""
    return {k: v for k, v in facts.items() if k not in ("modules", "dmabuf")}


def common(name: str, address: str) -> dict:
    return dict(
        host=name,
        address=address,
        kernel=KernelRelease("6.8.0-45-generic", (6, 8, 0)),
        runtime=ContainerRuntime("docker", "28.3.2", ["io.containerd.runc.v2", "nvidia", "runc"]),
        disk_images=space("/var/lib/docker", 800),
        disk_cache=space("/var/lib/k3deploy/cache", 3000),
        shm=DiskSpace("/dev/shm", "tmpfs", 64 * GIB, 64 * GIB, "/dev/shm"),
        interface=AddressInterface(address, "eth0", "eth0", [Ipv4Address("lo", "127.0.0.1", 8),
                                                             Ipv4Address("eth0", address, 24)]),
        rdma=[RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]),
              RdmaDevice("mlx5_1", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)])],
        modules=LoadedModules(["ib_core", "nvidia"]),
        dmabuf=DmabufSupport("6.8.0-45-generic", True, True, True, True, []),
    )


def imex_domain(addresses: list[str], state: str = "UP", status: dict[int, str] | None = None,
                links: dict[tuple[int, int], str] | None = None) -> ImexDomainState:
    """What nvidia-imex-ctl -N reports for a domain of these addresses: all READY and Connected unless changed."""
    status, links = status or {}, links or {}
    n = len(addresses)
    return ImexDomainState(state, [ImexNode(i, a, status.get(i, "READY"), "580.95",
                                            [links.get((i, j), "C") for j in range(n)])
                                   for i, a in enumerate(addresses)])


TRAYS = [f"10.77.0.{11 + i}" for i in range(3)]


def ib_ports(n: int) -> list[RdmaDevice]:
    """A node's GPU NICs, one InfiniBand port each (one per GPU)."""
    return [RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(n)]


def gb300_host(name: str, address: str) -> NvidiaFacts:
    facts = common(name, address)
    facts["rdma"] = ib_ports(4)
    # GB300 + ConnectX-8: Data Direct needs the 6.14-nvidia kernel (NVIDIA's Grace Blackwell CX8 GPUDirect RDMA guide)
    facts["dmabuf"] = DmabufSupport("6.14.0-1007-nvidia-64k", True, True, True, True, [], "25.04-0.6.1")
    return NvidiaFacts(
        **facts,
        gpus=[NvidiaGpu("NVIDIA GB300", 284208, "580.95.05") for _ in range(4)],
        toolkit=ToolkitVersion("1.17.8"),
        fabric=[GpuFabric(f"0000000{i}:06:00.0", "Completed", "Success", "32766", UUID, "Healthy") for i in range(4)],
        imex=ImexState("active", ["channel0"], 234),
        imex_domain=imex_domain(TRAYS),
    )


def h200_host(name: str, address: str) -> NvidiaFacts:
    return NvidiaFacts(
        **{**common(name, address), "rdma": ib_ports(8)},
        gpus=[NvidiaGpu("NVIDIA H200", 143771, "580.126.09") for _ in range(8)],
        toolkit=ToolkitVersion("1.17.8"),
        fabric_manager=FabricManagerState("active", "580.126.09"),
    )


def sel(hw: str, nodes: int, variant: str = "default", vram: float = 1680, **kw) -> Requirements:
    return Requirements(hardware=hardware()[hw], variant=variant, vram_minimum_gb=vram, nodes=nodes,
                     multi_node=nodes > 1, **kw)


def failures(results):
    return sorted((r.host, r.check) for r in results if r.status == "fail")


def gb300_cluster(n: int = 3) -> list[NvidiaFacts]:
    return [gb300_host(f"gb300-{i}", f"10.77.0.{11 + i}") for i in range(n)]


# ------------------------------------------------------------------------------- healthy


def test_healthy_gb300_trays_pass_every_check():
    results = run_checks(sel("gb300", 3), gb300_cluster())
    assert failures(results) == []
    assert not [r for r in results if r.status == "warn"]
    checked = {r.check for r in results if r.host == "gb300-1"}
    assert checked == {"nvidia.driver", "gpu.model", "gpu.count", "nvlink.fabric", "nvidia.imex", "nvidia.imex.domain",
                       "container.toolkit", "container.runtime", "rdma.devices", "rdma.gpudirect",
                       "network.interface", "disk.images", "disk.cache", "disk.shm"}
    (mem,) = [r for r in results if r.check == "gpu.memory"]
    assert mem.host == "cluster" and mem.status == "pass"
    assert mem.observed.startswith("3330.6 GB")  # 3 trays x 4 x 284208 MiB / 1024


def test_healthy_h200_pair_passes_including_fabric_manager():
    hosts = [h200_host("h200-0", "10.0.0.1"), h200_host("h200-1", "10.0.0.2")]
    results = run_checks(sel("h200", 2), hosts)
    assert failures(results) == []
    assert {(r.host, r.status) for r in results if r.check == "nvidia.fabricmanager"} == {
        ("h200-0", "pass"), ("h200-1", "pass")}


# ------------------------------------------------------------------------- injected faults


def _gpus(host, **change):
    return [dataclasses.replace(g, **change) for g in host.gpus]


FAULTS = {
    "old driver": (lambda h: setattr(h, "gpus", _gpus(h, driver="570.124.06")), "nvidia.driver"),
    "string-compare trap: 580.9 < 580.65": (lambda h: setattr(h, "gpus", _gpus(h, driver="580.9.1")), "nvidia.driver"),
    "one GPU missing": (lambda h: setattr(h, "gpus", h.gpus[:3]), "gpu.count"),
    "mixed models": (lambda h: setattr(h, "gpus", h.gpus[:3] + [NvidiaGpu("NVIDIA GB200", 189471, "580.95.05")]),
                     "gpu.model"),
    "fabric in progress": (lambda h: setattr(h, "fabric", [dataclasses.replace(h.fabric[0], state="In Progress",
                                                                              status=None)] + h.fabric[1:]),
                           "nvlink.fabric"),
    "zero ClusterUUID": (lambda h: setattr(h, "fabric", [dataclasses.replace(g, cluster_uuid=nvidia.ZERO_UUID)
                                                        for g in h.fabric]), "nvlink.fabric"),
    "other NVL domain": (lambda h: setattr(h, "fabric", [dataclasses.replace(g, clique_id="4") for g in h.fabric]),
                         "nvlink.fabric"),
    "fabric not reported": (lambda h: setattr(h, "fabric", []), "nvlink.fabric"),
    "imex inactive": (lambda h: setattr(h, "imex", ImexState("inactive", ["channel0"], 234)), "nvidia.imex"),
    "no imex channel": (lambda h: setattr(h, "imex", ImexState("active", [], None)), "nvidia.imex"),
    "imex peer not connected": (lambda h: setattr(h, "imex_domain", imex_domain(
        TRAYS, "DEGRADED", {2: "UNAVAILABLE"}, {(1, 2): "N", (2, 0): "I", (2, 1): "I", (2, 2): "I"})),
        "nvidia.imex.domain"),
    "imex link disconnected, domain UP": (lambda h: setattr(h, "imex_domain", imex_domain(TRAYS, links={(0, 1): "D"})),
                                          "nvidia.imex.domain"),
    "imex domain of the tray alone": (lambda h: setattr(h, "imex_domain", imex_domain([h.address])),
                                      "nvidia.imex.domain"),
    "no nvidia-imex-ctl": (lambda h: setattr(h, "imex_domain", nvidia.ImexDomain().default()), "nvidia.imex.domain"),
    "rdma port down": (lambda h: setattr(h, "rdma", [RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_DOWN", "InfiniBand")])]),
                       "rdma.devices"),
    "no rdma devices": (lambda h: setattr(h, "rdma", []), "rdma.devices"),
    "no ibv_devinfo": (lambda h: setattr(h, "rdma", FactError("absent", "ibv_devinfo", "ibv_devinfo")), "rdma.devices"),
    "docker down": (lambda h: setattr(h, "runtime", ContainerRuntime("docker", None, [], "Cannot connect")),
                    "container.runtime"),
    "no toolkit": (lambda h: setattr(h, "toolkit", nvidia.NvidiaContainerToolkit().default()), "container.toolkit"),
    "small shm": (lambda h: setattr(h, "shm", DiskSpace("/dev/shm", "tmpfs", 8 * GIB, 8 * GIB, "/dev/shm")),
                  "disk.shm"),
    "full cache disk": (lambda h: setattr(h, "disk_cache", space("/var/lib/k3deploy/cache", 200)), "disk.cache"),
    "full image disk": (lambda h: setattr(h, "disk_images", space("/var/lib/docker", 40)), "disk.images"),
    "address elsewhere": (lambda h: setattr(h, "interface", dataclasses.replace(h.interface, interface=None)),
                          "network.interface"),
    "loopback address": (lambda h: setattr(h, "interface", dataclasses.replace(h.interface, interface="lo")),
                         "network.interface"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_fails_only_the_faulty_tray_with_the_right_check(fault):
    inject, check = FAULTS[fault]
    hosts = gb300_cluster()
    inject(hosts[1])
    results = run_checks(sel("gb300", 3), hosts)
    assert failures(results) == [("gb300-1", check)]


def test_other_domain_on_the_head_fails_the_head_when_the_workers_agree():
    hosts = gb300_cluster()
    hosts[0].fabric = [dataclasses.replace(g, cluster_uuid="1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f") for g in read(hosts[0].fabric)]
    assert failures(run_checks(sel("gb300", 3), hosts)) == [("gb300-0", "nvlink.fabric")]


def test_fabric_from_real_in_progress_output_fails_that_tray():
    lines = (FIX / "nvidia/smi-q-gb300-in-progress.txt").read_text().splitlines()
    hosts = gb300_cluster(2)
    hosts[1].fabric = nvidia.NvlinkFabric().process(lines + ["K3_EXIT=0"])
    results = run_checks(sel("gb300", 2), hosts)
    assert failures(results) == [("gb300-1", "nvlink.fabric")]
    (bad,) = [r for r in results if r.status == "fail"]
    assert "00000018:06:00.0" in bad.observed and "In Progress" in bad.observed


def test_fabric_completed_but_unhealthy_from_real_output_fails_that_tray():
    """A GB200 tray's Fabric block Completed/Success with Health Summary Unhealthy (real output, see
    tests/fixtures/README.md) is not a usable NVLink domain member: it used to pass."""
    lines = (FIX / "nvidia/smi-q-fabric-unhealthy-gb200.txt").read_text().splitlines()
    hosts = gb300_cluster(2)
    (gpu,) = read(nvidia.NvlinkFabric().process(lines + ["K3_EXIT=0"]))
    hosts[1].fabric = [dataclasses.replace(gpu, gpu=g.gpu, cluster_uuid=UUID, clique_id="32766")
                       for g in read(hosts[1].fabric)]
    results = run_checks(sel("gb300", 2), hosts)
    assert failures(results) == [("gb300-1", "nvlink.fabric")]
    (bad,) = [r for r in results if r.status == "fail"]
    assert "Health Unhealthy" in bad.observed and "Health not Unhealthy" in bad.required
    assert "fabric health is Unhealthy" in bad.fix


def test_imex_domain_from_real_output_passes_when_it_lists_every_tray():
    real = read(nvidia.ImexDomain().process((FIX / "nvidia/imex-ctl-N-18-nodes-570.172.txt").read_text().splitlines()
                                            + ["K3_EXIT=0"]))
    addresses = [n.address for n in real.nodes]
    hosts = [gb300_host(f"gb300-{i}", a) for i, a in enumerate(addresses[:3])]
    for h in hosts:
        h.imex_domain = real
    results = run_checks(sel("gb300", 3), hosts)
    assert failures(results) == []
    assert {r.observed for r in results if r.check == "nvidia.imex.domain"} == {"UP, 18 node(s) READY, all connected"}


def test_imex_domain_not_formed_names_observed_required_and_fix():
    hosts = gb300_cluster()
    hosts[1].imex_domain = imex_domain(TRAYS[:2], "DEGRADED", {1: "UNAVAILABLE"}, {(0, 1): "N", (1, 0): "I",
                                                                                 (1, 1): "I"})
    (bad,) = [r for r in run_checks(sel("gb300", 3), hosts) if r.status == "fail"]
    assert (bad.host, bad.check) == ("gb300-1", "nvidia.imex.domain")
    assert "Domain State DEGRADED" in bad.observed and "node #1 10.77.0.12 UNAVAILABLE" in bad.observed
    assert "#0->#1 N" in bad.observed and "not in the domain: gb300-2 (10.77.0.13)" in bad.observed
    assert "Domain State UP" in bad.required and "every pair C" in bad.required
    assert "nodes_config.cfg" in bad.fix and "restart nvidia-imex" in bad.fix and "journalctl -u nvidia-imex" in bad.fix


def test_imex_domain_is_not_read_when_the_daemon_is_down():
    hosts = gb300_cluster()
    hosts[1].imex = ImexState("inactive", ["channel0"], 234)
    hosts[1].imex_domain = nvidia.ImexDomain().error("failed", ["could not connect"], exit_code=255)
    assert failures(run_checks(sel("gb300", 3), hosts)) == [("gb300-1", "nvidia.imex")]


def test_several_nvlink_domains_ask_only_for_the_tray_itself():
    hosts = gb300_cluster()
    for h in hosts:
        h.imex_domain = imex_domain([h.address])
    assert failures(run_checks(sel("gb300", 3), hosts)) == [
        (h.host, "nvidia.imex.domain") for h in hosts]
    assert failures(run_checks(sel("gb300", 3, one_nvlink_domain=False), hosts)) == []


def test_missing_nvidia_smi_names_the_host_and_the_driver():
    hosts = gb300_cluster()
    hosts[2].gpus = nvidia.NvidiaGpus().default()
    results = run_checks(sel("gb300", 3), hosts)
    # the other two trays already hold the checkpoint, so the cluster-wide memory check still passes
    assert failures(results) == [("gb300-2", "nvidia.driver")]
    (driver,) = [r for r in results if r.check == "nvidia.driver" and r.status == "fail"]
    assert driver.observed == "nvidia-smi not found on gb300-2: is the NVIDIA driver installed?"
    assert "580.65.06" in driver.fix


def test_unreachable_host_is_a_failed_host_with_the_reason():
    hosts = gb300_cluster()
    hosts[1] = NvidiaFacts(host="gb300-1", unreachable="Could not connect (timed out)")
    results = run_checks(sel("gb300", 3), hosts)
    assert ("gb300-1", "host.reachable") in failures(results)
    assert {h for h, _ in failures(results)} == {"gb300-1"}
    assert [r.observed for r in results if r.check == "host.reachable"] == ["Could not connect (timed out)"]


def test_gpudirect_missing_fails_that_host_only():
    hosts = [h200_host(f"h200-{i}", f"10.0.0.{i + 1}") for i in range(3)]
    hosts[1].dmabuf = DmabufSupport("5.4.0-150-generic", False, True, True, False, ["kernel 5.4.0-150-generic < 5.12"])
    results = run_checks(sel("h200", 3), hosts)
    assert failures(results) == [("h200-1", "rdma.gpudirect")]
    # x86: nvidia_peermem stands in, with a warning (CUDA 13 deprecates the NV-P2P API it uses)
    hosts[1].modules = LoadedModules(["nvidia", "nvidia_peermem"])
    results = run_checks(sel("h200", 3), hosts)
    assert [(r.host, r.check, r.status) for r in results if r.status != "pass"] == [
        ("h200-1", "rdma.gpudirect", "warn")]
    assert "CUDA 13 deprecates" in next(r.fix for r in results if r.check == "rdma.gpudirect" and r.status == "warn")


def test_gpudirect_on_grace_never_asks_for_peermem():
    hosts = gb300_cluster()
    hosts[1].dmabuf = DmabufSupport("6.14.0-1007-nvidia-64k", True, False, True, False,
                                    ["proprietary NVIDIA kernel modules"])
    hosts[1].modules = LoadedModules(["nvidia", "nvidia_peermem"])
    results = run_checks(sel("gb300", 3), hosts)
    assert failures(results) == [("gb300-1", "rdma.gpudirect")]
    bad = next(r for r in results if r.host == "gb300-1" and r.check == "rdma.gpudirect")
    assert "peermem" not in bad.fix and "peermem" not in bad.required


def test_gb300_data_direct_needs_the_6_14_nvidia_kernel():
    hosts = gb300_cluster()
    hosts[2].dmabuf = DmabufSupport("6.8.0-1031-nvidia-64k", True, True, True, True, [])
    results = run_checks(sel("gb300", 3), hosts)
    assert failures(results) == [("gb300-2", "rdma.gpudirect")]
    bad = next(r for r in results if r.host == "gb300-2" and r.check == "rdma.gpudirect")
    assert "6.8.0-1031-nvidia-64k" in bad.observed and "6.14" in bad.required and "linux-nvidia-64k-6.14" in bad.fix
    # GB200 (ConnectX-7) has no such floor
    gb200 = gb300_cluster()
    for h in gb200:
        h.gpus = [NvidiaGpu("NVIDIA GB200", 189471, "580.95.05") for _ in range(4)]
        h.dmabuf = DmabufSupport("6.8.0-1031-nvidia-64k", True, True, True, True, [])
    assert "rdma.gpudirect" not in {c for _, c in failures(run_checks(sel("gb200", 3), gb200))}


def test_gpudirect_unknown_is_a_warning_not_a_peermem_requirement():
    hosts = [h200_host(f"h200-{i}", f"10.0.0.{i + 1}") for i in range(2)]
    hosts[0].dmabuf = DmabufSupport("6.8.0", True, True, False, None, ["the mlx5 kernel driver (mlx5_ib) is not loaded"])
    results = run_checks(sel("h200", 2), hosts)
    shown = next(r for r in results if r.host == "h200-0" and r.check == "rdma.gpudirect")
    assert shown.status == "warn" and "k3_nccl_probe" in shown.fix


def test_gpudirect_status_is_configurable(monkeypatch):
    monkeypatch.setattr("k3deploy.vendors.nvidia.GPUDIRECT_MISSING_STATUS", "warn")
    hosts = gb300_cluster()
    hosts[2].dmabuf = DmabufSupport("6.14.0", True, False, True, False, ["proprietary NVIDIA kernel modules"])
    results = run_checks(sel("gb300", 3), hosts)
    assert failures(results) == []
    assert [(r.host, r.check) for r in results if r.status == "warn"] == [("gb300-2", "rdma.gpudirect")]


def test_single_tray_needs_no_imex_or_rdma():
    results = run_checks(sel("gb300", 1), gb300_cluster(1))
    assert {r.check for r in results} >= {"nvlink.fabric", "gpu.memory"}
    assert not {"nvidia.imex", "rdma.devices", "rdma.gpudirect"} & {r.check for r in results}
    assert failures(results) == [("cluster", "gpu.memory")]  # one GB300 tray holds 1110.2 GB < 1680


def test_fabric_manager_version_must_equal_driver():
    hosts = [h200_host("h200-0", "10.0.0.1"), h200_host("h200-1", "10.0.0.2")]
    hosts[1].fabric_manager = FabricManagerState("active", "580.95.05")
    assert failures(run_checks(sel("h200", 2), hosts)) == [("h200-1", "nvidia.fabricmanager")]
    hosts[1].fabric_manager = FabricManagerState("failed", "580.126.09")
    assert failures(run_checks(sel("h200", 2), hosts)) == [("h200-1", "nvidia.fabricmanager")]


def test_no_devices_fails_gpu_count():
    hosts = [h200_host("h200-0", "10.0.0.1"), h200_host("h200-1", "10.0.0.2")]
    hosts[0].gpus = []
    assert failures(run_checks(sel("h200", 2), hosts)) == [("cluster", "gpu.memory"), ("h200-0", "gpu.count")]


# ------------------------------------------------------------------------ memory sizing


def _node_gpus(model: str) -> list[NvidiaGpu]:
    lines = (FIX / f"nvidia/query-gpu-{model}.txt").read_text().splitlines()
    return read(nvidia.NvidiaGpus().process(lines + ["K3_EXIT=0"]))


@pytest.mark.parametrize(
    "model, per_node, nodes_for_1680",
    [("h100", 637.2, 3), ("h200", 1123.2, 2), ("b200", 1432.5, 2), ("b300", 2148.8, 1),
     ("gb200", 740.1, 3), ("gb300", 1110.2, 2)],
)
def test_memory_sizing_matches_the_documented_table(model, per_node, nodes_for_1680):
    def hosts(n):
        out = []
        for i in range(n):
            f = h200_host(f"n{i}", f"10.0.0.{i + 1}")
            f.gpus = _node_gpus(model)
            out.append(f)
        return out

    for n in (nodes_for_1680 - 1, nodes_for_1680):
        if n == 0:
            continue
        results = run_checks(sel(model, n), hosts(n))
        (mem,) = [r for r in results if r.check == "gpu.memory"]
        assert float(mem.observed.split()[0]) == pytest.approx(per_node * n, abs=0.06 * n)
        assert mem.status == ("pass" if n == nodes_for_1680 else "fail")
        assert "1680 GB" in mem.required and "GiB" in mem.required


def test_memory_fix_suggests_the_node_count():
    results = run_checks(sel("h200", 1), [h200_host("h200-0", "10.0.0.1")])
    (mem,) = [r for r in results if r.check == "gpu.memory"]
    assert mem.status == "fail" and "at least 2 h200 nodes" in mem.fix


# ------------------------------------------------------------------------------ AMD, Ascend


def mi355x_host(name: str) -> AmdFacts:
    return AmdFacts(
        **not_nvidia(common(name, "10.1.0.1")),
        amd_gpus=[AmdGpu(i, 309237645312, "AMD Instinct MI355X") for i in range(8)],
        amd_versions=AmdSmiVersions("26.0.2+39589fda", "26.0.2", "7.0.2", "6.14.14"),
        rocm_driver=RocmDriver("6.14.14"),
    )


def test_mi355x_node_passes_and_missing_rocm_smi_fails_it():
    results = run_checks(sel("mi355x", 1), [mi355x_host("mi-0")])
    assert failures(results) == []
    assert {r.check for r in results} >= {"rocm.driver", "rocm.version", "gpu.model", "gpu.count", "gpu.memory"}
    broken = mi355x_host("mi-0")
    broken.amd_gpus = FactError("absent", "rocm-smi", "rocm-smi --showmeminfo vram", hint="is ROCm SMI installed?")
    broken.rocm_driver = broken.amd_gpus
    broken.amd_versions = AmdSmiVersions(None, None, None, None)
    assert failures(run_checks(sel("mi355x", 1), [broken])) == [
        ("cluster", "gpu.memory"), ("mi-0", "rocm.devices"), ("mi-0", "rocm.driver")]


def test_rocm_host_floor_is_optional(monkeypatch):
    monkeypatch.setattr("k3deploy.vendors.amd.ROCM_HOST_MIN", "7.1")
    assert failures(run_checks(sel("mi355x", 1), [mi355x_host("mi-0")])) == [("mi-0", "rocm.version")]


def a3_host(name: str, address: str) -> AscendFacts:
    chips = [NpuChip(i // 2, i % 2, "Ascend910", "OK", f"0000:{i:02X}:00.0", 3000, 65536) for i in range(16)]
    gw = address.rsplit(".", 1)[0] + ".254"
    return AscendFacts(
        **not_nvidia(common(name, address)),
        npu=NpuInfo("25.5.0", chips),
        ascend=AscendVersionInfo("25.5.0", "7.7.0.1.231", None, []),
        hccn=[NpuPort(i, "UP", "Success", gw, gw) for i in range(16)],
    )


def test_ascend_pair_passes_and_faults_fail_only_their_node():
    s = sel("ascend_910c", 2, variant="ascend_w4a8", vram=1711)
    hosts = [a3_host("a3-0", "10.2.0.1"), a3_host("a3-1", "10.2.0.2")]
    results = run_checks(s, hosts)
    assert failures(results) == []
    assert "rdma.devices" not in {r.check for r in results}  # HCCS/RoCE on the NPUs, not ibverbs
    chips = read(hosts[1].npu).chips
    hosts[1].npu = NpuInfo("25.5.0", chips[:15] + [dataclasses.replace(chips[15], health="Alarm")])
    hosts[0].ascend = AscendVersionInfo("25.5.0", None, None, ["/usr/local/dcmi"])
    assert failures(run_checks(s, hosts)) == [("a3-0", "ascend.mounts"), ("a3-1", "ascend.health")]
    # a Warning (a minor alarm) only warns, as the health model has it
    hosts[1].npu = NpuInfo("25.5.0", chips[:15] + [dataclasses.replace(chips[15], health="Warning")])
    (warned,) = [r for r in run_checks(s, hosts) if r.host == "a3-1" and r.check == "ascend.health"]
    assert (warned.status, warned.observed) == ("warn", "NPU 7 chip 1: Warning")


def test_ascend_network_names_each_npu_whose_port_is_down_or_unhealthy():
    s = sel("ascend_910c", 2, variant="ascend_w4a8", vram=1711)
    hosts = [a3_host("a3-0", "10.2.0.1"), a3_host("a3-1", "10.2.0.2")]
    ok = next(r for r in run_checks(s, hosts) if (r.host, r.check) == ("a3-1", "ascend.network"))
    assert (ok.status, ok.observed) == ("pass", "16 NPUs: link UP, net health Success")
    ports = hosts[1].hccn
    assert isinstance(ports, list)
    ports[3] = dataclasses.replace(ports[3], link="DOWN", net_health="Fault")
    ports[11] = dataclasses.replace(ports[11], net_health="Init", netdetect=None)
    results = run_checks(s, hosts)
    assert failures(results) == [("a3-1", "ascend.network")]
    bad = next(r for r in results if (r.host, r.check) == ("a3-1", "ascend.network"))
    assert bad.observed == ("NPU 3: link DOWN, net health Fault (probing 10.2.0.254); "
                            "NPU 11: net health Init (no netdetect address)")
    assert bad.required == "every NPU (0..15): link status UP, net health status Success"
    assert "NPU 3, 11" in bad.fix and "hccn_tool -i 3 -link -g" in bad.fix and "-netdetect -s address" in bad.fix


def test_ascend_peers_pings_same_index_npus_and_names_each_unreachable_pair():
    from k3deploy.vendors.ascend.facts import NpuPing

    hosts = [a3_host("a3-0", "10.2.0.1"), a3_host("a3-1", "10.2.0.2")]
    for r, f in enumerate(hosts):
        f.hccn = [dataclasses.replace(p, ip=f"192.168.{100 + r}.{p.device + 1}", vnic=f"192.169.{r}.{199 - p.device}")
                  for p in f.hccn]  # type: ignore[union-attr]
    targets = peer_targets(hosts)
    assert targets["a3-0"][3] == [3, "192.169.1.196", "192.168.101.4"] and len(targets["a3-0"]) == 16
    assert targets["a3-1"][0] == [0, "192.169.0.199", "192.168.100.1"]
    assert peer_targets(hosts[:1]) == {}  # one node: nothing to ping

    def answers(host: str, bad: set[int]) -> list[NpuPing]:
        return [NpuPing(d, vnic, "hccs_ping", d not in bad,
                        f"3 packets transmitted, {0 if d in bad else 3} received") for d, vnic, _ in targets[host]]

    ok = peer_checks(hosts, targets, {"a3-0": answers("a3-0", set()), "a3-1": answers("a3-1", set())})
    assert [(r.host, r.check, r.status) for r in ok] == [("a3-0", "ascend.peers", "pass"),
                                                         ("a3-1", "ascend.peers", "pass")]
    got = {"a3-0": answers("a3-0", {3}), "a3-1": answers("a3-1", {3})[:15]}
    bad = peer_checks(hosts, targets, got)
    assert [r.status for r in bad] == ["fail", "fail"]
    assert bad[0].observed == "NPU 3 -> 192.169.1.196 (a3-1) hccs_ping: 3 packets transmitted, 0 received"
    assert "NPU 15 -> 192.169.0.184 (a3-0): not pinged" in bad[1].observed
    assert "same-index" in bad[0].required and "-hccs_ping" in bad[0].fix
    lost = peer_checks(hosts, targets, {"a3-0": "ConnectError: gone"})
    assert lost[0].status == "fail" and lost[0].observed == "not read: ConnectError: gone"


def test_ascend_network_is_read_across_nodes_only_and_its_status_is_a_setting(monkeypatch):
    from k3deploy.preflight.runner import fact_plan
    from k3deploy.vendors.ascend.facts import HccnNetwork

    plan = {name: (cls, kw) for name, cls, kw in fact_plan(sel("ascend_910c", 2, variant="ascend_w4a8"), "", "/c", "")}
    assert plan["hccn"] == (HccnNetwork, {"devices": 16})
    assert "hccn" not in {n for n, _, _ in fact_plan(sel("ascend_910c", 1, variant="ascend_w4a8"), "", "/c", "")}
    s = sel("ascend_910c", 2, variant="ascend_w4a8", vram=1711)
    hosts = [a3_host("a3-0", "10.2.0.1"), a3_host("a3-1", "10.2.0.2")]
    hosts[0].hccn = FactError(kind="absent", tool="hccn_tool", command="hccn_tool", hint="is the driver there?")
    assert failures(run_checks(s, hosts)) == [("a3-0", "ascend.network")]
    hosts[0].hccn = [NpuPort(i, "DOWN", "Init") for i in range(16)]
    monkeypatch.setattr("k3deploy.vendors.ascend.NETWORK_STATUS", "warn")
    results = run_checks(s, hosts)
    assert failures(results) == [] and ("a3-0", "ascend.network") in {(r.host, r.check) for r in results
                                                                      if r.status == "warn"}


def test_ascend_mounts_names_missing_and_empty_paths():
    s = sel("ascend_910c", 2, variant="ascend_w4a8", vram=1711)
    hosts = [a3_host("a3-0", "10.2.0.1"), a3_host("a3-1", "10.2.0.2")]
    hosts[1].ascend = AscendVersionInfo("25.5.0", "7.7.0.1.231", None, ["/usr/local/Ascend/driver/tools/hccn_tool"],
                                        ["/usr/local/bin/npu-smi"])
    results = run_checks(s, hosts)
    assert failures(results) == [("a3-1", "ascend.mounts")]
    bad = next(r for r in results if r.check == "ascend.mounts" and r.status == "fail")
    assert bad.observed == ("missing /usr/local/Ascend/driver/tools/hccn_tool; "
                            "empty directory /usr/local/bin/npu-smi")
    assert "docker run -v" in bad.fix and "rmdir" in bad.fix and "/usr/local/bin/npu-smi" in bad.fix


def test_ascend_old_driver_is_a_warning():
    s = sel("ascend_910c", 2, variant="ascend_w4a8", vram=1711)
    hosts = [a3_host("a3-0", "10.2.0.1"), a3_host("a3-1", "10.2.0.2")]
    hosts[0].ascend = AscendVersionInfo("25.3.rc1", "7.7.0.1.231", "8.5.0", [])
    results = run_checks(s, hosts)
    assert failures(results) == []
    assert [(r.host, r.check) for r in results if r.status == "warn"] == [("a3-0", "ascend.versions")]


# ------------------------------------------------------------------------------- settings


def test_settings_for_gb300_trays():
    hosts = gb300_cluster()
    s = derive_settings(sel("gb300", 3), hosts[0])
    assert s.env == {
        "NCCL_SOCKET_IFNAME": "=eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_MNNVL_ENABLE": "1",
        "NCCL_CUMEM_ENABLE": "1",
        "NCCL_NVLS_ENABLE": "1",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
    }
    assert not s.peermem_required


def test_settings_dmabuf_off_requires_peermem_and_pd_uses_ucx_rc():
    host = h200_host("h200-0", "10.0.0.1")
    host.interface = AddressInterface("10.0.0.1", "ens3f0", "eno1", [])
    host.dmabuf = DmabufSupport("6.8.0", True, False, True, False, ["proprietary NVIDIA kernel modules"])
    host.rdma = [RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand")]),
                 RdmaDevice("mlx5_1", ports=[RdmaPort(1, "PORT_DOWN", "InfiniBand")])]
    s = derive_settings(sel("h200", 2, strategy="pd_cluster", pd=True), host)
    assert (s.env["NCCL_SOCKET_IFNAME"], s.env["GLOO_SOCKET_IFNAME"]) == ("=ens3f0", "ens3f0")
    assert s.env["NCCL_DMABUF_ENABLE"] == "0" and s.peermem_required
    assert s.env["UCX_TLS"] == "rc,cuda_copy"
    assert s.env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert "NCCL_MNNVL_ENABLE" not in s.env


def test_settings_single_h200_node_and_loopback():
    host = h200_host("h200-0", "10.0.0.1")
    s = derive_settings(sel("h200", 1), host)
    assert set(s.env) == {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}
    host.interface = AddressInterface("127.0.0.1", "lo", "eth0", [])
    assert derive_settings(sel("h200", 1), host).env == {}
    host.interface = AddressInterface("", None, "eth0", [])
    assert derive_settings(sel("h200", 1), host).env["NCCL_SOCKET_IFNAME"] == "=eth0"


def test_settings_for_ascend():
    s = derive_settings(sel("ascend_910c", 2, variant="ascend_w4a8", vram=1711), a3_host("a3-0", "10.2.0.1"))
    assert s.env == {"HCCL_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
                     "HCCL_IF_IP": "10.2.0.1"}


def test_a_full_cache_disk_passes_when_the_weights_are_there_already():
    from k3deploy.facts.rollout import WeightsStatus

    hosts = gb300_cluster(2)
    for h in hosts:
        h.disk_cache = space("/var/lib/k3deploy/cache", 200)
    hosts[0].extra["weights"] = WeightsStatus(revision="abc", files=66)              # complete: a re-run
    hosts[1].extra["weights"] = WeightsStatus(revision="abc", files=60, missing=("model-00061-of-00066.safetensors",))
    results = run_checks(sel("gb300", 2), hosts)
    assert failures(results) == [("gb300-1", "disk.cache")]   # a partial download still needs the room
    (ok,) = [r for r in results if r.host == "gb300-0" and r.check == "disk.cache"]
    assert ok.status == "pass" and "in the cache already" in ok.required


# ------------------------------------------------------------------------- hardware truth

def _amd_names(fixture: str) -> list[str | None]:
    from k3deploy.vendors.amd.facts import AmdGpus
    value = read(AmdGpus().process(["K3_SECTION=sysfs", "K3_SECTION=vram", "K3_SECTION=name",
                                    *(FIX / fixture).read_text().splitlines(), "K3_EXIT=0"]))
    return [g.name for g in value]


def _result(results, host: str, check: str):
    (r,) = [r for r in results if (r.host, r.check) == (host, check)]
    return r


def test_a_real_mi300x_oam_node_passes_the_gpu_model_check():
    (name,) = _amd_names("amd/rocm-smi-productname-mi300x.txt")  # "AMD Instinct MI300X OAM", as AMD prints it
    host = mi355x_host("mi-0")
    host.amd_gpus = [AmdGpu(i, 206158430208, name) for i in range(8)]
    model = _result(run_checks(sel("mi300x", 1, vram=1000), [host]), "mi-0", "gpu.model")
    assert model.status == "pass", model.observed


def test_an_mi250_node_does_not_pass_for_an_mi300x():
    names = _amd_names("amd/rocm-smi-productname-mi250-rocm5.txt")
    host = mi355x_host("mi-0")
    host.amd_gpus = [AmdGpu(i, 68702699520, names[i % 2]) for i in range(8)]
    model = _result(run_checks(sel("mi300x", 1, vram=100), [host]), "mi-0", "gpu.model")
    assert model.status == "fail" and "MI250" in model.observed


def test_an_amd_node_is_recognised_by_its_pci_device_id_whatever_its_name():
    from k3deploy.vendors.amd.facts import AmdGpus
    gpus = AmdGpus().process([*(FIX / "amd/sysfs-drm-mi355x-no-product-name.txt").read_text().splitlines(),
                              "K3_EXIT=0"])
    host = mi355x_host("mi-0")
    host.amd_gpus = gpus
    assert failures(run_checks(sel("mi355x", 1), [host])) == []
    wrong = _result(run_checks(sel("mi300x", 1, vram=100), [host]), "mi-0", "gpu.model")
    assert wrong.status == "fail" and "0x75a3" in wrong.observed and "0x74a1" in wrong.required


def test_amd_pd_nodes_get_rocm_ucx_transports_and_no_cuda_setting():
    s = derive_settings(sel("mi355x", 2, strategy="pd_cluster", pd=True), mi355x_host("mi-0"))
    assert s.env["UCX_TLS"] == "rc,rocm_copy"
    assert not [k for k, v in s.env.items() if "cuda" in v.lower()]
    assert s.env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"


def test_pd_nodes_give_ucx_the_rdma_ports_nccl_uses():
    host = h200_host("h200-0", "10.0.0.1")
    host.rdma = [RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand")]),
                 RdmaDevice("mlx5_1", ports=[RdmaPort(1, "PORT_DOWN", "InfiniBand")]),
                 RdmaDevice("mlx5_2", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand")])]
    s = derive_settings(sel("h200", 2, strategy="pd_cluster", pd=True), host)
    assert (s.env["NCCL_IB_HCA"], s.env["UCX_NET_DEVICES"]) == ("=mlx5_0:1,mlx5_2:1", "mlx5_0:1,mlx5_2:1")
    assert s.env["UCX_TLS"] == "rc,cuda_copy"  # the recipe's own value on NVIDIA
    assert "UCX_NET_DEVICES" not in derive_settings(sel("h200", 2), host).env  # NCCL only without P/D


def _roce_host(default_iface: str = "eno1") -> NvidiaFacts:
    host = h200_host("h200-0", "10.0.0.1")
    host.interface = AddressInterface("10.0.0.1", "eno1", default_iface, [Ipv4Address("eno1", "10.0.0.1", 24)])
    host.rdma = [RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", 4096, f"ens{i}f0np0")])
                 for i in range(2)] + [RdmaDevice("mlx5_4", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", 1500, "eno1")])]
    return host


def test_the_rdma_port_of_the_default_route_is_not_given_to_nccl_or_ucx():
    host = _roce_host()
    s = derive_settings(sel("h200", 2, strategy="pd_cluster", pd=True), host)
    assert s.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert s.env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert "mlx5_4:1 (eno1 carries the default route)" in s.reasons["NCCL_IB_HCA"]
    rdma = _result(run_checks(sel("h200", 2), [host, h200_host("h200-1", "10.0.0.2")]), "h200-0", "rdma.devices")
    # two GPU NIC ports left for eight GPUs: a warning, the left-out port named
    assert rdma.status == "warn" and "not mlx5_4:1" in rdma.observed and "2 ports chosen for 8 GPUs" in rdma.observed


def test_a_single_rdma_port_on_the_default_route_is_kept_with_a_warning():
    host = _roce_host()
    host.rdma = read(host.rdma)[2:]
    assert derive_settings(sel("h200", 2), host).env["NCCL_IB_HCA"] == "=mlx5_4:1"
    rdma = _result(run_checks(sel("h200", 2), [host, h200_host("h200-1", "10.0.0.2")]), "h200-0", "rdma.devices")
    assert rdma.status == "warn" and "default route" in rdma.observed


def test_roce_only_nodes_get_no_gid_index_advice():
    # NCCL picks the RoCE v2 GID itself (NCCL_IB_GID_INDEX defaults to -1: automatic)
    host = h200_host("h200-0", "10.0.0.1")
    host.rdma = [RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", 4096)]) for i in range(8)]
    results = run_checks(sel("h200", 2), [host, h200_host("h200-1", "10.0.0.2")])
    rdma = _result(results, "h200-0", "rdma.devices")
    assert rdma.status == "pass" and "GID" not in rdma.fix + rdma.observed
    assert not [r for r in results if "GID_INDEX" in r.fix]
    assert "NCCL_IB_GID_INDEX" not in derive_settings(sel("h200", 2), host).env


def test_k3_ib_hca_names_the_ports_and_preflight_fails_a_host_without_them():
    host = _roce_host()
    host.ib_hca = "mlx5_4:1"
    s = derive_settings(sel("h200", 2, strategy="pd_cluster", pd=True), host)
    assert (s.env["NCCL_IB_HCA"], s.env["UCX_NET_DEVICES"], s.reasons["NCCL_IB_HCA"]) == (
        "=mlx5_4:1", "mlx5_4:1", "k3_ib_hca")
    host.ib_hca = "=mlx5_0,mlx5_1:1"  # a device alone = its active ports; NCCL's "=" is accepted
    assert derive_settings(sel("h200", 2), host).env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    host.ib_hca = "mlx5_9:1"
    rdma = _result(run_checks(sel("h200", 2), [host, h200_host("h200-1", "10.0.0.2")]), "h200-0", "rdma.devices")
    assert rdma.status == "fail" and "mlx5_9:1" in rdma.observed and "k3_ib_hca" in rdma.fix


def test_nccl_socket_ifname_is_the_exact_interface_and_gloo_the_bare_name():
    s = derive_settings(sel("h200", 2), h200_host("h200-0", "10.0.0.1"))
    assert (s.env["NCCL_SOCKET_IFNAME"], s.env["GLOO_SOCKET_IFNAME"]) == ("=eth0", "eth0")


def test_gb200_is_named_the_nvl72_compute_tray_not_the_nvl4_board():
    for hw in ("gb200", "gb300"):
        label = present(hardware()[hw].label)
        assert "NVL72 compute tray" in label and "NVL4" not in label


def test_a_gb200_tray_without_multi_node_nvlink_fails_as_not_an_nvl72_compute_tray():
    trays = []
    for i in range(4):
        tray = gb300_host(f"gb200-{i}", f"10.77.0.{11 + i}")
        tray.gpus = [NvidiaGpu("NVIDIA GB200", 189471, "580.95.05") for _ in range(4)]
        if i == 3:  # NVLink on the board only: every GPU's Fabric block is N/A
            tray.fabric = [GpuFabric(f"0000000{g}:01:00.0", None, None, None, None) for g in range(4)]
        trays.append(tray)
    results = run_checks(sel("gb200", 4), trays)
    fabric = _result(results, "gb200-3", "nvlink.fabric")
    assert fabric.status == "fail" and "no multi-node NVLink" in fabric.observed
    assert "GB200 NVL4" in fabric.fix and "NVL72" in fabric.fix
    assert "NCCL_MNNVL_ENABLE" not in derive_settings(sel("gb200", 4), trays[3]).env
    assert derive_settings(sel("gb200", 4), trays[0]).env["NCCL_MNNVL_ENABLE"] == "1"


def _roce_node_with_storage_nic() -> NvidiaFacts:
    """A RoCE-only HGX node (8 GPU NICs, each PIX to its GPU) with a bonded front-end/storage NIC, port up, on the
    first socket (NODE to its GPUs): the real H200's `nvidia-smi topo -m` of tests/fixtures/nvidia/topo-m-h200-bond.txt."""
    from k3deploy.vendors.nvidia.facts import parse_topo

    host = h200_host("h200-0", "10.0.0.1")
    topo = parse_topo((FIX / "nvidia/topo-m-h200-bond.txt").read_text().splitlines())
    host.topology = topo
    host.rdma = [RdmaDevice(n, ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", 4096)]) for n in topo.nics]
    return host


def test_a_nic_near_no_gpu_is_not_given_to_nccl():
    host = _roce_node_with_storage_nic()
    s = derive_settings(sel("h200", 2), host)
    assert "mlx5_bond_0" not in s.env["NCCL_IB_HCA"]
    assert s.env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}:1" for i in (0, 3, 4, 5, 6, 7, 8, 9))
    assert "mlx5_bond_0:1 (no PIX/PXB path to a GPU (nearest NODE))" in s.reasons["NCCL_IB_HCA"]
    shown = next(r for r in run_checks(sel("h200", 2), [host, h200_host("h200-1", "10.0.0.2")])
                 if r.host == "h200-0" and r.check == "rdma.devices")
    assert shown.status == "pass" and "not mlx5_bond_0:1" in shown.observed
    # without the matrix (not readable) every active port goes in, as before
    host.topology = None
    assert "mlx5_bond_0:1" in derive_settings(sel("h200", 2), host).env["NCCL_IB_HCA"]
    # k3_ib_hca still wins
    host.topology, host.ib_hca = _roce_node_with_storage_nic().topology, "mlx5_bond_0"
    assert derive_settings(sel("h200", 2), host).env["NCCL_IB_HCA"] == "=mlx5_bond_0:1"


def test_affinity_leaves_grace_trays_alone():
    from k3deploy.vendors.nvidia.facts import parse_topo

    hosts = gb300_cluster()
    hosts[0].topology = parse_topo((FIX / "nvidia/topo-m-gb200.txt").read_text().splitlines())  # every NIC SYS
    hosts[0].rdma = [RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(4)]
    s = derive_settings(sel("gb300", 3), hosts[0])
    assert s.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"


def test_imex_per_job_asks_for_the_packages_not_a_standing_domain_or_channel_0():
    """k3_imex: per_job (Slurm's switch/nvidia_imex, or the site's prolog): between jobs the daemon is stopped and
    no channel exists; that passes, with the packages on the tray. A tray without nvidia-imex fails, naming it."""
    per_job = dataclasses.replace(sel("gb300", 3), imex_per_job=True)
    hosts = gb300_cluster()
    for h in hosts:
        h.imex = ImexState("inactive", [], 234, installed=True)
        h.imex_domain = nvidia.ImexDomain().error("failed", ["could not connect"], exit_code=255)
    results = run_checks(per_job, hosts)
    assert failures(results) == []
    assert [r.observed for r in results if r.check == "nvidia.imex"][0] == (
        "IMEX per job: nvidia-imex installed (daemon inactive, no channel outside any job)")
    assert sorted(f[1] for f in failures(run_checks(sel("gb300", 3), hosts))) == ["nvidia.imex"] * 3  # standing
    hosts[2].imex = ImexState("inactive", [], None, installed=False)
    assert failures(run_checks(per_job, hosts)) == [("gb300-2", "nvidia.imex")]
    bad = next(r for r in run_checks(per_job, hosts) if r.host == "gb300-2" and r.check == "nvidia.imex")
    assert "no nvidia-imex on the tray" in bad.observed and "install the IMEX packages" in bad.fix
