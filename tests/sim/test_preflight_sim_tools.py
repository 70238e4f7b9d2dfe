"""The facts' real commands against the simulated vendor tools (k3sim node_tools), node by node,
without booting a cluster: a healthy cluster passes, and each injected fault fails the right node with
the right check. Disk, /dev/shm, the address, IMEX channel devices and the Ascend files are node-level
facts and are given here directly."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

sim_profiles = pytest.importorskip("k3sim.profiles")
from k3deploy.errors import K3Error  # noqa: E402
from k3deploy.facts.host import AddressInterface, DiskSpace, Ipv4Address  # noqa: E402
from k3deploy.model.requirements import Requirements  # noqa: E402
from k3deploy.preflight.checks import run_checks, vendor_checks  # noqa: E402
from k3deploy.preflight.runner import fact_plan  # noqa: E402
from k3deploy.recipe.taxonomy import hardware  # noqa: E402
from k3deploy.vendors.ascend.checks import AscendFacts  # noqa: E402
from k3deploy.vendors.ascend.facts import AscendVersionInfo  # noqa: E402
from k3deploy.vendors.nvidia import facts as nvidia  # noqa: E402
from k3deploy.vendors.nvidia.checks import NvidiaFacts  # noqa: E402
from k3deploy.vendors.nvidia.facts import ImexState  # noqa: E402
from k3sim.faults import parse_fault  # noqa: E402

GIB = 1024**3
UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"
TOOLS = sim_profiles.NODE_TOOLS
NODE_LEVEL = {"disk_images", "disk_cache", "shm", "interface", "ascend", "imex"}


def run_fact(fact_cls, kwargs, env):
    fact = fact_cls()
    required = fact.requires_command(**kwargs)
    if required and subprocess.run(["sh", "-c", f"command -v {required}"], env=env,
                                   capture_output=True).returncode:
        return fact.default()
    out = subprocess.run(["sh", "-c", fact.command(**kwargs)], env=env, capture_output=True, text=True,
                         timeout=60).stdout.splitlines()
    return fact.process(out) if out else fact.default()


def cluster(hw: str, nodes: int, faults: list[str], tmp_path, variant="default", vram=1680.0, strategy=None):
    sel = Requirements(hardware=hardware()[hw], variant=variant, vram_minimum_gb=vram, nodes=nodes,
                    strategy=strategy, multi_node=nodes > 1)
    parsed = [parse_fault(f) for f in faults]
    # the nodes run systemd with the vendor services up; this host may not: answer is-active for them
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "systemctl").write_text('#!/bin/sh\n[ "$1" = is-active ] && { echo active; exit 0; }\nexit 1\n')
    (stub / "systemctl").chmod(0o755)
    hosts = []
    for rank in range(nodes):
        ip = f"10.77.0.{11 + rank}"
        config = sim_profiles.node_config(hw, rank, nodes, f"node{rank}", ip, parsed, 1.0, UUID)
        path = tmp_path / f"node{rank}.json"
        path.write_text(json.dumps(config))
        env = dict(os.environ, K3SIM_NODE_CONFIG=str(path),
                   PATH=f"{stub}:{TOOLS}/usr/bin:{TOOLS}/usr/local/bin:{TOOLS}/usr/local/Ascend/driver/tools:"
                        f"{os.environ['PATH']}")
        facts = vendor_checks(sel).facts_type(host=f"node{rank}", address=ip)
        for read in fact_plan(sel, ip, "/var/lib/k3deploy/cache", "/var/lib/docker"):
            if read.name not in NODE_LEVEL:
                read.into(facts, run_fact(read.fact, read.kwargs, env))
        facts.disk_images = DiskSpace("/var/lib/docker", "/dev/nvme0n1", 4096 * GIB, 3000 * GIB, "/")
        facts.disk_cache = DiskSpace("/var/lib/k3deploy", "/dev/nvme0n1", 4096 * GIB, 3000 * GIB, "/")
        facts.shm = DiskSpace("/dev/shm", "tmpfs", 64 * GIB, 64 * GIB, "/dev/shm")
        facts.interface = AddressInterface(ip, "eth0", "eth0", [Ipv4Address("eth0", ip, 24)])
        if sel.mnnvl:  # device nodes under /dev exist only inside a node
            assert isinstance(facts, NvidiaFacts)
            facts.read_imex(ImexState("active", ["channel0"], 234))
        if hw.startswith("ascend"):
            assert isinstance(facts, AscendFacts)
            facts.read_ascend(AscendVersionInfo("25.5.0", "7.7.0.1.231", None, []))
        hosts.append(facts)
    return sel, hosts


def failures(results):
    return sorted((r.host, r.check) for r in results if r.status == "fail")


def test_healthy_gb300_pair_passes(tmp_path):
    sel, hosts = cluster("gb300", 2, [], tmp_path)
    results = run_checks(sel, hosts)
    assert failures(results) == []
    assert {"nvlink.fabric", "nvidia.imex", "nvidia.imex.domain", "rdma.devices"} <= {
        r.check for r in results if r.host == "node1"}
    (domain,) = [r for r in results if r.check == "nvidia.imex.domain" and r.host == "node1"]
    assert domain.observed == "UP, 2 node(s) READY, all connected"


@pytest.mark.parametrize(
    "hw, fault, expected",
    [
        ("gb300", "1:fabric=In Progress", [("node1", "nvlink.fabric")]),
        ("gb300", "1:cluster-uuid=1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", [("node1", "nvlink.fabric")]),
        ("gb300", "0:gpu-model=NVIDIA GB200", [("node0", "gpu.model")]),
        ("gb300", "1:imex-peer-down", [("node1", "nvidia.imex.domain")]),
        ("gb300", "1:fabric-health=no-partition", [("node1", "nvlink.fabric")]),
        # HGX GPUs stuck In Progress while Fabric Manager runs at the driver's version
        ("h200", "1:fabric=In Progress", [("node1", "nvswitch.fabric")]),
        ("h200", "1:gpu-count=7", [("node1", "gpu.count")]),
        # Fabric Manager stays at the old driver's version: both checks fail, on that node only
        ("h200", "1:driver=570.86.15", [("node1", "nvidia.driver"), ("node1", "nvidia.fabricmanager")]),
        # without nvidia-smi the node's memory is unknown and one H200 node cannot hold the checkpoint
        ("h200", "1:no-nvidia-smi", [("cluster", "gpu.memory"), ("node1", "nvidia.driver")]),
        # hardware health: a fatal event refuses that node; one that is not fatal only warns
        ("gb300", "0:xid=95:3", [("node0", "hardware.health")]),
        ("gb300", "1:xid=13", []),
        # a pending remap and a volatile uncorrectable count with recovery action None warn; the driver's own
        # recovery action, and XID 154 announcing it, decide
        ("gb300", "1:ecc=uncorrectable", []),
        ("gb300", "1:ecc=pending-remap", []),
        ("gb300", "1:recovery=none", []),
        ("gb300", "1:recovery=reboot", [("node1", "hardware.health")]),
        ("h200", "0:recovery=drain-p2p:5", [("node0", "hardware.health")]),
        ("gb300", "1:ecc=remap-failure:2", [("node1", "hardware.health")]),
        ("gb300", "1:nvlink-down=3", [("node1", "hardware.health")]),
    ],
)
def test_injected_fault_fails_the_right_node(hw, fault, expected, tmp_path):
    sel, hosts = cluster(hw, 2, [fault], tmp_path)
    assert failures(run_checks(sel, hosts)) == expected


def test_simulated_imex_ctl_text_and_json(tmp_path):
    """The simulated nvidia-imex-ctl lists the trays of the NVLink domain; imex-peer-down takes one peer out."""
    for rank, faults in ((0, []), (0, ["0:imex-peer-down"])):
        config = sim_profiles.node_config("gb200", rank, 2, "node0", "10.77.0.11", [parse_fault(f) for f in faults],
                                          1.0, UUID)
        path = tmp_path / "node.json"
        path.write_text(json.dumps(config))
        env = dict(os.environ, K3SIM_NODE_CONFIG=str(path))
        tool = str(TOOLS / "usr/bin/nvidia-imex-ctl")
        text = subprocess.run([tool, "-N"], env=env, capture_output=True, text=True, check=True).stdout
        domain = nvidia.parse_imex_domain(text.splitlines())
        doc = json.loads(subprocess.run([tool, "-N", "-j"], env=env, capture_output=True, text=True,
                                        check=True).stdout)
        assert [n.address for n in domain.nodes] == ["10.77.0.11", "10.77.0.12"]
        assert [v["host"] for v in doc["nodes"].values()] == ["10.77.0.11", "10.77.0.12"]
        if faults:
            assert (domain.domain_state, doc["status"], domain.formed) == ("DEGRADED", "DEGRADED", False)
            assert domain.nodes[1].status == doc["nodes"]["1"]["status"] == "UNAVAILABLE"
            assert domain.nodes[0].links == ["C", "N"] and domain.nodes[1].links == ["I", "I"]
        else:
            assert (domain.domain_state, doc["status"], domain.formed) == ("UP", "UP", True)
            assert {c["status"] for v in doc["nodes"].values() for c in v["connections"].values()} == {"CONNECTED"}
    assert subprocess.run([tool], env=env, capture_output=True).returncode == 1


def test_imex_peer_down_needs_imex_hardware_and_a_peer():
    with pytest.raises(K3Error, match="gb200, gb300"):
        sim_profiles.node_config("h200", 0, 2, "n", "10.77.0.11", [parse_fault("0:imex-peer-down")], 1.0, UUID)
    with pytest.raises(K3Error, match="at least 2 nodes"):
        sim_profiles.node_config("gb300", 0, 1, "n", "10.77.0.11", [parse_fault("0:imex-peer-down")], 1.0, UUID)
    # a rack holds 18 trays: tray 18 is in the next domain, alone
    config = sim_profiles.node_config("gb300", 18, 19, "n", "10.77.0.29", [], 1.0, UUID)
    assert config["imex"] == {"nodes": ["10.77.0.29"], "down": []}
    assert len(sim_profiles.node_config("gb300", 3, 19, "n", "10.77.0.14", [], 1.0, UUID)["imex"]["nodes"]) == 18
    excluded = set(sim_profiles.excluded_paths(sim_profiles.node_config("h200", 0, 1, "n", "10.77.0.11", [], 1.0,
                                                                        UUID)))
    assert "/usr/bin/nvidia-imex-ctl" in excluded


def test_missing_nvidia_smi_message(tmp_path):
    sel, hosts = cluster("h200", 2, ["1:no-nvidia-smi"], tmp_path)
    (driver,) = [r for r in run_checks(sel, hosts) if r.check == "nvidia.driver" and r.status == "fail"]
    assert driver.observed == "nvidia-smi not found on node1: is the NVIDIA driver installed?"


def test_ascend_npu_link_down_fails_that_node_naming_the_npus(tmp_path):
    sel, hosts = cluster("ascend_910c", 2, ["1:npu-link-down=3,11"], tmp_path, variant="ascend_w4a8", vram=1711.0)
    results = run_checks(sel, hosts)
    assert failures(results) == [("node1", "ascend.network")]
    (bad,) = [r for r in results if r.check == "ascend.network" and r.status == "fail"]
    assert bad.observed == ("NPU 3: link DOWN, net health Fault (probing 192.168.101.254); "
                            "NPU 11: link DOWN, net health Fault (probing 192.168.101.254)")


def test_healthy_mi355x_and_ascend(tmp_path):
    sel, hosts = cluster("mi355x", 1, [], tmp_path)
    assert failures(run_checks(sel, hosts)) == []
    sel, hosts = cluster("ascend_910c", 2, [], tmp_path, variant="ascend_w4a8", vram=1711.0)
    results = run_checks(sel, hosts)
    assert failures(results) == []
    assert [r.observed for r in results if r.check == "gpu.count" and r.host == "node0"] == ["16"]


def test_xid_79_names_the_node_the_gpu_the_event_and_the_fix(tmp_path):
    sel, hosts = cluster("gb300", 2, ["1:xid=79"], tmp_path)
    (bad,) = [r for r in run_checks(sel, hosts) if r.check == "hardware.health" and r.status == "fail"]
    assert bad.host == "node1"
    assert bad.observed == ("XID 79 on GPU 0 (fallen off the bus): NVRM: Xid (PCI:0008:01:00): 79, "
                            "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert bad.fix.startswith("node1 must not serve: the deploy quarantines it and gives its place to a spare")
    assert "reseat or replace the GPU or tray" in bad.fix
    assert hosts[1].health.summary() == "XID 79 on GPU 0 (fallen off the bus)"
    assert hosts[0].health.summary() == "ok"


def test_not_fatal_events_warn_and_show(tmp_path):
    sel, hosts = cluster("h200", 2, ["1:nvlink-down=3:5", "1:ecc=correctable"], tmp_path)
    (warn,) = [r for r in run_checks(sel, hosts) if r.check == "hardware.health" and r.host == "node1"]
    assert (warn.status, warn.observed) == ("warn", "NVLink link 3 inactive on GPU 5 (not fatal)")


def test_amd_and_ascend_health_faults(tmp_path):
    sel, hosts = cluster("mi355x", 2, ["0:ecc=uncorrectable:6", "1:ecc=deferred"], tmp_path)
    assert [f for f in failures(run_checks(sel, hosts)) if f[1] == "hardware.health"] == [("node0", "hardware.health")]
    assert [h.health.summary() for h in hosts] == ["ECC uncorrectable=2 on GPU 6",
                                                   "ECC deferred=1 on GPU 0 (not fatal)"]
    sel, hosts = cluster("ascend_910c", 2, ["1:npu-health=3", "0:npu-health=2:Warning"], tmp_path,
                         variant="ascend_w4a8", vram=1711.0)
    results = run_checks(sel, hosts)
    # one rule for the table's Health column and the health model: Alarm and Critical fail, a Warning warns
    assert failures(results) == [("node1", "ascend.health"), ("node1", "hardware.health")]
    assert {(r.check, r.status) for r in results if r.host == "node0" and "health" in r.check} == {
        ("ascend.health", "warn"), ("hardware.health", "warn")}
    assert hosts[1].health.summary() == ("NPU health Critical 80E18008 on NPU 3 chip 0; "
                                         "NPU health Critical 80E18008 on NPU 3 chip 1")
    assert hosts[0].health.summary() == ("NPU health Warning 80CB8009 on NPU 2 chip 0 (not fatal); "
                                         "NPU health Warning 80CB8009 on NPU 2 chip 1 (not fatal)")


def test_amd_without_amd_smi_reports_health_unknown_never_no_event(tmp_path):
    """amdgpu-dkms alone: no amd-smi, and the simulated node shows no RAS counters in sysfs: health is unknown, a
    warning that names what was missing; nothing is quarantined for it."""
    sel, hosts = cluster("mi355x", 2, ["1:no-amd-smi"], tmp_path)
    results = run_checks(sel, hosts)
    assert [f for f in failures(results) if "health" in f[1] or f[1].startswith("rocm")] == []
    (warn,) = [r for r in results if r.check == "hardware.health" and r.host == "node1"]
    assert warn.status == "warn"
    assert warn.observed == ("health unknown on node (nothing reads the GPUs' errors: no amd-smi, no amdgpu RAS "
                             "counters in sysfs)")
    assert hosts[1].health.fatal == () and "amd-smi" in hosts[1].health.events[0].text
    assert [r.status for r in results if r.check == "hardware.health" and r.host == "node0"] == ["pass"]


def test_an_a2_nodes_chips_are_read_by_the_health_command(tmp_path):
    """The A2 table's chip rows carry the chip id alone: the health command reads each chip not OK all the same."""
    sel, hosts = cluster("ascend_910c", 2, ["0:npu-smi-a2", "0:npu-health=5:Alarm", "1:npu-smi-a2",
                                            "1:npu-health=2:Warning"], tmp_path, variant="ascend_w4a8", vram=1711.0)
    results = run_checks(sel, hosts)
    assert failures(results) == [("node0", "ascend.health"), ("node0", "hardware.health")]
    assert hosts[0].health.summary() == "NPU health Alarm 80E18005 on NPU 5 chip 0"
    assert hosts[1].health.summary() == "NPU health Warning 80CB8009 on NPU 2 chip 0 (not fatal)"
    assert [r.observed for r in results if r.check == "gpu.count" and r.host == "node1"] == ["16"]


def test_the_quarantine_record_is_read_with_the_health(tmp_path):
    config = sim_profiles.node_config("gb300", 0, 2, "node0", "10.77.0.11", [], 1.0, UUID)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, K3SIM_NODE_CONFIG=str(path),
               PATH=f"{TOOLS}/usr/bin:{TOOLS}/usr/local/bin:{os.environ['PATH']}")
    kwargs = {"config_dir": str(tmp_path), "nvl": True}
    assert run_fact(nvidia.NvidiaHealth, kwargs, env).quarantined is None
    (tmp_path / "quarantine").write_text(json.dumps({"reason": "XID 79 on GPU 0 (fallen off the bus)",
                                                     "events": [], "when": "2026-12-05T10:00:00Z"}))
    facts = NvidiaFacts(host="node0")
    facts.read_health(run_fact(nvidia.NvidiaHealth, kwargs, env))
    assert facts.quarantined == "XID 79 on GPU 0 (fallen off the bus)"
    sel, _ = cluster("gb300", 2, [], tmp_path)
    results = [r for r in run_checks(sel, [facts]) if r.check == "node.quarantine"]
    assert [(r.status, r.observed) for r in results] == [("fail", "quarantined: XID 79 on GPU 0 (fallen off the bus)")]
    assert "k3deploy spares INVENTORY --release node0" in results[0].fix
