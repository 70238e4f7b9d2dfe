"""``rdma.reach``: with expert parallelism across nodes, each chosen RDMA port of each node reaches each chosen port of
the other nodes.

The all-to-all of expert parallelism (DeepEP, and its IBGDA path) sends from every GPU's NIC to every other node's
GPU NICs, rail to rail and across rails; a rail-only fabric (one switch per rail, no spine between them) carries
only rail-matched pairs, and the failure shows late, as NVSHMEM bootstrap errors (llm-d's wide-EP guide: rail-only
networks "will fail"). NCCL's own collectives and the NCCL probe (:mod:`k3deploy.vendors.nvidia.probe`) use rail-matched
paths only, so they pass on such a fabric.

A second round, once every host's facts and derived settings are in: each host runs one command that pings, from each
of its chosen ports (``NCCL_IB_HCA``; out of the port's network interface, ``ping -I <netdev>``: the RoCE netdev or
the IPoIB interface), the address of each chosen port of every other host, all pings at once. A port whose interface
has no IPv4 address cannot be checked and is named. The pairs that do not answer are named as
``<port> -> <peer> <peer port> (<address>)``.

Example::

    >>> parse_reach(["K3_REACH mlx5_0:1 n2 mlx5_1:1 10.201.0.12 1", "K3_REACH mlx5_0:1 n2 mlx5_0:1 10.200.0.12 0"])
    [Reach(port='mlx5_0:1', peer='n2', peer_port='mlx5_1:1', address='10.201.0.12', ok=False), \
Reach(port='mlx5_0:1', peer='n2', peer_port='mlx5_0:1', address='10.200.0.12', ok=True)]
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from k3deploy.facts.base import EXIT_MARK, Jsonable, K3Fact, Unparsable
from k3deploy.facts.host import AddressInterface
from k3deploy.preflight.base import CheckResult, HostFacts

CHECK = "rdma.reach"
MARK = "K3_REACH"
#: seconds each ping waits for its replies; the round's limit
PING_WAIT_S = 2
ROUND_TIMEOUT_S = 60
REQUIRED = ("each chosen RDMA port reaches each chosen port of the other nodes (expert parallelism across nodes: "
            "the all-to-all crosses rails)")
FIX = ("DeepEP's all-to-all needs every GPU NIC to reach every GPU NIC of the other nodes: connect the rails (a spine, "
       "or routes between the rail subnets), or choose a strategy without expert parallelism across nodes")


@dataclass(frozen=True)
class Reach(Jsonable):
    """One ping of the round: from ``port`` to ``peer``'s ``peer_port`` at ``address``; ``ok``: it answered."""

    port: str
    peer: str
    peer_port: str
    address: str
    ok: bool


def parse_reach(lines: list[str]) -> list[Reach]:
    """``K3_REACH <port> <peer> <peer port> <address> <ping's exit status>`` lines (other lines are ignored)."""
    out: list[Reach] = []
    for line in lines:
        parts = line.split()
        if not parts or parts[0] != MARK:
            continue
        if len(parts) != 6 or not parts[5].isdigit():
            raise Unparsable(f"bad reach line {line.strip()[:80]!r}")
        out.append(Reach(parts[1], parts[2], parts[3], parts[4], parts[5] == "0"))
    return out


class RdmaReach(K3Fact[list[Reach]]):
    """The host's pings of the round, all at once: ``targets`` = ``[port, netdev, peer, peer port, address]`` each."""

    tool = required_binary = "ping"
    hint = "the reachability round pings from each RDMA port's interface (iputils-ping)"
    shown_command = "ping -c 2 -W 2 -I <port netdev> <peer port address>  # each chosen port to each peer's"

    def command(self, targets: list[list[Any]] | None = None) -> str:
        steps = []
        for port, netdev, peer, peer_port, address in targets or []:
            q = [shlex.quote(str(x)) for x in (port, netdev, peer, peer_port, address)]
            steps.append(f"( ping -c 2 -i 0.2 -W {PING_WAIT_S} -I {q[1]} {q[4]} >/dev/null 2>&1; "
                         f"echo {MARK} {q[0]} {q[2]} {q[3]} {q[4]} $? ) &")
        script = " ".join(steps) + " wait"
        return f"timeout {ROUND_TIMEOUT_S} sh -c {shlex.quote(script)} 2>&1; echo {EXIT_MARK}0"

    def parse(self, lines: list[str]) -> list[Reach]:
        return parse_reach(lines)


def _chosen(env: dict[str, str]) -> list[str]:
    """The ports of ``NCCL_IB_HCA`` (``=mlx5_0:1,mlx5_1:1`` → ``['mlx5_0:1', 'mlx5_1:1']``)."""
    return [p for p in env.get("NCCL_IB_HCA", "").removeprefix("=").split(",") if p]


def port_addresses(facts: HostFacts, ports: list[str]) -> dict[str, tuple[str, str] | None]:
    """Each port's (network interface, IPv4 address), None where either is unknown.

    >>> from k3deploy.facts.host import Ipv4Address
    >>> from k3deploy.facts.rdma import RdmaDevice, RdmaPort
    >>> f = HostFacts("n1", rdma=[RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", netdev="r0")])],
    ...               interface=AddressInterface("10.0.0.1", "eth0", "eth0", [Ipv4Address("r0", "10.200.0.11", 24)]))
    >>> port_addresses(f, ["mlx5_0:1", "mlx5_1:1"])
    {'mlx5_0:1': ('r0', '10.200.0.11'), 'mlx5_1:1': None}
    """
    netdevs = {f"{d.name}:{p.port}": p.netdev for d in facts.rdma for p in d.ports} \
        if isinstance(facts.rdma, list) else {}
    itf = facts.interface if isinstance(facts.interface, AddressInterface) else None
    out: dict[str, tuple[str, str] | None] = {}
    for port in ports:
        netdev = netdevs.get(port)
        address = next((a.address for a in itf.addresses if a.interface == netdev), None) if itf and netdev else None
        out[port] = (str(netdev), address) if netdev and address else None
    return out


def reach_targets(read: list[HostFacts], env: dict[str, dict[str, str]], groups: list[list[str]] | None = None
                  ) -> tuple[dict[str, list[list[Any]]], dict[str, list[str]]]:
    """Per host: its pings (``[port, netdev, peer, peer port, address]``: each of its chosen ports to each chosen port
    of every other host of its engine groups, ``groups``: the hosts of each replica or P/D pool, None: one group),
    and its chosen ports that cannot be checked (no interface or no IPv4 address). Empty where no group has two
    hosts with chosen ports."""
    chosen = [f for f in read if f.unreachable is None and _chosen(env.get(f.host, {}))]
    names = {f.host for f in chosen}
    sets = [set(g) & names for g in (groups if groups is not None else [sorted(names)])]
    mates = {h: set().union(*(g for g in sets if h in g)) - {h} for h in names}
    hosts = [f for f in chosen if mates[f.host]]
    if len(hosts) < 2:
        return {}, {}
    where = {f.host: port_addresses(f, _chosen(env[f.host])) for f in hosts}
    targets: dict[str, list[list[Any]]] = {}
    unknown: dict[str, list[str]] = {}
    for f in hosts:
        targets[f.host] = []
        unknown[f.host] = [p for p, a in where[f.host].items() if a is None]
        for port, mine in where[f.host].items():
            if mine is None:
                continue
            for other in hosts:
                if other.host not in mates[f.host]:
                    continue
                for peer_port, theirs in where[other.host].items():
                    if theirs is not None:
                        targets[f.host].append([port, mine[0], other.host, peer_port, theirs[1]])
    return targets, unknown


def reach_checks(targets: dict[str, list[list[Any]]], unknown: dict[str, list[str]],
                 got: dict[str, Any]) -> list[CheckResult]:
    """``rdma.reach`` per host: every ping answered, else each pair that did not named as (port, peer, peer port).
    ``got``: the host's pings (``list[Reach]``), or why they could not be read."""
    out: list[CheckResult] = []
    for host, wanted in targets.items():
        pings = got.get(host)
        if not isinstance(pings, list):
            out.append(CheckResult(host, CHECK, "fail", f"not read: {pings}", REQUIRED,
                                   "check the connection to the host and rerun preflight"))
            continue
        done = {(p.port, p.peer, p.peer_port) for p in pings}
        pings = sorted(pings, key=lambda p: (p.peer, p.port, p.peer_port))   # they finish in any order
        bad = [f"{p.port} -> {p.peer} {p.peer_port} ({p.address})" for p in pings if not p.ok]
        bad += [f"{port} -> {peer} {peer_port} ({address}): no answer within the round"
                for port, _, peer, peer_port, address in wanted if (port, peer, peer_port) not in done]
        blind = unknown.get(host, [])
        if bad:
            out.append(CheckResult(host, CHECK, "fail", f"{len(bad)} of {len(wanted)} port pairs unreachable: "
                                   + "; ".join(bad), REQUIRED, FIX))
        elif blind or not wanted:
            out.append(CheckResult(host, CHECK, "warn",
                                   f"{len(pings)} port pairs answered; not checked: {', '.join(blind) or 'every port'}"
                                   " (no IPv4 address on the port's interface)", REQUIRED,
                                   "give each GPU NIC's interface (RoCE netdev or IPoIB) its address on the fabric, "
                                   "or check cross-rail reachability by hand (ib_write_bw between the ports)"))
        else:
            out.append(CheckResult(host, CHECK, "pass", f"{len(pings)} port pairs answered", REQUIRED))
    return out
