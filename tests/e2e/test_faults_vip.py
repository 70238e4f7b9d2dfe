"""The site's virtual address end to end, on one simulated cluster of 2 GB300 trays (``multi_node_tp``) and one spare
with ``k3_vip`` (``sim up --vip``: ``<subnet>.250``): keepalived (Debian's, VRRP over the cluster's bridge) runs on
every node, and only the head, while its ``/health`` answers, holds the address. The head is replaced by the spare
twice, once quarantined by its record and once powered off, each time by one deploy run and nothing else: the
client's base URL (``status --json``'s ``endpoint``, the smoke test's, the OpenAI client's) does not change and
answers again, now from the spare. The time from the head's power-off to the answer through the same URL is printed
(``pytest -s``)."""

from __future__ import annotations

import json
import time

import pytest

from helpers import deploy, k3, k3_here, why
from helpers.simulated import Sim, endpoint_of, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]

UNIT = "k3-engine.service"


@pytest.fixture(scope="module")
def cluster():
    k3_here("sim", "down", "--name", "vpa", check=False)
    sim = Sim("vpa", "gb300", 2, "--spares", "1", "--vip")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_link_timeout: 10\n")
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    yield sim
    sim.down()


def holds(sim: Sim, rank: int) -> bool:
    """Node ``rank`` has the virtual address on its eth0."""
    return f" {sim.info['vip']}/" in sim.ssh(rank, "ip -o -4 addr show dev eth0").stdout


def status(sim: Sim) -> dict:
    st = k3("status", sim.inventory, "--json")
    assert st.returncode == 0, st.stdout + st.stderr        # serving
    data: dict = json.loads(st.stdout)
    return data


def test_the_base_url_is_the_virtual_address_held_by_the_head_only(cluster):
    sim = cluster
    vip = sim.info["vip"]
    base = f"http://{vip}:8000"
    assert vip.rsplit(".", 1)[0] == sim.info["nodes"][0]["ip"].rsplit(".", 1)[0]     # in the cluster's subnet
    assert status(sim)["endpoint"] == base
    assert "Generated text: " in openai_client(base)
    assert [holds(sim, r) for r in range(3)] == [True, False, False]
    for r in range(3):   # keepalived runs on every node, the spare included, its configuration checked
        assert sim.ssh(r, "systemctl is-active keepalived").stdout.strip() == "active"
        assert sim.ssh(r, "keepalived -t -f /etc/keepalived/keepalived.conf && echo valid").stdout.strip() == "valid"
    assert "priority 150" in sim.ssh(0, "cat /etc/keepalived/keepalived.conf").stdout
    assert "priority 100" in sim.ssh(2, "cat /etc/keepalived/keepalived.conf").stdout
    again = deploy(sim.inventory)                            # nothing changed: keepalived is left as it runs
    assert again.returncode == 0, why(again)
    assert "keepalived: virtual address" in again.stdout and endpoint_of(again.stdout) == base
    assert sim.ssh(0, "journalctl -u keepalived --no-pager | grep -c 'Reloading\\|Stopping'").stdout.strip() == "0"
    plan = k3("plan", sim.inventory)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"virtual address {vip} (keepalived VRRP, router id 51): held by {sim.info['nodes'][0]['name']}" \
        in plan.stdout


def test_a_quarantined_head_gives_the_address_to_the_spare_that_replaces_it(cluster):
    sim = cluster
    node1, _, spare = (n["name"] for n in sim.info["nodes"])
    base = f"http://{sim.info['vip']}:8000"
    sim.ssh(0, "echo 'drained by hand: fan failure' > /etc/k3deploy/quarantine")   # as an operator would
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"{spare} takes {node1}'s place: rank 0 of group engine (quarantined: drained by hand" in run.stdout
    assert endpoint_of(run.stdout) == base                   # the smoke test went through the same URL
    assert "Hello from " + spare in openai_client(base)      # answered by the spare, through the same URL
    data = status(sim)
    assert data["endpoint"] == base and data["verdict"] == "serving"
    assert [holds(sim, r) for r in range(3)] == [False, False, True]
    assert "priority 150" in sim.ssh(2, "cat /etc/keepalived/keepalived.conf").stdout
    # the quarantined node's engine is stopped: its check fails, so keepalived there can never take the address
    assert sim.ssh(0, f"systemctl is-active {UNIT}").stdout.strip() != "active"
    assert "FAULT" in sim.ssh(0, "journalctl -u keepalived --no-pager | grep STATE | tail -1").stdout
    out = k3("spares", sim.inventory, "--release", node1, check=True)
    assert f"released {node1}" in out.stdout


def test_a_powered_off_head_gives_the_same_base_url_to_the_spare_on_the_next_run(cluster):
    sim = cluster
    node1, _, spare = (n["name"] for n in sim.info["nodes"])   # the spare is the head now, node1 stands by
    base = f"http://{sim.info['vip']}:8000"
    off = json.loads(k3("sim", "power", sim.name, "2", "off", "--json", check=True).stdout)
    assert off["power"] == "off" and off["was_on"]
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"{node1} takes {spare}'s place: rank 0 of group engine (unreachable" in run.stdout
    assert endpoint_of(run.stdout) == base
    answer = openai_client(base)
    seconds = time.time() - off["at"]
    print(f"\nthe head powered off -> the same base URL {base} answers from the spare (one deploy run): "
          f"{seconds:.1f} s")
    assert "Hello from " + node1 in answer
    assert status(sim)["endpoint"] == base
    assert [holds(sim, r) for r in range(2)] == [True, False]
    # the old head back: its engine cannot serve (its group has moved on), so it does not take the address back
    k3("sim", "power", sim.name, "2", "on", check=True)
    time.sleep(5)                                            # keepalived's adverts and checks, a few rounds
    assert not holds(sim, 2) and holds(sim, 0)
    assert "Hello from " + node1 in openai_client(base)
    back = deploy(sim.inventory)                             # it is a spare from now on, standing by
    assert back.returncode == 0, why(back)
    assert "priority 100" in sim.ssh(2, "cat /etc/keepalived/keepalived.conf").stdout
    assert status(sim)["endpoint"] == base and holds(sim, 0) and not holds(sim, 2)
