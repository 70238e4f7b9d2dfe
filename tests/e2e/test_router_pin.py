"""``k3_router_image`` pinned to a digest on the simulated cluster, as the engine image is: two replicas behind the
router, the router run from the simulated registry's ``vllm/vllm-router:v0.1.17``; plan names the build the tag names,
the deploy pulls it by digest on the router's host and runs it by its digest-named tag, the router's revision records
it; a re-push of the tag is a change of the router, and the next run runs the new build."""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, deploy, k3, plan_json, why
from k3deploy.model.images import run_ref

pytestmark = pytest.mark.sim

ROUTER = "vllm/vllm-router:v0.1.17"
REPO = "vllm/vllm-router"


def router_image(sim) -> str:
    """What the router's container runs on its host (replica 0's head, the first node)."""
    out = sim.ssh(0, "docker ps --format '{{.Image}}'")
    assert out.returncode == 0, out.stderr
    found = [line for line in out.stdout.split() if line.startswith(f"{REPO}:")]
    assert len(found) == 1, out.stdout
    return found[0]


def test_the_router_image_is_pinned_to_its_digest_and_a_re_push_is_a_change_of_the_router(sim_factory):
    registry = json.loads((ROOT / "simulator/k3sim/node_tools/usr/lib/k3sim/registry.json").read_text())
    first = registry[REPO]["v0.1.17"]["digest"]
    sim = sim_factory("lerpin", "h200", 4, "--replicas", "2")
    sim.set_vars(f"k3_router_image: {ROUTER}\n")

    rc, plan = plan_json(sim.inventory)
    assert rc == 3
    assert any(f"router image {ROUTER} is {first} in the registry" in note for note in plan["notes"]), plan["notes"]
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"router image {ROUTER} is {first} in the registry" in run.stdout
    assert router_image(sim) == run_ref(f"{REPO}@{first}")
    rc, plan = plan_json(sim.inventory)                          # the tag did not move: nothing to do
    assert rc == 0 and plan["changes_pending"] is False, plan

    # the tag pushed again upstream: the router's unit changes (the engines' do not), the next run runs the new build
    second = k3("sim", "push", sim.name, ROUTER, check=True).stdout.strip()
    assert second.startswith("sha256:") and second != first
    rc, plan = plan_json(sim.inventory)
    assert rc == 3 and any(second in note for note in plan["notes"]), plan["notes"]
    changed = {(h["host"], c["unit"]) for h in plan["hosts"] for c in h["changes"] if c.get("unit")}
    assert changed and all("router" in unit for _, unit in changed), changed
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert router_image(sim) == run_ref(f"{REPO}@{second}")
    history = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["router"]["revisions"]
    assert [(rev["image"], rev["tag"]) for rev in history][-2:] == [(f"{REPO}@{first}", ROUTER),
                                                                    (f"{REPO}@{second}", ROUTER)]
