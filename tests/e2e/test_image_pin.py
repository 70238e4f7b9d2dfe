"""One build per rollout on the simulated cluster: the image's mutable tag is resolved to the digest the registry
names once per rollout, and every node of the group runs that digest, whatever build of the tag each node held
before (a re-push upstream, a replaced node). Plan, status and history show the digest; a re-push is a change the
next rollout takes to the whole group; a rollback goes back to the exact build."""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, deploy, k3, plan_json, why
from k3deploy.model.images import run_ref

pytestmark = pytest.mark.sim

IMAGE = "vllm/vllm-openai:kimi-k3"
REPO = "vllm/vllm-openai"


def running(sim, rank: int) -> tuple[str, str]:
    """(the reference, the image id) the node's engine container runs."""
    out = sim.ssh(rank, "docker inspect --format '{{.Config.Image}} {{.Image}}' k3-engine")
    assert out.returncode == 0, out.stderr
    ref, iid = out.stdout.split()
    return ref, iid


def image_id(sim, rank: int, ref: str) -> str:
    out = sim.ssh(rank, f"docker image inspect --format '{{{{.Id}}}}' {ref}")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_every_node_runs_the_one_build_the_tag_names_at_the_start_of_the_rollout(sim_factory):
    registry = json.loads((ROOT / "simulator/k3sim/node_tools/usr/lib/k3sim/registry.json").read_text())
    first = registry[REPO]["kimi-k3"]["digest"]
    sim = sim_factory("pin", "h200", 2)
    sim.set_vars("k3_strategy: multi_node_tp\n")
    nodes = [n["name"] for n in sim.info["nodes"]]
    # node 1 pulled the tag's build of the day; the tag is pushed again upstream; node 2 (a replacement) pulls it
    # then: the two nodes hold different builds under the same tag
    assert sim.ssh(0, f"docker pull -q {IMAGE}").returncode == 0
    second = k3("sim", "push", sim.name, IMAGE, check=True).stdout.strip()
    assert second.startswith("sha256:") and second != first
    assert sim.ssh(1, f"docker pull -q {IMAGE}").returncode == 0
    # node 1 keeps images with the classic store (Docker Engine up to 28): a loaded image has no repo digest there
    assert sim.ssh(0, "mkdir -p /etc/docker && echo '{\"features\": {\"containerd-snapshotter\": false}}' "
                      "> /etc/docker/daemon.json").returncode == 0
    build = image_id(sim, 1, f"{REPO}@{second}")

    rc, plan = plan_json(sim.inventory)                 # the plan names the build: the digest the tag names now
    assert rc == 3 and plan["image"]["digest"] == second and plan["image"]["image"] == f"{REPO}@{second}"
    assert any(second in note for note in plan["notes"]), plan["notes"]
    for h in plan["hosts"]:                   # the units run it by a local tag named after the digest
        change = next(c for c in h["changes"] if c["kind"] == "image")
        assert change["to"] == run_ref(f"{REPO}@{second}") == f"{REPO}:k3-sha256-{second[7:]}"
    text = k3("plan", sim.inventory, check=False).stdout
    assert f"image {IMAGE} is {second} in the registry" in text and f"-> {REPO}@{second}" in text   # as people read it

    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    assert f"image {IMAGE} is {second} in the registry" in run.stdout
    # one build, not one per node: node 1 got it from node 2 (checked by its image id, as it has no repo digest)
    assert [running(sim, r) for r in (0, 1)] == [(run_ref(f"{REPO}@{second}"), build)] * 2
    assert sim.ssh(0, f"docker image inspect {REPO}@{second}").returncode != 0    # the classic store on node 1
    assert [image_id(sim, r, IMAGE) for r in (0, 1)] == [build] * 2    # the tag on every node names that build

    rc, plan = plan_json(sim.inventory)                 # the tag did not move: nothing to do
    assert rc == 0 and plan["changes_pending"] is False, plan
    st = json.loads(k3("status", sim.inventory, "--json", check=False).stdout)
    units = [u for g in st["groups"] for u in g["units"]]
    assert [u["image"] for u in units] == [f"{REPO}@{second}"] * 2 and all(u["matches_plan"] for u in units)
    text = k3("status", sim.inventory, check=False).stdout      # the table: repository and labelled short digest
    assert text.count(f"{REPO}@{second[:19]}") == 2, text   # REPO@sha256:DIGEST, cut to 12 hex digits

    # the tag is pushed again: a change of the whole group, rolled out together
    third = k3("sim", "push", sim.name, IMAGE, check=True).stdout.strip()
    rc, plan = plan_json(sim.inventory)
    assert rc == 3 and plan["image"]["digest"] == third
    assert plan["restart_order"] == [f"{n}:k3-engine.service" for n in nodes]
    run = deploy(sim.inventory)
    assert run.returncode == 0, why(run)
    newer = image_id(sim, 0, f"{REPO}@{third}")          # node 1 pulled it this time (nobody held it)
    assert newer != build and [running(sim, r) for r in (0, 1)] == [(run_ref(f"{REPO}@{third}"), newer)] * 2
    history = json.loads(k3("history", sim.inventory, "--json", check=True).stdout)["groups"]["engine"]["revisions"]
    assert [(rev["image"], rev["tag"]) for rev in history] == [(f"{REPO}@{second}", IMAGE), (f"{REPO}@{third}", IMAGE)]

    # a rollback goes back to the exact build of the revision, not to whatever the tag names now
    back = deploy(sim.inventory, "--data", "k3_rollback=true")
    assert back.returncode == 0, why(back)
    assert [running(sim, r) for r in (0, 1)] == [(run_ref(f"{REPO}@{second}"), build)] * 2
    assert "Stage round" not in back.stdout          # both nodes still held it (node 1 by its digest-named tag)
