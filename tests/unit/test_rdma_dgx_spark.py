"""A DGX Spark (GB10) shows each ConnectX-7 port under two RDMA names and two netdevs, one per PCIe link
(``rocep1s0f1`` -> ``enp1s0f1np1`` and ``roceP2p1s0f1`` -> ``enP2p1s0f1np1``: NVIDIA's "Connect Two Sparks"
playbook, tests/fixtures/README.md): the automatic port choice takes each port once, by the name NVIDIA says to use,
and the check names the second name as left out."""

from __future__ import annotations

import subprocess

from helpers import FIXTURES
from k3deploy.facts.base import EXIT_MARK, SECTION_MARK
from k3deploy.facts.host import AddressInterface, Ipv4Address
from k3deploy.facts.rdma import _NETDEV_COMMAND, RdmaDevice, RdmaDevices, RdmaPort, choose_ports, same_port_names
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import run_checks
from k3deploy.preflight.settings import derive_settings
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.nvidia.checks import NvidiaFacts
from k3deploy.vendors.nvidia.facts import NvidiaGpu


def ibdev2netdev_lines() -> list[str]:
    """What the fact's netdev section prints where sysfs has no infiniband class: its own awk over the real
    ``ibdev2netdev`` output of a DGX Spark (``ibdev2netdev`` is a shell function that prints the fixture)."""
    awk = _NETDEV_COMMAND.split("ibdev2netdev 2>/dev/null | ", 1)[1]
    out = subprocess.run(["bash", "-c", f"cat {FIXTURES / 'rdma/ibdev2netdev-dgx-spark.txt'} | {awk}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def spark_devices() -> list[RdmaDevice]:
    lines = (FIXTURES / "rdma/ibv_devinfo-roce-4hca-dgx-spark.txt").read_text().splitlines()
    devs = RdmaDevices().process([*lines, f"{SECTION_MARK}netdev", *ibdev2netdev_lines(), f"{EXIT_MARK}0"])
    assert isinstance(devs, list)
    return devs


def spark(name: str, address: str) -> NvidiaFacts:
    return NvidiaFacts(
        host=name, address=address,
        interface=AddressInterface(address, "enP7s7", "enP7s7", [Ipv4Address("enP7s7", address, 24)]),
        gpus=[NvidiaGpu("NVIDIA GB10", 122000, "580.95.05")], rdma=spark_devices())


def test_the_real_spark_outputs_read_as_four_functions_of_one_adapter():
    devs = spark_devices()
    assert [(d.name, d.sys_image_guid, [(p.state, p.netdev) for p in d.ports]) for d in devs] == [
        ("rocep1s0f0", "4cbb:4703:002d:1a16", [("PORT_DOWN", "enp1s0f0np0")]),
        ("rocep1s0f1", "4cbb:4703:002d:1a16", [("PORT_ACTIVE", "enp1s0f1np1")]),
        ("roceP2p1s0f0", "4cbb:4703:002d:1a16", [("PORT_DOWN", "enP2p1s0f0np0")]),
        ("roceP2p1s0f1", "4cbb:4703:002d:1a16", [("PORT_ACTIVE", "enP2p1s0f1np1")])]
    assert same_port_names(devs) == {"roceP2p1s0f0": "rocep1s0f0", "roceP2p1s0f1": "rocep1s0f1"}


def test_the_automatic_choice_takes_the_up_port_once():
    choice = choose_ports(spark_devices(), "enP7s7")
    assert choice.ports == [("rocep1s0f1", 1)]
    assert choice.excluded == [("roceP2p1s0f1", 1, "a second name of rocep1s0f1:1's port (another PCIe link to it)")]
    s = derive_settings(Requirements(hardware=hardware()["dgx_spark_gb10"], variant="default",
                                     vram_minimum_gb=None, nodes=2, multi_node=True), spark("spark-1", "10.0.0.11"))
    assert s.env["NCCL_IB_HCA"] == "=rocep1s0f1:1"
    assert "roceP2p1s0f1:1 (a second name of rocep1s0f1:1's port" in s.reasons["NCCL_IB_HCA"]


def test_the_check_passes_with_one_port_for_the_one_gpu_and_names_the_second_name():
    sel = Requirements(hardware=hardware()["dgx_spark_gb10"], variant="default", vram_minimum_gb=None, nodes=2,
                       multi_node=True)
    results = run_checks(sel, [spark("spark-1", "10.0.0.11"), spark("spark-2", "10.0.0.12")])
    (r,) = [r for r in results if (r.host, r.check) == ("spark-1", "rdma.devices")]
    assert r.status == "pass", r
    assert "rocep1s0f1:1" in r.observed and "not roceP2p1s0f1:1 (a second name" in r.observed


def test_two_adapters_in_two_pci_domains_are_two_ports_and_k3_ib_hca_still_decides():
    """Functions of different adapters (two sys_image_guids) are never one port, whatever their names."""
    up = [RdmaPort(1, "PORT_ACTIVE", "Ethernet")]
    devs = [RdmaDevice("rocep1s0f0", ports=up, sys_image_guid="0001"),
            RdmaDevice("roceP1p1s0f0", ports=up, sys_image_guid="0002")]
    assert choose_ports(devs).ports == [("rocep1s0f0", 1), ("roceP1p1s0f0", 1)]
    # the site's k3_ib_hca may take both names (both PCIe links) on a Spark
    assert choose_ports(spark_devices(), setting="rocep1s0f1,roceP2p1s0f1").ports == [("rocep1s0f1", 1),
                                                                                        ("roceP2p1s0f1", 1)]
