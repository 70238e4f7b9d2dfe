"""Day 2 on the simulated cluster: `status` says serving / degraded / down with the exit code automation reads,
and `bundle` writes one file with what support needs and no secret.

The tests share one cluster of two GB300 trays: the first finds it with nothing installed; the second starts from
the cluster's own variables and deploys its own change of them.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator

import pytest

from helpers import ROOT, deploy, k3, member, why
from helpers.simulated import Sim

pytestmark = pytest.mark.sim

TOKEN = "hf_bundleE2EsecretTOKEN987654321"


@pytest.fixture(scope="module")
def trays() -> Iterator[tuple[Sim, str]]:
    """Two GB300 trays, shared by the module's tests, and the variables they were brought up with."""
    sim = Sim("d2s", "gb300", 2)
    yield sim, sim.group_vars.read_text()
    sim.down()


def test_status_and_a_support_bundle_of_a_serving_cluster(trays, tmp_path):
    sim, _ = trays
    token = tmp_path / "hf-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    sim.set_vars(f"k3_strategy: multi_node_tp\nk3_stage: per_node\nk3_hf_token_file: {token}\n"
                 "k3_extra_env: {MY_API_KEY: keep-out}\n")
    before = k3("status", sim.inventory, "--json", check=False)
    assert before.returncode == 1 and json.loads(before.stdout)["verdict"] == "down"   # nothing installed yet
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)

    ok = k3("status", sim.inventory, "--json", check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    st = json.loads(ok.stdout)
    assert st["verdict"] == "serving" and st["endpoint_models"] == ["moonshotai/Kimi-K3"]
    units = {u["host"]: u for g in st["groups"] for u in g["units"]}
    head, worker = (units[n["name"]] for n in sim.info["nodes"])
    assert head["verdict"] == "serving" and head["health"] == 200 and head["matches_plan"] is True
    digest = json.loads((ROOT / "simulator/k3sim/node_tools/usr/lib/k3sim/registry.json").read_text())[
        "vllm/vllm-openai"]["kimi-k3"]["digest"]
    assert worker["verdict"] == "running" and worker["image"] == f"vllm/vllm-openai@{digest}"   # the tag's build
    text = k3("status", sim.inventory, check=False).stdout
    assert "cluster: serving" in text and "group engine: serving" in text

    out = tmp_path / "support.tar.gz"
    k3("bundle", sim.inventory, "-o", str(out), check=True)
    with tarfile.open(out) as tar:
        names = tar.getnames()
        blob = b"".join(member(tar, m) for m in tar.getmembers() if m.isfile())
    assert TOKEN.encode() not in blob and b"keep-out" not in blob   # no secret, by value or by name
    for host in units:
        assert f"k3deploy-bundle/hosts/{host}/facts.json" in names
        assert f"k3deploy-bundle/hosts/{host}/k3-engine.service.unit" in names
        assert f"k3deploy-bundle/hosts/{host}/k3-engine.service.env" in names
        assert f"k3deploy-bundle/hosts/{host}/k3-engine.service.journal.log" in names
    assert {"k3deploy-bundle/VERSION", "k3deploy-bundle/plan.json", "k3deploy-bundle/status.json",
            "k3deploy-bundle/preflight.json", "k3deploy-bundle/variables.json"} <= set(names)
    with tarfile.open(out) as tar:
        journal = member(tar, f"k3deploy-bundle/hosts/{head['host']}/k3-engine.service.journal.log")
        env = member(tar, f"k3deploy-bundle/hosts/{head['host']}/k3-engine.service.env").decode()
    assert b"Started" in journal or b"k3-engine" in journal
    assert "MY_API_KEY=****" in env

    sim.ssh(1, "systemctl stop k3-engine.service")
    down = k3("status", sim.inventory, "--json", check=False)
    assert down.returncode == 1
    st = json.loads(down.stdout)
    assert st["verdict"] in ("degraded", "down")
    assert {u["host"]: u["verdict"] for g in st["groups"] for u in g["units"]}[worker["host"]] == "down"


def test_a_group_whose_member_restarted_is_repaired_by_the_next_run(trays):
    """Without self-healing (k3_heal: false), a worker's engine dies and systemd restarts it on its own: the group
    may be wedged (headless engines do not recover when a peer restarts, vllm#32136), so the next run restarts the
    group in order; then nothing."""
    sim, own = trays
    sim.group_vars.write_text(own)
    sim.set_vars("k3_strategy: multi_node_tp\nk3_stage: per_node\nk3_heal: false\n")
    assert deploy(sim.inventory).returncode == 0
    assert json.loads(k3("plan", sim.inventory, "--json", check=False).stdout)["changes_pending"] is False
    sim.ssh(1, "systemctl kill --signal=SIGKILL k3-engine.service")
    worker = sim.info["nodes"][1]["name"]

    def restarts() -> int:
        return int(sim.ssh(1, "systemctl show -p NRestarts --value k3-engine.service").stdout.strip() or 0)

    import time

    deadline = time.monotonic() + 60
    while restarts() == 0 and time.monotonic() < deadline:
        time.sleep(1)
    assert restarts() > 0
    plan = k3("plan", sim.inventory, "--json", check=False)
    assert plan.returncode == 3, why(plan)
    reasons = {h["host"]: [c["reason"] for c in h["changes"] if c["kind"] == "restart"]
               for h in json.loads(plan.stdout)["hosts"]}
    assert any("restarted" in r and "wedged" in r for r in reasons[worker]), reasons
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert restarts() == 0    # an explicit start resets systemd's counter
    after = k3("plan", sim.inventory, "--json", check=False)
    assert after.returncode == 0 and json.loads(after.stdout)["changes_pending"] is False
    assert k3("status", sim.inventory, check=False).returncode == 0
