"""What the first hour's commands say, on a simulated cluster: an abbreviated engine flag in k3_extra_args warned
by plan and the deploy with its file; history per revision what changed since the one before; status's labelled
digests and why a unit is not as planned after a rollback; plan after a rollback whose variables were set back
(no stale note); a crash-loop failure that does not suggest a rollback when the cause is a node."""

from __future__ import annotations

import json

import pytest

from helpers import deploy, k3, k3_here, why

pytestmark = pytest.mark.sim

ABBREV = "--max-num-seq is an abbreviation argparse expands to --max-num-seqs"


def test_first_hour_reports(sim_factory):
    sim = sim_factory("e47", "gb300", 2)
    sim.set_vars('k3_extra_args: ["--max-num-seq", "64"]\n')
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 3 and f"note: warning: k3_extra_args ({sim.group_vars}): {ABBREV}" in plan.stdout
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    assert f"k3deploy: k3_extra_args ({sim.group_vars}): {ABBREV}" in first.stdout

    sim.set_vars('k3_extra_args: ["--max-num-seqs", "64"]\n')
    assert deploy(sim.inventory).returncode == 0
    revs = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]["revisions"]
    assert revs[1]["changes"] == [f"k3_extra_args: ['--max-num-seq', '64'] -> ['--max-num-seqs', '64'] "
                                  f"({sim.group_vars})"], revs[1]["changes"]

    assert deploy(sim.inventory, "--data", "k3_rollback=true").returncode == 0
    status = k3("status", sim.inventory, check=True).stdout
    assert "as planned: no: runs revision 1, rolled back from 2: the variables ask for other settings" in status
    assert "digest" in status and "local id" in status

    sim.set_vars('k3_extra_args: ["--max-num-seq", "64"]\n')   # the variables set back: nothing to do
    after = k3("plan", sim.inventory, check=False)
    assert after.returncode == 0 and "No changes" in after.stdout and "still ask" not in after.stdout, after.stdout
    assert "runs revision 1, rolled back from 2; the variables describe it" in after.stdout

    # the engine of node 2 exits at every start: the revision that served fails there; the cause is the node. Its
    # docker run takes 15 s to create the container (docker-slow-create): the deploy's stop of the crash-looping
    # unit comes while no container exists (its ExecStop's docker stop finds none), and when the failure is
    # reported the next attempt has not created one yet, so the report says so, whatever the machine's load (the
    # container of an attempt already running was shown instead at times)
    k3_here("sim", "fault", "--name", sim.name, "1:engine-crash", "1:docker-slow-create=15", check=True)
    sim.ssh(1, "systemctl restart k3-engine.service")
    failed = deploy(sim.inventory)
    assert failed.returncode != 0
    assert "so the cause is on" in failed.stdout and "k3_rollback=true" not in failed.stdout, failed.stdout[-3000:]
    assert "No such container" not in failed.stdout, failed.stdout[-3000:]
    assert "(no container k3-engine now" in failed.stdout, failed.stdout[-3000:]
