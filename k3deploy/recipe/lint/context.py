"""What a ``plan`` rule is called with: :class:`PlanContext`, one resolved plan with its recipe, the engine
catalogs, the hardware profile, every node's parsed arguments and layout, and :meth:`PlanContext.add`."""

from __future__ import annotations

from dataclasses import dataclass

from k3deploy.recipe.catalog import Catalog
from k3deploy.recipe.lint.argv import Arg, Layout, layout, parse_argv
from k3deploy.recipe.lint.provenance import Provenance, Scope, hw_keys
from k3deploy.recipe.lint.registry import Emitter
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import hardware, strategies


@dataclass
class EngineNode:
    """A ``vllm serve`` node: its options (after ``vllm serve <model>``), stray positionals and layout."""

    node: NodePlan
    args: list[Arg]
    stray: list[str]
    layout: Layout

    @property
    def role(self) -> str:
        return self.node.role


@dataclass
class RouterNode:
    """A ``vllm-router`` node, its options read with the router's catalog."""

    node: NodePlan
    args: list[Arg]


class PlanContext(Emitter):
    """One resolved plan as the ``plan`` rules see it."""

    def __init__(self, recipe: Recipe, plan: Plan, prov: Provenance, cat: Catalog, router: Catalog) -> None:
        super().__init__()
        self.recipe, self.plan, self.prov, self.cat, self.router = recipe, plan, prov, cat, router
        self.hw = hardware()[plan.hardware]
        self.strategy = strategies()[plan.strategy]
        self.scope = Scope(variant=plan.variant, strategy=plan.strategy, features=set(plan.features), hw=self.hw,
                           hw_keys=hw_keys(self.hw))
        self.cuda = self.hw.brand == "NVIDIA"
        self.npu = self.hw.vendor == "npu"
        #: every node in plan order
        self.nodes: list[EngineNode | RouterNode] = []
        for node in plan.nodes:
            if node.role == "router":
                self.nodes.append(RouterNode(node, parse_argv(node.argv[1:], router)[0]))
            else:
                args, stray = parse_argv(node.argv[3:], cat)
                self.nodes.append(EngineNode(node, args, stray, layout(args, cat)))
        self.engines = [n for n in self.nodes if isinstance(n, EngineNode)]
        self.routers = [n for n in self.nodes if isinstance(n, RouterNode)]

    def add(self, severity: str, message: str, fix: str, path: str | None, role: str | None) -> None:
        """Report a finding of the running rule on a node of ``role`` (None: the plan as a whole)."""
        self.emit(severity, message, fix, path, (role,) if role else ())

    def arg_path(self, node: NodePlan, arg: Arg | None, name: str | None = None) -> str:
        """The recipe key that put argument ``arg`` (or the option ``name``) on ``node``."""
        self.scope.role = node.role
        f = (arg.flag or arg.abbrev_of) if arg else None
        spellings: list[str] = [self.cat.normalize(arg.option)] if arg is not None else [name or ""]
        if f is not None:
            spellings += f.spellings
        value = arg.value if arg else None
        found = self.prov.arg(self.scope, spellings, value, self.cat.normalize)
        return found or f"builder: {self.plan.strategy}"

    def env_path(self, node: NodePlan, name: str) -> str:
        """The recipe key that set the variable ``name`` on ``node``."""
        self.scope.role = node.role
        return self.prov.env(self.scope, name, node.env.get(name)) or f"builder: {self.plan.strategy} env"

    def capability(self) -> tuple[int, int] | None:
        """The GPU's compute capability (NVIDIA), else None."""
        cc = self.hw.compute_capability
        if not cc:
            return None
        major, _, minor = cc.partition(".")
        return int(major), int(minor or 0)

    def hybrid_model(self) -> bool:
        """Kimi-K3's KDA layers keep Mamba-like state."""
        return "kimi-k3" in self.plan.model.lower()
