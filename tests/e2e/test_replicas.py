"""Replicas behind the real vllm-router on the simulated cluster: an engine change rolls one replica at a time while
a client keeps asking through the endpoint, with no failed request; a replica that does not come back stops the roll
and the endpoint keeps serving; rollback rolls the same way."""

from __future__ import annotations

import json
import time

import pytest

from helpers import deploy, k3, k3_here, totals, why
from helpers.clients import Client

pytestmark = pytest.mark.sim


def env_of(sim, rank: int) -> str:
    return sim.ssh(rank, "cat /etc/k3deploy/k3-engine.env").stdout


def router_workers(sim) -> list[str]:
    out = sim.ssh(0, "curl -s -m 3 http://127.0.0.1:30000/list_workers").stdout
    return sorted(json.loads(out)["urls"])


def test_two_replicas_roll_with_zero_failed_requests(sim_factory):
    sim = sim_factory("rep", "gb300", 4, "--replicas", "2")
    sim.set_vars("k3_slo_requests: 8\nk3_slo_output_tokens: 8\n")   # the canary's probe, small (tests/e2e/test_canary.py)
    ips = [n["ip"] for n in sim.info["nodes"]]
    heads = sorted([f"http://{ips[0]}:8000", f"http://{ips[2]}:8000"])
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert router_workers(sim) == heads
    st = json.loads(k3("status", sim.inventory, "--json", check=True).stdout)
    assert st["verdict"] == "serving"
    assert [(g["name"], g["in_router"]) for g in st["groups"]] == [("engine-r0", True), ("engine-r1", True),
                                                                     ("router", None)]
    router_since = sim.ssh(0, "systemctl show -p ActiveEnterTimestampMonotonic k3-engine-router").stdout

    # an engine-affecting change: the plan shows the steps, the roll keeps the endpoint serving
    sim.set_vars("k3_extra_env: {K3_CHANGE: one}\n")
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 3, plan.stdout + plan.stderr
    assert "step 1 of 2: engine-r0" in plan.stdout and "step 2 of 2: engine-r1" in plan.stdout
    endpoint = f"http://{ips[0]}:30000"
    with Client(endpoint) as client:
        time.sleep(2)
        run = deploy(sim.inventory)
        time.sleep(1)
    assert run.returncode == 0, why(run)
    assert client.failures == [], client.failures[:5]
    assert client.ok > 20 and len(client.answered_by) == 2, (client.ok, client.answered_by)
    out = run.stdout
    assert out.index("Take the replica out of the router (engine-r0, step 1 of 2)") \
        < out.index("Put the replica back into the router (engine-r0, step 1 of 2)") \
        < out.index("Take the replica out of the router (engine-r1, step 2 of 2)")
    for rank in range(4):
        assert "K3_CHANGE=one" in env_of(sim, rank), rank
    assert router_workers(sim) == heads
    # the router was not restarted
    assert sim.ssh(0, "systemctl show -p ActiveEnterTimestampMonotonic k3-engine-router").stdout == router_since
    assert k3("plan", sim.inventory, check=False).returncode == 0   # converged

    # replica 0 does not come back (its worker crashes at start): the roll stops there, replica 1 keeps the old
    # version and the endpoint serves
    k3_here("sim", "fault", sim.name, "1:engine-crash", check=True)
    sim.set_vars("k3_extra_env: {K3_CHANGE: two}\n")
    with Client(endpoint) as client:
        run = deploy(sim.inventory)
        time.sleep(1)
    assert run.returncode != 0, why(run)
    assert client.failures == [], client.failures[:5]
    assert client.ok > 5
    assert "K3_CHANGE=two" in env_of(sim, 0) and "K3_CHANGE=two" in env_of(sim, 1)
    assert "engine-r0" in run.stdout and "Take the replica out of the router (engine-r1" in run.stdout
    # replica 1 was not touched: it keeps the files it runs (written in its own step, which never came)
    assert "K3_CHANGE=one" in env_of(sim, 2) and "K3_CHANGE=one" in env_of(sim, 3)
    assert sim.ssh(3, "systemctl show -p ActiveState k3-engine").stdout.strip() == "ActiveState=active"
    assert router_workers(sim) == [f"http://{ips[2]}:8000"]
    st = json.loads(k3("status", sim.inventory, "--json", check=False).stdout)
    assert st["verdict"] == "degraded"
    assert {g["name"]: g["in_router"] for g in st["groups"]}["engine-r0"] is False

    # the fault gone, rollback goes back to revision 2 the same way: replica by replica, no failed request
    k3_here("sim", "fault", sim.name, "--clear", "1", check=True)
    with Client(endpoint) as client:
        run = deploy(sim.inventory, "--data", "k3_rollback=true")
        time.sleep(1)
    assert run.returncode == 0, why(run)
    assert client.failures == [], client.failures[:5]
    assert router_workers(sim) == heads
    for rank in range(4):
        assert "K3_CHANGE=one" in env_of(sim, rank), rank
    assert totals(run.stdout)[1] == 0
