"""``plan`` rules on data-parallel load balancing: one node's LB flags, and, across the nodes of a pool,
the data-parallel rendezvous without ``--nnodes`` (the head checks remote engines' ``--headless`` against its
own load-balancing mode; vLLM: 'Remote engine N must use --headless unless in external or hybrid dp lb
mode')."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from k3deploy.recipe.lint.context import EngineNode, PlanContext
from k3deploy.recipe.lint.registry import rule


@rule("lb-headless")
def lb_headless(ctx: PlanContext) -> None:
    """Hybrid LB on a headless node."""
    for e in ctx.engines:
        lay = e.layout
        if lay.hybrid_lb and lay.headless:
            ctx.add("error", "--data-parallel-hybrid-lb with --headless (vLLM: "
                    "'data_parallel_hybrid_lb is not applicable in headless mode')",
                    "drop --headless from hybrid-LB nodes", ctx.arg_path(e.node, lay.args["--data-parallel-hybrid-lb"]),
                    e.role)


@rule("lb-modes")
def lb_modes(ctx: PlanContext) -> None:
    """Hybrid and external LB together."""
    for e in ctx.engines:
        lay = e.layout
        if lay.hybrid_lb and lay.external_lb:
            ctx.add("error", "--data-parallel-hybrid-lb and --data-parallel-external-lb together",
                    "choose one load-balancing mode", ctx.arg_path(e.node, lay.args["--data-parallel-hybrid-lb"]),
                    e.role)


@rule("lb-hybrid-local")
def lb_hybrid_local(ctx: PlanContext) -> None:
    """Hybrid LB without a local data-parallel size."""
    for e in ctx.engines:
        lay = e.layout
        if lay.hybrid_lb and lay.dp_local is None and lay.nnodes <= 1:
            ctx.add("error", "--data-parallel-hybrid-lb needs --data-parallel-size-local",
                    "add --data-parallel-size-local", ctx.arg_path(e.node, lay.args["--data-parallel-hybrid-lb"]),
                    e.role)


@dataclass
class _Pool:
    """The engine nodes of one pool (``engine``, ``prefill`` or ``decode``) whose head runs data parallel
    without ``--nnodes``."""

    name: str
    members: list[EngineNode]
    head: EngineNode
    head_lb: bool  # the head runs hybrid or external LB

    def remotes(self) -> Iterator[EngineNode]:
        """The other members that join the head's data parallel group by rank."""
        for e in self.members:
            lay = e.layout
            if e is self.head or lay.nnodes > 1 or not (lay.dp_start or lay.dp_rank):
                continue
            yield e


def _dp_pools(ctx: PlanContext) -> Iterator[_Pool]:
    groups: dict[str, list[EngineNode]] = {}
    for e in ctx.engines:
        groups.setdefault(e.role if e.role in ("prefill", "decode") else "engine", []).append(e)
    for pool, members in groups.items():
        heads = [e for e in members if (e.layout.dp_start or 0) == 0 and e.layout.dp_rank is None]
        if not heads:
            continue
        head = heads[0].layout
        if head.nnodes > 1 or head.dp <= 1:
            continue
        local = head.dp_local if head.dp_local is not None else head.dp
        yield _Pool(pool, members, heads[0], head.external_lb or (head.hybrid_lb and local < head.dp))


@rule("dp-headless")
def dp_headless(ctx: PlanContext) -> None:
    """A remote data-parallel rank whose ``--headless`` does not match its head's load-balancing mode."""
    for pool in _dp_pools(ctx):
        for e in pool.remotes():
            lay, role = e.layout, e.role
            arg = lay.args.get("--data-parallel-start-rank") or lay.args.get("--data-parallel-rank")
            if not pool.head_lb and not lay.headless:
                mode = "external" if (lay.dp_local or 1) == 1 else "hybrid"
                ctx.add("error",
                        f"a {role} node has {arg.option if arg else '--data-parallel-start-rank'} "
                        f"without --headless ({mode} LB on that node) while its head runs internal-LB data "
                        "parallel; the head refuses it ('Remote engine must use --headless unless in external "
                        "or hybrid dp lb mode')",
                        "add --headless to that worker (one endpoint on the head; k3deploy's deployable "
                        "plan does, see k3deploy.recipe.fixes), or run every node in hybrid/external LB with a load "
                        "balancer in front",
                        ctx.arg_path(e.node, arg), role)
            elif pool.head_lb and lay.headless:
                ctx.add("error", f"a {role} node is --headless but its head runs "
                        "hybrid/external-LB data parallel (vLLM: 'must not use --headless')",
                        "drop --headless on that node", ctx.arg_path(e.node, lay.args.get("--headless")), role)


@rule("dp-endpoints")
def dp_endpoints(ctx: PlanContext) -> None:
    """Hybrid/external-LB data parallel over several nodes: one API endpoint per node."""
    for pool in _dp_pools(ctx):
        if pool.head_lb and len(pool.members) > 1 and pool.name != "decode":
            head = pool.head
            ctx.add("info", "hybrid/external-LB data parallel: every node serves its own API port; the deploy "
                    "puts a vllm-router in front of them (k3_front_hybrid_lb, on by default), so clients get one "
                    "endpoint",
                    "nothing to do for a k3deploy deploy; run by hand, put a load balancer in front of all nodes, "
                    "or use internal LB (workers --headless, no --data-parallel-hybrid-lb) for one endpoint",
                    ctx.arg_path(head.node, head.layout.args.get("--data-parallel-hybrid-lb")), head.role)
