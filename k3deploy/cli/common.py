"""Click options shared by several commands, defined once and composed (``@selection_options``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import click

from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.runtime.gather import Gathered
    from k3deploy.runtime.views import View


def _features(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [f.strip() for f in value.split(",") if f.strip()]


recipe_option = click.option(
    "--recipe", "recipe_path", metavar="PATH", default=None,
    help="Recipe YAML of the vLLM recipes schema (default: the vendored Kimi-K3 recipe).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for automation.")


def selection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--hardware/--strategy/--variant/--features/--nodes/--prefill-nodes/--decode-nodes/--image/--recipe."""
    decorators = [
        click.option("--hardware", "-H", metavar="ID", help="Hardware id, e.g. gb300, b300, h200, mi355x."),
        click.option("--strategy", "-s", metavar="ID", default=None,
                     help="Serving strategy (default: the recipe's recommendation for the hardware)."),
        click.option("--variant", "-v", metavar="ID", default="default", show_default=True, help="Recipe variant."),
        click.option("--features", "-f", metavar="A,B", default=None, callback=_features,
                     help="Exactly these features, comma-separated ('' for none; default: the recipe's default set)."),
        click.option("--nodes", "-n", type=int, default=None,
                     help="Node count (default: the count the recipes site picks)."),
        click.option("--prefill-nodes", type=int, default=None, help="pd_cluster: nodes in the prefill pool."),
        click.option("--decode-nodes", type=int, default=None, help="pd_cluster: nodes in the decode pool."),
        click.option("--image", metavar="REF", default=None,
                     help="Image override: REPO:TAG, REPO@sha256:..., :TAG or @sha256:<digest>."),
        recipe_option,
    ]
    for d in reversed(decorators):
        f = d(f)
    return f


def selection_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The resolve() keyword arguments out of the composed options."""
    if not params.get("hardware"):
        raise K3Error("missing --hardware: choose a hardware id (k3deploy options lists them)")
    return {k: params[k] for k in ("hardware", "strategy", "variant", "features", "nodes", "prefill_nodes",
                                   "decode_nodes", "image")}


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def read_cluster(command: str, inventory: str, view: View, overrides: Mapping[str, Any] | None = None) -> Gathered:
    """``k3deploy.runtime.gather.gather(inventory, view, overrides)`` for a command: bad input stays one line, and
    any other failure becomes one line naming the command (never a traceback)."""
    from k3deploy.runtime.gather import gather

    try:
        gathered = gather(inventory, view, overrides)
    except K3Error:
        raise
    except Exception as exc:  # never a traceback for the user
        raise K3Error(f"{command} could not run: {type(exc).__name__}: {exc}") from None
    rollout = getattr(gathered, "rollout", None)
    if rollout is not None:   # a command that reads the systemd units only says so instead of a wrong answer
        from k3deploy.runtime.launchers import launcher_for

        launcher = launcher_for(rollout)
        if command in launcher.refuses:
            raise K3Error(f"k3_launcher: {launcher.name}: k3deploy {command} "
                          f"{launcher.refuses[command].format(inventory=inventory)}")
    return gathered
