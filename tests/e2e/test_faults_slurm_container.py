"""A Slurm site whose node lacks the container runtime the deploy runs the jobs with (``sim up --slurm``, fault
``no-enroot`` on the worker): preflight's ``slurm.container`` (the Slurm launcher's check) fails that node in one line
(what it lacks, what is required, the fix), and the deploy stops there, before anything is staged, configured or
submitted: no job, no launch script anywhere. With the runtime the site does have (``k3_slurm_container: docker``)
the next run serves."""

from __future__ import annotations

import pytest

from helpers import deploy, preflight, result, why
from helpers.simulated import endpoint_of, openai_client

pytestmark = [pytest.mark.sim, pytest.mark.faults]


def test_a_node_without_enroot_fails_the_stage_and_nothing_is_submitted(sim_factory):
    sim = sim_factory("pxnoenr", "gb300", 2, "--slurm", "--fault", "1:no-enroot")
    sim.set_vars("k3_strategy: multi_node_tp\n")
    worker = sim.info["nodes"][1]["name"]

    rc, report = preflight(sim.inventory)
    assert rc == 1, report
    seen = result(report, worker, "slurm.container")
    assert seen["status"] == "fail" and seen["observed"] == "k3_slurm_container: pyxis: no enroot on PATH", seen
    assert seen["required"].startswith("enroot on every engine node") and "install enroot and pyxis" in seen["fix"]
    assert result(report, sim.info["nodes"][0]["name"], "slurm.container")["status"] == "pass"

    bad = deploy(sim.inventory)
    assert bad.returncode != 0, why(bad)
    line = next((ln for ln in bad.stdout.splitlines() if "k3_slurm_container: pyxis: no enroot on PATH" in ln), "")
    assert worker in line and "slurm.container" in line, bad.stdout[-3000:]
    # nothing half-applied: no job was submitted, no node got a launch script
    assert sim.ssh(0, "squeue -h").stdout.strip() == ""
    for rank in (0, 1):
        assert sim.ssh(rank, "test -e /etc/k3deploy/k3-engine.launch").returncode != 0

    sim.set_vars("k3_slurm_container: docker\n")
    good = deploy(sim.inventory)
    assert good.returncode == 0, why(good)
    assert "Kimi-K3" in openai_client(endpoint_of(good.stdout))
