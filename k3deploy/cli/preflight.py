"""``k3deploy preflight INVENTORY``: read every node, check it against the plan, report all nodes at once.

Exit codes: 0 every check passed (warnings allowed), 1 at least one check failed (an unreachable
node counts as failed), 2 bad input (unknown hardware, missing inventory, ...).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import click

from k3deploy.errors import K3Error

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def settings_lines(settings: Mapping[str, Any], extra_env: Mapping[str, str]) -> list[str]:
    """The settings derived per host as the lines each engine's env file gets (``NAME=value``, as written):
    ``k3_extra_env`` applied last, as the rollout applies it (:func:`k3deploy.model.rollout.engine_env`).

    >>> from k3deploy.preflight.settings import HostSettings
    >>> s = HostSettings("n1", {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_HCA": "=mlx5_0:1"})
    >>> title, line = settings_lines({"n1": s}, {"NCCL_IB_HCA": "mlx5_1"})
    >>> print(line)
      n1: NCCL_SOCKET_IFNAME==eth0 NCCL_IB_HCA=mlx5_1 (k3_extra_env; derived: =mlx5_0:1)
    """
    rows = [(h, s) for h, s in settings.items() if s.env]
    if not rows:
        return []
    out = ["Derived settings, as each engine's env file gets them (NAME=value; a value that starts with = is NCCL's "
           "exact-name match: NCCL_SOCKET_IFNAME==eth0 is the interface eth0, not eth0*):"]
    for host, s in rows:
        words = []
        for k, v in s.env.items():
            if k in extra_env and extra_env[k] != v:
                words.append(f"{k}={extra_env[k]} (k3_extra_env; derived: {v})")
            else:
                words.append(f"{k}={v}")
        extra = "  (nvidia_peermem required)" if s.peermem_required else ""
        out.append(f"  {host}: {' '.join(words)}{extra}")
    return out


def render_table(report: Any, extra_env: Mapping[str, str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 180)
    sel = report.requirements
    title = (f"Preflight: {sel.hardware.id} x {sel.nodes} node(s), variant {sel.variant}"
             + (f", strategy {sel.strategy}" if sel.strategy else ""))
    table = Table(title=title, show_lines=False, expand=False)
    for column, style in (("Host", "bold"), ("Check", ""), ("Status", ""), ("Observed", ""),
                          ("Required", "dim"), ("Fix", "")):
        table.add_column(column, style=style or None, overflow="fold")
    hosts = [f.host for f in report.hosts] + ["cluster"]
    first_group = True
    for host in hosts:
        rows = [r for r in report.results if r.host == host]
        if not rows:
            continue
        if not first_group:
            table.add_section()
        first_group = False
        for i, r in enumerate(rows):
            table.add_row(host if i == 0 else "", r.check, f"[{_STYLE[r.status]}]{r.status.upper()}[/]",
                          r.observed, r.required, r.fix)
    console.print(table)
    for line in settings_lines(report.settings, extra_env or {}):
        console.print(line, highlight=False, soft_wrap=True)
    counts = {"pass": 0, "warn": 0, "fail": 0}
    for r in report.results:
        counts[r.status] += 1
    failed = []
    for r in report.results:
        if r.status == "fail" and r.host not in failed:
            failed.append(r.host)
    verdict = "[bold green]ready[/]" if not failed else f"[bold red]failed: {', '.join(failed)}[/]"
    console.print(f"{len(report.hosts)} host(s), {len(report.results)} checks: {counts['pass']} passed, "
                  f"{counts['warn']} warnings, {counts['fail']} failed; {verdict}")


@click.command("preflight")
@click.argument("inventory")
@click.option("--hardware", help="hardware id (default: k3_hardware from the inventory's variables)")
@click.option("--strategy", help="serving strategy (default: k3_strategy from the inventory's variables)")
@click.option("--variant", help="recipe variant (default: k3_variant from the inventory's variables, else 'default')")
@click.option("--nodes", type=int, help="the node count you expect the inventory to plan (checked, exit 2 when it "
              "differs)")
@click.option("--cache-dir", help="where weights are cached on the nodes (default: k3_model_cache or "
              "/var/lib/k3deploy/cache)")
@click.option("--image-dir", help="where container images are stored (default: k3_image_dir, else Docker's "
              "DockerRootDir)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def preflight(inventory: str, hardware: str | None, strategy: str | None, variant: str | None,
              nodes: int | None, cache_dir: str | None, image_dir: str | None, as_json: bool) -> None:
    """Check every node of INVENTORY (a pyinfra inventory file, host list or @local) before deploying.

    Reads driver, GPUs, fabric, RDMA, container runtime, disk and /dev/shm on all nodes in parallel,
    changes nothing, and prints one table for the whole cluster. The options override the inventory's
    variables (a bare host list is read as the head followed by its workers). Exit 0: all passed; 1: a check
    failed; 2: bad input.
    """
    from k3deploy.cli.common import read_cluster
    from k3deploy.recipe.lint import echo_findings
    from k3deploy.runtime.views import PREFLIGHT

    overrides = {"k3_hardware": hardware.lower() if hardware else None, "k3_strategy": strategy,
                 "k3_variant": variant, "k3_model_cache": cache_dir, "k3_image_dir": image_dir}
    gathered = read_cluster("preflight", inventory, view=PREFLIGHT, overrides=overrides)
    report = gathered.preflight
    assert report is not None
    t = gathered.target
    if nodes is not None and nodes != t.requirements.nodes:
        raise K3Error(f"--nodes {nodes}: {inventory} plans {t.requirements.nodes} engine node(s); add or remove hosts "
                      "or drop --nodes")
    if t.plan is not None:
        echo_findings(t.recipe, t.plan, lambda line: click.echo(line, err=True))
    else:
        click.echo(f"warning: no plan for these hosts ({t.plan_error}); the hosts are checked against "
                   f"{t.requirements.hardware.id} x {t.requirements.nodes}", err=True)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        render_table(report, t.vars.k3_extra_env)
    if report.exit_code:
        sys.exit(report.exit_code)
