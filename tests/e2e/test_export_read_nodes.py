"""``k3deploy export kubernetes INVENTORY --read-nodes``: what the inventory leaves out (each node's cluster
interface and RDMA ports, the image's digest) read from the nodes over SSH as the deploy reads them, so that the
manifests hold nothing to fill; without it (and without --iface/--ib-hca) the export refuses and names the ways in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from helpers import k3, k3_here
from k3deploy.model.runbook.blanks import HCA_COMMAND, interface_command

pytestmark = pytest.mark.sim


def test_export_reads_what_the_inventory_leaves_out(sim_factory, tmp_path):
    sim = sim_factory("ke1", "gb300", 2)
    sim.set_vars("k3_strategy: multi_node_tp\n")
    out = tmp_path / "k8s"
    proc = k3_here("export", "kubernetes", sim.inventory, "-o", str(out))   # reads no host: in this process
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--iface" in proc.stderr and "--ib-hca" in proc.stderr and "--read-nodes" in proc.stderr
    assert not out.exists()

    proc = k3("export", "kubernetes", sim.inventory, "-o", str(out), "--read-nodes", "--json")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    for path in sorted(out.iterdir()):
        assert not re.findall(r"@[A-Z][A-Z0-9_]*@", path.read_text()), path
    lws = next(yaml.safe_load(Path(f["file"]).read_text()) for f in written["files"]
               if f["kind"] == "LeaderWorkerSet")
    # what the node has (the interface carrying its address, its active RDMA ports), and what the deploy derives
    # from it (preflight's settings: the GPU NICs' ports, not the default route's)
    iface = sim.ssh(0, interface_command(sim.info["nodes"][0]["ip"])).stdout.strip()
    active = set(sim.ssh(0, HCA_COMMAND).stdout.strip().split(","))
    report = json.loads(k3("preflight", sim.inventory, "--json").stdout)
    for rank, role in enumerate(("leaderTemplate", "workerTemplate")):
        derived = report["hosts"][sim.info["nodes"][rank]["name"]]["settings"]
        container = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GLOO_SOCKET_IFNAME"] == iface and env["NCCL_SOCKET_IFNAME"] == f"={iface}"
        assert set(env["NCCL_IB_HCA"].lstrip("=").split(",")) <= active
        assert {k: env.get(k) for k in derived} == derived
        assert "@sha256:" in container["image"]      # the build the nodes' registry names for the tag
