"""Validate a selection against a recipe and resolve it into a :class:`~k3deploy.plan.Plan`. Pure: no I/O.

Example::

    >>> from k3deploy import load_recipe, resolve
    >>> plan = resolve(load_recipe(), hardware="b300")
    >>> plan.strategy, plan.nodes[0].argv[:4]
    ('single_node_tp', ['vllm', 'serve', 'moonshotai/Kimi-K3', '--trust-remote-code'])
"""

from __future__ import annotations

import itertools
import re
from math import ceil
from typing import Any, Iterator, Sequence

from k3deploy.errors import SelectionError
from k3deploy.plan import NodePlan, Plan
from k3deploy.recipe import Recipe, Variant
from k3deploy.synthesis import (
    PoolSpec,
    default_features,
    fits_single_node,
    js_or,
    nodes_for,
    nodes_for_strategy,
    offered_strategies,
    reachable,
    recommend_strategy,
    strategy_supported_on,
    synthesize,
)
from k3deploy.taxonomy import MAX_NODES, HardwareProfile, Strategy, hardware, pinned_images, strategies

# ------------------------------------------------------------------------------------------------
# What a recipe offers


def _names(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "(none)"


def precision_ok(variant: Variant, hw: HardwareProfile) -> bool:
    allowed = variant.precision_hardware
    if allowed:
        keys = allowed if isinstance(allowed, list) else [allowed]
        return any(k in (hw.id, hw.gen, hw.brand.lower(), hw.brand) for k in keys)
    if (variant.precision or "").lower() in ("nvfp4", "fp4"):
        return hw.brand == "NVIDIA" and "blackwell" in hw.generations
    return True


def hardware_for_variant(recipe: Recipe, variant_key: str) -> list[str]:
    """Hardware ids a variant can be deployed on (the recipes site's hardware candidates)."""
    return list(recipe.memo(("hardware_for_variant", variant_key), lambda: _hardware_for_variant(recipe, variant_key)))


def _hardware_for_variant(recipe: Recipe, variant_key: str) -> list[str]:
    v = recipe.variants[variant_key]
    out = []
    for hw_id, hw in hardware().items():
        if not precision_ok(v, hw):
            continue
        if recipe.meta.hardware.get(hw_id) == "unsupported":
            continue
        if v.supported_hardware and hw_id not in v.supported_hardware:
            continue
        if hw.restricted and hw_id not in recipe.meta.hardware:
            continue
        out.append(hw_id)
    return out


def strategies_on(recipe: Recipe, hw: HardwareProfile) -> list[str]:
    """Strategies offered on one hardware id: offered, per-GPU gate, reachable, scalable."""
    return list(recipe.memo(("strategies_on", hw.id), lambda: _strategies_on(recipe, hw)))


def _strategies_on(recipe: Recipe, hw: HardwareProfile) -> list[str]:
    known = strategies()
    out = []
    for s in offered_strategies(recipe):
        strat = known.get(s)
        if strat is None or not strategy_supported_on(recipe, s, hw) or not reachable(recipe, strat, hw):
            continue
        if not hw.scalable and strat.deploy_type in ("multi_node", "pd_cluster"):
            continue
        out.append(s)
    return out


def recommended(recipe: Recipe, variant_key: str, hw: HardwareProfile) -> tuple[str, int]:
    """The recommended strategy and node count for (variant, hardware), as the recipes site picks them."""
    return recipe.memo(("recommended", variant_key, hw.id), lambda: _recommended(recipe, variant_key, hw))


def _recommended(recipe: Recipe, variant_key: str, hw: HardwareProfile) -> tuple[str, int]:
    offered_here = strategies_on(recipe, hw)
    v = recipe.variants[variant_key]
    base_n = 2 if (not fits_single_node(v, hw) and any(s.startswith("multi_node_") for s in offered_here)) else 1
    rec = recommend_strategy(recipe, offered_strategies(recipe), base_n)
    if rec not in offered_here:
        fallback = [s for s in offered_here if s != "pd_cluster"] or offered_here
        if not fallback:
            raise SelectionError(f"recipe {recipe.slug} offers no strategy on {hw.id}")
        rec = fallback[0]
    strat = strategies()[rec]
    n = max(base_n, nodes_for(recipe, strat, hw)) if strat.multi_node else 1
    return rec, n


def strategy_nodes(recipe: Recipe, variant_key: str, strategy: Strategy, hw: HardwareProfile) -> int:
    rec, rec_n = recommended(recipe, variant_key, hw)
    if strategy.id == rec:
        return rec_n
    return nodes_for(recipe, strategy, hw) if strategy.multi_node else 1


def pd_default_pools(recipe: Recipe, variant: Variant, strategy: Strategy, hw: HardwareProfile) -> tuple[int, int]:
    """The recipes site's P/D pool sizes; (0, 0) means prefill and decode co-located on one node."""
    need, have = variant.vram_minimum_gb or 0, hw.vram_gb or 0
    if hw.gpu_count >= 2 and have >= 2 * need:
        return 0, 0
    if not need or not have:
        return 0, 0
    per = ceil(need / have)
    if per > 4:
        raise SelectionError(
            f"pd_cluster on {hw.id} needs {per} nodes per pool to hold the model: "
            f"pass --prefill-nodes and --decode-nodes explicitly"
        )
    so = recipe.strategy_overrides.get("pd_cluster")
    sizes = []
    for role in ("prefill", "decode"):
        role_ov = getattr(so, role) if so is not None else None
        par = js_or(role_ov.parallelism if role_ov else None, strategy.role(role).parallelism, "tp")
        sizes.append(max(per, nodes_for_strategy(recipe, par, hw)))
    return sizes[0], sizes[1]


# ------------------------------------------------------------------------------------------------
# Images

_IMAGE = re.compile(
    r"(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _builder_image(recipe: Recipe, v: Variant, hw: HardwareProfile) -> str | None:
    pin = v.hardware_overrides.get(hw.id)
    if pin is not None and isinstance(pin.docker_image, str):
        return pin.docker_image
    key = hw.brand_key
    image: str | None = None
    cuda_map: dict[str, Any] | None = None
    for o in (v.docker_image, recipe.model.docker_image):
        if image or cuda_map or o is None:
            continue
        if isinstance(o, str):
            if key == "nvidia":
                image = o
        elif isinstance(o, dict):
            if any(k in o for k in ("nvidia", "amd", "tpu", "intel")):
                val = o.get(key)
                if isinstance(val, str):
                    image = val
                elif key == "nvidia" and isinstance(val, dict):
                    cuda_map = val
            elif key == "nvidia" and ("cu129" in o or "cu130" in o):
                cuda_map = o
    if image:
        return image
    if hw.gen == "xpu":
        return "vllm/vllm-openai-xpu:latest"
    if cuda_map:
        return cuda_map.get("cu130") or cuda_map.get("cu129")
    nightly = recipe.model.nightly_required
    defaults = {
        "nvidia": "vllm/vllm-openai:nightly" if nightly else "vllm/vllm-openai:latest",
        "amd": "vllm/vllm-openai-rocm:nightly" if nightly else "vllm/vllm-openai-rocm:latest",
        "tpu": "vllm/vllm-tpu:nightly" if nightly else "vllm/vllm-tpu:latest",
        "intel": None if nightly else "vllm/vllm-openai-cpu:latest-x86_64",
    }
    return defaults.get(key)


def resolve_image(recipe: Recipe, variant_key: str, hw: HardwareProfile, override: str | None = None) -> str:
    """The container image for (recipe, variant, hardware), with k3deploy's pins and an optional override.

    ``override`` is a full reference (``repo[:tag][@sha256:...]``), ``:tag`` (another tag of the default
    repository) or ``@sha256:<64 hex>`` (the default image pinned by digest).
    """
    v = recipe.variants[variant_key]
    pin = v.hardware_overrides.get(hw.id)
    if pin is not None and isinstance(pin.docker_image, str):
        image = pin.docker_image
    else:
        image = pinned_images().get(recipe.slug, {}).get(hw.vendor) or _builder_image(recipe, v, hw)
    if image is None:
        raise SelectionError(f"no container image known for {hw.id}: set an image with --image REPO:TAG")
    if not override:
        return image
    m = _IMAGE.fullmatch(image)
    base = m.group("name") if m else image.split("@")[0].rsplit(":", 1)[0]
    if override.startswith("@"):
        if not _DIGEST.fullmatch(override[1:]):
            raise SelectionError(
                f"image digest {override!r} is not of the form @sha256:<64 lowercase hex digits>")
        return image.split("@")[0] + override
    if override.startswith(":"):
        candidate = base + override
    else:
        candidate = override
    if not _IMAGE.fullmatch(candidate) or ":" not in candidate.split("/")[-1] and "@" not in candidate:
        raise SelectionError(
            f"image {override!r} is not a pinned image reference: use REPO:TAG, REPO@sha256:<digest>, "
            f":TAG or @sha256:<digest>")
    return candidate


# ------------------------------------------------------------------------------------------------
# resolve()


def _hardware(hw_id: str) -> HardwareProfile:
    known = hardware()
    hw = known.get(hw_id)
    if hw is None:
        raise SelectionError(f"unknown hardware {hw_id!r}: choose one of {_names(sorted(known))}")
    return hw


def _check_count(name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SelectionError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise SelectionError(f"{name} must be ≥ {minimum}, got {value}")
    if value > MAX_NODES:
        raise SelectionError(f"{name} must be ≤ {MAX_NODES} (the largest cluster the recipes cover), got {value}")
    return value


def _floor_message(recipe: Recipe, strat_key: str, label: str, hw: HardwareProfile, nodes: int) -> str | None:
    from k3deploy.synthesis import min_gpus_for_strategy

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
    if hardware not in globals()["hardware"]():
        offered = sorted({h for v in recipe.variants for h in hardware_for_variant(recipe, v)})
        raise SelectionError(f"unknown hardware {hardware!r}: {recipe.slug} runs on {_names(offered)}")
    hw = _hardware(hardware)
    if variant not in recipe.variants:
        raise SelectionError(
            f"unknown variant {variant!r} in recipe {recipe.slug}: choose one of {_names(list(recipe.variants))}")
    on_hw = hardware_for_variant(recipe, variant)
    if hw.id not in on_hw:
        others = [k for k in recipe.variants if hw.id in hardware_for_variant(recipe, k)]
        fix = f"use --variant {others[0]}" if others else "this recipe does not deploy on it"
        raise SelectionError(
            f"variant {variant} of {recipe.slug} does not support {hw.id} (it runs on {_names(on_hw)}): {fix}")
    offered_here = strategies_on(recipe, hw)
    if strategy is None:
        strategy, _ = recommended(recipe, variant, hw)
    known = strategies()
    if strategy not in known:
        raise SelectionError(f"unknown strategy {strategy!r}: choose one of {_names(sorted(known))}")
    if strategy not in offered_here:
        raise SelectionError(
            f"strategy {strategy} is not offered on {hw.id} by {recipe.slug}: choose one of {_names(offered_here)}")
    strat = known[strategy]

    # features
    if features is None:
        chosen = default_features(recipe, recipe.variants[variant], hw)
    else:
        unknown = [f for f in features if f not in recipe.features]
        if unknown:
            raise SelectionError(
                f"unknown feature {unknown[0]!r} in recipe {recipe.slug}: choose from {_names(list(recipe.features))}")
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
        raise SelectionError(f"{strategy} needs at least 2 nodes, got --nodes {nodes}: use --nodes 2 or a single_node_* strategy")
    msg = _floor_message(recipe, strategy, strategy, hw, nodes)
    if msg:
        raise SelectionError(msg)

    syn = synthesize(recipe, variant=variant, strategy=strat, hw=hw, features=chosen, nodes=nodes,
                     advanced_args=extra, frontend=frontend)
    plan_nodes = [
        NodePlan(role="head" if r == 0 else "worker", rank=r, argv=argv, env=dict(syn.env), port=_port(argv, 8000))
        for r, argv in enumerate(syn.argvs)
    ]
    return Plan(recipe=recipe.slug, model=syn.model_id, hardware=hw.id, strategy=strategy, variant=variant,
                features=applied, image=img, vendor=hw.vendor, nodes=plan_nodes, warnings=warnings)


def _port(argv: list[str], default: int) -> int:
    port = default
    for i, a in enumerate(argv[:-1]):
        if a == "--port" and argv[i + 1].isdigit():
            port = int(argv[i + 1])
    return port


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
    so = recipe.strategy_overrides.get("pd_cluster")
    pools = {"prefill": p, "decode": d}
    if p:
        for role, n in pools.items():
            role_ov = getattr(so, role) if so is not None else None
            par = js_or(role_ov.parallelism if role_ov else None, strat.role(role).parallelism, "tp")
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
    return Plan(recipe=recipe.slug, model=plan_nodes[0].argv[2], hardware=hw.id, strategy=strat.id, variant=variant,
                features=applied, image=img, vendor=hw.vendor, nodes=plan_nodes, warnings=warnings)


# ------------------------------------------------------------------------------------------------
# The offered matrix


def iter_matrix(recipe: Recipe, *, feature_subsets: bool = True) -> Iterator[dict[str, Any]]:
    """Every offered selection: hardware × offered strategy × variant × feature subset, at the site's node count.

    Yields keyword arguments for :func:`resolve` (``hardware``, ``strategy``, ``variant``, ``features``).
    """
    names = list(recipe.features)
    if feature_subsets:
        subsets = [list(c) for k in range(len(names) + 1) for c in itertools.combinations(names, k)]
    else:
        subsets = [None]  # type: ignore[list-item]
    for variant in recipe.variants:
        for hw_id in hardware_for_variant(recipe, variant):
            hw = hardware()[hw_id]
            for strategy in strategies_on(recipe, hw):
                for feats in subsets:
                    yield {"hardware": hw_id, "strategy": strategy, "variant": variant, "features": feats}


def pick_default_hardware(recipe: Recipe, variant_key: str = "default") -> str | None:
    """The hardware the recipes site opens a recipe on (``meta.default_hardware`` when it is a candidate)."""
    cands = hardware_for_variant(recipe, variant_key)
    v = recipe.variants[variant_key]
    if recipe.meta.default_hardware in cands:
        return recipe.meta.default_hardware
    if (v.precision or "").lower() in ("nvfp4", "fp4"):
        for hw_id in ("b200", "gb200"):
            if hw_id in cands:
                return hw_id
    if "h200" in cands:
        return "h200"
    order = {"NVIDIA": 0, "AMD": 1}
    cands.sort(key=lambda h: (order.get(hardware()[h].brand, 2), h))
    return cands[0] if cands else None


def offering(recipe: Recipe, *, hardware_id: str | None = None, variant: str | None = None) -> dict[str, Any]:
    """What a recipe offers: variants with their hardware, strategies per hardware, features."""
    from k3deploy.synthesis import min_gpus_for_strategy

    if variant is not None and variant not in recipe.variants:
        raise SelectionError(
            f"unknown variant {variant!r} in recipe {recipe.slug}: choose one of {_names(list(recipe.variants))}")
    if hardware_id is not None:
        _hardware(hardware_id)
    variants = [variant] if variant else list(recipe.variants)
    out: dict[str, Any] = {"recipe": recipe.slug, "model": recipe.model.model_id,
                           "default_hardware": pick_default_hardware(recipe, variants[0]), "variants": {},
                           "hardware": {}, "features": []}
    for vk in variants:
        v = recipe.variants[vk]
        hws = hardware_for_variant(recipe, vk)
        if hardware_id is not None:
            hws = [h for h in hws if h == hardware_id]
        out["variants"][vk] = {"model": v.model_id or recipe.model.model_id, "precision": v.precision,
                               "vram_minimum_gb": v.vram_minimum_gb, "hardware": hws}
        for hw_id in hws:
            hw = hardware()[hw_id]
            entry = out["hardware"].setdefault(hw_id, {"gpus_per_node": hw.gpu_count, "node_vram_gb": hw.vram_gb,
                                                      "variants": [], "recommended": {}, "strategies": []})
            entry["variants"].append(vk)
            rec, rec_n = recommended(recipe, vk, hw)
            entry["recommended"][vk] = {"strategy": rec, "nodes": rec_n}
            if entry["strategies"]:
                continue
            for s in strategies_on(recipe, hw):
                strat = strategies()[s]
                row: dict[str, Any] = {"strategy": s, "deploy_type": strat.deploy_type,
                                       "min_gpus": min_gpus_for_strategy(recipe, s, hw)}
                if strat.pd:
                    try:
                        p, d = pd_default_pools(recipe, v, strat, hw)
                        row["prefill_nodes"], row["decode_nodes"] = p, d
                    except SelectionError:
                        row["prefill_nodes"] = row["decode_nodes"] = None
                else:
                    row["nodes"] = strategy_nodes(recipe, vk, strat, hw)
                entry["strategies"].append(row)
    defaults = default_features(recipe, recipe.variants[variants[0]],
                                hardware()[hardware_id] if hardware_id else hardware()["h200"])
    for name, feat in recipe.features.items():
        out["features"].append({"name": name, "default": name in defaults, "opt_in": name in recipe.opt_in_features,
                                "strategies": feat.strategies or None, "description": feat.description})
    return out
