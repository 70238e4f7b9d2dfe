"""k3deploy: deploy Kimi-K3 on vLLM to bare-metal GPU clusters.

Public API::

    from k3deploy import load_recipe, resolve
    plan = resolve(load_recipe(), hardware="gb300", strategy="multi_node_tp", nodes=2)
    for node in plan.nodes:
        print(node.role, node.rank, node.argv, node.env)
"""

from __future__ import annotations

from k3deploy.errors import K3Error, RecipeError, SelectionError
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.recipe.resolve import resolve
from k3deploy.recipe.schema import Recipe, load_recipe, parse_recipe

__all__ = [
    "K3Error", "NodePlan", "Plan", "Recipe", "RecipeError", "SelectionError", "load_recipe", "parse_recipe",
    "resolve",
]
__version__ = "0.1.0"
