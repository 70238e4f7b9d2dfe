"""Findings as text: the selections a finding occurs in (:func:`summarize_selections`) and the
``lint error: ...`` lines other commands print (:func:`echo_findings`, :func:`echo_selection_findings`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from k3deploy.errors import K3Error
from k3deploy.recipe.lint.findings import Selection
from k3deploy.recipe.lint.runner import lint_plan
from k3deploy.recipe.plan import Plan
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import strategies


def summarize_selections(selections: Sequence[Selection], checked: Sequence[Selection]) -> str:
    """Compact text for a list of selections: per variant, each hardware with the affected strategies (just
    the hardware when every checked strategy is affected) and the opt-in features when not every feature
    set is affected."""
    if not selections:
        return "recipe"
    all_sets: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
    hw_strats: dict[tuple[str, str], list[str]] = {}
    for s in checked:
        all_sets.setdefault((s.variant, s.hardware, s.strategy), set()).add(s.extra)
        lst = hw_strats.setdefault((s.variant, s.hardware), [])
        if s.strategy not in lst:
            lst.append(s.strategy)
    hit: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
    for s in selections:
        hit.setdefault((s.variant, s.hardware, s.strategy), set()).add(s.extra)
    by_vh: dict[tuple[str, str], list[str]] = {}
    for (v, h, st), extras in hit.items():
        if extras == all_sets.get((v, h, st), set()):
            label = st
        else:
            label = st + "".join(sorted({"+" + "+".join(e) if e else " (default features)" for e in extras}))
        by_vh.setdefault((v, h), []).append(label)
    per_variant: dict[str, list[str]] = {}
    for (v, h), labels in by_vh.items():
        every = hw_strats.get((v, h), [])
        whole = sorted(labels) == sorted(every) and all("+" not in x and "(" not in x for x in labels)
        per_variant.setdefault(v, []).append(h if whole and len(every) > 1 else f"{h} ({', '.join(labels)})")
    several = len({s.variant for s in checked}) > 1
    return "; ".join(f"{v}: {', '.join(hs)}" if several else ", ".join(hs) for v, hs in per_variant.items())


def echo_findings(recipe: Recipe, plan: Plan, echo: Callable[[str], None], *, include_info: bool = False) -> int:
    """Print a plan's lint findings as ``lint error: ...`` / ``lint warning: ...`` lines; returns the number
    of errors. Never raises: a failure of the linter itself is printed as one line."""
    try:
        found = lint_plan(recipe, plan)
    except K3Error as exc:
        echo(f"lint skipped: {exc}")
        return 0
    except Exception as exc:  # the linter must never break the command it decorates
        echo(f"lint skipped: internal error {type(exc).__name__}: {exc}")
        return 0
    errors = 0
    for f in found:
        if f.severity == "info" and not include_info:
            continue
        errors += f.severity == "error"
        echo(f"lint {f.severity}: {f.line()}")
    return errors


def echo_selection_findings(selection: Any, echo: Callable[[str], None]) -> int:
    """``echo_findings`` for a preflight selection (hardware profile, strategy or None, variant, node count)
    against the vendored recipe, as k3deploy deploys it (:func:`k3deploy.recipe.fixes.deployable`); a selection that
    does not resolve is reported as one skipped line."""
    from k3deploy.recipe.fixes import deployable
    from k3deploy.recipe.resolve import resolve
    from k3deploy.recipe.schema import load_recipe

    try:
        recipe = load_recipe()
        strat = strategies().get(selection.strategy) if selection.strategy else None
        kwargs: dict[str, Any] = {"hardware": selection.hardware.id, "strategy": selection.strategy,
                                  "variant": selection.variant}
        if strat is not None and not strat.pd:
            kwargs["nodes"] = selection.nodes
        plan = deployable(resolve(recipe, **kwargs))
    except K3Error as exc:
        echo(f"lint skipped: {exc}")
        return 0
    return echo_findings(recipe, plan, echo)
