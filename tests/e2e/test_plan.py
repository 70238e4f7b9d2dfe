"""``k3deploy plan`` and ``pyinfra ... --dry --diff`` on a simulated cluster: never deployed, deployed, one
variable changed, secrets masked, an unreachable node."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import ROOT, deploy, k3, k3_here, plan_json, pyinfra, why

pytestmark = pytest.mark.sim

FAKE_TOKEN = "hf_k3deployFAKEtoken0123456789abcdef"
#: the build the simulated registry's vllm/vllm-openai:kimi-k3 names (the rollout pins the tag to it)
KIMI_K3_DIGEST = json.loads((ROOT / "simulator/k3sim/node_tools/usr/lib/k3sim/registry.json").read_text())[
    "vllm/vllm-openai"]["kimi-k3"]["digest"]


def dry_diff(inventory: str) -> subprocess.CompletedProcess:
    return pyinfra(inventory, "deploy/k3.py", "--dry", "--diff", timeout=120)


def test_plan_and_dry_diff_follow_the_cluster(sim_factory, tmp_path):
    sim = sim_factory("e6p", "gb300", 2)
    base = sim.group_vars.read_text() + "k3_strategy: multi_node_tp\n"
    sim.group_vars.write_text(base)
    head, worker = (n["name"] for n in sim.info["nodes"])
    token = tmp_path / "hf-token"
    token.write_text(FAKE_TOKEN + "\n")
    token.chmod(0o600)

    # never deployed: everything is a change, both units restart, head first
    rc, data = plan_json(sim.inventory)
    assert rc == 3
    assert data["restart_order"] == [f"{head}:k3-engine.service", f"{worker}:k3-engine.service"]
    by_host = {h["host"]: h for h in data["hosts"]}
    assert (by_host[head]["role"], by_host[head]["rank"]) == ("head", 0)
    assert (by_host[worker]["role"], by_host[worker]["rank"]) == ("worker", 1)
    for h in data["hosts"]:
        kinds = {c["kind"] for c in h["changes"]}
        assert {"file", "image", "argv", "env", "restart"} <= kinds
        image = next(c for c in h["changes"] if c["kind"] == "image")
        assert image["from"] is None and image["to"] == f"vllm/vllm-openai:k3-sha256-{KIMI_K3_DIGEST[7:]}"  # its build

    # --dry --diff on the never-deployed cluster, with a token file: diffs shown, token never
    sim.group_vars.write_text(base + f"k3_hf_token_file: {token}\n")
    dry = dry_diff(sim.inventory)
    assert dry.returncode == 0, why(dry)
    assert FAKE_TOKEN not in dry.stdout
    for host in (head, worker):
        assert f"[{host}] Will create /etc/k3deploy/k3-engine.env" in dry.stdout
        assert f"[{host}] Will create /etc/systemd/system/k3-engine.service" in dry.stdout
        assert f"[{host}] Will create /etc/k3deploy/hf-token (secret: contents not shown)" in dry.stdout
    # per variable and per flag, as the plan shows them
    assert "+ HF_HUB_OFFLINE=1" in dry.stdout and "+ --node-rank 1" in dry.stdout

    # deployed: no changes (exit 0)
    sim.group_vars.write_text(base)
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    rc, data = plan_json(sim.inventory)
    assert rc == 0 and data["restart_order"] == [] and all(not h["changes"] for h in data["hosts"])
    text = k3("plan", sim.inventory, check=False)
    assert text.returncode == 0 and "No changes" in text.stdout

    # one variable changed: exactly that argv line on each engine node (and, the flag being among what the engine's
    # compile caches are keyed by, each cache variable moved to the new key's directory); the group restarts head
    # first
    changed = base + 'k3_extra_args: ["--max-num-seqs", "64"]\n'
    sim.group_vars.write_text(changed)
    rc, data = plan_json(sim.inventory)
    assert rc == 3
    assert data["restart_order"] == [f"{head}:k3-engine.service", f"{worker}:k3-engine.service"]
    for h in data["hosts"]:
        files = [c for c in h["changes"] if c["kind"] != "restart"]
        caches = [c for c in files if c["kind"] == "env"]
        assert [c for c in files if c["kind"] != "env"] == [
            {"kind": "argv", "unit": "k3-engine.service", "op": "+", "line": "--max-num-seqs 64"}]
        assert caches and {c["name"] for c in caches} >= {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"}, caches
        assert all(c["op"] == "~" and "/k3-compile/" in c["from"] and c["from"] != c["to"]
                   and c["to"].split("/k3-compile/")[1].split("/")[0] != c["from"].split("/k3-compile/")[1].split("/")[0]
                   for c in caches), caches
        restart = [c for c in h["changes"] if c["kind"] == "restart"]
        assert [(c["position"], c["reason"]) for c in restart] == [(1 if h["host"] == head else 2, "its files change")]

    # a secret in an installed env file: masked in plan and in --dry --diff
    assert sim.ssh(0, f"echo HF_TOKEN={FAKE_TOKEN} >> /etc/k3deploy/k3-engine.env").returncode == 0
    sim.group_vars.write_text(changed + f"k3_hf_token_file: {token}\n")
    dry = dry_diff(sim.inventory)
    assert dry.returncode == 0, why(dry)
    assert FAKE_TOKEN not in dry.stdout
    assert f"[{head}] Will modify /etc/k3deploy/k3-engine.env" in dry.stdout and "- HF_TOKEN=****" in dry.stdout
    assert "+ --max-num-seqs 64" in dry.stdout
    assert not any(line.lstrip().startswith(("-ExecStart=", "+ExecStart=")) for line in dry.stdout.splitlines())
    plan = k3("plan", sim.inventory, check=False)
    assert plan.returncode == 3 and FAKE_TOKEN not in plan.stdout and "- HF_TOKEN=****" in plan.stdout
    rc, data = plan_json(sim.inventory)
    env = [c for h in data["hosts"] for c in h["changes"] if c["kind"] == "env" and "/k3-compile/" not in str(c["from"])]
    assert env == [{"kind": "env", "unit": "k3-engine.service", "op": "-", "name": "HF_TOKEN", "from": "****",
                    "to": None}]

    # deploy the change: a second plan shows none
    sim.group_vars.write_text(changed)
    second = deploy(sim.inventory)
    assert second.returncode == 0, why(second)
    rc, data = plan_json(sim.inventory)
    assert rc == 0 and data["restart_order"] == []

    # an unreachable node: exit 2, the node and the reason named
    k3_here("sim", "fault", "--name", sim.name, "1:sshd-down", check=True)
    down = k3("plan", sim.inventory, check=False)
    assert down.returncode == 2
    assert worker in down.stderr and "cannot reach" in down.stderr and "Traceback" not in down.stderr
