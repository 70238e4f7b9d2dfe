"""The resolved plan: what every node runs. Everything else (units, runbooks, diffs, rollout) renders from it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.recipe.argv import has_flag
from k3deploy.recipe.printing import format_command, format_router, format_site_docker_run, site_docker_run_argv


class NodePlan(BaseModel):
    """One process of the deployment.

    ``role`` is ``head``/``worker`` (single- and multi-node strategies), or ``prefill``/``decode``/``router``
    (pd_cluster). ``rank`` is the node rank (0 = head) or the index within a P/D pool. ``argv`` is the
    unquoted argument vector (``vllm serve <model> ...`` or ``vllm-router ...``); ``env`` is in insertion order.
    Frozen: a changed node is a new one (``model_copy(update=...)``).
    """

    model_config = ConfigDict(frozen=True)

    role: str
    rank: int
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    port: int | None = None
    pool_nodes: int | None = None
    parallelism: str | None = None

    @property
    def serves_http(self) -> bool:
        """False for ``--headless`` ranks: they join the head and serve no API."""
        return not has_flag(self.argv, "--headless")

    @property
    def command(self) -> str:
        """The command as shell text, laid out as the recipes site prints it."""
        return format_router(self.argv) if self.role == "router" else format_command(self.argv)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "rank": self.rank, "argv": list(self.argv), "env": dict(self.env),
                             "port": self.port}
        if self.pool_nodes is not None:
            d["pool_nodes"] = self.pool_nodes
            d["parallelism"] = self.parallelism
        return d


class Plan(BaseModel):
    """A resolved selection: the model, image and per-node commands.

    Example::

        >>> from k3deploy import load_recipe, resolve
        >>> plan = resolve(load_recipe(), hardware="gb300")
        >>> plan.strategy, [(n.role, n.rank) for n in plan.nodes]
        ('multi_node_tp', [('head', 0), ('worker', 1)])

    Frozen: another image or other nodes make a new plan (``model_copy(update=...)``).
    """

    model_config = ConfigDict(frozen=True)

    recipe: str
    model: str
    hardware: str
    strategy: str
    variant: str
    features: list[str]
    image: str
    vendor: str
    nodes: list[NodePlan]
    warnings: list[str] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "model": self.model,
            "hardware": self.hardware,
            "strategy": self.strategy,
            "variant": self.variant,
            "features": list(self.features),
            "image": self.image,
            "nodes": [n.to_dict() for n in self.nodes],
            "warnings": list(self.warnings),
        }

    def role(self, name: str) -> list[NodePlan]:
        return [n for n in self.nodes if n.role == name]

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def site_docker_argv(self, node: NodePlan) -> list[str]:
        return site_docker_run_argv(node.argv, node.env, self.image, node.port or 8000, self.vendor)

    def site_docker_command(self, node: NodePlan) -> str:
        return format_site_docker_run(node.argv, node.env, self.image, node.port or 8000, self.vendor)
