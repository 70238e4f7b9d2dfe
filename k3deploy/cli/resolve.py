"""``k3deploy resolve``: print the per-node commands of a selection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from k3deploy.cli.common import echo_json, json_option, selection_kwargs, selection_options
from k3deploy.recipe.argv import flag_value

if TYPE_CHECKING:
    from k3deploy.model.rollout import UnitWork
    from k3deploy.recipe.plan import NodePlan, Plan


@click.command()
@selection_options
@click.option("--inventory", "inventory", metavar="FILE", default=None,
              help="Resolve the selection of this pyinfra inventory (and its group_vars) and print each host's "
                   "commands with the placeholders filled in.")
@click.option("--full", is_flag=True, help="Print every node's env and command in full (by default a group of "
              "more than two nodes prints what its nodes share once, then each node's differences).")
@json_option
def resolve(recipe_path: str | None, as_json: bool, inventory: str | None = None, full: bool = False,
            **params: object) -> None:
    """Resolve a selection into per-node `vllm serve` commands, env and docker run forms.

    \b
    Examples:
      k3deploy resolve --hardware b300
      k3deploy resolve --hardware gb300 --strategy multi_node_tp --nodes 2 --json
      k3deploy resolve --hardware b300 --strategy pd_cluster --prefill-nodes 1 --decode-nodes 2
      k3deploy resolve --inventory inventories/gb300.py
    """
    if inventory is not None:
        _resolve_inventory(inventory, as_json, params, full)
        return
    from k3deploy import load_recipe
    from k3deploy import resolve as do_resolve
    recipe = load_recipe(recipe_path)
    plan = do_resolve(recipe, **selection_kwargs(params))
    for w in plan.warnings:
        click.echo(f"warning: {w}", err=True)
    from k3deploy.recipe.lint import echo_findings

    echo_findings(recipe, plan, lambda line: click.echo(line, err=True))
    if as_json:
        echo_json(plan.to_dict())
        return
    engines = [n for n in plan.nodes if n.role != "router"]
    click.echo(f"# {plan.recipe}: {plan.model} on {plan.hardware}, {plan.strategy}, variant {plan.variant}, "
               f"{len(engines)} node{'s' if len(engines) != 1 else ''}")
    click.echo(f"# features: {', '.join(plan.features) or '(none)'}")
    click.echo(f"# image: {plan.image}")
    _echo_nodes(plan, full)
    _echo_front_router(plan)
    from k3deploy.vendors import pack_for_container

    pack = pack_for_container(plan.vendor)
    site_form = pack is not None and pack.site_docker_form
    if len(engines) == 1 and site_form:
        click.echo("\n# the recipes site's docker run form (single node; the unit k3deploy installs runs the "
                   "container command `k3deploy resolve --inventory INVENTORY` prints)")
        click.echo(plan.site_docker_command(engines[0]))
    else:
        why = ("nodes of a multi-node group need host networking and the RDMA devices, not -p" if site_form else
               pack.no_site_docker_why if pack is not None else f"no vendor pack for {plan.vendor}")
        click.echo(f"\n# no docker run form: the recipes site's would not run here ({why}); "
                   "`k3deploy resolve --inventory INVENTORY` prints the container command each node's unit runs")


#: a group of more nodes than this prints what its nodes share once (``--full`` prints every node)
COMPACT_ABOVE = 2


def _title(node: NodePlan) -> str:
    if node.role == "router":
        port = flag_value(node.argv, "--port")
        return "router" + (f", port {port}" if port else "")
    return f"{node.role} (rank {node.rank})" + (f", port {node.port}" if node.port and node.serves_http
                                                 else ", headless")


def _echo_nodes(plan: Plan, full: bool) -> None:
    """Each node's env and command; a group (the engine nodes, or a P/D pool) of more than ``COMPACT_ABOVE`` nodes
    as what its nodes share, then per node the values that differ (ranks, ``--headless``, its own env)."""
    from k3deploy.recipe.compact import Member, shared_and_differences
    from k3deploy.recipe.printing import format_command, format_exports

    groups: dict[str, list[NodePlan]] = {}
    for node in plan.nodes:
        groups.setdefault("engine" if node.role in ("head", "worker") else node.role, []).append(node)
    for name, nodes in groups.items():
        if full or len(nodes) <= COMPACT_ABOVE or name == "router":
            for node in nodes:
                click.echo(f"\n## {_title(node)}")
                if node.env:
                    click.echo(format_exports(node.env))
                click.echo(node.command)
            continue
        shared = shared_and_differences([Member(_title(n), n.argv, n.env) for n in nodes])
        what = "engine nodes" if name == "engine" else f"{name} nodes"
        click.echo(f"\n## shared by the {len(nodes)} {what} (each node sets the variables of its line below; "
                   "--full prints every node)")
        if shared.env:
            click.echo(format_exports(shared.env))
        click.echo(format_command(shared.argv))
        click.echo(f"\n## per node ({what})")
        for label, sets, env in shared.per_node:
            own = "".join(f"; export {k}={v}" for k, v in env.items())
            click.echo(f"{label}: {' '.join(sets) or '(nothing differs)'}{own}")


def _echo_front_router(plan: Plan) -> None:
    """The router the deploy puts in front of several serving engine nodes (hybrid-LB data parallel,
    ``k3_front_hybrid_lb``): not in the recipe's plan, but part of what gets deployed."""
    serving = [n for n in plan.nodes if n.role in ("head", "worker") and n.serves_http]
    if any(n.role == "router" for n in plan.nodes) or len(serving) < 2:
        return
    from k3deploy.model.rollout import front_router_argv
    from k3deploy.model.variables import Variables
    from k3deploy.recipe.printing import format_router

    defaults = Variables()
    if not defaults.k3_front_hybrid_lb:
        return
    urls = [f"http://{'$HEAD_IP' if n.rank == 0 else f'$NODE{n.rank}_IP'}:{n.port or 8000}" for n in serving]
    click.echo(f"\n## router, port {defaults.k3_router_port} (added by the deploy on the head's host: one endpoint "
               f"in front of the {len(serving)} serving nodes; k3_front_hybrid_lb, k3_router_port)")
    click.echo(format_router(front_router_argv(urls, defaults)))


# ------------------------------------------------------------------------------------ --inventory


def _echo_units_compact(group: str, units: list[UnitWork]) -> None:
    """The units of one group of more than ``COMPACT_ABOVE`` hosts: what they share (env, command, container
    command) once, then per host its address and what differs."""
    import shlex

    from k3deploy.model.diff import planned_exec
    from k3deploy.model.secrets import mask_argv, mask_env
    from k3deploy.recipe.compact import Member, shared_and_differences
    from k3deploy.recipe.printing import format_exports

    def label(unit: UnitWork) -> str:
        return f"{unit.host} ({unit.node.address}): {unit.node.role} (rank {unit.rank}), {unit.unit}"

    command = shared_and_differences([Member(label(u), mask_argv(u.node.argv), mask_env(u.node.env)) for u in units])
    containers = [mask_argv(planned_exec(u) or []) for u in units]
    run = (shared_and_differences([Member(label(u), c, {}) for u, c in zip(units, containers, strict=True)],
                                  head_words=2) if all(containers) else None)
    click.echo(f"\n## shared by the {len(units)} hosts of group {group} (each host sets the variables of its line "
               "below; --full prints every host)")
    if command.env:
        click.echo(format_exports(command.env))
    click.echo(" ".join(shlex.quote(w) if not w.startswith("$") else w for w in command.argv))
    if run is not None:
        click.echo(f"# as run by {units[0].unit}:")
        click.echo(" ".join(shlex.quote(w) if not w.startswith("$") else w for w in run.argv))
    click.echo(f"\n## per host (group {group})")
    for i, (name, sets, env) in enumerate(command.per_node):
        values = dict(s.split("=", 1) for s in sets)
        if run is not None:
            values |= dict(s.split("=", 1) for s in run.per_node[i][1])
        own = "".join(f"; export {k}={v}" for k, v in env.items())
        click.echo(f"{name}: {' '.join(f'{k}={v}' for k, v in values.items()) or '(nothing differs)'}{own}")


def _resolve_inventory(spec: str, as_json: bool, params: dict[str, object], full: bool = False) -> None:
    """Per host of an inventory: the env and `vllm serve` command with placeholders filled (secrets masked), and
    the container command the systemd unit runs. Nothing is contacted: the interface comes from ``k3_iface`` (the
    rollout reads it from each node's facts)."""
    import shlex

    from k3deploy.cli.common import read_cluster
    from k3deploy.errors import K3Error
    from k3deploy.model.diff import planned_exec
    from k3deploy.model.secrets import MASK, is_secret, mask_argv, mask_env
    from k3deploy.recipe.printing import format_exports
    from k3deploy.runtime.views import INVENTORY_ONLY

    given = [f"--{k.replace('_', '-')}" for k, v in params.items() if v not in (None, "default")]
    if given:
        raise K3Error(f"{', '.join(given)} cannot be combined with --inventory: the selection comes from the "
                      "inventory's group_vars (k3_hardware, k3_strategy, ...)")
    gathered = read_cluster("resolve", spec, view=INVENTORY_ONLY)
    r = gathered.require_rollout()
    first = gathered.target.resolved[gathered.target.records[0].name]
    for w in r.plan.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        echo_json({"endpoint": r.endpoint, "group_vars": first.files, "variables": first.listing(), "units": [
            {"host": u.host, "unit": u.unit, "role": u.node.role, "rank": u.rank, "group": u.group,
             "argv": mask_argv(u.node.argv), "env": mask_env(u.node.env),
             "container_argv": mask_argv(planned_exec(u) or [])}
            for u in r.units]})
        return
    plan = r.plan
    click.echo(f"# {plan.recipe}: {plan.model} on {plan.hardware}, {plan.strategy}, variant {plan.variant}, "
               f"{len({u.host for u in r.units})} host(s) of {spec}")
    click.echo(f"# image: {plan.image}")
    click.echo(f"# endpoint: {r.endpoint}")
    click.echo(f"# group_vars merged (lowest first): {', '.join(first.files) or 'none'}")
    for line in first.lines():
        click.echo(f"# {line}")
    if any("$IFACE_NAME" in " ".join([*u.node.argv, *u.node.env.values()]) for u in r.units):
        click.echo("# $IFACE_NAME: set k3_iface, or let the rollout read each node's interface from its facts")
    hidden = sorted({k for u in r.units for k in u.node.env if is_secret(k)})
    if hidden:
        click.echo(f"# {', '.join(hidden)}: secret, shown as {MASK} (the env file on each node holds the value)")
    groups: dict[str, list[UnitWork]] = {}
    for u in r.units:
        groups.setdefault(u.group, []).append(u)
    for group, units in groups.items():
        if full or len(units) <= COMPACT_ABOVE:
            for u in units:
                click.echo(f"\n## {u.host}: {u.node.role} (rank {u.rank}), {u.unit}")
                if u.node.env:
                    click.echo(format_exports(mask_env(u.node.env)))
                click.echo(shlex.join(mask_argv(u.node.argv)))
                container = planned_exec(u)
                if container:
                    click.echo(f"# as run by {u.unit}:")
                    click.echo(shlex.join(mask_argv(container)))
            continue
        _echo_units_compact(group, units)
