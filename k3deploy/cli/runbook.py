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

    from k3deploy import load_recipe
    from k3deploy.cli.common import read_cluster
    from k3deploy.model.runbook import Context, build, to_html, to_markdown
    from k3deploy.recipe.taxonomy import hardware
    from k3deploy.runtime.gather import require_reachable

    if fmt is None:
        fmt = "html" if output.lower().endswith((".html", ".htm")) else "md"
    target = Path(output)
    if not target.parent.is_dir():
        raise K3Error(f"-o {output}: directory {target.parent} does not exist: create it or choose another path")
    blanks: list[Any] = []
    if offline:
        from k3deploy.model.pipeline import desired_rollout
        from k3deploy.model.runbook.blanks import offline_env

        cluster = read_cluster("runbook", inventory, facts=False)
        t = cluster.target
        t.require_plan()
        host_env: dict[str, dict[str, str]] = {}
        ifaces: dict[str, str] = {}
        for rec in t.records:
            env, mine = offline_env(t.requirements, rec.name, rec.address)
            host_env[rec.name] = env
            ifaces[rec.name] = t.vars.k3_iface or next(b.token for b in mine if b.name == "IFACE")
            blanks += mine
        r = desired_rollout(t, ifaces=ifaces, host_env=host_env)
        rows: list[Any] = []
    else:
        cluster = read_cluster("runbook", inventory, installed=False, pin_image=True)
        require_reachable(cluster)
        r = cluster.require_rollout()
        rows = cluster.preflight.results if cluster.preflight else []
    doc = build(r, Context(inventory=inventory, preflight=rows, addresses=cluster.addresses, ssh=cluster.ssh,
                           brand=str(hardware()[r.plan.hardware].brand), guide=load_recipe(r.vars.k3_recipe).guide,
                           version=version("k3deploy"), blanks=blanks, tag=cluster.pinned_tag))
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
