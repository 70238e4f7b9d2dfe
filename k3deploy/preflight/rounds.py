"""A second round across hosts: once every host's facts are in, each host runs one fact with its own targets (the
peers it pings), one command per host, all hosts at once. The packs' cluster-wide probes
(:class:`~k3deploy.preflight.base.ClusterProbe`: the NPUs' pings to their peers) and the RDMA reach round
(:func:`k3deploy.preflight.across.rdma_reach_round`) run their pings through it.

Example::

    >>> got = ping_round(state, hosts, {"n1": [[0, "", "10.2.0.2"]]}, HccnPing)   # doctest: +SKIP
    >>> got["n1"]                                                                   # doctest: +SKIP
    [NpuPing(device=0, address='10.2.0.2', ...)]
"""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase
from pyinfra.api.state import State

from k3deploy.facts.batch import read_batch
from k3deploy.facts.parallel import each_host


def ping_round(state: State, hosts: list[Any], targets: dict[str, Any], fact: type[FactBase[Any]]) -> dict[str, Any]:
    """A second round's pings: ``fact`` with each host's ``targets``, one command per host, all hosts at once; per
    host its value, or why it could not be read (a dropped connection: the check says so)."""
    by_name = {host.name: host for host in hosts}
    pinging = [by_name[name] for name in targets if name in by_name]

    def one(host: Any) -> Any:
        try:
            return read_batch(state, host, [("pings", fact, {"targets": targets[host.name]})])["pings"]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:200]

    return dict(zip([host.name for host in pinging], each_host(state, pinging, one), strict=True))
