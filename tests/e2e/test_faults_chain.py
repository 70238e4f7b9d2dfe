"""The stage's chain when a node's link is cut in the middle of it, on a simulated cluster of three trays whose node
links run as slow as a site's (80 Mbit/s): the middle node loses its cluster network (blackhole routes to its peers;
the control machine still reaches it, as over a management network) while the last node copies from it. The last
node routes around it to the first and ends with the image and every shard verified, the middle node is named with
what it could not get, nothing more crossed the uplink; once its link is back, the next deploy copies only what it
lacks, from a peer, and the cluster serves."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from helpers import PYINFRA, ROOT, deploy, k3, why
from k3deploy.model import commands

pytestmark = [pytest.mark.sim, pytest.mark.faults]

CACHE = "/var/lib/k3deploy/cache"
MODEL = "moonshotai/Kimi-K3"
IMAGE = "vllm/vllm-openai:kimi-k3"


def _uplink(sim) -> tuple[int, int]:
    doc = json.loads(k3("sim", "status", "--name", sim.name, "--json", check=True).stdout)
    c = next(c for c in doc["clusters"] if c["name"] == sim.name)
    return c["outside_bytes"], c["artifact_bytes"]


def _cut(sim, rank: int, on: bool) -> None:
    """Blackhole (or give back) node ``rank``'s routes to its peers, in its network namespace."""
    netns = sim.info["nodes"][rank]["name"]    # a node's network namespace is named as the node
    for node in sim.info["nodes"]:
        if node["rank"] != rank:
            subprocess.run(["ip", "-n", netns, "route", "add" if on else "del", "blackhole", f"{node['ip']}/32"],
                           check=True, capture_output=True)


def test_a_node_whose_link_is_cut_during_the_stage_is_routed_around_and_named(sim_factory):
    sim = sim_factory("fochain", "gb300", 3, "--weights-mb", "40", "--image-mb", "8", "--cluster-mbps", "80",
                      "--uplink-mbps", "400")
    sim.set_vars("k3_strategy: multi_node_tp\nk3_stage_hop_timeout: 2\n")
    middle, last = sim.info["nodes"][1]["name"], sim.info["nodes"][2]["name"]
    run = subprocess.Popen([PYINFRA, sim.inventory, "deploy/k3.py", "-y"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        # the last node has begun to copy from the middle one, which is itself still receiving
        while sim.ssh(2, "find /var/lib/k3deploy -name '*.k3-part' -size +0 | grep -q .").returncode != 0:
            assert run.poll() is None and time.monotonic() < deadline, "the chain never reached the last node"
            time.sleep(0.2)
        _cut(sim, 1, True)
        out, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, out[-3000:]
    said = [line.strip() for line in out.splitlines() if line.strip().startswith(f"[{middle}]")]
    assert any(line.startswith(f"[{middle}] stage: no peer gave") for line in said), said
    assert f"[{last}] Success" in out.split("Stage round 1 of 1: from a peer", 1)[1].split("-->", 1)[0], out[-3000:]
    for rank in (0, 2):     # the first and the last node hold it all, verified
        assert sim.ssh(rank, commands.verify_weights(CACHE, MODEL)).returncode == 0
        assert sim.ssh(rank, f"docker image inspect {IMAGE}").returncode == 0
    served, artifacts = _uplink(sim)
    assert served <= 1.2 * artifacts, (served, artifacts)
    _cut(sim, 1, False)
    again = deploy(sim.inventory)
    assert again.returncode == 0, why(again)
    assert f"Weights of {MODEL}: from the hub" not in again.stdout     # from a peer: nothing from outside
    assert sim.ssh(1, commands.verify_weights(CACHE, MODEL)).returncode == 0
    assert _uplink(sim)[0] <= 1.2 * artifacts
