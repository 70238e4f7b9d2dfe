"""At the sizes sites run: a full GB300 NVL72 rack of 18 trays as one multi_node_dep group (DP72 behind one
endpoint), and a P/D cluster with pools of several nodes (prefill 4 + decode 8 + router), each answered by the
recipe guide's OpenAI client; a plan afterwards changes nothing."""

from __future__ import annotations

import json

import pytest

from helpers import deploy, k3, why
from helpers.simulated import endpoint_of, openai_client

pytestmark = pytest.mark.sim


def plan_is_empty(inventory: str) -> None:
    proc = k3("plan", inventory, "--json", check=False)
    assert proc.returncode == 0, why(proc) + proc.stderr
    data = json.loads(proc.stdout)
    assert data["restart_order"] == [] and not any(h["changes"] for h in data["hosts"])


def test_a_full_nvl72_rack_serves_dp72_behind_one_endpoint(sim_factory):
    sim = sim_factory("e11r", "gb300", 18, "--strategy", "multi_node_dep")
    run = deploy(sim.inventory, timeout=600)
    assert run.returncode == 0, why(run)
    assert "18 nodes: beyond the 16 nodes the recipes builder renders" in run.stdout
    assert run.stdout.count("k3-engine.service serves at") == 18  # hybrid LB: every tray serves its DP ranks
    assert "k3-engine-router.service serves at" in run.stdout
    endpoint = endpoint_of(run.stdout)
    assert endpoint.endswith(":30000")
    openai_client(endpoint)
    head = sim.ssh(0, "grep -o '\"--data-parallel-size\" \"[0-9]*\"' /etc/systemd/system/k3-engine.service")
    assert head.stdout.strip() == '"--data-parallel-size" "72"'
    plan_is_empty(sim.inventory)


def test_pd_pools_of_several_nodes_serve_behind_the_router(sim_factory):
    sim = sim_factory("e11p", "b300", 12, "--layout", "pd:4,8")
    run = deploy(sim.inventory, timeout=600)
    assert run.returncode == 0, why(run)
    assert "k3-engine-prefill.service serves at" in run.stdout
    assert "k3-engine-router.service serves at" in run.stdout
    openai_client(endpoint_of(run.stdout))
    plan_is_empty(sim.inventory)
