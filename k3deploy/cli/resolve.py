"""``k3deploy resolve``: print the per-node commands of a selection."""

from __future__ import annotations

import click

from k3deploy.cli.common import echo_json, json_option, selection_kwargs, selection_options


@click.command()
@selection_options
@click.option("--inventory", "inventory", metavar="FILE", default=None,
              help="Resolve the selection of this pyinfra inventory (and its group_vars) and print each host's "
                   "commands with the placeholders filled in.")
@json_option
def resolve(recipe_path: str | None, as_json: bool, inventory: str | None = None, **params: object) -> None:
    """Resolve a selection into per-node `vllm serve` commands, env and docker run forms.

    \b
    Examples:
      k3deploy resolve --hardware b300
      k3deploy resolve --hardware gb300 --strategy multi_node_tp --nodes 2 --json
      k3deploy resolve --hardware b300 --strategy pd_cluster --prefill-nodes 1 --decode-nodes 2
      k3deploy resolve --inventory inventories/gb300.py
    """
    if inventory is not None:
        _resolve_inventory(inventory, as_json, params)
        return
    from k3deploy import load_recipe
    from k3deploy import resolve as do_resolve
    from k3deploy.recipe.printing import format_exports

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
    for node in plan.nodes:
        title = f"{node.role} (rank {node.rank})" if node.role != "router" else "router"
        click.echo(f"\n## {title}" + (f", port {node.port}" if node.port and node.serves_http else ", headless"))
        if node.env:
            click.echo(format_exports(node.env))
        click.echo(node.command)
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


# ------------------------------------------------------------------------------------ --inventory


def _resolve_inventory(spec: str, as_json: bool, params: dict[str, object]) -> None:
    """Per host of an inventory: the env and `vllm serve` command with placeholders filled (secrets masked), and
    the container command the systemd unit runs. Nothing is contacted: the interface comes from ``k3_iface`` (the
    rollout reads it from each node's facts)."""
    import shlex

    from k3deploy.cli.common import read_cluster
    from k3deploy.errors import K3Error
    from k3deploy.model.diff import exec_start
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
             "container_argv": mask_argv(exec_start(u.unit_text) or [])}
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
    for u in r.units:
        click.echo(f"\n## {u.host}: {u.node.role} (rank {u.rank}), {u.unit}")
        if u.node.env:
            click.echo(format_exports(mask_env(u.node.env)))
        click.echo(shlex.join(mask_argv(u.node.argv)))
        container = exec_start(u.unit_text)
        if container:
            click.echo(f"# as run by {u.unit}:")
            click.echo(shlex.join(mask_argv(container)))
