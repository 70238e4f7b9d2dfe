"""``plan`` rules on one node's parallel sizes, as vLLM's ``ParallelConfig`` checks them."""

from __future__ import annotations

from k3deploy.recipe.lint.context import PlanContext
from k3deploy.recipe.lint.registry import rule


@rule("dcp-divides-tp")
def dcp_divides_tp(ctx: PlanContext) -> None:
    """The decode-context-parallel size does not divide the tensor-parallel size."""
    for e in ctx.engines:
        lay = e.layout
        if lay.dcp > 1 and lay.tp % lay.dcp:
            ctx.add("error",
                    f"--decode-context-parallel-size {lay.dcp} does not divide the tensor-parallel size {lay.tp} "
                    f"(vLLM: tp_size={lay.tp} must be divisible by dcp_size={lay.dcp})",
                    f"use a DCP size that divides {lay.tp}, or a layout with TP a multiple of {lay.dcp}",
                    ctx.arg_path(e.node, lay.args.get("--decode-context-parallel-size")), e.role)


@rule("megamoe-needs-ep")
def megamoe_needs_ep(ctx: PlanContext) -> None:
    """``--moe-backend deep_gemm_mega_moe`` without expert parallelism."""
    for e in ctx.engines:
        lay = e.layout
        if lay.moe_backend == "deep_gemm_mega_moe" and not lay.ep:
            ctx.add("error", "--moe-backend deep_gemm_mega_moe needs --enable-expert-parallel "
                    "(vLLM: 'Kimi K3 MegaMoE requires expert parallel')", "add --enable-expert-parallel",
                    ctx.arg_path(e.node, lay.args.get("--moe-backend")), e.role)


@rule("nnodes-world")
def nnodes_world(ctx: PlanContext) -> None:
    """A world size (DP×PP×TP) that the node count does not divide."""
    for e in ctx.engines:
        lay = e.layout
        if lay.nnodes > 1:
            world = lay.dp * lay.pp * lay.tp
            if world % lay.nnodes:
                ctx.add("error", f"world size {world} (DP×PP×TP) is not divisible by --nnodes {lay.nnodes}",
                        "make DP×PP×TP a multiple of the node count",
                        ctx.arg_path(e.node, lay.args.get("--nnodes")), e.role)
