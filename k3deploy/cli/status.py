"""``k3deploy status INVENTORY``: what runs where and whether it is healthy; per unit, per group and for the
cluster. Read-only: one command per host."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.model.images import shown
from k3deploy.model.startup import describe

if TYPE_CHECKING:
    from k3deploy.model.slurm import GroupJob
    from k3deploy.model.spares import Settled
    from k3deploy.model.status import ClusterStatus, NodeHealth
    from k3deploy.runtime.gather import Gathered


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 86400}d{s % 86400 // 3600}h" if s >= 86400 else f"{s // 3600}h{s % 3600 // 60:02d}m" \
        if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _image_cell(image: str | None, image_id: str | None) -> str:
    """The image a unit runs, for the table: as every command writes it (``REPO@sha256:DIGEST``, the registry's
    manifest digest, :func:`~k3deploy.model.images.shown`), cut to 12 hex digits as docker shows them, then
    ``local id`` (the id of the image on the host, ``docker images --no-trunc``).

    >>> print(_image_cell("vllm/vllm-openai@sha256:" + "a" * 64, "sha256:" + "b" * 64))
    vllm/vllm-openai@sha256:aaaaaaaaaaaa…
    local id sha256:bbbbbbbbbbbb
    """
    return "\n".join([shown(image, short=True) or "-"] + ([f"local id {image_id[:19]}"] if image_id else []))


def read_status(inventory: str) -> tuple[ClusterStatus, list[str], list[str], Settled | None]:
    """The status of the inventory's cluster, the deployment lock's holders (one line each), for each group in
    a crash loop the member whose engine keeps exiting with its last journal line (the logs are read, once more,
    only then), and who stands in for whom (the spares: :mod:`k3deploy.model.spares`)."""
    from k3deploy.model.status import crash_loops
    from k3deploy.runtime.views import STATUS, bundle

    gathered = read_cluster("status", inventory, view=STATUS)
    st = status_of(gathered)
    if any(u.verdict == "crash-loop" for g in st.groups for u in g.units):
        logs = read_cluster("status", inventory, view=bundle(CRASH_LOG_LINES)).logs
        return st, gathered.lock_lines(), crash_loops(st, logs), gathered.spares
    return st, gathered.lock_lines(), [], gathered.spares


#: the journal lines read of a unit in a crash loop (its last line of its own among them)
CRASH_LOG_LINES = 40


def status_of(gathered: Gathered) -> ClusterStatus:
    from k3deploy.model.status import assess
    from k3deploy.model.steps import served_model

    rollout = gathered.require_rollout()
    down = set(gathered.preflight.unreachable()) if gathered.preflight else set()
    down -= set(gathered.spares.out if gathered.spares is not None else {})   # replaced, or standing by: not ours
    st = assess(rollout, served_model(rollout), gathered.runs, gathered.installed, gathered.endpoint_models, down,
                time.time(), gathered.history, jobs=group_jobs_of(gathered))
    st.nodes = node_health(gathered)
    return st


def node_health(gathered: Gathered) -> list[NodeHealth]:
    """Each reachable host's hardware health and quarantine record, as its facts read them (the facts command of
    the status view reads them with the rest)."""
    from k3deploy.model.status import NodeHealth

    hosts = gathered.preflight.hosts if gathered.preflight else []
    return [NodeHealth(h.host, h.health, h.quarantined) for h in hosts if h.unreachable is None and h.health_read]


def group_jobs_of(gathered: Gathered) -> dict[str, GroupJob] | None:
    """``k3_launcher: slurm``: each group's job as the submit host's ``squeue`` shows it (None: systemd units).
    Raises :class:`K3Error` (one line, the fix) where the submit host is not set, not in the inventory, or its
    squeue failed."""
    from k3deploy.runtime.launchers import launcher_for

    return launcher_for(gathered.require_rollout()).group_jobs(
        [r.name for r in gathered.target.records], gathered.preflight.unreachable() if gathered.preflight else [],
        gathered.slurm_queue)


def show(st: ClusterStatus, console: Any) -> None:  # console: a rich Console
    from rich.markup import escape
    from rich.table import Column, Table

    colour = {"serving": "green", "running": "green", "degraded": "yellow", "starting": "yellow"}
    slurm = st.launcher == "slurm"
    for g in st.groups:
        job = f"; {g.job.shown()} ({g.job.name})" if g.job is not None else ""
        # under Slurm a unit is its job's step on that node: no systemd unit, restarts or uptime to show
        images = [_image_cell(u.image, u.image_id) for u in g.units]
        # the image cell whole (the other cells wrap first): its digest is what people compare across nodes
        image = Column("image", no_wrap=True, min_width=max((len(line) for c in images for line in c.splitlines()),
                                                            default=5))
        table = Table(*(("host", "job.step", "role") if slurm else ("host", "unit", "role", "state", "restarts", "up")),
                      image, "as planned", "/health", "/v1/models", "verdict",
                      title=f"group {g.name}: [{colour.get(g.verdict, 'red')}]{g.verdict}[/]{job}"
                      + {True: " (in the router)", False: " [red](not in the router)[/]", None: ""}[g.in_router],
                      title_justify="left")
        for u, cell in zip(g.units, images, strict=True):
            where = ((u.host, g.job.on(u.host) if g.job is not None else u.active, f"{u.role} {u.rank}") if slurm else
                     (u.host, u.unit, f"{u.role} {u.rank}", u.active,
                      "n/a" if u.restarts is None else str(u.restarts), _uptime(u.uptime_s)))
            table.add_row(*where, cell,
                          {True: "yes", False: "[red]no[/] (below)", None: "-"}[u.matches_plan],
                          "-" if u.health is None else str(u.health),
                          "-" if u.models is None else ", ".join(u.models) or "(none)",
                          f"[{colour.get(u.verdict, 'red')}]{u.verdict}[/]")
        console.print(table)
        for u in g.units:
            if u.why:
                console.print(f"{u.host} {u.unit}: as planned: no: {u.why}", highlight=False, soft_wrap=True)
        for u in g.units:
            if u.startup:
                console.print(f"{u.host} {u.unit}: last start: {describe(u.startup, u.compile_cache)}",
                              highlight=False, soft_wrap=True)
    if slurm:
        console.print("k3_launcher: slurm: each group runs as one Slurm job, each node's engine as one of its steps "
                      "(job.step: squeue --steps on k3_slurm_submit_host, JOBID.STEPID and the job's state; a job "
                      "gone from the queue is 'no job'); no systemd unit, restarts or uptime: a job restarts whole, "
                      "as a new job or requeued (docs/slurm.md)", highlight=False, soft_wrap=True)
    if any(u.image_id for g in st.groups for u in g.units):
        console.print("image: the build each unit runs, REPO@sha256:DIGEST (the registry's digest of the build it was "
                      "pinned to; status --json has it whole); local id: the image's id on that host (docker images "
                      "--no-trunc)", highlight=False, soft_wrap=True)
    sick = [n for n in st.nodes if not n.ok]
    if st.nodes and not sick:
        console.print(f"health: [green]ok[/] on every node ({len(st.nodes)}): no XID, ECC, row-remap or link event",
                      highlight=False)
    for n in sick:
        console.print(f"health: [{'red' if n.fatal or n.quarantined else 'yellow'}]{escape(n.line())}[/]",
                      highlight=False, soft_wrap=True)
    listed = "does not answer" if st.endpoint_models is None else "lists " + (", ".join(st.endpoint_models) or
                                                                               "no model")
    console.print(f"cluster: [{colour.get(st.verdict, 'red')}]{st.verdict}[/]; endpoint {st.endpoint} {listed}"
                  + (f"; unreachable: {', '.join(st.unreachable)}" if st.unreachable else ""))


@click.command("status")
@click.argument("inventory")
@json_option
@click.option("--watch", type=float, default=None, metavar="SECONDS",
              help="Show the status again every SECONDS until interrupted (Ctrl-C).")
def status(inventory: str, as_json: bool, watch: float | None) -> None:
    """Per host and unit: state, restarts, uptime, image, whether it runs the planned files, /health and
    /v1/models, and its last start phase by phase (seconds, from the engine's log); per group and for the cluster:
    serving, degraded or down, and the public endpoint; per node its hardware health (XID, ECC, row-remap, link
    events; a fatal one: must not serve) and its quarantine.

    Exit code: 0 serving, 1 degraded or down, 2 bad input.

    \b
    Example:
      k3deploy status inventories/gb300.py
      k3deploy status inventories/gb300.py --json | jq .verdict
    """
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    while True:
        st, lock, loops, spares = read_status(inventory)
        if as_json:
            echo_json({**st.to_dict(), "lock": lock, "crash_loops": loops,
                       "spares": spares.to_dict() if spares is not None else None})
        else:
            show(st, console)
            for line in loops:
                console.print(f"[red]{line}[/]", highlight=False, soft_wrap=True)
            for line in spares.lines() if spares is not None else []:
                console.print(f"spares: {line}", highlight=False, soft_wrap=True)
            for line in lock:
                console.print(f"[yellow]{line}[/]: a change is under way (or a run was killed: k3deploy unlock)")
        if watch is None:
            sys.exit(st.exit_code)
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            sys.exit(st.exit_code)
