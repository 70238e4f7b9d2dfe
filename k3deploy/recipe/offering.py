"""What a recipe offers: hardware per variant, strategies per hardware, recommendations, pool sizes and the
offered matrix, as the recipes site computes them. Pure: no I/O.

Example::

    >>> from k3deploy import load_recipe
    >>> from k3deploy.recipe.taxonomy import hardware
    >>> recommended(load_recipe(), "default", hardware()["gb300"])
    ('multi_node_tp', 2)
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from math import ceil
from typing import Any

from k3deploy.errors import SelectionError
from k3deploy.recipe.rules import (
    default_features,
    fits_single_node,
    js_or,
    min_gpus_for_strategy,
    nodes_for,
    nodes_for_strategy,
    offered_strategies,
    reachable,
    recommend_strategy,
    strategy_supported_on,
)
from k3deploy.recipe.schema import Recipe, Variant
from k3deploy.recipe.taxonomy import HardwareProfile, Strategy, hardware, strategies

# ------------------------------------------------------------------------------------------------
# What a recipe offers


def _norm(text: str) -> str:
    return text.strip().lower().replace("-", "_")


def near(value: str, choices: Iterable[str]) -> str | None:
    """The choice ``value`` most likely meant: the same up to case and ``-``/``_``, else a close spelling."""
    options = list(choices)
    for c in options:
        if _norm(c) == _norm(value):
            return c
    close = difflib.get_close_matches(_norm(value), [_norm(c) for c in options], n=1, cutoff=0.6)
    return next((c for c in options if close and _norm(c) == close[0]), None)


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` or ``""``."""
    hit = near(value, choices)
    return f" (did you mean {hit!r}?)" if hit is not None and hit != value else ""


def listing(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "(none)"


def supported_hardware(recipe: Recipe, where: Callable[[str], bool] | None = None) -> list[str]:
    """The one list of the hardware k3deploy deploys: the ids a variant of ``recipe`` runs on, sorted (``where``:
    those of them it accepts, e.g. the simulator's IMEX trays). Every error that lists hardware lists it from here
    (:func:`unknown_hardware`, the simulator's), so they all name the same ids, spelt the same.

    >>> from k3deploy import load_recipe
    >>> listing(supported_hardware(load_recipe(), lambda h: h.startswith("gb")))
    'gb200, gb300'
    """
    ids = sorted({h for v in recipe.variants for h in hardware_for_variant(recipe, v)})
    return [h for h in ids if where is None or where(h)]


def hardware_profile(hw_id: str, recipe: Recipe) -> HardwareProfile:
    """The hardware profile of ``hw_id``, or :func:`unknown_hardware`'s error."""
    hw = hardware().get(hw_id)
    if hw is None:
        raise unknown_hardware(recipe, hw_id)
    return hw


def precision_ok(variant: Variant, hw: HardwareProfile) -> bool:
    allowed = variant.precision_hardware
    if allowed:
        keys = allowed if isinstance(allowed, list) else [allowed]
        return any(k in (hw.id, hw.gen, hw.brand.lower(), hw.brand) for k in keys)
    if (variant.precision or "").lower() in ("nvfp4", "fp4"):
        return hw.brand == "NVIDIA" and "blackwell" in hw.generations
    return True


def unknown_hardware(recipe: Recipe, hw_id: str) -> SelectionError:
    """The error for a hardware id the taxonomy does not know, listing the ids the recipe runs on (``options`` and
    ``resolve`` say the same) with a did-you-mean."""
    offered = supported_hardware(recipe)
    return SelectionError(f"unknown hardware {hw_id!r}: {recipe.slug} runs on {listing(offered)}"
                          + did_you_mean(hw_id, offered))


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


def pool_parallelism(recipe: Recipe, strategy: Strategy, role: str) -> str:
    """The parallelism of a P/D pool: the recipe's override, else the strategy's, else ``tp``."""
    so = recipe.strategy_overrides.get(strategy.id)
    role_ov = getattr(so, role) if so is not None else None
    return str(js_or(role_ov.parallelism if role_ov else None, strategy.role(role).parallelism, "tp"))


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
    sizes = [max(per, nodes_for_strategy(recipe, pool_parallelism(recipe, strategy, role), hw))
             for role in ("prefill", "decode")]
    return sizes[0], sizes[1]


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
    if variant is not None and variant not in recipe.variants:
        raise SelectionError(
            f"unknown variant {variant!r} in recipe {recipe.slug}: choose one of {listing(list(recipe.variants))}")
    if hardware_id is not None and hardware_id not in hardware():
        raise unknown_hardware(recipe, hardware_id)
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
                    floors = {role: min_gpus_for_strategy(recipe, pool_parallelism(recipe, strat, role), hw)
                              for role in ("prefill", "decode")}
                    row["min_gpus"] = sum(floors.values())  # each pool needs its own floor
                    row["min_gpus_per_pool"] = floors
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
