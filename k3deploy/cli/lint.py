"""``k3deploy lint``: check a recipe's offered selections against the pinned engine and the hardware."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from k3deploy.cli.common import echo_json, json_option, recipe_option
from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.recipe.lint import LintReport

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@click.command()
@click.option("--hardware", "-H", metavar="ID", default=None, help="Only this hardware id.")
@click.option("--strategy", "-s", metavar="ID", default=None, help="Only this strategy.")
@click.option("--variant", "-v", metavar="ID", default=None, help="Only this variant.")
@click.option("--nodes", "-n", type=int, default=None,
              help="Lint each selection at this node count, as resolve --nodes resolves it (strategies that do not "
                   "take it are left out).")
@click.option("--prefill-nodes", type=int, default=None, help="pd_cluster: nodes in the prefill pool.")
@click.option("--decode-nodes", type=int, default=None, help="pd_cluster: nodes in the decode pool.")
@click.option("--inventory", metavar="FILE", default=None,
              help="Lint what this inventory deploys: its plan with k3_extra_args, every node's final argv and env.")
@recipe_option
@json_option
@click.pass_context
def lint(ctx: click.Context, hardware: str | None, strategy: str | None, variant: str | None, nodes: int | None,
         prefill_nodes: int | None, decode_nodes: int | None, inventory: str | None, recipe_path: str | None,
         as_json: bool) -> None:
    """Lint every offered selection (variant x hardware x strategy, default features and each opt-in
    feature on) against vLLM's flags, env vars and backends, the hardware and the memory plan.

    \b
    Exit 0: no errors (warnings allowed); 1: at least one error; 2: bad input.
    Examples:
      k3deploy lint
      k3deploy lint --hardware h200 --json
      k3deploy lint --hardware gb300 --nodes 3
      k3deploy lint --inventory inventories/gb300.py
    """
    from k3deploy import load_recipe
    from k3deploy.recipe.lint import lint_recipe

    if inventory is not None:
        if hardware or strategy or variant or recipe_path or (nodes or prefill_nodes or decode_nodes) is not None:
            raise K3Error("--inventory cannot be combined with --hardware/--strategy/--variant/--nodes/--recipe: "
                          "the selection comes from the inventory's variables")
        ctx.exit(_lint_inventory(inventory, as_json))

    for name, value in (("--nodes", nodes), ("--prefill-nodes", prefill_nodes), ("--decode-nodes", decode_nodes)):
        if value is not None and value < 1:
            raise K3Error(f"{name} must be ≥ 1, got {value}")
    report = lint_recipe(load_recipe(recipe_path), hardware_id=hardware, strategy=strategy, variant=variant,
                         nodes=nodes, prefill_nodes=prefill_nodes, decode_nodes=decode_nodes)
    if as_json:
        echo_json(report.to_dict())
    else:
        _render(report)
    if report.exit_code:
        ctx.exit(report.exit_code)


def _render(report: LintReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from k3deploy.recipe.lint import summarize_selections

    console = Console(width=None if sys.stdout.isatty() else 200)
    c = report.counts
    if report.groups:
        n = len(report.checked)
        table = Table(title=f"k3deploy lint: {report.recipe}, {n} selection{'s' if n != 1 else ''}", show_lines=True)
        for column, style in (("Severity", ""), ("Code", "bold"), ("Finding", ""), ("Recipe key", "dim"),
                              ("Selections", "")):
            table.add_column(column, style=style or None, overflow="fold")
        for g in report.groups:
            f = g.finding
            roles = f" (on {', '.join(sorted(g.roles))})" if g.roles else ""
            table.add_row(f"[{_STYLE[f.severity]}]{f.severity}[/]", f.code,
                          f"{escape(f.message)}{escape(roles)}\n[green]fix:[/] {escape(f.fix)}",
                          escape(f.path or ""), escape(summarize_selections(g.selections, report.checked)))
        console.print(table)
    verdict = "[bold red]errors found[/]" if c["error"] else "[bold green]no errors[/]"
    n = len(report.checked)
    console.print(f"{n} selection{'s' if n != 1 else ''} checked: {c['error']} errors, {c['warning']} warnings, "
                  f"{c['info']} info; {verdict}")


def _lint_inventory(inventory: str, as_json: bool) -> int:
    """Findings of the plan an inventory deploys (k3_extra_args included); 1 when any is an error."""
    from k3deploy.cli.common import read_cluster
    from k3deploy.recipe.lint import lint_plan
    from k3deploy.runtime.views import INVENTORY_ONLY

    t = read_cluster("lint", inventory, view=INVENTORY_ONLY).target
    plan = t.require_plan()
    found = lint_plan(t.recipe, plan)
    if t.vars.k3_extra_args:   # what k3_extra_args bring is blamed on the file that set them, not the recipe
        from k3deploy.model.pipeline import extra_args_findings

        theirs = {(f.severity, f.code, f.message, f.fix): f for f in
                  extra_args_findings(t.records, t.vars, plan, t.source("k3_extra_args"), t.recipe)}
        found = [theirs.get((f.severity, f.code, f.message, f.fix), f) for f in found]
    errors = sum(f.severity == "error" for f in found)
    if as_json:
        echo_json({"inventory": inventory, "findings": [f.to_dict() for f in found], "errors": errors})
    else:
        for f in found:
            click.echo(f"{f.severity}: {f.line()}")
        click.echo(f"{inventory}: {plan.hardware} x {len(plan.nodes)}, {plan.strategy}: {len(found)} finding(s), "
                   f"{errors} error(s)")
    return 1 if errors else 0
