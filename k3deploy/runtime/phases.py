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

from k3deploy.cluster import commands
from k3deploy.cluster.images import holds, named, run_ref
from k3deploy.cluster.revisions import revision_for, revisions_dir
from k3deploy.cluster.rollout import Rollout, UnitWork, mark_changes
from k3deploy.cluster.staging import (
    ARCHIVE,
    OUTSIDE,
    StagePlan,
    addresses,
    peers_config,
    peers_config_path,
    stage_for,
    summary,
)
from k3deploy.cluster.staging import engines as stage_engines
from k3deploy.cluster.units import GROUP_MEMBER, group_member_text
from k3deploy.cluster.variables import inventory_path_from_argv
from k3deploy.errors import K3Error
from k3deploy.preflight.checks import CLUSTER
from k3deploy.recipe.argv import served_model_name
from k3deploy.runtime import oporder
from k3deploy.runtime.gather import Cluster, connector_drift, gather_in_run
from k3deploy.runtime.operations import (
    from_control,
    managed_file,
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
    gates: dict[str, gevent.event.AsyncResult] = field(default_factory=dict)   # group -> its readiness result
    router_calls: dict[str, bool] = field(default_factory=dict)   # "remove N" / "add N" of a roll -> it succeeded

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


def context() -> Context:
    """The run's shared context (computed by the first host that asks)."""
    state = ctx_state.get()
    key = id(state)
    with _lock:
        if key not in _contexts:
            _contexts[key] = _build(state)
        return _contexts[key]


def _refuse(lines: list[str], summary: str, exit_code: int) -> Context:
    """Print the reasons once (every host shares the context) and refuse the run."""
    for line in lines:
        logger.error(line)
    logger.error(f"--> k3deploy: {summary}")
    return Context(None, Refused(summary, exit_code))


def _build(state: Any) -> Context:
    try:
        cluster = gather_in_run(state, inventory_path_from_argv())
    except K3Error as exc:
        return _refuse([], f"{exc}; nothing was changed", exc.exit_code)
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
                              "INVENTORY shows every check)", 1)
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
    return Context(cluster)


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
    managed_file(name="Hugging Face token (0600)", dest=token or "", content=Path(v.k3_hf_token_file).read_text()
                 if v.k3_hf_token_file else "", mode="600", kind="secret",
                 active=bool(token) and me in stage_engines(r))
    if not _stages(sp):
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


def _write_files(ctx: Context, units: list[UnitWork], step: str, **global_args: Any) -> None:
    """The env file (0600) and the systemd unit of each of ``units`` (on this host)."""
    cluster = ctx.cluster
    assert cluster is not None
    for u in host.loop(units):
        have = cluster.installed.get((u.host, u.unit))
        managed_file(name=f"Env file (0600){step}", dest=u.env_path, content=u.env_text, mode="600", kind="env",
                     seen=(have.env_sha, have.env_text) if have else None, **global_args)
        managed_file(name=f"systemd unit{step}", dest=u.unit_path, content=u.unit_text, mode="644", kind="unit",
                     seen=(have.unit_sha, have.unit_text) if have else None, **global_args)


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
        go = partial(ctx.step_ok, earlier, [f"add {j}" for j in range(i)] if rolling else [])
        # the replica is restarted only once the router no longer sends it requests
        ready = partial(ctx.step_ok, earlier, [*(f"add {j}" for j in range(i)), f"remove {i}"]) if rolling else go
        step = f" ({', '.join(wave)}, step {i + 1} of {len(waves)})" if r.rolling else ""
        urls = r.serving_urls(wave)
        if rolling and router is not None:
            python.call(name=f"Take the replica out of the router{step}", function=_router_call, ctx=ctx,
                        key=f"remove {i}", text=commands.router_remove(router.serves or "", urls),
                        _if=partial(_both, host.name == router.host, go))
            draining = [u.serves for g in wave for u in r.group(g) if u.serves and u.host == host.name]
            script(name=f"Let its in-flight requests finish{step}", text=" && ".join(
                commands.drain(url, r.vars.k3_drain_timeout, r.vars.k3_poll_interval) for url in draining),
                active=bool(draining), _if=ready)
            _write_files(ctx, [u for u in r.on_host(host.name) if u.group in wave], step, _if=ready)
        # a change anywhere in a group restarts the whole group: router, workers, then heads
        if "router" in r.groups:
            stop_units(name="Stop routers of restarting groups", units=me.routers, active=bool(me.routers),
                       seen=seen, _if=ready)
        stop_units(name=f"Stop workers of restarting groups{step}", units=me.workers, active=bool(me.workers),
                   seen=seen, _if=ready)
        stop_units(name=f"Stop heads of restarting groups{step}", units=me.heads, active=bool(me.heads), seen=seen,
                   _if=ready)
        start_units(name=f"Start group heads{step}", units=me.heads, active=bool(me.heads), _if=ready)
        wait_tcp(name=f"Head rendezvous port accepts connections (from each worker){step}", targets=me.joins,
                 timeout=r.vars.k3_rendezvous_timeout, _if=ready)
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
    """Once a restarted group serves: on each of its hosts, keep what runs as the group's next revision (or, after
    a rollback, mark the revision it went back to as the current one)."""
    r, cluster = ctx.rollout, ctx.cluster
    assert cluster is not None
    # a group that did not restart records nothing on any host: no operation for it
    for group in host.loop([g for g in r.groups if g in r.changed_groups]):
        mine = [u for u in r.group(group) if u.host == host.name]
        history = cluster.history.get(group)
        active = bool(mine) and group in r.changed_groups and history is not None
        d = revisions_dir(r.vars.k3_config_dir, group)
        if not active or history is None:
            text = ""
        elif group in cluster.rollback_to:
            text = commands.set_current(d, cluster.rollback_to[group])
        else:
            number = history.next_number()
            first = cluster.target.resolved[cluster.target.records[0].name]
            variables = {k: f"{item['value']!r} ({item['from']})" for k, item in first.listing().items()
                         if k.startswith("k3_") and k not in PER_HOST}
            rev = revision_for(r, group, number, created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                               variables=variables, version=version("k3deploy"), tag=cluster.pinned_tag or "")
            files = [p for u in mine for p in (u.unit_path, u.env_path)]
            text = commands.record_revision(d, number, files, rev.to_json())
        script(name=f"Record the revision of group {group}", text=text, active=bool(text),
               _if=partial(ctx.serves, group))


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
          active=r.vars.k3_smoke_test, _if=every_group_serves)
    if ctx.cluster is not None and ctx.cluster.rollback_to:
        python.call(name="Say what the rollback leaves behind", function=_after_rollback, ctx=ctx,
                    _if=every_group_serves)


def _after_rollback(ctx: Context) -> None:
    cluster = ctx.cluster
    assert cluster is not None
    for group, number in cluster.rollback_to.items():
        if group not in ctx.rollout.changed_groups:
            continue
        newest = max(cluster.history[group].numbers)
        wanted = (f"revision {newest}'s settings" if newest > number else
                  "the change that did not come up (it was never recorded as a revision)")
        logger.warning(f"k3deploy: group {group} now runs revision {number} (rolled back). The variables "
                       f"(group_vars, inventory) still describe {wanted}: the next run without k3_rollback goes "
                       "forward to them again; change them to stay on this revision")
