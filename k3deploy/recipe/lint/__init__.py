"""Lint: what the recipe builder prints but the pinned engine does not accept, or the hardware cannot run.

Pure (no I/O besides the packaged data): checks resolved plans against the engine catalogs
(:mod:`k3deploy.recipe.catalog`) and the hardware taxonomy, and names for every finding the recipe key that
produced the offending argument or variable.

    >>> from k3deploy import load_recipe, resolve
    >>> from k3deploy.recipe.lint import lint_plan
    >>> recipe = load_recipe()
    >>> plan = resolve(recipe, hardware="mi355x", strategy="single_node_tp")
    >>> [f.path for f in lint_plan(recipe, plan) if f.code == "env-unknown"]
    ['hardware_overrides.amd.extra_env.VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4']

:func:`lint_recipe` runs the whole offered matrix (every variant × hardware × strategy, with the default
features and with each opt-in feature switched on) and groups identical findings across selections.

Every finding code is reported by exactly one rule, a function registered under that code in
:mod:`~k3deploy.recipe.lint.registry`, which lists them all:

    >>> from k3deploy.recipe.lint import registry
    >>> registry.rule_for("memory-fit").func.__name__, len(registry.codes()) > 30
    ('memory_fit', True)

Modules:

* :mod:`~k3deploy.recipe.lint.findings`: :class:`Finding`, :class:`Selection`, :class:`Group`,
  :class:`LintReport`, the severities;
* :mod:`~k3deploy.recipe.lint.provenance`: which recipe key produced an argument or variable;
* :mod:`~k3deploy.recipe.lint.argv`: :func:`parse_argv` (argv read as argparse reads it), a node's layout;
* :mod:`~k3deploy.recipe.lint.registry`: the rules, one per finding code, and running them;
* :mod:`~k3deploy.recipe.lint.context`: what a plan rule sees (plan, recipe, catalogs, hardware, parsed nodes);
* :mod:`~k3deploy.recipe.lint.images`: :func:`check_image` and the images a recipe names;
* the rules, by topic: :mod:`~k3deploy.recipe.lint.rules_flags` (flags and their values, stray arguments),
  :mod:`~k3deploy.recipe.lint.rules_backends` (attention backends vs GPU and KV dtype),
  :mod:`~k3deploy.recipe.lint.rules_parallel` (parallel sizes), :mod:`~k3deploy.recipe.lint.rules_lb`
  (data-parallel load balancing), :mod:`~k3deploy.recipe.lint.rules_spec` (speculative decoding),
  :mod:`~k3deploy.recipe.lint.rules_pd` (prefill/decode transfer), :mod:`~k3deploy.recipe.lint.rules_env`
  (environment), :mod:`~k3deploy.recipe.lint.rules_loading` (``--load-format``),
  :mod:`~k3deploy.recipe.lint.rules_memory` (memory fit), :mod:`~k3deploy.recipe.lint.rules_router`
  (router timeout), :mod:`~k3deploy.recipe.lint.rules_images` (image references),
  :mod:`~k3deploy.recipe.lint.rules_offering` (selections that do not resolve);
* :mod:`~k3deploy.recipe.lint.runner`: :func:`lint_plan`, :func:`lint_recipe`;
* :mod:`~k3deploy.recipe.lint.output`: findings as text for the CLI.
"""

from __future__ import annotations

# the rule modules register their rules on import
from k3deploy.recipe.lint import (  # noqa: F401
    rules_backends,
    rules_env,
    rules_flags,
    rules_images,
    rules_lb,
    rules_loading,
    rules_memory,
    rules_offering,
    rules_parallel,
    rules_pd,
    rules_router,
    rules_spec,
)
from k3deploy.recipe.lint.argv import Arg, Layout, parse_argv
from k3deploy.recipe.lint.findings import SEVERITIES, Finding, Group, LintReport, Selection
from k3deploy.recipe.lint.images import KNOWN_REPOSITORIES, check_image, recipe_image_findings
from k3deploy.recipe.lint.output import echo_findings, echo_selection_findings, summarize_selections
from k3deploy.recipe.lint.provenance import Provenance, provenance
from k3deploy.recipe.lint.registry import codes
from k3deploy.recipe.lint.runner import feature_sets, lint_plan, lint_recipe

__all__ = [
    "KNOWN_REPOSITORIES",
    "SEVERITIES",
    "Arg",
    "Finding",
    "Group",
    "Layout",
    "LintReport",
    "Provenance",
    "Selection",
    "check_image",
    "codes",
    "echo_findings",
    "echo_selection_findings",
    "feature_sets",
    "lint_plan",
    "lint_recipe",
    "parse_argv",
    "provenance",
    "recipe_image_findings",
    "summarize_selections",
]
