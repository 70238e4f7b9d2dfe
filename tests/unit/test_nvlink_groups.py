"""The NVLink domain per group, and the IMEX domain with spares, from fixture readings: each replica's trays must
share one NVLink domain (ClusterUUID and CliqueId), not every planned tray, so two replicas in two racks pass and a
replica split across two domains fails naming the group, its trays and their domains; a spare tray standing by
(powered off, IMEX stopped) is UNAVAILABLE in the serving trays' ``nvidia-imex-ctl -N`` and fails nothing, while a
planned serving tray that is not READY still does."""

from __future__ import annotations

import dataclasses

from helpers import FIXTURES, read
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, Ipv4Address, KernelRelease
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, RdmaPort
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import target
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.nvidia import facts as nvidia
from k3deploy.vendors.nvidia.checks import NvidiaFacts
from k3deploy.vendors.nvidia.facts import ImexDomainState, ImexState, NvidiaGpu, ToolkitVersion

GIB = 1024**3
#: a real 18-tray IMEX domain (nvidia-imex-ctl -N of 570.172, tests/fixtures/README.md): its first addresses are the
#: trays below
DOMAIN = read(nvidia.ImexDomain().process(
    (FIXTURES / "nvidia/imex-ctl-N-18-nodes-570.172.txt").read_text().splitlines() + ["K3_EXIT=0"]))
ADDRESSES = [n.address for n in DOMAIN.nodes]


def fabric(name: str) -> list[nvidia.GpuFabric]:
    """The Fabric blocks of a GB300 tray's ``nvidia-smi -q``: ``completed`` (ClusterUUID 9f3c..., CliqueId 32766) or
    ``other-clique`` (another rack: 1c2d..., CliqueId 4)."""
    lines = (FIXTURES / f"nvidia/smi-q-gb300-{name}.txt").read_text().splitlines()
    return read(nvidia.NvlinkFabric().process(lines + ["K3_EXIT=0"]))


def space(path: str, free_gib: float) -> DiskSpace:
    return DiskSpace(path=path, filesystem="/dev/nvme0n1p2", size_bytes=int(free_gib * 2 * GIB),
                     available_bytes=int(free_gib * GIB), mount="/")


def tray(name: str, address: str, rack: str = "completed", domain: ImexDomainState = DOMAIN) -> NvidiaFacts:
    return NvidiaFacts(
        host=name, address=address,
        kernel=KernelRelease("6.14.0-1007-nvidia-64k", (6, 14, 0)),
        runtime=ContainerRuntime("docker", "28.3.2", ["io.containerd.runc.v2", "nvidia", "runc"]),
        disk_images=space("/var/lib/docker", 800), disk_cache=space("/var/lib/k3deploy/cache", 3000),
        shm=DiskSpace("/dev/shm", "tmpfs", 64 * GIB, 64 * GIB, "/dev/shm"),
        interface=AddressInterface(address, "eth0", "eth0", [Ipv4Address("eth0", address, 24)]),
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(4)],
        modules=LoadedModules(["ib_core", "nvidia"]),
        dmabuf=DmabufSupport("6.14.0-1007-nvidia-64k", True, True, True, True, [], "25.04-0.6.1"),
        gpus=[NvidiaGpu("NVIDIA GB300", 284208, "580.95.05") for _ in range(4)],
        toolkit=ToolkitVersion("1.17.8"), fabric=fabric(rack),
        imex=ImexState("active", ["channel0"], 234), imex_domain=domain,
    )


def replicas(groups: dict[str, list[str]], spares: tuple[str, ...] = ()) -> Requirements:
    nodes = sum(len(h) for h in groups.values())
    return Requirements(hardware()["gb300"], "default", 1680, nodes=nodes, strategy="multi_node_tp",
                        multi_node=True, groups=tuple((g, tuple(h)) for g, h in groups.items()), spares=spares)


def failures(results):
    return sorted((r.host, r.check) for r in results if r.status == "fail")


def result(results, host: str, check: str):
    (r,) = [r for r in results if (r.host, r.check) == (host, check)]
    return r


# ------------------------------------------------------------------------------------ the NVLink domain per group


def test_an_inventory_of_replicas_gives_each_replica_its_own_group():
    hosts = [HostRecord(f"t{i}", ("head" if i % 2 == 0 else "workers",),
                        {"k3_hardware": "gb300", "k3_ip": f"10.0.0.{i + 1}", "k3_replica": i // 2, "rank": i % 2})
             for i in range(4)] + [HostRecord("t4", ("spares",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.5"})]
    need = target(hosts, None).requirements
    assert need.groups == (("engine-r0", ("t0", "t1")), ("engine-r1", ("t2", "t3")))
    assert need.spares == ("t4",) and need.group_of("t3") == ("engine-r1", ("t2", "t3")) and need.group_of("t4") is None


def test_two_replicas_in_two_racks_pass():
    # each rack its own IMEX domain: replica 0 in rack A (the real domain), replica 1 in rack B (its two trays)
    rack_b = dataclasses.replace(DOMAIN, nodes=[dataclasses.replace(n, address=a, links=["C", "C"])
                                                for n, a in zip(DOMAIN.nodes[:2], ["10.1.0.11", "10.1.0.12"],
                                                                strict=True)])
    trays = [tray("a0", ADDRESSES[0]), tray("a1", ADDRESSES[1]),
             tray("b0", "10.1.0.11", "other-clique", rack_b), tray("b1", "10.1.0.12", "other-clique", rack_b)]
    results = run_checks(replicas({"engine-r0": ["a0", "a1"], "engine-r1": ["b0", "b1"]}), trays)
    assert failures(results) == []
    assert "ClusterUUID 1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f, CliqueId 4" in result(results, "b1", "nvlink.fabric").observed
    assert result(results, "b0", "nvidia.imex.domain").observed == "UP, 2 node(s) READY, all connected"
    # the same four trays as one group (tensor parallelism over all four): the rack-B trays are refused
    one = run_checks(replicas({"engine": ["a0", "a1", "b0", "b1"]}), trays)
    assert ("b0", "nvlink.fabric") in failures(one) and ("b1", "nvlink.fabric") in failures(one)


def test_a_replica_split_across_two_domains_is_refused_naming_the_group_its_trays_and_their_domains():
    trays = [tray("a0", ADDRESSES[0]), tray("a1", ADDRESSES[1]), tray("a2", ADDRESSES[2]),
             tray("b0", ADDRESSES[3], "other-clique")]
    results = run_checks(replicas({"engine-r0": ["a0", "a1"], "engine-r1": ["a2", "b0"]}), trays)
    assert failures(results) == [("b0", "nvlink.fabric")]
    bad = result(results, "b0", "nvlink.fabric")
    assert bad.observed == ("ClusterUUID 1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f, CliqueId 4; group engine-r1 is split "
                            "across 2 NVLink domains (a2: ClusterUUID 9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f, CliqueId "
                            "32766; b0: ClusterUUID 1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f, CliqueId 4)")
    assert "the other trays of group engine-r1" in bad.required and "ClusterUUID 9f3c1a52" in bad.required
    assert "group engine-r1 must share one NVL72 rack" in bad.fix


def test_a_spare_in_another_rack_fails_no_serving_tray():
    trays = [tray("a0", ADDRESSES[0]), tray("a1", ADDRESSES[1]), tray("s", "10.1.0.11", "other-clique")]
    results = run_checks(replicas({"engine": ["a0", "a1"]}, spares=("s",)), trays)
    assert not [f for f in failures(results) if f[0] != "s"]


# ------------------------------------------------------------------------------------ IMEX with spares


def imex_with_down(down: list[int], nodes: int = 3) -> ImexDomainState:
    """The real domain cut to ``nodes`` trays with the trays ``down`` UNAVAILABLE (powered off: their row Invalid,
    their column Never Connected) and the domain DEGRADED, as nvidia-imex-ctl -N shows it (the legend of the
    fixture)."""
    rows = []
    for i, n in enumerate(DOMAIN.nodes[:nodes]):
        links = ["I" if i in down else ("N" if j in down else "C") for j in range(nodes)]
        rows.append(dataclasses.replace(n, status="UNAVAILABLE" if i in down else "READY", links=links))
    return ImexDomainState("DEGRADED" if down else "UP", rows, DOMAIN.timestamp)


def test_a_powered_off_spare_is_not_asked_to_be_ready():
    domain = imex_with_down([2])
    trays = [tray("a0", ADDRESSES[0], domain=domain), tray("a1", ADDRESSES[1], domain=domain),
             dataclasses.replace(NvidiaFacts(host="s", address=ADDRESSES[2]), unreachable="connection refused")]
    results = run_checks(replicas({"engine": ["a0", "a1"]}, spares=("s",)), trays)
    assert not [f for f in failures(results) if f[0] != "s"], results
    r = result(results, "a0", "nvidia.imex.domain")
    assert r.status == "pass"
    assert r.observed == (f"DEGRADED, 2 of 3 node(s) READY, connected; spare s ({ADDRESSES[2]}) UNAVAILABLE, not "
                          "asked to be READY")
    # a reachable spare whose IMEX is stopped (standing by) is the same
    standby = tray("s", ADDRESSES[2], domain=domain)
    standby.imex = ImexState("inactive", ["channel0"], 234)
    results = run_checks(replicas({"engine": ["a0", "a1"]}, spares=("s",)), trays[:2] + [standby])
    assert result(results, "a1", "nvidia.imex.domain").status == "pass"


def test_a_planned_serving_tray_not_ready_still_fails_with_the_spare_named():
    domain = imex_with_down([1, 2])
    trays = [tray("a0", ADDRESSES[0], domain=domain), tray("a1", ADDRESSES[1], domain=domain),
             dataclasses.replace(NvidiaFacts(host="s", address=ADDRESSES[2]), unreachable="connection refused")]
    results = run_checks(replicas({"engine": ["a0", "a1"]}, spares=("s",)), trays)
    r = result(results, "a0", "nvidia.imex.domain")
    assert r.status == "fail"
    assert f"node #1 {ADDRESSES[1]} UNAVAILABLE" in r.observed and "#0->#1 N" in r.observed
    assert f"spare s ({ADDRESSES[2]}) UNAVAILABLE, not asked to be READY" in r.observed
    assert "#0->#2" not in r.observed and "Domain State" not in r.observed
    # an unreachable host of the inventory that is no spare is not asked either (host.reachable says why) ...
    plain = run_checks(replicas({"engine": ["a0", "a1"]}), trays)
    assert f"unreachable host s ({ADDRESSES[2]}) UNAVAILABLE" in result(plain, "a0", "nvidia.imex.domain").observed
    # ... but a node of the domain that is no host of the inventory is, as it always was
    alone = run_checks(replicas({"engine": ["a0", "a1"]}), [tray(f"a{i}", ADDRESSES[i], domain=imex_with_down([2]))
                                                            for i in range(2)])
    r = result(alone, "a0", "nvidia.imex.domain")
    assert r.status == "fail" and "Domain State DEGRADED" in r.observed
    assert f"node #2 {ADDRESSES[2]} UNAVAILABLE" in r.observed
