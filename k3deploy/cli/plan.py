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
from dataclasses import dataclass, field
from typing import Any

import click

from k3deploy.errors import K3Error

EXIT_CHANGES = 3


@dataclass
class Cluster:
    """A rollout bound to live hosts: what ``deploy/k3.py`` would write, and what the hosts have now."""

    rollout: Any                                   # k3deploy.cluster.rollout.Rollout (with the derived host settings)
    installed: dict[tuple[str, str], Any]          # (host, unit) -> planning.Installed
    preflight: list[Any] = field(default_factory=list)       # CheckResult rows
    failures: dict[str, list[str]] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)  # host -> ssh address
    ssh: dict[str, list[str]] = field(default_factory=dict)  # host -> ssh argv from the control machine


def _records(inventory: Any) -> list[Any]:
    from k3deploy.cluster.binding import HostRecord

    out = []
    for h in inventory:
        groups = tuple(g for g in getattr(h, "groups", ()) if not g.startswith("@"))
        out.append(HostRecord(h.name, groups, dict(h.data.dict())))
    return out


def _read_installed(state: Any, host: Any, units: list[Any]) -> dict[tuple[str, str], Any]:
    from pyinfra.api.facts import get_fact
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.facts.files import FileContents, Sha256File

    from k3deploy.cluster.diff import Installed
    from k3deploy.facts.rollout import UnitState

    def fact(cls: Any, **kwargs: Any) -> Any:
        with ctx_state.use(state), ctx_host.use(host):
            return get_fact(state, host, cls, kwargs=kwargs, apply_failed_hosts=False)

    def text(path: str) -> str | None:
        lines = fact(FileContents, path=path)
        return None if lines is None else "".join(f"{ln}\n" for ln in lines)

    out = {}
    for u in units:
        status = fact(UnitState, unit=u.unit)
        out[(u.host, u.unit)] = Installed(
            unit_text=text(u.unit_path), env_text=text(u.env_path),
            unit_sha=fact(Sha256File, path=u.unit_path), env_sha=fact(Sha256File, path=u.env_path),
            active=status.active if status is not None else "absent")
    return out


def gather(spec: str, *, read_installed: bool = True) -> Cluster:
    """Connect to every host (read-only), run the preflight facts and compute the rollout as the deploy does.

    Raises :class:`K3Error` for a bad inventory or selection and when a host cannot be reached.
    """
    import gevent
    from pyinfra.context import ctx_config, ctx_inventory, ctx_state

    from k3deploy.cluster.inventory import plan_for, variables_for
    from k3deploy.cluster.rollout import compute
    from k3deploy.preflight import runner  # patches gevent first
    from k3deploy.runtime import phases as rollout_deploy

    state = runner.load_inventory(spec)
    records = _records(state.inventory)
    v = variables_for(records, spec)
    plan = plan_for(records, v)
    first = compute(plan, records, v)  # validates the inventory against the plan before connecting
    runner._quiet_pyinfra()
    hosts = list(state.inventory)
    with ctx_state.use(state), ctx_config.use(state.config), ctx_inventory.use(state.inventory):
        jobs = [gevent.spawn(runner._connect, h) for h in hosts]
        gevent.joinall(jobs)
        down = [f"{h.name}: {j.value}" for h, j in zip(hosts, jobs) if j.value is not None]
        try:
            if down:
                raise K3Error("cannot reach " + "; ".join(down) + ": check the address, SSH key and that the node "
                              "is up")
            failures, host_env, ifaces, rows = rollout_deploy._preflight(first, records)
            unreachable = [r for r in rows if r.check == "host.reachable"]
            if unreachable:
                raise K3Error("cannot reach " + "; ".join(f"{r.host}: {r.observed}" for r in unreachable)
                              + ": check the node and rerun")
            rollout = compute(plan, records, v, ifaces=ifaces, host_env=host_env)
            installed: dict[tuple[str, str], Any] = {}
            if read_installed:
                by_name = {h.name: h for h in hosts}
                jobs = [gevent.spawn(_read_installed, state, by_name[name], rollout.on_host(name))
                        for name in dict.fromkeys(u.host for u in rollout.units)]
                gevent.joinall(jobs)
                for j in jobs:
                    if not j.successful():
                        raise K3Error(f"reading the installed units failed: {type(j.exception).__name__}: "
                                      f"{j.exception}: check the connection and rerun")
                    installed.update(j.value)
        finally:
            for h in hosts:
                if h.connected:
                    try:
                        h.disconnect()
                    except Exception:
                        pass
    addresses = {h.name: str(h.data.get("ssh_hostname") or h.name) for h in hosts}
    return Cluster(rollout=rollout, installed=installed, preflight=rows, failures=failures, addresses=addresses,
                   ssh={h.name: ssh_argv(h.data.dict(), addresses[h.name]) for h in hosts})


def ssh_argv(data: dict[str, Any], address: str) -> list[str]:
    """``ssh`` with the inventory's connection settings (user, port, key, known hosts)."""
    argv = ["ssh"]
    if data.get("ssh_port"):
        argv += ["-p", str(data["ssh_port"])]
    if data.get("ssh_key"):
        argv += ["-i", str(data["ssh_key"])]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    strict = data.get("ssh_strict_host_key_checking")
    if strict:
        argv += ["-o", f"StrictHostKeyChecking={strict}"]
    user = data.get("ssh_user")
    return argv + [f"{user}@{address}" if user else address]


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
    from k3deploy.cluster.diff import build, render_text

    try:
        cluster = gather(inventory)
    except K3Error:
        raise
    except Exception as exc:  # never a traceback for the user
        raise K3Error(f"plan could not run: {type(exc).__name__}: {exc}") from None
    report = build(cluster.rollout, cluster.installed)
    for host, rows in cluster.failures.items():
        report.notes.append(f"preflight fails on {host}: {'; '.join(rows)}")
    if as_json:
        data = report.to_dict()
        data["preflight_failures"] = cluster.failures
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_text(report, cluster.rollout), nl=False)
    if cluster.failures:
        click.echo("error: preflight fails on " + ", ".join(sorted(cluster.failures))
                   + ": the rollout would stop before changing anything; fix the nodes (k3deploy preflight "
                   f"{inventory}) and rerun", err=True)
        sys.exit(2)
    return report.exit_code
