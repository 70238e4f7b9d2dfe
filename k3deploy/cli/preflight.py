"""``k3deploy preflight INVENTORY``: read every node, check it against the plan, report all nodes at once.

Exit codes: 0 every check passed (warnings allowed), 1 at least one check failed (an unreachable
node counts as failed), 2 bad input (unknown hardware, missing inventory, ...).
"""

from __future__ import annotations

import json
import sys
import textwrap
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


#: the widest the human output gets, whatever the terminal (narrower terminals get their own width)
WIDTH = 100


def folded_passes(results: list[Any], nodes: int) -> list[tuple[str, str, str]]:
    """The passed checks folded across hosts, one row per check in the order checks first appear: the check, where
    it passed (``on N nodes``, ``on N of M nodes`` where some did not pass, ``cluster``) and what it requires.

    >>> from k3deploy.preflight.base import CheckResult
    >>> rows = [CheckResult(h, "nvidia.driver", "pass", "580.95.05", ">= 580.65.06") for h in ("a", "b", "c")]
    >>> rows += [CheckResult("a", "gpu.count", "fail", "3", "4"), CheckResult("b", "gpu.count", "pass", "4", "4")]
    >>> rows += [CheckResult("cluster", "gpu.memory", "pass", "3330.6 GB", ">= 1680 GB")]
    >>> for row in folded_passes(rows, 3):
    ...     print(row)
    ('nvidia.driver', 'on 3 nodes', '>= 580.65.06')
    ('gpu.count', 'on 1 of 3 nodes', '4')
    ('gpu.memory', 'cluster', '>= 1680 GB')
    """
    by_check: dict[str, list[Any]] = {}
    for r in results:
        if r.status == "pass":
            by_check.setdefault(r.check, []).append(r)
    out = []
    for check, rows in by_check.items():
        hosts = {r.host for r in rows}
        if hosts == {"cluster"}:
            where = "cluster"
        else:
            where = f"on {len(hosts)} node{'s' if len(hosts) != 1 else ''}" if len(hosts) >= nodes else \
                f"on {len(hosts)} of {nodes} nodes"
        required = rows[0].required if len({r.required for r in rows}) == 1 else \
            "; ".join(dict.fromkeys(r.required for r in rows))
        out.append((check, where, required))
    return out


def folded_problems(problems: list[Any]) -> list[tuple[str, str, list[str], list[tuple[str, str]]]]:
    """The failures and warnings, in order, those that read the same on several hosts (the same check, observed,
    required and fix) once with their hosts: ``(status, check, hosts, [(label, text), ...])``.

    >>> from k3deploy.preflight.base import CheckResult
    >>> rows = [CheckResult(h, "disk.shm", "fail", "8 GiB", ">= 16 GiB", "grow /dev/shm") for h in ("a", "b")]
    >>> folded_problems(rows + [CheckResult("c", "disk.shm", "fail", "4 GiB", ">= 16 GiB")])[0]
    ('fail', 'disk.shm', ['a', 'b'], [('observed', '8 GiB'), ('required', '>= 16 GiB'), ('fix', 'grow /dev/shm')])
    """
    out: dict[tuple[str, str, str, str, str], list[str]] = {}
    for r in problems:
        out.setdefault((r.status, r.check, r.observed, r.required, r.fix), []).append(r.host)
    return [(status, check, hosts, [(label, text) for label, text in
                                     (("observed", observed), ("required", required), ("fix", fix)) if text])
            for (status, check, observed, required, fix), hosts in out.items()]


def folded_settings(settings: Mapping[str, Any], extra_env: Mapping[str, str]) -> list[str]:
    """:func:`settings_lines` with the hosts whose settings read the same on one line (``every node`` where all do).

    >>> from k3deploy.preflight.settings import HostSettings
    >>> same = {"NCCL_SOCKET_IFNAME": "=eth0"}
    >>> s = {h: HostSettings(h, same) for h in ("n1", "n2")}
    >>> s["n3"] = HostSettings("n3", {"NCCL_SOCKET_IFNAME": "=ib0"})
    >>> for line in folded_settings(s, {})[1:]:
    ...     print(line)
      n1, n2: NCCL_SOCKET_IFNAME==eth0
      n3: NCCL_SOCKET_IFNAME==ib0
    >>> folded_settings({h: HostSettings(h, same) for h in ("n1", "n2")}, {})[1]
    '  every node (2): NCCL_SOCKET_IFNAME==eth0'
    """
    lines = settings_lines(settings, extra_env)
    if not lines:
        return []
    hosts = [h for h, s in settings.items() if s.env]
    groups: dict[str, list[str]] = {}
    for host, line in zip(hosts, lines[1:], strict=True):
        groups.setdefault(line.split(": ", 1)[1], []).append(host)
    if len(groups) == 1 and len(hosts) == len(settings) and len(hosts) > 1:
        ((text, names),) = groups.items()
        return [lines[0], f"  every node ({len(names)}): {text}"]
    return [lines[0], *(f"  {', '.join(names)}: {text}" for text, names in groups.items())]


def render(report: Any, console: Any, extra_env: Mapping[str, str] | None = None, every_row: bool = False) -> None:
    """Print the report for people on ``console`` (rich): the failures and warnings first, each with its hosts, then
    what was observed, what is required and the fix on lines of their own (:func:`folded_problems`); then the
    passes, one line per check across the nodes (``every_row``: every host's rows instead); the derived settings;
    the verdict. Check names are never broken; other text wraps (problems) or is cut with an ellipsis (folded
    passes) to the console's width."""
    from rich.table import Table
    from rich.text import Text

    from k3deploy.preflight.checks import failed_hosts, summarize

    sel = report.requirements
    console.print(f"Preflight: {sel.hardware.id} x {sel.nodes} node(s), variant {sel.variant}"
                  + (f", strategy {sel.strategy}" if sel.strategy else ""), highlight=False)
    check_width = max((len(r.check) for r in report.results), default=5)
    order = {"fail": 0, "warn": 1}
    problems = sorted((r for r in report.results if r.status in order), key=lambda r: order[r.status])
    for status, check, hosts, rows in folded_problems(problems):
        console.print(f"[{_STYLE[status]}]{status.upper():<4}[/]  {check:<{check_width}}  ", end="", highlight=False)
        console.print(", ".join(hosts), highlight=False, markup=False)
        for label, text in rows:
            for part in textwrap.wrap(text, max(20, console.width - 16), break_on_hyphens=False) or [""]:
                console.print(f"      {label:<9} " + part, highlight=False, markup=False, soft_wrap=True)
                label = ""
    passes = Table(box=None, show_header=every_row, pad_edge=False, expand=False)
    passes.add_column("Status", no_wrap=True, min_width=4)
    passes.add_column("Check", no_wrap=True, min_width=check_width)
    if every_row:
        for column in ("Host", "Observed", "Required"):
            passes.add_column(column, overflow="fold")
        hosts = [f.host for f in report.hosts] + ["cluster"]
        for r in sorted((r for r in report.results if r.status == "pass"), key=lambda r: hosts.index(r.host)
                        if r.host in hosts else len(hosts)):
            passes.add_row(f"[{_STYLE['pass']}]PASS[/]", r.check, r.host, r.observed, r.required)
    else:
        folded = folded_passes(report.results, len(report.hosts))
        passes.add_column("Where", no_wrap=True, min_width=max((len(w) for _, w, _ in folded), default=5))
        passes.add_column("Required", overflow="ellipsis")
        for check, where, required in folded:
            passes.add_row(f"[{_STYLE['pass']}]PASS[/]", check, where,
                           Text(required, style="dim", no_wrap=True, overflow="ellipsis"))
    if passes.row_count:
        console.print(passes)
    settings = settings_lines if every_row else folded_settings
    for line in settings(report.settings, extra_env or {}):
        for part in textwrap.wrap(line, console.width, subsequent_indent="    ", break_on_hyphens=False,
                                  drop_whitespace=True) or [""]:
            console.print(part, highlight=False, markup=False, soft_wrap=True)
    counts = summarize(report.results)
    failed = failed_hosts(report.results)
    verdict = "[bold green]ready[/]" if not failed else f"[bold red]failed: {', '.join(failed)}[/]"
    console.print(f"{len(report.hosts)} host(s), {len(report.results)} checks: {counts['pass']} passed, "
                  f"{counts['warn']} warnings, {counts['fail']} failed; {verdict}"
                  + ("" if every_row else " (--all: every row)"))


def console_for_people() -> Any:
    """A rich console at most :data:`WIDTH` columns wide (a terminal's own width where narrower), colour on a
    terminal only."""
    from rich.console import Console

    width = Console().width if sys.stdout.isatty() else WIDTH
    return Console(width=min(width, WIDTH))


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
@click.option("--all", "every_row", is_flag=True, help="every host's every row (default: the failures and warnings, "
              "then one line per passed check across the nodes)")
def preflight(inventory: str, hardware: str | None, strategy: str | None, variant: str | None,
              nodes: int | None, cache_dir: str | None, image_dir: str | None, as_json: bool,
              every_row: bool) -> None:
    """Check every node of INVENTORY (a pyinfra inventory file, host list or @local) before deploying.

    Reads driver, GPUs, fabric, RDMA, container runtime, disk and /dev/shm on all nodes in parallel,
    changes nothing, and prints the whole cluster at once: the failures and warnings first, then one line per
    passed check across the nodes (--all: every host's rows). The options override the inventory's
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
        render(report, console_for_people(), t.vars.k3_extra_env, every_row)
    if report.exit_code:
        sys.exit(report.exit_code)
