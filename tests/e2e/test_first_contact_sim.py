"""Simulated clusters deploy as created: ``sim up`` without ``--strategy`` writes the recommended strategy
that fits its node count (mi355x x 2: the recommendation single_node_tp runs on one node), and a P/D layout at the
pool sizes ``options`` lists deploys without editing anything."""

from __future__ import annotations

import pytest

from helpers import deploy, why
from helpers.simulated import endpoint_of, openai_client

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("name, hardware, nodes, layout, strategy", [
    ("e27a", "mi355x", 2, None, "multi_node_tp"),
    ("e27p", "b300", 3, "pd:1,2", "pd_cluster"),
])
def test_a_cluster_deploys_as_created(sim_factory, name, hardware, nodes, layout, strategy):
    sim = sim_factory(name, hardware, nodes, *(["--layout", layout] if layout else []))
    assert f"k3_strategy: {strategy}\n" in sim.group_vars.read_text()
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert "Kimi-K3" in openai_client(endpoint_of(run.stdout))
