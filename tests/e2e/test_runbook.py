"""The runbook is proven by running it: its command blocks, executed in order over SSH on a fresh simulated
cluster, bring the cluster to serving."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from k3deploy.cluster.runbook import blocks

from .conftest import k3, skip_no_sim

pytestmark = [pytest.mark.sim, skip_no_sim]

FAKE_TOKEN = "hf_runbookE2EfakeTOKEN0123456789"


def _ssh(sim, host: str) -> list[str]:
    d = Path(sim.inventory).parent
    ip = next(n["ip"] for n in sim.info["nodes"] if n["name"] == host)
    return ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o",
            "BatchMode=yes", f"root@{ip}"]


def run_block(sim, node: str, script: str) -> subprocess.CompletedProcess:
    if node == "control":
        return subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=300)
    return subprocess.run([*_ssh(sim, node), "bash -e -c " + shlex.quote(script)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name, hardware, nodes, strategy, layout", [
    ("e6r", "gb300", 2, "multi_node_tp", None),
    ("e6s", "b300", 3, "pd_cluster", "pd:1,2"),
])
def test_runbook_brings_a_fresh_cluster_to_serving(sim_factory, tmp_path, name, hardware, nodes, strategy, layout):
    sim = sim_factory(name, hardware, nodes, *(["--layout", layout] if layout else []))
    token = tmp_path / "hf-token"
    token.write_text(FAKE_TOKEN + "\n")
    token.chmod(0o600)
    sim.set_vars(f"k3_strategy: {strategy}\nk3_hf_token_file: {token}\n")
    out = tmp_path / "runbook.md"
    k3("runbook", sim.inventory, "-o", str(out))
    text = out.read_text()
    assert FAKE_TOKEN not in text and str(token) in text
    steps = [b for b in blocks(text) if b.when is None]
    hosts = {n["name"] for n in sim.info["nodes"]}
    assert {b.node for b in steps} == hosts | {"control"}  # every node has work, nothing runs elsewhere
    # nothing is installed before the runbook runs
    assert sim.ssh(0, "systemctl is-active k3-engine.service").stdout.strip() != "active"
    for i, b in enumerate(steps):
        res = run_block(sim, b.node, b.text)
        assert res.returncode == 0, f"block {i} on {b.node} failed:\n{b.text}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
    # the token reached each engine node by reference, 0600, and was used by the weights download
    for rank in range(nodes):
        got = sim.ssh(rank, "stat -c %a /etc/k3deploy/hf-token && cat /etc/k3deploy/hf-token")
        assert got.stdout.split() == ["600", FAKE_TOKEN], got.stdout + got.stderr
    # what the runbook installed is what the deploy would install: plan sees no difference
    plan = k3("plan", sim.inventory, "--json", check=False)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    endpoint = json.loads(plan.stdout)["endpoint"]
    models = sim.ssh(0, f"curl -sf {endpoint}/v1/models")
    assert "moonshotai/Kimi-K3" in models.stdout
    chat = sim.ssh(0, f"curl -sf -H 'Content-Type: application/json' -d "
                      f"'{{\"model\":\"moonshotai/Kimi-K3\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' "
                      f"{endpoint}/v1/chat/completions")
    assert '"choices"' in chat.stdout
    for rank in range(nodes):
        active = sim.ssh(rank, "systemctl is-active k3-engine.service k3-engine-prefill.service "
                               "k3-engine-decode.service 2>/dev/null | grep -c '^active'")
        assert active.stdout.strip() == "1", (rank, active.stdout)
