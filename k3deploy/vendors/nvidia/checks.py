"""NVIDIA's preflight side: the facts it reads and the judges of its checks (preflight layer).

The checks' ids, commands, requirements and fixes are registered in the pure pack (:mod:`k3deploy.vendors.nvidia`,
with the floors); the judges here compare a host's facts with them: the driver, Fabric Manager on NVSwitch boards,
the NVLink fabric and the IMEX domain on NVL72 trays, the Container Toolkit, GPUDirect RDMA, and, once every tray
was judged, the NVLink domains of the plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.facts import rdma
from k3deploy.facts.base import FactError, version_at_least
from k3deploy.facts.host import AddressInterface
from k3deploy.facts.rdma import DmabufSupport, LoadedModules
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import (
    CLUSTER,
    HEALTH,
    CheckResult,
    ClusterProbe,
    Device,
    FactSpec,
    HostFacts,
    ProbeRound,
    Read,
    Results,
    VendorChecks,
    VendorRun,
    as_type,
    probe_not_run,
    unit_name,
)
from k3deploy.vendors import nvidia as vendor
from k3deploy.vendors.base import Setting
from k3deploy.vendors.nvidia import facts as facts_nvidia
from k3deploy.vendors.nvidia import probe


@dataclass
class NvidiaFacts(HostFacts):
    """A host's facts on NVIDIA hardware: the common ones, and what NVIDIA's tools say (None: not read on this
    hardware): the GPUs, the driver's flavour (open or proprietary modules), the Container Toolkit, Fabric Manager
    (NVSwitch boards), IMEX and its domain (NVL72 trays), each GPU's NVLink fabric, the loaded kernel modules and
    DMA-BUF's prerequisites (GPUDirect RDMA), and the ConnectX-8 Data Direct PCI functions (GB300)."""

    gpus: list[facts_nvidia.NvidiaGpu] | FactError | None = None
    flavour: facts_nvidia.DriverFlavour | FactError | None = None
    toolkit: facts_nvidia.ToolkitVersion | FactError | None = None
    fabric_manager: facts_nvidia.FabricManagerState | FactError | None = None
    imex: facts_nvidia.ImexState | FactError | None = None
    imex_domain: facts_nvidia.ImexDomainState | FactError | None = None  # nvidia-imex-ctl -N
    fabric: list[facts_nvidia.GpuFabric] | FactError | None = None
    modules: LoadedModules | FactError | None = None
    dmabuf: DmabufSupport | FactError | None = None
    data_direct: list[facts_nvidia.DataDirectFunction] | FactError | None = None

    def read_gpus(self, value: list[facts_nvidia.NvidiaGpu] | FactError) -> None:
        self.gpus = value

    def read_flavour(self, value: facts_nvidia.DriverFlavour | FactError) -> None:
        self.flavour = value

    def read_toolkit(self, value: facts_nvidia.ToolkitVersion | FactError) -> None:
        self.toolkit = value

    def read_fabric_manager(self, value: facts_nvidia.FabricManagerState | FactError) -> None:
        self.fabric_manager = value

    def read_imex(self, value: facts_nvidia.ImexState | FactError) -> None:
        self.imex = value

    def read_imex_domain(self, value: facts_nvidia.ImexDomainState | FactError) -> None:
        self.imex_domain = value

    def read_fabric(self, value: list[facts_nvidia.GpuFabric] | FactError) -> None:
        self.fabric = value

    def read_modules(self, value: LoadedModules | FactError) -> None:
        self.modules = value

    def read_dmabuf(self, value: DmabufSupport | FactError) -> None:
        self.dmabuf = value

    def read_data_direct(self, value: list[facts_nvidia.DataDirectFunction] | FactError) -> None:
        self.data_direct = value


def own(facts: HostFacts) -> NvidiaFacts:
    """``facts`` as NVIDIA's (:func:`~k3deploy.preflight.base.as_type`)."""
    return as_type(facts, NvidiaFacts)


def _check_nvidia_driver(out: Results, sel: Requirements, facts: NvidiaFacts) -> None:
    assert isinstance(facts.gpus, list)
    drivers = sorted({g.driver for g in facts.gpus if g.driver})
    required = f">= {vendor.DRIVER_FLOOR} (CUDA 13 image)"
    if not drivers:
        out.add(facts.host, "nvidia.driver", "fail", "driver version not reported", required,
                "run nvidia-smi on the node and repair the driver installation")
        return
    if len(drivers) > 1:
        out.add(facts.host, "nvidia.driver", "fail", "mixed driver versions " + ", ".join(drivers), required,
                "reinstall one driver version and reboot")
        return
    driver = drivers[0]
    if version_at_least(driver, vendor.DRIVER_FLOOR):
        out.add(facts.host, "nvidia.driver", "pass", driver, required)
    else:
        out.add(
            facts.host, "nvidia.driver", "fail", driver, required,
            f"upgrade to an r580 driver >= {vendor.DRIVER_FLOOR} (with matching Fabric Manager on NVSwitch "
            f"systems) and reboot; the image {sel.image or 'of the plan'} is CUDA 13 only",
        )


def _check_fabric_manager(out: Results, sel: Requirements, facts: NvidiaFacts) -> None:
    if sel.hardware.id not in vendor.NVSWITCH_HARDWARE or facts.fabric_manager is None:
        return
    fm = facts.fabric_manager
    required = vendor.PACK.check("nvidia.fabricmanager").required
    if isinstance(fm, FactError):
        out.error(facts.host, "nvidia.fabricmanager", fm, required,
                  vendor.PACK.check("nvidia.fabricmanager").fix)
        return
    driver = None
    if isinstance(facts.gpus, list):
        drivers = {g.driver for g in facts.gpus if g.driver}
        driver = drivers.pop() if len(drivers) == 1 else None
    if fm.service != "active":
        observed = f"service {fm.service}" + (f" ({fm.detail})" if fm.detail else "")
        out.add(facts.host, "nvidia.fabricmanager", "fail", observed, required,
                "systemctl enable --now nvidia-fabricmanager (without it CUDA fails with error 802 "
                "'system not yet initialized')")
        return
    if fm.version is None or driver is None:
        out.add(facts.host, "nvidia.fabricmanager", "warn", f"active, version {fm.version or 'unknown'}", required,
                "compare own(facts)-fabricmanager --version with the driver version by hand")
        return
    if fm.version != driver:
        if version_at_least(driver, vendor.DRIVER_FLOOR):
            fix = f"install nvidia-fabricmanager {driver} (the driver's exact version) and restart it"
        else:  # the driver itself must move first: the Fabric Manager follows the driver being installed
            fix = (f"after the driver upgrade to r580 (>= {vendor.DRIVER_FLOOR}), install the nvidia-fabricmanager of "
                   "exactly that new driver version and restart it")
        out.add(facts.host, "nvidia.fabricmanager", "fail", f"active, version {fm.version} (driver {driver})", required,
                fix)
        return
    out.add(facts.host, "nvidia.fabricmanager", "pass", f"active, version {fm.version}", required)


def no_nvlink_fabric(facts: NvidiaFacts) -> bool:
    """Every GPU of the host reports its NVLink fabric as N/A: no GPU of it reaches another tray over NVLink (an HGX
    or PCIe GPU, or a GB200 NVL4 board, whose NVLink stays on the board), as opposed to a fabric that is still
    forming (``In Progress``) or has no cluster yet."""
    return isinstance(facts.fabric, list) and bool(facts.fabric) and all(
        g.state is None and g.status is None and g.cluster_uuid is None for g in facts.fabric)


def _fabric_identity(facts: NvidiaFacts) -> tuple[str, str] | None:
    if not isinstance(facts.fabric, list) or not facts.fabric:
        return None
    ids = {(g.cluster_uuid, g.clique_id) for g in facts.fabric}
    if len(ids) != 1:
        return None
    uuid, clique = ids.pop()
    if uuid is None or clique is None:
        return None
    return uuid, clique


def _check_fabric_host(out: Results, sel: Requirements, facts: NvidiaFacts) -> bool:
    """Per-tray NVLink fabric state; True when the tray is usable for MNNVL."""
    required = vendor.FABRIC_REQUIRED
    fab = facts.fabric
    if fab is None:
        return False
    if isinstance(fab, FactError):
        out.error(facts.host, "nvlink.fabric", fab, required, "repair nvidia-smi on this tray")
        return False
    if not fab:
        out.add(facts.host, "nvlink.fabric", "fail", "nvidia-smi -q shows no Fabric block", required,
                f"the driver is too old to report the NVLink fabric: install r580 >= {vendor.DRIVER_FLOOR}")
        return False
    if no_nvlink_fabric(facts):
        names = sorted({g.name for g in facts.gpus}) if isinstance(facts.gpus, list) else []
        out.add(
            facts.host, "nvlink.fabric", "fail",
            f"no multi-node NVLink: Fabric State N/A on every GPU{' (' + ', '.join(names) + ')' if names else ''}",
            required + f" ({unit_name(sel.hardware)}: its GPUs reach the other trays of the rack over NVLink)",
            f"{sel.hardware.id} is the compute tray of an NVL72 rack; a board whose NVLink stays on the board (the "
            f"GB200 NVL4: 4 GPUs, scale-out over InfiniBand/Ethernet only) cannot run this plan's multi-node NVLink "
            "(tensor parallelism across trays, MegaMoE): use NVL72 compute trays, or check that the NVLink switch "
            "trays and the tray's NVLink cables are up (nvidia-smi -q shows a Fabric State other than N/A)",
        )
        return False
    # a fabric can be Completed/Success and still report its health Unhealthy, a route unhealthy or an incorrect
    # configuration such as insufficient NVLinks (NVML's fabric health mask)
    unjoined = [g for g in fab if not g.completed or not g.has_cluster]
    bad = unjoined + [g for g in fab if g.completed and g.has_cluster and g.health_failures]
    if bad:
        shown = "; ".join(
            f"GPU {g.gpu}: State {g.state or 'N/A'}, Status {g.status or 'N/A'}, ClusterUUID {g.cluster_uuid or 'N/A'}"
            + "".join(f", {reason}" for reason in g.health_failures)
            for g in bad[:4]
        )
        if not unjoined:
            reasons = sorted({reason for g in bad for reason in g.health_failures})
            fix = (f"the tray joined the NVLink domain but its fabric health is Unhealthy ({', '.join(reasons)}): "
                   "check the tray's NVLink links and the NVLink switch trays (nvidia-smi -q, Fabric > Health; "
                   "Incorrect Configuration names what is wrong), then rerun preflight")
        else:
            fix = ("the tray has not joined the NVLink domain: check the NVLink switch trays and nvidia-imex "
                   "(journalctl -u nvidia-imex); 'In Progress' usually settles within minutes, then rerun preflight")
        out.add(facts.host, "nvlink.fabric", "fail", shown, required, fix)
        return False
    identity = _fabric_identity(facts)
    if identity is None:
        ids = sorted({f"{g.cluster_uuid}/{g.clique_id}" for g in fab})
        out.add(facts.host, "nvlink.fabric", "fail", "GPUs disagree: " + ", ".join(ids), required,
                "the tray's GPUs sit in different NVLink partitions: fix the partition assignment (NMX)")
        return False
    return True


def fabric_degraded(facts: NvidiaFacts) -> str:
    """The GPUs whose fabric health reports reduced capacity (Limited Capacity, Bandwidth Degraded, a recovery
    running), as shown in a result; "" when none does."""
    slow = [g for g in facts.fabric if g.health_degraded] if isinstance(facts.fabric, list) else []
    more = f" (+{len(slow) - 4} more)" if len(slow) > 4 else ""
    return "; ".join(f"GPU {g.gpu}: {', '.join(g.health_degraded)}" for g in slow[:4]) + more


def _check_nvswitch_fabric(out: Results, sel: Requirements, facts: NvidiaFacts) -> None:
    """HGX boards: every GPU registered with the NVSwitch fabric (State Completed, Status Success). Fabric Manager can
    be active, of the driver's version, and the GPUs still In Progress (after a Fabric Manager failure, or with
    FABRIC_MODE=1 until their partition is activated): CUDA then fails at engine start."""
    if sel.hardware.id not in vendor.NVSWITCH_HARDWARE or facts.fabric is None:
        return
    required = vendor.NVSWITCH_FABRIC_REQUIRED
    fab = facts.fabric
    if isinstance(fab, FactError):
        out.error(facts.host, "nvswitch.fabric", fab, required, "repair nvidia-smi on this node")
        return
    if not fab:
        out.add(facts.host, "nvswitch.fabric", "warn", "nvidia-smi -q shows no Fabric block", required,
                f"the driver is too old to report the GPUs' fabric registration: install r580 >= "
                f"{vendor.DRIVER_FLOOR}")
        return
    if no_nvlink_fabric(facts):
        out.add(facts.host, "nvswitch.fabric", "warn", f"Fabric State N/A on all {len(fab)} GPU(s)", required,
                f"{unit_name(sel.hardware)} GPUs sit on NVSwitch and report their registration: check that this node "
                "is that board (an NVSwitch-less or PCIe board does not match k3_hardware) and that "
                "nvidia-fabricmanager runs")
        return
    unjoined = [g for g in fab if not g.completed]
    if unjoined:
        states = Counter(f"State {g.state or 'N/A'}, Status {g.status or 'N/A'}" for g in unjoined)
        shown = "; ".join(f"{n} GPU(s) {state}" for state, n in states.items())
        first = ", ".join(g.gpu for g in unjoined[:4]) + (" ..." if len(unjoined) > 4 else "")
        out.add(facts.host, "nvswitch.fabric", "fail",
                f"{len(unjoined)} of {len(fab)} GPU(s) not registered with the NVSwitch fabric: {shown} ({first})",
                required, vendor.NVSWITCH_FABRIC_FIX)
        return
    failing = [g for g in fab if g.health_failures]
    if failing:
        shown = "; ".join(f"GPU {g.gpu}: {', '.join(g.health_failures)}" for g in failing[:4])
        out.add(facts.host, "nvswitch.fabric", "fail", shown, required,
                "the NVSwitch fabric reports these GPUs unhealthy: check their NVLinks and the baseboard "
                "(nvidia-smi -q > Fabric > Health, nvidia-smi nvlink -s, journalctl -u nvidia-fabricmanager)")
        return
    slow = fabric_degraded(facts)
    if slow:
        out.add(facts.host, "nvswitch.fabric", "warn", f"registered, degraded: {slow}", required,
                vendor.FABRIC_DEGRADED_FIX)
        return
    out.add(facts.host, "nvswitch.fabric", "pass", f"{len(fab)} GPU(s) Completed, Success", required)


def _check_imex(out: Results, sel: Requirements, facts: NvidiaFacts, trays: list[NvidiaFacts] | None = None) -> None:
    if not sel.mnnvl or facts.imex is None:
        return
    required = vendor.PACK.check("nvidia.imex").required
    imex = facts.imex
    if isinstance(imex, FactError):
        out.error(facts.host, "nvidia.imex", imex, required, vendor.PACK.check("nvidia.imex").fix)
        return
    if sel.imex_per_job:
        _check_imex_per_job(out, sel, facts, imex, trays)
        return
    problems = []
    if imex.service != "active":
        problems.append(f"nvidia-imex {imex.service}" + (f" ({imex.detail})" if imex.detail else ""))
    if "channel0" not in imex.channels:
        problems.append("no channel0 in /dev/nvidia-caps-imex-channels")
    if problems:
        out.add(
            facts.host, "nvidia.imex", "fail", "; ".join(problems), required,
            "list every tray of the NVLink domain in /etc/nvidia-imex/nodes_config.cfg, "
            "systemctl enable --now nvidia-imex, and create channel0 (module option NVreg_CreateImexChannel0=1 "
            "survives reboots; mknod does not)",
        )
    else:
        out.add(facts.host, "nvidia.imex", "pass", f"active, {', '.join(imex.channels)}", required)
    if imex.service == "active":  # an inactive daemon is reported above: its domain cannot be read
        _check_imex_domain(out, sel, facts, trays or [facts])


def _check_imex_per_job(out: Results, sel: Requirements, facts: NvidiaFacts, imex: facts_nvidia.ImexState,
                        trays: list[NvidiaFacts] | None) -> None:
    """IMEX per Slurm job (``k3_imex: per_job``): Slurm's switch/nvidia_imex, or the site's prolog, gives each job its
    channel and may run IMEX only inside a job, so neither a running daemon nor channel 0 is asked for outside one;
    the IMEX packages must be on the tray (what the switch plugin and the prolog start). A daemon that runs
    between jobs (switch/nvidia_imex beside a standing daemon) is still asked for its domain."""
    required = vendor.PACK.check("nvidia.imex").required
    outside = (f"daemon {imex.service}, {', '.join(imex.channels) or 'no channel'} outside any job")
    if imex.installed is False:
        out.add(facts.host, "nvidia.imex", "fail", f"IMEX per job, but no nvidia-imex on the tray ({outside})",
                required, "install the IMEX packages of the driver's branch (nvidia-imex) on every tray: the site's "
                "Slurm (switch/nvidia_imex, or its IMEX prolog) starts IMEX for each job from them")
        return
    out.add(facts.host, "nvidia.imex", "pass", f"IMEX per job: nvidia-imex installed ({outside})", required)
    if imex.service == "active":
        _check_imex_domain(out, sel, facts, trays or [facts])


def _tray_names(facts: NvidiaFacts) -> set[str]:
    """What ``nodes_config.cfg`` may call this tray: its inventory name, its cluster address, and every address of
    its interfaces (NVIDIA's IMEX guide lets a site run IMEX on another network, e.g. the management network, with
    ``BIND_INTERFACE_IP`` / ``NETWORK_INTERFACE``)."""
    names = {name for name in (facts.address, facts.host) if name}
    if isinstance(facts.interface, AddressInterface):
        names |= {a.address for a in facts.interface.addresses if a.interface != "lo"}
    return names


def nvlink_group(sel: Requirements, host: str, trays: Sequence[HostFacts]) -> tuple[str, list[str]]:
    """The group whose trays must share ``host``'s NVLink domain (and IMEX domain), with its hosts: the planned group
    ``host`` serves in (each replica its own: two replicas may sit in two racks), else every planned tray (a plan
    whose groups are not known) but the spares; a spare's own group is itself."""
    group = sel.group_of(host)
    if group is not None:
        return group[0], list(group[1])
    if host in sel.spares:
        return "spare", [host]
    return "engine", [t.host for t in trays if t.host not in sel.spares]


def _check_imex_domain(out: Results, sel: Requirements, facts: NvidiaFacts, trays: list[NvidiaFacts]) -> None:
    """The IMEX domain has formed for this plan: every planned serving tray in it READY and connected to the other
    planned ones, this tray's group listed. A node of the domain that is a spare standing by (powered off, or IMEX
    stopped) or a host of the inventory that cannot be reached (a lost member, whose rank a spare takes) is not
    asked to be READY: the domain is then DEGRADED, which is not a failure while every planned tray is READY, and
    the result says which nodes stand by."""
    domain = facts.imex_domain
    if domain is None:
        return
    # the trays that must share this tray's IMEX domain: its group's when the plan wants one NVLink domain per group
    if sel.one_nvlink_domain:
        _, names = nvlink_group(sel, facts.host, trays)
        members = [t for t in trays if t.unreachable is None and t.host in names]
    else:
        members = [facts]
    if facts not in members:
        members.append(facts)
    required = ("nvidia-imex-ctl -N: Domain State UP, every node READY, every pair C (Connected), "
                f"{'these trays' if len(members) > 1 else 'this tray'} listed (a spare or an unreachable host may "
                "be down)")
    if isinstance(domain, FactError):
        out.error(facts.host, "nvidia.imex.domain", domain, required,
                  "install nvidia-imex-ctl (the nvidia-imex package) and enable the IMEX command service in "
                  "/etc/nvidia-imex/config.cfg (NVIDIA IMEX guide, 'IMEX Service Command Service'), then restart "
                  "nvidia-imex")
        return
    # nodes of the domain that need not be READY: spares standing by, hosts that cannot be reached (said by
    # host.reachable; with spares, one takes the lost member's rank)
    excused: dict[str, str] = {}
    for t in trays:
        if t.host == facts.host or (t.host not in sel.spares and t.unreachable is None):
            continue
        why = f"spare {t.host}" if t.host in sel.spares else f"unreachable host {t.host}"
        for name in _tray_names(t):
            excused.setdefault(name, why)
    asked = [n for n in domain.nodes if n.status == "READY" or n.address not in excused]
    standing = [n for n in domain.nodes if n not in asked]
    problems: list[str] = []
    if domain.domain_state != "UP" and not (domain.domain_state == "DEGRADED" and standing):
        problems.append(f"Domain State {domain.domain_state}")
    for node in asked:
        if node.status != "READY":
            problems.append(f"node #{node.index} {node.address} {node.status}")
    bad = [(a, b, code) for a, b, code in domain.not_connected()
           if a.address not in excused and (b is None or b.address not in excused)]
    if bad:
        shown = ", ".join(f"#{a.index}->#{b.index if b is not None else '?'} {code}" for a, b, code in bad[:6])
        more = f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""
        problems.append(f"{len(bad)} of {len(domain.nodes) ** 2} links not Connected: {shown}{more}")
    listed = {n.address for n in domain.nodes}
    missing = [t for t in members if not _tray_names(t) & listed]
    if missing:
        problems.append("not in the domain: " + ", ".join(f"{t.host} ({t.address})" if t.address and t.address != t.host
                                                          else t.host for t in missing))
    count = f"{len(domain.nodes)} node(s)"
    aside = "".join(f"; {excused[n.address]} ({n.address}) {n.status}, not asked to be READY" for n in standing)
    if problems:
        out.add(facts.host, "nvidia.imex.domain", "fail", f"{count}; " + "; ".join(problems) + aside, required,
                vendor.IMEX_DOMAIN_FIX)
    elif standing:
        out.add(facts.host, "nvidia.imex.domain", "pass",
                f"{domain.domain_state}, {len(asked)} of {count} READY, connected{aside}", required)
    else:
        out.add(facts.host, "nvidia.imex.domain", "pass", f"UP, {count} READY, all connected", required)


def _check_toolkit(out: Results, sel: Requirements, facts: NvidiaFacts) -> None:
    if facts.toolkit is None:
        return
    required = "nvidia-container-toolkit" + (f" >= {vendor.CTK_IMEX_CHANNELS_MIN}" if sel.mnnvl else "")
    if isinstance(facts.toolkit, FactError):
        out.error(facts.host, "container.toolkit", facts.toolkit, required,
                  vendor.PACK.check("container.toolkit").fix)
        return
    version = facts.toolkit.version
    if sel.mnnvl and not version_at_least(version, vendor.CTK_IMEX_CHANNELS_MIN):
        out.add(facts.host, "container.toolkit", "warn", version, required,
                f"the engine unit already passes the IMEX channel itself (--device {vendor.IMEX_CHANNEL}), which "
                f"this toolkit honours; upgrade it to >= {vendor.CTK_IMEX_CHANNELS_MIN} (apt install "
                "nvidia-container-toolkit) only where containers outside k3deploy ask for the channel through "
                "NVIDIA_IMEX_CHANNELS")
        return
    out.add(facts.host, "container.toolkit", "pass", version, required)


def _check_data_direct(out: Results, sel: Requirements, facts: NvidiaFacts, dmabuf: DmabufSupport) -> bool:
    """GB300 + ConnectX-8: GPUDirect RDMA goes through the NIC's Data Direct function, which needs the ``-nvidia``
    kernel flavour >= 6.14 (or its backports): a stock 6.14 has the version and not the patches, and NCCL falls back
    to host memory. Passes on the flavour or on a Data Direct function bound to ``mlx5_data_direct``; a kernel that
    only has the version is a warning (``k3_nccl_probe`` shows whether NCCL uses GPUDirect RDMA). True when it
    reported the host (the DMA-BUF prerequisites are then not reported again)."""
    kernel = dmabuf.kernel
    required = (f"the -nvidia kernel >= {vendor.DATA_DIRECT_MIN_KERNEL} (or a ConnectX-8 Data Direct function bound to "
                f"{facts_nvidia.DATA_DIRECT_DRIVER}): {unit_name(sel.hardware)} with ConnectX-8 reaches GPU memory "
                "through the NIC's Data Direct function")
    fix = (f"install the {vendor.DATA_DIRECT_MIN_KERNEL}-nvidia kernel ({vendor.DATA_DIRECT_KERNEL_PACKAGE}) and "
           "reboot, as NVIDIA's Grace Blackwell CX8 GPUDirect RDMA guide says; rdma_topo topo shows each GPU's NIC "
           "and Data Direct function")
    functions = facts.data_direct if isinstance(facts.data_direct, list) else []
    bound = [f for f in functions if f.driver == facts_nvidia.DATA_DIRECT_DRIVER]
    flavour = vendor.DATA_DIRECT_FLAVOUR in kernel.split("-")[1:]
    recent = version_at_least(kernel.split("-")[0], vendor.DATA_DIRECT_MIN_KERNEL)
    if not recent and not bound:
        out.add(facts.host, "rdma.gpudirect", "fail", f"kernel {kernel}: no Data Direct DMA-BUF for ConnectX-8",
                required, fix)
        return True
    if dmabuf.prerequisites_met is not True or (flavour and not bound):
        return False  # the DMA-BUF prerequisites decide (and report the -nvidia flavour's kernel)
    if bound:
        shown = ", ".join(f.address for f in bound[:4]) + (" ..." if len(bound) > 4 else "")
        out.add(facts.host, "rdma.gpudirect", "pass",
                f"kernel {kernel}; Data Direct function(s) {shown} bound to {facts_nvidia.DATA_DIRECT_DRIVER}",
                required)
        return True
    if isinstance(facts.data_direct, FactError):
        seen = f"Data Direct functions not read ({facts.data_direct.message(facts.host)})"
    elif functions:
        seen = f"Data Direct function(s) {', '.join(f.address for f in functions[:4])} bound to no driver"
    else:
        seen = "no Data Direct PCI function (15b3:2100) seen"
    out.add(facts.host, "rdma.gpudirect", "warn",
            f"kernel {kernel}: the version only, not the -{vendor.DATA_DIRECT_FLAVOUR} flavour; {seen}", required,
            f"a stock kernel of that version lacks the Data Direct patches and NCCL then stages through host memory: "
            f"set k3_nccl_probe: true to have preflight run an NCCL all-reduce and show whether it uses GPUDirect RDMA "
            f"(GDRDMA), or {fix}")
    return True


def _check_gpudirect(out: Results, sel: Requirements, facts: NvidiaFacts) -> None:
    """GPUDirect RDMA on the host: DMA-BUF (NVIDIA's recommended path) or, on x86, the legacy nvidia_peermem. Grace
    trays (GB200/GB300) have no nvidia_peermem; CUDA 13 deprecates the NV-P2P API nvidia_peermem is built on, so it
    is only a fallback where DMA-BUF cannot work, never a requirement."""
    grace = bool(getattr(sel.hardware, "nvl", False))
    required = "DMA-BUF usable" + ("" if grace else " (nvidia_peermem only as a deprecated fallback)")
    dmabuf, modules = facts.dmabuf, facts.modules
    peermem = isinstance(modules, LoadedModules) and "nvidia_peermem" in modules
    if isinstance(dmabuf, DmabufSupport) and sel.hardware.id in vendor.DATA_DIRECT_HARDWARE and \
            _check_data_direct(out, sel, facts, dmabuf):
        return
    if isinstance(dmabuf, DmabufSupport) and dmabuf.prerequisites_met:
        driver = f"mlx5_ib {dmabuf.mlx5_version}" if dmabuf.mlx5_version else "inbox mlx5_ib"
        out.add(facts.host, "rdma.gpudirect", "pass",
                f"DMA-BUF prerequisites met (kernel {dmabuf.kernel}, open modules, {driver})", required)
        return
    why = "; ".join(dmabuf.reasons) if isinstance(dmabuf, DmabufSupport) else (
        dmabuf.message(facts.host) if isinstance(dmabuf, FactError) else "not checked")
    unknown = not isinstance(dmabuf, DmabufSupport) or dmabuf.prerequisites_met is None
    if peermem and not grace:
        out.add(facts.host, "rdma.gpudirect", "warn", f"nvidia_peermem loaded (DMA-BUF: {why})", required,
                "works, but CUDA 13 deprecates the NV-P2P API nvidia_peermem uses: move to DMA-BUF (open kernel "
                "modules, kernel >= 5.12, mlx5 driver with DMA-BUF memory regions)")
        return
    if unknown:
        out.add(facts.host, "rdma.gpudirect", "warn", f"DMA-BUF prerequisites unknown: {why}", required,
                "check that the NVIDIA open modules and mlx5_ib are loaded; set k3_nccl_probe: true to have preflight "
                "run an NCCL all-reduce and see whether it uses GPUDirect RDMA (GDRDMA)")
        return
    fix = ("use the NVIDIA open kernel modules on kernel >= 5.12; otherwise NCCL stages through host memory"
           if grace else "use the NVIDIA open kernel modules on kernel >= 5.12 (or, deprecated with CUDA 13, "
           "modprobe nvidia-peermem and add it to /etc/modules-load.d); otherwise NCCL stages through host memory")
    mods = "" if grace else "; " + (modules.message(facts.host) if isinstance(modules, FactError)
                                    else "nvidia_peermem not loaded")
    out.add(facts.host, "rdma.gpudirect", vendor.GPUDIRECT_MISSING_STATUS, f"DMA-BUF: {why}{mods}", required, fix)


def _fabric_listed(out: Results, sel: Requirements, facts: NvidiaFacts) -> tuple[str, str] | None:
    """The tray's NVLink domain (ClusterUUID, CliqueId) when its fabric check passed."""
    if not (getattr(sel.hardware, "nvl", False) and _check_fabric_host(out, sel, facts)):
        return None
    identity = _fabric_identity(facts)
    assert identity is not None
    return identity


class NvidiaRun(VendorRun):
    def __init__(self, requirements: Requirements, hosts: Sequence[HostFacts]) -> None:
        super().__init__(requirements, hosts)
        self.trays = [own(h) for h in hosts]
        self.fabric_ok: dict[str, tuple[str, str]] = {}

    def _tray_passed(self, out: Results, host: str, observed: str, required: str) -> None:
        """A tray whose fabric passed: a warning instead when its fabric health reports reduced capacity."""
        facts = next((h for h in self.trays if h.host == host), None)
        slow = fabric_degraded(facts) if facts is not None else ""
        if slow:
            out.add(host, "nvlink.fabric", "warn", f"{observed}; degraded: {slow}", required,
                    vendor.FABRIC_DEGRADED_FIX)
        else:
            out.add(host, "nvlink.fabric", "pass", observed, required)

    def devices_listed(self, out: Results, facts: HostFacts) -> None:
        _check_nvidia_driver(out, self.requirements, own(facts))

    def after_devices(self, out: Results, facts: HostFacts, listed: bool) -> None:
        sel = self.requirements
        if listed:
            _check_fabric_manager(out, sel, own(facts))
            _check_nvswitch_fabric(out, sel, own(facts))
            identity = _fabric_listed(out, sel, own(facts))
            if identity is not None:
                self.fabric_ok[own(facts).host] = identity
            _check_imex(out, sel, own(facts), self.trays)
        _check_toolkit(out, sel, own(facts))

    def after_rdma(self, out: Results, facts: HostFacts) -> None:
        _check_gpudirect(out, self.requirements, own(facts))

    def cluster(self, out: Results) -> None:
        """The NVLink domains of the trays whose fabric passed: one domain per group (each replica's trays) for
        tensor parallelism across trays, the domains listed for data/expert parallelism over several."""
        sel, hosts, fabric_ok = self.requirements, self.hosts, self.fabric_ok
        if not getattr(sel.hardware, "nvl", False):
            return
        if len(fabric_ok) > 1 and not sel.one_nvlink_domain:
            # data/expert parallelism over several NVL domains: each tray in a Completed domain; the domains listed
            domains = Counter(fabric_ok.values())
            for h, (uuid, clique) in fabric_ok.items():
                self._tray_passed(out, h, f"Completed; ClusterUUID {uuid}, CliqueId {clique}", vendor.FABRIC_REQUIRED)
            per_domain = " + ".join(str(n) for n in domains.values())
            out.add(CLUSTER, "nvlink.domains", "pass" if len(domains) == 1 else "warn",
                    f"{len(domains)} NVLink domain(s) ({per_domain} trays)", "one domain keeps all traffic on NVLink",
                    "" if len(domains) == 1 else f"{sel.strategy} runs across domains: traffic between them goes "
                    "over RDMA")
        elif len(fabric_ok) > 1:
            # one NVLink domain per group (each replica its own: two replicas in two racks are fine), not one for
            # every planned tray
            order = [h.host for h in hosts if h.host in fabric_ok]
            groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
            for h in order:
                name, names = nvlink_group(sel, h, hosts)
                groups.setdefault((name, tuple(names)), []).append(h)
            for (name, _), trays in groups.items():
                counts = Counter(fabric_ok[h] for h in trays)
                top = max(counts.values())
                # majority identity; ties go to the first host in inventory order (the group's head)
                majority = next(fabric_ok[h] for h in trays if counts[fabric_ok[h]] == top)
                split = "; ".join(f"{h}: ClusterUUID {fabric_ok[h][0]}, CliqueId {fabric_ok[h][1]}" for h in trays)
                for h in trays:
                    uuid, clique = fabric_ok[h]
                    required = (f"ClusterUUID {majority[0]}, CliqueId {majority[1]} (the NVLink domain of the other "
                                f"trays of group {name})")
                    if fabric_ok[h] == majority:
                        self._tray_passed(out, h, f"Completed; ClusterUUID {uuid}, CliqueId {clique}", required)
                    else:
                        out.add(h, "nvlink.fabric", "fail",
                                f"ClusterUUID {uuid}, CliqueId {clique}; group {name} is split across "
                                f"{len(counts)} NVLink domains ({split})", required,
                                f"the trays of group {name} must share one NVL72 rack and partition (tensor "
                                "parallelism across its trays): give this tray's rank to a tray of that domain "
                                "(k3_replica, rank), or plan it as a separate deployment")
        else:
            for h, (uuid, clique) in fabric_ok.items():
                self._tray_passed(out, h, f"Completed; ClusterUUID {uuid}, CliqueId {clique}", vendor.FABRIC_REQUIRED)


class NcclAllReduce(ClusterProbe):
    """``k3_nccl_probe``: the two-node NCCL all-reduce in the image on the planned engine nodes
    (:mod:`k3deploy.vendors.nvidia.probe`), once every other check has passed (a node that fails them would fail it
    too, for a reason already shown); multi-node plans over RDMA only."""

    check = probe.CHECK
    after_render = True

    def run(self, at: ProbeRound) -> list[CheckResult]:
        wanted, rollout = at.target, at.rollout
        if not wanted.vars.k3_nccl_probe:
            return []
        engine_hosts = list(dict.fromkeys(u.host for u in rollout.units if u.group != "router"))
        if not (wanted.requirements.needs_rdma and len(engine_hosts) >= 2):
            return [probe_not_run()]
        if not at.ok:
            return [CheckResult(CLUSTER, probe.CHECK, "warn", "not run: other checks failed",
                                "every other check passed first", "fix the failures above, then rerun preflight")]
        hosts = {host.name: host for host in at.state.inventory}
        facts = [f for f in at.facts if f.host in engine_hosts]
        return probe.run_probe(at.state, hosts, facts, at.host_env, wanted.vars.k3_docker, rollout.plan.image)


class NvidiaChecks(VendorChecks):
    pack = vendor.PACK
    facts_type = NvidiaFacts
    capture = (
        (facts_nvidia.NvidiaGpus, {}),
        (facts_nvidia.NvidiaDriverFlavour, {}),
        (facts_nvidia.NvidiaContainerToolkit, {}),
        (facts_nvidia.FabricManager, {}),
        (facts_nvidia.Imex, {}),
        (facts_nvidia.ImexDomain, {}),
        (facts_nvidia.NvlinkFabric, {}),
        (facts_nvidia.GpuNicTopology, {}),
        (facts_nvidia.NvidiaHealth, {}),
    )

    def facts(self, requirements: Requirements) -> list[FactSpec]:
        sel = requirements
        plan: list[FactSpec] = [
            Read("gpus", facts_nvidia.NvidiaGpus, NvidiaFacts.read_gpus),
            Read("toolkit", facts_nvidia.NvidiaContainerToolkit, NvidiaFacts.read_toolkit),
        ]
        if sel.hardware.id in vendor.NVSWITCH_HARDWARE:
            # Fabric Manager, and each GPU's registration with the NVSwitch fabric (it can stay In Progress while the
            # service is active)
            plan += [Read("fabric_manager", facts_nvidia.FabricManager, NvidiaFacts.read_fabric_manager),
                     Read("fabric", facts_nvidia.NvlinkFabric, NvidiaFacts.read_fabric)]
        elif getattr(sel.hardware, "nvl", False):
            plan.append(Read("fabric", facts_nvidia.NvlinkFabric, NvidiaFacts.read_fabric))
            if sel.mnnvl:
                plan += [Read("imex", facts_nvidia.Imex, NvidiaFacts.read_imex),
                         Read("imex_domain", facts_nvidia.ImexDomain, NvidiaFacts.read_imex_domain)]
        if sel.needs_rdma:
            plan += [
                Read("topology", facts_nvidia.GpuNicTopology, HostFacts.read_topology),
                Read("flavour", facts_nvidia.NvidiaDriverFlavour, NvidiaFacts.read_flavour),
                Read("modules", rdma.KernelModules, NvidiaFacts.read_modules),
                Read("dmabuf", rdma.DmabufPrerequisites, NvidiaFacts.read_dmabuf),
            ]
            if sel.hardware.id in vendor.DATA_DIRECT_HARDWARE:
                plan.append(Read("data_direct", facts_nvidia.DataDirect, NvidiaFacts.read_data_direct))
        return plan

    def devices(self, facts: HostFacts) -> list[Device] | FactError | None:
        gpus = own(facts).gpus
        if gpus is None or isinstance(gpus, FactError):
            return gpus
        return [Device(g.name, g.memory_mib / 1024 if g.memory_mib is not None else None) for g in gpus]

    def begin(self, requirements: Requirements, hosts: Sequence[HostFacts]) -> VendorRun:
        return NvidiaRun(requirements, hosts)

    def probes(self) -> tuple[ClusterProbe, ...]:
        return (NcclAllReduce(),)

    def health(self, requirements: Requirements, config_dir: str) -> FactSpec | None:
        """XID events, ECC and row remapping, NVLink links; a link down is fatal on an NVL72 compute tray."""
        nvl = bool(getattr(requirements.hardware, "nvl", False))
        return Read(HEALTH, facts_nvidia.NvidiaHealth, HostFacts.read_health, {"config_dir": config_dir, "nvl": nvl})

    def nvlink(self, requirements: Requirements, facts: HostFacts) -> str | None:
        """GB200/GB300 NVL72 compute trays (not where the tray's GPUs report no NVLink fabric at all, as a GB200 NVL4
        board does)."""
        return None if no_nvlink_fabric(own(facts)) else self.pack.transport.nvlink(requirements.hardware)

    def rdma_settings(self, requirements: Requirements, facts: HostFacts) -> tuple[list[Setting], bool]:
        """NCCL_DMABUF_ENABLE=0 when DMA-BUF GPUDirect RDMA is not usable; then, on x86, nvidia_peermem must be
        loaded (CUDA 13 deprecates it, Grace has none)."""
        dmabuf = own(facts).dmabuf
        if isinstance(dmabuf, DmabufSupport) and dmabuf.prerequisites_met is False:
            return ([("NCCL_DMABUF_ENABLE", "0", "DMA-BUF not usable: " + "; ".join(dmabuf.reasons))],
                    not getattr(requirements.hardware, "nvl", False))
        return [], False


CHECKS = NvidiaChecks()
