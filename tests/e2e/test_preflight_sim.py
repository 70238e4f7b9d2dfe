"""`k3deploy preflight` against simulated clusters: a healthy GB300 pair and a healthy Ascend A3 pair pass; each
injected fault fails the right node with the right check, and only that node."""

from __future__ import annotations

import pytest

from helpers import k3, preflight

pytestmark = pytest.mark.sim

# fault on rank 1 -> the check that must fail there (cluster-wide memory fails too when a node cannot be read)
FAULTS = [
    ("driver=570.86.15", "nvidia.driver"),
    ("no-nvidia-smi", "nvidia.driver"),
    ("gpu-count=3", "gpu.count"),
    ("gpu-model=NVIDIA GB200", "gpu.model"),
    ("fabric=In Progress", "nvlink.fabric"),
    ("cluster-uuid=11111111-2222-3333-4444-555555555555", "nvlink.fabric"),
    ("disk-full", "disk.cache"),
    ("sshd-down", "host.reachable"),
]


def failing(report: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for host, h in report["hosts"].items():
        for r in h["results"]:
            if r["status"] == "fail":
                out.setdefault(host, set()).add(r["check"])
    return out


@pytest.fixture(scope="module")
def pair():
    from helpers.simulated import Sim

    sim = Sim("e4a", "gb300", 2)
    yield sim
    sim.down()


def test_healthy_gb300_pair_passes(pair):
    rc, report = preflight(pair.inventory)
    assert rc == 0 and report["ok"] and failing(report) == {}
    assert report["selection"] == {**report["selection"], "hardware": "gb300", "strategy": "multi_node_tp", "nodes": 2}
    assert all(h["settings"]["NCCL_MNNVL_ENABLE"] == "1" for h in report["hosts"].values())


@pytest.mark.parametrize("fault, check", FAULTS, ids=[f[0].split("=")[0] for f in FAULTS])
def test_each_fault_fails_the_right_node_with_the_right_check(pair, fault, check):
    k3("sim", "fault", "--name", "e4a", f"1:{fault}", check=True)
    try:
        rc, report = preflight(pair.inventory)
    finally:
        k3("sim", "fault", "--name", "e4a", "--clear", check=True)
    bad = failing(report)
    assert rc == 1
    assert check in bad.get("e4a-node2", set()), bad
    assert "e4a-node1" not in bad, bad  # only that node
    node2 = report["hosts"]["e4a-node2"]
    if check != "host.reachable":
        shown = next(r for r in node2["results"] if r["check"] == check)
        assert shown["observed"] and shown["required"] and shown["fix"]


def test_people_read_the_failure_first_and_one_line_per_passed_check(pair):
    """The human output of the same run: the failing check first, with the node, what was observed and the fix;
    every passed check on one line across the nodes; nothing wider than 100 columns."""
    k3("sim", "fault", "--name", "e4a", "1:gpu-count=3", check=True)
    try:
        proc = k3("preflight", pair.inventory)
    finally:
        k3("sim", "fault", "--name", "e4a", "--clear", check=True)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if line.split()[:1] in (["FAIL"], ["WARN"], ["PASS"])]
    assert rows[0] == ["FAIL", "gpu.count", "e4a-node2"], proc.stdout
    first = lines.index(next(line for line in lines if line.startswith("FAIL")))
    assert [line.split()[0] for line in lines[first + 1:first + 4]] == ["observed", "required", "fix"], proc.stdout
    assert lines[first + 1].split()[1] == "3", proc.stdout
    passed = [row for row in rows if row[0] == "PASS"]
    assert len(passed) == len({row[1] for row in passed}) >= 10           # one line per check
    assert ["PASS", "gpu.count", "on", "1", "of", "2", "nodes"] in [row[:7] for row in passed]
    assert max(len(line) for line in lines) <= 100 and "failed: e4a-node2" in lines[-1]

def test_dmabuf_failure_is_not_visible_to_host_facts(pair):
    """no-dmabuf is an mlx5 kernel driver that cannot register DMA-BUF memory: kernel, open modules and mlx5_ib all
    look right, so host facts derive no fallback (the opt-in NCCL probe catches it: tests/e2e/test_nccl_probe.py).
    A GB300 tray has no nvidia_peermem to fall back on, so a missing one is no failure either."""
    k3("sim", "fault", "--name", "e4a", "1:no-dmabuf", check=True)
    try:
        rc, report = preflight(pair.inventory)
        assert rc == 0, failing(report)
        assert "NCCL_DMABUF_ENABLE" not in report["hosts"]["e4a-node2"]["settings"]
        k3("sim", "fault", "--name", "e4a", "1:no-peermem", check=True)
        rc, report = preflight(pair.inventory)
        assert rc == 0 and failing(report) == {}
    finally:
        k3("sim", "fault", "--name", "e4a", "--clear", check=True)


# Ascend A3 (910C) pair: fault on rank 1 -> the check that must fail there, and what it must say
ASCEND_FAULTS = [
    ("npu-link-down=3,11", "ascend.network", "NPU 3: link DOWN, net health Fault"),
    ("mount-missing=/usr/local/Ascend/driver/tools/hccn_tool", "ascend.mounts",
     "missing /usr/local/Ascend/driver/tools/hccn_tool"),
    ("mount-missing=/usr/local/dcmi", "ascend.mounts", "missing /usr/local/dcmi"),
]


@pytest.fixture(scope="module")
def a3_pair():
    from helpers.simulated import Sim

    sim = Sim("e4n", "ascend_910c", 2, "--strategy", "none")  # a pair: below every strategy's size, preflight only
    yield sim
    sim.down()


def test_healthy_a3_pair_passes_the_npu_network_and_mount_checks(a3_pair):
    rc, report = preflight(a3_pair.inventory)
    assert rc == 0 and failing(report) == {}, failing(report)
    for h in report["hosts"].values():
        got = {r["check"]: r for r in h["results"]}
        assert got["ascend.network"]["status"] == "pass", got["ascend.network"]
        assert got["ascend.network"]["observed"] == "16 NPUs: link UP, net health Success"
        assert got["ascend.mounts"]["status"] == "pass"


@pytest.mark.parametrize("fault, check, observed", ASCEND_FAULTS, ids=[f[0] for f in ASCEND_FAULTS])
def test_each_a3_fault_fails_the_right_node_with_the_right_check(a3_pair, fault, check, observed):
    k3("sim", "fault", "--name", "e4n", f"1:{fault}", check=True)
    try:
        rc, report = preflight(a3_pair.inventory)
    finally:
        k3("sim", "fault", "--name", "e4n", "--clear", check=True)
    bad = failing(report)
    assert rc == 1 and check in bad.get("e4n-node2", set()), bad
    # a downed port also fails the peer's pings to it (ascend.peers); nothing else fails on the peer
    assert bad.get("e4n-node1", set()) <= ({"ascend.peers"} if fault.startswith("npu-link-down") else set()), bad
    shown = next(r for r in report["hosts"]["e4n-node2"]["results"] if r["check"] == check)
    assert shown["observed"].startswith(observed) and shown["required"] and shown["fix"], shown


def test_a3_npus_ping_the_same_npu_of_the_peer_and_a_downed_port_fails_both_ends(a3_pair):
    """The second round (hccn_tool -hccs_ping from NPU i to NPU i of the other node): 16 pings a node pass; NPU 3
    of rank 1 down fails rank 1's ping from NPU 3 and rank 0's ping to it, each named with the peer's address."""
    rc, report = preflight(a3_pair.inventory)
    assert rc == 0, failing(report)
    for h in report["hosts"].values():
        peers = next(r for r in h["results"] if r["check"] == "ascend.peers")
        assert (peers["status"], peers["observed"]) == ("pass", "16 pings to the peers' NPUs answered"), peers
    k3("sim", "fault", "--name", "e4n", "1:npu-link-down=3", check=True)
    try:
        rc, report = preflight(a3_pair.inventory)
    finally:
        k3("sim", "fault", "--name", "e4n", "--clear", check=True)
    assert rc == 1
    got = {host: next(r for r in h["results"] if r["check"] == "ascend.peers") for host, h in report["hosts"].items()}
    assert got["e4n-node1"]["status"] == got["e4n-node2"]["status"] == "fail", got
    # NPU 3 of rank r: VNIC 192.169.<r>.196 (the simulated hccn_tool -vnic -g)
    assert got["e4n-node1"]["observed"] == ("NPU 3 -> 192.169.1.196 (e4n-node2) hccs_ping: "
                                            "3 packets transmitted, 0 received, 100.00% packets loss"), got
    assert got["e4n-node2"]["observed"].startswith("NPU 3 -> 192.169.0.196 (e4n-node1) hccs_ping: "), got
    assert "same-index" in got["e4n-node1"]["required"] and got["e4n-node1"]["fix"]
