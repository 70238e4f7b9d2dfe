"""`pyinfra <inventory> deploy/k3.py` on simulated clusters: serving, idempotence, failure, rollback.

Tests that deploy a change of their own to a cluster of the same shape share one (``one_b300``, ``two_gb300``): each
starts from the cluster's own variables (what the test before it set is gone) and asserts on what its own deploy
did, so it holds whether its deploy is the cluster's first rollout or a change of a serving one. The two tests that
assert that a refused first deploy wrote nothing (a pinned digest the registry lacks, a driver below the floor) come
first, each on its cluster's first deploy.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest

from helpers import ROOT, deploy, k3_here, totals, why
from helpers.simulated import Sim, endpoint_of, openai_client

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def b300_tray() -> Iterator[tuple[Sim, str]]:
    sim = Sim("e5h", "b300", 1)
    yield sim, sim.group_vars.read_text()
    sim.down()


@pytest.fixture(scope="module")
def gb300_trays() -> Iterator[tuple[Sim, str]]:
    sim = Sim("e5b", "gb300", 2)
    yield sim, sim.group_vars.read_text()
    sim.down()


@pytest.fixture
def one_b300(b300_tray: tuple[Sim, str]) -> Sim:
    """One B300 tray, shared by the module's tests, with the variables it was brought up with."""
    sim, own = b300_tray
    sim.group_vars.write_text(own)
    return sim


@pytest.fixture
def two_gb300(gb300_trays: tuple[Sim, str]) -> Sim:
    """Two GB300 trays, shared by the module's tests, with the variables they were brought up with."""
    sim, own = gb300_trays
    sim.group_vars.write_text(own)
    return sim


def test_pinned_digest_is_verified(one_b300):
    """The tray's first deploy: an image pinned to a digest the registry lacks is refused in the stage, before any
    unit is written; the right digest deploys that build."""
    import json as _json

    registry = _json.loads((ROOT / "simulator/k3sim/node_tools/usr/lib/k3sim/registry.json").read_text())
    good = registry["vllm/vllm-openai"]["kimi-k3"]["digest"]
    sim = one_b300
    sim.set_vars(f'k3_image: "@sha256:{"0" * 64}"\n')
    bad = deploy(sim.inventory)
    assert bad.returncode != 0 and "Stage | Image" in bad.stdout
    assert sim.ssh(0, "test -e /etc/systemd/system/k3-engine.service && echo present || echo absent").stdout.strip() == "absent"
    sim.group_vars.write_text(sim.group_vars.read_text().replace("0" * 64, good.split(":", 1)[1]))
    ok = deploy(sim.inventory)
    assert ok.returncode == 0, why(ok)
    unit = sim.ssh(0, "cat /etc/systemd/system/k3-engine.service").stdout
    assert f"vllm/vllm-openai:k3-sha256-{good.split(':', 1)[1]}" in unit   # the build, by its digest-named tag


def test_preflight_failure_changes_nothing(two_gb300):
    """The pair's first deploy, with a driver below the floor on the worker: refused before anything changes."""
    sim = two_gb300
    k3_here("sim", "fault", sim.name, "1:driver=570.86.15", check=True)
    try:
        run = deploy(sim.inventory)
    finally:
        k3_here("sim", "fault", sim.name, "--clear", "1:driver", check=True)
    assert run.returncode != 0
    assert "nvidia.driver" in run.stdout and "570.86.15" in run.stdout and "nothing was changed" in run.stdout
    for rank in (0, 1):
        assert sim.ssh(rank, "test -e /etc/systemd/system/k3-engine.service && echo present || echo absent").stdout.strip() == "absent"
        assert sim.ssh(rank, "test -e /etc/k3deploy && echo present || echo absent").stdout.strip() == "absent"


@pytest.mark.parametrize("name, hardware, nodes, strategy, layout, served_units", [
    ("e5a", "b300", 1, "single_node_tp", None, ["k3-engine.service"]),
    ("e5c", "gb200", 4, "multi_node_dep", None, ["k3-engine.service", "k3-engine-router.service"]),
    ("e5d", "h200", 2, "multi_node_tp_dp", None, ["k3-engine.service"]),  # workers made --headless
    ("e5e", "b300", 3, "pd_cluster", "pd:1,2", ["k3-engine-prefill.service", "k3-engine-router.service"]),
])
def test_strategies_serve(sim_factory, tmp_path, name, hardware, nodes, strategy, layout, served_units):
    sim = sim_factory(name, hardware, nodes, *(["--layout", layout] if layout else []))
    sim.set_vars(f"k3_strategy: {strategy}\n")
    if "k3-engine-router.service" in served_units:   # the router's command is checked before anything changes
        sim.set_vars("k3_router_bin: /opt/nowhere/vllm-router\n")
        bad = deploy(sim.inventory)
        assert bad.returncode == 1 and "router.command: observed /opt/nowhere/vllm-router is missing" in bad.stdout
        assert "Stage |" not in bad.stdout
        sim.group_vars.write_text(sim.group_vars.read_text().replace("k3_router_bin: /opt/nowhere/vllm-router\n", ""))
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    success, errors, _ = totals(run.stdout)
    assert errors == 0 and success > 0
    for unit in served_units:
        assert f"{unit} serves at" in run.stdout
    out = openai_client(endpoint_of(run.stdout))
    assert "Kimi-K3" in out
    if layout:   # the P/D router's metrics target, scraped from the control machine as Prometheus would
        k3_here("export", "prometheus", sim.inventory, "-o", str(tmp_path / "prom"), check=True)
        (target,) = json.loads((tmp_path / "prom" / "targets" / "routers.json").read_text())[0]["targets"]
        assert target == f"{sim.info['nodes'][0]['ip']}:29000"          # k3_router_metrics_port on the router node
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as answer:
            scraped = answer.read().decode()
        # vllm-router 0.1.17's own P/D counter (vllm_router_rs::metrics): the chat completion above, on the prefill
        prefill = re.escape(f'{{worker="http://{sim.info["nodes"][0]["ip"]}:')
        assert re.search(rf"^vllm_router_pd_prefill_requests_total{prefill}\d+\"\}} [1-9]", scraped, re.M), scraped
    # every node runs its engine under its own systemd
    for rank in range(nodes):
        state = sim.ssh(rank, "systemctl is-active k3-engine.service k3-engine-prefill.service "
                              "k3-engine-decode.service 2>/dev/null | grep -c '^active'")
        assert state.stdout.strip() == "1", (rank, state.stdout)
        # its env file: vLLM's own address is the node's cluster address; the transport settings are the exact ones
        # derived from its facts, not the recipe's catch-alls
        env = sim.ssh(rank, "cat /etc/k3deploy/k3-engine*.env").stdout
        assert f"VLLM_HOST_IP={sim.info['nodes'][rank]['ip']}\n" in env, env
        assert "UCX_NET_DEVICES=all\n" not in env and all(
            line.startswith("NCCL_SOCKET_IFNAME==") for line in env.splitlines()
            if line.startswith("NCCL_SOCKET_IFNAME=")), env


def test_multi_node_tp_rerun_crash_and_rollback(two_gb300):
    sim = two_gb300
    sim.set_vars("k3_strategy: multi_node_tp\n")
    first = deploy(sim.inventory)
    assert first.returncode == 0, why(first)
    assert "k3-engine.service serves at" in first.stdout
    openai_client(endpoint_of(first.stdout))
    pid_before = sim.ssh(0, "systemctl show -p MainPID --value k3-engine.service").stdout.strip()

    # nothing changed: no changes reported, nothing restarted
    again = deploy(sim.inventory)
    assert again.returncode == 0
    success, errors, nochange = totals(again.stdout)
    assert (success, errors) == (0, 0) and nochange > 0
    assert sim.ssh(0, "systemctl show -p MainPID --value k3-engine.service").stdout.strip() == pid_before

    # a change that crashes the worker's engine: the rollout stops, names the worker, shows its logs
    k3_here("sim", "fault", "--name", "e5b", "1:engine-crash", check=True)
    sim.set_vars('k3_extra_args: ["--max-num-seqs", "4"]\n')
    try:   # the fault is cleared whatever this part finds: the next test on this cluster gets its engines back
        bad = deploy(sim.inventory)
        assert bad.returncode != 0
        assert "worker rank 1 on e5b-node2" in bad.stdout and "failed during start" in bad.stdout, why(bad)
        # reported by the node that failed, with its own logs; the head says why it stops, and only that
        assert "[e5b-node2] worker rank 1 on e5b-node2 (" in bad.stdout
        assert "[e5b-node1] group engine stopped because worker rank 1 on e5b-node2 failed" in bad.stdout
        assert "[e5b-node1] worker rank 1" not in bad.stdout and "[e5b-node1] --- journalctl" not in bad.stdout
        assert "journalctl -u k3-engine.service" in bad.stdout and "EngineCore failed to start" in bad.stdout
        # the whole group is stopped, not half of it
        for rank in (0, 1):
            assert sim.ssh(rank, "systemctl is-active k3-engine.service").stdout.strip() in ("inactive", "failed")
        assert "--max-num-seqs" in sim.ssh(0, "cat /etc/systemd/system/k3-engine.service").stdout
    finally:
        k3_here("sim", "fault", "--name", "e5b", "--clear", check=True)

    # rollback brings the previous version back, in order
    back = deploy(sim.inventory, "--data", "k3_rollback=true")
    assert back.returncode == 0, why(back)
    assert "--max-num-seqs" not in sim.ssh(0, "cat /etc/systemd/system/k3-engine.service").stdout
    assert sim.ssh(1, "systemctl is-active k3-engine.service").stdout.strip() == "active"
    openai_client(endpoint_of(back.stdout))


NASTY = "it's \"quoted\" $HOME ${X} 100% %n back\\slash"


def test_argv_reaches_the_container_byte_for_byte(one_b300):
    """Spaces, quotes, $, % and backslashes survive systemd's parsing (and docker's): the engine sees the plan."""
    import json as _json

    from k3deploy.runtime.gather import gather
    from k3deploy.runtime.views import INVENTORY_ONLY

    sim = one_b300
    value = _json.dumps({"note": NASTY})
    sim.set_vars("k3_extra_args: " + _json.dumps(["--override-generation-config", value]) + "\n")
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    planned = gather(sim.inventory, INVENTORY_ONLY).require_rollout().units[0].node.argv
    inspected = _json.loads(sim.ssh(0, "docker inspect --format '{{json .Args}}' k3-engine").stdout)
    assert inspected == planned[2:]  # the image's entrypoint is `vllm serve`
    assert value in inspected


def test_ascend_runs_through_a_login_shell(sim_factory):
    sim = sim_factory("e5i", "ascend_910c", 4)
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert "k3-engine.service serves at" in run.stdout
    unit = sim.ssh(1, "cat /etc/systemd/system/k3-engine.service").stdout
    assert '"--entrypoint" "bash"' in unit and "set_env.sh" in unit and '"/dev/davinci15"' in unit
    openai_client(endpoint_of(run.stdout), "Eco-Tech/Kimi-K3-w4a8")


def test_secrets_stay_in_0600_files(one_b300, tmp_path):
    token = tmp_path / "hf-token"
    token.write_text("hf_SECRETtokenVALUE123\n")
    token.chmod(0o600)
    sim = one_b300
    sim.set_vars(f"k3_hf_token_file: {token}\n")
    run = deploy(sim.inventory, "-v")
    assert run.returncode == 0, why(run)
    assert "hf_SECRETtokenVALUE123" not in run.stdout
    mode = sim.ssh(0, "stat -c %a /etc/k3deploy/hf-token /etc/k3deploy/k3-engine.env").stdout.split()
    assert mode == ["600", "600"]
    leaks = sim.ssh(0, "grep -rl hf_SECRETtokenVALUE123 /etc/systemd /etc/k3deploy/k3-engine.env; "
                       "journalctl --no-pager | grep -c hf_SECRETtokenVALUE123").stdout.split()
    assert leaks == ["0"]


def test_argv_derived_values_follow_k3_extra_args_as_vllm_reads_them(two_gb300):
    """A served model name and a port set through k3_extra_args (the last occurrence wins, ``--flag=value`` too):
    readiness, the smoke test and the endpoint all use them."""
    sim = two_gb300
    sim.set_vars('k3_strategy: multi_node_tp\n'
                 'k3_extra_args: ["--served-model-name", "old-name", "--served-model-name=k3-prod", "--port=8100"]\n')
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    head = sim.info["nodes"][0]["ip"]
    assert f"k3-engine.service serves at http://{head}:8100" in run.stdout
    assert re.search(r"smoke test: http://[0-9.]+:8100 answered '.+' as 'k3-prod'", run.stdout), why(run)
    assert "k3-prod" in openai_client(endpoint_of(run.stdout), model="k3-prod")
