"""``plan`` rule on memory: the nodes a plan (or each P/D pool) gets hold the variant's weights."""

from __future__ import annotations

from math import ceil

from k3deploy.recipe.lint.context import PlanContext
from k3deploy.recipe.lint.registry import rule


@rule("memory-fit")
def memory_fit(ctx: PlanContext) -> None:
    """The planned nodes (each P/D pool) have less GPU memory than the variant's ``vram_minimum_gb``."""
    plan, hw = ctx.plan, ctx.hw
    v = ctx.recipe.variants.get(plan.variant)
    need = v.vram_minimum_gb if v else None
    have = hw.vram_gb
    if not need or not have:
        return
    engines = [e.node for e in ctx.engines]
    path = f"variants.{plan.variant}.vram_minimum_gb"
    if ctx.strategy.pd:
        for role in ("prefill", "decode"):
            nodes = [n for n in engines if n.role == role]
            if not nodes:
                continue
            pool = nodes[0].pool_nodes or 0
            gb = have * pool if pool else have / 2
            if gb < need:
                size = f"{pool} node{'s' if pool != 1 else ''} × {have:g} GB" if pool else \
                    f"half of one {hw.id} node"
                ctx.add("error", f"the {role} pool on {hw.id} has {size} = {gb:g} GB, below "
                        f"the {need:g} GB variant {plan.variant} needs",
                        f"use --{role}-nodes {ceil(need / have)} or more", path, None)
        return
    n = len(engines)
    gb = have * n
    if gb < need:
        ctx.add("error",
                f"{plan.strategy} on {hw.id} plans {n} node{'s' if n != 1 else ''} × {have:g} GB = "
                f"{gb:g} GB, below the {need:g} GB variant {plan.variant} needs",
                f"use ≥{ceil(need / have)} nodes (a multi_node_* strategy, --nodes {ceil(need / have)})"
                if ctx.strategy.multi_node or n == 1 else f"use ≥{ceil(need / have)} nodes", path, None)
