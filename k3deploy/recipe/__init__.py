"""The recipe engine (pure: no I/O beyond the packaged data, never pyinfra or gevent).

recipe YAML -> :mod:`schema` (typed model) -> :mod:`offering` (what it offers on which hardware) ->
:mod:`rules` (the recipes builder's merge rules) -> :mod:`resolve` (a selection into a :class:`plan.Plan`,
with :mod:`images`) -> :mod:`fixes` (what the pinned engine needs to start) -> :mod:`lint` (checked against
:mod:`catalog`, the pinned engine's flags and env). :mod:`argv` reads values back out of an argv as vLLM's
parser does; :mod:`printing` prints commands the way the recipes site does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from k3deploy.recipe.schema import Recipe, load_recipe, parse_recipe

__all__ = ["Recipe", "load_recipe", "parse_recipe"]


def __getattr__(name: str) -> Any:
    """The schema's names, imported on first use: a module of the engine that needs no recipe (:mod:`argv`,
    :mod:`taxonomy`) is imported without pydantic and the schema."""
    if name not in __all__:
        raise AttributeError(f"module 'k3deploy.recipe' has no attribute {name!r}")
    from k3deploy.recipe import schema

    value = getattr(schema, name)
    globals()[name] = value
    return value
