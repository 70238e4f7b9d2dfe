"""``k3deploy plan INVENTORY``: what a rollout would change, read from the hosts without changing them.

Exit codes (like ``terraform plan -detailed-exitcode``): 0 no changes, 2 bad input or an error (unreachable
host, a failing preflight check, a weights source that lacks part of its checkpoint), 3 changes pending.

The rollout is computed exactly as ``deploy/k3.py`` computes it (inventory -> variables -> plan -> preflight
facts -> derived settings -> rendered files), and what restarts, the revisions and the SLO gate are decided by the
deploy's own :func:`k3deploy.runtime.decide.decide`; then the rollout is compared with the installed unit and env
files and unit states.

Example::

    k3deploy plan inventories/gb300.py --json | jq .restart_order
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING

import click

from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.model.diff import PlanReport
    from k3deploy.runtime.decide import Decided
    from k3deploy.runtime.gather import Gathered
    from k3deploy.runtime.launchers import Launcher

EXIT_CHANGES = 3


@click.command("plan")
@click.argument("inventory")
@click.option("--rollback", "rollback", metavar="previous|N", default=None,
              help="Preview a rollback: to each group's previous revision, or to revision N (k3deploy history).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(inventory: str, rollback: str | None, as_json: bool) -> int:
    """Show what `pyinfra INVENTORY deploy/k3.py` would change, without changing anything.

    Per host: role and rank, image now -> planned, the container argv diff (one flag per line), the env
    diff (secrets masked), other unit-file changes, and which services restart in which order.

    \b
    Exit codes: 0 no changes, 2 bad input or error, 3 changes pending.
    Examples:
      k3deploy plan inventories/gb300.py
      k3deploy plan inventories/gb300.py --json | jq .restart_order
    """
    from k3deploy.cli.common import read_cluster
    from k3deploy.model import correctness
    from k3deploy.runtime.decide import decide, no_spare
    from k3deploy.runtime.gather import require_reachable
    from k3deploy.runtime.launchers import launcher_for
    from k3deploy.runtime.views import PLAN

    wanted: bool | int | None = None
    if rollback is not None:
        if rollback != "previous" and not rollback.isdigit():
            raise K3Error(f"--rollback {rollback}: use 'previous' or a revision number (k3deploy history {inventory})")
        wanted = True if rollback == "previous" else int(rollback)
    gathered = read_cluster("plan", inventory, view=PLAN, overrides={"k3_rollback": wanted})
    unfilled = no_spare(gathered)   # the deploy's own refusal, in its words
    if unfilled is not None:
        raise K3Error(unfilled.line())
    require_reachable(gathered)
    launcher = launcher_for(gathered.require_rollout(), gathered.slurm_queue,
                            [r.name for r in gathered.target.records])
    decided = decide(gathered, launcher)
    rollout = decided.rollout
    # before the notes: what still has to be staged is a change too
    staged = dataclasses.replace(plan_report(gathered, launcher, decided), staging=staging_lines(gathered))
    gate = decided.gate
    failures = ({h: [f.line() for f in fs] for h, fs in gathered.preflight.failures_by_host().items()}
                if gathered.preflight else {})
    probe = [correctness.plan_line()] if rollout.vars.k3_correctness_probe and staged.has_changes else []
    report = dataclasses.replace(staged, gate=(gate.lines() if gate is not None and staged.has_changes else []) + probe,
                                 notes=[
        *staged.notes, *(f"preflight fails on {host}: {'; '.join(rows)}" for host, rows in failures.items()),
        *(f"warning: {w}" for w in rollout.plan.warnings),   # as the deploy logs them
        *revision_notes(gathered, staged.has_changes), *image_notes(gathered), *spare_notes(gathered),
        *(f"{line}: a deploy now would be refused (wait for it; if that run is gone: k3deploy unlock {inventory} "
          f"--run ID)" for line in gathered.lock_lines())])
    t = gathered.target
    first = t.resolved[t.records[0].name]
    if as_json:
        data = report.to_dict()
        data["preflight_failures"] = failures
        data["lock"] = gathered.lock_lines()
        data["slo_gate"] = gate.to_json() if gate is not None and report.has_changes else None
        data["group_vars"], data["variables"] = first.files, first.listing()
        res = gathered.resolution
        data["image"] = {"image": rollout.plan.image, "tag": res.image if res else None,
                         "digest": res.digest if res else None, "resolved_on": res.host if res else None}
        data["spares"] = gathered.spares.to_dict() if gathered.spares is not None else None
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(f"Variables (group_vars merged, lowest first: {', '.join(first.files) or 'none'}):")
        for line in first.lines():
            click.echo(f"  {line}")
        click.echo(launcher.plan_text(report, rollout), nl=False)
    refused = source_refusals(gathered)
    for line in refused:
        click.echo(f"error: {line}", err=True)
    if refused:
        sys.exit(2)
    if failures:
        click.echo("error: preflight fails on " + ", ".join(sorted(failures))
                   + ": the rollout would stop before changing anything; fix the nodes (k3deploy preflight "
                   f"{inventory}) and rerun", err=True)
        sys.exit(2)
    # a split current marker or a record a deploy writes again is a repair the deploy makes: not converged
    repairs = any(h.split or any(h.rebuildable(n, host) for n, where in h.corrupt.items() for host in where)
                  for h in gathered.history.values())
    return 3 if report.exit_code == 0 and repairs else report.exit_code


def plan_report(gathered: Gathered, launcher: Launcher | None = None, decided: Decided | None = None) -> PlanReport:
    """The plan's report, decided as the deploy decides it (``launcher``: :func:`k3deploy.runtime.launchers.
    launcher_for`, from the queue a submit host read; the groups that restart: ``decided``,
    :func:`k3deploy.runtime.decide.decide`), as the launcher reports it (:meth:`~k3deploy.runtime.launchers.Launcher.
    plan`: each unit's unit and env file changes and its restart, or each group's job, kept, submitted or replaced,
    and each unit's launch script and env file changes). Raises :class:`K3Error` where a queue cannot be read."""
    from k3deploy.runtime.decide import decide
    from k3deploy.runtime.launchers import launcher_for

    if launcher is None:
        launcher = launcher_for(gathered.require_rollout(), gathered.slurm_queue,
                                [r.name for r in gathered.target.records])
    rollout = (decided or decide(gathered, launcher)).rollout
    return launcher.plan(rollout, gathered)


def staging_lines(gathered: Gathered) -> list[str]:
    """What the stage still has to bring, and why, per host (empty when every engine node holds both)."""
    from k3deploy.model.staging import summary

    sp = gathered.stage
    if sp is None or not (sp.takes_part or sp.image.require or sp.weights.require):
        return []
    lines = summary(sp)
    for host, status in gathered.weights.items():
        if not status.verified:
            lines.append(f"{host}: weights {status.describe()}")
    lines += [f"{line}: a deploy now is refused" for line in source_refusals(gathered)]
    return lines


def source_refusals(gathered: Gathered) -> list[str]:
    """The lines that refuse a deploy whose stage would copy from an incomplete source on the control machine (the
    weights source, the image archive)."""
    from k3deploy.runtime.gather import refused_stage

    return [line for line in refused_stage(gathered) if not line.startswith(" ")]


def spare_notes(gathered: Gathered) -> list[str]:
    """Who stands in for whom: each substitution in effect (a new one: the deploy makes it, restarting the group),
    each lost member no spare replaces, each host that runs nothing, the spares standing by."""
    return [f"spares: {line}" for line in gathered.spares.lines()] if gathered.spares is not None else []


def image_notes(gathered: Gathered) -> list[str]:
    """The build the rollout pins: the digest the registry gives for the image's tag now."""
    res, router = gathered.resolution, gathered.router_resolution
    out = [] if res is None or res.digest is None else [
        f"image {res.image} is {res.digest} in the registry (asked from {res.host}): every node runs {res.pinned}"]
    if router is not None and router.digest is not None:
        out.append(f"router image {router.image} is {router.digest} in the registry (asked from {router.host}): "
                   f"the router runs {router.pinned}")
    return out


def revision_notes(gathered: Gathered, changes: bool = True) -> list[str]:
    """What the plan means for each group's revisions: a rollback previewed, or a group running an older
    revision than the newest it served: the variables ask for the newer settings (``changes``: the plan has
    changes), or they were set back and describe what runs (no changes)."""
    notes = []
    for group, h in gathered.history.items():
        if h.split:
            notes.append(h.split_line())
        for n, where in sorted(h.corrupt.items()):
            for host, path in where.items():
                notes.append(f"group {group}: the record of revision {n} on {host} is corrupt ({path}); "
                             + ("a deploy writes it again from the other nodes' record" if h.rebuildable(n, host)
                                else "it cannot be written again (its files there differ from the record): "
                                     "not restorable"))
        if group in gathered.rollback_to:
            asked = gathered.target.vars.k3_rollback   # written as the docs write it: true (previous) or N
            value = "true" if asked is True else gathered.rollback_to[group]
            notes.append(f"group {group}: a rollback from revision {h.current} to revision "
                         f"{gathered.rollback_to[group]} (pyinfra INVENTORY deploy/k3.py -y --data "
                         f"k3_rollback={value} applies it)")
        elif h.current is not None and h.newest_served is not None and h.current < h.newest_served and not changes:
            notes.append(f"group {group} runs revision {h.current}, rolled back from {h.newest_served}; the "
                         "variables describe it, so a deploy keeps it")
        elif h.current is not None and h.newest_served is not None and h.current < h.newest_served:
            notes.append(f"group {group} runs revision {h.current}, rolled back from {h.newest_served}: the "
                         "variables still ask for the newer settings, so the changes above take it forward again")
    return notes
