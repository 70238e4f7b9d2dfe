"""Groups of several jobs under a real Slurm on the simulated cluster (``sim up --slurm``): P/D pools submitted
before the router's job, which starts once they serve; replicas roll one job at a time behind the router's job,
with a client asking throughout and no failed request."""

from __future__ import annotations

import time

import pytest

from helpers import deploy, why
from helpers.clients import Client
from helpers.simulated import endpoint_of, openai_client
from helpers.simulated import slurm_jobs as jobs

pytestmark = pytest.mark.sim


def test_pd_pools_before_the_router_under_slurm(sim_factory):
    sim = sim_factory("sdpd", "b300", 3, "--layout", "pd:1,2", "--slurm")
    sim.set_vars("k3_strategy: pd_cluster\n")
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    out = run.stdout
    # the pools' jobs first, side by side; the router's once they serve
    assert out.index("group prefill: job") < out.index("group decode: job") < out.index("decode rank 0 of job") \
        < out.index("group router: job") < out.index("router rank 0 of job")
    assert "Kimi-K3" in openai_client(endpoint_of(out))
    queued = jobs(sim)
    assert sorted((j[1], j[2], j[3].rsplit(":", 1)[0]) for j in queued) == [
        ("k3-decode", "RUNNING", "k3deploy:decode"), ("k3-prefill", "RUNNING", "k3deploy:prefill"),
        ("k3-router", "RUNNING", "k3deploy:router")]
    again = deploy(sim.inventory)
    assert again.returncode == 0 and "submitted on" not in again.stdout, why(again)
    assert jobs(sim) == queued


def test_replicas_roll_one_job_at_a_time_behind_the_routers_job(sim_factory):
    sim = sim_factory("sdrep", "gb300", 4, "--replicas", "2", "--slurm")
    # sim up writes it: the router's job shares the first replica's head
    assert "k3_slurm_exclusive: user" in sim.group_vars.read_text()
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    before = {j[1]: j[0] for j in jobs(sim)}
    assert sorted(before) == ["k3-engine-r0", "k3-engine-r1", "k3-router"]
    sim.set_vars("k3_extra_env: {K3_CHANGE: one}\n")
    with Client(f"http://{sim.info['nodes'][0]['ip']}:30000") as client:
        time.sleep(2)
        run = deploy(sim.inventory)
        time.sleep(1)
    assert run.returncode == 0, why(run)
    assert client.failures == [] and client.ok > 20, (client.ok, client.failures[:5])
    out = run.stdout
    assert out.index("Take the replica out of the router (engine-r0, step 1 of 2)") \
        < out.index(f"cancelled job {before['k3-engine-r0']} (k3-engine-r0") \
        < out.index("Put the replica back into the router (engine-r0, step 1 of 2)") \
        < out.index(f"cancelled job {before['k3-engine-r1']} (k3-engine-r1") \
        < out.index("Put the replica back into the router (engine-r1, step 2 of 2)")
    after = {j[1]: j[0] for j in jobs(sim)}
    # each replica's job replaced, the router's left running
    assert after["k3-router"] == before["k3-router"]
    assert after["k3-engine-r0"] != before["k3-engine-r0"] and after["k3-engine-r1"] != before["k3-engine-r1"]
