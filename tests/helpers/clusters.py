"""Small clusters as inventory records, for tests that render every strategy x vendor family without any host.

Example::

    >>> [r.name for r in records("gb300", "multi_node_tp", 2)]
    ['n0', 'n1']
    >>> smallest_rollout(["gb300"], "multi_node_tp").plan.strategy
    'multi_node_tp'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from k3deploy.errors import K3Error
from k3deploy.model.binding import HostRecord
from k3deploy.model.pipeline import desired_rollout, target
from k3deploy.model.rollout import Rollout

#: one or two hardware ids per vendor family (the first that offers a strategy is used)
FAMILIES = {"NVIDIA": ["gb300", "h200"], "AMD": ["mi300x"], "Ascend": ["ascend_910c"]}
#: every strategy the recipe engine knows
STRATEGIES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "k3deploy" / "data" / "strategies")
                    .glob("*.yaml"))


def records(hardware: str, strategy: str, nodes: int, **extra: Any) -> list[HostRecord]:
    """``nodes`` hosts for ``strategy`` (P/D: half prefill with the router on the first, half decode), with ``extra``
    variables on every host."""
    data = {"k3_hardware": hardware, "k3_strategy": strategy, **extra,
            **({"k3_variant": "ascend_w4a8"} if hardware.startswith("ascend") else {})}
    if strategy == "pd_cluster":
        prefill = max(1, nodes // 2)
        return ([HostRecord(f"p{i}", ("prefill", "router") if i == 0 else ("prefill",),
                            {**data, "k3_ip": f"192.0.2.{10 + i}", "rank": i}) for i in range(prefill)]
                + [HostRecord(f"d{i}", ("decode",), {**data, "k3_ip": f"192.0.2.{50 + i}", "rank": i})
                   for i in range(nodes - prefill)])
    return [HostRecord(f"n{i}", ("head",) if i == 0 else ("workers",),
                       {**data, "k3_ip": f"192.0.2.{10 + i}", "rank": i}) for i in range(nodes)]


def smallest_rollout(hardware: list[str], strategy: str, **extra: Any) -> Rollout | None:
    """The smallest cluster of the first of ``hardware`` that offers ``strategy``, rendered (None: none offers it)."""
    for hw in hardware:
        for nodes in range(1, 9):
            try:
                wanted = target(records(hw, strategy, nodes, **extra), None)
            except K3Error:   # a strategy the recipe does not offer on this hardware
                break
            if wanted.plan is not None:
                return desired_rollout(wanted)
    return None
