"""``k3deploy unlock INVENTORY``: show who holds the deployment lock, and break the lock of a run that is gone.

A run killed with SIGKILL, or a control machine that died, leaves the lock on the hosts
(:mod:`k3deploy.runtime.lock`). A run takes such a lock over on its own once it is stale (its process gone, on the
same control machine; its lease run out, from anywhere). Here, by the run's id: the lock of a run that is not alive
is removed on every host; a live one (its process runs on this machine, or it renewed its lease within the lease's
length) is refused in one line, exit 1, nothing removed; ``--force`` removes it anyway, with a warning.

Example::

    $ k3deploy unlock inventories/gb300.py --run 3f2a9c1b7e4d
    removed the deployment lock of run 3f2a9c1b7e4d on node1, node2
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
              help="Break the lock that run ID holds (the id the refusal and `k3deploy plan` show), if that run is "
                   "not alive.")
@click.option("--force", is_flag=True, default=False,
              help="With --run: remove the lock even of a run that is alive (it goes on changing the cluster).")
@json_option
def unlock(inventory: str, run_id: str | None, force: bool, as_json: bool) -> None:
    """Show the deployment lock's holder on every host; with --run ID, remove that run's lock everywhere, unless the
    run is alive (its process runs on this control machine, or it renewed its lease within k3_lock_lease seconds).

    Exit codes: 0 no lock is held (any more), 1 a lock is held (without --run, by another run, or by a live run
    without --force), 2 bad input.

    \b
    Examples:
      k3deploy unlock inventories/gb300.py
      k3deploy unlock inventories/gb300.py --run 3f2a9c1b7e4d
      k3deploy unlock inventories/gb300.py --run 3f2a9c1b7e4d --force
    """
    from k3deploy.facts.parallel import each_host
    from k3deploy.model import commands
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import connect, disconnect, open_inventory
    from k3deploy.runtime.lock import LockHeld, LockRecord, alive, held_summary, run_on

    if run_id is not None and not run_id.isalnum():
        raise K3Error(f"--run {run_id!r}: a run id is the hex id the refusal or `k3deploy plan` names")
    if force and run_id is None:
        raise K3Error("--force without --run: name the run whose lock to remove (--run ID, as `k3deploy unlock "
                      f"{inventory}` shows it)")
    state, t = open_inventory(inventory)
    runner.quiet_pyinfra()
    hosts = list(state.inventory)

    def config_dir(h: Any) -> str:
        return t.host_vars(h.name).k3_config_dir

    def read(h: Any) -> tuple[str | None, LockRecord | None]:
        reason = connect(h, 15)
        if reason is not None:
            return reason, None
        ok, lines = run_on(h, commands.lock_read(config_dir(h)))
        rec = LockRecord.parse("\n".join(lines)) if ok and lines else None
        return (None if ok else " ".join(lines)[:200]), rec

    def remove(h: Any) -> bool:
        return run_on(h, commands.lock_release(config_dir(h), run_id or ""))[0]

    try:
        seen = dict(zip([h.name for h in hosts], each_host(state, hosts, read), strict=True))
        # decided for the run as a whole before anything is removed: alive on one host is alive
        mine = [h for h in hosts if (rec := seen[h.name][1]) is not None and rec.run == run_id]
        lives = [(h.name, why) for h in mine if (why := alive(seen[h.name][1])) is not None]  # type: ignore[arg-type]
        if lives and not force:
            name, why = lives[0]
            raise LockHeld(f"run {run_id} is alive ({why}; its lock as {name} shows it): its lock stays on every "
                          f"host. Wait for it to end (it gives the lock back), or remove it anyway: k3deploy unlock "
                          f"{inventory} --run {run_id} --force")
        gone = dict(zip([h.name for h in mine], each_host(state, mine, remove), strict=True)) if mine else {}
    finally:
        disconnect(hosts)
    if lives:
        name, why = lives[0]
        click.echo(f"warning: run {run_id} is alive ({why}; its lock as {name} showed it): its lock was removed "
                   "anyway (--force); that run goes on changing the cluster, and another run may now start beside it",
                   err=True)
    held = {name: rec for name, (_, rec) in seen.items() if rec is not None and not gone.get(name)}
    removed = sorted(name for name, ok in gone.items() if ok)
    unreachable = {name: why for name, (why, _) in seen.items() if why}
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
