"""Hardware health end to end on one simulated 2-tray GB300 cluster whose second tray's kernel log shows XID 79 (its
GPU 0 fell off the bus): preflight refuses that tray naming the GPU, the XID and the fix, ``status`` shows each
node's health (``--json`` with the events), a quarantine record on a node is read and refused, and a cleared fault
clears the event. Then, on a second cluster of 2 GB300 trays and a spare, deployed and serving: a pending row remap
(recovery action None) only warns, the tray keeps serving and the spare stays a spare; the driver's recovery action
Reboot (``GPU Recovery Action`` and its XID 154) quarantines the tray and the spare serves in its rank. Real pyinfra
over real SSH; the simulated ``dmesg`` and ``nvidia-smi`` print the driver's lines."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from helpers import deploy, k3, k3_here, preflight, result, why
from helpers.simulated import Sim, endpoint_of, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]

NAME = "hhxid"
NODE1, NODE2 = f"{NAME}-node1", f"{NAME}-node2"
SPARED = "hlspare"
UNIT = "k3-engine.service"


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    cluster = Sim(NAME, "gb300", 2, "--fault", "1:xid=79")
    try:
        yield cluster
    finally:
        cluster.down()


def test_preflight_refuses_the_tray_naming_the_gpu_the_xid_and_the_fix(sim: Sim) -> None:
    rc, report = preflight(sim.inventory)
    assert rc == 1 and report["failed_hosts"] == [NODE2], report["failed_hosts"]
    bad = result(report, NODE2, "hardware.health")
    assert bad["status"] == "fail"
    assert bad["observed"].startswith("XID 79 on GPU 0 (fallen off the bus): NVRM: Xid (PCI:0008:01:00): 79, ")
    assert bad["fix"].startswith(f"{NODE2} must not serve") and "reseat or replace the GPU or tray" in bad["fix"]
    assert result(report, NODE1, "hardware.health")["status"] == "pass"
    text = k3("preflight", sim.inventory)
    assert text.returncode == 1 and "XID 79 on GPU 0" in text.stdout and NODE2 in text.stdout


def test_status_shows_each_nodes_health_and_its_events(sim: Sim) -> None:
    shown = k3("status", sim.inventory)
    assert f"health: {NODE2}: XID 79 on GPU 0 (fallen off the bus): must not serve" in shown.stdout, shown.stdout
    assert f"health: {NODE1}" not in shown.stdout
    doc = json.loads(k3("status", sim.inventory, "--json").stdout)
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert nodes[NODE1]["health"] == "ok" and not nodes[NODE1]["fatal"]
    assert nodes[NODE2]["fatal"] and [(e["device"], e["kind"], e["code"]) for e in nodes[NODE2]["events"]] == [
        ("GPU 0", "xid", "79")]


def test_a_quarantine_record_is_read_and_a_cleared_fault_clears_the_event(sim: Sim) -> None:
    record = {"reason": "XID 79 on GPU 0 (fallen off the bus)", "events": [], "when": "2026-12-05T10:00:00Z"}
    assert sim.ssh(0, f"mkdir -p /etc/k3deploy && echo '{json.dumps(record)}' > /etc/k3deploy/quarantine"
                   ).returncode == 0
    k3_here("sim", "fault", NAME, "--clear", "1:xid", check=True)
    rc, report = preflight(sim.inventory)
    assert report["failed_hosts"] == [NODE1]
    quarantined = result(report, NODE1, "node.quarantine")
    assert quarantined["observed"] == "quarantined: XID 79 on GPU 0 (fallen off the bus)"
    assert f"--release {NODE1}" in quarantined["fix"]
    assert result(report, NODE2, "hardware.health")["status"] == "pass"
    nodes = {n["host"]: n for n in json.loads(k3("status", sim.inventory, "--json").stdout)["nodes"]}
    assert nodes[NODE1]["quarantined"] == record["reason"] and nodes[NODE2]["events"] == []


@pytest.fixture(scope="module")
def spared() -> Iterator[Sim]:
    k3_here("sim", "down", "--name", SPARED, check=False)
    cluster = Sim(SPARED, "gb300", 2, "--spares", "1")
    try:
        cluster.set_vars("k3_strategy: multi_node_tp\nk3_link_timeout: 10\n")
        first = deploy(cluster.inventory)
        assert first.returncode == 0, why(first)
        yield cluster
    finally:
        cluster.down()


def test_a_pending_remap_warns_and_the_tray_keeps_serving_without_a_spare(spared: Sim) -> None:
    node1, node2, spare = (n["name"] for n in spared.info["nodes"])
    k3_here("sim", "fault", "--name", SPARED, "1:ecc=pending-remap", check=True)
    rc, report = preflight(spared.inventory)
    warn = result(report, node2, "hardware.health")
    assert (warn["status"], warn["observed"]) == ("warn", "row remap pending on GPU 0 (not fatal)"), warn
    run = deploy(spared.inventory)
    assert run.returncode == 0, why(run)
    assert f"takes {node2}'s place" not in run.stdout, run.stdout
    assert spared.ssh(1, f"systemctl is-active {UNIT}").stdout.strip() == "active"
    assert spared.ssh(1, "test -e /etc/k3deploy/quarantine").returncode != 0
    listed = json.loads(k3("spares", spared.inventory, "--json", check=True).stdout)
    assert [(h["host"], h["state"]) for h in listed["hosts"]] == [(spare, "standing by")]
    assert listed["quarantined"] == []
    st = json.loads(k3("status", spared.inventory, "--json").stdout)
    nodes = {n["host"]: n for n in st["nodes"]}
    assert st["verdict"] == "serving" and not nodes[node2]["fatal"]
    assert nodes[node2]["health"] == "row remap pending on GPU 0 (not fatal)"


def test_the_recovery_action_reboot_quarantines_the_tray_and_the_spare_takes_its_place(spared: Sim) -> None:
    node1, node2, spare = (n["name"] for n in spared.info["nodes"])
    k3_here("sim", "fault", "--name", SPARED, "1:recovery=reboot", check=True)
    rc, report = preflight(spared.inventory)
    bad = result(report, node2, "hardware.health")
    assert bad["status"] == "fail" and bad["observed"].startswith(
        "XID 154 on GPU 0 (GPU recovery action changed): NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action "
        "changed from 0x0 (None) to 0x2 (Node Reboot Required)"), bad
    assert "reboot the node" in bad["fix"].lower()
    run = deploy(spared.inventory)
    assert run.returncode == 0, why(run)
    (line,) = [x for x in run.stdout.splitlines() if f"{spare} takes {node2}'s place" in x]
    assert "(quarantined: XID 154 on GPU 0 (GPU recovery action changed)" in line, line
    assert "Generated text: " in openai_client(endpoint_of(run.stdout))
    record = json.loads(spared.ssh(1, "cat /etc/k3deploy/quarantine").stdout)
    assert "GPU recovery action Reboot on GPU 0 (node reboot required)" in record["reason"], record
    # with the driver asking for a reboot, the pending remap counts too
    assert "row remap pending on GPU 0" in record["reason"], record
    assert spared.ssh(1, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    listed = json.loads(k3("spares", spared.inventory, "--json", check=True).stdout)
    assert [q["host"] for q in listed["quarantined"]] == [node2]
