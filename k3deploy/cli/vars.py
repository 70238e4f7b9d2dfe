"""``k3deploy vars INVENTORY [--host H]``: every variable of a deployment, its value and where it came from (as
``ansible-inventory --vars`` shows them). Reads the inventory and its group_vars; contacts no host."""

from __future__ import annotations

import sys

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.errors import K3Error


@click.command("vars")
@click.argument("inventory")
@click.option("--host", "host", metavar="NAME", default=None, help="Only this host.")
@click.option("--all", "everything", is_flag=True, help="Also list the variables left at their defaults.")
@json_option
def vars_cmd(inventory: str, host: str | None, everything: bool, as_json: bool) -> None:
    """Show the variables of INVENTORY's hosts, each with the file and key (or inventory data) it came from,
    and which group_vars files were merged. Nothing is contacted.

    \b
    Examples:
      k3deploy vars inventories/gb300.py
      k3deploy vars inventories/gb300.py --host gb300-node2 --all --json
    """
    from k3deploy.runtime.views import VARIABLES

    t = read_cluster("vars", inventory, view=VARIABLES).target
    names = [r.name for r in t.records]
    if host is not None and host not in names:
        raise K3Error(f"--host {host}: not in {inventory} (hosts: {', '.join(names)})")
    shown = [host] if host else names
    files = list(dict.fromkeys(f for h in names for f in t.resolved[h].files))   # every host's, in order
    hosts = {h: t.resolved[h].listing(everything=everything) for h in shown}
    data = {"inventory": inventory, "files": files, "hosts": hosts}
    if as_json:
        echo_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"[bold]{inventory}[/]: group_vars merged (lowest first, each host the files of its groups): "
                  + (", ".join(files) or "none"), highlight=False)
    for h in shown:
        table = Table("variable", "value", "from", title=h, title_justify="left")
        for k, item in sorted(hosts[h].items()):
            table.add_row(k, repr(item["value"]) if not isinstance(item["value"], str) else item["value"],
                          item["from"])
        console.print(table)
