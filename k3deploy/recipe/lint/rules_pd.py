"""``plan`` rules on prefill/decode disaggregation: what a node with a NIXL ``--kv-transfer-config`` needs."""

from __future__ import annotations

from collections.abc import Iterator

from k3deploy.recipe.lint.context import EngineNode, PlanContext
from k3deploy.recipe.lint.registry import rule


def _nixl_nodes(ctx: PlanContext) -> Iterator[EngineNode]:
    for e in ctx.engines:
        kvt = e.layout.args.get("--kv-transfer-config")
        if kvt is not None and kvt.value and "nixl" in kvt.value.lower():
            yield e


@rule("pd-hybrid-kv")
def pd_hybrid_kv(ctx: PlanContext) -> None:
    """NIXL P/D with the hybrid KV-cache manager turned off."""
    for e in _nixl_nodes(ctx):
        lay = e.layout
        if lay.boolean("--disable-hybrid-kv-cache-manager", ctx.cat):
            ctx.add("error", "NIXL P/D needs the hybrid KV-cache manager, but "
                    "--disable-hybrid-kv-cache-manager turns it off",
                    "use --no-disable-hybrid-kv-cache-manager",
                    ctx.arg_path(e.node, lay.args["--disable-hybrid-kv-cache-manager"]), e.role)


@rule("pd-conv-layout")
def pd_conv_layout(ctx: PlanContext) -> None:
    """NIXL transfer of a hybrid model's conv state without the DS conv state layout."""
    for e in _nixl_nodes(ctx):
        if ctx.hybrid_model() and e.node.env.get("VLLM_SSM_CONV_STATE_LAYOUT") != "DS":
            ctx.add("error", "NIXL transfer of Kimi-K3's KDA (Mamba-like) state needs "
                    "VLLM_SSM_CONV_STATE_LAYOUT=DS (vLLM asserts: '3-read Mamba conv transfer requires DS conv "
                    "state layout')", "set VLLM_SSM_CONV_STATE_LAYOUT=DS on every prefill and decode node",
                    ctx.env_path(e.node, "VLLM_SSM_CONV_STATE_LAYOUT"), e.role)


@rule("pd-side-channel")
def pd_side_channel(ctx: PlanContext) -> None:
    """No NIXL side-channel host: vLLM's localhost default works only on one machine."""
    for e in _nixl_nodes(ctx):
        if "VLLM_NIXL_SIDE_CHANNEL_HOST" not in e.node.env:
            ctx.add("warning", "VLLM_NIXL_SIDE_CHANNEL_HOST is unset: vLLM defaults to "
                    "localhost, which only works when prefill and decode share a machine",
                    "set VLLM_NIXL_SIDE_CHANNEL_HOST to the node's own reachable IP",
                    f"strategies/{ctx.plan.strategy}.yaml:{e.role}.env", e.role)
