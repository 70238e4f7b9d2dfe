"""Running the rules: :func:`lint_plan` (one resolved plan) and :func:`lint_recipe` (the whole offered
matrix, identical findings grouped across selections)."""

from __future__ import annotations

from typing import Any

from k3deploy.errors import SelectionError
from k3deploy.recipe.catalog import Catalog, load_catalog
from k3deploy.recipe.lint.context import PlanContext
from k3deploy.recipe.lint.findings import Finding, Group, LintReport, Selection, order
from k3deploy.recipe.lint.images import check_image, image_path, recipe_image_findings
from k3deploy.recipe.lint.provenance import provenance
from k3deploy.recipe.lint.registry import run
from k3deploy.recipe.lint.rules_offering import SelectionContext
from k3deploy.recipe.plan import Plan
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import HardwareProfile, hardware, strategies


def lint_plan(recipe: Recipe, plan: Plan, *, catalog: Catalog | None = None,
              router_catalog: Catalog | None = None) -> list[Finding]:
    """Findings for one resolved plan, identical findings on several nodes merged (their roles listed)."""
    cat = catalog or load_catalog("vllm")
    router = router_catalog or load_catalog("vllm-router")
    ctx = PlanContext(recipe, plan, provenance(recipe), cat, router)
    raw = run("plan", ctx) + check_image(plan.image, image_path(recipe, plan, ctx.hw), vendor=ctx.hw.vendor)
    merged: dict[tuple[str, str, str | None, str, str], Finding] = {}
    for f in raw:
        k = f.key
        if k in merged:
            roles = tuple(dict.fromkeys(merged[k].roles + f.roles))
            merged[k] = Finding(f.severity, f.code, f.message, f.fix, f.path, roles)
        else:
            merged[k] = f
    return sorted(merged.values(), key=order)


def feature_sets(recipe: Recipe, variant: str, hw: HardwareProfile,
                 strategy: str) -> list[tuple[list[str], tuple[str, ...]]]:
    """The default feature set, and that set plus each opt-in feature that applies to ``strategy``."""
    from k3deploy.recipe.rules import default_features

    base = default_features(recipe, recipe.variants[variant], hw)
    out: list[tuple[list[str], tuple[str, ...]]] = [(base, ())]
    opt = list(dict.fromkeys(list(recipe.opt_in_features) + list(recipe.hardware_opt_in_features.get(hw.id) or [])))
    for f in opt:
        if f in base or f not in recipe.features:
            continue
        scope = recipe.features[f].strategies
        if scope and strategy not in scope:
            continue
        out.append(([x for x in recipe.features if x in base or x == f], (f,)))
    return out


def _nodes_label(plan: Plan) -> str:
    if strategies()[plan.strategy].pd:
        p = len(plan.role("prefill"))
        d = len(plan.role("decode"))
        pool = plan.role("prefill")[0].pool_nodes if plan.role("prefill") else 0
        return "colocated" if pool == 0 else f"P{p}+D{d}"
    return str(len(plan.nodes))


def lint_recipe(recipe: Recipe, *, hardware_id: str | None = None, strategy: str | None = None,
                variant: str | None = None, nodes: int | None = None, prefill_nodes: int | None = None,
                decode_nodes: int | None = None) -> LintReport:
    """Lint every offered selection (optionally narrowed) and group identical findings. Sizes (``nodes``; P/D:
    ``prefill_nodes``, ``decode_nodes``) resolve each selection as ``resolve`` does at that size; a strategy that
    does not take the size is left out unless it was asked for (then its refusal is the finding)."""
    from k3deploy.recipe.offering import hardware_for_variant, strategies_on, unknown_hardware
    from k3deploy.recipe.resolve import resolve

    hw_all = hardware()
    if hardware_id is not None and hardware_id not in hw_all:
        raise unknown_hardware(recipe, hardware_id)
    if strategy is not None and strategy not in strategies():
        raise SelectionError(f"unknown strategy {strategy!r}: choose one of {', '.join(sorted(strategies()))}")
    if variant is not None and variant not in recipe.variants:
        raise SelectionError(f"unknown variant {variant!r} in recipe {recipe.slug}: choose one of "
                             f"{', '.join(recipe.variants)}")
    cat, router = load_catalog("vllm"), load_catalog("vllm-router")
    groups: dict[tuple[str, str, str | None, str, str], Group] = {}
    checked: list[Selection] = []
    refusals: list[str] = []   # of strategies left out for a size they do not take

    def record(finding: Finding, sel: Selection | None) -> None:
        g = groups.get(finding.key)
        if g is None:
            g = groups[finding.key] = Group(Finding(finding.severity, finding.code, finding.message, finding.fix,
                                                    finding.path))
        if sel is not None and (not g.selections or g.selections[-1] != sel):
            g.selections.append(sel)
        g.roles.update(finding.roles)

    for vk in ([variant] if variant else list(recipe.variants)):
        for hw_id in hardware_for_variant(recipe, vk):
            if hardware_id is not None and hw_id != hardware_id:
                continue
            hw = hw_all[hw_id]
            for s in strategies_on(recipe, hw):
                if strategy is not None and s != strategy:
                    continue
                pd = strategies()[s].pd
                size: dict[str, Any] = ({"prefill_nodes": prefill_nodes, "decode_nodes": decode_nodes} if pd
                                        else {"nodes": nodes})
                if (nodes is not None and pd) or (not pd and (prefill_nodes or decode_nodes) is not None):
                    continue   # the sizes given are another kind of strategy's
                for feats, extra in feature_sets(recipe, vk, hw, s):
                    try:
                        plan = resolve(recipe, hardware=hw_id, strategy=s, variant=vk, features=feats, **size)
                    except SelectionError as exc:
                        if strategy is None and any(v is not None for v in size.values()):
                            refusals.append(str(exc))
                            break   # this strategy does not take the size asked for
                        sel = Selection(hw_id, s, vk, tuple(feats), extra, "")
                        checked.append(sel)
                        for f in run("selection", SelectionContext(exc)):
                            record(f, sel)
                        continue
                    sel = Selection(hw_id, s, vk, tuple(plan.features), extra, _nodes_label(plan))
                    checked.append(sel)
                    for f in lint_plan(recipe, plan, catalog=cat, router_catalog=router):
                        record(f, sel)
    if not checked:
        what = ", ".join(f"{k} {v}" for k, v in (("hardware", hardware_id), ("strategy", strategy),
                                                   ("variant", variant)) if v) or "the recipe"
        sized = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in (
            ("nodes", nodes), ("prefill_nodes", prefill_nodes), ("decode_nodes", decode_nodes)) if v is not None)
        why = f" ({refusals[0]})" if refusals else ""
        raise SelectionError(f"{recipe.slug} offers no selection for {what}{' at ' + sized if sized else ''}{why}: "
                             "see k3deploy options for what it offers")
    # the recipe's own images: those of the selected hardware's vendors when the lint was narrowed to hardware
    vendors = {hw_all[s.hardware].vendor for s in checked} if hardware_id is not None else None
    for f in recipe_image_findings(recipe, vendors):
        record(f, None)
    ordered = sorted(groups.values(), key=lambda g: order(g.finding))
    return LintReport(recipe=recipe.slug, groups=ordered, checked=checked)
