"""Review before change, on a simulated cluster: a dry run that tells the truth (a failing preflight exits
non-zero with the reason; no engine gets a request), engine flags refused before anything changes, and numbered
revisions: previewed, rolled back to, reported."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from helpers import deploy, k3, k3_here, pyinfra, why

pytestmark = pytest.mark.sim


def dry(inventory: str) -> subprocess.CompletedProcess:
    return pyinfra(inventory, "deploy/k3.py", "--dry", "--diff", timeout=180)


def requests_served(sim, rank: int = 0) -> float:
    metrics = sim.ssh(rank, "curl -s http://127.0.0.1:8000/metrics").stdout
    m = re.search(r"^vllm:request_success_total\{[^}]*\} ([0-9.]+)$", metrics, re.M)
    assert m, metrics
    return float(m.group(1))


def test_review_before_change_on_a_real_run(sim_factory):
    sim = sim_factory("e16", "h200", 2)
    sim.set_vars("k3_strategy: multi_node_tp_dp\n")
    nothing_installed = "test ! -e /etc/k3deploy && test ! -e /etc/systemd/system/k3-engine.service"
    node2 = sim.info["nodes"][1]["name"]

    # an old driver on node 2: the dry run fails, names the node, what it saw and what is required, once
    k3_here("sim", "fault", "--name", sim.name, "1:driver=550.54.15", check=True)
    run = dry(sim.inventory)
    assert run.returncode == 1, why(run)
    assert f"preflight failed on {node2};" in run.stdout
    assert f"[{node2}] nvidia.driver: observed 550.54.15; required >= 580.65.06" in run.stdout
    # the Fabric Manager follows the driver being installed, not the old one
    fm = next(line for line in run.stdout.splitlines() if f"[{node2}] nvidia.fabricmanager" in line)
    assert "after the driver upgrade to r580" in fm and "install nvidia-fabricmanager 550" not in fm
    assert run.stdout.count("nothing was changed") == 2 and "No hosts remaining" not in run.stdout
    assert all(sim.ssh(rank, nothing_installed).returncode == 0 for rank in (0, 1))
    k3_here("sim", "fault", "--name", sim.name, "--clear", check=True)

    # a misspelt engine flag: refused with the right spelling before anything changes
    sim.set_vars('k3_extra_args: ["--max-modle-len", "262144"]\n')
    bad = deploy(sim.inventory)
    assert bad.returncode == 2, why(bad)
    assert "vllm 0.33.0 has no flag --max-modle-len: use --max-model-len" in bad.stdout
    assert all(sim.ssh(rank, nothing_installed).returncode == 0 for rank in (0, 1))
    sim.set_vars("k3_extra_args: []\n")

    # revision 1; the preflight's verdict is in the deploy's output; no router ops without a router
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    assert "k3deploy: preflight passed on 2 host(s)" in first.stdout
    assert "Start router" not in first.stdout and "Router serves" not in first.stdout

    # a dry run after the change sends no request to the engines (nor restarts them)
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "64"]\n')
    before = requests_served(sim)
    pid = sim.ssh(0, "systemctl show -p MainPID --value k3-engine.service").stdout
    review = dry(sim.inventory)
    assert review.returncode == 0, why(review)
    assert "+ --max-num-seqs 64" in review.stdout
    assert requests_served(sim) == before
    assert sim.ssh(0, "systemctl show -p MainPID --value k3-engine.service").stdout == pid

    # revision 2, then a rollback to revision 1: previewed, applied, reported
    second = deploy(sim.inventory)
    assert second.returncode == 0, why(second)
    history = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    assert history["current"] == 2 and [r["number"] for r in history["revisions"]] == [1, 2]
    assert "k3_extra_args" in history["revisions"][1]["variables"]
    preview = k3("plan", sim.inventory, "--rollback", "1", "--json", check=False)
    assert preview.returncode == 3, preview.stdout + preview.stderr
    data = json.loads(preview.stdout)
    assert any("a rollback from revision 2 to revision 1" in n for n in data["notes"])
    argv = [c for h in data["hosts"] for c in h["changes"] if c["kind"] == "argv"]
    assert ("-", "--max-num-seqs 64") in {(c["op"], c["line"]) for c in argv}
    assert all(c["line"].startswith("--max-num-seqs ") for c in argv)  # back to the recipe's own value
    back = deploy(sim.inventory, "--data", "k3_rollback=1")
    assert back.returncode == 0, why(back)
    assert "rollback of group engine from revision 2 to revision 1" in back.stdout
    assert "group engine now runs revision 1 (rolled back)" in back.stdout
    assert "still describe revision 2's settings" in back.stdout
    assert '"--max-num-seqs" "64"' not in sim.ssh(0, "cat /etc/systemd/system/k3-engine.service").stdout
    history = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]
    assert history["current"] == 1
    after = k3("plan", sim.inventory, check=False)
    assert after.returncode == 3 and "runs revision 1, rolled back from 2" in after.stdout
    # where each value came from, in the plan too
    assert f"k3_extra_args = ['--max-num-seqs', '64']  ({sim.group_vars})" in after.stdout
