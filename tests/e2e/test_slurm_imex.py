"""IMEX per Slurm job end to end, on 2 GB300 trays under a real Slurm (``sim up --slurm --imex per-job``: no standing
IMEX daemon or channel 0; the simulated switch/nvidia_imex gives each job ``channelN`` and the submit host's
``scontrol`` answers as a 24.05 site with it, docs/sim.md): preflight reads the mode from the submit host and checks
it as such (the packages, no standing domain), the deploy serves, and the engine's container got the job's channel,
not channel 0."""

from __future__ import annotations

import json

import pytest

from helpers import deploy, k3, why
from helpers.simulated import endpoint_of, openai_client
from helpers.simulated import slurm_jobs as jobs

pytestmark = pytest.mark.sim


def test_imex_per_job_is_read_from_the_site_checked_as_such_and_each_job_gets_its_channel(sim_factory):
    sim = sim_factory("ssimex", "gb300", 2, "--slurm", "--imex", "per-job")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_slurm_container: docker\n")   # the channels as docker's --device
    head = sim.info["nodes"][0]["name"]
    assert sim.ssh(1, "ls /dev/nvidia-caps-imex-channels 2>/dev/null").stdout.strip() == ""   # nothing standing

    pre = k3("preflight", sim.inventory, "--json")
    assert pre.returncode == 0, pre.stdout[-3000:] + pre.stderr
    results = {(r["host"], r["check"]): r for h in json.loads(pre.stdout)["hosts"].values() for r in h["results"]}
    site = results[(head, "slurm.site")]
    assert site["status"] == "pass" and "Slurm 24.05.3, SwitchType switch/nvidia_imex" in site["observed"]
    assert "IMEX per_job" in site["observed"]
    for node in sim.info["nodes"]:
        imex = results[(node["name"], "nvidia.imex")]
        assert imex["status"] == "pass" and imex["observed"].startswith("IMEX per job: nvidia-imex installed"), imex

    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert "Generated text: " in openai_client(endpoint_of(run.stdout))
    (job,) = jobs(sim)
    channel = f"/dev/nvidia-caps-imex-channels/channel{int(job[0]) % 2047 + 1}"
    for rank in (0, 1):
        got = sim.ssh(rank, "docker inspect k3-engine")
        assert got.returncode == 0, got.stderr
        devices = [str(d) for d in json.loads(got.stdout)[0]["HostConfig"]["Devices"]]
        imex = [d for d in devices if "imex" in d]
        assert imex and all(d.startswith(channel) for d in imex), devices      # the job's channel, not channel 0
    launch = sim.ssh(1, "cat /etc/k3deploy/k3-engine.launch").stdout
    assert "channel0" not in launch and "NVIDIA_IMEX_CHANNELS" in launch

    # --segment: the site's Slurm (24.05, read from the submit host) does not accept it with --nodelist
    sim.set_vars("k3_slurm_segment: true\n")
    refused = deploy(sim.inventory)
    assert refused.returncode == 2, why(refused)
    assert ("k3_slurm_segment: true needs Slurm >= 25.11 (sbatch accepts --segment with --nodelist from 25.11), "
            "the site's Slurm is 24.05: set k3_slurm_segment: auto") in refused.stdout
    assert jobs(sim) == [job]                                               # nothing changed
    sim.set_vars("k3_slurm_segment: auto\n")                                # left out on 24.05: the job is kept
    kept = deploy(sim.inventory)
    assert kept.returncode == 0, why(kept)
    assert jobs(sim) == [job]
    assert "--segment" not in sim.ssh(0, "cat /var/lib/k3deploy/slurm/k3-engine.sbatch").stdout

    # the inventory's word over the site's: a standing domain is asked for, and this site has none
    sim.set_vars("k3_imex: standing\n")
    pre = k3("preflight", sim.inventory, "--json")
    assert pre.returncode == 1, pre.stdout[-3000:] + pre.stderr
    hosts = json.loads(pre.stdout)["hosts"]
    for node in sim.info["nodes"]:
        (imex,) = [r for r in hosts[node["name"]]["results"] if r["check"] == "nvidia.imex"]
        assert imex["status"] == "fail" and "no channel0" in imex["observed"], imex
