"""The phases of ``deploy/k3.py`` as pyinfra ``@deploy`` functions, and the cluster context they share.

The context is built once per run (first host to ask; the others wait for it) by the one pipeline,
:func:`k3deploy.runtime.gather.gather_in_run`: inventory -> variables -> plan -> preflight facts and checks ->
derived host settings -> rendered units and env files -> installed state and revisions -> which groups restart.
Every phase then calls its operations from one call site on every host, with an ``active`` flag, so pyinfra's
cross-host ordering follows the rendezvous rules (pyinfra orders ops by call site, not by host).

Nothing is half-applied: a bad inventory, a failing preflight check or an engine flag the pinned engine refuses
stops the run while it is being prepared (``--dry`` included), with every reason printed once and a non-zero exit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gevent.event
import gevent.lock
from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.operations import python

from k3deploy.errors import K3Error
from k3deploy.model import commands
from k3deploy.model.images import holds, named, run_ref
from k3deploy.model.pipeline import Target
from k3deploy.model.revisions import GroupHistory, revision_for, revisions_dir, sha256
from k3deploy.model.rollout import Rollout, UnitWork, mark_changes
from k3deploy.model.staging import (
    ARCHIVE,
    OUTSIDE,
    StagePlan,
    addresses,
    peers_config,
    peers_config_path,
    stage_for,
    summary,
)
from k3deploy.model.staging import engines as stage_engines
from k3deploy.model.units import GROUP_MEMBER, group_member_text
from k3deploy.model.variables import inventory_path_from_argv
from k3deploy.preflight.checks import CLUSTER
from k3deploy.recipe.argv import served_model_name
from k3deploy.runtime import oporder
from k3deploy.runtime.gather import Cluster, connector_drift, gather_in_run
from k3deploy.runtime.lock import Lock, LockHeld, this_run
from k3deploy.runtime.operations import (
    from_control,
    managed_file,
    owner_and_mode,
    script,
    smoke,
    start_units,
    stop_units,
    wait_tcp,
)
from k3deploy.runtime.readiness import Failure, wait_group

oporder.install()  # pyinfra's op identities, without reading every frame's source (see the module)
_lock = gevent.lock.RLock()
#: variables that belong to one host or one run, not to what a group runs
PER_HOST = frozenset({"k3_ip", "k3_sim", "k3_rollback", "k3_replica"})
_contexts: dict[int, Context] = {}


@dataclass(frozen=True)
class Refused:
    """The rollout cannot go ahead; nothing was changed (the reasons are printed once, while the run prepares)."""

    message: str
    exit_code: int


@dataclass
class Context:
    cluster: Cluster | None
    refusal: Refused | None = None
    state: Any = None
    lock: Lock | None = None
    gates: dict[str, gevent.event.AsyncResult] = field(default_factory=dict)   # group -> its readiness result
    router_calls: dict[str, bool] = field(default_factory=dict)   # "remove N" / "add N" of a roll -> it succeeded
    begun: dict[int, bool] = field(default_factory=dict)   # step of the restart -> it went ahead (see :meth:`begins`)
    numbers: dict[str, int] = field(default_factory=dict)  # group -> the revision number this run records
    metas: dict[str, str] = field(default_factory=dict)    # group -> that revision's meta.json
    marks: dict[str, int] = field(default_factory=dict)    # group -> the revision marked current once it serves

    @property
    def rollout(self) -> Rollout:
        assert self.cluster is not None and self.cluster.rollout is not None
        return self.cluster.rollout

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def step_ok(self, groups: list[str], calls: list[str]) -> bool:
        """Every one of ``groups`` serves and every one of the router ``calls`` succeeded."""
        return self.all_serve(groups) and all(self.router_calls.get(c) for c in calls)

    def all_serve(self, groups: list[str]) -> bool:
        """Every one of ``groups`` serves (see :meth:`serves`)."""
        return all(self.serves(g) for g in groups)

    def serves(self, group: str) -> bool:
        """The group was not restarted, or it came back serving (False while its gate has not finished)."""
        if group not in self.rollout.changed_groups:
            return True
        result = self.gates.get(group)
        return result is not None and result.ready() and result.get() is None

    def failed_members(self, groups: list[str]) -> list[str]:
        """The hosts of these groups that failed an earlier step of this run (pyinfra dropped them)."""
        failed = {h.name for h in getattr(self.state, "failed_hosts", ())}
        return sorted({u.host for g in groups for u in self.rollout.group(g) if u.host in failed})

    def intact(self, groups: list[str]) -> bool:
        """No host of these groups failed an earlier step: the groups may be configured."""
        return not self.failed_members(groups)

    def begins(self, step: int, groups: list[str]) -> bool:
        """Whether restart step ``step`` (of ``groups``) goes ahead, decided once, when its first operation runs:
        only when no member of its groups failed an earlier step (the stage, the configure phase, a gate). A
        group held back keeps running what it ran (its recorded revision); the reason is said once."""
        with _lock:
            if step not in self.begun:
                down = self.failed_members(groups)
                self.begun[step] = not down
                if down:
                    history = self.cluster.history if self.cluster is not None else {}
                    runs = ", ".join(f"{g} keeps running " + (f"revision {history[g].current}"
                                                             if g in history and history[g].current is not None
                                                             else "what it ran")
                                     for g in groups)
                    logger.error(f"--> k3deploy: the change of {', '.join(groups)} stops here: "
                                 f"{', '.join(down)} failed an earlier step of this run (its error is above); no "
                                 f"member of the group was restarted or given new files: {runs}. Fix the cause and "
                                 "run again")
            return self.begun[step]


def context() -> Context:
    """The run's shared context (computed by the first host that asks)."""
    state = ctx_state.get()
    key = id(state)
    with _lock:
        if key not in _contexts:
            _contexts[key] = _build(state)
        return _contexts[key]


def _refuse(lines: list[str], summary: str, exit_code: int, lock: Lock | None = None) -> Context:
    """Print the reasons once (every host shares the context) and refuse the run (giving the lock back)."""
    for line in lines:
        logger.error(line)
    logger.error(f"--> k3deploy: {summary}")
    if lock is not None:
        lock.release()
    return Context(None, Refused(summary, exit_code))


def dry_run(argv: list[str] | None = None) -> bool:
    """This ``pyinfra`` run changes nothing: ``--dry``, or ``--json`` without ``-y`` (pyinfra prints the changes and
    exits; its state does not say so).

    >>> dry_run(["pyinfra", "inv.py", "deploy/k3.py", "--dry"]), dry_run(["pyinfra", "inv.py", "deploy/k3.py", "-y"])
    (True, False)
    """
    args = sys.argv[1:] if argv is None else argv[1:]
    yes = any(a in ("-y", "--yes") or (a.startswith("-") and not a.startswith("--") and "y" in a) for a in args)
    return "--dry" in args or ("--json" in args and not yes)


def _take_lock(state: Any, spec: str | None, t: Target, holder: list[Lock]) -> None:
    """Before any host is read (so before the revision numbers are chosen): the deployment lock on every host
    (:mod:`k3deploy.runtime.lock`); ``--dry`` takes none and names a held one."""
    # pyinfra's @fake hosts (tests of the deploy's own logic) answer scripted facts only: nothing there to lock
    hosts = {h.name: h for h in state.inventory if h.connected and type(h.connector).__name__ != "FakeConnector"}
    dirs = {n: t.host_vars(n).k3_config_dir for n in hosts}
    if dry_run() or not hosts:
        return
    lock = Lock(state, hosts, dirs, this_run(spec or "INVENTORY"))
    lock.acquire()
    holder.append(lock)
    for note in lock.notes:
        logger.warning(f"k3deploy: {note}")
    logger.info(f"--> k3deploy: deployment lock taken on {len(lock.taken)} host(s) (run {lock.record.run})")


def _build(state: Any) -> Context:
    spec = inventory_path_from_argv()
    held: list[Lock] = []
    try:
        cluster = gather_in_run(state, spec, before_read=partial(_take_lock, state, spec, holder=held))
    except K3Error as exc:
        return _refuse([], str(exc) if isinstance(exc, LockHeld) else f"{exc}; nothing was changed", exc.exit_code,
                       held[0] if held else None)
    lock = held[0] if held else None
    if dry_run():
        for line in cluster.lock_lines():
            logger.warning(f"k3deploy: {line}: a run now would be refused")
    report = cluster.preflight
    assert report is not None
    failing = report.failures_by_host()
    if failing:
        nodes = sorted(h for h in failing if h != CLUSTER)
        where = ", ".join(nodes) + (" and for the cluster as a whole" if CLUSTER in failing else "")
        lines = [f"k3deploy: preflight failed on {where}; nothing was changed on any node:"]
        for h, fs in failing.items():
            lines += [f"  [{h}] {f.line()}" for f in fs]
        return _refuse(lines, "preflight failed: nothing was changed (the reasons are above; k3deploy preflight "
                              "INVENTORY shows every check)", 1, lock)
    r = cluster.require_rollout()
    for line in connector_drift(state, cluster.target):
        logger.warning(f"k3deploy: {line}")
    logger.info(f"--> k3deploy: preflight passed on {len(report.hosts)} host(s), {len(report.results)} checks; "
                f"plan {r.plan.hardware} x {len(r.hosts)}, {r.plan.strategy}, image {r.plan.image}")
    res = cluster.resolution
    if res is not None and cluster.pinned_tag is not None:
        logger.info(f"--> k3deploy: image {res.image} is {res.digest} in the registry (asked from {res.host}): "
                    "every node runs that build")
    for w in r.plan.warnings:
        logger.warning(f"k3deploy: {w}")
    for line in summary(cluster.stage) if cluster.stage is not None else []:
        logger.info(f"--> k3deploy: stage {line}")
    mark_changes(r, cluster.installed)
    for group, number in cluster.rollback_to.items():
        current = cluster.history[group].current if group in cluster.history else None
        if group not in r.changed_groups:
            continue   # it runs that revision already
        logger.info(f"--> k3deploy: rollback of group {group} from revision {current} to revision {number}")
    # the groups whose files change record a new revision, numbered under the lock (no other run records one of
    # these groups until this one ends); worked out once for the run, not per host
    changing = {g for g in r.changed_groups if any(_changed_files(cluster, u) for u in r.group(g))}
    numbers = {g: (cluster.history.get(g) or GroupHistory(g)).next_number() for g in changing
               if g not in cluster.rollback_to}
    metas = {g: _revision_meta(cluster, g, n) for g, n in numbers.items()}
    marks = {g: n for g in r.changed_groups if (n := _serving_revision(cluster, g, numbers)) is not None}
    return Context(cluster, state=state, lock=lock, numbers=numbers, metas=metas, marks=marks)


# ------------------------------------------------------------------------------------------------ phases


@deploy("Preflight")
def preflight_phase(ctx: Context) -> None:
    if ctx.refusal is not None:
        raise SystemExit(ctx.refusal.exit_code)  # pyinfra would print any other exception with a traceback
    host.noop("every check passed on every host")


@deploy("Stage")
def stage_phase(ctx: Context) -> None:
    r = ctx.rollout
    v = r.vars
    cluster = ctx.cluster
    assert cluster is not None
    me = host.name
    sp = cluster.stage or stage_for(r, {}, {})
    img, wts = sp.image, sp.weights
    docker, cache, model, image_ref = v.k3_docker, v.k3_model_cache, r.plan.model, r.plan.image
    tag = cluster.pinned_tag   # the tag that names the pinned build
    shown = tag or image_ref
    archive = commands.archive_path(v.k3_stage_dir, image_ref)
    where = addresses(r)
    token = v.k3_config_dir.rstrip("/") + "/hf-token" if v.k3_hf_token_file else None
    # a killed run's rsync daemon (root, open to the cluster) goes first, wherever the facts saw it
    left = next((f.stage_peers for f in cluster.facts if f.host == me), None)
    script(name="Peers: stop a daemon an earlier run left", text=commands.stop_peers(),
           active=getattr(left, "running", False))
    managed_file(name="Hugging Face token (0600)", dest=token or "", content=Path(v.k3_hf_token_file).read_text()
                 if v.k3_hf_token_file else "", mode="600", kind="secret",
                 active=bool(token) and me in stage_engines(r))
    if not _stages(sp):
        _verify_before_start(r, sp, me)
        return  # every engine node holds both artifacts: no stage operation would do anything on any host
    # fetched from outside (or from the control machine on an air-gapped site) by the first node(s) only
    script(name=f"Image {shown}: from the registry", text=commands.pull(docker, image_ref, tag) + (
        " && " + commands.export_image(docker, image_ref, v.k3_stage_dir) if me in img.senders else ""),
        active=img.fetch.get(me) == OUTSIDE)
    from_control(name="Image: the archive from the control machine", src=v.k3_image_archive or "", dest=archive,
                 active=img.fetch.get(me) == ARCHIVE)
    script(name="Image: load the archive", text=commands.load_image(docker, image_ref, archive, tag),
           active=img.fetch.get(me) == ARCHIVE)
    # a node that holds the pinned build by its digest only gets the local tag the units run
    script(name="Image: name the pinned build", text=commands.name_build(docker, image_ref, tag),
           active=me in stage_engines(r) and me not in img.fetch and me not in img.receivers
           and not named(image_ref, cluster.images.get(me)))
    # the hub CLI of the pinned build where the node has it by now, else of the build its tag names there (any build
    # of the image downloads the same files: no image crosses the uplink for it), else the pinned build
    held = cluster.images.get(me)
    hf_image = (run_ref(image_ref) if me in img.fetch or holds(image_ref, held) else
                tag if tag and held is not None and held.ref_digest else image_ref)
    script(name=f"Weights of {model}: from the hub", text=commands.fetch_weights(
        docker, cache, hf_image, model, token, v.k3_hf_endpoint), active=wts.fetch.get(me) == OUTSIDE)
    from_control(name="Weights: from the control machine", src=(v.k3_weights_source or "").rstrip("/") + "/",
                 dest=commands.model_dir(cache, model) + "/", active=wts.fetch.get(me) == ARCHIVE)
    script(name="Weights: verify", text=commands.verify_weights(cache, model), active=wts.fetch.get(me) == ARCHIVE)
    script(name="Weights: verify those already here", text=commands.require_weights(cache, model),
           active=me in wts.require)
    # then node to node: every holder hands each artifact to one node per round
    script(name="Image: archive for peers", text=commands.export_image(docker, image_ref, v.k3_stage_dir),
           active=me in img.export)
    managed_file(name="Peers: rsync daemon configuration", dest=peers_config_path(r),
                 content=peers_config(r, me) if me in where else "", mode="644", active=me in sp.senders)
    script(name="Peers: serve staged files (read only)", text=commands.serve_peers(
        peers_config_path(r), where.get(me, ""), v.k3_stage_port,
        [commands.hub_dir(cache), v.k3_stage_dir]), active=me in sp.senders)
    for i in range(sp.rounds):
        from_image, from_weights = sp.round_of(i, me)
        steps = []
        if from_image:
            steps.append(commands.receive_image(where[from_image], v.k3_stage_port, docker, image_ref,
                                                v.k3_stage_dir, tag))
        if from_weights:
            steps.append(commands.receive_weights(where[from_weights], v.k3_stage_port, cache, model))
        script(name=f"Stage round {i + 1} of {sp.rounds}: from a peer", text=" && ".join(steps), active=bool(steps))
    script(name="Peers: stop serving, remove image archives",
           text=commands.stop_serving(v.k3_stage_dir, image_ref), active=me in sp.takes_part)
    _verify_before_start(r, sp, me)


def _verify_before_start(r: Rollout, sp: StagePlan, me: str) -> None:
    """Every file of the snapshot hashed again, whatever its time stamps, on each engine host of a group that
    restarts (the stage's last step): a host whose stage verified the weights in this run already is not read twice;
    on one shared cache, the first engine host of each such group."""
    w = sp.weights
    hashed = {*w.fetch, *w.require, *w.receivers}
    groups = {g: [h for h in dict.fromkeys(u.host for u in r.group(g))]
              for g in r.changed_groups if g != "router"}
    hosts = {h for g, hs in groups.items() for h in (hs[:1] if r.vars.k3_weights_shared else hs)}
    script(name="Weights: verify every file before the engines start", text=commands.verify_before_start(
        r.vars.k3_model_cache, r.plan.model), active=me in hosts and me not in hashed)


def _stages(sp: StagePlan) -> bool:
    """Some host has something to fetch, check, export, serve or receive (the same on every host: the stage's
    operations are called on every host or on none, so pyinfra's order across hosts is unchanged)."""
    a, b = sp.image, sp.weights
    return bool(a.fetch or b.fetch or a.require or b.require or a.export or b.export or sp.rounds or sp.senders
                or sp.takes_part)


@deploy("Configure")
def configure_phase(ctx: Context) -> None:
    r, cluster = ctx.rollout, ctx.cluster
    assert cluster is not None
    engines = any(u.group != "router" for u in r.on_host(host.name))
    managed_file(name=f"Group member helper {GROUP_MEMBER}", dest=GROUP_MEMBER, content=group_member_text(),
                 mode="755", seen=(cluster.helpers.get(host.name), None) if host.name in cluster.helpers else None,
                 active=engines)
    # with a rolling change, each replica gets its files in its own step of the roll (start phase): a roll that
    # stops leaves the replicas after it on the files they run
    rolled = {g for wave in r.waves() for g in wave} if r.rolling else set()
    _write_files(ctx, [u for u in r.on_host(host.name) if u.group not in rolled], "")
    owner_and_mode(name="Unit and env files: owner and mode", units=r.on_host(host.name), installed=cluster.installed)


def _write_files(ctx: Context, units: list[UnitWork], step: str, when: Callable[[], bool] | None = None) -> None:
    """The next env file (0600) and systemd unit of each of ``units`` (on this host), where they differ from the
    live ones: written beside them (:func:`commands.staged_path`), never over them. The restart step records them
    as the group's revision and puts them in place (:func:`_swap`), so a run that stops before then (killed, a
    member that failed) leaves every node running, and healing restarting, a recorded revision. Only when no host
    of the unit's group failed an earlier step (and ``when`` holds)."""
    cluster = ctx.cluster
    assert cluster is not None
    cfg = ctx.rollout.vars.k3_config_dir
    for u in host.loop(units):
        have = cluster.installed.get((u.host, u.unit))
        ok = partial(_all, [partial(ctx.intact, [u.group]), *([when] if when else [])])
        managed_file(name=f"Env file (0600), staged{step}", dest=commands.staged_path(u.env_path, cfg),
                     content=u.env_text, mode="600", kind="env",
                     seen=(have.env_sha, have.env_text) if have else None, live=u.env_path, _if=ok)
        managed_file(name=f"systemd unit, staged{step}", dest=commands.staged_path(u.unit_path, cfg),
                     content=u.unit_text, mode="644", kind="unit",
                     seen=(have.unit_sha, have.unit_text) if have else None, live=u.unit_path, _if=ok)


def _all(conditions: list[Callable[[], bool]]) -> bool:
    return all(c() for c in conditions)


def _changed_files(cluster: Cluster, u: UnitWork) -> list[tuple[str, str]]:
    """``(staged, live)`` of the files of ``u`` this run changes (what :func:`_write_files` staged)."""
    have = cluster.installed.get((u.host, u.unit))
    cfg = cluster.require_rollout().vars.k3_config_dir
    return [(commands.staged_path(live, cfg), live) for live, text, sha in (
        (u.unit_path, u.unit_text, have.unit_sha if have else None),
        (u.env_path, u.env_text, have.env_sha if have else None)) if sha != sha256(text)]


def _swap(ctx: Context, groups: list[str]) -> str:
    """This host's part of putting ``groups``' new files in place, once their units are stopped: each changing
    group's revision is recorded first (copies of the files it will run: the staged ones where they change, the
    live ones where not, and its ``meta.json``), then the staged files move onto the live ones. A rollback records
    nothing: it goes back to a recorded revision."""
    r, cluster = ctx.rollout, ctx.cluster
    assert cluster is not None
    parts = []
    pairs: list[tuple[str, str]] = []
    for group in groups:
        mine = [u for u in r.group(group) if u.host == host.name]
        if not mine:
            continue
        changes = {live: staged for u in mine for staged, live in _changed_files(cluster, u)}
        pairs += [(staged, live) for live, staged in changes.items()]
        if group in ctx.numbers:
            files = [(changes.get(p, p), p.rsplit("/", 1)[-1]) for u in mine for p in (u.unit_path, u.env_path)]
            parts.append(commands.record_revision(revisions_dir(r.vars.k3_config_dir, group), ctx.numbers[group],
                                                  files, ctx.metas[group]))
    swap = commands.swap_in(pairs)
    # record_revision ends with a here-document: the swap goes on the line after it
    return "\n".join([*(f"{{ {p}\n}}" for p in parts), swap]) if parts and swap else (swap or "\n".join(parts))


def _revision_meta(cluster: Cluster, group: str, number: int) -> str:
    """The ``meta.json`` of revision ``number`` of ``group``: what runs, from which variables, by which version."""
    r = cluster.require_rollout()
    first = cluster.target.resolved[cluster.target.records[0].name]
    variables = {k: f"{item['value']!r} ({item['from']})" for k, item in first.listing().items()
                 if k.startswith("k3_") and k not in PER_HOST}
    rev = revision_for(r, group, number, created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       variables=variables, version=version("k3deploy"), tag=cluster.pinned_tag or "")
    return rev.to_json()


@deploy("Start")
def start_phase(ctx: Context) -> None:
    r = ctx.rollout
    cluster = ctx.cluster
    assert cluster is not None
    seen = {u.unit: have.active for u in r.on_host(host.name)
            if (have := cluster.installed.get((u.host, u.unit))) is not None}
    waves = r.waves()
    router = next((u for u in r.units if u.group == "router"), None)
    missing = r.missing_from_router()
    if not waves and not missing:
        host.noop("every group runs the planned version: nothing restarts")
    if missing and router is not None:   # called only when there is something to do (on the router's host)
        urls = r.serving_urls(missing)
        script(name=f"Put serving replicas the router left out back in ({', '.join(missing) or 'none'})",
               text=commands.router_add(router.serves or "", urls, r.ready_timeout),
               active=bool(urls) and host.name == router.host)
    for i, wave in enumerate(host.loop(waves)):
        plan = r.start_plan(set(wave))
        me = plan.on(host.name)
        earlier = [g for w in waves[:i] for g in w]
        rolling = r.rolling and router is not None
        # a step starts only once every earlier step's replicas serve and are back in the router: a replica that
        # fails (or a router call that fails) stops the roll
        # ... and only when no member of its groups failed an earlier step (decided once, for every host)
        begins = partial(ctx.begins, i, list(wave))
        go = partial(_all, [partial(ctx.step_ok, earlier, [f"add {j}" for j in range(i)] if rolling else []),
                            begins])
        # the replica is restarted only once the router no longer sends it requests
        ready = partial(_all, [partial(ctx.step_ok, earlier, [*(f"add {j}" for j in range(i)), f"remove {i}"]),
                               begins]) if rolling else go
        step = f" ({', '.join(wave)}, step {i + 1} of {len(waves)})" if r.rolling else ""
        urls = r.serving_urls(wave)
        if rolling and router is not None:
            python.call(name=f"Take the replica out of the router{step}", function=_router_call, ctx=ctx,
                        key=f"remove {i}", text=commands.router_remove(router.serves or "", urls),
                        _if=partial(_both, host.name == router.host, go))
            draining = [u.serves for g in wave for u in r.group(g) if u.serves and u.host == host.name]
            script(name=f"Let its in-flight requests finish{step}", text=" && ".join(
                commands.drain(url, r.vars.k3_drain_timeout, r.vars.k3_poll_interval) for url in draining),
                active=bool(draining), _if=ready, _timeout=r.vars.k3_drain_timeout + r.vars.k3_link_timeout)
            _write_files(ctx, [u for u in r.on_host(host.name) if u.group in wave], step, when=ready)
        # a change anywhere in a group restarts the whole group: router, workers, then heads
        if "router" in r.groups:
            stop_units(name="Stop routers of restarting groups", units=me.routers, active=bool(me.routers),
                       seen=seen, _if=ready)
        stop_units(name=f"Stop workers of restarting groups{step}", units=me.workers, active=bool(me.workers),
                   seen=seen, _if=ready)
        stop_units(name=f"Stop heads of restarting groups{step}", units=me.heads, active=bool(me.heads), seen=seen,
                   _if=ready)
        swap = _swap(ctx, list(wave))
        script(name=f"Record the new revision, put its files in place{step}", text=swap, active=bool(swap),
               _if=ready)
        start_units(name=f"Start group heads{step}", units=me.heads, active=bool(me.heads), _if=ready)
        wait_tcp(name=f"Head rendezvous port accepts connections (from each worker){step}", targets=me.joins,
                 timeout=r.vars.k3_rendezvous_timeout, _if=ready,
                 _timeout=r.vars.k3_rendezvous_timeout + r.vars.k3_link_timeout)
        start_units(name=f"Start workers{step}", units=me.workers, active=bool(me.workers), _if=ready)
        groups = sorted({u.group for u in r.on_host(host.name) if u.group in plan.engine_groups})
        python.call(name=f"Engine groups serve (health, models){step}", function=_gate, ctx=ctx, groups=groups,
                    _if=partial(_both, bool(groups), ready))
        engines_serve = partial(ctx.step_ok, [*earlier, *plan.engine_groups],
                                [*(f"add {j}" for j in range(i)), f"remove {i}"] if rolling else [])
        if rolling and router is not None:
            python.call(name=f"Put the replica back into the router{step}", function=_router_call, ctx=ctx,
                        key=f"add {i}", text=commands.router_add(router.serves or "", urls, r.ready_timeout),
                        _if=partial(_both, host.name == router.host, engines_serve))
        elif "router" in r.groups:
            start_units(name="Start router", units=me.routers, active=bool(me.routers), _if=engines_serve)
            python.call(name="Router serves", function=_gate, ctx=ctx, groups=["router"] if me.routers else [],
                        _if=partial(_both, bool(me.routers), engines_serve))
    _record(ctx)


def _router_call(state: Any, host: Any, ctx: Context, key: str, text: str) -> bool:
    """Run a router call (take replicas out, put them back) on the router's host; the roll goes on only if it
    succeeded (``ctx.router_calls[key]``)."""
    from k3deploy.runtime.readiness import run

    ok, out = run({host.name: host}, host.name, text)
    for line in out.splitlines():
        (logger.info if ok else logger.error)(f"[{host.name}] {line}")
    if not ok:
        logger.error(f"[{host.name}] the router call failed: the roll stops here; the replicas not yet rolled keep "
                     "serving")
    ctx.router_calls[key] = ok
    return ok


def _both(here: bool, condition: Callable[[], bool]) -> bool:
    """An ``_if``: this host takes part and ``condition`` holds (evaluated when the operation runs)."""
    return here and condition()


def _gate(state: Any, host: Any, ctx: Context, groups: list[str]) -> bool:
    """Every host of a restarting group waits for the group's readiness (the first to ask polls, for all of
    them); the host whose unit failed reports what it observed and fails, the others say why they stop."""
    hosts = {h.name: h for h in state.inventory}
    ok = True
    for g in groups:
        with _lock:
            first = g not in ctx.gates
            if first:
                ctx.gates[g] = gevent.event.AsyncResult()
        if first:
            ctx.gates[g].set(wait_group(ctx.rollout, g, hosts))
        failure: Failure | None = ctx.gates[g].get()
        if failure is None:
            continue
        if failure.host == host.name:
            for line in failure.report().splitlines():
                logger.error(f"[{host.name}] {line}")
            logger.error(f"[{host.name}] group {g} is stopped; it runs no half-started version. The revisions it "
                         f"ran before: k3deploy history INVENTORY (roll back with --data k3_rollback=true)")
            ok = False
        else:
            logger.warning(f"[{host.name}] group {g} stopped because {failure.unit.node.role} rank "
                           f"{failure.unit.rank} on {failure.host} failed (reported there)")
    return ok


def _record(ctx: Context) -> None:
    """Once a restarted group serves, on each of its hosts: the revision it runs becomes the current one (the one
    recorded at its restart, or, after a rollback, the revision it went back to). A group that restarted with files
    unchanged (a member had stopped) stays on its current revision."""
    r, cluster = ctx.rollout, ctx.cluster
    assert cluster is not None
    # a group that did not restart records nothing on any host: no operation for it
    for group in host.loop([g for g in r.groups if g in r.changed_groups]):
        mine = [u for u in r.group(group) if u.host == host.name]
        d = revisions_dir(r.vars.k3_config_dir, group)
        number = ctx.marks.get(group)
        text = commands.set_current(d, number) if mine and number is not None else ""
        script(name=f"Mark the revision of group {group} current", text=text, active=bool(text),
               _if=partial(ctx.serves, group))


def _serving_revision(cluster: Cluster, group: str, numbers: dict[str, int]) -> int | None:
    """The revision a restarted group runs once it serves: the one it was rolled back to, the one this run records
    (``numbers``), or, when its files did not change, the recorded revision with exactly these files (a run that was
    stopped after putting them in place left it unmarked); None: the current one already."""
    r = cluster.require_rollout()
    if group in cluster.rollback_to:
        return cluster.rollback_to[group]
    if group in numbers:
        return numbers[group]
    history = cluster.history.get(group)
    if history is None:
        return None
    want = {f"{u.host}:{p}": sha256(text) for u in r.group(group)
            for p, text in ((u.unit_path, u.unit_text), (u.env_path, u.env_text))}
    same = [n for n, rev in history.revisions.items() if rev.files == want]
    return max(same) if same and max(same) != history.current else None


def _smoke_model(r: Rollout) -> str:
    engines = [u for u in r.units if u.group != "router"]
    return served_model_name(engines[0].node.argv, r.plan.model) if engines else r.plan.model


@deploy("Smoke test")
def smoke_phase(ctx: Context) -> None:
    r = ctx.rollout
    if host.name != r.units[0].host:
        return  # one request through the public endpoint, from the first host only
    every_group_serves = lambda: all(ctx.serves(g) for g in r.groups)  # noqa: E731
    smoke(name=f"Chat completion through {r.endpoint}", endpoint=r.endpoint, model=_smoke_model(r),
          active=r.vars.k3_smoke_test, _if=every_group_serves, _timeout=150 + r.vars.k3_link_timeout)
    if ctx.cluster is not None and ctx.cluster.rollback_to:
        python.call(name="Say what the rollback leaves behind", function=_after_rollback, ctx=ctx,
                    _if=every_group_serves)


def _after_rollback(ctx: Context) -> None:
    cluster = ctx.cluster
    assert cluster is not None
    for group, number in cluster.rollback_to.items():
        if group not in ctx.rollout.changed_groups:
            continue
        h = cluster.history[group]
        newest = max(h.numbers)
        wanted = (f"revision {newest}'s settings" + ("" if h.served(newest) else " (a change that never served)")
                  if newest > number else "the revision it went back to")
        logger.warning(f"k3deploy: group {group} now runs revision {number} (rolled back). The variables "
                       f"(group_vars, inventory) still describe {wanted}: the next run without k3_rollback goes "
                       "forward to them again; change them to stay on this revision")
