"""``k3deploy plan INVENTORY``: what a rollout would change, read from the hosts without changing them.

Exit codes (like ``terraform plan -detailed-exitcode``): 0 no changes, 2 bad input or an error (unreachable
host, a failing preflight check), 3 changes pending.

The rollout is computed exactly as ``deploy/k3.py`` computes it (inventory -> variables -> plan -> preflight
facts -> derived settings -> rendered files -> what restarts), then compared with the installed unit and env
files and unit states.
"""

from __future__ import annotations

import json
import sys

import click

EXIT_CHANGES = 3


@click.command("plan")
@click.argument("inventory")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(inventory: str, as_json: bool) -> int:
    """Show what `pyinfra INVENTORY deploy/k3.py` would change, without changing anything.

    Per host: role and rank, image now -> planned, the container argv diff (one flag per line), the env
    diff (secrets masked), other unit-file changes, and which services restart in which order.

    \b
    Exit codes: 0 no changes, 2 bad input or error, 3 changes pending.
    Examples:
      k3deploy plan inventories/gb300.py
      k3deploy plan inventories/gb300.py --json | jq .restart_order
    """
    from k3deploy.cli.common import read_cluster
    from k3deploy.cluster.diff import build, render_text
    from k3deploy.runtime.gather import require_reachable

    cluster = read_cluster("plan", inventory)
    require_reachable(cluster)
    rollout = cluster.require_rollout()
    report = build(rollout, cluster.installed)
    failures = ({h: [f.line() for f in fs] for h, fs in cluster.preflight.failures_by_host().items()}
                if cluster.preflight else {})
    for host, rows in failures.items():
        report.notes.append(f"preflight fails on {host}: {'; '.join(rows)}")
    if as_json:
        data = report.to_dict()
        data["preflight_failures"] = failures
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_text(report, rollout), nl=False)
    if failures:
        click.echo("error: preflight fails on " + ", ".join(sorted(failures))
                   + ": the rollout would stop before changing anything; fix the nodes (k3deploy preflight "
                   f"{inventory}) and rerun", err=True)
        sys.exit(2)
    return report.exit_code
