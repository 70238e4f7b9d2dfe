"""The simulated GPU fabric's rails: each GPU NIC of a node on its own rail subnet, named by
the simulated ``ibdev2netdev`` as MLNX-OFED's does, the ``rail-only`` fault, and the simulated ``ping`` the
reachability round runs (the nodes' base has none)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence

import pytest

from helpers import FIXTURES
from k3deploy.errors import K3Error
from k3deploy.facts.rdma import RdmaDevices, choose_ports
from k3sim.faults import parse_fault
from k3sim.profiles import NODE_TOOLS, node_config

UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"
LINE = re.compile(r"^\S+ port \d+ ==> \S+ \((Up|Down)\)$")


def config(hw: str, faults: Sequence[str] = (), rank: int = 1) -> dict:
    return node_config(hw, rank, 3, f"node{rank + 1}", f"10.77.5.{11 + rank}", [parse_fault(f) for f in faults], 1.0,
                       UUID)


def tool(tmp_path, cfg: dict, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([str(NODE_TOOLS / "usr/bin" / name), *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, K3SIM_NODE_CONFIG=str(path)))


def test_one_subnet_per_rail_and_the_rail_only_fault():
    rails = config("gb300")["rails"]
    assert rails == {"rail_only": False, "ports": [
        {"netdev": f"ib{i}", "rail": i, "address": f"10.{200 + i}.5.12"} for i in range(4)]}
    assert config("gb300", ["1:rail-only"])["rails"]["rail_only"]
    assert not config("gb300", ["0:rail-only"])["rails"]["rail_only"]       # another node's fault
    assert [p["netdev"] for p in config("mi355x")["rails"]["ports"]] == [f"ens{i + 1}f0np0" for i in range(8)]
    assert "rails" not in config("ascend_910c")
    with pytest.raises(K3Error, match="rails"):
        config("ascend_910c", ["1:rail-only"])


def test_ibdev2netdev_names_each_gpu_nic_as_the_real_tool_does(tmp_path):
    real = (FIXTURES / "rdma/ibdev2netdev-ucx-docs.txt").read_text().splitlines()
    real += (FIXTURES / "rdma/ibdev2netdev-mixed.txt").read_text().splitlines()
    assert all(LINE.match(line) for line in real)
    out = tool(tmp_path, config("gb300"), "ibdev2netdev").stdout.splitlines()
    assert out == [f"mlx5_{i} port 1 ==> ib{i} (Up)" for i in range(4)] and all(LINE.match(line) for line in out)
    # what the RdmaDevices fact makes of it where sysfs has no infiniband class (its command's awk)
    netdevs = [" ".join(line.split()[i] for i in (0, 2, 4)) for line in out]
    devs = RdmaDevices().process([*tool(tmp_path, config("gb300"), "ibv_devinfo").stdout.splitlines(),
                                  "K3_SECTION=netdev", *netdevs, "K3_EXIT=0"])
    assert isinstance(devs, list)
    assert [p.netdev for d in devs for p in d.ports if d.name in ("mlx5_0", "mlx5_3")] == ["ib0", "ib3"]
    assert choose_ports(devs).nccl_ib_hca == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"


def test_the_simulated_ping_speaks_iputils(tmp_path):
    usage = tool(tmp_path, config("gb300"), "ping")
    assert usage.returncode == 2 and "Destination address required" in usage.stderr
    if os.geteuid() != 0:
        pytest.skip("ICMP needs a raw socket (root)")
    ok = tool(tmp_path, config("gb300"), "ping", "-c", "1", "-W", "1", "127.0.0.1")
    assert ok.returncode == 0 and "1 packets transmitted, 1 received, 0% packet loss" in ok.stdout
    bad = tool(tmp_path, config("gb300"), "ping", "-c", "1", "-W", "1", "-I", "nosuchif0", "127.0.0.1")
    assert bad.returncode == 2 and bad.stderr.startswith("ping: ")
