"""`pyinfra <inventory> deploy/k3.py` with ``k3_launcher: slurm`` on a simulated cluster under a real Slurm (``sim up
--slurm``: slurmctld on the rank-0 node, the submit host): each group one batch job, a re-run submits nothing, a change
cancels and resubmits, a failing worker fails its job with its own output in the report; P/D pools before the router;
replicas roll one job at a time behind the router's job."""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import deploy, k3, totals, why
from helpers.clients import Client
from helpers.simulated import Sim, endpoint_of, openai_client

pytestmark = pytest.mark.sim

COMMENT = re.compile(r"k3deploy:engine:[0-9a-f]{16}")


def jobs(sim: Sim) -> list[list[str]]:
    """The submit host's queue: ``[id, name, state, comment]`` per job."""
    out = sim.ssh(0, "squeue -h -o '%i %j %T %k'")
    assert out.returncode == 0, out.stderr
    return [line.split() for line in out.stdout.splitlines() if line.strip()]


def engine_job(sim: Sim) -> tuple[str, str]:
    """The one job of the engine group: its id and comment (it must be running)."""
    queued = jobs(sim)
    assert [(j[1], j[2]) for j in queued] == [("k3-engine", "RUNNING")], queued
    assert COMMENT.fullmatch(queued[0][3]), queued
    return queued[0][0], queued[0][3]


def history(sim: Sim) -> tuple[int | None, list[int]]:
    """The engine group's current revision and its revisions' numbers (``k3deploy history --json``)."""
    got = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    return got["current"], [r["number"] for r in got["revisions"]]


def test_multi_node_tp_under_slurm(sim_factory):
    sim = sim_factory("sdtp", "gb300", 2, "--slurm")
    sim.set_vars("k3_strategy: multi_node_tp\n")
    head, worker = (n["name"] for n in sim.info["nodes"])

    # the submit host must be a host of the inventory: one line, exit 2, nothing changed
    sim.set_vars("k3_slurm_submit_host: login9\n")
    bad = deploy(sim.inventory)
    assert bad.returncode == 2, why(bad)
    assert "k3_slurm_submit_host: login9 is not a host of the inventory" in bad.stdout and "Stage |" not in bad.stdout
    sim.set_vars(f"k3_slurm_submit_host: {head}\n")

    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    job, comment = engine_job(sim)
    assert f"group engine: job {job} (k3-engine, {comment}) submitted on {head},{worker}" in first.stdout
    assert "serves at" in first.stdout
    assert "Kimi-K3" in openai_client(endpoint_of(first.stdout))
    for rank in (0, 1):
        # the engine runs in the job's step, not under systemd: no k3-engine unit anywhere
        units = sim.ssh(rank, "systemctl list-unit-files 'k3-engine*' --no-legend; ls /etc/systemd/system")
        assert "k3-engine" not in units.stdout, units.stdout
        files = sim.ssh(rank, "stat -c '%n %a' /etc/k3deploy/k3-engine.env /etc/k3deploy/k3-engine.launch")
        assert files.stdout.split("\n")[:2] == ["/etc/k3deploy/k3-engine.env 600",
                                                "/etc/k3deploy/k3-engine.launch 755"], files.stdout
        # each node keeps its own step's output
        out = sim.ssh(rank, f"cat /var/lib/k3deploy/slurm/engine/{job}/{sim.info['nodes'][rank]['name']}.out")
        assert out.returncode == 0, out.stderr
    assert history(sim) == (1, [1])
    kept = sim.ssh(1, "ls /etc/k3deploy/revisions/engine/1").stdout.split()
    assert kept == ["k3-engine.env", "k3-engine.launch", "meta.json", "served"], kept
    batch = sim.ssh(0, "cat /var/lib/k3deploy/slurm/k3-engine.sbatch").stdout
    assert f"#SBATCH --comment={comment}\n" in batch and f"#SBATCH --nodelist={head},{worker}\n" in batch

    # nothing changed: nothing submitted or cancelled, the same job runs on
    again = deploy(sim.inventory)
    assert again.returncode == 0, why(again)
    success, errors, nochange = totals(again.stdout)
    assert (success, errors) == (0, 0) and nochange > 0, again.stdout[-3000:]
    assert "submitted on" not in again.stdout and "cancelled" not in again.stdout
    assert engine_job(sim) == (job, comment)

    # a change: the old job is cancelled, the new one submitted with the new revision, and it serves
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "4"]\n')
    changed = deploy(sim.inventory)
    assert changed.returncode == 0, why(changed)
    assert f"cancelled job {job} (k3-engine, {comment})" in changed.stdout
    job2, comment2 = engine_job(sim)
    assert job2 != job and comment2 != comment
    assert "--max-num-seqs 4" in sim.ssh(1, "cat /etc/k3deploy/k3-engine.launch").stdout
    openai_client(endpoint_of(changed.stdout))
    assert history(sim) == (2, [1, 2])

    # a job cancelled behind the deploy's back: the next run submits it again
    assert sim.ssh(0, f"scancel {job2}").returncode == 0
    for _ in range(60):
        if not jobs(sim):
            break
        sim.ssh(0, "sleep 1")
    back = deploy(sim.inventory)
    assert back.returncode == 0, why(back)
    job3, comment3 = engine_job(sim)
    assert job3 != job2 and comment3 == comment2
    assert history(sim) == (2, [1, 2])   # the same files: no new revision

    # a rollback is not built yet under Slurm: one line, exit 2, nothing changed
    rollback = deploy(sim.inventory, "--data", "k3_rollback=true")
    assert rollback.returncode == 2 and "k3_launcher: slurm: k3_rollback is not built yet" in rollback.stdout
    assert engine_job(sim) == (job3, comment3)

    # a change whose worker crashes: the job ends whole, the report names the worker with its own step output
    k3("sim", "fault", "--name", sim.name, "1:engine-crash", check=True)
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "8"]\n')
    crash = deploy(sim.inventory)
    assert crash.returncode != 0
    assert f"[{worker}] worker rank 1 on {worker} (" in crash.stdout and "failed during start" in crash.stdout
    assert f"[{worker}] --- /var/lib/k3deploy/slurm/engine/" in crash.stdout
    assert "EngineCore failed to start" in crash.stdout
    assert f"[{head}] group engine stopped because worker rank 1 on {worker} failed" in crash.stdout
    assert jobs(sim) == []   # no half group


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
    sim.set_vars("k3_slurm_exclusive: user\n")   # the router's job shares the first replica's head
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
