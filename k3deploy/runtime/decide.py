"""What a run does, decided once from what was read: whether it may go ahead at all where a lost member has no spare
(:func:`no_spare`), the groups that restart, the revision each records and the one it is marked with once it
serves, the groups whose marks are repaired, and the SLO gate. ``deploy/k3.py`` (through
:mod:`k3deploy.runtime.phases`) and ``k3deploy plan`` call the same :func:`no_spare` and :func:`decide`, so the
plan shows, and refuses, what the deploy does. Nothing here reads a host or changes anything: a :class:`Decided` is
a frozen value made from a :class:`~k3deploy.runtime.gather.Gathered` and the run's launcher.

Example::

    >>> gathered = gather("inventories/gb300.py", PLAN)                                    # doctest: +SKIP
    >>> launcher = launcher_for(gathered.require_rollout(), gathered.slurm_queue, hosts)    # doctest: +SKIP
    >>> decided = decide(gathered, launcher)                                               # doctest: +SKIP
    >>> decided.rollout.changed_groups, decided.numbers                                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version

from k3deploy.model import commands
from k3deploy.model.revisions import GroupHistory, revision_for, sha256
from k3deploy.model.rollout import Rollout, UnitWork
from k3deploy.model.slo import GatePlan, plan_gate
from k3deploy.runtime.gather import Gathered
from k3deploy.runtime.launchers import Launcher

#: variables that belong to one host or one run, not to what a group runs
PER_HOST = frozenset({"k3_ip", "k3_rollback", "k3_replica"})


@dataclass(frozen=True)
class Decided:
    """A run's decisions (:func:`decide`): the rollout with the groups that restart, per group the revision this
    run records (``numbers``, with its ``metas``) and the one marked current once it serves (``marks``), the groups
    whose nodes name different current revisions (``repairs``), the rollback's target revisions and the SLO gate."""

    rollout: Rollout
    numbers: Mapping[str, int]     # group -> the revision number this run records
    metas: Mapping[str, str]       # group -> that revision's meta.json
    marks: Mapping[str, int]       # group -> the revision marked current once it serves
    repairs: tuple[str, ...]       # groups whose nodes name different current revisions
    rollback_to: Mapping[str, int]   # group -> the revision a rollback restores
    gate: GatePlan | None          # the SLO gate of the restart (None: not gated)


@dataclass(frozen=True)
class NoSpare:
    """A run refused because a lost member has no spare to take its rank (:func:`no_spare`): each such member, one
    line each, and the line that refuses the run. The deploy and ``k3deploy plan`` refuse in these words.

    >>> refusal = NoSpare(("group engine: n2 (rank 1) is lost (unreachable: timed out) and no spare is left",),
    ...                   "no spare left for n2: nothing was changed (...)")
    >>> refusal.line()
    'group engine: n2 (rank 1) is lost (unreachable: timed out) and no spare is left; no spare left for n2: ...'
    """

    lines: tuple[str, ...]   # each lost member no spare replaces
    reason: str              # what the run does about it: nothing, and how to go on

    def line(self) -> str:
        """The refusal on one line (``k3deploy plan``'s error)."""
        return "; ".join((*self.lines, self.reason))


def no_spare(gathered: Gathered) -> NoSpare | None:
    """The refusal of a run in which a member is lost (unreachable, quarantined) and no spare takes its rank: decided
    from the spares' settlement before anything else (a lost member also fails the preflight, which this names
    better); None: every rank is held."""
    settled = gathered.spares
    if settled is None or not settled.unfilled:
        return None
    inventory = gathered.target.inventory or "INVENTORY"
    return NoSpare(tuple(u.line() for u in settled.unfilled),
                   f"no spare left for {', '.join(u.lost for u in settled.unfilled)}: nothing was changed (bring the "
                   "node back, add a host to the inventory's spares group, or release a quarantined one: k3deploy "
                   f"spares {inventory})")


def decide(gathered: Gathered, launcher: Launcher) -> Decided:
    """Decide the run from what ``gathered`` read: what restarts (the launcher's :meth:`changes`), and for the
    groups whose files change a new revision, numbered under the deployment lock (no other run records one of these
    groups until this one ends)."""
    rendered = gathered.require_rollout()
    r = rendered.decided(launcher.changes(rendered, gathered))
    # a group whose files change records a new revision (the launcher says which files those are)
    files = {g: launcher.revision_files(g) for g in r.changed_groups}
    changing = {g for g in r.changed_groups if launcher.new_revision(g, gathered.installed, _recorded(gathered, g))}
    numbers = {g: (gathered.history.get(g) or GroupHistory(g)).next_number() for g in changing
               if g not in gathered.rollback_to}
    metas = {g: _revision_meta(gathered, r, g, n, files[g]) for g, n in numbers.items()}
    marks = {g: n for g in r.changed_groups
             if (n := _serving_revision(gathered, g, numbers, files[g])) is not None}
    # a group whose nodes name different current revisions is marked again on every node: with the one this run
    # starts, else the one its files are
    repairs = tuple(g for g, h in gathered.history.items() if h.split and g in r.groups
                    and (g in marks or (g not in r.changed_groups and h.runs_now is not None)))
    for g in repairs:
        marks.setdefault(g, gathered.history[g].runs_now or 0)
    return Decided(rollout=r, numbers=numbers, metas=metas, marks=marks, repairs=repairs,
                   rollback_to=dict(gathered.rollback_to), gate=plan_gate(r, rollback=bool(gathered.rollback_to),
                                                                     gated=launcher.slo_gated))


def changed_files(gathered: Gathered, unit: UnitWork) -> list[tuple[str, str]]:
    """``(staged, live)`` of the files of ``unit`` this run changes (what the configure phase stages)."""
    have = gathered.installed.get((unit.host, unit.unit))
    cfg = gathered.require_rollout().vars.k3_config_dir
    return [(commands.staged_path(live, cfg), live) for live, text, sha in (
        (unit.unit_path, unit.unit_text, have.unit_sha if have else None),
        (unit.env_path, unit.env_text, have.env_sha if have else None)) if sha != sha256(text)]


def _recorded(gathered: Gathered, group: str) -> dict[str, str] | None:
    """What ``group``'s current revision records (``host:path -> sha256``; None: no current revision)."""
    h = gathered.history.get(group)
    rev = h.revisions.get(h.current) if h is not None and h.current is not None else None
    return rev.files if rev is not None else None


def _revision_meta(gathered: Gathered, rollout: Rollout, group: str, number: int, files: dict[str, str]) -> str:
    """The ``meta.json`` of revision ``number`` of ``group``: what runs, from which variables, by which version."""
    first = gathered.target.resolved[gathered.target.records[0].name]
    variables = {k: f"{item['value']!r} ({item['from']})" for k, item in first.listing().items()
                 if k.startswith("k3_") and k not in PER_HOST}
    rev = revision_for(rollout, group, number, created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       variables=variables, version=version("k3deploy"),
                       tag=(gathered.router_tag if group == "router" and rollout.vars.k3_router_image
                            else gathered.pinned_tag) or "", files=files)
    return rev.to_json()


def _serving_revision(gathered: Gathered, group: str, numbers: Mapping[str, int], files: dict[str, str]) -> int | None:
    """The revision a restarted group runs once it serves: the one it was rolled back to, the one this run records
    (``numbers``), or, when its files did not change, the recorded revision with exactly ``files`` (the launcher's
    :meth:`~k3deploy.runtime.launchers.Launcher.revision_files`; a run that was
    stopped after putting them in place left it unmarked); None: the current one already."""
    if group in gathered.rollback_to:
        return gathered.rollback_to[group]
    if group in numbers:
        return numbers[group]
    history = gathered.history.get(group)
    if history is None:
        return None
    same = [n for n, rev in history.revisions.items() if rev.files == files]
    return max(same) if same and max(same) != history.current else None
