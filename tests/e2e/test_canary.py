"""The SLO gate's canary on the simulated cluster: two replicas of 2 GB300 trays behind the real vllm-router. A change
whose engines are three times slower (``K3SIM_SLOWDOWN`` through ``k3_extra_env``) is caught on the first replica
of the roll, which goes back to its previous revision by itself while a client keeps asking through the router
without one failed request; the run exits non-zero with the figures against the targets and the other replica is
never touched. A good change then rolls over both, each step gated."""

from __future__ import annotations

import json
import time

import pytest

from helpers import deploy, k3, why
from helpers.clients import Client
from helpers.simulated import Sim

pytestmark = pytest.mark.sim

NAME = "ggcanary"


def env_of(sim: Sim, rank: int) -> str:
    return sim.ssh(rank, "cat /etc/k3deploy/k3-engine.env").stdout


def router_workers(sim: Sim) -> list[str]:
    out = sim.ssh(0, "curl -s -m 3 http://127.0.0.1:30000/list_workers").stdout
    return sorted(json.loads(out)["urls"])


def started_at(sim: Sim, rank: int) -> str:
    return sim.ssh(rank, "systemctl show -p ActiveEnterTimestampMonotonic k3-engine").stdout


@pytest.fixture(scope="module")
def sim():
    s = Sim(NAME, "gb300", 4, "--replicas", "2")
    # a smaller probe than the default (20 requests, 64 tokens out): the same verdicts, fewer seconds
    s.set_vars("k3_slo_requests: 12\nk3_slo_output_tokens: 16\n")
    run = deploy(s.inventory)
    assert run.returncode == 0, why(run)
    assert "SLO gate" not in run.stdout.replace("k3_slo_", "")   # a first deploy starts everything: no canary
    yield s
    s.down()


def test_a_slow_change_is_caught_by_the_canary_and_taken_back(sim):
    ips = [n["ip"] for n in sim.info["nodes"]]
    heads = sorted([f"http://{ips[0]}:8000", f"http://{ips[2]}:8000"])
    replica1_since = started_at(sim, 2)
    sim.set_vars("k3_extra_env: {K3SIM_SLOWDOWN: '3'}\n")
    plan = k3("plan", sim.inventory, "--json")
    assert plan.returncode == 3, plan.stdout + plan.stderr
    gate = json.loads(plan.stdout)["slo_gate"]
    assert (gate["kind"], gate["groups"], gate["baseline"]) == ("canary", ["engine-r0"], "engine-r1")
    assert gate["load"]["requests"] == 12 and gate["targets"]["relative"] == 1.5

    with Client(f"http://{ips[0]}:30000") as client:
        time.sleep(1)
        run = deploy(sim.inventory)
        time.sleep(1)
    assert run.returncode != 0, why(run)
    assert client.failures == [], client.failures[:5]
    assert client.ok > 10, client.ok
    out = run.stdout
    # the figures against the targets, once more at the end of the run, and what was done about it
    assert "SLO gate: group engine-r0 misses the targets (measured against engine-r1, still on the previous " \
           "revision, under the same load)" in out
    assert "failed requests: 0 of 12 (target 0): hit" in out
    assert "ITL p95: 73.8 ms against 24.2 ms on the previous revision (target at most 1.5x = 36.4 ms): miss" in out
    assert "TTFT p95:" in out and "): miss" in out.split("TTFT p95:")[-1].splitlines()[0]
    assert "SLO gate missed: group engine-r0 went back to revision 1 and serves it again, back in the router; the " \
           "roll stopped" in out
    assert out.index("going back to revision 1") < out.index("Put the replica back into the router (engine-r0")
    # the canary runs its previous revision's files again, replica 1 was never restarted, both are in the router
    for rank in range(4):
        assert "K3SIM_SLOWDOWN" not in env_of(sim, rank), rank
    assert started_at(sim, 2) == replica1_since
    assert router_workers(sim) == heads
    st = json.loads(k3("status", sim.inventory, "--json", check=True).stdout)
    assert st["verdict"] == "serving"
    # history: the slow change is a revision that never served, with its figures; the baseline's figures are kept
    # with the revision replica 1 runs
    hist = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]
    r0 = {rev["number"]: rev for rev in hist["engine-r0"]["revisions"]}
    assert hist["engine-r0"]["current"] == 1 and not r0[2]["served"]
    assert r0[2]["slo"]["verdict"] == "miss" and r0[2]["slo"]["figures"]["itl_p95_ms"] == pytest.approx(73.75)
    r1 = {rev["number"]: rev for rev in hist["engine-r1"]["revisions"]}
    assert r1[1]["slo"]["figures"]["itl_p95_ms"] == pytest.approx(24.25)
    shown = k3("history", sim.inventory, check=True).stdout
    assert "miss: TTFT p95" in shown


def test_a_good_change_rolls_over_both_replicas(sim):
    sim.set_vars("k3_extra_env: {K3_CHANGE: one}\n")
    ips = [n["ip"] for n in sim.info["nodes"]]
    with Client(f"http://{ips[0]}:30000") as client:
        run = deploy(sim.inventory)
        time.sleep(1)
    assert run.returncode == 0, why(run)
    assert client.failures == [], client.failures[:5]
    out = run.stdout
    assert "SLO gate: group engine-r0 meets the targets" in out
    assert out.index("SLO gate: group engine-r0 meets") < out.index("Take the replica out of the router (engine-r1")
    for rank in range(4):
        assert "K3_CHANGE=one" in env_of(sim, rank), rank
    hist = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]
    assert hist["engine-r0"]["current"] == 3 and hist["engine-r1"]["current"] == 2
    r0 = {rev["number"]: rev for rev in hist["engine-r0"]["revisions"]}
    assert r0[3]["served"] and r0[3]["slo"]["verdict"] == "hit"
    assert k3("plan", sim.inventory).returncode == 0   # converged
