"""Hot spares under ``k3_launcher: slurm``, on one simulated cluster under a real Slurm (``sim up --slurm``: 2 GB300
trays ``multi_node_tp`` and one spare): a tray of the serving group gets a fatal XID (79, fallen off the bus); the
next deploy run quarantines it and rebuilds the group's job around the spare: the old job is cancelled, the new one
runs on the head and the spare (``--nodelist``), with a new revision in its ``--comment``, the quarantined tray left
out, and the endpoint answers through it. The time from the fault to the answer is printed (``pytest -s``)."""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import deploy, k3, k3_here, why
from helpers.simulated import Sim, endpoint_of, openai_client
from helpers.simulated import slurm_jobs as jobs

pytestmark = [pytest.mark.sim, pytest.mark.faults]

COMMENT = re.compile(r"k3deploy:engine:[0-9a-f]{16}")


def nodelist(sim: Sim, job: str) -> str:
    """The nodes Slurm gave ``job`` (``squeue -j JOB -o %N``), as a sorted comma-separated list."""
    out = sim.ssh(0, f"scontrol show hostnames $(squeue -h -j {job} -o %N)")
    assert out.returncode == 0, out.stderr
    return ",".join(sorted(out.stdout.split()))


def test_a_quarantined_tray_s_job_is_rebuilt_around_the_spare(sim_factory):
    sim = sim_factory("ssspare", "gb300", 2, "--slurm", "--spares", "1")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_link_timeout: 10\n")
    node1, node2, spare = (n["name"] for n in sim.info["nodes"])
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    (before,) = jobs(sim)
    assert before[1:3] == ["k3-engine", "RUNNING"] and COMMENT.fullmatch(before[3]), before
    assert nodelist(sim, before[0]) == ",".join(sorted([node1, node2]))

    t0 = time.time()
    k3_here("sim", "fault", "--name", sim.name, "1:xid=79", check=True)
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"{spare} takes {node2}'s place: rank 1 of group engine (quarantined: XID 79" in run.stdout
    answer = openai_client(endpoint_of(run.stdout))
    seconds = time.time() - t0
    print(f"\nXID 79 on {node2} -> serving again through the spare's job (one deploy run, the OpenAI client's "
          f"answer): {seconds:.1f} s")
    assert "Generated text: " in answer

    (after,) = jobs(sim)                                  # one job: the old one cancelled, the new one running
    assert after[1:3] == ["k3-engine", "RUNNING"] and COMMENT.fullmatch(after[3]), after
    assert after[0] != before[0] and after[3] != before[3]          # a new job, another revision
    assert nodelist(sim, after[0]) == ",".join(sorted([node1, spare]))   # the spare in, the quarantined tray out
    st = json.loads(k3("status", sim.inventory, "--json").stdout)
    assert st["verdict"] == "serving", st
    assert [(u["host"], u["rank"]) for g in st["groups"] for u in g["units"]] == [(node1, 0), (spare, 1)]
    assert [(s["lost"], s["spare"]) for s in st["spares"]["substitutions"]] == [(node2, spare)]

    again = deploy(sim.inventory)                         # a re-run leaves the rebuilt job alone
    assert again.returncode == 0, why(again)
    assert jobs(sim) == [after]
