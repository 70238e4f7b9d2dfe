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
from k3deploy.recipe.plan import NodePlan, Plan

LB_FLAGS = ("--data-parallel-hybrid-lb", "--data-parallel-external-lb")


def deployable(plan: Plan) -> Plan:
    """A copy of ``plan`` with the engine fixes applied (the input is not changed)."""
    out = plan.model_copy(deep=True)
    groups: dict[str, list[NodePlan]] = {}
    for node in out.nodes:
        if node.role in ("head", "worker"):
            groups.setdefault("engine", []).append(node)
    for nodes in groups.values():
        head = nodes[0]
        internal_lb = not any(has_flag(head.argv, f) for f in LB_FLAGS)
        fixed = []
        for w in nodes[1:]:
            starts_dp = flag_value(w.argv, "--data-parallel-start-rank", "-dpr") is not None
            if internal_lb and starts_dp and not has_flag(w.argv, "--headless"):
                w.argv.append("--headless")
                fixed.append(w.rank)
        if fixed:
            out.warnings.append(
                f"{plan.strategy}: workers {', '.join(map(str, fixed))} get --headless (vLLM 0.33.0 refuses remote "
                f"engines that are not headless in internal-LB mode; the recipes builder omits it)")
    return out
