"""Bring simulated clusters up and down: the lifecycle (up, down, status, runtime faults, node reboots).

A cluster named ``NAME`` with N nodes consists of, for node i (1 <= i <= N, rank i-1):

- node name (hostname, nspawn machine name, network namespace): ``NAME-node<i>``;
- address ``<subnet>.<10+i>/24`` on ``eth0`` inside the namespace; the host side of the veth pair is
  ``NAME-v<i>`` on the bridge ``NAME0`` (``<subnet>.1``). ``k3sim`` uses ``10.77.0``; other names get
  a subnet derived from the name unless one is given (:mod:`k3sim.network`);
- a tmpfs at ``<state>/NAME-node<i>`` holding the overlay's ``upper``/``work`` directories and the
  node's root ``merged`` (lower layer: the cached base root, :mod:`k3sim.base`);
- a "disk" tmpfs on ``/var/lib/k3deploy`` and on ``/var/lib/k3sim/docker`` (4 TiB nominal, RAM-backed
  as used; 64 MiB and full under the ``disk-full`` fault) (:mod:`k3sim.rootfs`);
- its own cgroups ``k3deploy-sim/NAME/NAME-node<i>`` in every cgroup hierarchy nspawn uses (plus the
  v1 ``memory`` controller for accounting, where present);
- ``systemd-nspawn --boot`` (real systemd as the node's PID 1) and the node's own OpenSSH sshd with its
  own ed25519 host key, accepting the cluster key for root (:mod:`k3sim.processes`);
- ``eth0`` egress shaped to the cluster rate (``--cluster-mbps``, tc tbf).

and one simulated outside (:mod:`k3sim.outside`): an HTTP server standing in for the registries and the
model hub, in the network namespace ``NAME-out`` at ``<subnet>.254`` (host-side veth ``NAME-vo``), its egress shaped
to the uplink rate (``--uplink-mbps``), its state (counters, cut fault, generated files) in ``<state>/outside``. The
nodes' ``/etc/hosts`` map ``registry-1.docker.io``, ``quay.io``, ``huggingface.co`` and ``k3sim-outside`` to it.

The state lives in ``/run/k3deploy/sim/NAME/`` (``K3SIM_STATE`` overrides the parent): ``state.json``,
the cluster key ``id_ed25519``, ``known_hosts``, the pyinfra inventory ``NAME.py``
(:mod:`k3sim.inventory`) and the node tmpfs mounts. Every resource is recorded in ``state.json``
before it is created, so ``down`` (and an ``up`` after a crash) can remove exactly what an earlier run
made. Processes are stopped by PID only, after checking that the PID still runs ``systemd-nspawn`` with
the recorded start time, or because they sit in the node's own cgroups.

This module is the public API of the simulator; the names it re-exports from the modules above stay
importable from here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from k3deploy.errors import K3Error
from k3sim import base as sim_base
from k3sim import faults as sim_faults
from k3sim import monitoring as sim_monitoring
from k3sim import network, outside, processes, profiles, rootfs
from k3sim import router as sim_router
from k3sim import slurm as sim_slurm
from k3sim.host import COMMAND_PACKAGES, SimError, ensure_inotify, run
from k3sim.inventory import parse_layout, write_inventory
from k3sim.network import bridge_name, default_subnet, validate_subnet
from k3sim.processes import (
    CG_PARENT,
    CG_ROOT,
    cgroup_hierarchies,
    node_cgroups,
    node_init_pid,
    node_memory,
)
from k3sim.rootfs import (
    DISK_DIRS,
    DISK_FILLER,
    DISK_SIZE_FULL_MIB,
    DISK_SIZE_HEALTHY,
    DISK_SOURCE,
)
from k3sim.state import (
    DEFAULT_NAME,
    MAX_NODES,
    NAME_RE,
    RESERVED_NAMES,
    STATE_VERSION,
    NodeLayout,
    layout,
    list_names,
    load_state,
    locked,
    save_state,
    state_dir,
    state_root,
    validate_name,
)

__all__ = [
    "CG_PARENT",
    "CG_ROOT",
    "DEFAULT_NAME",
    "DISK_DIRS",
    "DISK_FILLER",
    "DISK_SIZE_FULL_MIB",
    "DISK_SIZE_HEALTHY",
    "DISK_SOURCE",
    "MAX_NODES",
    "NAME_RE",
    "RESERVED_NAMES",
    "STATE_VERSION",
    "NodeLayout",
    "Progress",
    "SimError",
    "bridge_name",
    "cgroup_hierarchies",
    "check_host",
    "default_subnet",
    "down",
    "fault_kinds",
    "fault_text",
    "hardware_ids",
    "layout",
    "list_names",
    "load_state",
    "node_cgroups",
    "node_config",
    "node_init_pid",
    "node_memory",
    "parse_fault",
    "parse_layout",
    "power",
    "reboot",
    "running",
    "set_faults",
    "state_dir",
    "state_root",
    "status",
    "summary",
    "up",
    "validate_name",
    "validate_subnet",
]


# --------------------------------------------------------------------------- faults and profiles


class _Clear(NamedTuple):
    """``sim fault --clear RANK``: every fault kind of that rank."""

    rank: int
    kind: str = "*"
    value: str | None = None


def fault_kinds() -> dict[str, str]:
    """Node fault kinds (``RANK:KIND[=VALUE]``) and cluster fault kinds (``KIND=VALUE``, no rank)."""
    return {**sim_faults.FAULT_KINDS, **sim_faults.CLUSTER_FAULT_KINDS}


def parse_fault(text: str) -> sim_faults.Fault:
    """``RANK:KIND[=VALUE]`` -> :class:`k3sim.faults.Fault` (rank, kind, value)."""
    return sim_faults.parse_fault(text)


def fault_text(fault: sim_faults.Fault | _Clear) -> str:
    value = getattr(fault, "value", None)
    return f"{fault.rank}:{fault.kind}" + ("" if value in (None, "") else f"={value}")


def hardware_ids() -> list[str]:
    return list(profiles.hardware_ids())


def node_config(
    hardware: str,
    rank: int,
    nodes: int,
    name: str,
    ip: str,
    faults: list[sim_faults.Fault],
    time_scale: float,
    cluster_uuid: str,
) -> dict[str, Any]:
    """The node's ``/etc/k3sim/node.json`` document (:func:`k3sim.profiles.node_config`)."""
    return profiles.node_config(
        hardware=hardware,
        rank=rank,
        nodes=nodes,
        name=name,
        ip=ip,
        faults=faults,
        time_scale=time_scale,
        cluster_uuid=cluster_uuid,
    )


# --------------------------------------------------------------------------- checks


def check_host() -> None:
    """Root, the needed commands and a cgroup layout nspawn can use; one line naming the fix."""
    if os.geteuid() != 0:
        raise SimError("the simulated cluster needs root: run k3deploy sim as root (sudo)")
    for cmd in ("systemd-nspawn", "ip", "tc", "ssh", "ssh-keygen", "nsenter", "mount", "umount"):
        if shutil.which(cmd) is None:
            raise SimError(f"{cmd} not found: {COMMAND_PACKAGES[cmd]}")
    if not cgroup_hierarchies():
        raise SimError(f"no usable cgroup hierarchy under {CG_ROOT}: mount cgroup2 or the hybrid hierarchies")


# --------------------------------------------------------------------------- up


#: ``--strategy none``: write no strategy, check no size (a cluster for preflight or the simulator's own tools)
NO_STRATEGY = "none"


def choose_strategy(hardware: str, nodes: int, pools: dict[str, int] | None,
                    strategy: str | None) -> tuple[str, bool]:
    """The strategy a cluster of ``nodes`` nodes (per replica) of ``hardware`` deploys as created, and whether an
    unset ``k3_strategy`` deploys it too (the recipe's recommendation for the hardware): the recommended strategy
    that fits, or ``strategy`` when it fits; with P/D pools pd_cluster when the pools fit. SimError naming the sizes
    that fit otherwise."""
    from k3deploy.recipe import fit, load_recipe
    from k3deploy.recipe.offering import recommended
    from k3deploy.recipe.taxonomy import hardware as profiles_of

    if strategy == NO_STRATEGY:
        return ("pd_cluster", False) if pools else ("", False)
    recipe = load_recipe(None)
    picked, implicit = _choose(recipe, hardware, nodes, pools, strategy)
    rec, _ = recommended(recipe, fit.variant_for(recipe, hardware), profiles_of()[hardware])
    return picked, implicit and picked == rec


def _choose(recipe: Any, hardware: str, nodes: int, pools: dict[str, int] | None,
            strategy: str | None) -> tuple[str, bool]:
    from k3deploy.recipe import fit

    if pools:
        p, d = pools["prefill"], pools["decode"]
        if fit.pd_fits(recipe, hardware, p, d):
            return "pd_cluster", strategy is None
        smallest = fit.pd_sizes(recipe, hardware, p, d)
        hint = (f"pools that fit: --layout pd:{smallest[0]},{smallest[1]} --nodes {sum(smallest)}" if smallest
                else "no P/D pools fit")
        raise SimError(f"--layout pd:{p},{d} does not fit pd_cluster on {hardware} ({recipe.slug}): {hint} "
                       "(k3deploy options --hardware " + hardware + " lists the recipe's pool sizes)")
    fitting = fit.fitting(recipe, hardware, nodes)
    if strategy is None:
        if fitting:
            return fitting[0], True
        sizes = fit.sizes_text(fit.sizes_that_fit(recipe, hardware))
        raise SimError(f"no strategy of {recipe.slug} runs on {nodes} node{'s' if nodes != 1 else ''} of {hardware}: "
                       f"give --nodes of a size that fits: {sizes}")
    if strategy in fitting:
        return strategy, False
    fix = (f"strategies that fit {nodes} node{'s' if nodes != 1 else ''}: {', '.join(fitting)}" if fitting else
           f"sizes that fit: {fit.sizes_text(fit.sizes_that_fit(recipe, hardware))}")
    raise SimError(f"--strategy {strategy} does not run on {nodes} node{'s' if nodes != 1 else ''} of {hardware} "
                   f"({recipe.slug}): {fix}")


Progress = Callable[[str], None]


def up(
    hardware: str,
    nodes: int,
    name: str = DEFAULT_NAME,
    faults: list[str] | None = None,
    time_scale: float = 0.01,
    subnet: str | None = None,
    progress: Progress | None = None,
    boot_timeout: float | None = None,
    pd_layout: str | None = None,
    strategy: str | None = None,
    uplink_mbps: float = 400.0,
    cluster_mbps: float = 4000.0,
    weights_mb: float = 8.0,
    image_mb: float = 8.0,
    replicas: int = 1,
    slurm: bool = False,
    spares: int = 0,
    vip: bool = False,
    imex: str = "standing",
    monitoring: bool = False,
    compile_seconds: float | None = None,
) -> dict[str, Any]:
    """Create and boot a cluster; returns ``{"name", "inventory", "nodes": [{"name", "ip", "rank"}], "outside"}``.

    ``pd_layout`` ``"pd:P,D"`` writes an inventory with groups prefill (P nodes), decode (D nodes) and router
    (the first prefill node) instead of head and workers. ``strategy`` goes into the cluster's group_vars
    (``pd_cluster`` with a P/D layout; none given: the recommended strategy that fits the node count, see
    :func:`choose_strategy`; ``"none"``: none written, no size checked). The outside serves images of
    ``image_mb`` MiB and checkpoints of ``weights_mb`` MiB over an uplink of ``uplink_mbps`` Mbit/s; nodes send
    to each other at ``cluster_mbps``.
    ``faults`` may hold cluster faults (``outside-cut=MB``) next to node faults. ``replicas`` R > 1 splits the
    nodes into R replicas of ``nodes / R`` (``k3_replica`` per host, one head each, ranks within the replica).
    ``slurm``: the nodes run a real Slurm (:mod:`k3sim.slurm`): slurmctld on rank 0, munged and slurmd on
    every node, partition ``k3``; returns once every node's slurmd has registered (sinfo: idle, unless a fault
    keeps a node out; the result's ``slurm``).
    ``spares`` K adds K nodes of the same hardware after the ``nodes`` engine nodes (ranks ``nodes`` ..
    ``nodes + K - 1``), in the inventory group ``spares``. ``vip``: the cluster's group_vars set ``k3_vip`` to
    ``<subnet>.250`` (:func:`~k3sim.network.vip_address`; the result's ``vip``). ``imex`` ``"per-job"`` (with
    ``slurm``, on IMEX hardware): IMEX as a Slurm >= 24.05 site with ``SwitchType=switch/nvidia_imex`` runs it, on
    Debian's 22.05 (:func:`k3sim.slurm.imex_files`): no standing daemon or channel 0, a channel per job.
    ``monitoring``: a real Prometheus on this host scrapes the cluster (:mod:`k3sim.monitoring`; the result's
    ``prometheus``: its URL).
    ``compile_seconds``: the nominal time of an engine's cold compile (times ``time_scale``; None: the simulated
    engine's default, ``vllmsim_caches.NOMINAL_COMPILE_SECONDS``); a cache hit takes a twentieth of it.
    """
    from k3deploy.recipe.offering import did_you_mean
    from k3deploy.recipe.taxonomy import strategies

    say = progress or (lambda _m: None)
    validate_name(name)
    if spares < 0:
        raise SimError(f"bad --spares {spares}: give a number of spare nodes >= 0")
    pools = parse_layout(pd_layout, nodes)
    if strategy is not None and strategy != NO_STRATEGY and strategy not in strategies():
        raise SimError(f"unknown strategy {strategy!r}: choose one of {', '.join(sorted(strategies()))}"
                       + did_you_mean(strategy, strategies()))
    if replicas < 1 or nodes % replicas:
        raise SimError(f"bad --replicas {replicas}: give a number >= 1 that divides --nodes {nodes}")
    if pools and replicas > 1:
        raise SimError("--replicas with --layout pd:P,D: a P/D cluster has no replicas; drop one of them")
    if pools and strategy not in (None, "pd_cluster", NO_STRATEGY):
        raise SimError(f"--strategy {strategy} with --layout pd:P,D: a P/D layout is pd_cluster; drop one of them")
    hw_ids = hardware_ids()
    if hardware not in hw_ids:
        raise SimError(f"unknown hardware {hardware!r}: choose one of {', '.join(hw_ids)}"
                       + did_you_mean(hardware, hw_ids))
    if not 1 <= nodes <= MAX_NODES:
        raise SimError(f"bad node count {nodes}: the simulation runs 1 to {MAX_NODES} nodes")
    if nodes + spares > MAX_NODES:
        raise SimError(f"bad --spares {spares}: {nodes} nodes and {spares} spares are more than the {MAX_NODES} nodes "
                       "the simulation runs")
    engines, nodes = nodes, nodes + spares   # the spares are nodes like the others, after the engine nodes
    if not time_scale > 0:
        raise SimError(f"bad time scale {time_scale}: give a factor > 0, e.g. 0.01")
    for label, value in (("--uplink-mbps", uplink_mbps), ("--cluster-mbps", cluster_mbps)):
        if not 0 < value <= 400_000:
            raise SimError(f"bad {label} {value:g}: give megabits per second > 0, e.g. 400")
    for label, value in (("--weights-mb", weights_mb), ("--image-mb", image_mb)):
        if not 0.01 <= value <= 1 << 20:
            raise SimError(f"bad {label} {value:g}: give MiB (at least 0.01), e.g. 8")
    cluster_faults = [sim_faults.parse_cluster_fault(f) for f in faults or [] if sim_faults.is_cluster_fault(f)]
    parsed = [parse_fault(f) for f in faults or [] if not sim_faults.is_cluster_fault(f)]
    for f in parsed:
        if not 0 <= f.rank < nodes:
            raise SimError(f"bad fault {fault_text(f)!r}: rank {f.rank} is not in 0..{nodes - 1}")
    explicit_subnet = subnet is not None
    subnet = validate_subnet(subnet or default_subnet(name))
    no_uuid = "00000000-0000-0000-0000-000000000000"
    for nd in layout(name, subnet, nodes):  # profile and fault errors surface before anything is created
        node_config(hardware, nd.rank, nodes, nd.name, nd.ip, parsed, time_scale, no_uuid)
    asked = strategy
    strategy, strategy_default = choose_strategy(hardware, engines // replicas, pools, strategy)
    per = engines // replicas
    strategy_note = (f"strategy: none written (--strategy {NO_STRATEGY})" if asked == NO_STRATEGY else
                     f"strategy: pd_cluster (--layout {pd_layout}: pools of {pools['prefill']} prefill and "
                     f"{pools['decode']} decode nodes fit)" if pools else
                     f"strategy: {strategy} ({'as asked; it fits' if asked else 'the recommended strategy that fits'}"
                     f" {per} node{'s' if per != 1 else ''} of {hardware}; set k3_strategy in "
                     f"{state_dir(name) / 'group_vars' / 'all.yml'} to change it)")
    if boot_timeout is None:
        boot_timeout = float(os.environ.get("K3SIM_BOOT_TIMEOUT", "90"))
    check_host()
    sim_router.check()  # the real vllm-router the router hosts run

    with locked(name):
        old = load_state(name)
        if old is not None:
            if old.get("phase") == "up" and _cluster_alive(old):
                raise SimError(f"simulated cluster {name!r} is already up: run 'k3deploy sim down --name {name}' first")
            say(f"cleaning up leftovers of an earlier run of {name!r}")
            _down_locked(name, old)
        else:
            _clean_orphans(name)
        if explicit_subnet:
            network.check_conflicts(name, subnet)
        else:
            subnet = network.free_subnet(name, subnet)
        if imex not in ("standing", "per-job"):
            raise SimError(f"--imex {imex!r}: give standing or per-job")
        if imex == "per-job" and not (slurm and profiles.profile(hardware).get("imex")):
            raise SimError(f"--imex per-job needs --slurm and IMEX hardware ({profiles.supported('imex')}), not "
                           f"{hardware!r}"
                           + ("" if slurm else " without --slurm"))
        base = sim_base.ensure_base(say)
        if slurm:
            sim_slurm.check_base(base)
            if shutil.which("unshare") is None:  # a node's own boot clock (processes.spawn)
                raise SimError("unshare not found: install the util-linux package (apt-get install util-linux)")
        running_nodes = sum(len(st.get("nodes", [])) for other in list_names() if other != name
                            if (st := load_state(other)) is not None)
        ensure_inotify(nodes + running_nodes, say)
        started = time.monotonic()
        # node files get the modes a normal root would give them, whatever the caller's umask
        umask = os.umask(0o022)
        try:
            shaping = {"uplink_mbps": float(uplink_mbps), "cluster_mbps": float(cluster_mbps),
                       "weights_mb": float(weights_mb), "image_mb": float(image_mb)}
            result = _up_locked(name, hardware, nodes, subnet, parsed, time_scale, base, say, boot_timeout, pools,
                                strategy, shaping, cluster_faults, replicas, strategy_default, slurm, spares, vip,
                                imex == "per-job", monitoring, compile_seconds)
        except BaseException as exc:
            state = load_state(name)
            with contextlib.suppress(Exception):
                _down_locked(name, state)
            if isinstance(exc, K3Error):
                raise
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise SimError(f"sim up {name!r} failed and was rolled back: {exc}") from exc
        finally:
            os.umask(umask)
        say(f"{nodes} node(s) up in {time.monotonic() - started:.1f} s")
        say(strategy_note)
        return result


def _up_locked(
    name: str,
    hardware: str,
    n: int,
    subnet: str,
    faults: list[sim_faults.Fault],
    time_scale: float,
    base: Path,
    say: Progress,
    boot_timeout: float,
    pools: dict[str, int] | None = None,
    strategy: str | None = None,
    shaping: dict[str, float] | None = None,
    cluster_faults: list[sim_faults.ClusterFault] | None = None,
    replicas: int = 1,
    strategy_default: bool = False,
    slurm: bool = False,
    spares: int = 0,
    vip: bool = False,
    imex_per_job: bool = False,
    monitoring: bool = False,
    compile_seconds: float | None = None,
) -> dict[str, Any]:
    shaping = shaping or {"uplink_mbps": 400.0, "cluster_mbps": 4000.0, "weights_mb": 8.0, "image_mb": 8.0}
    sdir = state_dir(name)
    sdir.mkdir(parents=True, exist_ok=True)
    os.chmod(sdir, 0o700)
    nodes = layout(name, subnet, n)
    cluster_uuid = str(uuid.uuid4())
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "name": name,
        "hardware": hardware,
        "subnet": subnet,
        "bridge": bridge_name(name),
        "bridge_created": False,
        "base": str(base),
        "cluster_uuid": cluster_uuid,
        "time_scale": time_scale,
        "phase": "starting",
        "created": time.time(),
        "inventory": str(sdir / f"{name}.py"),
        "pools": pools,
        "replicas": replicas,
        "spares": spares,
        "vip": network.vip_address(subnet) if vip else None,
        "strategy": "pd_cluster" if pools else strategy,
        "strategy_default": strategy_default,
        "monitoring": monitoring,
        "key": str(sdir / "id_ed25519"),
        "known_hosts": str(sdir / "known_hosts"),
        "cgroups": [str(cg) for cg in processes.cluster_cgroups(name)],
        "nodes": [
            {
                "name": nd.name,
                "rank": nd.rank,
                "ip": nd.ip,
                "netns": nd.netns,
                "veth": nd.veth,
                "dir": str(nd.dir),
                "faults": [fault_text(f) for f in faults if f.rank == nd.rank],
                "pid": None,
                "pid_start": None,
            }
            for nd in nodes
        ],
        "outside": {
            "netns": network.outside_names(name)[0],
            "veth": network.outside_names(name)[1],
            "ip": f"{subnet}.{outside.OCTET}",
            "port": outside.PORT,
            "dir": str(sdir / "outside"),
            **shaping,
            "faults": [str(f) for f in cluster_faults or []],
            "pid": None,
            "pid_start": None,
        },
    }
    slurm_files: tuple[str, str, bytes] | None = None
    if slurm:  # recorded before anything of it is made; all of it lives in the nodes' roots
        cpus = os.cpu_count() or 1  # what each node's slurmd finds: the nodes share the host's CPUs
        prof = profiles.profile(hardware)
        gpus = int(prof["gpus"])
        state["slurm"] = {**sim_slurm.record(state, cpus, gpus), "imex": "per-job" if imex_per_job else "standing"}
        gres_name = sim_slurm.gres_name(str(prof.get("vendor", "nvidia")))
        slurm_files = (sim_slurm.render_conf(name, [(nd.name, nd.ip) for nd in nodes], cpus, gpus, gres_name,
                                             imex_per_job),
                       sim_slurm.render_gres(sim_slurm.gpu_files(str(prof.get("vendor", "nvidia")), gpus), gres_name),
                       sim_slurm.new_key())
    save_state(state)
    plugin = None
    if slurm_files is not None:
        (sdir / "slurm.conf").write_text(slurm_files[0])
        plugin = sim_slurm.build_plugin(sim_base.cache_dir() / "spank")

    key = sdir / "id_ed25519"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"k3deploy-sim-{name}", "-f", str(key)])
    pubkey = (sdir / "id_ed25519.pub").read_text()

    br = state["bridge"]
    state["bridge_created"] = True
    save_state(state)
    network.create_bridge(br, subnet)
    _start_outside(state)

    out = state["outside"]
    hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
        f"{nd.ip}\t{nd.name}\n" for nd in nodes
    ) + f"{out['ip']}\t{' '.join(outside.HOSTS)}\n"
    host_keys: dict[str, str] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for nd, rec in zip(nodes, state["nodes"], strict=True):
        node_faults = [f for f in faults if f.rank == nd.rank]
        doc = node_config(hardware, nd.rank, n, nd.name, nd.ip, faults, time_scale, cluster_uuid)
        if imex_per_job:  # no standing IMEX: no channel 0, the daemon not started at boot (k3sim.slurm.imex_files)
            doc = {**doc, "imex_per_job": True}
        if compile_seconds is not None:   # the simulated engine's cold compile (vllmsim_caches)
            doc = {**doc, "compile_seconds": round(compile_seconds * time_scale, 3)}
        host_keys[nd.name] = rootfs.prepare_root(nd, base, pubkey, hosts, doc, node_faults)
        if slurm_files is not None:
            sim_slurm.prepare_node(nd.merged, *slurm_files, controller=nd.rank == 0, imex_per_job=imex_per_job,
                                   plugin=plugin)
        network.prepare_net(nd, br, subnet, shaping["cluster_mbps"])
        if doc.get("rails"):  # the GPU NICs, one subnet per rail, in the cluster's fabric namespace
            network.prepare_rails(name, nd.rank, nd.netns, doc["rails"])
        route = _default_route(node_faults)
        if route is not None:  # fault default-route: none, or on a front-end network
            network.set_default_route(nd.netns, subnet, nd.rank, route)
        if doc.get("management"):  # fault imex-mgmt: a second network IMEX binds to
            network.add_management(name, nd.rank, nd.netns, doc["management"]["interface"], doc["management"]["ip"])
        proc = processes.spawn(name, nd, own_uptime=slurm)
        procs[nd.name] = proc
        st = processes.proc_stat(proc.pid)
        rec["pid"], rec["pid_start"] = proc.pid, st[1] if st else None
        save_state(state)

    (sdir / "known_hosts").write_text("".join(f"{nd.ip},{nd.name} {host_keys[nd.name]}\n" for nd in nodes))
    write_inventory(state)
    say(f"booting {n} node(s) of {hardware} ({name}, {subnet}.0/24)")
    _wait_ready(state, nodes, faults, boot_timeout)
    _wait_outside(state)
    if monitoring:
        say(f"monitoring: Prometheus on {sim_monitoring.start(state, sdir)}")
    if slurm_files is not None and not any(f.rank == 0 and f.kind == "sshd-down" for f in faults):
        say("waiting for every node's slurmd to register with slurmctld")
        sim_slurm.wait_registered(_ssh_base(state), nodes[0].ip, [nd.name for nd in nodes], boot_timeout)
    state["phase"] = "up"
    state["up_at"] = time.time()
    save_state(state)
    # the nodes outlive this process: stop tracking them as children
    for proc in procs.values():
        proc.returncode = 0
    return summary(state)


@contextlib.contextmanager
def running(
    hardware: str, nodes: int, name: str = DEFAULT_NAME, faults: list[str] | None = None, **kwargs: Any
) -> Iterator[dict[str, Any]]:
    """``with running("gb300", 2, name="t1") as c:`` -- a cluster for the block, removed afterwards."""
    result = up(hardware, nodes, name=name, faults=faults, **kwargs)
    try:
        yield result
    finally:
        down(name)


def summary(state: dict[str, Any]) -> dict[str, Any]:
    res = {
        "name": state["name"],
        "inventory": state["inventory"],
        "nodes": [{"name": r["name"], "ip": r["ip"], "rank": r["rank"]} for r in state["nodes"]],
        "strategy": state.get("strategy"),
    }
    if state.get("spares"):   # the last nodes, in the inventory group spares
        res["spares"] = [r["name"] for r in state["nodes"][len(state["nodes"]) - int(state["spares"]):]]
    if state.get("vip"):
        res["vip"] = state["vip"]
    res.update(sim_monitoring.status(state))
    out = state.get("outside")
    if out:
        res["outside"] = {"ip": out["ip"], "port": out["port"], "names": list(outside.HOSTS)}
    sl = state.get("slurm")
    if sl:
        res["slurm"] = {k: sl[k] for k in ("controller", "submit_host", "partition")}
    return res


# --------------------------------------------------------------------------- the outside


def _start_outside(state: dict[str, Any]) -> None:
    """The outside's namespace (on the bridge, shaped to the uplink rate) and its server, a process of its own."""
    out = state["outside"]
    network.prepare_outside_net(out["netns"], out["veth"], state["bridge"], out["ip"], out["uplink_mbps"])
    d = Path(out["dir"])
    d.mkdir(parents=True, exist_ok=True)
    for f in out.get("faults", []):
        outside.set_cut(d, float(sim_faults.parse_cluster_fault(f).value))
    cmd = ["ip", "netns", "exec", out["netns"], sys.executable, "-I", "-S", outside.__file__, "--dir", str(d),
           "--bind", out["ip"], "--port", str(out["port"]), "--image-mb", repr(out["image_mb"]),
           "--weights-mb", repr(out["weights_mb"])]
    with open(d / "server.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    st = processes.proc_stat(proc.pid)
    out["pid"], out["pid_start"] = proc.pid, st[1] if st else None
    save_state(state)
    proc.returncode = 0  # it outlives this process: stop tracking it as a child


def _wait_outside(state: dict[str, Any], timeout: float = 20) -> None:
    out = state["outside"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((out["ip"], out["port"]), timeout=0.5):
                return
        except OSError:
            pass
        alive = processes.alive(out["pid"])
        if not alive or time.monotonic() > deadline:
            processes.reap(out["pid"])
            log = Path(out["dir"]) / "server.log"
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
            why = lines[-1] if lines else "no output"
            raise SimError(f"the simulated outside did not {'listen' if alive else 'start'} on "
                           f"{out['ip']}:{out['port']}: {why} (see {log})")
        time.sleep(0.05)


def _stop_outside(name: str, out: dict[str, Any] | None) -> None:
    """Stop the outside's server (by PID, after checking it is ours) and anything else in its namespace (only what
    the simulation started runs there), then remove its namespace and veth."""
    netns, veth = (out["netns"], out["veth"]) if out else network.outside_names(name)
    pid, start = int((out or {}).get("pid") or 0), (out or {}).get("pid_start")
    if processes.ours(pid, start, outside.PROCESS_NAME):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        while processes.ours(pid, start, outside.PROCESS_NAME) and time.monotonic() < deadline:
            processes.reap(pid)
            time.sleep(0.05)
        if processes.ours(pid, start, outside.PROCESS_NAME):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if pid:
        processes.reap(pid)
    if Path(f"/run/netns/{netns}").exists():
        for _ in range(40):
            left = [int(p) for p in run(["ip", "netns", "pids", netns], check=False).stdout.split() if p.isdigit()]
            if not left:
                break
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
                processes.reap(p)
            time.sleep(0.05)
    network.remove_outside_net(netns, veth)


def _ssh_base(state: dict[str, Any]) -> list[str]:
    return [
        "ssh", "-q", "-i", state["key"],
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={state['known_hosts']}", "-o", "ConnectTimeout=2",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip


def _wait_ready(
    state: dict[str, Any], nodes: list[NodeLayout], faults: list[sim_faults.Fault], timeout: float
) -> None:
    """Wait until every node's sshd accepts the cluster key (or, with sshd-down, its systemd is up)."""
    no_ssh = {f.rank for f in faults if f.kind == "sshd-down"}
    pending = {nd.name: nd for nd in nodes}
    recs = {r["name"]: r for r in state["nodes"]}
    checks: dict[str, subprocess.Popen[bytes]] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for nm, nd in list(pending.items()):
            rec = recs[nm]
            if not processes.ours(rec["pid"], rec["pid_start"]):
                processes.reap(rec["pid"])
                raise SimError(f"node {nm} stopped while booting: {processes.console_tail(nd)}")
            proc = checks.get(nm)
            if proc is not None:
                rc = proc.poll()
                if rc is None:
                    continue
                del checks[nm]
                out = proc.stdout.read().decode().strip() if proc.stdout else ""
                # ssh: exit 0; systemctl is-system-running --wait: booted, "running" or "degraded"
                if rc == 0 or out == "degraded":
                    del pending[nm]
                continue
            if nd.rank in no_ssh:
                pid1 = node_init_pid(rec)
                if pid1:
                    checks[nm] = subprocess.Popen(
                        ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p",
                         "systemctl", "is-system-running", "--wait"],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                    )  # fmt: skip
            elif network.ssh_banner(nd.ip):
                checks[nm] = subprocess.Popen(  # the first login also fills the node's tool cache
                    [*_ssh_base(state), f"root@{nd.ip}", f"sh {rootfs.WARM_SCRIPT} >/dev/null 2>&1; true"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                )  # fmt: skip
        if not pending:
            break
        if time.monotonic() > deadline:
            for p in checks.values():
                p.kill()
                p.wait()
            names = ", ".join(sorted(pending))
            raise SimError(f"node(s) {names} not reachable over SSH after {timeout:.0f} s (raise K3SIM_BOOT_TIMEOUT)")
        time.sleep(0.05)


# --------------------------------------------------------------------------- down


def _cluster_alive(state: dict[str, Any]) -> bool:
    recs = state.get("nodes") or []
    return bool(recs) and all(processes.ours(r.get("pid"), r.get("pid_start")) for r in recs)


def down(name: str = DEFAULT_NAME, progress: Progress | None = None) -> bool:
    """Stop and remove a cluster; False when there was nothing to remove."""
    validate_name(name)
    check_host()
    with locked(name):
        state = load_state(name)
        if state is None and not _has_orphans(name):
            return False
        started = time.monotonic()
        _down_locked(name, state)
        if progress:
            progress(f"{name} down in {time.monotonic() - started:.1f} s")
        return True


def _has_orphans(name: str) -> bool:
    return state_dir(name).exists() or any(cg.exists() for cg in processes.cluster_cgroups(name))


def _clean_orphans(name: str) -> None:
    if _has_orphans(name):
        _down_locked(name, None)


def _down_locked(name: str, state: dict[str, Any] | None) -> None:
    state = state or {"name": name, "nodes": []}
    recs = state.get("nodes") or []
    if state.get("phase") == "up":
        state["phase"] = "stopping"
        with contextlib.suppress(OSError):
            save_state(state)
    # 1. power every node off at once
    processes.stop_nodes(recs)
    # 2. anything left in the cluster's cgroups descends from its nspawns
    cg_roots = [Path(p) for p in state.get("cgroups", [])] or processes.cluster_cgroups(name)
    processes.kill_cgroups(cg_roots)
    # 3. file systems: disks, overlays, node tmpfs (deepest first)
    sdir = state_dir(name)
    rootfs.umount_under(sdir)
    # 4. network
    for r in recs:
        network.remove_node_net(r)
        processes.remove_nspawn_leftovers(r["name"])
    _stop_outside(name, state.get("outside"))
    sim_monitoring.stop(state)
    network.remove_rails(name)
    network.remove_bridge(state)
    # 5. cgroups, then the state directory
    processes.remove_cgroups(cg_roots)
    left = rootfs.mounts_under(sdir)
    if left:
        raise SimError(
            f"cannot unmount {left[0]}: a process outside the simulation uses it; stop it and run sim down again"
        )
    shutil.rmtree(sdir, ignore_errors=True)


# --------------------------------------------------------------------------- status


def status(name: str | None = None) -> list[dict[str, Any]]:
    """One entry per cluster: name, hardware, phase, inventory and per-node liveness."""
    out = []
    for nm in [name] if name else list_names():
        st = load_state(nm)
        if st is None:
            continue
        nodes = []
        for r in st.get("nodes", []):
            running = processes.ours(r.get("pid"), r.get("pid_start"))
            nodes.append(
                {
                    "name": r["name"],
                    "ip": r["ip"],
                    "rank": r["rank"],
                    "running": running,
                    "ssh": running and network.ssh_banner(r["ip"], 0.5),
                    "faults": r.get("faults", []),
                    "memory_bytes": node_memory(st, r) if running else None,
                }
            )
        phase = st.get("phase", "unknown")
        ext = _outside_status(st)
        if phase == "up" and not (all(n["running"] for n in nodes) and (ext is None or ext["outside"]["running"])):
            phase = "degraded"
        out.append(
            {
                "name": nm,
                "hardware": st.get("hardware"),
                "phase": phase,
                "subnet": f"{st.get('subnet')}.0/24",
                "inventory": st.get("inventory"),
                "nodes": nodes,
                **(ext or {}),
                **({"slurm": _slurm_status(st, nodes)} if st.get("slurm") else {}),
                **sim_monitoring.status(st),
            }
        )
    return out


def _slurm_status(st: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The Slurm side of a --slurm cluster: controller, submit host, partition, and sinfo's nodes and squeue's jobs
    read on the controller over SSH (``error`` where it does not answer)."""
    sl = st["slurm"]
    res: dict[str, Any] = {k: sl.get(k) for k in ("controller", "submit_host", "partition", "version")}
    head = next((n for n in nodes if n["name"] == sl["controller"]), None)
    if head is None or not head["ssh"]:
        return {**res, "nodes": [], "jobs": [], "error": f"the controller {sl['controller']} does not answer on SSH"}
    return {**res, **sim_slurm.query(_ssh_base(st), head["ip"])}


def _outside_status(st: dict[str, Any]) -> dict[str, Any] | None:
    """``outside_bytes`` (payload served since up), ``artifact_bytes`` (what one node needs: one image's layers and
    one checkpoint), the shaping rates and the outside's details; None for a cluster without an outside."""
    out = st.get("outside")
    if not out:
        return None
    counters = outside.read_counters(Path(out["dir"]))
    return {
        "outside_bytes": counters["payload_bytes"],
        "artifact_bytes": outside.artifact_bytes(out["image_mb"], out["weights_mb"]),
        "uplink_mbps": out["uplink_mbps"],
        "cluster_mbps": out["cluster_mbps"],
        "outside": {
            "ip": out["ip"],
            "port": out["port"],
            "names": list(outside.HOSTS),
            "running": processes.ours(out.get("pid"), out.get("pid_start"), outside.PROCESS_NAME),
            "image_bytes": outside.mib_bytes(out["image_mb"]),
            "checkpoint_bytes": outside.checkpoint_bytes(out["weights_mb"]),
            "other_bytes": counters["other_bytes"],
            "requests": counters["requests"],
            "by_host": counters["by_host"],
            "aborted": counters["aborted"],
            "faults": out.get("faults", []),
            "cut": counters["cut"],
            "counters": str(Path(out["dir"]) / outside.COUNTERS),
        },
    }


# --------------------------------------------------------------------------- push


def push(name: str, ref: str) -> str:
    """Push a new build of ``ref`` (``repository:tag`` of the simulated registry) to the cluster's outside, as a
    re-push of a mutable tag upstream would: the tag names the new build from now on; earlier builds stay
    reachable by digest. Returns the new digest."""
    validate_name(name)
    state = load_state(name)
    if state is None or state.get("phase") != "up" or not state.get("outside"):
        raise SimError(f"no simulated cluster {name!r} with an outside is up: start one with 'k3deploy sim up "
                       f"--name {name} ...'")
    try:
        return outside.repush(Path(state["outside"]["dir"]), ref)
    except ValueError as exc:
        raise SimError(str(exc)) from None


# --------------------------------------------------------------------------- reboot


def _running_node(name: str, rank: int) -> tuple[dict[str, Any], dict[str, Any], NodeLayout]:
    """The state of running cluster ``name`` (its lock held), the record of its node ``rank`` and that node's
    layout; raises :class:`SimError` where the cluster is not up or has no such rank."""
    state = load_state(name)
    if state is None or state.get("phase") != "up":
        raise SimError(f"no simulated cluster {name!r} is up: start one with 'k3deploy sim up --name {name} ...'")
    n = len(state["nodes"])
    if not 0 <= rank < n:
        raise SimError(f"bad rank {rank!r}: cluster {name!r} has node ranks 0..{n - 1}")
    rec = next(r for r in state["nodes"] if r["rank"] == rank)
    return state, rec, NodeLayout(rec["name"], rec["rank"], rec["ip"], rec["veth"], Path(rec["dir"]))


def reboot(
    name: str,
    rank: int,
    progress: Progress | None = None,
    boot_timeout: float | None = None,
    stop_timeout: float | None = None,
) -> dict[str, Any]:
    """Reboot node ``rank`` of a running cluster; returns once its sshd answers again (its systemd, under
    ``sshd-down``).

    The node's systemd reboots as with ``systemctl reboot`` (:func:`k3sim.processes.reboot_node`: units
    stopped, ``ExecStop=`` run, processes sent SIGTERM), its nspawn exits, and the node boots again through the
    launch path of ``up`` (:func:`k3sim.processes.spawn`) with the same root file system, disks, network
    namespace, address and faults; its enabled units start again. A node whose nspawn is no longer running (a
    ``reboot`` inside the node ends its nspawn, and nothing relaunches it) is booted again. A node that does not stop
    within ``stop_timeout`` seconds (``K3SIM_STOP_TIMEOUT``, default 120) is reset (SIGKILL); one that does not
    answer within ``boot_timeout`` (``K3SIM_BOOT_TIMEOUT``, default 90) is an error.

    Returns ``{"cluster", "name", "rank", "ip", "pid", "previous_pid", "was_running", "clean", "seconds"}``
    (``clean``: stopped by its own systemd, not reset).
    """
    say = progress or (lambda _m: None)
    validate_name(name)
    if boot_timeout is None:
        boot_timeout = float(os.environ.get("K3SIM_BOOT_TIMEOUT", "90"))
    if stop_timeout is None:
        stop_timeout = float(os.environ.get("K3SIM_STOP_TIMEOUT", "120"))
    check_host()
    with locked(name):
        state, rec, nd = _running_node(name, rank)
        started = time.monotonic()
        previous = rec.get("pid")
        was_running = processes.ours(rec.get("pid"), rec.get("pid_start"))
        clean = True
        if was_running:
            say(f"rebooting {nd.name}")
            clean = processes.reboot_node(rec, stop_timeout)
            if not clean:
                say(f"{nd.name} did not stop within {stop_timeout:g} s: reset")
        else:
            say(f"{nd.name} is not running: booting it")
        _clear_node(name, nd)
        _boot_again(name, state, rec, nd, boot_timeout)
        seconds = time.monotonic() - started
        say(f"{nd.name} up again in {seconds:.1f} s")
        return {
            "cluster": name,
            "name": nd.name,
            "rank": nd.rank,
            "ip": nd.ip,
            "pid": rec["pid"],
            "previous_pid": previous,
            "was_running": was_running,
            "clean": clean,
            "seconds": round(seconds, 3),
        }


def _clear_node(name: str, nd: NodeLayout) -> None:
    """What a stopped node leaves behind: a reset leaves processes in its cgroups, a clean stop nspawn's empty
    cgroups and propagation directory. The node's own cgroups stay (its v1 memory cgroup keeps the charge of the
    node's tmpfs pages)."""
    cgs = node_cgroups(name, nd.name)
    processes.kill_cgroups(cgs)
    for cg in cgs:
        for sub in [d for d in cg.iterdir() if d.is_dir()] if cg.is_dir() else []:
            processes.remove_cgroup_tree(sub)
    processes.remove_nspawn_leftovers(nd.name)


def _boot_again(name: str, state: dict[str, Any], rec: dict[str, Any], nd: NodeLayout, boot_timeout: float) -> None:
    """Boot a stopped node through the launch path of ``up``, with the same root, disks, network namespace, address
    and faults; returns once it answers on SSH (its systemd, under ``sshd-down``)."""
    if not Path(f"/run/netns/{nd.netns}").exists() or not nd.merged.is_dir():
        raise SimError(f"node {nd.name} has lost its network namespace or root: run "
                       f"'k3deploy sim down --name {name}' and up again")
    umask = os.umask(0o022)
    try:
        proc = processes.spawn(name, nd, append_log=True, own_uptime=bool(state.get("slurm")))
    finally:
        os.umask(umask)
    st = processes.proc_stat(proc.pid)
    rec["pid"], rec["pid_start"] = proc.pid, st[1] if st else None
    save_state(state)
    try:
        _wait_ready(state, [nd], [parse_fault(t) for t in rec.get("faults", [])], boot_timeout)
    finally:
        proc.returncode = 0  # the node outlives this process: stop tracking it as a child


# --------------------------------------------------------------------------- power


def power(
    name: str,
    rank: int,
    on: bool,
    progress: Progress | None = None,
    boot_timeout: float | None = None,
    stop_timeout: float = 15,
) -> dict[str, Any]:
    """Power node ``rank`` of a running cluster off, or on again.

    Off: SIGTERM to the node's nspawn, which its systemd takes as a clean poweroff (its units stop); SIGKILL after
    ``stop_timeout`` seconds. The node's address then answers nothing (its sshd is gone: a connection is refused at
    once, where a real tray's times out). On: the node boots again as it was (same root, disks, address, faults) and
    its enabled units start; returns once it answers on SSH (``K3SIM_BOOT_TIMEOUT``, default 90 s). Powering off a
    node that is off, or on one that is on, does nothing.

    Returns ``{"cluster", "name", "rank", "ip", "power": "on"|"off", "was_on", "at", "seconds"}`` (``at``: the time
    the node went off, or answered again, as ``time.time()``).
    """
    say = progress or (lambda _m: None)
    validate_name(name)
    if boot_timeout is None:
        boot_timeout = float(os.environ.get("K3SIM_BOOT_TIMEOUT", "90"))
    check_host()
    with locked(name):
        state, rec, nd = _running_node(name, rank)
        started = time.monotonic()
        was_on = processes.ours(rec.get("pid"), rec.get("pid_start"))
        if not on and was_on:
            say(f"powering {nd.name} off")
            processes.stop_nodes([rec], timeout=stop_timeout)
            _clear_node(name, nd)
        elif on and not was_on:
            say(f"powering {nd.name} on")
            _clear_node(name, nd)
            _boot_again(name, state, rec, nd, boot_timeout)
        else:
            say(f"{nd.name} is {'on' if on else 'off'} already: nothing to do")
        seconds = time.monotonic() - started
        if on != was_on:
            say(f"{nd.name} {'up again' if on else 'off'} in {seconds:.1f} s")
        return {"cluster": name, "name": nd.name, "rank": nd.rank, "ip": nd.ip, "power": "on" if on else "off",
                "was_on": was_on, "at": time.time(), "seconds": round(seconds, 3)}


# --------------------------------------------------------------------------- runtime faults


def set_faults(
    name: str, add: list[str] | None = None, clear: list[str] | None = None, clear_all: bool = False
) -> dict[str, list[str]]:
    """Add or clear faults on a running cluster; returns each node's faults afterwards (and the outside's, under
    its namespace name ``NAME-out``).

    The node's ``/etc/k3sim/node.json`` is rewritten (the simulated tools re-read it on every call);
    ``disk-full`` shrinks and fills the node's disks, ``sshd-down`` stops and masks ``ssh.service``. Cluster faults
    (``outside-cut=MB``; cleared by ``outside-cut``) go to the outside's ``fault.json``; ``clear_all`` clears them too.
    """
    validate_name(name)
    check_host()
    add_cluster = [sim_faults.parse_cluster_fault(t) for t in add or [] if sim_faults.is_cluster_fault(t)]
    clear_cluster = {t.strip().partition("=")[0].strip() for t in clear or [] if sim_faults.is_cluster_fault(t)}
    add = [t for t in add or [] if not sim_faults.is_cluster_fault(t)]
    clear = [t for t in clear or [] if not sim_faults.is_cluster_fault(t)]
    with locked(name):
        state = load_state(name)
        if state is None or state.get("phase") != "up":
            raise SimError(f"no simulated cluster {name!r} is up: start one with 'k3deploy sim up --name {name} ...'")
        out = state.get("outside")
        if (add_cluster or clear_cluster) and not out:
            raise SimError(f"cluster {name!r} has no simulated outside (made by an older k3deploy): run "
                           f"'k3deploy sim down --name {name}' and up again")
        n = len(state["nodes"])
        adds = [parse_fault(t) for t in add or []]
        clears = [_parse_clear(t) for t in clear or []]
        given: list[sim_faults.Fault | _Clear] = [*adds, *clears]
        for f in given:
            if not 0 <= f.rank < n:
                raise SimError(f"bad fault {fault_text(f)!r}: rank {f.rank} is not in 0..{n - 1}")
        plan = []
        for rec in state["nodes"]:
            before = [parse_fault(t) for t in rec.get("faults", [])]
            after = [] if clear_all else list(before)
            after = [
                f for f in after if not any(c.rank == f.rank and c.kind in ("*", f.kind) for c in clears)
            ]
            for f in adds:
                if f.rank == rec["rank"]:
                    after = [g for g in after if g.kind != f.kind] + [f]
            if [fault_text(f) for f in after] != rec.get("faults", []):
                # a fault the profile cannot take fails here, before any node changes
                node_config(state["hardware"], rec["rank"], n, rec["name"], rec["ip"], after,
                            state["time_scale"], state["cluster_uuid"])  # fmt: skip
                plan.append((rec, before, after))
        umask = os.umask(0o022)
        try:
            everyone = [parse_fault(t) for rec in state["nodes"] for t in rec.get("faults", [])
                        if rec["rank"] not in {r["rank"] for r, _, _ in plan}]
            everyone += [f for _, _, after in plan for f in after]
            for rec, before, after in plan:
                _apply_faults(state, rec, before, after, everyone)
                rec["faults"] = [fault_text(f) for f in after]
                save_state(state)
            # the peers' view of the downed NPU ports (simulated hccn_tool pings), of the IMEX addresses (imex-mgmt)
            if any(f.kind in ("npu-link-down", "imex-mgmt") for _, before, after in plan for f in [*before, *after]):
                for rec in state["nodes"]:
                    if all(r is not rec for r, _, _ in plan):
                        mine = [parse_fault(t) for t in rec.get("faults", [])]
                        _apply_faults(state, rec, mine, mine, everyone)
            if out and (add_cluster or clear_cluster or clear_all):
                _apply_cluster_faults(state, add_cluster, clear_cluster, clear_all)
        finally:
            os.umask(umask)
        res = {rec["name"]: rec.get("faults", []) for rec in state["nodes"]}
        if out:
            res[out["netns"]] = list(out.get("faults", []))
        return res


def _apply_cluster_faults(state: dict[str, Any], add: list[sim_faults.ClusterFault], clear: set[str],
                          clear_all: bool) -> None:
    """Arm or clear the outside's faults (its server reads ``fault.json`` at the next transfer)."""
    out = state["outside"]
    d = Path(out["dir"])
    faults = [] if clear_all else [f for f in out.get("faults", []) if f.partition("=")[0] not in clear]
    for f in add:
        faults = [g for g in faults if g.partition("=")[0] != f.kind] + [str(f)]
        if f.kind == "outside-cut":
            outside.set_cut(d, float(f.value))
    if not any(f.startswith("outside-cut=") for f in faults):
        outside.clear_cut(d)
    out["faults"] = faults
    save_state(state)


def _default_route(faults: list[sim_faults.Fault]) -> str | None:
    """What fault ``default-route`` leaves the node's default route (None: the usual one, via the bridge)."""
    return next((f.value for f in faults if f.kind == "default-route"), None)


def _parse_clear(text: str) -> _Clear:
    """``RANK`` (all faults of that node) or ``RANK:KIND[=VALUE]`` (that kind; the value is ignored)."""
    rank, _, rest = text.strip().partition(":")
    kind = rest.partition("=")[0] or "*"
    if not rank.isdigit() or (kind != "*" and kind not in sim_faults.FAULT_KINDS):
        raise SimError(
            f"bad fault to clear {text!r}: use RANK or RANK:KIND with KIND one of {', '.join(sim_faults.FAULT_KINDS)}"
            f", or a cluster fault kind ({', '.join(sim_faults.CLUSTER_FAULT_KINDS)})"
        )
    return _Clear(int(rank), kind)


def _apply_faults(
    state: dict[str, Any], rec: dict[str, Any], before: list[sim_faults.Fault], after: list[sim_faults.Fault],
    everyone: list[sim_faults.Fault] | None = None,
) -> None:
    """Rewrite one node's tools and config for its faults ``after`` (``everyone``: every node's, for what a node
    sees of its peers)."""
    nd = Path(rec["dir"])
    doc = node_config(
        hardware=state["hardware"],
        rank=rec["rank"],
        nodes=len(state["nodes"]),
        name=rec["name"],
        ip=rec["ip"],
        faults=[*after, *(f for f in everyone or [] if f.rank != rec["rank"])],
        time_scale=state["time_scale"],
        cluster_uuid=state["cluster_uuid"],
    )
    rootfs.install_tools(nd / "merged", doc)
    mm_files = profiles.sysfs_mm_files(doc)
    if mm_files is not None:  # the folder the node has bound over its /sys/kernel/mm (AMD's peer memory)
        profiles.write_sysfs_mm(nd / processes.SYSFS_MM_DIR, mm_files)
    had = {f.kind for f in before}
    has = {f.kind for f in after}
    root = nd / "merged"
    if "disk-full" in has - had:
        for rel in DISK_DIRS:
            rootfs.fill_disk(root / rel)
    elif "disk-full" in had - has:
        for rel in DISK_DIRS:
            rootfs.clear_disk(root / rel)
    if ("imex-mgmt" in had) != ("imex-mgmt" in has):
        mgmt = doc.get("management") or {"interface": profiles.MANAGEMENT_INTERFACE}
        if "imex-mgmt" in has:
            network.add_management(state["name"], rec["rank"], rec["netns"], mgmt["interface"], mgmt["ip"])
        else:
            network.remove_management(rec["netns"], mgmt["interface"])
    if ("rail-only" in had) != ("rail-only" in has) and doc.get("rails"):
        network.set_rail_only(rec["netns"], doc["rails"], "rail-only" in has)
    if _default_route(before) != _default_route(after):
        network.set_default_route(rec["netns"], state["subnet"], rec["rank"], _default_route(after))
    if ("sshd-down" in had) != ("sshd-down" in has):
        pid1 = node_init_pid(rec)
        if pid1 is None:
            raise SimError(
                f"node {rec['name']} is not running: run 'k3deploy sim down --name {state['name']}' and up again"
            )
        action = ["mask", "--now"] if "sshd-down" in has else ["unmask"]
        enter = ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p"]
        run([*enter, "systemctl", *action, "ssh.service"])
        if "sshd-down" not in has:
            run([*enter, "systemctl", "start", "ssh.service"])
