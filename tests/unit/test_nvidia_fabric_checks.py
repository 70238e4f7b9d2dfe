"""NVIDIA fabric truths: the NVSwitch fabric registration of HGX GPUs, the fabric's health
beyond Summary Unhealthy, the IMEX domain on another network of the trays and GB300 Data
Direct. Each test fails on the code before the fix."""

from __future__ import annotations

import dataclasses

from helpers import FIXTURES, ROOT, read
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, Ipv4Address, KernelRelease
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, RdmaPort
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import Spot
from k3deploy.vendors import nvidia as vendor
from k3deploy.vendors.nvidia import facts as nvidia
from k3deploy.vendors.nvidia.checks import CHECKS, NvidiaFacts
from k3deploy.vendors.nvidia.facts import (
    FabricManagerState,
    GpuFabric,
    ImexDomainState,
    ImexNode,
    ImexState,
    NvidiaGpu,
    ToolkitVersion,
)

GIB = 1024**3
UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"


def _space(path: str, free_gib: float) -> DiskSpace:
    return DiskSpace(path, "/dev/nvme0n1p2", int(free_gib * 2 * GIB), int(free_gib * GIB), "/")


def _common(name: str, address: str, extra: list[Ipv4Address] | None = None, ports: int = 8) -> dict:
    return dict(
        host=name, address=address,
        kernel=KernelRelease("6.8.0-45-generic", (6, 8, 0)),
        runtime=ContainerRuntime("docker", "28.3.2", ["io.containerd.runc.v2", "nvidia", "runc"]),
        disk_images=_space("/var/lib/docker", 800), disk_cache=_space("/var/lib/k3deploy/cache", 3000),
        shm=DiskSpace("/dev/shm", "tmpfs", 64 * GIB, 64 * GIB, "/dev/shm"),
        interface=AddressInterface(address, "eth0", "eth0", [Ipv4Address("lo", "127.0.0.1", 8),
                                                             Ipv4Address("eth0", address, 24), *(extra or [])]),
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(ports)],
        modules=LoadedModules(["ib_core", "nvidia"]),
        dmabuf=DmabufSupport("6.8.0-45-generic", True, True, True, True, []),
    )


def _domain(addresses: list[str]) -> ImexDomainState:
    return ImexDomainState("UP", [ImexNode(i, a, "READY", "580.95", ["C"] * len(addresses))
                                  for i, a in enumerate(addresses)])


def gb300(name: str, address: str, imex: list[str], extra: list[Ipv4Address] | None = None) -> NvidiaFacts:
    facts = _common(name, address, extra, ports=4)
    facts["dmabuf"] = DmabufSupport("6.14.0-1007-nvidia-64k", True, True, True, True, [], "25.04-0.6.1")
    return NvidiaFacts(
        **facts,
        gpus=[NvidiaGpu("NVIDIA GB300", 284208, "580.95.05") for _ in range(4)],
        toolkit=ToolkitVersion("1.17.8"),
        fabric=[GpuFabric(f"0000000{i}:06:00.0", "Completed", "Success", "32766", UUID, "Healthy")
                for i in range(4)],
        imex=ImexState("active", ["channel0"], 234),
        imex_domain=_domain(imex),
    )


def hgx(name: str, address: str, fabric: list[GpuFabric] | None = None) -> NvidiaFacts:
    real = read(nvidia.NvlinkFabric().process(
        (FIXTURES / "nvidia/smi-q-h100-hgx-fabric-completed.txt").read_text().splitlines() + ["K3_EXIT=0"]))
    return NvidiaFacts(
        **_common(name, address),
        gpus=[NvidiaGpu("NVIDIA H200", 143771, "580.126.09") for _ in range(8)],
        toolkit=ToolkitVersion("1.17.8"),
        fabric_manager=FabricManagerState("active", "580.126.09"),
        fabric=fabric if fabric is not None else [dataclasses.replace(real[0], gpu=f"00000000:{b}:00.0")
                                                  for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")],
    )


def sel(hw: str, nodes: int) -> Requirements:
    return Requirements(hardware=hardware()[hw], variant="default", vram_minimum_gb=1000, nodes=nodes,
                        multi_node=nodes > 1)


def of(results, host: str, check: str):
    (hit,) = [r for r in results if r.host == host and r.check == check]
    return hit


# ---------------------------------------------------------------- HGX NVSwitch fabric


def test_hgx_reads_the_fabric_state_of_its_gpus():
    assert "fabric" in {attr for attr, _, _ in CHECKS.facts(sel("h200", 2))}
    assert "fabric" in {attr for attr, _, _ in CHECKS.facts(sel("b300", 2))}


def test_hgx_fabric_from_the_real_h100_output_passes():
    results = run_checks(sel("h200", 2), [hgx("h200-0", "10.0.0.1"), hgx("h200-1", "10.0.0.2")])
    assert [(r.host, r.status) for r in results if r.check == "nvswitch.fabric"] == [
        ("h200-0", "pass"), ("h200-1", "pass")]
    assert of(results, "h200-0", "nvswitch.fabric").observed == "8 GPU(s) Completed, Success"


def test_hgx_gpus_in_progress_with_fabric_manager_active_fail():
    """NVSentinel #883/#889: Fabric Manager active (and of the driver's version), the GPUs stuck In Progress."""
    stuck = [GpuFabric(f"00000000:{b}:00.0", "In Progress", None, None, None) for b in ("18", "2A", "3A", "5D")]
    done = read(hgx("x", "10.0.0.9").fabric)[4:]
    hosts = [hgx("h200-0", "10.0.0.1"), hgx("h200-1", "10.0.0.2", stuck + done)]
    results = run_checks(sel("h200", 2), hosts)
    assert of(results, "h200-1", "nvidia.fabricmanager").status == "pass"
    bad = of(results, "h200-1", "nvswitch.fabric")
    assert bad.status == "fail" and of(results, "h200-0", "nvswitch.fabric").status == "pass"
    assert "4 of 8 GPU(s) not registered" in bad.observed and "State In Progress" in bad.observed
    assert "Completed" in bad.required and "Success" in bad.required
    assert "nvidia-fabricmanager" in bad.fix and "FABRIC_MODE" in bad.fix and "partition" in bad.fix


def test_hgx_completed_with_a_failed_status_fails():
    real = read(nvidia.NvlinkFabric().process(
        (FIXTURES / "nvidia/smi-q-fabric-insufficient-resources.txt").read_text().splitlines() + ["K3_EXIT=0"]))
    hosts = [hgx("h200-0", "10.0.0.1", real * 8)]
    bad = of(run_checks(sel("h200", 1), hosts), "h200-0", "nvswitch.fabric")
    assert bad.status == "fail" and "Status Insufficient Resources" in bad.observed


def test_nvswitch_fabric_is_registered_with_command_requirement_and_fix():
    check = vendor.PACK.check("nvswitch.fabric")
    assert "nvidia-smi -q" in check.command_for(Spot()) and "Completed" in check.required


# ------------------------------------------------------------- degraded fabric health


def test_the_parser_reads_every_health_row():
    """The rows a real GB300 tray prints (driver 580.173.02, NVIDIA/k8s-test-infra's reference), degraded."""
    lines = ["GPU 00000008:01:00.0", "    Fabric", "        State                             : Completed",
             "        Status                            : Success", "        CliqueId                          : 7",
             f"        ClusterUUID                       : {UUID}", "        Health",
             "            Summary                       : Limited Capacity",
             "            Bandwidth                     : Degraded",
             "            Route Recovery in progress    : False",
             "            Route Unhealthy               : False",
             "            Access Timeout Recovery       : False",
             "            Incorrect Configuration       : None",
             "            Partition Assigned            : N/A"]
    (gpu,) = read(nvidia.NvlinkFabric().process(lines + ["K3_EXIT=0"]))
    assert (gpu.health, gpu.bandwidth) == ("Limited Capacity", "Degraded")
    assert gpu.conditions == {"Route Recovery in progress": "False", "Route Unhealthy": "False",
                              "Access Timeout Recovery": "False", "Incorrect Configuration": "None"}
    assert gpu.health_failures == [] and gpu.health_degraded == ["Health Limited Capacity", "Bandwidth Degraded"]


def trays() -> list[NvidiaFacts]:
    addresses = [f"10.77.0.{11 + i}" for i in range(3)]
    return [gb300(f"gb300-{i}", a, addresses) for i, a in enumerate(addresses)]


def test_degraded_bandwidth_on_one_tray_is_a_warning_naming_it():
    hosts = trays()
    hosts[1].fabric = [dataclasses.replace(g, health="Limited Capacity", bandwidth="Degraded")
                       for g in read(hosts[1].fabric)]
    results = run_checks(sel("gb300", 3), hosts)
    slow = of(results, "gb300-1", "nvlink.fabric")
    assert slow.status == "warn"
    assert "Bandwidth Degraded" in slow.observed and "Limited Capacity" in slow.observed
    assert "nvlink -s" in slow.fix
    assert {r.status for r in results if r.check == "nvlink.fabric" and r.host != "gb300-1"} == {"pass"}


def test_insufficient_nvlinks_or_a_route_unhealthy_fail_the_tray():
    for conditions in ({"Incorrect Configuration": "Insufficient NVLinks"}, {"Route Unhealthy": "True"}):
        hosts = trays()
        # Summary left Healthy: the condition alone must fail the tray
        hosts[2].fabric = [dataclasses.replace(g, conditions=conditions) for g in read(hosts[2].fabric)]
        results = run_checks(sel("gb300", 3), hosts)
        bad = of(results, "gb300-2", "nvlink.fabric")
        assert bad.status == "fail", conditions
        shown = next(iter(conditions)) if "Route" in next(iter(conditions)) else "Insufficient NVLinks"
        assert shown in bad.observed and "Unhealthy" in bad.fix


def test_hgx_degraded_fabric_warns():
    host = hgx("h200-0", "10.0.0.1")
    host.fabric = [dataclasses.replace(g, health="Limited Capacity", bandwidth="Degraded") for g in read(host.fabric)]
    shown = of(run_checks(sel("h200", 1), [host]), "h200-0", "nvswitch.fabric")
    assert shown.status == "warn" and "Bandwidth Degraded" in shown.observed


# ---------------------------------------------------- IMEX domain on another network


def test_an_imex_domain_on_the_management_network_passes():
    """nodes_config.cfg lists the trays' management addresses (IMEX bound there with BIND_INTERFACE_IP): the
    domain is fully formed, and each tray is in it by the address of its second interface."""
    cluster = [f"10.77.0.{11 + i}" for i in range(3)]
    management = [f"192.168.50.{11 + i}" for i in range(3)]
    hosts = [gb300(f"gb300-{i}", a, management, [Ipv4Address("mgmt0", management[i], 24)])
             for i, a in enumerate(cluster)]
    results = run_checks(sel("gb300", 3), hosts)
    assert [(r.host, r.status) for r in results if r.check == "nvidia.imex.domain"] == [
        (h.host, "pass") for h in hosts]


def test_a_tray_missing_from_the_management_network_domain_still_fails():
    cluster = [f"10.77.0.{11 + i}" for i in range(3)]
    management = [f"192.168.50.{11 + i}" for i in range(3)]
    hosts = [gb300(f"gb300-{i}", a, management[:2], [Ipv4Address("mgmt0", management[i], 24)])
             for i, a in enumerate(cluster)]
    results = run_checks(sel("gb300", 3), hosts)
    bad = of(results, "gb300-0", "nvidia.imex.domain")
    assert bad.status == "fail" and "not in the domain: gb300-2 (10.77.0.13)" in bad.observed


# --------------------------------------------------------------- GB300 Data Direct


def _tray_with_kernel(kernel: str, data_direct=None) -> list[NvidiaFacts]:
    hosts = trays()[:2]
    for h in hosts:
        h.dmabuf = DmabufSupport(kernel, True, True, True, True, [], "25.04-0.6.1")
        h.data_direct = data_direct
    return hosts


def test_gb300_reads_its_data_direct_functions():
    assert "data_direct" in {attr for attr, _, _ in CHECKS.facts(sel("gb300", 2))}
    assert "data_direct" not in {attr for attr, _, _ in CHECKS.facts(sel("gb200", 2))}


def test_a_stock_6_14_kernel_is_a_warning_pointing_at_the_nccl_probe():
    """The version alone: a stock 6.14 lacks the Data Direct patches of the -nvidia flavour."""
    results = run_checks(sel("gb300", 2), _tray_with_kernel("6.14.0-29-generic", []))
    shown = of(results, "gb300-0", "rdma.gpudirect")
    assert shown.status == "warn"
    assert "6.14.0-29-generic" in shown.observed and "-nvidia flavour" in shown.observed
    assert "15b3:2100" in shown.observed and "k3_nccl_probe" in shown.fix and "linux-nvidia-64k-6.14" in shown.fix


def test_the_nvidia_flavour_or_a_bound_data_direct_function_passes():
    flavour = run_checks(sel("gb300", 2), _tray_with_kernel("6.14.0-1007-nvidia-64k", []))
    assert of(flavour, "gb300-0", "rdma.gpudirect").status == "pass"
    functions = nvidia.DataDirect().process(["0000:03:00.1 mlx5_data_direct", "0002:03:00.1 mlx5_data_direct",
                                             "K3_EXIT=0"])
    bound = run_checks(sel("gb300", 2), _tray_with_kernel("6.14.0-29-generic", functions))
    shown = of(bound, "gb300-1", "rdma.gpudirect")
    assert shown.status == "pass" and "0000:03:00.1" in shown.observed and "mlx5_data_direct" in shown.observed


# ---------------------------------------------------------------- NVIDIA wording


def test_gb_inventories_call_the_trays_nvl72_compute_trays_not_nvl4():
    """GB200/GB300 in these plans are the 4-GPU compute trays of an NVL72 rack (multi-node NVLink through IMEX); the
    GB200 NVL4 is another board, whose NVLink stays on the board."""
    for path in ("inventories/gb300.py", "inventories/gb200.py", "group_vars/gb300.yml", "group_vars/gb200.yml",
                 "tools/demo.sh"):
        text = (ROOT / path).read_text()
        assert "NVL4" not in text and "NVL72 compute trays" in text, path


def test_the_toolkit_fix_does_not_ask_for_the_imex_channel_the_unit_passes():
    hosts = trays()[:2]
    hosts[1].toolkit = ToolkitVersion("1.16.2")
    shown = of(run_checks(sel("gb300", 2), hosts), "gb300-1", "container.toolkit")
    assert shown.status == "warn"
    assert "already passes the IMEX channel" in shown.fix and "or pass --device" not in shown.fix


def test_a_data_direct_function_does_not_hide_missing_dma_buf_prerequisites():
    functions = nvidia.DataDirect().process(["0000:03:00.1 mlx5_data_direct", "K3_EXIT=0"])
    hosts = _tray_with_kernel("6.14.0-29-generic", functions)
    hosts[0].dmabuf = DmabufSupport("6.14.0-29-generic", True, False, True, False, ["proprietary NVIDIA kernel modules"])
    assert of(run_checks(sel("gb300", 2), hosts), "gb300-0", "rdma.gpudirect").status == "fail"
