"""``rdma.reach``: with expert parallelism across nodes each chosen RDMA port of each node
must reach each chosen port of the others; a rail-only fabric carries only rail-matched pairs. The round's targets,
its command, and the verdict that names the (node, port, peer port) pairs that fail."""

from __future__ import annotations

from typing import Any, cast

from k3deploy import load_recipe, resolve
from k3deploy.facts.host import AddressInterface, Ipv4Address
from k3deploy.facts.rdma import RdmaDevice, RdmaPort
from k3deploy.model.pipeline import expert_parallel_across_nodes, requirements_of
from k3deploy.preflight.base import HostFacts
from k3deploy.preflight.reach import RdmaReach, Reach, parse_reach, reach_checks, reach_targets
from k3deploy.recipe.taxonomy import strategies
from k3deploy.vendors.base import Spot
from k3deploy.vendors.common import COMMON

RAILS = 4


def node(name: str, rank: int, rails: int = RAILS, addressed: int | None = None) -> HostFacts:
    """A node with one GPU NIC per rail, each port's interface ``ib<i>`` on rail subnet ``10.20<i>.0.0/24``."""
    addressed = rails if addressed is None else addressed
    return HostFacts(
        host=name, address=f"10.77.0.{11 + rank}",
        rdma=[RdmaDevice(f"mlx5_{i}", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand", 4096, f"ib{i}")])
              for i in range(rails)],
        interface=AddressInterface(f"10.77.0.{11 + rank}", "eth0", "eth0",
                                   [Ipv4Address("eth0", f"10.77.0.{11 + rank}", 24)]
                                   + [Ipv4Address(f"ib{i}", f"10.{200 + i}.0.{11 + rank}", 24)
                                      for i in range(addressed)]),
    )


def env(rails: int = RAILS) -> dict[str, str]:
    return {"NCCL_IB_HCA": "=" + ",".join(f"mlx5_{i}:1" for i in range(rails))}


def test_expert_parallelism_across_nodes_is_known_from_the_plan():
    recipe = load_recipe()
    assert expert_parallel_across_nodes(resolve(recipe, hardware="h200", strategy="multi_node_tep"))
    assert not expert_parallel_across_nodes(resolve(recipe, hardware="h200", strategy="multi_node_tp"))
    assert requirements_of(resolve(recipe, hardware="h200", strategy="multi_node_tep"),
                           recipe).expert_parallel_across_nodes
    assert strategies()["multi_node_dep"].expert_parallel_across_nodes
    assert not strategies()["single_node_dep"].expert_parallel_across_nodes


def test_every_port_of_every_node_pings_every_port_of_the_others():
    hosts = [node("n1", 0), node("n2", 1), node("n3", 2)]
    targets, unknown = reach_targets(hosts, {h.host: env() for h in hosts})
    assert len(targets["n1"]) == RAILS * 2 * RAILS and not any(unknown.values())
    assert ["mlx5_0:1", "ib0", "n2", "mlx5_3:1", "10.203.0.12"] in targets["n1"]
    assert not [t for t in targets["n2"] if t[2] == "n2"]   # never itself
    command = RdmaReach().command(targets=targets["n1"][:2])
    assert "ping -c 2 -i 0.2 -W 2 -I ib0 10.200.0.12" in command and command.endswith("echo K3_EXIT=0")
    # registered with the command its fact shows
    assert next(c for c in COMMON if c.id == "rdma.reach").command_for(Spot()) == RdmaReach.shown_command


def test_a_rail_only_fabric_fails_naming_each_cross_rail_pair():
    hosts = [node("n1", 0), node("n2", 1)]
    targets, unknown = reach_targets(hosts, {h.host: env() for h in hosts})
    # what a rail-only fabric answers: port i reaches port i of the peer, nothing else
    got = {h: [Reach(port, peer, peer_port, address, port.split(":")[0] == peer_port.split(":")[0])
               for port, _, peer, peer_port, address in wanted] for h, wanted in targets.items()}
    results = {r.host: r for r in reach_checks(targets, unknown, got)}
    bad = results["n1"]
    assert bad.status == "fail" and bad.check == "rdma.reach"
    assert bad.observed.startswith("12 of 16 port pairs unreachable: ")
    assert "mlx5_0:1 -> n2 mlx5_1:1 (10.201.0.12)" in bad.observed
    assert "mlx5_0:1 -> n2 mlx5_0:1" not in bad.observed   # rail-matched pairs answer
    assert "spine" in bad.fix and "expert parallelism" in bad.fix
    # a full fabric passes
    full = {h: [Reach(port, peer, peer_port, address, True) for port, _, peer, peer_port, address in wanted]
            for h, wanted in targets.items()}
    assert {r.status for r in reach_checks(targets, unknown, full)} == {"pass"}


def test_a_port_without_an_address_is_named_and_a_lost_host_fails():
    hosts = [node("n1", 0, addressed=3), node("n2", 1)]
    targets, unknown = reach_targets(hosts, {h.host: env() for h in hosts})
    assert unknown == {"n1": ["mlx5_3:1"], "n2": []}
    got: dict[str, Any] = {h: [Reach(p, peer, pp, a, True) for p, _, peer, pp, a in wanted]
                           for h, wanted in targets.items()}
    results = {r.host: r for r in reach_checks(targets, unknown, got)}
    assert results["n1"].status == "warn" and "mlx5_3:1" in results["n1"].observed
    assert results["n2"].status == "pass"
    got["n2"] = "OSError: connection lost"
    assert {r.host: r.status for r in reach_checks(targets, unknown, got)}["n2"] == "fail"
    # pings that never came back (the round's time ran out) are named too
    got["n2"] = got["n1"][:0]
    lost = {r.host: r for r in reach_checks(targets, unknown, got)}["n2"]
    assert lost.status == "fail" and "no answer within the round" in lost.observed


def test_one_node_or_no_ports_means_no_round():
    assert reach_targets([node("n1", 0)], {"n1": env()}) == ({}, {})
    assert reach_targets([node("n1", 0), node("n2", 1)], {"n1": env()}) == ({}, {})


def test_the_round_output_parses():
    assert parse_reach(["noise", "K3_REACH mlx5_0:1 n2 mlx5_0:1 10.200.0.12 0"]) == [
        Reach("mlx5_0:1", "n2", "mlx5_0:1", "10.200.0.12", True)]


def test_the_round_runs_only_with_expert_parallelism_across_nodes():
    from k3deploy.model.requirements import Requirements
    from k3deploy.preflight.across import rdma_reach_round
    from k3deploy.preflight.report import PreflightReport
    from k3deploy.preflight.settings import HostSettings
    from k3deploy.recipe.taxonomy import hardware

    tp = Requirements(hardware()["gb300"], "default", None, nodes=2, strategy="multi_node_tp", multi_node=True)
    hosts = [node("n1", 0), node("n2", 1)]
    report = PreflightReport(requirements=tp, hosts=hosts, results=[],
                             settings={h.host: HostSettings(h.host, env()) for h in hosts})
    assert reach_targets(hosts, report.host_env())[0]   # there would be pings to send
    assert rdma_reach_round(cast(Any, None), [], hosts, tp, report) == []   # but nothing is asked of any host


def test_pings_stay_within_each_expert_parallel_group():
    """Two replicas (or P/D pools): the all-to-all runs inside each, so only their own hosts are pinged."""
    hosts = [node(f"n{i + 1}", i) for i in range(5)]
    targets, _ = reach_targets(hosts, {h.host: env() for h in hosts}, [["n1", "n2"], ["n3", "n4"], ["n5"]])
    assert set(targets) == {"n1", "n2", "n3", "n4"}                     # n5 is alone in its group
    assert {t[2] for t in targets["n1"]} == {"n2"} and {t[2] for t in targets["n4"]} == {"n3"}
    assert len(targets["n1"]) == RAILS * RAILS
