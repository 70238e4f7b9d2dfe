"""``k3deploy sim``: the simulated cluster (up, down, status, fault, reboot, power, push, base)."""

from __future__ import annotations

import json
import os

import click

from k3deploy.errors import K3Error
from k3sim import base as sim_base
from k3sim import cluster as sim
from k3sim import faults as sim_faults


def _say(msg: str) -> None:
    click.echo(msg, err=True)


@click.group("sim")
def sim_group() -> None:
    """Simulated GPU cluster on this host: real systemd and sshd per node, simulated GPUs and engine."""


@sim_group.command("base")
@click.option("--rebuild", is_flag=True, help="Build the base root again even if it is cached.")
@click.option("--remove", is_flag=True, help="Delete the cached base roots.")
def base_cmd(rebuild: bool, remove: bool) -> None:
    """Build (once) and cache the nodes' base root; prints its path."""
    if remove:
        if sim.list_names():
            raise K3Error("simulated clusters are up (k3deploy sim status): run 'k3deploy sim down' for each first")
        for path in sim_base.remove_base():
            _say(f"removed {path}")
        return
    click.echo(str(sim_base.ensure_base(_say, rebuild=rebuild)))


@sim_group.command("up")
@click.option("--hardware", "-H", required=True, help="Hardware id, e.g. gb300, h200, mi355x, ascend_910c.")
@click.option("--nodes", "-n", type=int, required=True, help=f"Number of nodes (1-{sim.MAX_NODES}).")
@click.option("--name", default=sim.DEFAULT_NAME, show_default=True, help="Cluster name (2-10 chars).")
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="RANK:KIND[=VALUE]",
    help="Inject a fault (repeatable); KIND: " + ", ".join(sim_faults.FAULT_KINDS) + ". Cluster faults, without "
         "RANK: " + "; ".join(sim_faults.CLUSTER_FAULT_KINDS.values()) + ".",
)
@click.option("--time-scale", type=float, default=0.01, show_default=True, help="Factor on vLLM's timeouts/delays.")
@click.option("--subnet", default=None, help="First three octets of a free /24 (default: from the name).")
@click.option("--layout", default=None, metavar="pd:P,D",
              help="pd:P,D: inventory groups prefill (P nodes), decode (D nodes) and router instead of head/workers.")
@click.option("--replicas", type=int, default=1, show_default=True,
              help="Split the nodes into this many replicas (engine groups behind one router): k3_replica per host.")
@click.option("--strategy", "-s", default=None, metavar="ID",
              help="Serving strategy written to the cluster's group_vars (default: the recommended strategy that fits "
                   "--nodes; 'none': write none and check no size, for preflight of any size).")
@click.option("--uplink-mbps", type=float, default=400.0, show_default=True,
              help="Rate of the uplink to the simulated outside (registries, hub), Mbit/s, shared by all nodes.")
@click.option("--cluster-mbps", type=float, default=4000.0, show_default=True,
              help="Rate each node sends at to the other nodes, Mbit/s.")
@click.option("--weights-mb", type=float, default=8.0, show_default=True,
              help="Size of every checkpoint the simulated hub serves (its shards), MiB.")
@click.option("--image-mb", type=float, default=8.0, show_default=True,
              help="Size of the layers of every image the simulated registries serve, MiB.")
@click.option("--slurm", is_flag=True,
              help="Run a real Slurm in the cluster (Debian's 22.05): slurmctld on the rank-0 node (the submit host), "
                   "munged and slurmd on every node, partition k3; the group_vars select k3_launcher: slurm.")
@click.option("--spares", type=int, default=0, show_default=True,
              help="Add this many nodes of the same hardware after the engine nodes, in the inventory group spares "
                   "(they stand by for a lost node: docs/spares.md).")
@click.option("--vip", is_flag=True,
              help="Give the cluster a virtual address, <subnet>.250, as k3_vip in its group_vars (keepalived on the "
                   "nodes holds it on the node that serves: docs/operating.md#one-endpoint).")
@click.option("--imex", type=click.Choice(["standing", "per-job"]), default="standing", show_default=True,
              help="With --slurm on GB200/GB300: per-job = IMEX as a Slurm >= 24.05 site with "
                   "SwitchType=switch/nvidia_imex runs it (a channel per job, no standing domain; docs/sim.md).")
@click.option("--compile-seconds", type=float, default=None,
              help="Nominal seconds of an engine's cold compile, times --time-scale (default 100: 1 s at 0.01); a "
                   "compile cache hit takes a twentieth of it (docs/sim.md).")
@click.option("--monitoring", is_flag=True,
              help="Run a real Prometheus on this host scraping the cluster with `k3deploy export prometheus`'s "
                   "configuration (short intervals in the group_vars; its URL: sim status --json, prometheus; "
                   "docs/monitoring.md).")
@click.option("--json", "as_json", is_flag=True,
              help="Print {name, inventory, nodes, outside[, slurm, prometheus]} as JSON.")
def up_cmd(
    hardware: str, nodes: int, name: str, faults: tuple[str, ...], time_scale: float, subnet: str | None,
    layout: str | None, strategy: str | None, uplink_mbps: float, cluster_mbps: float, weights_mb: float,
    image_mb: float, as_json: bool, replicas: int, slurm: bool, spares: int, vip: bool, imex: str, monitoring: bool,
    compile_seconds: float | None,
) -> None:
    """Create and boot a simulated cluster and its simulated outside (registries and model hub at <subnet>.254,
    behind a shaped uplink); prints its pyinfra inventory."""
    res = sim.up(
        hardware=hardware,
        nodes=nodes,
        name=name,
        faults=list(faults),
        time_scale=time_scale,
        subnet=subnet,
        progress=_say,
        pd_layout=layout,
        strategy=strategy,
        uplink_mbps=uplink_mbps,
        cluster_mbps=cluster_mbps,
        weights_mb=weights_mb,
        image_mb=image_mb,
        replicas=replicas,
        slurm=slurm,
        spares=spares,
        vip=vip,
        imex=imex,
        monitoring=monitoring,
        compile_seconds=compile_seconds,
    )
    if as_json:
        click.echo(json.dumps(res))
        return
    for n in res["nodes"]:
        click.echo(f"{n['name']}\t{n['ip']}\trank {n['rank']}" + ("\tspare" if n["name"] in res.get("spares", [])
                                                                   else ""))
    if res.get("outside"):
        click.echo(f"outside: {res['outside']['ip']} ({', '.join(res['outside']['names'])}), uplink "
                   f"{uplink_mbps:g} Mbit/s, node to node {cluster_mbps:g} Mbit/s")
    if res.get("vip"):
        click.echo(f"virtual address: {res['vip']} (k3_vip)")
    if res.get("slurm"):
        sl = res["slurm"]
        click.echo(f"slurm: slurmctld on {sl['controller']} (the submit host), partition {sl['partition']}")
    if res.get("prometheus"):
        click.echo(f"prometheus: {res['prometheus']} (scraping the cluster: docs/monitoring.md)")
    click.echo(f"inventory: {res['inventory']}")
    click.echo(f"try: pyinfra {res['inventory']} exec -y -- hostname")


@sim_group.command("down")
@click.option("--name", default=sim.DEFAULT_NAME, show_default=True)
@click.option("--all", "all_", is_flag=True, help="Remove every simulated cluster.")
@click.option("--json", "as_json", is_flag=True, help='Print {"removed": [names], "absent": [names]}.')
def down_cmd(name: str, all_: bool, as_json: bool) -> None:
    """Stop a simulated cluster and remove everything it created."""
    names = sim.list_names() if all_ else [name]
    removed, absent = [], []
    for nm in names:
        if sim.down(nm, progress=_say):
            removed.append(nm)
        else:
            absent.append(nm)
            _say(f"no simulated cluster {nm!r}: nothing to do")
    if as_json:
        click.echo(json.dumps({"removed": removed, "absent": absent}))


@sim_group.command("status")
@click.option("--name", default=None, help="Only this cluster.")
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name: str | None, as_json: bool) -> None:
    """List simulated clusters and whether each node runs and answers on SSH; the outside's address, rates and
    bytes served (--json: outside_bytes, artifact_bytes, uplink_mbps, cluster_mbps, outside); for a --slurm cluster,
    sinfo's nodes and squeue's jobs (--json: slurm)."""
    if name is not None:
        sim.validate_name(name)
    if os.geteuid() != 0:
        raise K3Error("the simulated cluster's state is readable by root only: run k3deploy sim status as root (sudo)")
    clusters = sim.status(name)
    if as_json:
        click.echo(json.dumps({"clusters": clusters}, indent=2))
        return
    if not clusters:
        click.echo("no simulated clusters")
        return
    for c in clusters:
        click.echo(f"{c['name']}: {c['hardware']} x {len(c['nodes'])}, {c['phase']}, {c['subnet']}")
        click.echo(f"  inventory: {c['inventory']}")
        if "prometheus" in c:
            click.echo(f"  prometheus: {c['prometheus'] or 'stopped'}")
        for n in c["nodes"]:
            mem = f"{n['memory_bytes'] / 2**20:.0f} MiB" if n["memory_bytes"] else "-"
            state = "running" if n["running"] else "stopped"
            ssh = "ssh ok" if n["ssh"] else "no ssh"
            faults = ",".join(n["faults"]) or "-"
            click.echo(f"  {n['name']:<16} {n['ip']:<14} rank {n['rank']:<3} {state:<8} {ssh:<7} {mem:>8}  "
                       f"faults: {faults}")
        out = c.get("outside")
        if out:
            cut = out.get("cut") or {}
            faults = ",".join(f + (" (fired)" if cut.get("fired") else "") for f in out["faults"]) or "-"
            click.echo(f"  outside          {out['ip']:<14} {'running' if out['running'] else 'stopped'}, uplink "
                       f"{c['uplink_mbps']:g} Mbit/s, node to node {c['cluster_mbps']:g} Mbit/s, served "
                       f"{c['outside_bytes'] / 2**20:.1f} MiB (one node's artifacts: {c['artifact_bytes'] / 2**20:.1f}"
                       f" MiB)  faults: {faults}")
        sl = c.get("slurm")
        if sl:
            click.echo(f"  slurm            controller {sl['controller']}, partition {sl['partition']}"
                       + (f"  error: {sl['error']}" if sl.get("error") else ""))
            for n in sl["nodes"]:
                click.echo(f"    {n['name']:<16} {n['partition']:<6} {n['state']}")
            for j in sl["jobs"]:
                click.echo(f"    job {j['id']:<8} {j['name']:<20} {j['state']:<10} {j['nodelist'] or j['reason']}")


@sim_group.command("fault")
@click.argument("specs", nargs=-1, metavar="[NAME] RANK:KIND[=VALUE]|outside-cut=MB...")
@click.option("--name", default=None, help=f"Cluster name (default {sim.DEFAULT_NAME}).")
@click.option("--clear", is_flag=True,
              help="Clear the given faults (RANK, RANK:KIND or outside-cut), or all faults when none given.")
def fault_cmd(specs: tuple[str, ...], name: str | None, clear: bool) -> None:
    """Switch faults of a running simulated cluster (node.json is rewritten; tools re-read it).

    Node faults are RANK:KIND[=VALUE]. The cluster fault outside-cut=MB makes the simulated outside serve MB more
    MiB, then cut every transfer in progress once (the connections close mid-body), then serve normally again."""
    items = list(specs)
    if items and ":" not in items[0] and not items[0].isdigit() and not sim_faults.is_cluster_fault(items[0]):
        if name is not None and name != items[0]:
            raise K3Error(f"cluster given twice ({items[0]!r} and --name {name!r}): give it once")
        name = items.pop(0)
    name = name or sim.DEFAULT_NAME
    if not items and not clear:
        raise K3Error(f"no fault given: use e.g. 'k3deploy sim fault {name} 1:driver=570.86.15' or "
                      f"'k3deploy sim fault {name} outside-cut=8', or --clear")
    if clear:
        res = sim.set_faults(name, clear=items, clear_all=not items)
    else:
        res = sim.set_faults(name, add=items)
    for node, faults in res.items():
        click.echo(f"{node}\t{','.join(faults) or '-'}")


@sim_group.command("push")
@click.argument("args", nargs=-1, metavar="[NAME] REPOSITORY:TAG")
@click.option("--name", default=None, help=f"Cluster name (default {sim.DEFAULT_NAME}).")
def push_cmd(args: tuple[str, ...], name: str | None) -> None:
    """Push a new build of REPOSITORY:TAG to the simulated outside's registry (a re-push of a mutable tag): the tag
    names the new build from now on, earlier builds stay reachable by digest. Prints the new digest."""
    items = list(args)
    if len(items) == 2:
        if name is not None and name != items[0]:
            raise K3Error(f"cluster given twice ({items[0]!r} and --name {name!r}): give it once")
        name = items.pop(0)
    if len(items) != 1:
        raise K3Error("give one REPOSITORY:TAG, e.g. 'k3deploy sim push k3sim vllm/vllm-openai:kimi-k3'")
    click.echo(sim.push(name or sim.DEFAULT_NAME, items[0]))


@sim_group.command("reboot", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, metavar="[NAME] RANK")
@click.option("--name", default=None, help=f"Cluster name (default {sim.DEFAULT_NAME}).")
@click.option("--json", "as_json", is_flag=True,
              help="Print {cluster, name, rank, ip, pid, previous_pid, was_running, clean, seconds} as JSON.")
def reboot_cmd(args: tuple[str, ...], name: str | None, as_json: bool) -> None:
    """Reboot node RANK (0 = head) of a running simulated cluster, as 'systemctl reboot' on the node would: its
    units stop, the node boots again with the same root, address and faults, and its enabled units start again.
    Returns once the node answers on SSH again (K3SIM_BOOT_TIMEOUT seconds at most, default 90)."""
    items = list(args)
    if items and not items[0].lstrip("-").isdigit():
        if name is not None and name != items[0]:
            raise K3Error(f"cluster given twice ({items[0]!r} and --name {name!r}): give it once")
        name = items.pop(0)
    name = name or sim.DEFAULT_NAME
    sim.validate_name(name)
    if not items:
        raise K3Error(f"no node rank given: use e.g. 'k3deploy sim reboot {name} 1' (0 = the head)")
    if len(items) > 1:
        raise K3Error(f"give one node rank, not {' '.join(items)!r}: e.g. 'k3deploy sim reboot {name} 1'")
    if not items[0].isdigit():
        raise K3Error(f"bad rank {items[0]!r}: give a node rank (0 = the head), e.g. 'k3deploy sim reboot {name} 1'")
    res = sim.reboot(name, int(items[0]), progress=_say)
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"{res['name']}\t{res['ip']}\trank {res['rank']}\tup again in {res['seconds']:.1f} s"
               + ("" if res["clean"] else " (reset: it did not stop in time)"))


@sim_group.command("power", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, metavar="[NAME] RANK off|on")
@click.option("--name", default=None, help=f"Cluster name (default {sim.DEFAULT_NAME}).")
@click.option("--json", "as_json", is_flag=True,
              help="Print {cluster, name, rank, ip, power, was_on, at, seconds} as JSON (at: when it went off or "
                   "answered again, seconds since the epoch).")
def power_cmd(args: tuple[str, ...], name: str | None, as_json: bool) -> None:
    """Power node RANK (0 = node1) of a running simulated cluster off, as a tray that loses power (its nspawn gets
    SIGTERM: the node's systemd powers off, its units stop, its address answers nothing), or on again: it boots as it
    was, with the same root, address and faults, and its enabled units start (returns once it answers on SSH)."""
    items = list(args)
    if len(items) == 3:
        if name is not None and name != items[0]:
            raise K3Error(f"cluster given twice ({items[0]!r} and --name {name!r}): give it once")
        name = items.pop(0)
    name = name or sim.DEFAULT_NAME
    sim.validate_name(name)
    if len(items) != 2 or items[1] not in ("off", "on"):
        raise K3Error(f"give a node rank and off or on, not {' '.join(items)!r}: e.g. 'k3deploy sim power {name} 1 "
                      "off' (0 = node1)")
    if not items[0].isdigit():
        raise K3Error(f"bad rank {items[0]!r}: give a node rank (0 = node1), e.g. 'k3deploy sim power {name} 1 off'")
    res = sim.power(name, int(items[0]), items[1] == "on", progress=_say)
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"{res['name']}\t{res['ip']}\trank {res['rank']}\t{res['power']}"
               + ("" if res["was_on"] != (res["power"] == "on") else " (already)"))
