"""``k3deploy unlock INVENTORY``: show who holds the deployment lock, and break the lock of a run that is gone.

A run killed with SIGKILL, or a control machine that died, leaves the lock on the hosts
(:mod:`k3deploy.runtime.lock`). A run from the same control machine takes such a lock over on its own once the
holder's process is gone; from anywhere else, check that the run is really over, then break it here by its id.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from k3deploy.cli.common import echo_json, json_option
from k3deploy.errors import K3Error


@click.command("unlock")
@click.argument("inventory")
@click.option("--run", "run_id", metavar="ID", default=None,
              help="Break the lock that run ID holds (the id the refusal and `k3deploy plan` show).")
@json_option
def unlock(inventory: str, run_id: str | None, as_json: bool) -> None:
    """Show the deployment lock's holder on every host; with --run ID, remove that run's lock everywhere.

    Exit codes: 0 no lock is held (any more), 1 a lock is held (without --run, or by another run), 2 bad input.

    \b
    Examples:
      k3deploy unlock inventories/gb300.py
      k3deploy unlock inventories/gb300.py --run 3f2a9c1b7e4d
    """
    from k3deploy.facts.parallel import each_host
    from k3deploy.model import commands
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import connect, disconnect, open_inventory
    from k3deploy.runtime.lock import LockRecord, held_summary, run_on

    if run_id is not None and not run_id.isalnum():
        raise K3Error(f"--run {run_id!r}: a run id is the hex id the refusal or `k3deploy plan` names")
    state, t = open_inventory(inventory)
    runner.quiet_pyinfra()
    hosts = list(state.inventory)

    def config_dir(h: Any) -> str:
        return t.host_vars(h.name).k3_config_dir

    def one(h: Any) -> tuple[str | None, LockRecord | None, bool]:
        reason = connect(h, 15)
        if reason is not None:
            return reason, None, False
        ok, lines = run_on(h, commands.lock_read(config_dir(h)))
        rec = LockRecord.parse("\n".join(lines)) if ok and lines else None
        if rec is not None and run_id is not None and rec.run == run_id:
            removed, _ = run_on(h, commands.lock_release(config_dir(h), run_id))
            return None, None if removed else rec, removed
        return (None if ok else " ".join(lines)[:200]), rec, False

    try:
        results = dict(zip([h.name for h in hosts], each_host(state, hosts, one), strict=True))
    finally:
        disconnect(hosts)
    held = {name: rec for name, (_, rec, _) in results.items() if rec is not None}
    removed = sorted(name for name, (_, _, gone) in results.items() if gone)
    unreachable = {name: why for name, (why, _, _) in results.items() if why}
    lines = held_summary(held)
    if as_json:
        echo_json({"held": {n: rec.line() for n, rec in held.items()}, "removed": removed,
                   "unreachable": unreachable})
    else:
        if removed:
            click.echo(f"removed the deployment lock of run {run_id} on {', '.join(removed)}")
        for line in lines:
            click.echo(line)
        for name, why in unreachable.items():
            click.echo(f"{name}: not reachable ({why}): its lock, if any, stays", err=True)
        if not held and not unreachable:
            click.echo("the deployment lock is free on every host")
        elif held and run_id is None:
            click.echo(f"if that run is gone for good: k3deploy unlock {inventory} --run ID", err=True)
    if run_id is not None and not removed and not held and not unreachable:
        click.echo(f"run {run_id} holds no lock on any host", err=True)
    sys.exit(1 if held or unreachable else 0)
