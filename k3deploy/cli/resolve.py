"""``k3deploy resolve``: print the per-node commands of a selection."""

from __future__ import annotations

import click

from k3deploy.cli.common import echo_json, json_option, selection_kwargs, selection_options


@click.command()
@selection_options
@json_option
def resolve(recipe_path: str | None, as_json: bool, **params: object) -> None:
    """Resolve a selection into per-node `vllm serve` commands, env and docker run forms.

    \b
    Examples:
      k3deploy resolve --hardware b300
      k3deploy resolve --hardware gb300 --strategy multi_node_tp --nodes 2 --json
      k3deploy resolve --hardware b300 --strategy pd_cluster --prefill-nodes 1 --decode-nodes 2
    """
    from k3deploy import load_recipe
    from k3deploy import resolve as do_resolve
    from k3deploy.render import format_exports

    plan = do_resolve(load_recipe(recipe_path), **selection_kwargs(params))
    for w in plan.warnings:
        click.echo(f"warning: {w}", err=True)
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
    click.echo("\n# docker run forms")
    for node in engines:
        click.echo(f"\n## {node.role} (rank {node.rank})")
        click.echo(plan.docker_command(node))
