"""What an engine's env file holds, layer over layer: the plan's env, the settings derived from the host's facts
(which replace the plan's placeholders and catch-alls), ``VLLM_HOST_IP`` = the node's cluster address, and
``k3_extra_env`` last."""

from __future__ import annotations

import pytest

from k3deploy import resolve
from k3deploy.facts.host import AddressInterface, Ipv4Address
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, RdmaPort
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.requirements import Requirements
from k3deploy.model.rollout import Rollout, plan_rollout
from k3deploy.model.runbook.blanks import offline_env
from k3deploy.model.variables import Variables
from k3deploy.preflight.settings import derive_settings
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors.nvidia.checks import NvidiaFacts

#: GB300 P/D as the recipe lays it out: two prefill trays (one of them the router's host), four decode trays
PD = [HostRecord("p0", ("prefill", "router"), {"k3_ip": "192.0.2.10", "rank": 0}),
      HostRecord("p1", ("prefill",), {"k3_ip": "192.0.2.11", "rank": 1}),
      *(HostRecord(f"d{i}", ("decode",), {"k3_ip": f"192.0.2.{20 + i}", "rank": i}) for i in range(4))]


def facts(name: str, address: str, iface: str = "eth1", ports: int = 4) -> NvidiaFacts:
    """A node whose cluster address is on ``iface`` (a name other interfaces start with: ``eth10``), with ``ports``
    GPU NIC ports and working DMA-BUF."""
    return NvidiaFacts(
        host=name, address=address,
        interface=AddressInterface(address, iface, "eth0", [Ipv4Address("eth0", "198.51.100.7", 24),
                                                           Ipv4Address(iface, address, 24),
                                                           Ipv4Address(iface + "0", "203.0.113.5", 24)]),
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096)]) for i in range(ports)],
        modules=LoadedModules(["ib_core", "nvidia"]),
        dmabuf=DmabufSupport("6.8.0-45-generic", True, True, True, True, []),
    )


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def engines(r: Rollout) -> dict[tuple[str, str], dict[str, str]]:
    return {(u.host, u.node.role): env_of(u.env_text) for u in r.units if u.node.role != "router"}


def pd_rollout(recipe, **variables) -> Rollout:
    plan = resolve(recipe, hardware="gb300", strategy="pd_cluster")
    need = Requirements(hardware()["gb300"], "default", None, nodes=6, multi_node=True, strategy="pd_cluster", pd=True)
    host_env = {r.name: derive_settings(need, facts(r.name, r.address)).env for r in PD}
    return plan_rollout(plan, PD, Variables(**variables), ifaces={r.name: "eth1" for r in PD}, host_env=host_env)


def test_derived_transport_settings_replace_the_plans_all_and_prefix_match(recipe):
    plan = resolve(recipe, hardware="gb300", strategy="pd_cluster")
    assert plan.role("prefill")[0].env["UCX_NET_DEVICES"] == "all"   # what the recipe says
    got = engines(pd_rollout(recipe))
    ports = ",".join(f"mlx5_{i}:1" for i in range(4))
    for (host, role), env in got.items():
        # prefill and decode alike: the exact ports, never "all" (was: prefill "all", decode the ports)
        assert env["UCX_NET_DEVICES"] == ports, (host, role)
        assert env["NCCL_IB_HCA"] == "=" + ports, (host, role)
        # NCCL's exact-match form: a bare eth1 would select eth10 too (was: the plan's $IFACE_NAME, eth1)
        assert env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["GLOO_SOCKET_IFNAME"] == "eth1", (host, role)
    assert len(got) == 6


def test_k3_extra_env_stays_the_last_word(recipe):
    got = engines(pd_rollout(recipe, k3_extra_env={"UCX_NET_DEVICES": "mlx5_3:1", "VLLM_HOST_IP": "192.0.2.99",
                                                    "NCCL_SOCKET_IFNAME": "eth1"}))
    for env in got.values():
        assert env["UCX_NET_DEVICES"] == "mlx5_3:1" and env["VLLM_HOST_IP"] == "192.0.2.99"
        assert env["NCCL_SOCKET_IFNAME"] == "eth1"


def test_every_engine_unit_advertises_its_own_cluster_address(recipe):
    got = engines(pd_rollout(recipe))
    assert {host: env["VLLM_HOST_IP"] for (host, _), env in got.items()} == {r.name: r.address for r in PD}
    router = next(u for u in pd_rollout(recipe).units if u.node.role == "router")
    assert "VLLM_HOST_IP" not in env_of(router.env_text)


@pytest.mark.parametrize("hw, extra, nodes", [
    ("gb300", {"k3_strategy": "multi_node_tp"}, 2), ("h200", {"k3_strategy": "multi_node_tp_pp"}, 2),
    ("mi355x", {"k3_strategy": "multi_node_tp"}, 2), ("ascend_910c", {"k3_variant": "ascend_w4a8"}, 4),
    ("b300", {}, 1)])
def test_vllm_host_ip_is_the_k3_ip_on_every_engine_even_offline(hw, extra, nodes):
    recs = [HostRecord(f"n{i}", ("head",) if i == 0 else ("workers",),
                       {"k3_ip": f"192.0.2.{11 + i}", "k3_hardware": hw, **extra})
            for i in range(nodes)]
    r = desired_rollout(target(recs, None))
    got = {u.host: env_of(u.env_text).get("VLLM_HOST_IP") for u in r.units if u.node.role != "router"}
    assert got == {rec.name: rec.address for rec in recs}


def test_k3_iface_names_the_socket_interface_of_the_derived_settings():
    need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True)
    host = facts("n1", "192.0.2.11")
    host.iface = "bond0"
    s = derive_settings(need, host)
    assert s.env["NCCL_SOCKET_IFNAME"] == "=bond0" and s.env["GLOO_SOCKET_IFNAME"] == "bond0"
    assert s.reasons["GLOO_SOCKET_IFNAME"] == "k3_iface"
    assert derive_settings(need, facts("n1", "192.0.2.11")).env["NCCL_SOCKET_IFNAME"] == "=eth1"


def test_the_offline_runbook_writes_the_exact_form_and_k3_iface():
    need = Requirements(hardware()["h200"], "default", None, nodes=2, multi_node=True)
    env, blanks = offline_env(need, "n1", "192.0.2.11")
    assert env["NCCL_SOCKET_IFNAME"] == "=@IFACE_n1@" and [b.name for b in blanks][:1] == ["IFACE"]
    env, blanks = offline_env(need, "n1", "192.0.2.11", "bond0")
    assert env["NCCL_SOCKET_IFNAME"] == "=bond0" and "IFACE" not in [b.name for b in blanks]
