"""``selection`` rule: an offered selection of the matrix that does not resolve (:func:`lint_recipe`)."""

from __future__ import annotations

from k3deploy.errors import SelectionError
from k3deploy.recipe.lint.registry import Emitter, rule


class SelectionContext(Emitter):
    """An offered selection and the error resolving it raised."""

    def __init__(self, error: SelectionError) -> None:
        super().__init__()
        self.error = error


@rule("unresolvable", scope="selection")
def unresolvable(ctx: SelectionContext) -> None:
    """The recipe offers a selection (hardware × strategy × variant × features) that does not resolve."""
    ctx.emit("error", f"the offered selection does not resolve: {ctx.error}",
             "fix the recipe's offering (strategy_hardware, strategy_min_gpus) or the selection", None)
