"""``k3deploy runbook INVENTORY -o FILE``: a bring-up runbook from the same rollout the deploy executes."""

from __future__ import annotations

from pathlib import Path

import click

from k3deploy.errors import K3Error


@click.command("runbook")
@click.argument("inventory")
@click.option("-o", "--output", "output", required=True, metavar="FILE", help="Where to write the runbook.")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default=None,
              help="md or html (default: from the file name, else md).")
def runbook(inventory: str, output: str, fmt: str | None) -> None:
    """Write a bring-up runbook for INVENTORY: prerequisites with their check commands and expected values,
    per node the files and commands, the start order with what to wait for, smoke test, rollback and
    troubleshooting.

    The nodes are read (never changed) to fill in what the rollout derives from them (interfaces, NCCL
    settings) and to show each prerequisite's current value. Every command block names its node
    (```sh node=NAME```), so the runbook can be executed block by block.

    \b
    Examples:
      k3deploy runbook inventories/gb300.py -o gb300-runbook.md
      k3deploy runbook inventories/gb300.py -o gb300-runbook.html
    """
    from importlib.metadata import version

    from k3deploy import load_recipe
    from k3deploy.cli.common import read_cluster
    from k3deploy.cluster.runbook import Context, build, to_html, to_markdown
    from k3deploy.recipe.taxonomy import hardware
    from k3deploy.runtime.gather import require_reachable

    if fmt is None:
        fmt = "html" if output.lower().endswith((".html", ".htm")) else "md"
    target = Path(output)
    if not target.parent.is_dir():
        raise K3Error(f"-o {output}: directory {target.parent} does not exist: create it or choose another path")
    cluster = read_cluster("runbook", inventory, installed=False)
    require_reachable(cluster)
    r = cluster.require_rollout()
    rows = cluster.preflight.results if cluster.preflight else []
    doc = build(r, Context(inventory=inventory, preflight=rows, addresses=cluster.addresses, ssh=cluster.ssh,
                           brand=str(hardware()[r.plan.hardware].brand), guide=load_recipe(r.vars.k3_recipe).guide,
                           version=version("k3deploy")))
    text = to_html(doc) if fmt == "html" else to_markdown(doc)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise K3Error(f"-o {output}: cannot write: {exc.strerror}: choose a writable path") from None
    click.echo(f"wrote {output} ({fmt}, {len(r.units)} unit(s) on {len({u.host for u in r.units})} host(s))")
    failing = sorted(cluster.preflight.failures_by_host()) if cluster.preflight else []
    if failing:
        click.echo("warning: preflight fails on " + ", ".join(failing)
                   + ": the runbook's prerequisites section lists what to fix", err=True)
