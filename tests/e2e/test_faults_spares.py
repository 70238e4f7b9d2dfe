"""Hot spares end to end, on one simulated cluster of 2 GB300 trays (``multi_node_tp``) and one spare: the spare is
staged and runs nothing; powered off and out of the IMEX domain it fails no serving tray; node2 is powered off; the
next deploy run (and nothing else) serves on the spare, in node2's rank, and ``status``, ``history``, ``plan`` and
``spares`` show the substitution; node2 powered on again is a spare, its units stopped and disabled by the run after.
The time from the power-off to the OpenAI client's answer through the spare is printed (``pytest -s``)."""

from __future__ import annotations

import json
import time

import pytest

from helpers import deploy, k3, k3_here, why
from helpers.simulated import Sim, WatchLoop, endpoint_of, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]

UNIT = "k3-engine.service"


@pytest.fixture(scope="module")
def cluster():
    k3_here("sim", "down", "--name", "ssp", check=False)
    sim = Sim("ssp", "gb300", 2, "--spares", "1")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_link_timeout: 10\n")
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    yield sim
    sim.down()


def test_a_spare_out_of_the_imex_domain_fails_no_serving_tray(cluster):
    """The spare powered off, and node2's IMEX domain showing it UNAVAILABLE (fault ``imex-peer-down``: node2's peer
    in its domain is the next tray, the spare; the simulated tools do not take a powered-off peer out of the domain by
    themselves): preflight asks the planned serving trays to be READY, not the spare, and the deploy goes ahead."""
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])
    assert k3("sim", "power", sim.name, "2", "off", check=True).returncode == 0
    k3_here("sim", "fault", "--name", sim.name, "1:imex-peer-down", check=True)
    try:
        shown = sim.ssh(1, "nvidia-imex-ctl -N").stdout
        report = json.loads(k3("preflight", sim.inventory, "--json", check=False).stdout)
        run = deploy(sim.inventory)
    finally:
        k3_here("sim", "fault", "--name", sim.name, "--clear", "1:imex-peer-down", check=True)
        k3("sim", "power", sim.name, "2", "on", check=True)
    address = sim.info["nodes"][2]["ip"]
    assert "UNAVAILABLE" in shown and "Domain State: DEGRADED" in shown, shown
    imex = {r["check"]: r for r in report["hosts"][node2]["results"]}["nvidia.imex.domain"]
    assert imex["status"] == "pass", imex
    assert imex["observed"] == (f"DEGRADED, 2 of 3 node(s) READY, connected; spare {spare} ({address}) "
                                "UNAVAILABLE, not asked to be READY")
    assert node1 not in report["failed_hosts"] and node2 not in report["failed_hosts"], report["failed_hosts"]
    assert run.returncode == 0, why(run)


def test_a_powered_off_member_is_replaced_by_the_spare_on_the_next_run(cluster):
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])
    assert "spares = [" in open(sim.inventory).read()
    listed = json.loads(k3("spares", sim.inventory, "--json", check=True).stdout)
    assert [(h["host"], h["state"]) for h in listed["hosts"]] == [(spare, "standing by")]
    assert sim.ssh(2, f"systemctl is-active {UNIT}").stdout.strip() != "active"          # it runs nothing
    assert sim.ssh(2, "docker image ls -q | head -1").stdout.strip()                      # but it holds the image

    endpoint = json.loads(k3("status", sim.inventory, "--json").stdout)["endpoint"]
    # the site's control loop runs; the power goes off; no other command is run until the group serves again
    loop = WatchLoop(sim.inventory, "--repair", "--grace", "5", "--interval", "2")
    off = json.loads(k3("sim", "power", sim.name, "1", "off", "--json", check=True).stdout)
    assert off["power"] == "off" and off["was_on"]
    answer = None
    while time.time() - off["at"] < 150 and loop.proc.poll() is None and answer is None:
        if any(e["event"] == "repaired" for e in loop.events):
            answer = openai_client(endpoint)
        time.sleep(1)
    seconds = time.time() - off["at"]
    assert loop.stop() == 0 and answer is not None, f"{loop.events}\n{loop.stderr[-3000:]}"
    print(f"\nnode2 powered off -> serving again on the spare (watch --repair --grace 5 --interval 2, the OpenAI "
          f"client's answer): {seconds:.1f} s")
    assert "Generated text: " in answer
    (repaired,) = [e for e in loop.events if e["event"] == "repaired"]
    assert repaired["rc"] == 0, loop.stderr[-3000:]
    assert f"{spare} takes {node2}'s place: rank 1 of group engine (unreachable" in loop.stderr

    st = k3("status", sim.inventory, "--json")
    assert st.returncode == 0, st.stdout + st.stderr                                      # serving
    data = json.loads(st.stdout)
    assert [(u["host"], u["rank"]) for g in data["groups"] for u in g["units"]] == [(node1, 0), (spare, 1)]
    assert node2 not in data["unreachable"]
    subs = data["spares"]["substitutions"]
    assert [(s["group"], s["rank"], s["lost"], s["spare"], s["new"]) for s in subs] == [
        ("engine", 1, node2, spare, False)]
    assert f"spares: group engine rank 1: {spare} in place of {node2} (unreachable" in k3("status",
                                                                                         sim.inventory).stdout
    history = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)
    assert [s["spare"] for s in history["groups"]["engine"]["substitutions"]] == [spare]
    plan = k3("plan", sim.inventory, "--json")
    assert plan.returncode == 0, plan.stdout + plan.stderr                                # nothing left to change
    assert json.loads(plan.stdout)["spares"]["substitutions"][0]["spare"] == spare
    assert f"spares: group engine rank 1: {spare} in place of {node2}" in k3("plan", sim.inventory).stdout
    assert "spares =" in open(sim.inventory).read() and spare in open(sim.inventory).read().split("spares =")[1]


def test_the_lost_member_back_is_a_spare_and_runs_nothing(cluster):
    sim = cluster
    _, node2, spare = (n["name"] for n in sim.info["nodes"])
    k3("sim", "power", sim.name, "1", "on", check=True)
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert sim.ssh(1, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    assert sim.ssh(1, f"systemctl is-enabled {UNIT}").stdout.strip() == "disabled"
    listed = json.loads(k3("spares", sim.inventory, "--json", check=True).stdout)
    assert {h["host"]: h["state"] for h in listed["hosts"]} == {spare: "in use", node2: "standing by"}
    assert k3("status", sim.inventory).returncode == 0


def test_a_quarantined_head_is_replaced_stood_down_and_released(cluster):
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])
    sim.ssh(0, "echo 'drained by hand: fan failure' > /etc/k3deploy/quarantine")   # as an operator would
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"{node2} takes {node1}'s place: rank 0 of group engine (quarantined: drained by hand" in run.stdout
    answer = openai_client(endpoint_of(run.stdout))                     # the endpoint moved with the head
    assert "Generated text: " in answer and sim.info["nodes"][1]["ip"] in endpoint_of(run.stdout)
    assert sim.ssh(0, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    assert sim.ssh(0, f"systemctl is-enabled {UNIT}").stdout.strip() == "disabled"
    listed = json.loads(k3("spares", sim.inventory, "--json", check=True).stdout)
    assert [(q["host"], q["recorded"]) for q in listed["quarantined"]] == [(node1, True)]
    out = k3("spares", sim.inventory, "--release", node1, check=True)
    assert f"released {node1} (drained by hand: fan failure)" in out.stdout
    listed = json.loads(k3("spares", sim.inventory, "--json", check=True).stdout)
    assert {h["host"]: h["state"] for h in listed["hosts"]} == {node2: "in use", spare: "in use",
                                                               node1: "standing by"}
    assert json.loads(k3("status", sim.inventory, "--json").stdout)["verdict"] == "serving"


def test_an_xid_79_quarantines_the_node_and_a_spare_takes_its_place(cluster):
    sim = cluster
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])   # node2 is the head now, node1 a spare again
    k3_here("sim", "fault", "--name", sim.name, "1:xid=79", check=True)
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"{node1} takes {node2}'s place: rank 0 of group engine (quarantined: XID 79 on GPU 0" in run.stdout
    assert "Generated text: " in openai_client(endpoint_of(run.stdout))
    record = json.loads(sim.ssh(1, "cat /etc/k3deploy/quarantine").stdout)
    assert record["reason"].startswith("XID 79 on GPU 0 (fallen off the bus)"), record
    assert sim.ssh(1, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    st = json.loads(k3("status", sim.inventory, "--json").stdout)
    assert st["verdict"] == "serving"
    health = {n["host"]: n for n in st["nodes"]}
    assert health[node2]["quarantined"] and "XID 79" in health[node2]["health"], health[node2]
    listed = json.loads(k3("spares", sim.inventory, "--json", check=True).stdout)
    assert [q["host"] for q in listed["quarantined"]] == [node2]
