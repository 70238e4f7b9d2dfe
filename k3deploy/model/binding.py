"""Bind a plan to inventory hosts: which host runs which node, and the placeholders filled in.

Pure: the caller passes plain host records (name, groups, data) taken from a pyinfra inventory.

Inventory contract:

- non-P/D strategies: group ``head`` (exactly one host) and group ``workers`` (ranks 1..N-1);
- ``pd_cluster``: groups ``prefill`` and ``decode`` (one host per pool rank) and ``router`` (one host,
  which may also be a prefill or decode host);
- per host, ``k3_ip`` is its address on the cluster network (default: ``ssh_hostname``, else the host name)
  and ``rank`` its rank within its group (default: the order of the group);
- replicas (non-P/D): per host ``k3_replica`` (0..R-1, default 0); each replica has one host in ``head`` and its
  own workers, ranked within the replica, and runs the whole plan.

Example::

    >>> hosts = [HostRecord("n1", ("head",), {"k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {"k3_ip": "10.0.0.2"})]
    >>> bound = bind(plan, hosts, ifaces={"n1": "eth0", "n2": "eth0"})      # doctest: +SKIP
    >>> bound["n2"].engine.argv[-3:]                                        # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from k3deploy.errors import K3Error
from k3deploy.recipe.argv import flag_value, int_value
from k3deploy.recipe.plan import NodePlan, Plan

PLACEHOLDER = re.compile(r"\$([A-Z_][A-Z0-9_]*)")
DEFAULT_MASTER_PORT = 29501
DEFAULT_DP_RPC_PORT = 29550


@dataclass(frozen=True)
class HostRecord:
    name: str
    groups: tuple[str, ...]
    data: Mapping[str, Any]
    origins: Mapping[str, str] = field(default_factory=dict)  # data key -> where the inventory set it

    @property
    def address(self) -> str:
        return str(self.data.get("k3_ip") or self.data.get("ssh_hostname") or self.name)


@dataclass(frozen=True)
class BoundNode:
    """One plan node on one host, placeholders filled."""

    node: NodePlan          # as planned (placeholders intact)
    argv: list[str]         # filled
    env: dict[str, str]     # filled
    address: str
    replica: int = 0        # the replica (engine group) this node belongs to
    values: Mapping[str, str] = field(default_factory=dict)   # what each placeholder was filled with

    @property
    def role(self) -> str:
        return self.node.role

    @property
    def rank(self) -> int:
        return self.node.rank


@dataclass
class BoundHost:
    host: HostRecord
    engine: BoundNode | None = None
    router: BoundNode | None = None
    extras: list[BoundNode] = field(default_factory=list)  # a co-located second engine (P/D on one node)


def replica_of(record: HostRecord) -> int:
    """The replica a host belongs to (``k3_replica``, default 0)."""
    value = record.data.get("k3_replica")
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        raise K3Error(f"host {record.name}: k3_replica is {value!r}, not a replica number: give 0, 1, ...") from None


def replicas_of(hosts: Iterable[HostRecord]) -> list[int]:
    """The replica numbers of the engine hosts (``head``/``workers``), checked to be 0..R-1.

    >>> replicas_of([HostRecord("a", ("head",), {}), HostRecord("b", ("head",), {"k3_replica": 1})])
    [0, 1]
    """
    found = sorted({replica_of(h) for h in hosts if {"head", "workers"} & set(h.groups)})
    if found and found != list(range(len(found))):
        raise K3Error(f"k3_replica values {found} do not number the replicas 0..{len(found) - 1}: give every "
                      "replica's hosts one number, counting from 0 with no gaps")
    return found or [0]


def _ranked(hosts: list[HostRecord], group: str) -> list[HostRecord]:
    members = [h for h in hosts if group in h.groups]
    ranks = [h.data.get("rank") for h in members]
    if members and all(r is not None for r in ranks):
        dup = {r for r in ranks if ranks.count(r) > 1}
        if dup:
            names = [h.name for h in members if h.data.get("rank") in dup]
            first = sorted(dup, key=str)[0]
            raise K3Error(f"duplicate rank {first} in group {group}: hosts {', '.join(names)}; give each a "
                          "unique rank")
        return sorted(members, key=lambda h: int(h.data["rank"]))
    if any(r is not None for r in ranks):
        missing = [h.name for h in members if h.data.get("rank") is None]
        raise K3Error(f"group {group}: hosts {', '.join(missing)} have no rank while others do; set rank on all or "
                      "none")
    return members


def fill(value: str, mapping: Mapping[str, str]) -> str:
    """Replace known ``$NAME`` placeholders; unknown ``$...`` text is left as it is."""
    return PLACEHOLDER.sub(lambda m: mapping.get(m.group(1), m.group(0)), value)


def bind(plan: Plan, hosts: Iterable[HostRecord], *, ifaces: Mapping[str, str] | None = None,
         dp_rpc_port: int = DEFAULT_DP_RPC_PORT, router_host: str = "0.0.0.0",
         router_port: int = 8000) -> dict[str, BoundHost]:
    """Assign every plan node to a host and fill the placeholders; raise K3Error on an inventory mismatch."""
    hosts = list(hosts)
    ifaces = ifaces or {}
    out: dict[str, BoundHost] = {h.name: BoundHost(h) for h in hosts}
    common = {"PREFILL_DP_RPC_PORT": str(dp_rpc_port), "DECODE_DP_RPC_PORT": str(dp_rpc_port),
              "ROUTER_HOST": router_host, "ROUTER_PORT": str(router_port)}

    def make(node: NodePlan, host: HostRecord, mapping: Mapping[str, str], replica: int = 0) -> BoundNode:
        m = {**mapping, "IFACE_NAME": ifaces.get(host.name, mapping.get("IFACE_NAME", "$IFACE_NAME"))}
        return BoundNode(node, [fill(a, m) for a in node.argv], {k: fill(v, m) for k, v in node.env.items()},
                         host.address, replica, m)

    if plan.strategy == "pd_cluster":
        if any(replica_of(h) for h in hosts):
            raise K3Error("k3_replica is set but pd_cluster has no replicas: its pools scale with k3_prefill_nodes "
                          "and k3_decode_nodes; remove k3_replica")
        pools: dict[str, list[HostRecord]] = {}
        mapping = dict(common)
        for role in ("prefill", "decode"):
            planned = plan.role(role)
            members = _ranked(hosts, role)
            if len(members) != len(planned):
                raise K3Error(f"the plan has {len(planned)} {role} node(s) but group {role} has {len(members)} "
                              f"host(s): add or remove hosts, or set k3_{role}_nodes")
            pools[role] = members
            for i, h in enumerate(members, start=1):
                mapping[f"{role.upper()}_NODE_{i}"] = h.address
        routers = [h for h in hosts if "router" in h.groups]
        if len(routers) != 1:
            raise K3Error(f"pd_cluster needs exactly one host in group router, found {len(routers)}")
        for role, members in pools.items():
            for node, h in zip(plan.role(role), members, strict=True):
                bound = make(node, h, mapping)
                if out[h.name].engine is None:
                    out[h.name].engine = bound
                else:
                    out[h.name].extras.append(bound)
        out[routers[0].name].router = make(plan.role("router")[0], routers[0], mapping)
        return out

    replicas = replicas_of(hosts)
    for replica in replicas:
        members = [h for h in hosts if replica_of(h) == replica]
        for name, bound_node in _bind_group(plan, members, replica, len(replicas), common, make).items():
            out[name].engine = bound_node
    return out


def _bind_group(plan: Plan, hosts: list[HostRecord], replica: int, count: int, common: Mapping[str, str],
                make: Callable[[NodePlan, HostRecord, Mapping[str, str], int], BoundNode]) -> dict[str, BoundNode]:
    """One engine group (a replica): its head and workers, checked against the plan, placeholders filled."""
    where = f" of replica {replica}" if count > 1 else ""
    heads = [h for h in hosts if "head" in h.groups]
    if len(heads) != 1:
        raise K3Error(f"{plan.strategy} needs exactly one host in group head{where}, found {len(heads)}"
                      + (f" ({', '.join(h.name for h in heads)})" if heads else
                         (": give one head host this k3_replica" if count > 1 else
                          ": add a head group to the inventory")))
    workers = _ranked(hosts, "workers")
    if heads[0] in workers:
        raise K3Error(f"host {heads[0].name} is in both head and workers")
    ordered = [heads[0], *workers]
    if len(ordered) != len(plan.nodes):
        raise K3Error(f"the plan for {plan.strategy} on {plan.hardware} has {len(plan.nodes)} node(s) but the "
                      f"inventory{where} has {len(ordered)} (1 head + {len(workers)} workers): "
                      + ("give every replica the same number of hosts" if count > 1 else
                         "set k3_nodes or fix the inventory"))
    if heads[0].data.get("rank") not in (None, 0):
        raise K3Error(f"head host {heads[0].name} has rank {heads[0].data.get('rank')}; the head is rank 0")
    for i, w in enumerate(workers, start=1):
        if w.data.get("rank") is not None and int(w.data["rank"]) != i:
            raise K3Error(f"workers{where} must have ranks 1..{len(workers)}; host {w.name} has rank "
                          f"{w.data['rank']}")
    mapping = {**common, "HEAD_IP": heads[0].address}
    return {h.name: make(node, h, mapping, replica) for node, h in zip(plan.nodes, ordered, strict=True)}


def rendezvous_port(argv: list[str]) -> int | None:
    """The TCP port workers join on: ``--master-port`` (nnodes) or ``--data-parallel-rpc-port`` (DP address),
    read as vLLM's parser reads them (the last occurrence wins).

    >>> rendezvous_port(["vllm", "serve", "m", "--nnodes", "2", "--master-port", "1", "--master-port=29600"])
    29600
    """
    if flag_value(argv, "--nnodes") is not None:
        return int_value(argv, "--master-port", default=DEFAULT_MASTER_PORT)
    if flag_value(argv, "--data-parallel-address", "-dpa") is not None:
        return int_value(argv, "--data-parallel-rpc-port", "-dpp", default=DEFAULT_DP_RPC_PORT)
    return None
