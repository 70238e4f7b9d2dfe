"""What a deployment asks of its hosts, before any host is read: the hardware profile, the variant's memory,
how many engine nodes, whether they talk across nodes (RDMA, multi-node NVLink) and whether it is P/D.

Pure. The preflight checks (:mod:`k3deploy.preflight.checks`) compare each host's facts with these.

Example::

    >>> from k3deploy.recipe.taxonomy import hardware
    >>> r = Requirements(hardware()["gb300"], "default", 1680.0, nodes=2, strategy="multi_node_tp", multi_node=True)
    >>> r.brand, r.mnnvl, r.needs_rdma
    ('NVIDIA', True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Requirements:
    """``hardware`` is a taxonomy profile (anything with ``id``, ``brand``, ``gpu_count``, ``vram_gb``,
    ``gpu_names`` and ``nvl``); ``nodes`` is the number of planned engine nodes (the router needs no GPU)."""

    hardware: Any
    variant: str
    vram_minimum_gb: float | None
    nodes: int
    strategy: str | None = None
    multi_node: bool = False
    pd: bool = False
    hardware_from: str = "group_vars"   # where k3_hardware was set (a fix names it)
    image: str | None = None            # the image the plan runs (a fix names it as planned, digest and all)
    one_nvlink_domain: bool = True      # each group's nodes must sit in one NVLink domain (tensor parallelism across
    #                                     trays); the groups are ``groups`` (empty: every planned node is one group)
    expert_parallel_across_nodes: bool = False   # an expert-parallel group spans nodes (its all-to-all crosses them)
    imex_per_job: bool = False          # IMEX per Slurm job (k3_imex: per_job): no standing domain, no channel 0
    #: the planned engine groups, each with its hosts, whose nodes share one NVLink domain (``one_nvlink_domain``):
    #: each replica, or a P/D cluster's pools together; empty where the inventory was not laid out
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    spares: tuple[str, ...] = ()        # the hosts standing by as spares (inventory group ``spares``)

    def group_of(self, host: str) -> tuple[str, tuple[str, ...]] | None:
        """The planned group ``host`` serves in, with its hosts (None: a spare, a host of no engine group, or no
        groups known).

        >>> from k3deploy.recipe.taxonomy import hardware
        >>> r = Requirements(hardware()["gb300"], "default", None, nodes=4, groups=(("engine-r0", ("a", "b")),
        ...                  ("engine-r1", ("c", "d"))), spares=("e",))
        >>> r.group_of("c"), r.group_of("e")
        (('engine-r1', ('c', 'd')), None)
        """
        return next((g for g in self.groups if host in g[1]), None)

    @property
    def brand(self) -> str:
        return str(self.hardware.brand)

    @property
    def mnnvl(self) -> bool:
        """Multi-node NVLink: NVL trays (GB200/GB300) used across more than one tray."""
        return bool(getattr(self.hardware, "nvl", False)) and self.nodes > 1

    @property
    def needs_rdma(self) -> bool:
        return self.nodes > 1 or self.pd
