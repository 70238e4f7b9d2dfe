"""Validate a selection against a recipe and resolve it into a :class:`~k3deploy.recipe.plan.Plan`. Pure: no I/O.

Example::

    >>> from k3deploy import load_recipe, resolve
    >>> plan = resolve(load_recipe(), hardware="b300")
    >>> plan.strategy, plan.nodes[0].argv[:4]
    ('single_node_tp', ['vllm', 'serve', 'moonshotai/Kimi-K3', '--trust-remote-code'])
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil
from typing import Any

from k3deploy.errors import SelectionError
from k3deploy.recipe.argv import has_flag, int_at, int_value, last_flags
from k3deploy.recipe.images import resolve_image
from k3deploy.recipe.offering import (
    did_you_mean,
    hardware_for_variant,
    hardware_profile,
    listing,
    pd_default_pools,
    pool_parallelism,
    recommended,
    strategies_on,
    strategy_nodes,
    unknown_hardware,
)
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.recipe.rules import PoolSpec, default_features, min_gpus_for_strategy, synthesize
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import BUILDER_MAX_NODES, MAX_NODES, HardwareProfile, Strategy, strategies
from k3deploy.recipe.taxonomy import hardware as hardware_profiles


def _check_count(name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SelectionError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise SelectionError(f"{name} must be ≥ {minimum}, got {value}")
    if value > MAX_NODES:
        raise SelectionError(f"{name} must be ≤ {MAX_NODES}, got {value}: plan several deployments (replicas) "
                             "instead of one larger group")
    return value


def _floor_message(recipe: Recipe, strat_key: str, label: str, hw: HardwareProfile, nodes: int) -> str | None:
    floor = min_gpus_for_strategy(recipe, strat_key, hw)
    if nodes * hw.gpu_count >= floor:
        return None
    need = ceil(floor / hw.gpu_count)
    return (f"{label} on {hw.id} needs ≥{floor} GPUs = {need} nodes of {hw.gpu_count}; "
            f"got {nodes} node{'s' if nodes != 1 else ''} ({nodes * hw.gpu_count} GPUs): use --nodes {need} or more")


def resolve(
    recipe: Recipe,
    *,
    hardware: str,
    strategy: str | None = None,
    variant: str = "default",
    features: Sequence[str] | None = None,
    nodes: int | None = None,
    prefill_nodes: int | None = None,
    decode_nodes: int | None = None,
    image: str | None = None,
    extra_args: Sequence[str] | None = None,
    frontend: str | None = None,
) -> Plan:
    """Resolve a selection into a plan, or raise :class:`~k3deploy.errors.SelectionError` naming the fix.

    ``strategy=None`` picks the recommended strategy for the hardware; ``features=None`` the recipe's default
    set (a list is exactly that set, emitted in the recipe's feature order); ``nodes=None`` the node count the
    recipes site picks. pd_cluster takes ``prefill_nodes``/``decode_nodes`` instead of ``nodes``.
    ``extra_args`` are appended where the recipes site puts its "Advanced" arguments (before features).
    """
    if hardware not in hardware_profiles():
        raise unknown_hardware(recipe, hardware)
    hw = hardware_profile(hardware, recipe)
    if variant not in recipe.variants:
        raise SelectionError(
            f"unknown variant {variant!r} in recipe {recipe.slug}: choose one of {listing(list(recipe.variants))}")
    on_hw = hardware_for_variant(recipe, variant)
    if hw.id not in on_hw:
        others = [k for k in recipe.variants if hw.id in hardware_for_variant(recipe, k)]
        fix = f"use --variant {others[0]}" if others else "this recipe does not deploy on it"
        raise SelectionError(
            f"variant {variant} of {recipe.slug} does not support {hw.id} (it runs on {listing(on_hw)}): {fix}")
    offered_here = strategies_on(recipe, hw)
    if strategy is None:
        strategy, _ = recommended(recipe, variant, hw)
    known = strategies()
    if strategy not in known:
        raise SelectionError(f"unknown strategy {strategy!r}: choose one of {listing(sorted(known))}"
                             + did_you_mean(strategy, known))
    if strategy not in offered_here:
        raise SelectionError(
            f"strategy {strategy} is not offered on {hw.id} by {recipe.slug}: choose one of {listing(offered_here)}")
    strat = known[strategy]

    # features
    if features is None:
        chosen = default_features(recipe, recipe.variants[variant], hw)
    else:
        unknown = [f for f in features if f not in recipe.features]
        if unknown:
            raise SelectionError(
                f"unknown feature {unknown[0]!r} in recipe {recipe.slug}: choose from {listing(list(recipe.features))}")
        wanted = set(features)
        chosen = [f for f in recipe.features if f in wanted]
    warnings: list[str] = []
    applied = []
    for f in chosen:
        scope = recipe.features[f].strategies
        if scope and strategy not in scope:
            warnings.append(f"feature {f} does not apply to {strategy} (only {', '.join(scope)}): not emitted")
        else:
            applied.append(f)

    img = resolve_image(recipe, variant, hw, image)
    extra = list(extra_args or [])

    if strat.pd:
        if nodes is not None and nodes != 1:
            raise SelectionError("pd_cluster sizes its pools with --prefill-nodes and --decode-nodes, not --nodes")
        return _resolve_pd(recipe, variant, strat, hw, chosen, applied, img, prefill_nodes, decode_nodes, extra,
                           frontend, warnings)
    if prefill_nodes is not None or decode_nodes is not None:
        raise SelectionError(f"--prefill-nodes/--decode-nodes apply to pd_cluster only, not {strategy}")
    if nodes is None:
        nodes = strategy_nodes(recipe, variant, strat, hw)
    nodes = _check_count("--nodes", nodes)
    if not strat.multi_node and nodes != 1:
        raise SelectionError(
            f"{strategy} runs on exactly 1 node, got --nodes {nodes}: use a multi_node_* strategy for {nodes} nodes")
    if strat.multi_node and nodes < 2:
        raise SelectionError(f"{strategy} needs at least 2 nodes, got --nodes {nodes}: use --nodes 2 or a "
                             "single_node_* strategy")
    msg = _floor_message(recipe, strategy, strategy, hw, nodes)
    if msg:
        raise SelectionError(msg)
    warnings += scale_warnings(strat, hw, {"": nodes})

    syn = synthesize(recipe, variant=variant, strategy=strat, hw=hw, features=chosen, nodes=nodes,
                     advanced_args=extra, frontend=frontend)
    read = [last_flags(argv, PORT, TP) for argv in syn.argvs]   # one pass over each argv
    plan_nodes = [
        NodePlan(role="head" if r == 0 else "worker", rank=r, argv=argv, env=dict(syn.env),
                 port=int_at(argv, read[r][0], 8000) or 8000)
        for r, argv in enumerate(syn.argvs)
    ]
    warnings += size_notes(recipe, plan_nodes, [int_at(argv, at, 1) or 1 for argv, (_, at) in zip(syn.argvs, read,
                                                                                                   strict=True)])
    return Plan(recipe=recipe.slug, model=syn.model_id, hardware=hw.id, strategy=strategy, variant=variant,
                features=applied, image=img, vendor=hw.vendor, nodes=plan_nodes, warnings=warnings)


def size_notes(recipe: Recipe, nodes: list[NodePlan], tps: list[int] | None = None) -> list[str]:
    """A tensor-parallel size that is not a power of two (12 from 3 trays of 4 GPUs) is unusual for a model: whether
    the dimensions the recipe gives divide by it (routed experts over the expert-parallel ranks), and the one it
    does not give (attention heads: vLLM refuses a TP size that does not divide ``num_attention_heads``).
    ``tps``: each node's tensor-parallel size where the caller has read it already.

    >>> from k3deploy import load_recipe
    >>> (note,) = size_notes(load_recipe(), [NodePlan(role="head", rank=0, argv=["vllm", "serve", "m",
    ...     "--tensor-parallel-size", "12", "--enable-expert-parallel"])])
    >>> note[:112]
    '--tensor-parallel-size 12 is an unusual size for the model: its 896 routed experts over 12 expert-parallel ranks'
    >>> "do not divide (74.67 each" in note and "divides num_attention_heads" in note
    True
    """
    out: list[str] = []
    for i, node in enumerate(nodes):
        if node.role == "router":
            continue
        tp = tps[i] if tps is not None else int_value(node.argv, *TP, default=1) or 1
        if tp & (tp - 1) == 0:   # a power of two: nothing to say (most plans: the rest is read only for a note)
            continue
        dp = int_value(node.argv, "--data-parallel-size", "-dp", default=1) or 1
        ep = has_flag(node.argv, "--enable-expert-parallel")
        experts = _routed_experts(recipe)
        parts = []
        if experts is not None and ep:
            ranks = tp * dp
            parts.append(f"its {experts} routed experts over {ranks} expert-parallel ranks "
                         + ("divide evenly" if experts % ranks == 0 else
                            f"do not divide ({experts / ranks:.2f} each: some ranks hold one more)"))
        elif experts is not None:
            parts.append(f"its {experts} routed experts are not split by count (no expert parallelism): each "
                         f"expert's weights are split {tp} ways")
        parts.append(f"the recipe does not give its attention-head count: vLLM refuses to start unless {tp} "
                     "divides num_attention_heads (the model's config.json): check it, or choose a node count "
                     "that gives a power-of-two size")
        line = f"--tensor-parallel-size {tp} is an unusual size for the model: {'; '.join(parts)}"
        if line not in out:
            out.append(line)
    return out


def _routed_experts(recipe: Recipe) -> int | None:
    """The routed experts of the recipe's model (from its ``active_parameters``: "... of 896 routed ..."), if it
    says."""
    import re

    extra = recipe.model.model_extra or {}
    m = re.search(r"of (\d+) routed", str(extra.get("active_parameters", "")))
    return int(m.group(1)) if m else None


def scale_warnings(strat: Strategy, hw: HardwareProfile, groups: dict[str, int]) -> list[str]:
    """What a plan beyond the recipes builder's range says of itself: computed by the same rules, never rendered by
    the builder; and where a group outgrows one NVLink domain (GB200/GB300 NVL72: 18 trays)."""
    out = []
    for label, n in groups.items():
        what = f"{label} of {n} nodes" if label else f"{n} nodes"
        if n > BUILDER_MAX_NODES:
            out.append(f"{what}: beyond the {BUILDER_MAX_NODES} nodes the recipes builder renders; planned by the "
                       "same rules (sizes, ranks, ports), not compared with the builder")
        domain = hw.nvl_domain
        if domain and n > domain:
            spans = f"{what} span{'s' if label else ''} {-(-n // domain)} NVLink domains of {domain} {hw.id} trays"
            if strat.tensor_parallel_across_nodes or (label and strat.pd):
                out.append(f"{spans}: tensor parallelism needs NVLink, which ends at the domain; keep a group within "
                           f"{domain} trays (several groups as replicas, or multi_node_dep)")
            else:
                out.append(f"{spans}: traffic between domains goes over RDMA; sizes that fill whole domains "
                           f"(multiples of {domain} trays) keep the groups even")
    return out


#: the flags a resolve reads back from each node's argv
PORT = ("--port",)
TP = ("--tensor-parallel-size", "-tp")


def _port(argv: list[str], default: int) -> int:
    """The API port a node serves on: its last ``--port`` (as vLLM's parser reads it), else ``default``."""
    return int_value(argv, *PORT, default=default) or default


def _resolve_pd(recipe: Recipe, variant: str, strat: Strategy, hw: HardwareProfile, chosen: list[str],
                applied: list[str], img: str, prefill_nodes: int | None, decode_nodes: int | None,
                extra: list[str], frontend: str | None, warnings: list[str]) -> Plan:
    if (prefill_nodes is None) != (decode_nodes is None):
        raise SelectionError("give both --prefill-nodes and --decode-nodes (or neither, for the recipe's pool sizes)")
    if prefill_nodes is None:
        p, d = pd_default_pools(recipe, recipe.variants[variant], strat, hw)
    else:
        p = _check_count("--prefill-nodes", prefill_nodes, minimum=0)
        d = _check_count("--decode-nodes", decode_nodes, minimum=0)
        if (p == 0) != (d == 0):
            raise SelectionError(
                "--prefill-nodes 0 and --decode-nodes 0 together co-locate both pools on one node; "
                "otherwise give each pool ≥ 1 node")
        if p == 0 and hw.gpu_count < 2:
            raise SelectionError(f"co-located P/D needs ≥ 2 GPUs per node; {hw.id} has {hw.gpu_count}")
    pools = {"prefill": p, "decode": d}
    if p:
        for role, n in pools.items():
            par = pool_parallelism(recipe, strat, role)
            msg = _floor_message(recipe, par, f"the {role} pool ({par})", hw, n)
            if msg:
                raise SelectionError(msg.replace("use --nodes", f"use --{role}-nodes"))
    plan_nodes: list[NodePlan] = []
    by_role: dict[str, list[NodePlan]] = {"prefill": [], "decode": []}
    router: list[str] = []
    for r in range(max(1, p, d)):
        pd = {role: PoolSpec(nodes=n, rank=min(r, max(1, n) - 1)) for role, n in pools.items()}
        syn = synthesize(recipe, variant=variant, strategy=strat, hw=hw, features=chosen, nodes=1, pd_nodes=pd,
                         advanced_args=extra, frontend=frontend)
        router = syn.router_argv
        for role, n in pools.items():
            if r < max(1, n):
                argv, env, meta = syn.roles[role]
                by_role[role].append(NodePlan(role=role, rank=r, argv=argv, env=env,
                                              port=_port(argv, 8001 if role == "prefill" else 8002),
                                              pool_nodes=n, parallelism=meta.parallelism))
    plan_nodes = by_role["prefill"] + by_role["decode"]
    plan_nodes.append(NodePlan(role="router", rank=0, argv=router, env={}))
    warnings += scale_warnings(strat, hw, {f"the {role} pool": n for role, n in pools.items()})
    warnings += size_notes(recipe, plan_nodes)
    return Plan(recipe=recipe.slug, model=plan_nodes[0].argv[2], hardware=hw.id, strategy=strat.id, variant=variant,
                features=applied, image=img, vendor=hw.vendor, nodes=plan_nodes, warnings=warnings)


