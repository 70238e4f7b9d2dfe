"""The one pipeline every entry point uses: inventory -> variables -> plan -> host facts and checks -> derived
settings -> rendered files -> what the hosts have installed.

``deploy/k3.py`` (:func:`gather_in_run`, inside pyinfra's own run), ``k3deploy plan``, ``preflight``, ``runbook``
and ``resolve --inventory`` (:func:`gather`) all build their :class:`Cluster` here, so they cannot read one
inventory two ways. Hosts are read in parallel (gevent greenlets over pyinfra's connections) and never changed.

Example::

    >>> cluster = gather("inventories/gb300.py")            # doctest: +SKIP
    >>> cluster.preflight.ok, cluster.rollout.endpoint       # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import gevent
from pyinfra.api import Config, State
from pyinfra.api.exceptions import ConnectError
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state
from pyinfra.facts.files import File, FileContents

from k3deploy.errors import K3Error
from k3deploy.facts.rollout import (
    Executable,
    FileHash,
    ImageDigest,
    RegistryDigest,
    Revisions,
    UnitOnHost,
    WeightsState,
    WeightsStatus,
)
from k3deploy.facts.status import (
    DeployLock,
    EndpointModels,
    HealthCode,
    RouterWorkers,
    UnitLogs,
    UnitRun,
    UnitRuntime,
)
from k3deploy.model import images as image_pins
from k3deploy.model.diff import Installed
from k3deploy.model.images import LocalImage, Resolution
from k3deploy.model.inventory import records_of
from k3deploy.model.observed import token_path
from k3deploy.model.pipeline import Target, desired_rollout, target
from k3deploy.model.revisions import GroupHistory, combine, revisions_dir, rollback_target, runs
from k3deploy.model.rollout import Rollout
from k3deploy.model.staging import StagePlan, engines, stage_for
from k3deploy.model.units import GROUP_MEMBER
from k3deploy.preflight import runner
from k3deploy.preflight.checks import CLUSTER, CheckResult, HostFacts
from k3deploy.preflight.report import PreflightReport, check
from k3deploy.runtime.lock import LockRecord, held_summary, read_locks

T = TypeVar("T")


# ------------------------------------------------------------------------------------- inventory


def load_inventory(spec: str) -> State:
    """A pyinfra state holding the inventory of a file, a host list or a connector (``@local``), read as the
    ``pyinfra`` command line reads it (its ``group_data`` included)."""
    from pyinfra_cli.inventory import make_inventory

    if not ("@" in spec or "," in spec or Path(spec).exists()):
        raise K3Error(f"inventory {spec!r} not found: pass an inventory file (inventories/x.py), a host list "
                      "or @local")
    cwd = str(Path.cwd())
    if cwd not in sys.path:  # inventory files may import modules next to them, as with the pyinfra CLI
        sys.path.append(cwd)
    state = State()
    state.cwd = cwd
    config = Config()
    try:
        with ctx_state.use(state), ctx_config.use(config):
            inventory = make_inventory(spec, cwd=cwd)
            state.init(inventory, config)
    except Exception as exc:  # the inventory file is user code
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise K3Error(f"cannot load inventory {spec!r}: {first}: fix the inventory file") from None
    if len(inventory) == 0:
        raise K3Error(f"inventory {spec!r} has no hosts: add hosts to it")
    return state


def inventory_file(spec: str | None) -> str | None:
    """The inventory's file when it is one (group_vars are looked up next to it), else None."""
    return spec if spec and spec.endswith(".py") and Path(spec).is_file() else None


# ------------------------------------------------------------------------------------ host access


def connect(host: Any, silent_after: int | None = None) -> str | None:
    """Connect one host (with :func:`bound_silence`); the reason when it cannot be reached, else None."""
    try:
        host.connect(raise_exceptions=True, show_errors=False)
    except ConnectError as exc:
        return str(exc.args[0]) if exc.args else "could not connect"
    except Exception as exc:  # paramiko/socket errors not wrapped by the connector
        return f"{type(exc).__name__}: {exc}"
    if silent_after:
        bound_silence(host, silent_after)
    return None


def bound_silence(host: Any, seconds: int) -> bool:
    """Make a host's SSH connection fail, instead of waiting forever, once its node has not answered for about
    ``seconds`` (a cut link, a node that froze): SSH keepalives every ``seconds / 3``, TCP keepalives on the
    socket, and ``TCP_USER_TIMEOUT`` (data sent and not acknowledged for ``seconds`` closes the connection). A command
    that was running there then ends with an error naming the host, and the run goes on with the other hosts.
    False when the host has no SSH connection (``@local``, ``@fake``)."""
    import socket

    client = getattr(getattr(host, "connector", None), "client", None)
    transport = client.get_transport() if client is not None else None
    sock: Any = getattr(transport, "sock", None)
    if transport is None or not hasattr(sock, "setsockopt"):
        return False
    transport.set_keepalive(max(1, seconds // 3))
    every = max(1, seconds // 6)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", every), ("TCP_KEEPINTVL", every), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", seconds * 1000)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in options:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:  # not a TCP socket (a proxy command)
            return False
    _lost_is_failure(host)
    return True


def _lost_is_failure(host: Any) -> None:
    """A connection that dies under a command fails that host, not the run: paramiko raises ``EOFError`` (or its
    own ``SSHException``) when the transport is gone, and pyinfra aborts the whole run on an ``EOFError``; here
    it becomes the ``OSError`` pyinfra reports as that host's failure."""
    connector = host.connector
    if getattr(connector, "_k3_guarded", False):
        return

    def guard(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except EOFError as exc:
                raise OSError(f"the SSH connection to {host.name} was lost (no answer within k3_link_timeout): "
                              f"{type(exc).__name__}") from exc
        return call

    for name in ("run_shell_command", "put_file", "get_file"):
        setattr(connector, name, guard(getattr(connector, name)))
    connector._k3_guarded = True


def each_host(state: State, hosts: list[Any], fn: Callable[[Any], T]) -> list[T]:
    """``fn(host)`` on every host at once (one greenlet each, in the state's contexts); results in host order.
    An exception in one host's call is raised after all have finished."""
    def run(h: Any) -> T:
        with ctx_state.use(state), ctx_config.use(state.config), ctx_inventory.use(state.inventory), \
                ctx_host.use(h):
            return fn(h)

    jobs = [gevent.spawn(run, h) for h in hosts]
    gevent.joinall(jobs)
    for h, j in zip(hosts, jobs, strict=True):
        if not j.successful():
            raise K3Error(f"reading {h.name} failed: {type(j.exception).__name__}: {j.exception}: check the "
                          "connection and rerun")
    return [j.value for j in jobs]


def disconnect(hosts: list[Any]) -> None:
    for h in hosts:
        if h.connected:
            try:
                h.disconnect()
            except Exception:  # a connection that already broke
                pass


def read_facts(state: State, hosts: list[Any], t: Target, *, connect_first: bool,
               extra: Callable[[str], list[Any]] | None = None) -> list[HostFacts]:
    """The preflight facts of every host, and ``extra(host)`` facts in the same command (an unreachable host
    becomes a host with its connection error)."""
    req, v = t.requirements, t.vars

    def one(h: Any) -> HostFacts:
        mine = t.host_vars(h.name)
        if connect_first:
            reason = connect(h, mine.k3_link_timeout)
            if reason is not None:
                return HostFacts(host=h.name, address=runner.host_address(h), unreachable=reason)
        return runner.host_facts(state, h, req, v.k3_model_cache, v.k3_image_dir, extra(h.name) if extra else None,
                                 ib_hca=mine.k3_ib_hca)

    return each_host(state, hosts, one)


def router_checks(read: list[HostFacts], path: str) -> list[CheckResult]:
    """The router host has the ``vllm-router`` command its unit runs (``k3_router_bin``), read with its facts."""
    out = []
    for f in read:
        if "router_bin" not in f.extra:
            continue
        if f.extra["router_bin"]:
            out.append(CheckResult(f.host, "router.command", "pass", f"{path} is executable",
                                   "the vllm-router command"))
        else:
            out.append(CheckResult(f.host, "router.command", "fail", f"{path} is missing or not executable on {f.host}",
                                   "the vllm-router command at k3_router_bin (the router unit's ExecStart)",
                                   "pip install vllm-router==0.1.17 on the router host, or set k3_router_bin to "
                                   "where it is (or k3_router_image to run it from an image)"))
    return out


def ascend_peer_round(state: State, hosts: list[Any], read: list[HostFacts], t: Target) -> list[CheckResult]:
    """Multi-node Ascend: the second round, once every host's NPU addresses are read: each host pings, from NPU i,
    NPU i of every other host (same-index pairs, what the RoCE plane connects; not every NPU pair), one command per
    host, all hosts at once; then ``ascend.peers`` per host (:func:`k3deploy.preflight.checks.peer_checks`)."""
    from k3deploy.facts import ascend
    from k3deploy.facts.batch import read_batch
    from k3deploy.preflight.checks import peer_checks, peer_targets

    req = t.requirements
    if req.brand != "Huawei" or not req.needs_rdma:
        return []
    targets = peer_targets(read)
    if not targets:
        return []
    by_name = {h.name: h for h in hosts}
    pinging = [by_name[name] for name in targets if name in by_name]

    def one(h: Any) -> Any:
        try:
            return read_batch(state, h, [("peers", ascend.HccnPing, {"targets": targets[h.name]})])["peers"]
        except Exception as exc:  # a dropped connection: the check says so
            return f"{type(exc).__name__}: {exc}"[:200]

    got = dict(zip([h.name for h in pinging], each_host(state, pinging, one), strict=True))
    return peer_checks(read, targets, got)


def nccl_probe(state: State, t: Target, r: Rollout, report: PreflightReport) -> list[CheckResult]:
    """``k3_nccl_probe``: the two-node NCCL all-reduce in the image on the planned engine nodes
    (:mod:`k3deploy.preflight.probe`), once every other check has passed (a node that fails them would fail it too,
    for a reason already shown); NVIDIA multi-node plans only."""
    from k3deploy.preflight.probe import CHECK, run_probe

    req = t.requirements
    engines = list(dict.fromkeys(u.host for u in r.units if u.group != "router"))
    if req.brand != "NVIDIA" or not req.needs_rdma or len(engines) < 2:
        return [CheckResult(CLUSTER, CHECK, "pass", "not run: no multi-node NCCL over RDMA in this plan",
                            "k3_nccl_probe: a two-node NCCL all-reduce where NCCL crosses nodes")]
    if not report.ok:
        return [CheckResult(CLUSTER, CHECK, "warn", "not run: other checks failed", "every other check passed first",
                            "fix the failures above, then rerun preflight")]
    hosts = {h.name: h for h in state.inventory}
    facts = [f for f in report.hosts if f.host in engines]
    return run_probe(state, hosts, facts, report.host_env(), t.vars.k3_docker, r.plan.image)


def image_resolver(r: Rollout) -> str | None:
    """The one host that asks the registry which build the image's tag names (the first engine host, which also
    fetches the image when no node holds it), or None when the image is not resolved (pinned already, an
    air-gapped archive, ``k3_image_resolve: false``, a rollback: the revision names its build)."""
    v = r.vars
    hosts = engines(r)
    if not hosts or v.k3_rollback is not False or not image_pins.to_resolve(r.plan.image, resolve=v.k3_image_resolve,
                                              archive=bool(v.k3_image_archive)):
        return None
    return hosts[0]


def image_check(res: image_pins.Resolution) -> CheckResult:
    """The preflight's record of the tag's resolution: the build every node of this rollout runs, or why the
    rollout cannot know it."""
    required = "the registry names the build of the image's tag (every node runs that one digest)"
    if res.digest:
        return CheckResult(res.host, "image.digest", "pass", f"{res.image} is {res.digest}", required)
    return CheckResult(res.host, "image.digest", "fail", f"{res.image}: {res.error}", required,
                       f"let {res.host} reach the registry with `docker buildx imagetools inspect {res.image}` "
                       "(the docker-buildx-plugin package), or pin the build: k3_image: REPO@sha256:<digest>; "
                       "k3_image_resolve: false runs the tag as each node has it (builds may differ)")


def registry_fact(r: Rollout) -> Any:
    """The digest the registry gives for the plan's image tag, read on the host that resolves it."""
    return ("registry", RegistryDigest, {"image": r.plan.image, "docker": r.vars.k3_docker})


def rollout_facts(r: Rollout, host: str, runtime: bool = False, logs: int = 0, health: bool = False,
                  resolve: bool = False) -> list[Any]:
    """What the rollout reads of a host, to go in the host's one command with its preflight facts: each unit (state
    and files), the image's digests there, the weights, and the revisions of every group with a unit here;
    with ``resolve`` the digest the registry gives for the image's tag; with ``runtime`` also each unit as it runs
    and, on the host of the public endpoint, what the endpoint lists; with ``health`` (the deploy and plan) only
    whether each serving unit's ``/health`` answers."""
    v = r.vars
    token = token_path(v.k3_config_dir) if v.k3_hf_token_file else None   # its owner and mode, with an engine's
    out: list[Any] = [(f"unit:{u.unit}", UnitOnHost, {"unit": u.unit, "unit_path": u.unit_path, "env_path": u.env_path,
                                                     "token_path": token if u.group != "router" else None})
                      for u in r.on_host(host)]
    if resolve:
        out.append(registry_fact(r))
    if any(u.group != "router" for u in r.on_host(host)):
        out += [("helper", FileHash, {"path": GROUP_MEMBER}),
                ("image", ImageDigest, {"image": r.plan.image, "docker": v.k3_docker}),
                ("weights", WeightsState, {"cache": v.k3_model_cache, "model": r.plan.model})]
    if any(u.group == "router" for u in r.on_host(host)) and not v.k3_router_image:
        out.append(("router_bin", Executable, {"path": v.k3_router_bin}))
    if len(r.replicas) > 1:   # which replicas the router sends requests to
        out += [("router_workers", RouterWorkers, {"router": u.serves}) for u in r.on_host(host)
                if u.group == "router" and u.serves]
    out.append(("lock", DeployLock, {"config_dir": v.k3_config_dir}))
    out += [(f"revisions:{g}", Revisions, {"directory": revisions_dir(v.k3_config_dir, g)})
            for g in r.groups if any(u.host == host for u in r.group(g))]
    if runtime:
        out += [(f"run:{u.unit}", UnitRuntime, {"unit": u.unit, "container": u.container, "docker": v.k3_docker,
                                              "url": u.serves}) for u in r.on_host(host)]
        if r.units and host == r.hosts[0]:
            out.append(("endpoint", EndpointModels, {"endpoint": r.endpoint}))
    elif health:
        out += [(f"health:{u.unit}", HealthCode, {"url": u.serves}) for u in r.on_host(host) if u.serves]
    if logs:
        out += [(f"logs:{u.unit}", UnitLogs, {"unit": u.unit, "container": u.container, "docker": v.k3_docker,
                                             "lines": logs}) for u in r.on_host(host)]
    return out


def ssh_argv(data: Mapping[str, Any], address: str) -> list[str]:
    """``ssh`` with the inventory's connection settings (user, port, key, known hosts)."""
    argv = ["ssh"]
    if data.get("ssh_port"):
        argv += ["-p", str(data["ssh_port"])]
    if data.get("ssh_key"):
        argv += ["-i", str(data["ssh_key"])]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    strict = data.get("ssh_strict_host_key_checking")
    if strict:
        argv += ["-o", f"StrictHostKeyChecking={strict}"]
    user = data.get("ssh_user")
    return argv + [f"{user}@{address}" if user else address]


# ---------------------------------------------------------------------------------------- cluster


@dataclass
class Cluster:
    """One inventory, read: its target (variables, requirements, plan), the preflight of its hosts, the rollout
    rendered with each host's derived settings, and what the hosts have installed now."""

    target: Target
    rollout: Rollout | None
    preflight: PreflightReport | None = None
    installed: dict[tuple[str, str], Installed] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)   # host -> ssh address
    ssh: dict[str, list[str]] = field(default_factory=dict)   # host -> ssh argv from the control machine
    history: dict[str, GroupHistory] = field(default_factory=dict)   # group -> its recorded revisions
    rollback_to: dict[str, int] = field(default_factory=dict)        # group -> the revision the rollout restores
    images: dict[str, LocalImage] = field(default_factory=dict)      # host -> what it holds of the image's repository
    resolution: Resolution | None = None   # the registry's digest for the image's tag (None: not asked)
    weights: dict[str, WeightsStatus] = field(default_factory=dict)  # host -> what its cache holds of the model
    stage: StagePlan | None = None     # how the image and the weights reach the nodes that lack them
    runs: dict[tuple[str, str], UnitRun] = field(default_factory=dict)   # (host, unit) -> as it runs (runtime=True)
    endpoint_models: tuple[str, ...] | None = None   # what the public endpoint lists (runtime=True)
    logs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)   # (host, unit) -> journal, container
    facts: list[HostFacts] = field(default_factory=list)   # what each host's facts said
    helpers: dict[str, str | None] = field(default_factory=dict)   # host -> sha256 of its k3-group-member (None: none)
    locks: dict[str, LockRecord] = field(default_factory=dict)     # host -> the deployment lock held there

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

    def require_rollout(self) -> Rollout:
        if self.rollout is None:
            self.target.require_plan()
            raise K3Error("no rollout")  # unreachable: a target with a plan always renders one
        return self.rollout


def _rollout(t: Target, report: PreflightReport | None) -> Rollout | None:
    if t.plan is None:
        return None
    if report is None:
        return desired_rollout(t)
    ifaces = {}
    for host, s in report.settings.items():
        iface = t.vars.k3_iface or s.env.get("GLOO_SOCKET_IFNAME")
        if iface:
            ifaces[host] = iface
    return desired_rollout(t, ifaces=ifaces, host_env=report.host_env())


def _assemble(state: State, t: Target, *, facts: bool, installed: bool, connect_first: bool,
              require_plan: bool, runtime: bool = False, logs: int = 0, health: bool = False,
              pin_image: bool = False) -> Cluster:
    if require_plan:
        t.require_plan()
    hosts = list(state.inventory)
    planned = desired_rollout(t) if t.plan is not None and (installed or (facts and pin_image)) else None
    resolver = image_resolver(planned) if planned is not None and facts else None
    extra: Callable[[str], list[Any]] | None = None
    if planned is not None and installed:
        extra = lambda name: rollout_facts(planned, name, runtime, logs, health, resolve=name == resolver)  # noqa: E731
    elif planned is not None and resolver is not None:
        # what the hosts run is not read (a runbook), but the build the tag names is: the runbook pins it too
        extra = lambda name: [registry_fact(planned)] if name == resolver else []  # noqa: E731
    read = read_facts(state, hosts, t, connect_first=connect_first, extra=extra) if facts else []
    report = check(t.requirements, read) if facts else None
    if report is not None:
        report.results += router_checks(read, t.vars.k3_router_bin)
        report.results += ascend_peer_round(state, hosts, read, t)
    resolution = None
    asked = next((f for f in read if f.host == resolver and f.unreachable is None), None)
    if asked is not None and report is not None and t.plan is not None:
        # one build for the whole rollout: every unit, the stage and the revision use the digest the tag names now
        resolution = image_pins.resolution(t.plan.image, asked.host, asked.extra.get("registry"))
        report.results.append(image_check(resolution))
        if resolution.pinned:
            t = replace(t, plan=t.plan.model_copy(update={"image": resolution.pinned}))
    rollout = _rollout(t, report)
    if report is not None and rollout is not None and t.vars.k3_nccl_probe:
        report.results += nccl_probe(state, t, rollout, report)
    have: dict[tuple[str, str], Installed] = {}
    history: dict[str, GroupHistory] = {}
    listed: dict[str, dict[str, GroupHistory]] = {}   # group -> host -> its revisions as that host lists them
    rollback_to: dict[str, int] = {}
    images: dict[str, LocalImage] = {}
    helpers: dict[str, str | None] = {}
    weights: dict[str, WeightsStatus] = {}
    runs: dict[tuple[str, str], UnitRun] = {}
    unit_logs: dict[tuple[str, str], dict[str, str]] = {}
    answers: dict[tuple[str, str], bool] = {}
    lock_lines: dict[str, list[str]] = {}
    endpoint_models: tuple[str, ...] | None = None
    if planned is not None and installed and rollout is not None:
        for f in read:
            if f.unreachable is not None:
                continue
            for name, value in f.extra.items():
                kind, _, key = name.partition(":")
                if kind == "unit":
                    have[(f.host, key)] = value
                elif kind == "revisions":
                    listed.setdefault(key, {})[f.host] = value
                elif kind == "image":
                    images[f.host] = value
                elif kind == "helper":
                    helpers[f.host] = value
                elif kind == "weights":
                    weights[f.host] = value
                elif kind == "run":
                    runs[(f.host, key)] = value
                elif kind == "endpoint":
                    endpoint_models = value
                elif kind == "router_workers":
                    rollout.router_workers = value
                elif kind == "logs":
                    unit_logs[(f.host, key)] = value
                elif kind == "health":
                    answers[(f.host, key)] = value == 200
                elif kind == "lock":
                    lock_lines[f.host] = value
        for g, by_host in listed.items():   # a revision is restorable only where every host of the group holds it
            order = list(dict.fromkeys(u.host for u in planned.group(g)))
            history[g] = combine(g, [(h, by_host[h]) for h in order if h in by_host])
        for (host, unit), run in runs.items():
            if run.health is not None:
                answers[(host, unit)] = run.health == 200
        for where, ok in answers.items():   # a serving unit that does not answer is a change to repair
            if where in have:
                have[where] = replace(have[where], answers=ok)
        if t.vars.k3_rollback is not False:
            rollback_to = restore_revisions(state, rollout, history, t.vars.k3_rollback, have)
            restored = {history[g].revisions[n].image for g, n in rollback_to.items()
                        if g in history and n in history[g].revisions}
            if len(restored) == 1 and image_pins.is_pinned(next(iter(restored))):
                # the revision's exact build is what the restored units run: stage that one
                rollout.plan = rollout.plan.model_copy(update={"image": next(iter(restored))})
    stage = None
    if planned is not None and installed and rollout is not None:
        stage = stage_for(rollout, images, {h: w.verified for h, w in weights.items()})
    addresses = {h.name: str(h.data.get("ssh_hostname") or h.name) for h in hosts}
    return Cluster(target=t, rollout=rollout, preflight=report, installed=have, addresses=addresses,
                   ssh={h.name: ssh_argv(h.data.dict(), addresses[h.name]) for h in hosts}, history=history,
                   rollback_to=rollback_to, images=images, resolution=resolution, weights=weights, stage=stage,
                   runs=runs, endpoint_models=endpoint_models, logs=unit_logs, facts=read, helpers=helpers,
                   locks=read_locks(lock_lines))


def restore_revisions(state: State, r: Rollout, history: Mapping[str, GroupHistory], wanted: bool | int,
                      installed: Mapping[tuple[str, str], Installed]) -> dict[str, int]:
    """A rollback: every unit's desired files become those of its group's revision (for ``True`` the previous
    one, or the current one when the hosts run an unrecorded, failed change, or, with replicas, when a roll stopped
    on any replica; else number ``wanted``), read from the revision directories on the hosts."""
    hosts = {h.name: h for h in state.inventory}
    now: dict[str, str | None] = {}
    for u in r.units:
        have = installed.get((u.host, u.unit), Installed())
        now[f"{u.host}:{u.unit_path}"], now[f"{u.host}:{u.env_path}"] = have.unit_sha, have.env_sha
    out: dict[str, int] = {}
    runs_current: dict[str, bool] = {}
    for group in r.groups:
        h = history.get(group) or GroupHistory(group)
        current = h.revisions.get(h.current) if h.current is not None else None
        runs_current[group] = current is None or runs(current, now)
    # a roll of replicas that stopped: going back means every replica on its current revision (those the roll
    # never reached already are), not the replicas that stayed behind one revision further back
    stopped_roll = len(r.replicas) > 1 and not all(runs_current[g] for g in r.replicas)
    for group in r.groups:
        h = history.get(group) or GroupHistory(group)
        try:
            # the router in front of replicas is not what engine changes change: it stays on its revision
            stay = (stopped_roll and group in r.replicas) or (len(r.replicas) > 1 and group == "router")
            number = rollback_target(h.numbers, h.current, wanted, runs_current=runs_current[group] and not stay)
        except K3Error as exc:
            raise K3Error(f"group {group}: {exc}") from None
        d = f"{revisions_dir(r.vars.k3_config_dir, group)}/{number}"
        keep: dict[tuple[str, str], tuple[str, str]] = {}   # units that run that revision: kept as they are
        for u in r.group(group):
            have = installed.get((u.host, u.unit), Installed())
            if number == h.current and runs_current[group] and have.unit_text is not None \
                    and have.env_text is not None:
                keep[(u.host, u.unit)] = (have.unit_text, have.env_text)
        reads = {u.host for u in r.group(group) if (u.host, u.unit) not in keep}
        lacking = [host for host in h.lacking(number) if host in reads]
        if lacking:   # refused before any file is read or changed: a rollback restores every host or none
            raise K3Error(f"cannot roll group {group} back to revision {number}: {', '.join(lacking)} "
                          f"{'lacks' if len(lacking) == 1 else 'lack'} its files in {d} (k3deploy history INVENTORY "
                          "shows which revisions every host of the group holds): pick a revision they all hold")
        for u in r.group(group):
            if (u.host, u.unit) in keep:
                u.unit_text, u.env_text = keep[(u.host, u.unit)]   # it runs that revision: keep it
                continue
            for attr, path in (("unit_text", u.unit_path), ("env_text", u.env_path)):
                kept = f"{d}/{path.rsplit('/', 1)[-1]}"
                lines = get_fact(state, hosts[u.host], FileContents, kwargs={"path": kept}, apply_failed_hosts=False)
                if lines is None and get_fact(state, hosts[u.host], File, kwargs={"path": kept},
                                              apply_failed_hosts=False):
                    lines = []   # an empty file (a router's env file)
                if lines is None:
                    raise K3Error(f"cannot roll group {group} back to revision {number}: {u.host} has no "
                                  f"{d}/{path.rsplit('/', 1)[-1]} (k3deploy history shows what each host kept)")
                setattr(u, attr, "".join(f"{ln}\n" for ln in lines))
        out[group] = number
    return out


def gather(spec: str, *, overrides: Mapping[str, Any] | None = None, facts: bool = True, installed: bool = True,
           require_plan: bool = True, runtime: bool = False, logs: int = 0, health: bool = False,
           pin_image: bool = False) -> Cluster:
    """Load an inventory, connect to every host (read-only) and build its :class:`Cluster`.

    ``facts=False`` reads no host at all (the plan and rollout from the inventory alone). With ``installed`` the
    image's tag is resolved to the digest the deploy would pin (``pin_image`` asks for that without reading what
    the hosts run: the runbook). Raises
    :class:`K3Error` for a bad inventory, variables or selection, and (``require_plan``) for a plan that does
    not fit the hosts. Unreachable hosts are reported in the preflight, not raised.
    """
    state, t = open_inventory(spec, overrides)
    if not facts:
        return _assemble(state, t, facts=False, installed=False, connect_first=False, require_plan=require_plan)
    runner.quiet_pyinfra()
    try:
        return _assemble(state, t, facts=True, installed=installed, connect_first=True, require_plan=require_plan,
                         runtime=runtime, logs=logs, health=health, pin_image=pin_image)
    finally:
        disconnect(list(state.inventory))


def open_inventory(spec: str, overrides: Mapping[str, Any] | None = None) -> tuple[State, Target]:
    """An inventory loaded (:func:`load_inventory`) with its variables read and the connection settings its
    group_vars give applied to its hosts; no host is contacted."""
    state = load_inventory(spec)
    t = target(records_of(state.inventory), inventory_file(spec), overrides)
    apply_connector_settings(state, t)
    return state, t


def apply_connector_settings(state: State, t: Target) -> None:
    """The connection settings group_vars give a host (``ssh_user``, ``ssh_port``, ...), where its inventory data
    does not set them already (the inventory's own data wins, as for every variable)."""
    for h in state.inventory:
        resolved = t.resolved.get(h.name)
        if resolved is None:
            continue
        have = h.data.dict()
        for key, value in resolved.connector.items():
            if key not in have:
                setattr(h.data, key, value)


def connector_drift(state: State, t: Target) -> list[str]:
    """Connection settings group_vars give a host that the running pyinfra did not connect with (it reads only
    the inventory and ``group_data/*.py``), one line each."""
    out = []
    for h in state.inventory:
        resolved = t.resolved.get(h.name)
        if resolved is None:
            continue
        have = h.data.dict()
        for key, value in resolved.connector.items():
            if have.get(key) != value:
                out.append(f"{h.name}: {key}={value!r} in {resolved.connector_sources[key]} is not what pyinfra "
                           f"connected with ({have.get(key)!r}): pyinfra reads connection settings from the inventory "
                           "and group_data/*.py (inventories/group_data/all.py bridges group_vars/all.yml)")
    return out


def gather_in_run(state: State, inventory_spec: str | None,
                  before_read: Callable[[Target], None] | None = None) -> Cluster:
    """The cluster of a running ``pyinfra INVENTORY deploy/k3.py`` (hosts already connected by pyinfra; each gets
    :func:`bound_silence`). ``before_read(target)`` runs once the variables are known and before any host is read
    (the deployment lock is taken there)."""
    t = target(records_of(state.inventory), inventory_file(inventory_spec))
    for h in state.inventory:
        if h.connected:
            bound_silence(h, t.host_vars(h.name).k3_link_timeout)
    if before_read is not None:
        before_read(t)
    return _assemble(state, t, facts=True, installed=True, connect_first=False, require_plan=True, health=True)


def require_reachable(cluster: Cluster) -> None:
    """Raise :class:`K3Error` naming every host that could not be reached."""
    down = cluster.preflight.unreachable() if cluster.preflight else {}
    if down:
        raise K3Error("cannot reach " + "; ".join(f"{h}: {why}" for h, why in down.items())
                      + ": check the address, SSH key and that the node is up")
