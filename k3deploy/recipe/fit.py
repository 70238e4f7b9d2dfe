"""Which strategies fit a given number of nodes (or P/D pool sizes), and a did-you-mean for ids. Pure: no I/O.

Used where a cluster already exists and the strategy must follow it: ``sim up`` picks the recommended strategy that
fits its node count, and an inventory whose strategy does not fit its hosts is told which ones do.

Example::

    >>> from k3deploy import load_recipe
    >>> fitting(load_recipe(), "mi355x", 2)[:2]
    ['multi_node_tp', 'multi_node_tep']
    >>> did_you_mean("MI355X", ["gb300", "mi355x"])
    " (did you mean 'mi355x'?)"
"""

from __future__ import annotations

from k3deploy.errors import SelectionError
from k3deploy.recipe.offering import did_you_mean, hardware_for_variant, near, recommended, strategies_on
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import BUILDER_MAX_NODES, hardware

__all__ = ["did_you_mean", "fitting", "near", "pd_fits", "pd_sizes", "pick", "sizes_text", "sizes_that_fit",
           "variant_for"]


def variant_for(recipe: Recipe, hw_id: str) -> str:
    """The variant a cluster of ``hw_id`` deploys when none is set: ``default`` where it runs, else the first that
    does (e.g. ascend_w4a8 on ascend_910c)."""
    if hw_id in hardware_for_variant(recipe, "default"):
        return "default"
    return next((v for v in recipe.variants if hw_id in hardware_for_variant(recipe, v)), "default")


def _resolves(recipe: Recipe, **kwargs: object) -> bool:
    from k3deploy.recipe.resolve import resolve

    try:
        resolve(recipe, **kwargs)  # type: ignore[arg-type]
    except SelectionError:
        return False
    return True


def fitting(recipe: Recipe, hw_id: str, nodes: int, variant: str | None = None) -> list[str]:
    """The strategies (not pd_cluster) that resolve on ``nodes`` nodes of ``hw_id``, the recommended one first."""
    if hw_id not in hardware():
        return []
    variant = variant or variant_for(recipe, hw_id)
    hw = hardware()[hw_id]
    if hw_id not in hardware_for_variant(recipe, variant):
        return []
    rec, _ = recommended(recipe, variant, hw)
    order = [rec] + [s for s in strategies_on(recipe, hw) if s != rec]
    return [s for s in order if s != "pd_cluster"
            and _resolves(recipe, hardware=hw_id, strategy=s, variant=variant, nodes=nodes)]


def pd_fits(recipe: Recipe, hw_id: str, prefill: int, decode: int, variant: str | None = None) -> bool:
    """Whether pd_cluster resolves with these pool sizes."""
    variant = variant or variant_for(recipe, hw_id)
    return _resolves(recipe, hardware=hw_id, strategy="pd_cluster", variant=variant, prefill_nodes=prefill,
                     decode_nodes=decode)


def sizes_that_fit(recipe: Recipe, hw_id: str, variant: str | None = None,
                   upto: int = BUILDER_MAX_NODES) -> dict[int, list[str]]:
    """Node count -> the strategies that fit it, for 1..``upto`` nodes (counts nothing fits left out)."""
    out = {}
    for n in range(1, upto + 1):
        fit = fitting(recipe, hw_id, n, variant)
        if fit:
            out[n] = fit
    return out


def sizes_text(sizes: dict[int, list[str]]) -> str:
    """``1 node (single_node_tp); 2-16 nodes (multi_node_tp, multi_node_tep)``: runs of sizes that fit the same
    strategies merged."""
    runs: list[tuple[int, int, list[str]]] = []
    for n, strats in sizes.items():
        if runs and runs[-1][1] == n - 1 and runs[-1][2] == strats:
            runs[-1] = (runs[-1][0], n, strats)
        else:
            runs.append((n, n, strats))
    parts = [(f"{a} node{'s' if a != 1 else ''}" if a == b else f"{a}-{b} nodes") + f" ({', '.join(s)})"
             for a, b, s in runs]
    return "; ".join(parts) if parts else "none"


def pd_sizes(recipe: Recipe, hw_id: str, prefill: int, decode: int, variant: str | None = None,
             upto: int = BUILDER_MAX_NODES) -> tuple[int, int] | None:
    """The smallest pool sizes at least (``prefill``, ``decode``) that pd_cluster resolves with, or None."""
    for total in range(prefill + decode, upto + 1):
        for p in range(prefill, total - decode + 1):
            if pd_fits(recipe, hw_id, p, total - p, variant):
                return p, total - p
    return None


def pick(recipe: Recipe, hw_id: str, nodes: int, variant: str | None = None) -> str:
    """The recommended strategy that fits ``nodes`` nodes of ``hw_id``, or SelectionError naming the sizes that
    fit."""
    fit = fitting(recipe, hw_id, nodes, variant)
    if fit:
        return fit[0]
    sizes = sizes_that_fit(recipe, hw_id, variant)
    raise SelectionError(f"no strategy of {recipe.slug} runs on {nodes} node{'s' if nodes != 1 else ''} of {hw_id}; "
                         f"sizes that fit: {sizes_text(sizes)}")
