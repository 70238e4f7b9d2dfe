"""The phases of ``deploy/k3.py`` as pyinfra ``@deploy`` functions, and the cluster context they share.

The context is built once per run (first host to ask; the others wait for it) by the one pipeline,
:func:`k3deploy.runtime.gather.gather_in_run`: inventory -> variables -> plan -> preflight facts and checks ->
derived host settings -> rendered units and env files -> installed state -> which groups restart. Every phase then
calls its operations from one call site on every host, with an ``active`` flag, so pyinfra's cross-host ordering
follows the rendezvous rules (pyinfra orders ops by call site, not by host).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent.lock
from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.facts.files import FileContents
from pyinfra.operations import python

from k3deploy.cluster.rollout import Rollout, mark_changes
from k3deploy.cluster.variables import inventory_path_from_argv
from k3deploy.errors import K3Error
from k3deploy.recipe.argv import served_model_name
from k3deploy.runtime.gather import Cluster, gather_in_run
from k3deploy.runtime.operations import image, managed_file, smoke, start_units, stop_units, wait_tcp, weights
from k3deploy.runtime.readiness import wait_group

_lock = gevent.lock.RLock()
_contexts: dict[int, Context] = {}


@dataclass
class Context:
    cluster: Cluster | None
    error: str | None = None          # an inventory/selection error: nothing can be planned
    rollback: bool = False

    @property
    def rollout(self) -> Rollout:
        assert self.cluster is not None and self.cluster.rollout is not None
        return self.cluster.rollout

    @property
    def failures(self) -> dict[str, list[str]]:
        """Host -> its failed preflight checks, one line each."""
        report = self.cluster.preflight if self.cluster else None
        if report is None:
            return {}
        return {h: [f.line() for f in fs] for h, fs in report.failures_by_host().items()}

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failures


def context() -> Context:
    """The run's shared context (computed by the first host that asks)."""
    state = ctx_state.get()
    key = id(state)
    with _lock:
        if key not in _contexts:
            _contexts[key] = _build(state)
        return _contexts[key]


def _build(state: Any) -> Context:
    try:
        cluster = gather_in_run(state, inventory_path_from_argv())
    except K3Error as exc:
        return Context(None, error=str(exc))
    r = cluster.require_rollout()
    for w in r.plan.warnings:
        logger.warning(f"k3deploy: {w}")
    rollback = r.vars.k3_rollback
    if rollback:
        err = _load_previous(r, {h.name: h for h in state.inventory})
        if err:
            return Context(None, error=err)
    mark_changes(r, cluster.installed)
    return Context(cluster, rollback=rollback)


def _load_previous(r: Rollout, hosts: dict[str, Any]) -> str | None:
    """Rollback: the desired files become the previous versions kept in ``<k3_config_dir>/previous``.

    A file without a previous version (it did not change in the last rollout) keeps its current content.
    """
    prev = r.vars.k3_config_dir.rstrip("/") + "/previous"
    found = 0
    for u in r.units:
        h = hosts[u.host]
        for attr, live in (("unit_text", u.unit_path), ("env_text", u.env_path)):
            old = h.get_fact(FileContents, path=f"{prev}/{live.rsplit('/', 1)[-1]}")
            if old is None:
                old = h.get_fact(FileContents, path=live)
            else:
                found += 1
            if old is None:
                return f"nothing to roll back to on {u.host}: neither {live} nor a previous version exists"
            setattr(u, attr, "\n".join(old) + "\n")
    if not found:
        return f"nothing to roll back to: no previous unit or env file in {prev} on any host"
    return None


# ------------------------------------------------------------------------------------------------ phases


def _fail(message: str) -> None:
    def report(state: Any, host: Any) -> bool:
        for line in message.splitlines():
            logger.error(f"[{host.name}] {line}")
        return False

    python.call(name="k3deploy cannot proceed: nothing is changed", function=report)


@deploy("Preflight")
def preflight_phase(ctx: Context) -> None:
    if ctx.error:
        _fail(f"k3deploy: {ctx.error}")
        return
    mine = ctx.failures.get(host.name, [])
    if mine:
        _fail("preflight failed, nothing was changed:\n" + "\n".join(mine))
    elif ctx.failures:
        _fail("preflight failed on " + ", ".join(sorted(ctx.failures)) + ": nothing was changed on any node")


@deploy("Stage")
def stage_phase(ctx: Context) -> None:
    r = ctx.rollout
    v = r.vars
    mine = r.on_host(host.name)
    engines = [u for u in mine if u.group != "router"]
    if engines:
        image(name=f"Image {r.plan.image}", image=r.plan.image, docker=v.k3_docker)
    token = None
    if v.k3_hf_token_file and engines:
        token = v.k3_config_dir.rstrip("/") + "/hf-token"
        managed_file(name="Hugging Face token (0600)", dest=token, content=Path(v.k3_hf_token_file).read_text(),
                     mode="600", secret=True)
    first_host = r.units[0].host
    weights(name=f"Weights of {r.plan.model}", model=r.plan.model, cache=v.k3_model_cache, image=r.plan.image,
            docker=v.k3_docker, token_file=token, download=v.k3_download_weights,
            active=bool(engines) and (not v.k3_weights_shared or host.name == first_host))


@deploy("Configure")
def configure_phase(ctx: Context) -> None:
    r = ctx.rollout
    prev = r.vars.k3_config_dir.rstrip("/") + "/previous"
    for u in host.loop(r.on_host(host.name)):
        managed_file(name="Env file (0600)", dest=u.env_path, content=u.env_text, mode="600", backup_dir=prev)
        managed_file(name="systemd unit", dest=u.unit_path, content=u.unit_text, mode="644", backup_dir=prev)


@deploy("Start")
def start_phase(ctx: Context) -> None:
    r = ctx.rollout
    plan = r.start_plan()
    me = plan.on(host.name)
    if plan.empty:
        host.noop("every group runs the planned version: nothing restarts")
    # a change anywhere in a group restarts the whole group: router, workers, then heads
    stop_units(name="Stop routers of restarting groups", units=me.routers, active=bool(me.routers))
    stop_units(name="Stop workers of restarting groups", units=me.workers, active=bool(me.workers))
    stop_units(name="Stop heads of restarting groups", units=me.heads, active=bool(me.heads))
    start_units(name="Start group heads", units=me.heads, active=bool(me.heads))
    wait_tcp(name="Head rendezvous port accepts connections (from each worker)", targets=me.joins,
             timeout=r.vars.k3_rendezvous_timeout)
    start_units(name="Start workers", units=me.workers, active=bool(me.workers))
    gated = [u.group for u in r.on_host(host.name) if u.is_group_head and u.group in plan.engine_groups]
    python.call(name="Engine groups serve (health, models)", function=_gate, rollout=r, groups=gated,
                _if=lambda: bool(gated))
    start_units(name="Start router", units=me.routers, active=bool(me.routers))
    python.call(name="Router serves", function=_gate, rollout=r, groups=["router"] if me.routers else [],
                _if=lambda: bool(me.routers))


def _gate(state: Any, host: Any, rollout: Rollout, groups: list[str]) -> bool:
    hosts = {h.name: h for h in state.inventory}
    ok = True
    for g in groups:
        failure = wait_group(rollout, g, hosts)
        if failure is not None:
            for line in failure.report().splitlines():
                logger.error(f"[{host.name}] {line}")
            logger.error(f"[{host.name}] group {g} stopped; previous unit and env files are kept in "
                         f"{rollout.vars.k3_config_dir}/previous (roll back with --data k3_rollback=true)")
            ok = False
    return ok


@deploy("Smoke test")
def smoke_phase(ctx: Context) -> None:
    r = ctx.rollout
    engines = [u for u in r.units if u.group != "router"]
    model = served_model_name(engines[0].node.argv, r.plan.model) if engines else r.plan.model
    active = r.vars.k3_smoke_test and host.name == r.units[0].host
    smoke(name=f"Chat completion through {r.endpoint}", endpoint=r.endpoint, model=model, active=active)
