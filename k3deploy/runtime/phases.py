"""The phases of ``deploy/k3.py`` as pyinfra ``@deploy`` functions, and the cluster context they share.

The context is computed once per run (first host to ask; the others wait for it): inventory -> variables ->
plan -> preflight facts and checks -> derived host settings -> rendered units and env files -> observed state
-> which groups restart. Every phase then calls its operations from one call site on every host, with an
``active`` flag, so pyinfra's cross-host ordering follows the rendezvous rules (pyinfra orders ops by call
site, not by host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gevent.lock
from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.facts.files import FileContents, Sha256File
from pyinfra.operations import python

from k3deploy.cluster.binding import HostRecord
from k3deploy.cluster.inventory import plan_for, records_of, variables_for
from k3deploy.cluster.rollout import Rollout, compute, mark_changes
from k3deploy.cluster.variables import Variables, inventory_path_from_argv
from k3deploy.errors import K3Error
from k3deploy.facts.rollout import UnitState
from k3deploy.runtime.operations import image, managed_file, smoke_test, start_units, stop_units, wait_tcp, weights
from k3deploy.runtime.readiness import wait_group

_lock = gevent.lock.RLock()
_contexts: dict[int, Context] = {}


@dataclass
class Context:
    rollout: Rollout | None
    vars: Variables | None
    failures: dict[str, list[str]] = field(default_factory=dict)   # host -> preflight failures
    error: str | None = None                                          # an inventory/selection error
    preflight_rows: list[Any] = field(default_factory=list)
    rollback: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failures


def _preflight(r: Rollout, records: list[HostRecord]) -> tuple[dict[str, list[str]], dict[str, dict[str, str]], dict[str, str], list[Any]]:
    """Run the preflight checks over every host; returns failures, derived env and interfaces per host."""
    import gevent

    from k3deploy.preflight import runner
    from k3deploy.preflight.checks import run_checks
    from k3deploy.preflight.settings import derive_settings

    sel = runner.selection_for_plan(r.plan, r.vars.k3_recipe)
    hosts = list(inventory)
    real_state = ctx_state.get()  # the State object itself, not pyinfra's context proxy
    jobs = [gevent.spawn(runner.host_facts, real_state, h, sel, r.vars.k3_model_cache)
            for h in hosts]
    gevent.joinall(jobs)
    facts = [j.value for j in jobs]
    results = run_checks(sel, facts)
    failures: dict[str, list[str]] = {}
    for res in results:
        if res.status == "fail":
            failures.setdefault(res.host, []).append(f"{res.check}: observed {res.observed}; required {res.required}; fix: {res.fix}")
    host_env: dict[str, dict[str, str]] = {}
    ifaces: dict[str, str] = {}
    for f in facts:
        s = derive_settings(sel, f)
        host_env[f.host] = dict(s.env)
        iface = r.vars.k3_iface or s.env.get("NCCL_SOCKET_IFNAME")
        if iface:
            ifaces[f.host] = iface
    return failures, host_env, ifaces, results


def context() -> Context:
    """The run's shared context (computed by the first host that asks)."""
    key = id(ctx_state.get())
    with _lock:
        if key in _contexts:
            return _contexts[key]
        ctx = _build()
        _contexts[key] = ctx
        return ctx


def _build() -> Context:
    records = records_of(inventory)
    try:
        v = variables_for(records, inventory_path_from_argv())
        plan = plan_for(records, v)
        for w in plan.warnings:
            logger.warning(f"k3deploy: {w}")
        rollout = compute(plan, records, v)  # validates the inventory against the plan before any fact is read
    except K3Error as exc:
        return Context(None, None, error=str(exc))

    rollback = v.k3_rollback
    failures, host_env, ifaces, rows = _preflight(rollout, records)
    rollout = compute(plan, records, v, ifaces=ifaces, host_env=host_env)
    hosts = {h.name: h for h in inventory}
    if rollback:
        err = _load_previous(rollout, hosts)
        if err:
            return Context(None, v, error=err)
    observed = {}
    for u in rollout.units:
        h = hosts[u.host]
        observed[(u.host, u.unit)] = (h.get_fact(Sha256File, path=u.unit_path), h.get_fact(Sha256File, path=u.env_path),
                                      h.get_fact(UnitState, unit=u.unit).running)
    mark_changes(rollout, observed)
    return Context(rollout, v, failures=failures, preflight_rows=rows, rollback=rollback)


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
    assert r is not None
    v = r.vars
    mine = r.on_host(host.name)
    engines = [u for u in mine if u.group != "router"]
    if engines:
        image(name=f"Image {r.plan.image}", image=r.plan.image, docker=v.k3_docker)
    token = None
    if v.k3_hf_token_file and engines:
        token = v.k3_config_dir.rstrip("/") + "/hf-token"
        from pathlib import Path

        managed_file(name="Hugging Face token (0600)", dest=token, content=Path(v.k3_hf_token_file).read_text(),
                     mode="600", secret=True)
    first_host = r.units[0].host
    weights(name=f"Weights of {r.plan.model}", model=r.plan.model, cache=v.k3_model_cache, image=r.plan.image,
            docker=v.k3_docker, token_file=token, download=v.k3_download_weights,
            active=bool(engines) and (not v.k3_weights_shared or host.name == first_host))


@deploy("Configure")
def configure_phase(ctx: Context) -> None:
    r = ctx.rollout
    assert r is not None
    prev = r.vars.k3_config_dir.rstrip("/") + "/previous"
    for u in host.loop(r.on_host(host.name)):
        managed_file(name="Env file (0600)", dest=u.env_path, content=u.env_text, mode="600", backup_dir=prev)
        managed_file(name="systemd unit", dest=u.unit_path, content=u.unit_text, mode="644", backup_dir=prev)


@deploy("Start")
def start_phase(ctx: Context) -> None:
    r = ctx.rollout
    assert r is not None
    changed = r.changed_groups
    mine = [u for u in r.on_host(host.name) if u.group in changed]
    engines = [u for u in mine if u.group != "router"]
    heads = [u.unit for u in engines if u.is_group_head]
    workers = [u for u in engines if not u.is_group_head]
    routers = [u.unit for u in mine if u.group == "router"]
    if not changed:
        host.noop("every group runs the planned version: nothing restarts")
    # a change anywhere in a group restarts the whole group: router, workers, then heads
    stop_units(name="Stop routers of restarting groups", units=routers, active=bool(routers))
    stop_units(name="Stop workers of restarting groups", units=[u.unit for u in workers], active=bool(workers))
    stop_units(name="Stop heads of restarting groups", units=heads, active=bool(heads))
    start_units(name="Start group heads", units=heads, active=bool(heads))
    join = workers[0].join if workers and workers[0].join else None
    wait_tcp(name="Head rendezvous port accepts connections (from each worker)",
             address=join[0] if join else "", port=join[1] if join else 0,
             timeout=r.vars.k3_rendezvous_timeout, active=join is not None)
    start_units(name="Start workers", units=[u.unit for u in workers], active=bool(workers))
    gated = [u.group for u in engines if u.is_group_head]
    python.call(name="Engine groups serve (health, models)", function=_gate, rollout=r, groups=gated,
                _if=lambda: bool(gated))
    start_units(name="Start router", units=routers, active=bool(routers))
    python.call(name="Router serves", function=_gate, rollout=r, groups=["router"] if routers else [],
                _if=lambda: bool(routers))


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
    assert r is not None
    smoke_test(name=f"Chat completion through {r.endpoint}", endpoint=r.endpoint, model=r.plan.model,
               active=r.vars.k3_smoke_test and host.name == r.units[0].host)
