"""Preflight checks: pure functions from (selection, per-host facts) to a list of results.

Nothing here touches a host. :func:`run_checks` takes the planned selection (hardware profile,
strategy, variant, node count) and one :class:`HostFacts` per node and returns one
:class:`CheckResult` per host and check (plus cluster-wide results under the host name
``"cluster"``). Every result carries what was observed, what is required and the fix.

The checks every host gets are here; a vendor's own are judged by its pack's preflight side
(``k3deploy/vendors/<family>/checks.py``, found by :data:`VENDOR_CHECKS`), whose floors live with the pure pack
(:mod:`k3deploy.vendors.nvidia` and its siblings). Each check's id, command, requirement and fix are registered
there too (:meth:`k3deploy.vendors.base.Pack.check`).

Thresholds are module variables so a site can change them before calling :func:`run_checks`:

* ``SHM_MIN_GIB``: ``/dev/shm`` size below which NCCL/PyTorch shared memory runs out.
* ``IMAGE_DISK_MIN_GIB``: free space where container images are stored.
* ``CACHE_DISK_FACTOR``: free space for weights = factor x the variant's ``vram_minimum_gb``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from k3deploy.facts.base import FactError
from k3deploy.facts.host import AddressInterface, DiskSpace
from k3deploy.facts.rdma import GpuTopology, RdmaDevice, choose_ports
from k3deploy.facts.rollout import StageDaemon
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import (
    CLUSTER,
    GIB,
    CheckResult,
    Device,
    HostFacts,
    Results,
    Status,
    VendorChecks,
    VendorRun,
    describe_mix,
    gib,
    unit_name,
)
from k3deploy.vendors import PACKS, Pack, pack_for
from k3deploy.vendors.base import Spot
from k3deploy.vendors.common import COMMON, QUARANTINE_NOTE, SHM_MIN_GIB

__all__ = [
    "CLUSTER", "VENDOR_CHECKS", "CheckResult", "HostFacts", "Status", "failed_hosts", "run_checks", "summarize",
    "vendor_checks",
]

IMAGE_DISK_MIN_GIB = 100.0
CACHE_DISK_FACTOR = 1.0

#: the checks every host gets (id, command, requirement, fix), by id
_COMMON = {check.id: check for check in COMMON}



def preflight_side(pack: Pack) -> VendorChecks:
    """The pack's preflight side: ``CHECKS`` of its ``checks`` module (``k3deploy/vendors/<name>/checks.py``)."""
    module = f"k3deploy.vendors.{pack.name}.checks"
    checks = getattr(importlib.import_module(module), "CHECKS", None)
    if not isinstance(checks, VendorChecks) or checks.pack is not pack:
        raise ImportError(f"{module} has no CHECKS of the {pack.name} pack: define CHECKS, its VendorChecks")
    return checks


#: the preflight side of every vendor pack, by pack name (found in the packs: :func:`preflight_side`)
VENDOR_CHECKS: dict[str, VendorChecks] = {pack.name: preflight_side(pack) for pack in PACKS}


def vendor_checks(sel: Requirements) -> VendorChecks:
    """The preflight side of the plan's vendor pack."""
    return VENDOR_CHECKS[pack_for(sel).name]


# --------------------------------------------------------------------------- per-host rules


def _check_accelerators(out: Results, sel: Requirements, facts: HostFacts, judges: VendorChecks,
                        run: VendorRun) -> list[Device] | None:
    hw = sel.hardware
    pack = judges.pack
    tool = pack.tool
    devices = judges.devices(facts)
    if devices is None:
        return None
    if isinstance(devices, FactError):
        out.error(facts.host, pack.driver_check, devices, f"working {tool}", pack.driver_fix)
        return None
    if not devices:
        out.add(
            facts.host, "gpu.count", "fail", f"{tool} sees no devices", f"{hw.gpu_count} ({hw.id})",
            "check that the devices are visible (lspci, dmesg for Xid / 'fallen off the bus') and the driver is loaded",
        )
        return None

    run.devices_listed(out, facts)

    names = [d.shown for d in devices]
    allowed = tuple(getattr(hw, "gpu_names", ()) or ())
    ids = tuple(i.lower() for i in getattr(hw, "pci_device_ids", ()) or ())
    wrong = sorted({d.shown for d in devices if not pack.model_matches(d.name, d.device_id, allowed, ids)})
    required = " or ".join(allowed) + (f" (PCI device {' or '.join(ids)})" if ids else "")
    if allowed:
        if wrong:
            out.add(
                facts.host, "gpu.model", "fail", describe_mix(names), required + f" ({hw.id})",
                f"this node is not a {unit_name(hw)}: set k3_hardware (now from {sel.hardware_from}) to what "
                "these nodes are, or move this node to an inventory of its own",
            )
        else:
            out.add(facts.host, "gpu.model", "pass", describe_mix(names), required)
    else:
        out.add(facts.host, "gpu.model", "warn", describe_mix(names), f"no product names known for {hw.id}",
                "add gpu_names for this hardware to the taxonomy")

    count = len(devices)
    if count == hw.gpu_count:
        out.add(facts.host, "gpu.count", "pass", str(count), str(hw.gpu_count))
    else:
        out.add(
            facts.host, "gpu.count", "fail", f"{count} devices", f"{hw.gpu_count} per node ({hw.id})",
            # the vendor's own reasons (NVIDIA: hidden or MIG devices; AMD: CPX/NPS4 partitions)
            f"{pack.check('gpu.count').fix}, or correct the hardware in the inventory",
        )
    return devices


def _check_runtime(out: Results, sel: Requirements, facts: HostFacts) -> None:
    if facts.runtime is None:
        return
    box = pack_for(sel).container
    required = "docker daemon answering" + (f" with the {box.docker_runtime} runtime" if box.docker_runtime else "")
    rt = facts.runtime
    if isinstance(rt, FactError):
        out.error(facts.host, "container.runtime", rt, required, _COMMON["container.runtime"].fix)
        return
    if rt.server_version is None:
        out.add(facts.host, "container.runtime", "fail", f"docker daemon not reachable: {rt.error}", required,
                "systemctl enable --now docker (and check that the deploy user may use the docker socket)")
        return
    if box.docker_runtime and box.docker_runtime not in rt.runtimes:
        out.add(facts.host, "container.runtime", "warn",
                f"docker {rt.server_version}, runtimes: {' '.join(rt.runtimes) or 'none'}", required, box.runtime_fix)
        return
    out.add(facts.host, "container.runtime", "pass", f"docker {rt.server_version}", required)


def _active_ports(devices: list[RdmaDevice]) -> list[tuple[str, int, str | None]]:
    return [(d.name, p.port, p.link_layer) for d in devices for p in d.ports if p.active]


def gpu_topology(facts: HostFacts) -> GpuTopology | None:
    """The host's GPU/NIC matrix when it was read (an unreadable one leaves the port choice to the other rules)."""
    return facts.topology if isinstance(facts.topology, GpuTopology) else None


def _check_rdma(out: Results, sel: Requirements, facts: HostFacts) -> bool:
    """RDMA for multi-node / P/D; True when at least one port is active."""
    if not sel.needs_rdma or facts.rdma is None or not pack_for(sel).transport.rdma_ports:
        return False
    required = _COMMON["rdma.devices"].required
    if isinstance(facts.rdma, FactError):
        out.error(facts.host, "rdma.devices", facts.rdma, required,
                  "install rdma-core (ibverbs-utils) or DOCA-OFED; without RDMA NCCL falls back to TCP sockets")
        return False
    active = _active_ports(facts.rdma)
    if not facts.rdma:
        out.add(facts.host, "rdma.devices", "fail", "no RDMA devices", required,
                "load the mlx5 driver (mlx5_ib) and check the HCAs; without RDMA NCCL falls back to NET/Socket")
        return False
    if not active:
        ports = ", ".join(f"{d.name}:{p.port} {p.state}" for d in facts.rdma for p in d.ports)
        out.add(facts.host, "rdma.devices", "fail", ports or "devices without ports", required,
                "bring the ports up (cable, subnet manager for InfiniBand, switch config for RoCE)")
        return False
    itf = facts.interface if isinstance(facts.interface, AddressInterface) else None
    choice = choose_ports(facts.rdma, itf.default_interface if itf else None, facts.ib_hca, gpu_topology(facts))
    layers = {(d.name, p.port): p.link_layer for d in facts.rdma for p in d.ports}
    shown = ", ".join(f"{d}:{p} {layers.get((d, p)) or '?'}" for d, p in choice.ports)
    if choice.excluded:
        shown += "; not " + ", ".join(f"{d}:{p} ({why})" for d, p, why in choice.excluded)
    if choice.missing:
        have = ", ".join(f"{name}:{port}" for name, port, _ in active)
        out.add(facts.host, "rdma.devices", "fail",
                f"k3_ib_hca names {', '.join(choice.missing)}: no active port of that name (active: {have})",
                required + ", as k3_ib_hca names them",
                "fix k3_ib_hca (`ibv_devinfo` lists each device and port), or bring those ports up")
        return bool(choice.ports)
    gpus = sel.hardware.gpu_count
    if choice.front_end:
        out.add(facts.host, "rdma.devices", "warn", shown + " (carries the default route)", required,
                "the only active RDMA port is the front-end NIC: NCCL and the KV transfer share it with every other "
                "traffic; bring up the back-end ports, or name the intended ones in k3_ib_hca")
    elif not choice.from_setting and gpus and len(choice.ports) != gpus:
        out.add(facts.host, "rdma.devices", "warn", f"{len(choice.ports)} ports chosen for {gpus} GPUs: {shown}",
                required + f", one GPU NIC port per GPU ({gpus}) or k3_ib_hca",
                "name the GPU NICs' ports in k3_ib_hca (a DPU, storage or front-end port in NCCL_IB_HCA can time "
                "out ibv_modify_qp), or bring up the missing GPU NIC ports")
    else:
        out.add(facts.host, "rdma.devices", "pass", shown, required)
    return True


def _check_interface(out: Results, facts: HostFacts) -> None:
    if facts.interface is None:
        return
    required = _COMMON["network.interface"].required
    itf = facts.interface
    if isinstance(itf, FactError):
        out.error(facts.host, "network.interface", itf, required, "install iproute2")
        return
    if itf.address:
        if itf.interface is None:
            have = ", ".join(f"{a.interface} {a.address}" for a in itf.addresses)
            out.add(facts.host, "network.interface", "fail", f"{itf.address} not configured (have {have})", required,
                    "the inventory address must belong to this node: fix ssh_hostname / k3_ip")
        elif itf.interface == "lo":
            out.add(facts.host, "network.interface", "fail", f"{itf.address} on lo", required,
                    "use the node's cluster address, not a loopback address (NCCL would bootstrap on lo)")
        else:
            out.add(facts.host, "network.interface", "pass", f"{itf.address} on {itf.interface}", required)
        return
    if itf.default_interface and itf.default_interface != "lo":
        out.add(facts.host, "network.interface", "warn", f"no address given; default route on {itf.default_interface}",
                required, "set k3_ip (or ssh_hostname) to the node's cluster address")
    else:
        out.add(facts.host, "network.interface", "fail", "no address given and no default route", required,
                "set k3_ip (or ssh_hostname) to the node's cluster address")


def _check_space(out: Results, facts: HostFacts, check: str, space: DiskSpace | FactError | None,
                 need_gib: float | None, what: str, fix: str, use_size: bool = False) -> None:
    if space is None or need_gib is None:
        return
    required = f">= {gib(need_gib)} {what}"
    if isinstance(space, FactError):
        out.error(facts.host, check, space, required, fix)
        return
    have = (space.size_bytes if use_size else space.available_bytes) / GIB
    observed = f"{gib(have)} {'size' if use_size else 'free'} on {space.mount} ({space.path})"
    out.add(facts.host, check, "pass" if have >= need_gib else "fail", observed, required, fix)


def _check_stage_leftover(out: Results, facts: HostFacts) -> None:
    """``stage.peers``: the stage's read-only rsync daemon (root, serving the model cache and the stage directory to
    the cluster's engine hosts) runs only while a stage does; one running now was left by a run that was killed.
    Said only when found (a warning: the next deploy stops it in its first step)."""
    from k3deploy.model.commands import PEERS_UNIT

    daemon = facts.stage_peers
    if not isinstance(daemon, StageDaemon) or not daemon.running:
        return
    out.add(facts.host, "stage.peers", "warn", f"{PEERS_UNIT}.service {daemon.state}"
            + (f" since {daemon.since}" if daemon.since else "") + " (rsync --daemon as root, left by a killed run)",
            _COMMON["stage.peers"].required, f"systemctl stop {PEERS_UNIT} on {facts.host} (the next deploy "
            "stops it in its first stage step)")


def _check_health(out: Results, judges: VendorChecks, facts: HostFacts) -> None:
    """``node.quarantine``: the node carries a quarantine record (the deploy quarantined it for a fatal health event;
    it runs nothing until the operator releases it). ``hardware.health``: the vendor's health fact reports no fatal
    event (each fatal one named: its device, the event, the tool's line, and what to do)."""
    if facts.quarantined is not None:
        rule = _COMMON["node.quarantine"]
        out.add(facts.host, "node.quarantine", "fail", f"quarantined: {facts.quarantined}", rule.required,
                rule.fix.replace("NODE", facts.host))
    if not facts.health_read:
        return
    check = judges.pack.check("hardware.health")
    if facts.health_error is not None:
        out.add(facts.host, "hardware.health", "warn", facts.health_error.message(facts.host), check.required,
                f"run `{check.command_for(Spot())}` on {facts.host} and read it")
        return
    fatal = facts.health.fatal
    if fatal:
        shown = "; ".join(f"{e.title()}: {e.text}" for e in fatal[:4])
        more = f" (+{len(fatal) - 4} more)" if len(fatal) > 4 else ""
        fix = " ".join(f"{fix[0].upper()}{fix[1:]}." for fix in facts.health.fixes())
        out.add(facts.host, "hardware.health", "fail", shown + more, check.required,
                f"{facts.host} must not serve: {QUARANTINE_NOTE}. {fix}")
    elif facts.health.events:
        out.add(facts.host, "hardware.health", "warn", facts.health.summary(), check.required,
                "not fatal: the node serves; watch whether the events repeat (k3deploy status shows them)")
    else:
        out.add(facts.host, "hardware.health", "pass", "no fatal event", check.required)


# ------------------------------------------------------------------------------------- entry


def run_checks(sel: Requirements, hosts: Sequence[HostFacts]) -> list[CheckResult]:
    """All checks for all hosts: per-host results in host order, then the cluster-wide ones."""
    out = Results()
    hw = sel.hardware
    judges = vendor_checks(sel)
    run = judges.begin(sel, hosts)
    memory: dict[str, float | None] = {}
    for facts in hosts:
        if facts.unreachable is not None:
            out.add(facts.host, "host.reachable", "fail", facts.unreachable, _COMMON["host.reachable"].required,
                    _COMMON["host.reachable"].fix)
            memory[facts.host] = None
            continue
        _check_health(out, judges, facts)
        devices = _check_accelerators(out, sel, facts, judges, run)
        if devices is not None:
            sizes = [d.memory_gib for d in devices if d.memory_gib is not None]
            memory[facts.host] = sum(sizes) if len(sizes) == len(devices) else None
        else:
            memory[facts.host] = None
        run.after_devices(out, facts, devices is not None)
        _check_runtime(out, sel, facts)
        if _check_rdma(out, sel, facts):
            run.after_rdma(out, facts)
        _check_interface(out, facts)
        _check_space(out, facts, "disk.images", facts.disk_images, IMAGE_DISK_MIN_GIB, "for container images",
                     _COMMON["disk.images"].fix)
        cache_need = sel.vram_minimum_gb * CACHE_DISK_FACTOR if sel.vram_minimum_gb else None
        held = facts.extra.get("weights")   # the rollout's reading of the cache, when it asked (WeightsStatus)
        weights_what = "for the model weights"
        if cache_need is not None and getattr(held, "complete", False):
            cache_need = 0.0   # a re-run, a rollback or pre-staged weights: only what is missing needs room
            weights_what = "more: the weights are in the cache already"
        _check_space(out, facts, "disk.cache", facts.disk_cache, cache_need, weights_what,
                     _COMMON["disk.cache"].fix)
        _check_space(out, facts, "disk.shm", facts.shm, SHM_MIN_GIB, "of /dev/shm",
                     _COMMON["disk.shm"].fix,
                     use_size=True)
        _check_stage_leftover(out, facts)
        run.last(out, facts)

    # ---- cluster-wide: the vendor's own (NVLink domains), then the memory of the planned nodes
    run.cluster(out)

    # ---- cluster-wide: memory of the planned nodes against the variant's planning minimum
    if sel.vram_minimum_gb:
        known = {h: m for h, m in memory.items() if m is not None}
        total = sum(known.values())
        unknown = sorted(h for h, m in memory.items() if m is None)
        need = sel.vram_minimum_gb
        required = (f">= {need:g} GB for variant {sel.variant} (the recipe's GB = GiB = MiB/1024, "
                    f"summed over the planned nodes)")
        observed = f"{total:.1f} GB over {len(known)} of {len(hosts)} nodes"
        if unknown:
            observed += f" (unknown: {', '.join(unknown)})"
        if total >= need:
            out.add(CLUSTER, "gpu.memory", "pass", observed, required)
        elif unknown:
            out.add(CLUSTER, "gpu.memory", "fail", observed, required,
                    "fix the nodes whose memory could not be read, then rerun preflight")
        else:
            per_node = float(hw.vram_gb) if hw.vram_gb else 0.0
            more = ""
            if per_node > 0:
                nodes_needed = -(-need // per_node)
                more = f": plan at least {int(nodes_needed)} {hw.id} nodes"
            out.add(CLUSTER, "gpu.memory", "fail", observed, required,
                    f"the checkpoint does not fit{more}, or choose a smaller variant")
    return out.results


def summarize(results: list[CheckResult]) -> dict[str, int]:
    counts = {"pass": 0, "warn": 0, "fail": 0}
    for r in results:
        counts[r.status] += 1
    return counts


def failed_hosts(results: list[CheckResult]) -> list[str]:
    seen: list[str] = []
    for r in results:
        if r.status == "fail" and r.host not in seen:
            seen.append(r.host)
    return seen
