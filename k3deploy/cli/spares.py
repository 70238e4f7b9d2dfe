"""``k3deploy spares INVENTORY``: the hot spares (the inventory group ``spares``), the quarantined nodes and who
stands in for whom, read from the nodes; ``--release NODE`` brings a quarantined node back as a spare.

A node is quarantined by the deploy run that finds a fatal hardware event on it (its record ``quarantine`` in
``k3_config_dir``); it runs nothing and takes no rank until the operator releases it here (docs/spares.md).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.runtime.gather import Gathered


def listing(gathered: Gathered) -> dict[str, Any]:
    """The spares as the nodes tell them: each host that stands by, stands in for a lost member or runs nothing
    (``hosts``), the quarantined ones with their records (``quarantined``; ``recorded`` false: the next deploy run
    records it), the substitutions in effect and the lost members no spare replaces."""
    from k3deploy.model.spares import Quarantine

    settled = gathered.spares
    if settled is None:
        return {"hosts": [], "quarantined": [], "substitutions": [], "unfilled": []}
    hosts: list[dict[str, Any]] = []
    fresh = set(settled.new)
    for sub in settled.substitutions:
        hosts.append({"host": sub.spare, "state": "in use", "detail": sub.line()
                      + (" (new: the next deploy run makes it)" if sub in fresh else "")})
    hosts += [{"host": h, "state": "standing by", "detail": "staged, runs nothing"} for h in settled.standby]
    hosts += [{"host": h, "state": "runs nothing", "detail": why} for h, why in settled.out.items()]
    quarantined = []
    for host, reading in gathered.readings.items():
        recorded = Quarantine.from_text(reading.spare_files.quarantine) if reading.spare_files else None
        q = recorded or gathered.quarantine.get(host)
        if q is not None:
            quarantined.append({"host": host, "reason": q.reason, "when": q.when, "events": list(q.events),
                                "recorded": recorded is not None})
    return {"hosts": hosts, "quarantined": quarantined,
            "substitutions": [{**s.as_dict(), "new": s in fresh} for s in settled.substitutions],
            "unfilled": [{"group": u.group, "rank": u.rank, "lost": u.lost, "why": u.why} for u in settled.unfilled]}


@click.command("spares")
@click.argument("inventory")
@click.option("--release", "release", metavar="NODE", default=None,
              help="Bring quarantined NODE back: it becomes a spare (the events it was quarantined for no longer "
                   "quarantine it; a new one does).")
@json_option
def spares(inventory: str, release: str | None, as_json: bool) -> None:
    """List the spares: each host of the spares group standing by (staged, running nothing) or standing in for a
    lost member (group, rank, whom, why, since when), each node that runs nothing and why (lost, quarantined), and
    each lost member no spare is left for. Read-only without --release.

    Exit codes: 0, 1 a lost member has no spare, 2 bad input (or NODE is not quarantined).

    \b
    Examples:
      k3deploy spares inventories/gb300.py
      k3deploy spares inventories/gb300.py --release node7
    """
    from k3deploy.runtime.views import SPARES

    gathered = read_cluster("spares", inventory, view=SPARES)
    if release is not None:
        released = release_node(inventory, gathered, release)
        if as_json:
            echo_json({"released": release, "reason": released})
        else:
            click.echo(f"released {release} ({released}): it is a spare from now on")
        return
    data = {"inventory": inventory, **listing(gathered)}
    if as_json:
        echo_json(data)
    else:
        if not data["hosts"] and not data["unfilled"]:
            click.echo("no spares: add hosts of the same hardware to the inventory's spares group (docs/spares.md)")
        for h in data["hosts"]:
            click.echo(f"{h['host']}: {h['state']}: {h['detail']}")
        for q in data["quarantined"]:
            click.echo(f"{q['host']}: quarantined: {q['reason']}" + (f", since {q['when']}" if q["when"] else "")
                       + ("" if q["recorded"] else " (the next deploy run records it)")
                       + f"; release it: k3deploy spares {inventory} --release {q['host']}")
        for u in gathered.spares.unfilled if gathered.spares is not None else []:
            click.echo(f"error: {u.line()}", err=True)
    sys.exit(1 if data["unfilled"] else 0)


def release_node(inventory: str, gathered: Gathered, node: str) -> str:
    """Release quarantined ``node``: its events are kept as released and its quarantine record removed, on the
    node. Returns what it was quarantined for; raises :class:`K3Error` when it is not in the inventory, cannot be
    reached or is not quarantined."""
    from k3deploy.model import commands
    from k3deploy.model.spares import (
        QUARANTINE_FILE,
        RELEASED_FILE,
        Quarantine,
        parse_released,
        released_text,
    )
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import connect, disconnect, load_inventory
    from k3deploy.runtime.lock import run_on

    names = [r.name for r in gathered.target.records]
    if node not in names:
        raise K3Error(f"--release {node}: no such host in {inventory} (its hosts: {', '.join(names)})")
    reading = gathered.readings.get(node)
    if reading is None:
        why = gathered.preflight.unreachable().get(node) if gathered.preflight else None
        raise K3Error(f"--release {node}: it cannot be reached ({why or 'not read'}): bring it up first")
    files = reading.spare_files
    q = (Quarantine.from_text(files.quarantine) if files is not None else None) or gathered.quarantine.get(node)
    if q is None:
        raise K3Error(f"--release {node}: it is not quarantined (k3deploy spares {inventory} lists those that are)")
    text = released_text(parse_released(files.released if files is not None else None), q)
    cfg = gathered.target.host_vars(node).k3_config_dir
    state = load_inventory(inventory)
    runner.quiet_pyinfra()
    host = next(h for h in state.inventory if h.name == node)
    try:
        reason = connect(host, gathered.target.host_vars(node).k3_link_timeout)
        if reason is not None:
            raise K3Error(f"--release {node}: it cannot be reached ({reason}): bring it up first")
        ok, lines = run_on(host, commands.release_quarantine(cfg, QUARANTINE_FILE, RELEASED_FILE, text))
    finally:
        disconnect([host])
    if not ok:
        raise K3Error(f"--release {node}: the node refused it ({' '.join(lines)[:200]}): check {cfg} there")
    return q.reason
