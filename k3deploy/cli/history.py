"""``k3deploy history INVENTORY``: the numbered revisions of each group, as the hosts keep them: what was
deployed, when, from which variables, and which one runs now."""

from __future__ import annotations

import sys
from dataclasses import asdict

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster


@click.command("history")
@click.argument("inventory")
@json_option
def history(inventory: str, as_json: bool) -> None:
    """List each group's revisions: number, when, image, what was deployed, the variables that differed from
    their defaults (with the file that set them), and which revision runs now. Read-only.

    \b
    Roll back to one: pyinfra INVENTORY deploy/k3.py -y --data k3_rollback=N (preview: k3deploy plan
    INVENTORY --rollback N).
    """
    from k3deploy.runtime.gather import require_reachable

    cluster = read_cluster("history", inventory, installed=True)
    require_reachable(cluster)
    groups = {g: h for g, h in cluster.history.items()}
    if as_json:
        echo_json({"inventory": inventory, "groups": {
            g: {"current": h.current, "revisions": [asdict(h.revisions[n]) for n in h.numbers]}
            for g, h in groups.items()}})
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    for g, h in groups.items():
        if not h.revisions:
            console.print(f"group {g}: no revision recorded yet (the first rollout that restarts it records one)")
            continue
        table = Table("rev", "created", "image", "deployed", "variables", title=f"group {g}", title_justify="left")
        for n in h.numbers:
            rev = h.revisions[n]
            mark = f"{n} (current)" if n == h.current else str(n)
            image = rev.image + (f"\n(tag {rev.tag})" if rev.tag else "")
            table.add_row(mark, rev.created, image, rev.summary + (f"; {rev.note}" if rev.note else ""),
                          "\n".join(f"{k} = {v}" for k, v in sorted(rev.variables.items())))
        console.print(table)
