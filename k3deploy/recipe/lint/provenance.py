"""Where an argument or variable came from: the recipe key (or strategy definition entry) that put it in a
resolved plan, so that every finding names the key to edit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from k3deploy.recipe.schema import Recipe
from k3deploy.recipe.taxonomy import HardwareProfile, strategies

_ARG_KEYS = ("base_args", "extra_args", "vllm_args", "args")
_ENV_KEYS = ("base_env", "extra_env", "env")


@dataclass(frozen=True)
class Source:
    """One argument list or env map of the recipe or of a strategy definition."""

    path: tuple[str, ...]
    kind: str  # "args" | "env"
    items: Any  # list[str] or dict[str, str]
    prefix: str = ""  # "" for the recipe, "strategies/<id>.yaml:" for a strategy definition


@dataclass
class Scope:
    """The selection (and node role) a key must apply to."""

    variant: str
    strategy: str
    features: set[str]
    hw: HardwareProfile
    hw_keys: set[str]
    role: str | None = None


def _walk(node: Any, path: tuple[str, ...], out: list[Source], prefix: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            k = str(k)
            if k in _ARG_KEYS and isinstance(v, list):
                out.append(Source(path + (k,), "args", [str(a) for a in v], prefix))
            elif k in _ENV_KEYS and isinstance(v, dict):
                out.append(Source(path + (k,), "env", {str(a): str(b) for a, b in v.items()}, prefix))
            elif isinstance(v, (dict, list)) and k not in ("guide", "meta"):
                _walk(v, path + (k,), out, prefix)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, (dict, list)):
                _walk(v, path + (str(i),), out, prefix)


def hw_keys(hw: HardwareProfile) -> set[str]:
    """The ``hardware_overrides`` keys that apply to a hardware profile."""
    keys = {hw.id, hw.gen, hw.brand.lower(), "default", *hw.generations}
    if hw.brand == "NVIDIA":
        keys.add("nvidia")
    return keys


class Provenance:
    """Finds the recipe key an argument or variable of a selection came from, by searching the recipe's
    argument lists and env maps that apply to the selection (variant, hardware keys, strategy, role,
    features), then the strategy definition."""

    def __init__(self, recipe: Recipe) -> None:
        raw = recipe.model_dump(mode="python", exclude={"guide", "source"})
        self.sources: list[Source] = []
        _walk(raw, (), self.sources)
        self.strategy_sources: dict[str, list[Source]] = {}
        for sid, strat in strategies().items():
            found: list[Source] = []
            _walk(strat.model_dump(mode="python"), (), found, prefix=f"strategies/{sid}.yaml:")
            self.strategy_sources[sid] = found

    @staticmethod
    def _applies(src: Source, ctx: Scope) -> bool:
        p = src.path
        if src.prefix:  # strategy definition: top level, or the node's pd role
            return not (p and p[0] in ("prefill", "decode") and p[0] != ctx.role)
        for i, seg in enumerate(p):
            parent = p[i - 1] if i else None
            if parent == "variants" and seg != ctx.variant:
                return False
            if parent == "features" and seg not in ctx.features:
                return False
            if parent == "strategy_overrides" and seg != ctx.strategy:
                return False
            if parent == "hardware_overrides" and seg not in ctx.hw_keys:
                return False
            if i >= 2 and p[0] == "strategy_overrides" and i == 2 and seg in ("prefill", "decode") \
                    and seg != ctx.role:
                return False
        return True

    def _candidates(self, ctx: Scope) -> Iterator[Source]:
        for s in self.sources:
            if self._applies(s, ctx):
                yield s
        for s in self.strategy_sources.get(ctx.strategy, ()):
            if self._applies(s, ctx):
                yield s

    def arg(self, ctx: Scope, spellings: Iterable[str], value: str | None, norm: Callable[[str], str]) -> str | None:
        """Key path of the argument list entry that sets this flag (with this value when given)."""
        wanted = set(spellings)
        best: tuple[int, str] | None = None
        for src in self._candidates(ctx):
            items = src.items
            for i, a in enumerate(items):
                if not a.startswith("-") or norm(a) not in wanted:
                    continue
                inline = a.split("=", 1)[1] if "=" in a else None
                nxt = inline if inline is not None else (items[i + 1] if i + 1 < len(items) else None)
                score = 2 if value is None or nxt == value else 1
                path = src.prefix + ".".join(src.path) + f"[{i}]"
                if best is None or score > best[0]:
                    best = (score, path)
        return best[1] if best else None

    def env(self, ctx: Scope, name: str, value: str | None) -> str | None:
        best: tuple[int, str] | None = None
        for src in self._candidates(ctx):
            if name in src.items:
                score = 2 if value is None or src.items[name] == value else 1
                path = src.prefix + ".".join(src.path + (name,))
                if best is None or score > best[0]:
                    best = (score, path)
        return best[1] if best else None


def provenance(recipe: Recipe) -> Provenance:
    """The recipe's :class:`Provenance`, built once per loaded recipe."""
    return recipe.memo(("lint.provenance",), lambda: Provenance(recipe))
