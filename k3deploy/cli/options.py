"""``k3deploy options``: what a recipe offers."""

from __future__ import annotations

import click

from k3deploy.cli.common import echo_json, json_option, recipe_option


@click.command()
@click.option("--hardware", "-H", metavar="ID", default=None, help="Only this hardware id.")
@click.option("--variant", "-v", metavar="ID", default=None, help="Only this variant.")
@recipe_option
@json_option
def options(hardware: str | None, variant: str | None, recipe_path: str | None, as_json: bool) -> None:
    """List hardware per variant, strategies per hardware (GPU floor, node count), recommendations, features."""
    from k3deploy import load_recipe
    from k3deploy.recipe.offering import offering

    data = offering(load_recipe(recipe_path), hardware_id=hardware, variant=variant)
    if as_json:
        echo_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    console.print(f"[bold]{data['recipe']}[/bold] ({data['model']}), default hardware: {data['default_hardware']}")
    vt = Table("variant", "model", "precision", "needs (GB)", "hardware", title="Variants")
    for vk, v in data["variants"].items():
        vt.add_row(vk, v["model"], str(v["precision"]), f"{v['vram_minimum_gb'] or '-'}", ", ".join(v["hardware"]))
    console.print(vt)
    st = Table("hardware", "GPUs/node", "strategy", "min GPUs", "nodes", "recommended", title="Strategies per hardware")
    for hw_id, entry in data["hardware"].items():
        recs = {r["strategy"] for r in entry["recommended"].values()}
        for row in entry["strategies"]:
            nodes = (f"P{row['prefill_nodes']}+D{row['decode_nodes']}" if row["deploy_type"] == "pd_cluster"
                     else str(row["nodes"]))
            pools = row.get("min_gpus_per_pool")
            floor = f"{pools['prefill']}+{pools['decode']} (per pool)" if pools else str(row["min_gpus"])
            st.add_row(hw_id, str(entry["gpus_per_node"]), row["strategy"], floor, nodes,
                       "yes" if row["strategy"] in recs else "")
    console.print(st)
    ft = Table("feature", "default", "opt-in", "strategies", title="Features")
    for f in data["features"]:
        ft.add_row(f["name"], "on" if f["default"] else "off", "yes" if f["opt_in"] else "",
                   ", ".join(f["strategies"]) if f["strategies"] else "all")
    console.print(ft)
