"""Deliberate, documented changes k3deploy makes to the builder's commands before deploying them.

The builder's output is reproduced exactly by :func:`k3deploy.resolve`; :func:`deployable` then applies the
few changes the pinned engine needs to start at all, each recorded in ``plan.warnings`` and listed in
docs/layout.md. The rollout, ``k3deploy plan``, the runbook and ``resolve --inventory`` all deploy this version.

1. ``multi_node_tp_dp`` (and any plan whose workers carry ``--data-parallel-start-rank`` while the head runs
   neither hybrid nor external load balancing): vLLM 0.33.0 refuses such workers ("Remote engine N must use
   --headless unless in external or hybrid dp lb mode"), so they get ``--headless`` and the head is the one
   endpoint (internal load balancing).
"""

from __future__ import annotations

from k3deploy.recipe.argv import flag_value, has_flag
from k3deploy.recipe.plan import Plan

LB_FLAGS = ("--data-parallel-hybrid-lb", "--data-parallel-external-lb")


def deployable(plan: Plan) -> Plan:
    """``plan`` with the engine fixes applied: a new plan where one applies (the input is not changed)."""
    engines = [n for n in plan.nodes if n.role in ("head", "worker")]
    if not engines:
        return plan
    internal_lb = not any(has_flag(engines[0].argv, f) for f in LB_FLAGS)
    fixed = {id(w) for w in engines[1:] if internal_lb and not has_flag(w.argv, "--headless")
             and flag_value(w.argv, "--data-parallel-start-rank", "-dpr") is not None}
    if not fixed:
        return plan
    nodes = [n.model_copy(update={"argv": [*n.argv, "--headless"]}) if id(n) in fixed else n for n in plan.nodes]
    ranks = [n.rank for n in plan.nodes if id(n) in fixed]
    return plan.model_copy(update={"nodes": nodes, "warnings": [
        *plan.warnings, f"{plan.strategy}: workers {', '.join(map(str, ranks))} get --headless (vLLM 0.33.0 refuses "
        "remote engines that are not headless in internal-LB mode; the recipes builder omits it)"]})
