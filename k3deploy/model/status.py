"""What runs where, and is it healthy: ``k3deploy status`` as a pure assessment of what the hosts report.

Per unit: its state, restarts, uptime, image, whether it runs what the plan says (its unit and env files are the
planned ones), and for a unit that serves HTTP its ``/health`` and ``/v1/models``. Per group and for the cluster a
verdict: **serving** (every member up, the endpoint lists the model), **degraded** (the endpoint still answers, but
a member is not up), **down** (it does not answer). Exit code: 0 serving, 1 degraded or down.

Example::

    >>> unit_verdict(active="active", serves=True, health=200, listed=True)
    'serving'
    >>> unit_verdict(active="active", serves=True, health=503, listed=False)
    'down'
    >>> unit_verdict(active="active", serves=False, health=None, listed=None)
    'running'
    >>> unit_verdict(active="activating", serves=True, health=None, listed=None, restarts=4)
    'crash-loop'
    >>> unit_verdict(active="failed", serves=False, health=None, listed=None, restarts=4)
    'down'
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from k3deploy.model import startup
from k3deploy.model.health import Health
from k3deploy.model.images import shown
from k3deploy.model.observed import Installed
from k3deploy.model.revisions import GroupHistory
from k3deploy.model.rollout import Rollout
from k3deploy.model.slurm import GroupJob, launch_path, launch_script
from k3deploy.model.variables import Variables

UP = ("serving", "running")
#: restarts by systemd after which a unit that is not up is said to be in a crash loop (its starts back off)
CRASH_LOOP = 3
#: a unit that serves no HTTP, restarted that often, is still in its crash loop while it runs less than this long
#: (the default of ``k3_crash_loop_window``)
CRASH_LOOP_UPTIME_S: int = Variables.model_fields["k3_crash_loop_window"].default


class Run(Protocol):
    """One unit as it runs (read-only: :class:`k3deploy.facts.status.UnitRun` is frozen)."""

    @property
    def active(self) -> str: ...
    @property
    def sub(self) -> str: ...
    @property
    def restarts(self) -> int: ...
    @property
    def since(self) -> float | None: ...
    @property
    def image(self) -> str | None: ...
    @property
    def image_id(self) -> str | None: ...
    @property
    def health(self) -> int | None: ...
    @property
    def models(self) -> tuple[str, ...] | None: ...
    @property
    def startup(self) -> tuple[str, ...]: ...


def unit_verdict(*, active: str, serves: bool, health: int | None, listed: bool | None, restarts: int = 0,
                 uptime_s: float | None = None, window_s: float = CRASH_LOOP_UPTIME_S) -> str:
    """serving | running (up, serves no HTTP) | starting | down | crash-loop (restarted :data:`CRASH_LOOP` times
    by systemd, being started again and not serving: starting, or running for less than ``window_s``
    (``k3_crash_loop_window``); each start waits longer, see ``k3_restart_max_delay``)."""
    verdict = _verdict(active=active, serves=serves, health=health, listed=listed)
    if restarts < CRASH_LOOP or verdict == "serving" or active not in ("active", "activating"):
        return verdict   # failed or inactive: systemd is not starting it again
    if verdict == "running" and (uptime_s is None or uptime_s >= window_s):
        return verdict
    return "crash-loop"


def _verdict(*, active: str, serves: bool, health: int | None, listed: bool | None) -> str:
    if active in ("activating", "reloading"):
        return "starting"
    if active != "active":
        return "down"
    if not serves:
        return "running"
    if health == 503:
        return "down"
    return "serving" if health == 200 and listed else "starting"


@dataclass(frozen=True)
class UnitReport:
    host: str
    unit: str
    group: str
    rank: int
    role: str
    verdict: str
    active: str                   # systemd's state (under Slurm: the group's job's, as squeue shows it)
    restarts: int | None          # by systemd (None under Slurm: a job restarts whole, it keeps no count)
    uptime_s: float | None
    image: str | None
    image_id: str | None
    matches_plan: bool | None     # None: the host did not answer
    url: str | None
    health: int | None
    models: list[str] | None
    why: str | None = None        # why it does not run as planned (matches_plan False), one line
    startup: dict[str, float] | None = None   # its last start, phase by phase (seconds; None: not read)
    compile_cache: str | None = None          # its last start's compile cache: hit, miss (None: not logged)


@dataclass
class GroupReport:
    name: str
    verdict: str
    units: list[UnitReport] = field(default_factory=list)
    in_router: bool | None = None   # a replica: whether the router sends it requests (None: no replicas/unknown)
    job: GroupJob | None = None     # k3_launcher: slurm: the group's job in the queue (None: systemd units)


@dataclass(frozen=True)
class NodeHealth:
    """One host's hardware health as its tools report it, and its quarantine record's reason (None: none).

    >>> from k3deploy.model.health import HealthEvent
    >>> sick = NodeHealth("n2", Health((HealthEvent("GPU 0", "xid", "79", "NVRM: Xid ...", True),)))
    >>> sick.line(), sick.fatal
    ('n2: XID 79 on GPU 0 (fallen off the bus): must not serve', True)
    >>> NodeHealth("n1", Health(), "XID 79 on GPU 0").line()
    'n1: ok; quarantined (XID 79 on GPU 0): runs nothing until released'
    """

    host: str
    health: Health = Health()
    quarantined: str | None = None

    @property
    def fatal(self) -> bool:
        return bool(self.health.fatal)

    @property
    def ok(self) -> bool:
        return not self.health.events and self.quarantined is None

    def line(self) -> str:
        out = f"{self.host}: {self.health.summary()}" + (": must not serve" if self.fatal else "")
        if self.quarantined is not None:
            out += f"; quarantined ({self.quarantined}): runs nothing until released"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "health": self.health.summary(), "fatal": self.fatal,
                "events": self.health.as_dicts(), "quarantined": self.quarantined}


@dataclass
class ClusterStatus:
    endpoint: str
    model: str
    endpoint_models: list[str] | None
    groups: list[GroupReport]
    unreachable: list[str]
    launcher: str = "systemd"       # k3_launcher: what starts the groups
    nodes: list[NodeHealth] = field(default_factory=list)   # each host's hardware health (read with its facts)

    @property
    def verdict(self) -> str:
        if not self.endpoint_models or self.model not in self.endpoint_models:
            return "down"
        whole = all(g.verdict == "serving" and g.in_router is not False for g in self.groups)
        return "serving" if whole and not self.unreachable else "degraded"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "serving" else 1

    def to_dict(self) -> dict[str, Any]:
        groups: list[dict[str, Any]] = [{"name": g.name, "verdict": g.verdict, "in_router": g.in_router,
                                         "units": [asdict(u) for u in g.units]} for g in self.groups]
        out: dict[str, Any] = {"verdict": self.verdict, "endpoint": self.endpoint, "model": self.model,
                               "endpoint_models": self.endpoint_models, "unreachable": self.unreachable,
                               "groups": groups}
        if self.nodes:
            out["nodes"] = [n.to_dict() for n in self.nodes]
        if self.launcher != "systemd":   # the systemd output stays as it was
            out["launcher"] = self.launcher
            for g, d in zip(self.groups, groups, strict=True):
                d["job"] = None if g.job is None else {**asdict(g.job), "shown": g.job.shown()}
        return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def not_planned_why(unit: Any, have: Installed, history: GroupHistory | None, unit_path: str | None = None) -> str:
    """Why ``unit`` (a rendered unit) does not run its planned files: a recorded revision it runs (after a rollback,
    the variables asking for newer settings), files missing, or files that differ from the plan. ``unit_path``:
    the unit's file where it is not its systemd unit (under Slurm its launch script).

    >>> from k3deploy.model.revisions import Revision
    >>> class U: host, unit_path, env_path = "n1", "/etc/u.service", "/etc/u.env"
    >>> rev = Revision("engine", 1, "t", "img", "s", files={"n1:/etc/u.service": "a", "n1:/etc/u.env": "b"})
    >>> h = GroupHistory("engine", {1: rev, 2: Revision("engine", 2, "t", "img", "s")}, current=1, marked={1, 2})
    >>> not_planned_why(U(), Installed(unit_sha="a", env_sha="b"), h)  # doctest: +ELLIPSIS
    'runs revision 1, rolled back from 2: the variables ask for other settings (k3deploy plan INVENTORY ...'
    """
    what = "unit" if unit_path is None else "launch script"
    path = unit.unit_path if unit_path is None else unit_path
    if have.unit_sha is None or have.env_sha is None:
        return f"its {what} or env file is missing: a deploy installs it (k3deploy plan INVENTORY shows it)"
    numbers = sorted(history.revisions, reverse=True) if history else []
    for n in sorted(numbers, key=lambda n: n != (history.current if history else None)):   # the current first
        assert history is not None
        files = history.revisions[n].files
        if (files.get(f"{unit.host}:{path}"), files.get(f"{unit.host}:{unit.env_path}")) == \
                (have.unit_sha, have.env_sha):
            newest = history.newest_served
            back = f", rolled back from {newest}" if newest is not None and newest > n else ""
            return (f"runs revision {n}{back}: the variables ask for other settings (k3deploy plan INVENTORY "
                    "shows them; a deploy applies them, or set the variables back)")
    return (f"its {what} or env file differs from the plan (the variables changed since the deploy, or a file was "
            "edited on the host): k3deploy plan INVENTORY shows how")


def crash_loops(st: ClusterStatus, logs: Mapping[tuple[str, str], Mapping[str, str]]) -> list[str]:
    """One line per group in a crash loop: the member whose engine keeps exiting (the most restarts) and the last
    line its process wrote to the journal (``logs``: per (host, unit) its ``journal`` and ``container`` tail).

    >>> u = UnitReport("n2", "k3-engine", "engine", 1, "worker", "crash-loop", "activating", 5, None, None, None,
    ...                False, None, None, None)
    >>> st = ClusterStatus("http://x", "m", None, [GroupReport("engine", "down", [u])], [])
    >>> crash_loops(st, {("n2", "k3-engine"): {"journal": "t n2 docker[9]: ValueError: bad\\n"
    ...                                                   "t n2 systemd[1]: k3-engine.service: Failed\\n"}})
    ... # doctest: +NORMALIZE_WHITESPACE
    ["group engine: n2's engine keeps exiting (k3-engine, restarted 5 times); its last journal line:
      't n2 docker[9]: ValueError: bad' (more: journalctl -u k3-engine on n2, or k3deploy bundle INVENTORY)"]
    """
    out = []
    for g in st.groups:
        looping = [u for u in g.units if u.verdict == "crash-loop"]
        if not looping:
            continue
        worst = max(looping, key=lambda u: u.restarts or 0)
        text = logs.get((worst.host, worst.unit), {})
        lines = [x for x in text.get("journal", "").splitlines() if x.strip()]
        own = [x for x in lines if " systemd[" not in x] or [x for x in text.get("container", "").splitlines()
                                                              if x.strip()] or lines
        last = f"; its last journal line: {own[-1].strip()[:300]!r}" if own else ""
        out.append(f"group {g.name}: {worst.host}'s {worst.role if worst.role != 'worker' else 'engine'} keeps "
                   f"exiting ({worst.unit}, restarted {worst.restarts} times){last} (more: journalctl -u "
                   f"{worst.unit} on {worst.host}, or k3deploy bundle INVENTORY)")
    return out


def _started(run: Run, headless: bool) -> tuple[dict[str, float] | None, str | None]:
    """A unit's last start as :class:`UnitReport` carries it: its phases (None: nothing logged) and compile cache."""
    s = startup.parse(run.startup, headless=headless)
    return (s.seconds if s.phases else None), s.compile_cache


def assess(rollout: Rollout, model: str, runs: Mapping[tuple[str, str], Run],
           installed: Mapping[tuple[str, str], Installed], endpoint_models: tuple[str, ...] | None,
           unreachable: set[str], now: float, history: Mapping[str, GroupHistory] | None = None,
           jobs: Mapping[str, GroupJob] | None = None) -> ClusterStatus:
    """The status of every unit, group and the cluster from what the hosts reported (``runs``: per (host, unit));
    ``history``: each group's revisions, to say why a unit does not run as planned. ``jobs`` (``k3_launcher:
    slurm``): each group's job in the queue, which stands for its units' systemd state (:attr:`GroupJob.active`),
    and a unit runs as planned when its launch script and env file are the planned ones."""
    groups = []
    for name in rollout.groups:
        reports = []
        job = jobs.get(name) if jobs is not None else None
        for u in rollout.group(name):
            run = runs.get((u.host, u.unit))
            if u.host in unreachable or run is None:
                reports.append(UnitReport(u.host, u.unit, u.group, u.rank, u.node.role, "unreachable", "unknown",
                                          None if jobs is not None else 0, None, None, None, None, u.serves, None,
                                          None))
                continue
            have = installed.get((u.host, u.unit), Installed())
            own = launch_path(rollout, u) if jobs is not None else None
            matches = have.unit_sha == _sha(launch_script(rollout, u) if own else u.unit_text) and \
                have.env_sha == _sha(u.env_text)
            listed = None if run.models is None else model in run.models
            why = None if matches else not_planned_why(u, have, (history or {}).get(u.group), own)
            if jobs is not None:
                active = job.active if job is not None else "inactive"
                reports.append(UnitReport(
                    u.host, u.unit, u.group, u.rank, u.node.role,
                    unit_verdict(active=active, serves=u.serves is not None, health=run.health, listed=listed),
                    job.shown() if job is not None else "no job", None, None, shown(run.image), run.image_id,
                    matches, u.serves, run.health, list(run.models) if run.models is not None else None, why,
                    *_started(run, u.serves is None)))
                continue
            reports.append(UnitReport(
                u.host, u.unit, u.group, u.rank, u.node.role,
                unit_verdict(active=run.active, serves=u.serves is not None, health=run.health, listed=listed,
                             restarts=run.restarts, uptime_s=now - run.since if run.since else None,
                             window_s=rollout.vars.k3_crash_loop_window),
                run.active if run.active != "active" or not run.sub else f"{run.active}/{run.sub}", run.restarts,
                round(now - run.since, 1) if run.since else None, shown(run.image), run.image_id, matches, u.serves,
                run.health, list(run.models) if run.models is not None else None, why,
                *_started(run, u.serves is None)))
        serving = [x for x in reports if x.url and x.verdict == "serving"]
        if all(x.verdict in UP for x in reports):
            verdict = "serving"
        elif serving:
            verdict = "degraded"
        else:
            verdict = "down"
        groups.append(GroupReport(name, verdict, reports, rollout.in_router(name), job))
    at_endpoint = list(endpoint_models) if endpoint_models is not None else None
    return ClusterStatus(rollout.endpoint, model, at_endpoint, groups, sorted(unreachable),
                         "systemd" if jobs is None else "slurm")
