"""``k3deploy runbook INVENTORY -o FILE``: a bring-up runbook from the same rollout the deploy executes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from k3deploy.errors import K3Error


@click.command("runbook")
@click.argument("inventory")
@click.option("-o", "--output", "output", required=True, metavar="FILE", help="Where to write the runbook.")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default=None,
              help="md or html (default: from the file name, else md).")
@click.option("--offline", is_flag=True,
              help="Write it from the inventory alone: no node is contacted; what the rollout would read from the "
                   "nodes appears as named blanks, each with the command that finds it.")
def runbook(inventory: str, output: str, fmt: str | None, offline: bool) -> None:
    """Write a bring-up runbook for INVENTORY: prerequisites with their check commands and expected values,
    per node the files and commands, the start order with what to wait for, smoke test, rollback and
    troubleshooting.

    The nodes are read (never changed) to fill in what the rollout derives from them (interfaces, NCCL
    settings) and to show each prerequisite's current value; with --offline nothing is read, so a site can
    review the bring-up before its machines answer. Every command block names its node
    (```sh node=NAME```), so the runbook can be executed block by block.

    \b
    Examples:
      k3deploy runbook inventories/gb300.py -o gb300-runbook.md
      k3deploy runbook inventories/gb300.py -o gb300-runbook.html
      k3deploy runbook inventories/gb300.py -o gb300-runbook.md --offline
    """
    from importlib.metadata import version

    from k3deploy.cli.common import read_cluster
    from k3deploy.model.runbook import Context, build, to_html, to_markdown
    from k3deploy.recipe.taxonomy import hardware
    from k3deploy.runtime.gather import require_reachable
    from k3deploy.runtime.views import OFFLINE_RUNBOOK, RUNBOOK

    if fmt is None:
        fmt = "html" if output.lower().endswith((".html", ".htm")) else "md"
    target = Path(output)
    if not target.parent.is_dir():
        raise K3Error(f"-o {output}: directory {target.parent} does not exist: create it or choose another path")
    gathered = read_cluster("runbook", inventory, view=OFFLINE_RUNBOOK if offline else RUNBOOK)
    if not offline:
        require_reachable(gathered)
    r = gathered.require_rollout()
    rows: list[Any] = gathered.preflight.results if gathered.preflight else []
    doc = build(r, Context(inventory=inventory, preflight=rows, addresses=gathered.addresses, ssh=gathered.ssh,
                           brand=str(hardware()[r.plan.hardware].brand), guide=gathered.target.recipe.guide,
                           version=version("k3deploy"), blanks=list(gathered.blanks), tag=gathered.pinned_tag,
                           files_dir=str(target.resolve().parent / f"{target.stem}-files")))
    text = to_html(doc) if fmt == "html" else to_markdown(doc)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise K3Error(f"-o {output}: cannot write: {exc.strerror}: choose a writable path") from None
    click.echo(f"wrote {output} ({fmt}, {len(r.units)} unit(s) on {len({u.host for u in r.units})} host(s))")
    failing = sorted(gathered.preflight.failures_by_host()) if gathered.preflight else []
    if failing:
        click.echo("warning: preflight fails on " + ", ".join(failing)
                   + ": the runbook's prerequisites section lists what to fix", err=True)
