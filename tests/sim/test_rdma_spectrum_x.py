"""The simulated GB300 tray on a Spectrum-X RoCE fabric (``sim fault N:spectrum-x``): its
``ibv_devinfo`` shows four ConnectX-8 SuperNICs and a BlueField-3, every port Ethernet, and the port choice leaves
the BlueField out of ``NCCL_IB_HCA`` by its ``vendor_part_id`` alone."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from k3deploy.errors import K3Error
from k3deploy.facts.rdma import RdmaDevices, choose_ports
from k3sim.faults import parse_fault
from k3sim.profiles import NODE_TOOLS, node_config

UUID = "9f3c1a52-6b7e-4c1d-8e2f-3a4b5c6d7e8f"


def ibv_devinfo(tmp_path, hw: str, faults: list[str]) -> list[str]:
    config = node_config(hw, 0, 2, "node1", "10.77.0.11", [parse_fault(f) for f in faults], 1.0, UUID)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    return subprocess.run([str(NODE_TOOLS / "usr/bin/ibv_devinfo")], env=dict(os.environ, K3SIM_NODE_CONFIG=str(path)),
                          capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()


def test_a_spectrum_x_tray_shows_ethernet_gpu_nics_beside_a_bluefield_and_nccl_gets_the_gpu_nics(tmp_path):
    devs = RdmaDevices().process([*ibv_devinfo(tmp_path, "gb300", ["0:spectrum-x"]), "K3_EXIT=0"])
    assert isinstance(devs, list)
    active = {(d.name, p.link_layer) for d in devs for p in d.ports if p.active}
    assert active == {(f"mlx5_{i}", "Ethernet") for i in range(5)}   # nothing but Ethernet: the link layer tells nothing
    choice = choose_ports(devs)
    assert choice.nccl_ib_hca == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert [(d, p) for d, p, _ in choice.excluded] == [("mlx5_4", 1)]


def test_the_infiniband_tray_keeps_its_bluefield_out_as_before(tmp_path):
    devs = RdmaDevices().process([*ibv_devinfo(tmp_path, "gb300", []), "K3_EXIT=0"])
    assert isinstance(devs, list)
    assert choose_ports(devs).nccl_ib_hca == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert {p.link_layer for d in devs if d.name != "mlx5_4" for p in d.ports} == {"InfiniBand"}


def test_spectrum_x_needs_a_grace_tray_with_a_bluefield():
    with pytest.raises(K3Error, match="gb200, gb300"):
        node_config("h200", 0, 1, "n", "10.77.0.11", [parse_fault("0:spectrum-x")], 1.0, UUID)
