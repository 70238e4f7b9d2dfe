"""The phases of ``deploy/k3.py`` as pyinfra ``@deploy`` functions, and the context of the run they share.

The context is built once per run (first host to ask; the others wait for it) by the one pipeline,
:func:`k3deploy.runtime.gather.gather_in_run`: inventory -> variables -> plan -> preflight facts and checks ->
derived host settings -> rendered units and env files -> installed state and revisions -> which groups restart.
The phases render the rollout's steps (:mod:`k3deploy.model.steps`, the same steps the runbook prints) as
operations: the stage's steps and the restart's actions (:func:`k3deploy.model.steps.restart`, whatever starts the
groups) each from one call site, told apart by their place in the list (``pyinfra_internals.operation_kind``), so
pyinfra's cross-host ordering follows the list (pyinfra orders ops by call site, not by host), and each only on the
hosts it has something to do on (a barrier on every host): a tray pays the control machine for its own steps, not
for every step of the rollout.
A host's files are written in one command (:func:`~k3deploy.runtime.operations.write_files`).

Nothing is half-applied: a bad inventory, a failing preflight check or an engine flag the pinned engine refuses
stops the run while it is being prepared (``--dry`` included), with every reason printed once and a non-zero exit.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from typing import Any, Protocol

import gevent.event
import gevent.lock
from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_state, host
from pyinfra.operations import python

from k3deploy.errors import K3Error
from k3deploy.facts import batch
from k3deploy.model import commands, steps
from k3deploy.model.inventory import SPARES
from k3deploy.model.pipeline import Target
from k3deploy.model.revisions import GroupHistory, sha256
from k3deploy.model.rollout import Rollout, UnitWork
from k3deploy.model.slo import GatePlan
from k3deploy.model.stagecopies import Copied, copies
from k3deploy.model.staging import StagePlan, summary
from k3deploy.model.staging import engines as stage_engines
from k3deploy.model.steps import RouterCall, Step
from k3deploy.model.units import GROUP_MEMBER
from k3deploy.preflight.across import preflight_count
from k3deploy.preflight.checks import CLUSTER
from k3deploy.runtime import interrupts, pyinfra_internals
from k3deploy.runtime import slo as slo_gate
from k3deploy.runtime.command import inventory_argument, shown_command
from k3deploy.runtime.connections import connector_drift
from k3deploy.runtime.decide import Decided, changed_files, decide, no_spare
from k3deploy.runtime.gather import Gathered, gather_in_run, refused_stage
from k3deploy.runtime.launchers import Launcher, Systemd, launcher_for
from k3deploy.runtime.lock import Lock, LockHeld, this_run
from k3deploy.runtime.operations import (
    STOPPED,
    Written,
    directories,
    drifted,
    keepalived,
    script,
    smoke,
    stage_step,
    start_units,
    stop_units,
    vip_held,
    write_files,
)
from k3deploy.runtime.readiness import Failure, wait_group
from k3deploy.runtime.slo import Outcome

pyinfra_internals.install()  # pyinfra's op identities, without reading every frame's source (see the module)
_lock = gevent.lock.RLock()
#: each pyinfra run's context (:func:`context`), built by the first host that asks
_contexts: weakref.WeakKeyDictionary[State, RunContext] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Refused:
    """The rollout cannot go ahead; nothing was changed (the reasons are printed once, while the run prepares)."""

    message: str
    exit_code: int


@dataclass
class RunState:
    """What the run finds out as it goes, the only thing of the run that changes: each restarted group's readiness
    result, the router calls of a roll, which restart steps went ahead, the SLO gate's findings, the jobs it
    submitted."""

    gates: dict[str, gevent.event.AsyncResult] = field(default_factory=dict)   # group -> its readiness result
    router_calls: dict[RouterCall, bool] = field(default_factory=dict)   # a call of a roll -> it succeeded
    begun: dict[int, bool] = field(default_factory=dict)   # step of the restart -> it went ahead (see :meth:`begins`)
    outcomes: dict[str, Outcome] = field(default_factory=dict)   # group -> what the SLO gate found
    reverted: set[str] = field(default_factory=set)   # groups the gate took back to their previous revision
    submitted: dict[str, str] = field(default_factory=dict)   # group -> the id of the job this run submitted


@dataclass(frozen=True)
class RunContext:
    """The run the phases share: what was read (``gathered``), what was decided from it (``decided``: the rollout
    that restarts what changed, the revisions, the gate), what starts the groups, the lock, and the run's state."""

    gathered: Gathered | None   # the inventory as the deploy read it, and its rollout rendered
    decided: Decided | None = None
    refusal: Refused | None = None
    state: State | None = None
    lock: Lock | None = None
    chosen: Launcher | None = None   # what starts the groups (k3_launcher), chosen once (None: its systemd units)
    run: RunState = field(default_factory=RunState)

    @property
    def rollout(self) -> Rollout:
        assert self.decided is not None
        return self.decided.rollout

    @property
    def gate(self) -> GatePlan | None:
        """The SLO gate of this run's restart (None: not gated, or no run)."""
        return self.decided.gate if self.decided is not None else None

    @cached_property
    def launcher(self) -> Launcher:
        """What starts the groups (:func:`k3deploy.runtime.launchers.launcher_for`)."""
        chosen: Launcher = self.chosen if self.chosen is not None else Systemd(self.rollout)
        return chosen

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @cached_property
    def rollout_steps(self) -> steps.RolloutSteps:
        """Every step of the run, in order (:func:`k3deploy.model.steps.rollout`), built once from what the facts
        saw (the images each host holds, an rsync daemon an earlier run left) and the run's decisions
        (:meth:`decisions`); a configure step for every host of the inventory."""
        gathered = self.gathered
        assert gathered is not None
        r = self.rollout
        leftover = {f.host for f in gathered.facts if getattr(f.stage_peers, "running", False)}
        hosts = [h.name for h in self.state.inventory] if self.state is not None else r.hosts
        return steps.rollout(r, self.launcher.start_steps, gathered.stage or steps.fresh(r), self.decisions(),
                             hosts=hosts, tag=gathered.pinned_tag, images=gathered.images, leftover=leftover,
                             router_tag=gathered.router_tag, router_images=gathered.router_images)

    @cached_property
    def stage_steps(self) -> dict[str, list[Step]]:
        """host -> its steps of the stage."""
        out: dict[str, list[Step]] = {}
        for step in self.rollout_steps.stage:
            out.setdefault(step.host, []).append(step)
        return out

    @cached_property
    def spare_writes(self) -> dict[str, list[Written]]:
        """host -> the spare records the run writes there: the substitutions in effect (where the host's copy
        differs, and only once there are any), the fence record (who holds each rank: where the host's copy
        differs), its new quarantine."""
        from k3deploy.model.spares import (
            FENCE_FILE,
            QUARANTINE_FILE,
            SUBSTITUTIONS_FILE,
            Fence,
            fence_for,
            substitutions_text,
        )

        gathered = self.gathered
        assert gathered is not None
        settled = gathered.spares
        if settled is None:
            return {}
        cfg = self.rollout.vars.k3_config_dir.rstrip("/")
        text = substitutions_text(settled.substitutions)
        out: dict[str, list[Written]] = {}
        for name, reading in gathered.readings.items():
            have = reading.spare_files.substitutions if reading.spare_files is not None else None
            if (settled.substitutions or have is not None) and have != text:
                out.setdefault(name, []).append(Written(f"{cfg}/{SUBSTITUTIONS_FILE}", text, "644",
                                                        seen=(sha256(have) if have is not None else None, have)))
        fences = {name: r.spare_files.fence if r.spare_files is not None else None
                  for name, r in gathered.readings.items()}
        fence = fence_for(self.rollout, [Fence.from_text(t) for t in fences.values()],
                          int(datetime.now(UTC).timestamp())).text()
        for name, have in fences.items():
            if have != fence:
                out.setdefault(name, []).append(Written(f"{cfg}/{FENCE_FILE}", fence, "644",
                                                        seen=(sha256(have) if have is not None else None, have)))
        for name, q in gathered.quarantine.items():
            out.setdefault(name, []).append(Written(f"{cfg}/{QUARANTINE_FILE}", q.to_json(), "644"))
        return out

    @cached_property
    def stage_plan(self) -> StagePlan:
        """The stage's plan, as its steps were made from it (:attr:`rollout_steps`)."""
        plan = self.gathered.stage if self.gathered is not None else None
        return plan or steps.fresh(self.rollout)

    def stage_copies(self, step: Step) -> tuple[Copied, ...]:
        """What a stage step copies onto its host, shown while it runs (:mod:`k3deploy.model.stagecopies`)."""
        return copies(self.rollout, self.stage_plan, step)

    @cached_property
    def stage_kinds(self) -> set[steps.StageKind]:
        """The kinds of stage step that apply on some host (the others are no operation)."""
        return {step.kind for mine in self.stage_steps.values() for step in mine
                if step.applies and step.kind is not None}

    @cached_property
    def summary_host(self) -> str:
        """The host that calls every operation of the stage (see :func:`stage_phase`): the first engine host."""
        hosts = stage_engines(self.rollout) or self.rollout.hosts
        return hosts[0]

    @cached_property
    def actions(self) -> list[steps.Action]:
        """Every operation of the start phase (:func:`k3deploy.model.steps.restart`)."""
        return list(self.rollout_steps.start)

    def decisions(self) -> steps.Decisions:
        """What the restart's steps are built with: the revision numbers and marks, the files that move, the units
        read as stopped, the records cut short a host writes again, the SLO gate."""
        gathered, made = self.gathered, self.decided
        assert gathered is not None and made is not None
        r = made.rollout
        rebuild = {}
        for h in r.hosts:
            mine = []
            for group in sorted({u.group for u in r.on_host(h)}):
                hist = gathered.history.get(group) or GroupHistory(group)
                mine += [(group, n, hist.revisions[n].to_json()) for n in sorted(hist.corrupt)
                         if hist.rebuildable(n, h)]
            if mine:
                rebuild[h] = tuple(mine)
        return steps.Decisions(
            numbers=made.numbers, metas=made.metas, marks=made.marks, repairs=tuple(made.repairs),
            changes={(u.host, u.unit): tuple(changed_files(gathered, u)) for u in r.units},
            stopped=frozenset((u.host, u.unit) for u in r.units
                              if (have := gathered.installed.get((u.host, u.unit))) is not None
                              and have.active in STOPPED),
            rebuild=rebuild, gate=self.gate, gate_host=_gate_host(self))

    def holds(self, conditions: Sequence[steps.Condition]) -> Callable[[], bool]:
        """An ``_if`` that holds when every one of ``conditions`` does, evaluated in order when the operation runs."""
        checks: list[Callable[[], bool]] = []
        for c in conditions:
            if isinstance(c, steps.Serves):
                checks.append(partial(self.step_ok, list(c.groups), list(c.calls)))
            elif isinstance(c, steps.Begins):
                checks.append(partial(self.begins, c.wave, list(c.groups)))
            elif isinstance(c, steps.Keeps):
                checks.append(partial(self.keeps, c.group))
            elif isinstance(c, steps.Intact):
                checks.append(partial(self.intact, [c.group]))
            else:
                checks.append(self.missed)
        return checks[0] if len(checks) == 1 else partial(_all, checks)

    def step_ok(self, groups: list[str], calls: list[RouterCall]) -> bool:
        """Every one of ``groups`` serves and every one of the router ``calls`` succeeded (and the run was not
        interrupted: no step of the restart starts after that, :mod:`k3deploy.runtime.interrupts`)."""
        return not interrupts.stopped() and self.all_serve(groups) and all(self.run.router_calls.get(c) for c in calls)

    def all_serve(self, groups: list[str]) -> bool:
        """Every one of ``groups`` serves (see :meth:`serves`)."""
        return all(self.serves(g) for g in groups)

    def serves(self, group: str) -> bool:
        """The group was not restarted, or it came back serving (False while its gate has not finished)."""
        if group not in self.rollout.changed_groups:
            return True
        result = self.run.gates.get(group)
        return result is not None and result.ready() and result.get() is None

    def keeps(self, group: str) -> bool:
        """The group serves what this run started it with (the SLO gate did not take it back)."""
        return self.serves(group) and group not in self.run.reverted

    def missed(self) -> bool:
        """A group missed the SLO gate in this run."""
        return any(not o.ok for o in self.run.outcomes.values())

    def failed_members(self, groups: list[str]) -> list[str]:
        """The hosts of these groups that failed an earlier step of this run (pyinfra dropped them)."""
        failed = {h.name for h in getattr(self.state, "failed_hosts", ())}
        return sorted({u.host for g in groups for u in self.rollout.group(g) if u.host in failed})

    def intact(self, groups: list[str]) -> bool:
        """No host of these groups failed an earlier step (and the run was not interrupted): the groups may be
        configured."""
        return not interrupts.stopped() and not self.failed_members(groups)

    def state_lines(self) -> list[str]:
        """Each group's state as far as this run knows it (for an interrupted run): untouched and on which
        revision, held back, restarting (stopped for the change, not serving yet), serving the change, or stopped by
        a failed gate; then the command that converges them."""
        if self.gathered is None or self.decided is None:
            return ["nothing was changed on any node (the run had not started its rollout)"]
        r, history = self.rollout, self.gathered.history
        step_of = {g: i for i, wave in enumerate(r.waves()) for g in wave}
        out = []
        for g in r.groups:
            cur = history[g].current if g in history else None
            was = f"revision {cur}" if cur is not None else "what it ran before (no recorded revision)"
            new = f"revision {self.decided.numbers[g]}" if g in self.decided.numbers else "its files"
            result = self.run.gates.get(g)
            failure = result.get() if result is not None and result.ready() else None
            if g not in r.changed_groups:
                out.append(f"group {g}: untouched by this run, runs {was}")
            elif not self.run.begun.get(step_of.get(g, -1)):
                out.append(f"group {g}: untouched, runs {was} (nothing of it was stopped; files this run staged "
                           f"are in {r.vars.k3_config_dir.rstrip('/')}/next/, where nothing runs them)")
            elif result is not None and result.ready() and failure is None:
                out.append(f"group {g}: serves {new}, this run's change")
            elif failure is not None:
                out.append(f"group {g}: stopped: {failure.unit.node.role} rank {failure.unit.rank} on {failure.host} "
                           "failed its readiness gate (above)")
            else:
                out.append(f"group {g}: restarting, not serving: its units were stopped for the change and may be "
                           f"starting {new}")
        command = shown_command()
        out.append(f"to converge every group: {command} (it takes the lock, and restarts and gates each group that "
                   "does not serve the planned revision)")
        return out

    def begins(self, step: int, groups: list[str]) -> bool:
        """Whether restart step ``step`` (of ``groups``) goes ahead, decided once, when its first operation runs:
        only when no member of its groups failed an earlier step (the stage, the configure phase, a gate). A
        group held back keeps running what it ran (its recorded revision); the reason is said once."""
        begun = self.run.begun
        with _lock:
            missed = [o.group for o in self.run.outcomes.values() if not o.ok]
            if step not in begun and missed and self.gate is not None and self.gate.kind == "canary":
                begun[step] = False
                logger.error(f"--> k3deploy: the roll stops here: the canary {', '.join(missed)} missed the SLO "
                             f"gate (its figures are above, and again at the end); {', '.join(groups)} "
                             f"keep{'s' if len(groups) == 1 else ''} running the previous revision")
            if step not in begun:
                down = self.failed_members(groups)
                begun[step] = not down
                if down:
                    history = self.gathered.history if self.gathered is not None else {}
                    runs = ", ".join(f"{g} keeps running " + (f"revision {history[g].current}"
                                                             if g in history and history[g].current is not None
                                                             else "what it ran")
                                     for g in groups)
                    logger.error(f"--> k3deploy: the change of {', '.join(groups)} stops here: "
                                 f"{', '.join(down)} failed an earlier step of this run (its error is above); no "
                                 f"member of the group was restarted or given new files: {runs}. Fix the cause and "
                                 "run again")
            return begun[step]


def context() -> RunContext:
    """The run's shared context (computed by the first host that asks)."""
    state: State = ctx_state.get()  # type: ignore[no-untyped-call]
    with _lock:
        if state not in _contexts:
            _contexts[state] = _build(state)
            pyinfra_internals.settle_heap()
        return _contexts[state]


def _refuse(lines: list[str], summary: str, exit_code: int, lock: Lock | None = None) -> RunContext:
    """Print the reasons once (every host shares the context) and refuse the run (giving the lock back)."""
    for line in lines:
        logger.error(line)
    logger.error(f"--> k3deploy: {summary}")
    if lock is not None:
        lock.release()
    return RunContext(None, refusal=Refused(summary, exit_code))


def dry_run(argv: list[str] | None = None) -> bool:
    """This ``pyinfra`` run changes nothing: ``--dry``, or ``--json`` without ``-y`` (pyinfra prints the changes and
    exits; its state does not say so).

    >>> dry_run(["pyinfra", "inv.py", "deploy/k3.py", "--dry"]), dry_run(["pyinfra", "inv.py", "deploy/k3.py", "-y"])
    (True, False)
    """
    args = sys.argv[1:] if argv is None else argv[1:]
    yes = any(a in ("-y", "--yes") or (a.startswith("-") and not a.startswith("--") and "y" in a) for a in args)
    return "--dry" in args or ("--json" in args and not yes)


def _take_lock(state: State, spec: str | None, target: Target, holder: list[Lock]) -> Lock | None:
    """Before any host is read (so before the revision numbers are chosen): the deployment lock
    (:mod:`k3deploy.runtime.lock`) on the first host; on the others the command that reads them takes it first
    (:func:`~k3deploy.runtime.gather.gather_in_run`). ``--dry`` takes none and names a held one."""
    # hosts whose facts are read one at a time answer scripted outputs (a test's): nothing there to lock
    hosts = {h.name: h for h in state.inventory if h.connected and not batch.one_at_a_time(h)}
    dirs = {n: target.host_vars(n).k3_config_dir for n in hosts}
    if dry_run() or not hosts:
        return None
    lease = target.host_vars(next(iter(hosts))).k3_lock_lease
    lock = Lock(state, hosts, dirs, this_run(spec or "INVENTORY", lease))
    holder.append(lock)
    lock.take_first()
    return lock


def _lock_taken(lock: Lock) -> None:
    for note in lock.notes:
        logger.warning(f"k3deploy: {note}")
    logger.info(f"--> k3deploy: deployment lock taken on {len(lock.taken)} host(s) (run {lock.record.run})")


def _build(state: State) -> RunContext:
    """Read the hosts, refuse what may not go ahead, decide the run (:func:`~k3deploy.runtime.decide.decide`) and
    say what it does."""
    spec = inventory_argument()
    held: list[Lock] = []

    def state_now() -> list[str]:
        ctx = _contexts.get(state)
        return ctx.state_lines() if ctx is not None else ["nothing was changed on any node (the run was still "
                                                            "reading the hosts)"]

    interrupts.install(state_now, lambda: held[0].release() if held else None)
    try:
        gathered = gather_in_run(state, spec, before_read=partial(_take_lock, state, spec, holder=held))
    except K3Error as exc:
        return _refuse([], str(exc) if isinstance(exc, LockHeld) else f"{exc}; nothing was changed", exc.exit_code,
                       held[0] if held else None)
    lock = held[0] if held else None
    if lock is not None:
        _lock_taken(lock)
    if dry_run():
        for line in gathered.lock_lines():
            logger.warning(f"k3deploy: {line}: a run now would be refused")
    # the plan's warnings (k3_extra_args ones name their file) before the preflight's verdict: they hold either way
    for w in gathered.target.plan.warnings if gathered.target.plan is not None else []:
        logger.warning(f"k3deploy: {w}")
    report = gathered.preflight
    assert report is not None
    unfilled = no_spare(gathered)
    if unfilled is not None:
        return _refuse([f"k3deploy: {line}" for line in unfilled.lines], unfilled.reason, 1, lock)
    _spares_said(state, gathered)
    failing = report.failures_by_host()
    if failing:
        nodes = sorted(h for h in failing if h != CLUSTER)
        where = ", ".join(nodes) + (" and for the cluster as a whole" if CLUSTER in failing else "")
        lines = [f"k3deploy: preflight failed on {where}; nothing was changed on any node:"]
        for h, fs in failing.items():
            lines += [f"  [{h}] {f.line()}" for f in fs]
        return _refuse(lines, "preflight failed: nothing was changed (the reasons are above; k3deploy preflight "
                              "INVENTORY shows every check)", 1, lock)
    r = gathered.require_rollout()
    refused = refused_stage(gathered)
    if refused:
        return _refuse([line if line.startswith(" ") else f"k3deploy: {line}" for line in refused],
                       "the stage's source on the control machine is incomplete: nothing was copied to any node (the "
                       "reason is above)", 2, lock)
    try:
        launcher = launcher_for(r, gathered.slurm_queue, [h.name for h in state.inventory])
    except K3Error as exc:
        return _refuse([], f"{exc}; nothing was changed", exc.exit_code, lock)
    for line in connector_drift(state, gathered.target):
        logger.warning(f"k3deploy: {line}")
    logger.info(f"--> k3deploy: preflight passed on {len(report.hosts)} host(s), {preflight_count(report.results)}; "
                f"plan {r.plan.hardware} x {len(r.hosts)}, {r.plan.strategy}, image {r.plan.image}")
    res = gathered.resolution
    if res is not None and gathered.pinned_tag is not None:
        logger.info(f"--> k3deploy: image {res.image} is {res.digest} in the registry (asked from {res.host}): "
                    "every node runs that build")
    routed = gathered.router_resolution
    if routed is not None and gathered.router_tag is not None:
        logger.info(f"--> k3deploy: router image {routed.image} is {routed.digest} in the registry (asked from "
                    f"{routed.host}): the router runs that build")
    for line in summary(gathered.stage) if gathered.stage is not None else []:
        logger.info(f"--> k3deploy: stage {line}")
    decided = decide(gathered, launcher)
    r = decided.rollout
    for group, number in decided.rollback_to.items():
        current = gathered.history[group].current if group in gathered.history else None
        if group not in r.changed_groups:
            continue   # it runs that revision already
        logger.info(f"--> k3deploy: rollback of group {group} from revision {current} to revision {number}")
    for g in decided.repairs:
        logger.warning(f"k3deploy: {gathered.history[g].split_line()}")
    for g, hist in gathered.history.items():
        for n, paths in sorted(hist.corrupt.items()):
            for name, path in paths.items():
                fix = ("it is written again from the other nodes' record (its files there hash to it)"
                       if hist.rebuildable(n, name) else "it cannot be written again here (no other node keeps a whole "
                       "record, or its files there differ from it): revision " + str(n) + " is not restorable")
                logger.warning(f"k3deploy: group {g}: the record of revision {n} on {name} is corrupt ({path}, cut "
                               f"short or unreadable); {fix}")
    gate = decided.gate
    if gate is not None:
        logger.info(f"--> k3deploy: SLO gate ({'a canary' if gate.kind == 'canary' else 'the group'}): "
                    + "; ".join(gate.lines()))
    return RunContext(gathered, decided, state=state, lock=lock, chosen=launcher)


def _spares_said(state: State, gathered: Gathered) -> None:
    """Say once what the spares change in this run: each new substitution and quarantine, each host that runs
    nothing. A lost member that pyinfra could not connect to, and that a spare replaces, is no failure of the run:
    it leaves pyinfra's failed hosts (its 'Could not connect' above stays; docs/spares.md)."""
    settled = gathered.spares
    if settled is None:
        return
    for sub in settled.new:
        logger.warning(f"k3deploy: {sub.spare} takes {sub.lost}'s place: rank {sub.rank} of group {sub.group} "
                       f"({sub.why}); recorded on the nodes (substitutions.json), the inventory file is left as it is")
    for name, q in gathered.quarantine.items():
        logger.warning(f"k3deploy: {name} is quarantined ({q.reason}): it runs nothing until k3deploy spares "
                       f"INVENTORY --release {name}")
    for name, why in settled.out.items():
        if name not in gathered.quarantine:
            logger.info(f"--> k3deploy: {name} runs nothing: {why}")
    failed = getattr(state, "failed_hosts", None)
    if isinstance(failed, set):
        # a lost member a spare replaces, and a spare that cannot be reached (powered off): they run nothing
        spares = {r.name for r in settled.records if SPARES in r.groups}
        for h in [h for h in failed if h.name in settled.out and (h.name in settled.lost or h.name in spares)]:
            failed.discard(h)


# ------------------------------------------------------------------------------------------------ phases


class Phase(Protocol):
    """A phase of the deploy (a pyinfra deploy function): called with the run's context."""

    def __call__(self, *, ctx: RunContext) -> object: ...


def roll_out(ctx: RunContext) -> None:
    """The rollout after the preflight: each phase of :data:`PHASES` in the order of
    :data:`k3deploy.model.steps.ORDER` (the runbook's sections follow the same tuple)."""
    for part in steps.ORDER:
        PHASES[part](ctx=ctx)



@deploy("Preflight")
def preflight_phase(ctx: RunContext) -> None:
    if ctx.refusal is not None:
        raise SystemExit(ctx.refusal.exit_code)  # pyinfra would print any other exception with a traceback
    host.noop("every check passed on every host")


@deploy("Stage")
def stage_phase(ctx: RunContext) -> None:
    """This host's steps of the stage (:func:`k3deploy.model.steps.stage`), one operation per step kind, called
    where the step applies: a step kind runs on every host at once, in the order of the kinds (an operation's
    identity is its kind, not its place in a host's list). The first engine host calls every kind that applies on
    some host, doing nothing where it has nothing to do: pyinfra orders operations by each host's own sequence first,
    so one host's sequence of all of them keeps the kinds in order. A kind that applies nowhere is no operation at all
    (each operation costs the control machine a little for every host of the inventory, even those it skips)."""
    me = host.name
    for step in ctx.stage_steps.get(me, []):
        if step.kind is not None and (step.applies or (me == ctx.summary_host and step.kind in ctx.stage_kinds)):
            with pyinfra_internals.operation_kind(host, step.kind.order):
                stage_step(name=step.name, step=step, copies=ctx.stage_copies(step))


@deploy("Configure")
def configure_phase(ctx: RunContext) -> None:
    """The spares' records (:func:`_spare_records`), then this host's configure step, the launcher's
    (:meth:`k3deploy.model.steps.StartSteps.configure`): its directories, then its files in one operation (one
    command): the files written in place (the engine units' helper, the units that answer its fence record, or a
    Slurm job's files) and each staged unit's next env file (0600) and systemd unit (:func:`_staged`)."""
    _spare_records(ctx)
    rollout, gathered = ctx.rollout, ctx.gathered
    assert gathered is not None
    me = host.name
    step = ctx.rollout_steps.configure_of(me)
    if step is None:
        return
    if step.dirs:
        directories(name=step.dirs_name, paths=list(step.dirs), owner=step.owner, owned=step.owned,
                    opened=step.opened)
    files = [Written(f.dest, f.content, f.mode, f.kind,
                     seen=(gathered.helpers.get(me), None) if f.dest == GROUP_MEMBER and me in gathered.helpers
                     else None, when=ctx.holds(f.when) if f.when else None, spec=f.spec, owner=f.owner,
                     read=gathered.files.get((me, f.dest)))
             for f in step.files]
    files += _staged(ctx, [u for u in rollout.on_host(me) if u.unit in step.staged])
    # (on every host, even where nothing is written: pyinfra orders operations by their depth in each host's own
    # sequence first, so every host's sequence keeps the same steps at the same depths)
    write_files(name=step.name, files=files,
                restore=drifted(rollout.on_host(me), gathered.installed) if step.restore else ())


def _spare_records(ctx: RunContext) -> None:
    """The spares' records on this host (:mod:`k3deploy.model.spares`), where something changes in the deployment
    (nothing is called otherwise): the substitutions in effect (every host the run reaches keeps them), a new
    quarantine; then a host that runs nothing has its units stopped and disabled (called on every host, so that
    every host's sequence keeps the same operations at the same depths)."""
    gathered = ctx.gathered
    assert gathered is not None
    writes = ctx.spare_writes
    if not writes and not gathered.stand_down:
        return
    me = host.name
    write_files(name="Spare records: substitutions, quarantine", files=writes.get(me, []))
    if gathered.stand_down:
        units = gathered.stand_down.get(me, [])
        script(name="Stand down: the units of a node that runs nothing, stopped and disabled",
               text=commands.stand_down(units) if units else "", active=bool(units))


def _staged(ctx: RunContext, units: list[UnitWork], when: Callable[[], bool] | None = None) -> list[Written]:
    """The next env file (0600) and systemd unit of each of ``units`` (on this host), where they differ from the
    live ones: written beside them (:func:`commands.staged_path`), never over them. The restart step records them
    as the group's revision and puts them in place (:func:`_swap`), so a run that stops before then (killed, a
    member that failed) leaves every node running, and healing restarting, a recorded revision. Only when no host
    of the unit's group failed an earlier step (and ``when`` holds)."""
    gathered = ctx.gathered
    assert gathered is not None
    out = []
    for unit in units:
        have = gathered.installed.get((unit.host, unit.unit))
        ok = partial(_all, [ctx.holds((steps.Intact(unit.group),)), *([when] if when else [])])
        env, unit_file = steps.unit_files(ctx.rollout, unit, staged=True)
        out += [Written(env.dest, env.content, env.mode, env.kind, seen=(have.env_sha, have.env_text) if have else None,
                        live=unit.env_path, when=ok, spec=env.spec),
                Written(unit_file.dest, unit_file.content, unit_file.mode, unit_file.kind,
                        seen=(have.unit_sha, have.unit_text) if have else None, live=unit.unit_path, when=ok,
                        spec=unit_file.spec)]
    return out


def _all(conditions: list[Callable[[], bool]]) -> bool:
    return all(c() for c in conditions)


@deploy("Start")
def start_phase(ctx: RunContext) -> None:
    """The restart's operations (:func:`k3deploy.model.steps.restart`, whatever starts the groups), each called on
    the hosts it has something to do on (its units, its rendezvous, the router's host), so a tray pays for its own
    part only, and a barrier on every host; pyinfra runs each operation on all its hosts at once, in the order of
    the list."""
    r = ctx.rollout
    if not r.waves() and not r.missing_from_router():
        host.noop(ctx.launcher.start_steps.idle)
    actions = ctx.actions
    # the deployment lock is given back with this host's last mark (nothing runs on it after that but the smoke
    # test, on the first unit's host, which gives it back as the connection closes)
    marks = [i for i, a in enumerate(actions) if a.kind == "current" and (p := a.on(host.name)) is not None
             and p.script]
    for index, action in enumerate(actions):
        part = action.on(host.name)
        if part is None and not action.barrier:
            continue
        op, kwargs = _operation(ctx, action, part, marks[-1] == index if marks else False)
        with pyinfra_internals.operation_kind(host, index):
            op(name=action.name, **kwargs)


def _operation(ctx: RunContext, action: steps.Action, part: steps.Part | None,
               last_mark: bool) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The pyinfra operation that runs ``action`` on this host (``part``: what it does here; None: a barrier with
    nothing to do here) and its arguments."""
    r = ctx.rollout
    kind = action.kind
    when = ctx.holds([*action.when, *(part.when if part is not None else ())]) if action.when else None
    here = part is not None
    text = part.script if part is not None else ""
    limit = {"_timeout": action.timeout} if action.timeout is not None else {}
    if kind in ("out", "in"):
        assert action.call is not None and when is not None
        return python.call, {"function": _router_call, "ctx": ctx, "key": action.call,
                             "text": text, "_if": partial(_both, here, when)}
    if kind in ("slo", "verdict"):
        assert when is not None
        return python.call, {"function": _slo_gate if kind == "slo" else _slo_verdict, "ctx": ctx,
                             "_if": partial(_both, here, when)}
    assert part is not None or kind == "current"
    if kind == "stage":
        assert part is not None
        units = [u for u in r.on_host(host.name) if u.unit in part.units]
        return write_files, {"files": _staged(ctx, units, when)}
    if kind in ("stop", "start"):
        assert part is not None
        gathered = ctx.gathered
        assert gathered is not None
        args: dict[str, Any] = {"text": part.script, "_if": when, **limit}
        if kind == "stop":
            args.update(units=list(part.units), seen={u.unit: have.active for u in r.on_host(host.name)
                                                      if (have := gathered.installed.get((u.host, u.unit)))
                                                      is not None})
            return stop_units, args
        return start_units, args
    if kind in ("gate", "submit"):
        assert part is not None
        if kind == "gate":
            return python.call, {"function": _gate, "ctx": ctx, "groups": list(part.groups), "_if": when}
        return python.call, {"function": _submit, "ctx": ctx, "stop": list(part.stops), "start": list(part.groups),
                             "_if": when}
    if kind == "current":
        lock = ctx.lock
        give_back = (last_mark and lock is not None and host.name != r.units[0].host and host.name in lock.taken)
        if give_back and lock is not None:
            text = f"{text} && {{ {lock.release_text(host.name)}; }}"
        return script, {"text": text, "active": bool(text), "then": lock.given_back if give_back and lock else None,
                        "_if": when}
    args = {"text": text, **limit}
    if part is not None and not part.active:
        args["active"] = False
    return script, {**args, **({"_if": when} if when is not None else {})}


def _submit(state: State, host: Host, ctx: RunContext, stop: list[str], start: list[str]) -> bool:
    """On the submit host: cancel the jobs of ``stop``, submit those of ``start`` (the launcher's
    :meth:`~k3deploy.runtime.launchers.Launcher.submit`), each job's id kept in the run's state."""
    return ctx.launcher.submit({h.name: h for h in state.inventory}, stop, start, ctx.run.submitted)


def _router_call(state: State, host: Host, ctx: RunContext, key: RouterCall, text: str) -> bool:
    """Run a router call (take replicas out, put them back) on the router's host; the roll goes on only if it
    succeeded (``ctx.run.router_calls[key]``)."""
    from k3deploy.runtime.readiness import run

    ok, out = run({host.name: host}, host.name, text)
    for line in out.splitlines():
        (logger.info if ok else logger.error)(f"[{host.name}] {line}")
    if not ok:
        logger.error(f"[{host.name}] the router call failed: the roll stops here; the replicas not yet rolled keep "
                     "serving")
    ctx.run.router_calls[key] = ok
    return ok


def _both(here: bool, condition: Callable[[], bool]) -> bool:
    """An ``_if``: this host takes part and ``condition`` holds (evaluated when the operation runs)."""
    return here and condition()


def _gate(state: State, host: Host, ctx: RunContext, groups: list[str]) -> bool:
    """Every host of a restarting group waits for the group's readiness (the first to ask polls, for all of
    them); the host whose unit failed reports what it observed and fails, the others say why they stop."""
    hosts = {h.name: h for h in state.inventory}
    ok = True
    for g in groups:
        with _lock:
            first = g not in ctx.run.gates
            if first:
                ctx.run.gates[g] = gevent.event.AsyncResult()
        if first:
            ctx.run.gates[g].set(_wait_group(ctx, g, hosts))
        failure = _gate_result(ctx, g)
        if failure is None:
            continue
        if failure.host == host.name:
            for line in failure.report().splitlines():
                logger.error(f"[{host.name}] {line}")
            changed = ctx.gathered is None or not _starts_served_revision(ctx.gathered, g)
            advice = ctx.launcher.advice(g, failure.host, changed, ctx.run.submitted)
            logger.error(f"[{host.name}] {advice}")
            ok = False
        else:
            logger.warning(f"[{host.name}] group {g} stopped because {failure.unit.node.role} rank "
                           f"{failure.unit.rank} on {failure.host} failed (reported there)")
    return ok


def _wait_group(ctx: RunContext, group: str, hosts: dict[str, Host]) -> Failure | None:
    """The group's readiness (:func:`wait_group`), never an exception: a gate that could not finish is the group's
    failure, named after what stopped it, so that every host waiting on the result hears it."""
    try:
        return wait_group(ctx.rollout, group, hosts, control=ctx.launcher.control(ctx.run.submitted))
    except Exception as exc:   # a lost connection the gate did not expect: the group does not serve
        head = ctx.rollout.group(group)[0]
        return Failure(head, "start", f"the readiness gate stopped: {type(exc).__name__}: {exc}",
                       "every member answers its gate")


def gate_bound(rollout: Rollout) -> float:
    """The longest a host waits for the result of its group's gate that another host polls: the gate's own deadline
    plus, for its last poll, the log fetch and the stop of every member, each bounded on its node
    (:mod:`k3deploy.runtime.readiness`), and a margin."""
    from k3deploy.runtime.readiness import COMMAND_SECONDS, STOP_SECONDS

    link = rollout.vars.k3_link_timeout
    return rollout.deadline + 2 * (link + COMMAND_SECONDS) + link + STOP_SECONDS + 30


def _gate_result(ctx: RunContext, group: str) -> Failure | None:
    """The result of ``group``'s gate, waited for no longer than :func:`gate_bound` (another host polls it): a gate
    that did not end in that time is the group's failure."""
    result = ctx.run.gates[group]
    bound = gate_bound(ctx.rollout)
    try:
        failure: Failure | None = result.get(timeout=bound)
    except gevent.Timeout:
        head = ctx.rollout.group(group)[0]
        failure = Failure(head, "start", f"no result of the group's readiness gate within {bound:.0f} s",
                          "the gate ends within its deadline")
        with _lock:
            if not result.ready():
                result.set(failure)
    return failure


def _gate_host(ctx: RunContext) -> str | None:
    """The host that runs the SLO gate's operations: the router's with a canary, else the gated group's head's."""
    gate, r = ctx.gate, ctx.rollout
    if gate is None:
        return None
    if gate.kind == "canary":
        return next((u.host for u in r.units if u.group == "router"), None)
    return r.group(gate.groups[0])[0].host if r.group(gate.groups[0]) else None


def _slo_gate(state: State, host: Host, ctx: RunContext) -> bool:
    """The SLO gate (:mod:`k3deploy.runtime.slo`): the canary groups against a replica on the previous revision, or
    each gated group against its previous revision's recorded figures. A canary that misses goes back to its
    previous revision here (so that the next operation puts it back into the router); a single group that misses
    goes back with ``k3_auto_rollback``. The verdict (and the run's exit) comes at the end of the phase
    (:func:`_slo_verdict`): this operation fails only where going back failed."""
    gate, gathered = ctx.gate, ctx.gathered
    assert gate is not None and gathered is not None
    hosts = {h.name: h for h in state.inventory}
    r = ctx.rollout
    numbers = ctx.decided.numbers if ctx.decided is not None else {}
    if not any(g in numbers for g in gate.groups):
        logger.info(f"[{host.name}] SLO gate: {', '.join(gate.groups)} restarted with the files of a recorded "
                    "revision (a repair, not a change): nothing to judge")
        return True
    if gate.kind == "canary":
        outcomes = slo_gate.canary(hosts, r, gate, numbers, gathered.history)
    else:
        outcomes = [slo_gate.single(hosts, r, gate, g, numbers.get(g), gathered.history.get(g))
                    for g in gate.groups if ctx.serves(g)]
    ok = True
    for o in outcomes:
        ctx.run.outcomes[o.group] = o
        for line in o.report().splitlines():
            (logger.info if o.ok else logger.warning)(f"[{host.name}] {line}")
        if o.ok or (gate.kind == "group" and not gate.auto_rollback):
            continue
        h = gathered.history.get(o.group)
        number = h.current if h is not None else None
        if number is None or not h or not h.restorable(number):
            o.notes.append("there is no recorded revision every node of the group holds to go back to: the group "
                           "is left as it is" + (", out of the router" if gate.kind == "canary" else ""))
            _hold(ctx, o.group, Failure(r.group(o.group)[0], "the SLO gate", "missed the gate",
                                        "a recorded revision to go back to"))
            continue
        logger.warning(f"[{host.name}] group {o.group} missed the SLO gate: going back to revision {number} "
                       "(stopped, its files restored, started, gated)")
        o.back_to = number
        o.failure = slo_gate.go_back(hosts, r, o.group, number)
        ctx.run.reverted.add(o.group)
        if o.failure is not None:
            for line in o.failure.report().splitlines():
                logger.error(f"[{host.name}] {line}")
            _hold(ctx, o.group, o.failure)
            ok = False
        else:
            logger.info(f"[{host.name}] group {o.group} serves revision {number} again")
    return ok


def _hold(ctx: RunContext, group: str, failure: Failure) -> None:
    """The group does not serve for the rest of the run (it is not put back into the router, nothing marks it)."""
    result: gevent.event.AsyncResult = gevent.event.AsyncResult()
    result.set(failure)
    ctx.run.gates[group] = result


def _slo_verdict(state: State, host: Host, ctx: RunContext) -> bool:
    """At the end of the start phase, where a group missed the SLO gate: the figures against the targets once more,
    what was done about it, and the run fails (exit non-zero)."""
    gate = ctx.gate
    assert gate is not None
    for o in ctx.run.outcomes.values():
        if o.ok:
            continue
        for line in o.report().splitlines():
            logger.error(f"[{host.name}] {line}")
        recorded = (f"the change is recorded as revision {o.number} (never served; k3deploy history shows its "
                    "figures)" if o.number is not None else "")
        if o.back_to is not None and o.failure is None:
            done = (f"group {o.group} went back to revision {o.back_to} and serves it"
                    + (" again, back in the router; the roll stopped: the other replicas were not changed"
                       if gate.kind == "canary" else " again"))
        elif o.back_to is not None:
            done = f"group {o.group} could not go back to revision {o.back_to} (above): it is stopped"
        else:
            done = (f"group {o.group} keeps the change (k3_auto_rollback: false); roll back with --data "
                    "k3_rollback=true" if gate.kind == "group" else f"group {o.group} is left out of the router")
        logger.error(f"[{host.name}] SLO gate missed: {done}; {recorded + '; ' if recorded else ''}fix the change "
                     "(or the targets, k3_slo_*) and run again (pyinfra reports this step next as 'Error: executed 0 "
                     "commands': the step is this verdict, which runs no command of its own)")
    return False


def _starts_served_revision(gathered: Gathered, group: str) -> bool:
    """This run starts the group with exactly the files of the revision it last served (its ``current`` one): a
    failure then has its cause on a node, not in the settings."""
    from k3deploy.model.revisions import runs

    h = gathered.history.get(group)
    rev = h.revisions.get(h.current) if h is not None and h.current is not None else None
    if rev is None:
        return False
    now: dict[str, str | None] = {}
    for u in gathered.require_rollout().group(group):
        now[f"{u.host}:{u.unit_path}"], now[f"{u.host}:{u.env_path}"] = sha256(u.unit_text), sha256(u.env_text)
    return runs(rev, now)




@deploy("Virtual address")
def vip_phase(ctx: RunContext) -> None:
    """``k3_vip``: this host's steps of the virtual address (:func:`k3deploy.model.steps.virtual_address`), each as
    its operation: keepalived with its configuration, the refusal where the address's interface is unknown, and, on
    the host that serves the endpoint, once its condition holds, the wait until it holds the address. Nothing
    without ``k3_vip``."""
    for step in ctx.rollout_steps.vip:
        if step.host != host.name:
            continue
        if isinstance(step, steps.Refusal):
            script(name=step.name, text=step.script)
        elif isinstance(step, steps.Keepalived):
            keepalived(name=step.name, conf=step.conf, content=step.content, unit=step.unit, package=step.package,
                       staged=step.staged, apply=step.apply)
        else:
            vip_held(name=step.name, endpoint=step.endpoint, vip=step.vip, timeout=step.timeout,
                     _if=ctx.holds(step.when), _timeout=step.timeout + ctx.rollout.vars.k3_link_timeout)


@deploy("Smoke test")
def smoke_phase(ctx: RunContext) -> None:
    r, step = ctx.rollout, ctx.rollout_steps.smoke
    if host.name != step.host:
        return  # one request through the public endpoint, from the first host only
    every_group_serves = lambda: all(ctx.serves(g) for g in r.groups)  # noqa: E731
    smoke(name=step.name, endpoint=r.endpoint, model=steps.served_model(r), env_file=r.units[0].env_path,
          active=step.applies, correct=r.vars.k3_correctness_probe, _if=every_group_serves,
          _timeout=150 + r.vars.k3_link_timeout)
    if ctx.gathered is not None and ctx.gathered.rollback_to:
        python.call(name="Say what the rollback leaves behind", function=_after_rollback, ctx=ctx,
                    _if=every_group_serves)


def _after_rollback(ctx: RunContext) -> None:
    gathered = ctx.gathered
    assert gathered is not None
    for group, number in gathered.rollback_to.items():
        if group not in ctx.rollout.changed_groups:
            continue
        h = gathered.history[group]
        newest = max(h.numbers)
        wanted = (f"revision {newest}'s settings" + ("" if h.served(newest) else " (a change that never served)")
                  if newest > number else "the revision it went back to")
        logger.warning(f"k3deploy: group {group} now runs revision {number} (rolled back). The variables "
                       f"(group_vars, inventory) still describe {wanted}: the next run without k3_rollback goes "
                       "forward to them again; change them to stay on this revision")


#: each part of the rollout (:data:`k3deploy.model.steps.ORDER`) and the phase that renders its steps
PHASES: dict[str, Phase] = {
    "stage": stage_phase, "configure": configure_phase, "start": start_phase, "virtual address": vip_phase,
    "smoke": smoke_phase}
