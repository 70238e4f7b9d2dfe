"""AMD's own checks over synthetic fact sets: the amdgpu floor the ROCm 7 image needs, one amdgpu version across
the group, the amdkfd peer-memory interface RCCL's GPUDirect RDMA needs, and a partitioned GPU count."""

from __future__ import annotations

import pytest

from helpers import FIXTURES
from k3deploy.facts.base import FactError
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, Ipv4Address, KernelRelease
from k3deploy.facts.rdma import RdmaDevice, RdmaPort
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.amd import facts as amd
from k3deploy.vendors.amd.checks import AmdFacts
from k3deploy.vendors.amd.facts import AmdGpu, AmdSmiVersions, PeerMemory, RocmDriver

GIB = 1024**3
PEERS = PeerMemory(path="/sys/kernel/mm/memory_peers/amdkfd/version", version="1.0")


def sel(hw: str, nodes: int) -> Requirements:
    return Requirements(hardware=hardware()[hw], variant="default", vram_minimum_gb=1680, nodes=nodes,
                        multi_node=nodes > 1)


def space(path: str, free_gib: float) -> DiskSpace:
    return DiskSpace(path=path, filesystem="/dev/nvme0n1p2", size_bytes=int(free_gib * 2 * GIB),
                     available_bytes=int(free_gib * GIB), mount="/")


def mi355x(name: str, address: str, driver: str = "6.14.14", peers: PeerMemory | None = PEERS,
           gpus: int = 8) -> AmdFacts:
    return AmdFacts(
        host=name, address=address,
        kernel=KernelRelease("6.8.0-45-generic", (6, 8, 0)),
        runtime=ContainerRuntime("docker", "28.3.2", ["io.containerd.runc.v2", "runc"]),
        disk_images=space("/var/lib/docker", 800), disk_cache=space("/var/lib/k3deploy/cache", 3000),
        shm=DiskSpace("/dev/shm", "tmpfs", 64 * GIB, 64 * GIB, "/dev/shm"),
        interface=AddressInterface(address, "eth0", "eth0", [Ipv4Address("lo", "127.0.0.1", 8),
                                                             Ipv4Address("eth0", address, 24)]),
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", 4096, f"ens{i}np0")])
              for i in range(8)],
        amd_gpus=[AmdGpu(i, 309237645312, "AMD Instinct MI355X") for i in range(gpus)],
        amd_versions=AmdSmiVersions("26.0.2+39589fda", "26.0.2", "7.0.2", driver),
        rocm_driver=RocmDriver(driver),
        amd_peer_memory=peers,
    )


def group(*drivers: str) -> list[AmdFacts]:
    return [mi355x(f"mi-{i}", f"10.1.0.{11 + i}", driver) for i, driver in enumerate(drivers)]


def failures(results):
    return sorted((r.host, r.check) for r in results if r.status == "fail")


def result(results, host: str, check: str):
    (found,) = [r for r in results if r.host == host and r.check == check]
    return found


# --------------------------------------------------------------------------------- the driver


def test_a_healthy_mi355x_pair_passes_and_reports_one_driver_for_the_group():
    results = run_checks(sel("mi355x", 2), group("6.14.14", "6.14.14"))
    assert failures(results) == []
    assert result(results, "cluster", "rocm.driver.group").observed == "amdgpu 6.14.14 on 2 nodes"
    assert result(results, "mi-0", "rdma.gpudirect").status == "pass"


def test_an_amdgpu_below_the_floor_fails_that_node_and_the_group():
    """``sim fault 1:driver=6.0.0`` on MI355X: the node's amdgpu 6.0.0 (ROCm 6.0's) is below what the ROCm 7 image
    runs on, and differs from the other node's 6.14.14 (old code: ``PASS amdgpu 6.0.0``)."""
    results = run_checks(sel("mi355x", 2), group("6.14.14", "6.0.0"))
    assert failures(results) == [("cluster", "rocm.driver.group"), ("mi-1", "rocm.driver"),
                                 ("mi-1", "rocm.driver.group")]
    floor = result(results, "mi-1", "rocm.driver")
    assert floor.observed == "amdgpu 6.0.0" and ">= 6.10" in floor.required and "amdgpu-dkms" in floor.fix
    odd = result(results, "mi-1", "rocm.driver.group")
    assert "6.0.0" in odd.observed and "6.14.14" in odd.required and "same amdgpu-dkms version" in odd.fix
    assert "6.0.0 on mi-1" in result(results, "cluster", "rocm.driver.group").observed


def test_two_drivers_above_the_floor_still_fail_the_group_and_name_the_odd_node():
    results = run_checks(sel("mi355x", 3), group("6.14.14", "6.12.12", "6.14.14"))
    assert failures(results) == [("cluster", "rocm.driver.group"), ("mi-1", "rocm.driver.group")]


def test_the_kernels_own_amdgpu_is_below_the_floor():
    """Without amdgpu-dkms rocm-smi reports the kernel release (6.8.0-79-generic): not a driver ROCm 7 supports."""
    host = mi355x("mi-0", "10.1.0.11", "6.8.0-79-generic")
    assert failures(run_checks(sel("mi355x", 1), [host])) == [("mi-0", "rocm.driver")]


def test_the_floor_is_a_site_setting(monkeypatch):
    monkeypatch.setattr("k3deploy.vendors.amd.AMDGPU_FLOOR", "6.16")
    assert failures(run_checks(sel("mi355x", 1), [mi355x("mi-0", "10.1.0.11")])) == [("mi-0", "rocm.driver")]


def test_one_node_has_no_group_check():
    results = run_checks(sel("mi355x", 1), [mi355x("mi-0", "10.1.0.11", peers=None)])
    assert not [r for r in results if r.check == "rocm.driver.group"]


# ------------------------------------------------------------------------- GPUDirect RDMA


def test_without_the_amdkfd_peer_memory_interface_the_node_fails():
    hosts = group("6.14.14", "6.14.14")
    hosts[1].amd_peer_memory = PeerMemory()
    results = run_checks(sel("mi355x", 2), hosts)
    assert failures(results) == [("mi-1", "rdma.gpudirect")]
    gdr = result(results, "mi-1", "rdma.gpudirect")
    assert "memory_peers/amdkfd/version" in gdr.observed and "host memory" in gdr.observed
    assert "peer-memory" in gdr.fix


def test_the_kallsyms_symbol_is_enough_and_the_status_is_a_site_setting(monkeypatch):
    hosts = group("6.14.14", "6.14.14")
    hosts[0].amd_peer_memory = PeerMemory(kallsyms="0000000000000000 T ib_register_peer_memory_client [ib_uverbs]")
    hosts[1].amd_peer_memory = PeerMemory()
    monkeypatch.setattr("k3deploy.vendors.amd.GPUDIRECT_MISSING_STATUS", "warn")
    results = run_checks(sel("mi355x", 2), hosts)
    assert failures(results) == []
    assert result(results, "mi-0", "rdma.gpudirect").status == "pass"
    assert result(results, "mi-1", "rdma.gpudirect").status == "warn"


def test_an_unreadable_peer_memory_fact_fails():
    hosts = group("6.14.14", "6.14.14")
    hosts[0].amd_peer_memory = FactError("absent", "grep", "grep", hint="grep is missing")
    assert ("mi-0", "rdma.gpudirect") in failures(run_checks(sel("mi355x", 2), hosts))


def test_the_peer_memory_fact_is_read_only_across_nodes():
    from k3deploy.vendors.amd.checks import CHECKS

    assert "amd_peer_memory" in [name for name, _, _ in CHECKS.facts(sel("mi355x", 2))]
    assert "amd_peer_memory" not in [name for name, _, _ in CHECKS.facts(sel("mi355x", 1))]


def _read(fixture: str) -> list[str]:
    return (FIXTURES / fixture).read_text().splitlines()


@pytest.mark.parametrize(("kallsyms", "available", "shown"), [
    ("amd/kallsyms-peer-memory-ib-uverbs.txt", True, "ib_register_peer_memory_client in /proc/kallsyms (T "),
    # amdgpu's own pointer to the function is no peer-memory support (RCCL's substring search takes it for one)
    ("amd/kallsyms-amdgpu-only.txt", False, "no memory_peers/amdkfd/version"),
])
def test_the_peer_memory_fact_reads_kallsyms(kallsyms, available, shown):
    value = amd.AmdPeerMemory().process(["K3_SECTION=peers", "K3_SECTION=kallsyms", *_read(kallsyms), "K3_EXIT=0"])
    assert isinstance(value, PeerMemory) and value.available is available and value.shown.startswith(shown)


def test_the_peer_memory_fact_reads_the_memory_peers_version():
    (version,) = _read("amd/memory-peers-amdkfd-version.txt")
    value = amd.AmdPeerMemory().process(["K3_SECTION=peers", f"/sys/memory_peers/amdkfd/version {version}",
                                         "K3_SECTION=kallsyms", "K3_EXIT=0"])
    assert value == PeerMemory(path="/sys/memory_peers/amdkfd/version", version="1.0")


def test_the_peer_memory_command_looks_where_rccl_looks():
    command = amd.AmdPeerMemory().command()
    for path in ("/sys/kernel/mm/memory_peers/amdkfd/version", "/sys/kernel/memory_peers/amdkfd/version",
                 "/sys/memory_peers/amdkfd/version"):
        assert f"[ -e {path} ]" in command
    assert "ib_register_peer_memory_client' /proc/kallsyms" in command


# ---------------------------------------------------------------------- a partitioned GPU count


def test_a_wrong_gpu_count_on_amd_points_to_the_partition_modes():
    """A CPX/NPS4-partitioned MI355X shows 64 devices: the fix names SPX/NPS1, not CUDA_VISIBLE_DEVICES or MIG."""
    results = run_checks(sel("mi355x", 1), [mi355x("mi-0", "10.1.0.11", gpus=64)])
    count = result(results, "mi-0", "gpu.count")
    assert count.status == "fail"
    assert "SPX" in count.fix and "NPS1" in count.fix
    assert "CUDA_VISIBLE_DEVICES" not in count.fix and "MIG" not in count.fix


# ------------------------------------------------------------------- the simulated node's peer memory


def test_a_simulated_amd_node_shows_the_peer_memory_interface_unless_the_fault_removes_it(tmp_path):
    from k3deploy.errors import K3Error
    from k3sim.faults import parse_fault
    from k3sim.profiles import node_config, sysfs_mm_files, write_sysfs_mm

    def config(hw: str, *faults: str) -> dict:
        return node_config(hw, 1, 2, "n2", "10.9.0.12", [parse_fault(f) for f in faults], 0.01, "u")

    assert sysfs_mm_files(config("mi355x")) == {"memory_peers/amdkfd/version": "1.0\n"}
    assert sysfs_mm_files(config("mi355x", "1:no-peer-memory")) == {}
    assert sysfs_mm_files(config("h200")) is None   # an NVIDIA node's /sys/kernel/mm stays the kernel's
    with pytest.raises(K3Error, match="AMD hardware only"):
        config("h200", "1:no-peer-memory")
    mm = tmp_path / "mm"
    write_sysfs_mm(mm, sysfs_mm_files(config("mi355x")) or {})
    assert (mm / "memory_peers/amdkfd/version").read_text() == "1.0\n"
    write_sysfs_mm(mm, {})   # the fault added on a running node: the bound folder stays, emptied
    assert mm.is_dir() and list(mm.iterdir()) == []


# ------------------------------------------------------------- the GPU/NIC topology for the port choice


def _sysfs(lspci_pp: str) -> str:
    """``lspci -PP``'s path (``00:01.1/01:00.0/...``) as the sysfs device path ``readlink -f`` prints."""
    chain = lspci_pp.split()[0].split("/")
    return "/sys/devices/pci0000:" + chain[0][:2] + "/" + "/".join(f"0000:{c}" for c in chain)


def mi300x_topology_lines() -> list[str]:
    """AMD's system acceptance guide's MI300X host (GPUs 0-3 on NUMA node 0, 4-7 on 1; a ConnectX-7 beside each GPU),
    plus a front-end NIC (``ens99f0np0`` at b9:00.0 in the guide) on a root complex of its own."""
    gpus = _read("amd/lspci-PP-mi300x.txt")
    nics = _read("amd/lspci-PP-cx7.txt")
    return (["K3_SECTION=gpus"] + [f"card{i + 1} {_sysfs(line)} {i // 4}" for i, line in enumerate(gpus)]
            + ["K3_SECTION=nics"] + [f"mlx5_{i} {_sysfs(line)} {i // 4}" for i, line in enumerate(nics)]
            + [f"mlx5_8 {_sysfs('b8:01.1/b9:00.0')} 1", "K3_EXIT=0"])


def test_the_amd_topology_tells_each_gpus_nic_from_the_front_end_nic():
    topology = amd.AmdGpuNicTopology().process(mi300x_topology_lines())
    assert not isinstance(topology, FactError)
    assert [topology.nearest(f"mlx5_{i}") for i in range(8)] == ["PXB"] * 8
    assert topology.nics["mlx5_0"][0] == "PXB" and topology.nics["mlx5_0"][1] == "NODE" \
        and topology.nics["mlx5_0"][4] == "SYS"
    assert topology.nearest("mlx5_8") == "NODE" and topology.separates


def test_the_front_end_nic_stays_out_of_nccl_ib_hca_on_amd():
    """Before, AMD read no topology: every active port went to NCCL_IB_HCA, the front-end NIC's too."""
    from k3deploy.vendors.amd.checks import CHECKS

    assert ("topology", amd.AmdGpuNicTopology, {}) in [read.spec for read in CHECKS.facts(sel("mi300x", 2))]
    hosts = [mi355x(f"mi-{i}", f"10.1.0.{11 + i}") for i in range(2)]
    for host in hosts:
        host.rdma = [*present_list(host.rdma), RdmaDevice("mlx5_8", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", 1024,
                                                                                     "ens99f0np0")])]
        host.topology = amd.AmdGpuNicTopology().process(mi300x_topology_lines())
    results = run_checks(sel("mi355x", 2), hosts)
    ports = result(results, "mi-0", "rdma.devices")
    assert ports.status == "pass" and "not mlx5_8:1 (no PIX/PXB path to a GPU (nearest NODE))" in ports.observed
    assert "mlx5_8" not in ports.observed.split("; not")[0]


def present_list(value):
    assert isinstance(value, list)
    return value
