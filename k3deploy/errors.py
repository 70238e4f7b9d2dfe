"""Errors that reach the user as one line and exit code 2."""

from __future__ import annotations


class K3Error(Exception):
    """Bad input or a failed precondition: printed as one line, exit code 2.

    The message names the bad value and the fix, e.g.
    ``unknown hardware 'b900': kimi-k3 runs on ascend_910c, b200, ... (did you mean 'b300'?)``.
    """

    exit_code = 2


class RecipeError(K3Error):
    """A recipe file that cannot be read, parsed or validated."""


class SelectionError(K3Error):
    """A selection (hardware, strategy, variant, features, nodes) the recipe does not offer."""
