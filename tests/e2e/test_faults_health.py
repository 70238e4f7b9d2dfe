"""Hardware health end to end on one simulated 2-tray GB300 cluster whose second tray's kernel log shows XID 79 (its
GPU 0 fell off the bus): preflight refuses that tray naming the GPU, the XID and the fix, ``status`` shows each
node's health (``--json`` with the events), a quarantine record on a node is read and refused, and a cleared fault
clears the event. Real pyinfra over real SSH; the simulated ``dmesg`` prints the driver's XID line."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from helpers import k3, preflight, result
from helpers.simulated import Sim

pytestmark = [pytest.mark.sim, pytest.mark.faults]

NAME = "hhxid"
NODE1, NODE2 = f"{NAME}-node1", f"{NAME}-node2"


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
    k3("sim", "fault", NAME, "--clear", "1:xid", check=True)
    rc, report = preflight(sim.inventory)
    assert report["failed_hosts"] == [NODE1]
    quarantined = result(report, NODE1, "node.quarantine")
    assert quarantined["observed"] == "quarantined: XID 79 on GPU 0 (fallen off the bus)"
    assert f"--release {NODE1}" in quarantined["fix"]
    assert result(report, NODE2, "hardware.health")["status"] == "pass"
    nodes = {n["host"]: n for n in json.loads(k3("status", sim.inventory, "--json").stdout)["nodes"]}
    assert nodes[NODE1]["quarantined"] == record["reason"] and nodes[NODE2]["events"] == []
