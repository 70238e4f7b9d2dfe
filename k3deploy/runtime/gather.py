"""The one pipeline every entry point uses: inventory -> variables -> plan laid out on the hosts -> host facts and
what the rollout reads there -> checks -> derived settings -> the rollout rendered once -> what the hosts have.

``deploy/k3.py`` (:func:`gather_in_run`, inside pyinfra's own run) and every ``k3deploy`` command that reads an
inventory (:func:`gather`, with the command's :mod:`~k3deploy.runtime.views` view) build their :class:`Gathered`
here, so they cannot read one inventory two ways. The parts live in their own modules: the inventory and the
connections in :mod:`k3deploy.runtime.connections`, the typed plan of what each host is asked and its typed reading
in :mod:`k3deploy.runtime.reading`, the checks across hosts in :mod:`k3deploy.preflight.across`. Hosts are read in
parallel (gevent greenlets over pyinfra's connections) and never changed.

Example::

    >>> gathered = gather("inventories/gb300.py", PLAN)                # doctest: +SKIP
    >>> gathered.preflight.ok, gathered.rollout.endpoint               # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from pyinfra.api.facts import get_fact
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.facts.files import File, FileContents

from k3deploy.errors import K3Error
from k3deploy.facts.rollout import FileState, WeightsStatus
from k3deploy.facts.status import SlurmQueueReading, UnitRun
from k3deploy.model import images as image_pins
from k3deploy.model import slurm
from k3deploy.model.binding import HostRecord
from k3deploy.model.checkpoint import SourceCheck, check_archive, check_source
from k3deploy.model.images import LocalImage, Resolution
from k3deploy.model.inventory import SPARES, records_of
from k3deploy.model.jobcontainers import runtime, stale_files
from k3deploy.model.observed import Installed
from k3deploy.model.pipeline import Target, desired_rollout, target
from k3deploy.model.revisions import GroupHistory, combine, revisions_dir, rollback_target, runs
from k3deploy.model.rollout import Rollout, UnitWork
from k3deploy.model.runbook.blanks import Blank, offline_env
from k3deploy.model.spares import (
    Quarantine,
    Settled,
    merged,
    parse_released,
    parse_substitutions,
    places,
    quarantine_for,
    settle,
)
from k3deploy.model.staging import ARCHIVE, StagePlan, refused_archive, refused_source, stage_for, stage_hosts
from k3deploy.preflight import runner
from k3deploy.preflight.across import (
    image_check,
    image_resolver,
    rdma_reach_round,
    router_checks,
    run_probes,
    slurm_site_checks,
)
from k3deploy.preflight.checks import HostFacts
from k3deploy.preflight.report import PreflightReport, check
from k3deploy.runtime.connections import (
    bound_silence,
    disconnect,
    host_data,
    inventory_file,
    open_inventory,
    ssh_argv,
)
from k3deploy.runtime.launchers import launcher_for
from k3deploy.runtime.lock import Lock, LockRecord, held_summary, read_locks
from k3deploy.runtime.reading import (
    HostReading,
    ReadPlan,
    TakeLockThere,
    plan_hosts,
    read_again,
    read_hosts,
    router_resolver,
)
from k3deploy.runtime.views import DEPLOY, View

# ------------------------------------------------------------------------------------------ gathered


@dataclass(frozen=True)
class Gathered:
    """One inventory as one use read it (its :class:`~k3deploy.runtime.views.View`): its target (variables,
    requirements, plan), the preflight of its hosts with each host's facts, what the rollout read on each host (one
    :class:`~k3deploy.runtime.reading.HostReading` each), and the rollout rendered once with each host's derived
    settings. The maps by ``(host, unit)`` and by host that the rollout's users look things up in are views of the
    readings."""

    target: Target
    rollout: Rollout | None
    preflight: PreflightReport | None = None
    facts: list[HostFacts] = field(default_factory=list)                 # what each host's facts said
    readings: dict[str, HostReading] = field(default_factory=dict)       # host -> what the rollout read there
    addresses: dict[str, str] = field(default_factory=dict)   # host -> ssh address
    ssh: dict[str, list[str]] = field(default_factory=dict)   # host -> ssh argv from the control machine
    history: dict[str, GroupHistory] = field(default_factory=dict)   # group -> its recorded revisions
    rollback_to: dict[str, int] = field(default_factory=dict)        # group -> the revision the rollout restores
    resolution: Resolution | None = None   # the registry's digest for the image's tag (None: not asked)
    router_resolution: Resolution | None = None   # the same for k3_router_image's tag (None: not asked)
    stage: StagePlan | None = None         # how the image and the weights reach the nodes that lack them
    source: SourceCheck | None = None      # the control machine's weights source, read when the stage copies it
    archive: str | None = None             # what is wrong with the image archive the stage copies (None: nothing)
    blanks: list[Blank] = field(default_factory=list)   # what no node was asked, as named blanks (offline runbook)
    spares: Settled | None = None          # who stands in for whom (views that read what is installed)
    quarantine: dict[str, Quarantine] = field(default_factory=dict)   # host -> the quarantine this reading asks for
    stand_down: dict[str, list[str]] = field(default_factory=dict)    # host -> its units to stop and disable

    @cached_property
    def installed(self) -> dict[tuple[str, str], Installed]:
        """``(host, unit)`` -> its files and state as installed (whether it answers /health included)."""
        return {(host, unit): have for host, r in self.readings.items() for unit, have in r.installed.items()}

    @cached_property
    def images(self) -> dict[str, LocalImage]:
        """host -> what it holds of the image's repository."""
        return {host: r.image for host, r in self.readings.items() if r.image is not None}

    @cached_property
    def router_images(self) -> dict[str, LocalImage]:
        """host -> what it holds of ``k3_router_image``'s repository (the router's host)."""
        return {host: r.router_image for host, r in self.readings.items() if r.router_image is not None}

    @cached_property
    def helpers(self) -> dict[str, str | None]:
        """host -> sha256 of its k3-group-member (None: none there); hosts that were not asked are left out."""
        return {host: r.helper for host, r in self.readings.items() if r.helper_read}

    @cached_property
    def files(self) -> dict[tuple[str, str], FileState]:
        """``(host, path)`` -> a file the configure step writes in place, as the host's reading found it."""
        return {(host, path): state for host, r in self.readings.items() for path, state in r.files.items()}

    @cached_property
    def weights(self) -> dict[str, WeightsStatus]:
        """host -> what its cache holds of the model."""
        return {host: r.weights for host, r in self.readings.items() if r.weights is not None}

    @cached_property
    def compile_caches(self) -> dict[str, tuple[str, ...]]:
        """host -> the compile cache keys it holds whole; hosts that were not asked are left out."""
        return {host: r.compile_caches for host, r in self.readings.items() if r.compile_caches is not None}

    @cached_property
    def runs(self) -> dict[tuple[str, str], UnitRun]:
        """``(host, unit)`` -> as it runs (views that read ``running``)."""
        return {(host, unit): run for host, r in self.readings.items() for unit, run in r.runs.items()}

    @cached_property
    def logs(self) -> dict[tuple[str, str], dict[str, str]]:
        """``(host, unit)`` -> its journal and container log (views with ``log_lines``)."""
        return {(host, unit): text for host, r in self.readings.items() for unit, text in r.logs.items()}

    @cached_property
    def endpoint_models(self) -> tuple[str, ...] | None:
        """What the public endpoint lists (views that read ``running``; None: no answer)."""
        return next((r.endpoint_models for r in self.readings.values() if r.endpoint_models is not None), None)

    @cached_property
    def locks(self) -> dict[str, LockRecord]:
        """host -> the deployment lock held there."""
        return read_locks({host: r.lock for host, r in self.readings.items() if r.lock is not None})

    @cached_property
    def slurm_queue(self) -> SlurmQueueReading | None:
        """k3deploy's jobs in the Slurm queue, as ``k3_slurm_submit_host`` read them (None: not asked, or that host
        could not be read)."""
        return next((r.slurm_queue for r in self.readings.values() if r.slurm_queue is not None), None)

    def lock_lines(self) -> list[str]:
        """One line per run that holds the deployment lock on some host (none when it is free everywhere)."""
        return held_summary(self.locks)

    @property
    def ok(self) -> bool:
        return self.preflight is None or self.preflight.ok

    @property
    def pinned_tag(self) -> str | None:
        """The tag the rollout's image was pinned from in this run (None: not resolved, or the plan runs another
        image, e.g. a rollback's recorded build)."""
        res = self.resolution
        if res is None or self.rollout is None or res.pinned != self.rollout.plan.image:
            return None
        return res.image

    @property
    def router_tag(self) -> str | None:
        """The tag ``k3_router_image`` was pinned from in this run (None: not resolved)."""
        res = self.router_resolution
        if res is None or self.rollout is None or res.pinned != self.rollout.vars.k3_router_image:
            return None
        return res.image

    def require_rollout(self) -> Rollout:
        if self.rollout is None:
            self.target.require_plan()
            raise K3Error("no rollout")  # unreachable: a target with a plan always renders one
        return self.rollout


# ------------------------------------------------------------------------------------ the pipeline


def gather(spec: str, view: View, overrides: Mapping[str, Any] | None = None) -> Gathered:
    """Load an inventory, connect to every host (read-only; none with a view that reads no host) and read what
    ``view`` asks (:mod:`k3deploy.runtime.views`). Raises :class:`K3Error` for a bad inventory, variables or
    selection, and (``view.needs_plan``) for a plan that does not fit the hosts. Unreachable hosts are reported in
    the preflight, not raised."""
    state, wanted = open_inventory(spec, overrides)
    if not view.reads_hosts:
        return read_and_render(state, wanted, view, connect_first=False)
    runner.quiet_pyinfra()
    try:
        return read_and_render(state, wanted, view, connect_first=True)
    finally:
        disconnect(list(state.inventory))


def gather_in_run(state: State, inventory_spec: str | None,
                  before_read: Callable[[Target], Lock | None] | None = None) -> Gathered:
    """The deploy's reading of a running ``pyinfra INVENTORY deploy/k3.py`` (:data:`~k3deploy.runtime.views.DEPLOY`;
    hosts already connected by pyinfra; each gets :func:`~k3deploy.runtime.connections.bound_silence`).
    ``before_read(target)`` runs once the variables are known and before any host is read: the deployment lock is
    taken there on the first host, and on every other host by the command that reads it, before what it reads
    (:meth:`~k3deploy.runtime.lock.Lock.settle`, once every host answered: :class:`~k3deploy.runtime.lock.LockHeld`
    where another run holds it)."""
    wanted = target(records_of(state.inventory), inventory_file(inventory_spec))
    for host in state.inventory:
        if host.connected:
            bound_silence(host, wanted.host_vars(host.name).k3_link_timeout)
    lock = before_read(wanted) if before_read is not None else None
    return read_and_render(state, wanted, DEPLOY, connect_first=False, lock=lock)


def read_and_render(state: State, wanted: Target, view: View, *, connect_first: bool,
                    lock: Lock | None = None) -> Gathered:
    """What ``view`` reads of the inventory's hosts (nothing for a view that reads no host), checked, and the rollout
    rendered once with each host's derived settings; then, for a view that reads what is installed, each group's
    history, a rollback's files and the stage. With ``lock``, each host's command takes it first (see
    :func:`gather_in_run`)."""
    if view.needs_plan:
        wanted.require_plan()
    hosts = list(state.inventory)
    addresses = {h.name: str(h.data.get("ssh_hostname") or h.name) for h in hosts}
    ssh = {h.name: ssh_argv(host_data(h), addresses[h.name]) for h in hosts}
    if not view.reads_hosts:
        rollout, blanks = render_offline(wanted, view)
        return Gathered(target=wanted, rollout=rollout, addresses=addresses, ssh=ssh, blanks=blanks)

    layout = wanted.layout   # which unit runs where: all the reading needs (the rollout is rendered once, below)
    resolver = image_resolver(layout) if layout is not None and (view.installed or view.pins_image) else None
    plans = plan_hosts(layout, [h.name for h in hosts], view, resolver) if layout is not None else {}
    asked_plans = dict(plans)
    if lock is not None:
        for name, plan in plans.items():
            if (take := lock.request(name)) is not None:
                plans[name] = plan.taking_lock(TakeLockThere(*take))
    facts, readings = read_hosts(state, hosts, wanted, plans, connect_first=connect_first)
    if lock is not None:
        lock.settle({host: r.lock_taken for host, r in readings.items()})
    site = next(((h, r.slurm_site) for h, r in readings.items() if r.slurm_site is not None), None)
    if site is not None and (decided := slurm.site_variables(wanted.vars, site[1])):
        # what the variables leave to the site (auto), as its Slurm says it: before the checks and the rendering
        wanted = target(wanted.records, wanted.inventory, {**(wanted.overrides or {}), **decided})
    report = check(wanted.requirements, facts)
    if site is not None:
        report.results += slurm_site_checks(site[0], site[1], wanted.vars, wanted.requirements)
    if wanted.layout is not None:   # the launcher's own checks (the Slurm runtime's tools on each engine node)
        report.results = launcher_for(wanted.layout).preflight(
            report.results, {h: r.runtime for h, r in readings.items() if r.runtime is not None})
    spares: Standing | None = None
    if layout is not None and view.installed:
        spares = take_spares(state, hosts, wanted, view, facts, readings, report, asked_plans, resolver)
        wanted, layout, resolver = spares.target, spares.target.layout, spares.resolver
    report.results += router_checks({host: r.router_command for host, r in readings.items()
                                     if r.router_command is not None}, wanted.vars.k3_router_bin)
    report.results += run_probes(state, hosts, wanted, report)
    if wanted.vars.k3_rdma_reach:
        report.results += rdma_reach_round(state, hosts, facts, wanted.requirements, report, layout)
    resolution = None
    asked = next((f for f in facts if f.host == resolver and f.unreachable is None), None)
    if asked is not None and wanted.plan is not None:
        # one build for the whole rollout: every unit, the stage and the revision use the digest the tag names now
        answer = readings[asked.host].registry if asked.host in readings else None
        resolution = image_pins.resolution(wanted.plan.image, asked.host, answer)
        report.results.append(image_check(resolution))
        if resolution.pinned:
            wanted = wanted.with_image(resolution.pinned)
    router_resolution = None
    routed = router_resolver(layout) if layout is not None and (view.installed or view.pins_image) else None
    if routed is not None and wanted.vars.k3_router_image and routed in readings:
        # the router's image too: the tag pinned to the build the registry names now, run and recorded as such
        router_resolution = image_pins.resolution(wanted.vars.k3_router_image, routed,
                                                  readings[routed].router_registry)
        report.results.append(image_check(router_resolution))
        if router_resolution.pinned:
            wanted = wanted.with_router_image(router_resolution.pinned)
    rollout = _render(wanted, report)
    if rollout is not None:
        report.results += run_probes(state, hosts, wanted, report, rollout)
    gathered = Gathered(target=wanted, rollout=rollout, preflight=report, facts=facts, readings=readings,
                        addresses=addresses, ssh=ssh, resolution=resolution, router_resolution=router_resolution,
                        spares=spares.settled if spares is not None else None,
                        quarantine=spares.quarantine if spares is not None else {},
                        stand_down=spares.stand_down if spares is not None else {})
    if rollout is not None and view.installed:
        return _installed_state(state, gathered, rollout)
    return gathered


@dataclass
class Standing:
    """The spares taken into account (:func:`take_spares`): the target built with the substitutions, the host that
    resolves the image's tag in it, who stands in for whom, the quarantines to record and the units to stand down."""

    target: Target
    resolver: str | None
    settled: Settled
    quarantine: dict[str, Quarantine]
    stand_down: dict[str, list[str]]


def take_spares(state: State, hosts: list[Host], wanted: Target, view: View, facts: list[HostFacts],
                readings: dict[str, HostReading], report: PreflightReport, plans: dict[str, ReadPlan],
                resolver: str | None) -> Standing:
    """The spares (:mod:`k3deploy.model.spares`) taken into account: the substitutions the nodes record applied, a
    spare for each member lost now (unreachable, or quarantined: its record on the node, or a fatal event in its
    health), the target and its layout built from the result. The hosts whose part changed are read again (what
    their new units need); the checks of a host that runs nothing are kept as warnings (it does not stop a run); a
    quarantined node's record is written by the deploy, and its units, like those of a lost member that came back,
    are stopped and disabled."""
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    files = {host: r.spare_files for host, r in readings.items() if r.spare_files is not None}
    recorded = merged(parse_substitutions(f.substitutions) for f in files.values())
    # (a host pyinfra could not connect to is tried once more by the facts: said as the connection error alone)
    unreachable = {f.host: f.unreachable.removeprefix(runner.LOST_CONNECTION) for f in facts
                   if f.unreachable is not None}
    held: dict[str, Quarantine] = {}
    new_quarantine: dict[str, Quarantine] = {}
    for f in facts:
        if f.unreachable is not None or f.host not in files:
            continue
        q = Quarantine.from_text(files[f.host].quarantine)
        if q is not None:
            held[f.host] = q
        elif (q := quarantine_for(f.health, parse_released(files[f.host].released), when)):
            new_quarantine[f.host] = q
    if not recorded and not any(SPARES in r.groups for r in wanted.records):
        # no spares here: an unreachable node or a fatal event fails the preflight as it always did (a node's own
        # quarantine record still keeps it from running)
        unreachable, new_quarantine = {}, {}
    quarantined = {h: q.reason for h, q in {**held, **new_quarantine}.items()}
    unusable = {h: fs[0].check for h, fs in report.failures_by_host().items()}
    targets: dict[tuple[tuple[str, tuple[str, ...]], ...], Target] = {}

    def target_of(records: list[HostRecord]) -> Target:
        key = tuple((r.name, r.groups) for r in records)
        if records == wanted.records:
            return wanted
        if key not in targets:
            targets[key] = target(records, wanted.inventory, wanted.overrides)
        return targets[key]

    def placed_of(records: list[HostRecord]) -> dict[str, tuple[str, int]]:
        layout = target_of(records).layout
        return places(layout) if layout is not None else {}

    settled = settle(wanted.records, recorded, placed_of, unreachable=unreachable, quarantined=quarantined,
                     unusable=unusable, when=when)
    moved = target_of(settled.records)
    layout = moved.require_layout()
    moved = replace(moved, layout=replace(layout, spares={h: a for h, a in layout.spares.items()
                                                          if h in settled.standby}))
    layout = moved.require_layout()
    if resolver is not None:   # the first engine host resolves the image's tag: a spare, if it took the head's place
        resolver = image_resolver(layout)
    again = plan_hosts(layout, [h.name for h in hosts], view, resolver)
    changed = [h for h in hosts if h.name not in unreachable and h.name in plans and again[h.name] != plans[h.name]
               and (layout.on_host(h.name) or h.name == resolver)]
    if changed:
        for host, reading in read_again(state, changed, again).items():
            old = readings.get(host)
            readings[host] = replace(reading, lock=old.lock, lock_taken=old.lock_taken) if old is not None else reading
    report.results = [replace(r, status="warn", observed=f"{r.observed} ({settled.out[r.host]}; it runs nothing, "
                              "which stops no run)")
                      if r.status == "fail" and r.host in settled.out else r for r in report.results]
    stand_down: dict[str, list[str]] = {}
    for host in [h.name for h in hosts if not layout.on_host(h.name)]:   # a spare, or a host out: runs nothing
        found = readings.get(host)
        if host in unreachable or found is None:
            continue
        units = [unit for unit, have in found.installed.items() if have.active != "absent"
                 and (host in new_quarantine or have.active not in ("inactive",))]
        if units:
            stand_down[host] = units
    return Standing(moved, resolver, settled, {h: q for h, q in new_quarantine.items() if h in settled.out},
                    stand_down)


def _render(wanted: Target, report: PreflightReport) -> Rollout | None:
    """The rollout, rendered once: each host's interface and derived settings from its facts."""
    if wanted.plan is None:
        return None
    ifaces = {}
    for host, settings in report.settings.items():
        iface = wanted.vars.k3_iface or settings.env.get("GLOO_SOCKET_IFNAME")
        if iface:
            ifaces[host] = iface
    return desired_rollout(wanted, ifaces=ifaces, host_env=report.host_env())


def render_offline(wanted: Target, view: View) -> tuple[Rollout | None, list[Blank]]:
    """The rollout from the inventory alone; with ``view.blanks`` each node's derived settings are named blanks,
    each with the command that finds it (an offline runbook)."""
    if wanted.plan is None:
        return None, []
    if not view.blanks:
        return desired_rollout(wanted), []
    blanks: list[Blank] = []
    host_env: dict[str, dict[str, str]] = {}
    ifaces: dict[str, str] = {}
    for rec in wanted.records:
        mine_vars = wanted.host_vars(rec.name)
        iface = mine_vars.k3_iface
        env, mine = offline_env(wanted.requirements, rec.name, rec.address, iface, mine_vars.k3_ib_hca)
        host_env[rec.name] = env
        ifaces[rec.name] = iface or next(b.token for b in mine if b.name == "IFACE")
        blanks += mine
    return desired_rollout(wanted, ifaces=ifaces, host_env=host_env), blanks


def _installed_state(state: State, gathered: Gathered, rollout: Rollout) -> Gathered:
    """``gathered`` with what its readings say of what is installed: whether each serving unit answers, what the
    running router lists, each group's history (a revision is restorable only where every host of the group holds
    it), a rollback's files and the stage."""
    listed: dict[str, dict[str, GroupHistory]] = {}   # group -> host -> its revisions as that host lists them
    readings: dict[str, HostReading] = {}
    for host, reading in gathered.readings.items():
        answers = {unit: code == 200 for unit, code in reading.health.items()}
        answers.update({unit: run.health == 200 for unit, run in reading.runs.items() if run.health is not None})
        # a serving unit that does not answer is a change to repair
        readings[host] = replace(reading, installed={unit: replace(have, answers=answers[unit]) if unit in answers
                                                     else have for unit, have in reading.installed.items()})
        if reading.router_workers is not None:
            rollout = rollout.decided(router_workers=reading.router_workers)
        for group, history in reading.revisions.items():
            listed.setdefault(group, {})[host] = history
    histories: dict[str, GroupHistory] = {}
    gathered = replace(gathered, readings=readings, rollout=rollout, history=histories)
    for group, by_host in listed.items():
        order = list(dict.fromkeys(u.host for u in rollout.group(group)))
        h = combine(group, [(h, by_host[h]) for h in order if h in by_host])
        if h.split:   # a run stopped between the nodes' marks: the current revision is what the files are
            now: dict[str, str | None] = {}
            for u in rollout.group(group):
                have = gathered.installed.get((u.host, u.unit), Installed())
                now[f"{u.host}:{u.unit_path}"], now[f"{u.host}:{u.env_path}"] = have.unit_sha, have.env_sha
            running = [n for n, rev in h.revisions.items() if runs(rev, now)]
            runs_now = max(running) if running else None
            h = replace(h, runs_now=runs_now, current=runs_now if runs_now is not None else h.current)
        histories[group] = h
    wanted = gathered.target
    rollback_to: dict[str, int] = {}
    if wanted.vars.k3_rollback is not False:
        rollback_to, rollout = restore_revisions(state, rollout, gathered.history, wanted.vars.k3_rollback,
                                                 gathered.installed)
        restored = {gathered.history[g].revisions[n].image for g, n in rollback_to.items()
                    if g in gathered.history and n in gathered.history[g].revisions and g != "router"}
        if len(restored) == 1 and image_pins.is_pinned(next(iter(restored))):
            # the revision's exact build is what the restored units run: stage that one
            rollout = replace(rollout, plan=rollout.plan.model_copy(update={"image": next(iter(restored))}))
    launcher = launcher_for(rollout)   # where the image travels as its runtime's file (Slurm: pyxis, apptainer)
    stage = stage_for(rollout, gathered.images, {h: w.verified for h, w in gathered.weights.items()},
                      gathered.compile_caches if rollout.vars.k3_compile_cache else None,
                      image_file=launcher.image_file,
                      runtime=launcher.runtime_tools.name if launcher.runtime_tools is not None else None,
                      files={h: r.runtime.files for h, r in gathered.readings.items() if r.runtime is not None})
    if stage.runtime is not None:   # its older files: those of the images no kept revision runs, pruned
        kept = {rev.image for h in gathered.history.values() for rev in h.revisions.values()} | \
            {rollout.plan.image, *([rollout.vars.k3_router_image] if rollout.vars.k3_router_image else [])}
        rt, folder = runtime(stage.runtime), rollout.vars.k3_stage_dir
        stage = replace(stage, stale={h: old for h, r in gathered.readings.items() if r.runtime is not None
                                      and (old := stale_files(folder, rt, r.runtime.files, kept))})
    # before a byte moves: the source holds every shard its index names, each as long as its header says
    source = check_source(rollout.vars.k3_weights_source) \
        if rollout.vars.k3_weights_source and ARCHIVE in stage.weights.fetch.values() else None
    archive = check_archive(rollout.vars.k3_image_archive) \
        if rollout.vars.k3_image_archive and ARCHIVE in stage.image.fetch.values() else None
    return replace(gathered, rollout=rollout, rollback_to=rollback_to, stage=stage, source=source, archive=archive)


def restore_revisions(state: State, rollout: Rollout, history: Mapping[str, GroupHistory], wanted: bool | int,
                      installed: Mapping[tuple[str, str], Installed]) -> tuple[dict[str, int], Rollout]:
    """A rollback: every unit's desired files become those of its group's revision (for ``True`` the previous
    one, or the current one when the hosts run an unrecorded, failed change, or, with replicas, when a roll stopped
    on any replica; else number ``wanted``), read from the revision directories on the hosts. With ``k3_launcher:
    slurm`` a unit's files are its launch script (``launch_text``: what its job's step runs) and its env file, as
    the revisions keep them; the group's job is then rendered from them. Returns each group's revision and the
    rollout with those files."""
    hosts = {h.name: h for h in state.inventory}
    launcher = launcher_for(rollout)

    def own(unit: UnitWork) -> str:
        """The unit's own file: its systemd unit, or under Slurm its launch script."""
        return launcher.unit_file(unit)

    def with_files(unit: UnitWork, own_text: str, env_text: str) -> UnitWork:
        """The unit with a revision's files: its own file (:func:`own`) and its env file."""
        if own(unit) != unit.unit_path:
            return unit.kept(launch_text=own_text, env_text=env_text)
        return unit.kept(unit_text=own_text, env_text=env_text)

    now: dict[str, str | None] = {}
    for u in rollout.units:
        have = installed.get((u.host, u.unit), Installed())
        now[f"{u.host}:{own(u)}"], now[f"{u.host}:{u.env_path}"] = have.unit_sha, have.env_sha
    out: dict[str, int] = {}
    restored: dict[tuple[str, str], UnitWork] = {}   # (host, unit) -> the unit with its revision's files
    runs_current: dict[str, bool] = {}
    for group in rollout.groups:
        h = history.get(group) or GroupHistory(group)
        current = h.revisions.get(h.current) if h.current is not None else None
        runs_current[group] = current is None or runs(current, now)
    # a roll of replicas that stopped: going back means every replica on its current revision (those the roll
    # never reached already are), not the replicas that stayed behind one revision further back
    stopped_roll = len(rollout.replicas) > 1 and not all(runs_current[g] for g in rollout.replicas)
    for group in rollout.groups:
        h = history.get(group) or GroupHistory(group)
        try:
            # the router in front of replicas is not what engine changes change: it stays on its revision
            stay = (stopped_roll and group in rollout.replicas) or (len(rollout.replicas) > 1 and group == "router")
            number = rollback_target(h.numbers, h.current, wanted, runs_current=runs_current[group] and not stay,
                                     served=[n for n in h.numbers if h.served(n)])
        except K3Error as exc:
            raise K3Error(f"group {group}: {exc}") from None
        d = f"{revisions_dir(rollout.vars.k3_config_dir, group)}/{number}"
        keep: dict[tuple[str, str], tuple[str, str]] = {}   # units that run that revision: kept as they are
        for u in rollout.group(group):
            have = installed.get((u.host, u.unit), Installed())
            if number == h.current and runs_current[group] and have.unit_text is not None \
                    and have.env_text is not None:
                keep[(u.host, u.unit)] = (have.unit_text, have.env_text)
        reads = {u.host for u in rollout.group(group) if (u.host, u.unit) not in keep}
        lacking = [host for host in h.lacking(number) if host in reads]
        if lacking:   # refused before any file is read or changed: a rollback restores every host or none
            raise K3Error(f"cannot roll group {group} back to revision {number}: {', '.join(lacking)} "
                          f"{'lacks' if len(lacking) == 1 else 'lack'} its files in {d} (k3deploy history INVENTORY "
                          "shows which revisions every host of the group holds): pick a revision they all hold")
        for u in rollout.group(group):
            if (u.host, u.unit) in keep:   # it runs that revision: keep it
                restored[(u.host, u.unit)] = with_files(u, *keep[(u.host, u.unit)])
                continue
            texts: list[str] = []
            for path in (own(u), u.env_path):
                kept = f"{d}/{path.rsplit('/', 1)[-1]}"
                lines = get_fact(state, hosts[u.host], FileContents, kwargs={"path": kept}, apply_failed_hosts=False)
                if lines is None and get_fact(state, hosts[u.host], File, kwargs={"path": kept},
                                              apply_failed_hosts=False):
                    lines = []   # an empty file (a router's env file)
                if lines is None:
                    raise K3Error(f"cannot roll group {group} back to revision {number}: {u.host} has no "
                                  f"{d}/{path.rsplit('/', 1)[-1]} (k3deploy history shows what each host kept)")
                texts.append("".join(f"{ln}\n" for ln in lines))
            restored[(u.host, u.unit)] = with_files(u, *texts)
        out[group] = number
    return out, replace(rollout, units=[restored.get((u.host, u.unit), u) for u in rollout.units])


def require_reachable(gathered: Gathered) -> None:
    """Raise :class:`K3Error` naming every host that could not be reached (a lost member a spare replaces, or a
    spare, is none of the rollout's business: see ``gathered.spares``)."""
    down = gathered.preflight.unreachable() if gathered.preflight else {}
    out = gathered.spares.out if gathered.spares is not None else {}
    down = {h: why for h, why in down.items() if h not in out}
    if down:
        raise K3Error("cannot reach " + "; ".join(f"{h}: {why}" for h, why in down.items())
                      + ": check the address, SSH key and that the node is up")


def refused_stage(gathered: Gathered) -> list[str]:
    """Why the stage may not start (empty: it may): the control machine's weights source or image archive, read
    before the stage copies from it, is incomplete. Each reason's line, then one line per host of the stage."""
    sp, rollout = gathered.stage, gathered.rollout
    if sp is None or rollout is None:
        return []
    hosts = stage_hosts(rollout)
    target = gathered.target
    lines = []
    if gathered.source is not None and not gathered.source.ok:
        lines += refused_source(sp, gathered.source, hosts, where=target.source("k3_weights_source"),
                                model=rollout.plan.model)
    if gathered.archive is not None:
        lines += refused_archive(sp, gathered.archive, hosts, archive=str(rollout.vars.k3_image_archive),
                                 where=target.source("k3_image_archive"), image=rollout.plan.image)
    return lines
