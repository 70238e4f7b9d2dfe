"""Preflight checks: pure functions from (selection, per-host facts) to a list of results.

Nothing here touches a host. :func:`run_checks` takes the planned selection (hardware profile,
strategy, variant, node count) and one :class:`HostFacts` per node and returns one
:class:`CheckResult` per host and check (plus cluster-wide results under the host name
``"cluster"``). Every result carries what was observed, what is required and the fix.

Thresholds are module variables so a site can change them before calling :func:`run_checks`:

* ``NVIDIA_DRIVER_FLOOR``: minimum Linux driver for the CUDA 13.0 image ``vllm/vllm-openai:kimi-k3``.
* ``CTK_IMEX_CHANNELS_MIN``: Container Toolkit version that understands ``NVIDIA_IMEX_CHANNELS``.
* ``SHM_MIN_GIB``: ``/dev/shm`` size below which NCCL/PyTorch shared memory runs out.
* ``IMAGE_DISK_MIN_GIB``: free space where container images are stored.
* ``CACHE_DISK_FACTOR``: free space for weights = factor x the variant's ``vram_minimum_gb``.
* ``ASCEND_DRIVER_RECOMMENDED``: Ascend HDK the vllm-ascend K3 images are validated with.
* ``ROCM_HOST_MIN``: host ROCm userspace floor (None: the ROCm image brings its own ROCm).
* ``GPUDIRECT_MISSING_STATUS``: status when DMA-BUF cannot serve GPUDirect RDMA and no nvidia_peermem stands in
  (none on Grace) (NCCL then stages through host memory: it works, much slower, so a multi-node K3
  deployment treats it as a failure; set "warn" to accept it).
* ``ASCEND_NETWORK_STATUS``: status of ``ascend.network`` when an NPU's port is not ``link status: UP`` with ``net
  health status: Success`` (vllm-ascend's multi-node guides require both on every NPU; set "warn" where the site
  has checked the NPUs' reachability by ``hccn_tool -hccs_ping`` itself), and of ``ascend.peers`` when a ping
  from NPU i to NPU i of another host does not come back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from k3deploy.facts.amd import AmdGpu, AmdSmiVersions, RocmDriver
from k3deploy.facts.ascend import AscendVersionInfo, NpuInfo, NpuPort
from k3deploy.facts.base import FactError, version_at_least
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, KernelRelease
from k3deploy.facts.nvidia import (
    DriverFlavour,
    FabricManagerState,
    GpuFabric,
    GpuTopology,
    ImexDomainState,
    ImexState,
    NvidiaGpu,
    ToolkitVersion,
)
from k3deploy.facts.rdma import DmabufSupport, LoadedModules, RdmaDevice, choose_ports
from k3deploy.facts.rollout import StageDaemon
from k3deploy.model.requirements import Requirements

NVIDIA_DRIVER_FLOOR = "580.65.06"
CTK_IMEX_CHANNELS_MIN = "1.17.0"
SHM_MIN_GIB = 16.0
IMAGE_DISK_MIN_GIB = 100.0
CACHE_DISK_FACTOR = 1.0
ASCEND_DRIVER_RECOMMENDED = "25.5"
ROCM_HOST_MIN: str | None = None
GPUDIRECT_MISSING_STATUS: Status = "fail"
ASCEND_NETWORK_STATUS: Status = "fail"

#: hardware ids of HGX baseboards with NVSwitch, where Fabric Manager must run
NVSWITCH_HARDWARE = frozenset({"h100", "h200", "b200", "b300"})
CLUSTER = "cluster"
GIB = 1024**3

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class CheckResult:
    host: str
    check: str
    status: Status
    observed: str
    required: str
    fix: str = ""


@dataclass
class HostFacts:
    """Facts of one host; None = not collected (the fact does not apply to this hardware)."""

    host: str
    address: str = ""
    unreachable: str | None = None  # the connection error, when the host could not be reached
    gpus: list[NvidiaGpu] | FactError | None = None
    flavour: DriverFlavour | FactError | None = None
    toolkit: ToolkitVersion | FactError | None = None
    fabric_manager: FabricManagerState | FactError | None = None
    imex: ImexState | FactError | None = None
    imex_domain: ImexDomainState | FactError | None = None  # nvidia-imex-ctl -N
    fabric: list[GpuFabric] | FactError | None = None
    rdma: list[RdmaDevice] | FactError | None = None
    topology: GpuTopology | FactError | None = None  # nvidia-smi topo -m: how near each HCA sits to the GPUs
    modules: LoadedModules | FactError | None = None
    dmabuf: DmabufSupport | FactError | None = None
    kernel: KernelRelease | FactError | None = None
    amd_versions: AmdSmiVersions | FactError | None = None
    rocm_driver: RocmDriver | FactError | None = None
    amd_gpus: list[AmdGpu] | FactError | None = None
    npu: NpuInfo | FactError | None = None
    ascend: AscendVersionInfo | FactError | None = None
    hccn: list[NpuPort] | FactError | None = None  # the NPUs' network ports (multi-node Ascend)
    runtime: ContainerRuntime | FactError | None = None
    disk_images: DiskSpace | FactError | None = None
    disk_cache: DiskSpace | FactError | None = None
    shm: DiskSpace | FactError | None = None
    interface: AddressInterface | FactError | None = None
    stage_peers: StageDaemon | FactError | None = None   # the stage's rsync daemon, when a killed run left it up
    ib_hca: str | None = None  # k3_ib_hca: the RDMA ports the site names for NCCL and UCX (not read from the host)
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ helpers


def _gib(value: float) -> str:
    return f"{value:.1f} GiB"


def _unit_name(hardware: Any) -> str:
    return str(getattr(hardware, "label", None) or hardware.id)


def _names_match(name: str, allowed: tuple[str, ...] | list[str]) -> bool:
    norm = " ".join(name.split()).casefold()
    return any(norm == " ".join(a.split()).casefold() for a in allowed)


def _words(text: str) -> list[str]:
    return text.casefold().split()


def _amd_name_match(name: str, allowed: tuple[str, ...] | list[str]) -> bool:
    """An AMD product name matches when an allowed name appears in it as whole words, in any case: rocm-smi prints
    the form factor and more after the model ("AMD Instinct MI300X OAM", "AMD INSTINCT MI250 (MCM) OAM AC MBA").

    >>> _amd_name_match("AMD Instinct MI300X OAM", ["AMD Instinct MI300X"]), _amd_name_match("MI300A", ["MI300X"])
    (True, False)
    """
    have = _words(name)
    for a in allowed:
        want = _words(a)
        if want and any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1)):
            return True
    return False


@dataclass(frozen=True)
class _Device:
    name: str
    memory_gib: float | None
    device_id: str | None = None  # PCI device id (AMD)

    @property
    def shown(self) -> str:
        return f"{self.name} ({self.device_id})" if self.device_id else self.name


def _devices(facts: HostFacts, brand: str) -> list[_Device] | FactError | None:
    """The accelerators of a host, whatever the vendor: name and memory in GiB (the recipe's GB)."""
    if brand == "NVIDIA":
        if facts.gpus is None or isinstance(facts.gpus, FactError):
            return facts.gpus
        return [_Device(g.name, g.memory_mib / 1024 if g.memory_mib is not None else None) for g in facts.gpus]
    if brand == "AMD":
        if facts.amd_gpus is None or isinstance(facts.amd_gpus, FactError):
            return facts.amd_gpus
        return [
            _Device(g.name or "AMD GPU", g.vram_bytes / GIB if g.vram_bytes is not None else None,
                    getattr(g, "device_id", None))
            for g in facts.amd_gpus
        ]
    if brand == "Huawei":
        if facts.npu is None or isinstance(facts.npu, FactError):
            return facts.npu
        return [
            _Device(c.name, c.hbm_total_mb / 1024 if c.hbm_total_mb is not None else None)
            for c in facts.npu.chips
        ]
    return None


def _describe_mix(names: list[str]) -> str:
    counts = Counter(names)
    return ", ".join(f"{n}x {name}" for name, n in sorted(counts.items()))


class _Out:
    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    def add(self, host: str, check: str, status: Status, observed: str, required: str, fix: str = "") -> None:
        self.results.append(CheckResult(host, check, status, observed, required, fix if status != "pass" else ""))

    def error(self, host: str, check: str, err: FactError, required: str, fix: str) -> None:
        self.add(host, check, "fail", err.message(host), required, fix)


# --------------------------------------------------------------------------- per-host rules


def _check_accelerators(out: _Out, sel: Requirements, f: HostFacts) -> list[_Device] | None:
    hw = sel.hardware
    brand = sel.brand
    tool = {"NVIDIA": "nvidia-smi", "AMD": "rocm-smi", "Huawei": "npu-smi"}.get(brand, "")
    devices = _devices(f, brand)
    check = {"NVIDIA": "nvidia.driver", "AMD": "rocm.devices", "Huawei": "ascend.driver"}.get(brand, "gpu.devices")
    if devices is None:
        return None
    if isinstance(devices, FactError):
        fix = {
            "NVIDIA": f"install the NVIDIA r580 driver (>= {NVIDIA_DRIVER_FLOOR}, open kernel modules) and reboot",
            "AMD": "install the amdgpu driver (amdgpu-dkms) and ROCm SMI, then reboot",
            "Huawei": "install the Ascend driver and firmware (HDK) so that npu-smi works, then reboot",
        }.get(brand, "install the accelerator driver")
        out.error(f.host, check, devices, f"working {tool}", fix)
        return None
    if not devices:
        out.add(
            f.host, "gpu.count", "fail", f"{tool} sees no devices", f"{hw.gpu_count} ({hw.id})",
            "check that the devices are visible (lspci, dmesg for Xid / 'fallen off the bus') and the driver is loaded",
        )
        return None

    if brand == "NVIDIA":
        _check_nvidia_driver(out, sel, f)

    names = [d.shown for d in devices]
    allowed = tuple(getattr(hw, "gpu_names", ()) or ())
    ids = tuple(i.lower() for i in getattr(hw, "pci_device_ids", ()) or ())
    if brand == "AMD":
        # by PCI device id where the kernel says it, else by the product name as words
        wrong = sorted({d.shown for d in devices
                        if not (d.device_id is not None and d.device_id.lower() in ids)
                        and not _amd_name_match(d.name, allowed)})
    else:
        wrong = sorted({d.shown for d in devices if not _names_match(d.name, allowed)})
    required = " or ".join(allowed) + (f" (PCI device {' or '.join(ids)})" if ids else "")
    if allowed:
        if wrong:
            out.add(
                f.host, "gpu.model", "fail", _describe_mix(names), required + f" ({hw.id})",
                f"this node is not a {_unit_name(hw)}: set k3_hardware (now from {sel.hardware_from}) to what "
                "these nodes are, or move this node to an inventory of its own",
            )
        else:
            out.add(f.host, "gpu.model", "pass", _describe_mix(names), required)
    else:
        out.add(f.host, "gpu.model", "warn", _describe_mix(names), f"no product names known for {hw.id}",
                "add gpu_names for this hardware to the taxonomy")

    count = len(devices)
    if count == hw.gpu_count:
        out.add(f.host, "gpu.count", "pass", str(count), str(hw.gpu_count))
    else:
        out.add(
            f.host, "gpu.count", "fail", f"{count} devices", f"{hw.gpu_count} per node ({hw.id})",
            "a device is missing or hidden (CUDA_VISIBLE_DEVICES, MIG, dmesg Xid errors): repair the node, "
            "or correct the hardware in the inventory",
        )
    return devices


def _check_nvidia_driver(out: _Out, sel: Requirements, f: HostFacts) -> None:
    assert isinstance(f.gpus, list)
    drivers = sorted({g.driver for g in f.gpus if g.driver})
    required = f">= {NVIDIA_DRIVER_FLOOR} (CUDA 13 image)"
    if not drivers:
        out.add(f.host, "nvidia.driver", "fail", "driver version not reported", required,
                "run nvidia-smi on the node and repair the driver installation")
        return
    if len(drivers) > 1:
        out.add(f.host, "nvidia.driver", "fail", "mixed driver versions " + ", ".join(drivers), required,
                "reinstall one driver version and reboot")
        return
    driver = drivers[0]
    if version_at_least(driver, NVIDIA_DRIVER_FLOOR):
        out.add(f.host, "nvidia.driver", "pass", driver, required)
    else:
        out.add(
            f.host, "nvidia.driver", "fail", driver, required,
            f"upgrade to an r580 driver >= {NVIDIA_DRIVER_FLOOR} (with matching Fabric Manager on NVSwitch "
            f"systems) and reboot; the image {sel.image or 'of the plan'} is CUDA 13 only",
        )


def _check_fabric_manager(out: _Out, sel: Requirements, f: HostFacts) -> None:
    if sel.brand != "NVIDIA" or sel.hardware.id not in NVSWITCH_HARDWARE or f.fabric_manager is None:
        return
    fm = f.fabric_manager
    required = "nvidia-fabricmanager active, version = driver version"
    if isinstance(fm, FactError):
        out.error(f.host, "nvidia.fabricmanager", fm, required,
                  "install nvidia-fabricmanager of the driver's version and enable it")
        return
    driver = None
    if isinstance(f.gpus, list):
        drivers = {g.driver for g in f.gpus if g.driver}
        driver = drivers.pop() if len(drivers) == 1 else None
    if fm.service != "active":
        observed = f"service {fm.service}" + (f" ({fm.detail})" if fm.detail else "")
        out.add(f.host, "nvidia.fabricmanager", "fail", observed, required,
                "systemctl enable --now nvidia-fabricmanager (without it CUDA fails with error 802 "
                "'system not yet initialized')")
        return
    if fm.version is None or driver is None:
        out.add(f.host, "nvidia.fabricmanager", "warn", f"active, version {fm.version or 'unknown'}", required,
                "compare nv-fabricmanager --version with the driver version by hand")
        return
    if fm.version != driver:
        if version_at_least(driver, NVIDIA_DRIVER_FLOOR):
            fix = f"install nvidia-fabricmanager {driver} (the driver's exact version) and restart it"
        else:  # the driver itself must move first: the Fabric Manager follows the driver being installed
            fix = (f"after the driver upgrade to r580 (>= {NVIDIA_DRIVER_FLOOR}), install the nvidia-fabricmanager of "
                   "exactly that new driver version and restart it")
        out.add(f.host, "nvidia.fabricmanager", "fail", f"active, version {fm.version} (driver {driver})", required,
                fix)
        return
    out.add(f.host, "nvidia.fabricmanager", "pass", f"active, version {fm.version}", required)


def no_nvlink_fabric(f: HostFacts) -> bool:
    """Every GPU of the host reports its NVLink fabric as N/A: no GPU of it reaches another tray over NVLink (an HGX
    or PCIe GPU, or a GB200 NVL4 board, whose NVLink stays on the board), as opposed to a fabric that is still
    forming (``In Progress``) or has no cluster yet."""
    return isinstance(f.fabric, list) and bool(f.fabric) and all(
        g.state is None and g.status is None and g.cluster_uuid is None for g in f.fabric)


def _fabric_identity(f: HostFacts) -> tuple[str, str] | None:
    if not isinstance(f.fabric, list) or not f.fabric:
        return None
    ids = {(g.cluster_uuid, g.clique_id) for g in f.fabric}
    if len(ids) != 1:
        return None
    uuid, clique = ids.pop()
    if uuid is None or clique is None:
        return None
    return uuid, clique


FABRIC_REQUIRED = "every GPU: State Completed, Status Success, one ClusterUUID and CliqueId, Health not Unhealthy"


def _check_fabric_host(out: _Out, sel: Requirements, f: HostFacts) -> bool:
    """Per-tray NVLink fabric state; True when the tray is usable for MNNVL."""
    required = FABRIC_REQUIRED
    fab = f.fabric
    if fab is None:
        return False
    if isinstance(fab, FactError):
        out.error(f.host, "nvlink.fabric", fab, required, "repair nvidia-smi on this tray")
        return False
    if not fab:
        out.add(f.host, "nvlink.fabric", "fail", "nvidia-smi -q shows no Fabric block", required,
                f"the driver is too old to report the NVLink fabric: install r580 >= {NVIDIA_DRIVER_FLOOR}")
        return False
    if no_nvlink_fabric(f):
        names = sorted({g.name for g in f.gpus}) if isinstance(f.gpus, list) else []
        out.add(
            f.host, "nvlink.fabric", "fail",
            f"no multi-node NVLink: Fabric State N/A on every GPU{' (' + ', '.join(names) + ')' if names else ''}",
            required + f" ({_unit_name(sel.hardware)}: its GPUs reach the other trays of the rack over NVLink)",
            f"{sel.hardware.id} is the compute tray of an NVL72 rack; a board whose NVLink stays on the board (the "
            f"GB200 NVL4: 4 GPUs, scale-out over InfiniBand/Ethernet only) cannot run this plan's multi-node NVLink "
            "(tensor parallelism across trays, MegaMoE): use NVL72 compute trays, or check that the NVLink switch "
            "trays and the tray's NVLink cables are up (nvidia-smi -q shows a Fabric State other than N/A)",
        )
        return False
    # a fabric can be Completed/Success and still report its Health Summary Unhealthy (NVML's fabric health)
    bad = [g for g in fab if not g.completed or not g.has_cluster or g.health == "Unhealthy"]
    if bad:
        shown = "; ".join(
            f"GPU {g.gpu}: State {g.state or 'N/A'}, Status {g.status or 'N/A'}, ClusterUUID {g.cluster_uuid or 'N/A'}"
            + (f", Health {g.health}" if g.health == "Unhealthy" else "")
            for g in bad[:4]
        )
        if all(g.completed and g.has_cluster for g in bad):
            fix = ("the tray joined the NVLink domain but its fabric health is Unhealthy: check the tray's NVLink "
                   "links and the NVLink switch trays (nvidia-smi -q, Fabric > Health), then rerun preflight")
        else:
            fix = ("the tray has not joined the NVLink domain: check the NVLink switch trays and nvidia-imex "
                   "(journalctl -u nvidia-imex); 'In Progress' usually settles within minutes, then rerun preflight")
        out.add(f.host, "nvlink.fabric", "fail", shown, required, fix)
        return False
    identity = _fabric_identity(f)
    if identity is None:
        ids = sorted({f"{g.cluster_uuid}/{g.clique_id}" for g in fab})
        out.add(f.host, "nvlink.fabric", "fail", "GPUs disagree: " + ", ".join(ids), required,
                "the tray's GPUs sit in different NVLink partitions: fix the partition assignment (NMX)")
        return False
    return True


def _check_imex(out: _Out, sel: Requirements, f: HostFacts, trays: list[HostFacts] | None = None) -> None:
    if not sel.mnnvl or f.imex is None:
        return
    required = "nvidia-imex active and /dev/nvidia-caps-imex-channels/channel0 present"
    imex = f.imex
    if isinstance(imex, FactError):
        out.error(f.host, "nvidia.imex", imex, required, "install and enable nvidia-imex")
        return
    problems = []
    if imex.service != "active":
        problems.append(f"nvidia-imex {imex.service}" + (f" ({imex.detail})" if imex.detail else ""))
    if "channel0" not in imex.channels:
        problems.append("no channel0 in /dev/nvidia-caps-imex-channels")
    if problems:
        out.add(
            f.host, "nvidia.imex", "fail", "; ".join(problems), required,
            "list every tray of the NVLink domain in /etc/nvidia-imex/nodes_config.cfg, "
            "systemctl enable --now nvidia-imex, and create channel0 (module option NVreg_CreateImexChannel0=1 "
            "survives reboots; mknod does not)",
        )
    else:
        out.add(f.host, "nvidia.imex", "pass", f"active, {', '.join(imex.channels)}", required)
    if imex.service == "active":  # an inactive daemon is reported above: its domain cannot be read
        _check_imex_domain(out, sel, f, trays or [f])


#: the fix of a domain that has not formed
IMEX_DOMAIN_FIX = ("check that /etc/nvidia-imex/nodes_config.cfg lists every tray of the NVLink domain, the same "
                   "file on every tray, then restart nvidia-imex on every tray (systemctl restart nvidia-imex); "
                   "journalctl -u nvidia-imex and nvidia-imex-ctl -N show which peer does not connect")


def _tray_names(f: HostFacts) -> set[str]:
    return {name for name in (f.address, f.host) if name}


def _check_imex_domain(out: _Out, sel: Requirements, f: HostFacts, trays: list[HostFacts]) -> None:
    """The IMEX domain has formed: UP, every node READY and connected to every other, this plan's trays in it."""
    domain = f.imex_domain
    if domain is None:
        return
    # the trays that must share this tray's IMEX domain: all planned trays when the plan is one NVLink domain
    members = [t for t in trays if t.unreachable is None] if sel.one_nvlink_domain else [f]
    if f not in members:
        members.append(f)
    required = ("nvidia-imex-ctl -N: Domain State UP, every node READY, every pair C (Connected), "
                f"{'these trays' if len(members) > 1 else 'this tray'} listed")
    if isinstance(domain, FactError):
        out.error(f.host, "nvidia.imex.domain", domain, required,
                  "install nvidia-imex-ctl (the nvidia-imex package) and enable the IMEX command service in "
                  "/etc/nvidia-imex/config.cfg (NVIDIA IMEX guide, 'IMEX Service Command Service'), then restart "
                  "nvidia-imex")
        return
    problems: list[str] = []
    if domain.domain_state != "UP":
        problems.append(f"Domain State {domain.domain_state}")
    for node in domain.nodes:
        if node.status != "READY":
            problems.append(f"node #{node.index} {node.address} {node.status}")
    bad = domain.not_connected()
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
    if problems:
        out.add(f.host, "nvidia.imex.domain", "fail", f"{count}; " + "; ".join(problems), required, IMEX_DOMAIN_FIX)
    else:
        out.add(f.host, "nvidia.imex.domain", "pass", f"UP, {count} READY, all connected", required)


def _check_toolkit(out: _Out, sel: Requirements, f: HostFacts) -> None:
    if sel.brand != "NVIDIA" or f.toolkit is None:
        return
    required = "nvidia-container-toolkit" + (f" >= {CTK_IMEX_CHANNELS_MIN}" if sel.mnnvl else "")
    if isinstance(f.toolkit, FactError):
        out.error(f.host, "container.toolkit", f.toolkit, required,
                  "install nvidia-container-toolkit and run nvidia-ctk runtime configure --runtime=docker")
        return
    version = f.toolkit.version
    if sel.mnnvl and not version_at_least(version, CTK_IMEX_CHANNELS_MIN):
        out.add(f.host, "container.toolkit", "warn", version, required,
                "NVIDIA_IMEX_CHANNELS needs toolkit >= 1.17: upgrade it, or pass "
                "--device /dev/nvidia-caps-imex-channels/channel0 to the container")
        return
    out.add(f.host, "container.toolkit", "pass", version, required)


def _check_runtime(out: _Out, sel: Requirements, f: HostFacts) -> None:
    if f.runtime is None:
        return
    required = "docker daemon answering" + (" with the nvidia runtime" if sel.brand == "NVIDIA" else "")
    rt = f.runtime
    if isinstance(rt, FactError):
        out.error(f.host, "container.runtime", rt, required, "install Docker Engine and start it")
        return
    if rt.server_version is None:
        out.add(f.host, "container.runtime", "fail", f"docker daemon not reachable: {rt.error}", required,
                "systemctl enable --now docker (and check that the deploy user may use the docker socket)")
        return
    if sel.brand == "NVIDIA" and "nvidia" not in rt.runtimes:
        out.add(f.host, "container.runtime", "warn",
                f"docker {rt.server_version}, runtimes: {' '.join(rt.runtimes) or 'none'}", required,
                "nvidia-ctk runtime configure --runtime=docker && systemctl restart docker "
                "(or use CDI: --device nvidia.com/gpu=all)")
        return
    out.add(f.host, "container.runtime", "pass", f"docker {rt.server_version}", required)


def _active_ports(devices: list[RdmaDevice]) -> list[tuple[str, int, str | None]]:
    return [(d.name, p.port, p.link_layer) for d in devices for p in d.ports if p.active]


def gpu_topology(f: HostFacts) -> GpuTopology | None:
    """The host's GPU/NIC matrix when it was read (an unreadable one leaves the port choice to the other rules)."""
    return f.topology if isinstance(f.topology, GpuTopology) else None


def _check_rdma(out: _Out, sel: Requirements, f: HostFacts) -> bool:
    """RDMA for multi-node / P/D; True when at least one port is active."""
    if not sel.needs_rdma or f.rdma is None or sel.brand == "Huawei":
        return False
    required = "an ACTIVE InfiniBand/RoCE port (multi-node)"
    if isinstance(f.rdma, FactError):
        out.error(f.host, "rdma.devices", f.rdma, required,
                  "install rdma-core (ibverbs-utils) or DOCA-OFED; without RDMA NCCL falls back to TCP sockets")
        return False
    active = _active_ports(f.rdma)
    if not f.rdma:
        out.add(f.host, "rdma.devices", "fail", "no RDMA devices", required,
                "load the mlx5 driver (mlx5_ib) and check the HCAs; without RDMA NCCL falls back to NET/Socket")
        return False
    if not active:
        ports = ", ".join(f"{d.name}:{p.port} {p.state}" for d in f.rdma for p in d.ports)
        out.add(f.host, "rdma.devices", "fail", ports or "devices without ports", required,
                "bring the ports up (cable, subnet manager for InfiniBand, switch config for RoCE)")
        return False
    itf = f.interface if isinstance(f.interface, AddressInterface) else None
    choice = choose_ports(f.rdma, itf.default_interface if itf else None, f.ib_hca, gpu_topology(f))
    layers = {(d.name, p.port): p.link_layer for d in f.rdma for p in d.ports}
    shown = ", ".join(f"{d}:{p} {layers.get((d, p)) or '?'}" for d, p in choice.ports)
    if choice.excluded:
        shown += "; not " + ", ".join(f"{d}:{p} ({why})" for d, p, why in choice.excluded)
    if choice.missing:
        have = ", ".join(f"{name}:{port}" for name, port, _ in active)
        out.add(f.host, "rdma.devices", "fail",
                f"k3_ib_hca names {', '.join(choice.missing)}: no active port of that name (active: {have})",
                required + ", as k3_ib_hca names them",
                "fix k3_ib_hca (`ibv_devinfo` lists each device and port), or bring those ports up")
        return bool(choice.ports)
    if choice.front_end:
        out.add(f.host, "rdma.devices", "warn", shown + " (carries the default route)", required,
                "the only active RDMA port is the front-end NIC: NCCL and the KV transfer share it with every other "
                "traffic; bring up the back-end ports, or name the intended ones in k3_ib_hca")
    else:
        out.add(f.host, "rdma.devices", "pass", shown, required)
    return True


#: hardware whose GPUs reach their ConnectX-8 through Data Direct (Grace has no PCIe ATS): NVIDIA's Grace Blackwell
#: CX8 GPUDirect RDMA guide, "Platform Software and Configuration": the 6.14-nvidia and newer kernels carry the
#: patches (``apt install linux-nvidia-64k-6.14``)
DATA_DIRECT_HARDWARE = frozenset({"gb300"})
DATA_DIRECT_MIN_KERNEL = "6.14"


def _check_gpudirect(out: _Out, sel: Requirements, f: HostFacts) -> None:
    """GPUDirect RDMA on the host: DMA-BUF (NVIDIA's recommended path) or, on x86, the legacy nvidia_peermem. Grace
    trays (GB200/GB300) have no nvidia_peermem; CUDA 13 deprecates the NV-P2P API nvidia_peermem is built on, so it
    is only a fallback where DMA-BUF cannot work, never a requirement."""
    if sel.brand != "NVIDIA":
        return
    grace = bool(getattr(sel.hardware, "nvl", False))
    required = "DMA-BUF usable" + ("" if grace else " (nvidia_peermem only as a deprecated fallback)")
    dmabuf, modules = f.dmabuf, f.modules
    peermem = isinstance(modules, LoadedModules) and "nvidia_peermem" in modules
    if isinstance(dmabuf, DmabufSupport) and sel.hardware.id in DATA_DIRECT_HARDWARE and \
            not version_at_least(dmabuf.kernel.split("-")[0], DATA_DIRECT_MIN_KERNEL):
        out.add(f.host, "rdma.gpudirect", "fail",
                f"kernel {dmabuf.kernel}: no Data Direct DMA-BUF for ConnectX-8",
                f"kernel >= {DATA_DIRECT_MIN_KERNEL}-nvidia ({_unit_name(sel.hardware)} with ConnectX-8: GPUDirect "
                "RDMA goes through the NIC's Data Direct function)",
                "install the 6.14-nvidia kernel (apt install linux-nvidia-64k-6.14) and reboot, as NVIDIA's Grace "
                "Blackwell CX8 GPUDirect RDMA guide says; rdma_topo topo shows each GPU's NIC and Data Direct function")
        return
    if isinstance(dmabuf, DmabufSupport) and dmabuf.prerequisites_met:
        driver = f"mlx5_ib {dmabuf.mlx5_version}" if dmabuf.mlx5_version else "inbox mlx5_ib"
        out.add(f.host, "rdma.gpudirect", "pass",
                f"DMA-BUF prerequisites met (kernel {dmabuf.kernel}, open modules, {driver})", required)
        return
    why = "; ".join(dmabuf.reasons) if isinstance(dmabuf, DmabufSupport) else (
        dmabuf.message(f.host) if isinstance(dmabuf, FactError) else "not checked")
    unknown = not isinstance(dmabuf, DmabufSupport) or dmabuf.prerequisites_met is None
    if peermem and not grace:
        out.add(f.host, "rdma.gpudirect", "warn", f"nvidia_peermem loaded (DMA-BUF: {why})", required,
                "works, but CUDA 13 deprecates the NV-P2P API nvidia_peermem uses: move to DMA-BUF (open kernel "
                "modules, kernel >= 5.12, mlx5 driver with DMA-BUF memory regions)")
        return
    if unknown:
        out.add(f.host, "rdma.gpudirect", "warn", f"DMA-BUF prerequisites unknown: {why}", required,
                "check that the NVIDIA open modules and mlx5_ib are loaded; set k3_nccl_probe: true to have preflight "
                "run an NCCL all-reduce and see whether it uses GPUDirect RDMA (GDRDMA)")
        return
    fix = ("use the NVIDIA open kernel modules on kernel >= 5.12; otherwise NCCL stages through host memory"
           if grace else "use the NVIDIA open kernel modules on kernel >= 5.12 (or, deprecated with CUDA 13, "
           "modprobe nvidia-peermem and add it to /etc/modules-load.d); otherwise NCCL stages through host memory")
    mods = "" if grace else "; " + (modules.message(f.host) if isinstance(modules, FactError)
                                    else "nvidia_peermem not loaded")
    out.add(f.host, "rdma.gpudirect", GPUDIRECT_MISSING_STATUS, f"DMA-BUF: {why}{mods}", required, fix)


def _check_interface(out: _Out, f: HostFacts) -> None:
    if f.interface is None:
        return
    required = "the node's address on a non-loopback interface"
    itf = f.interface
    if isinstance(itf, FactError):
        out.error(f.host, "network.interface", itf, required, "install iproute2")
        return
    if itf.address:
        if itf.interface is None:
            have = ", ".join(f"{a.interface} {a.address}" for a in itf.addresses)
            out.add(f.host, "network.interface", "fail", f"{itf.address} not configured (have {have})", required,
                    "the inventory address must belong to this node: fix ssh_hostname / k3_ip")
        elif itf.interface == "lo":
            out.add(f.host, "network.interface", "fail", f"{itf.address} on lo", required,
                    "use the node's cluster address, not a loopback address (NCCL would bootstrap on lo)")
        else:
            out.add(f.host, "network.interface", "pass", f"{itf.address} on {itf.interface}", required)
        return
    if itf.default_interface and itf.default_interface != "lo":
        out.add(f.host, "network.interface", "warn", f"no address given; default route on {itf.default_interface}",
                required, "set k3_ip (or ssh_hostname) to the node's cluster address")
    else:
        out.add(f.host, "network.interface", "fail", "no address given and no default route", required,
                "set k3_ip (or ssh_hostname) to the node's cluster address")


def _check_space(out: _Out, f: HostFacts, check: str, space: DiskSpace | FactError | None,
                 need_gib: float | None, what: str, fix: str, use_size: bool = False) -> None:
    if space is None or need_gib is None:
        return
    required = f">= {_gib(need_gib)} {what}"
    if isinstance(space, FactError):
        out.error(f.host, check, space, required, fix)
        return
    have = (space.size_bytes if use_size else space.available_bytes) / GIB
    observed = f"{_gib(have)} {'size' if use_size else 'free'} on {space.mount} ({space.path})"
    out.add(f.host, check, "pass" if have >= need_gib else "fail", observed, required, fix)


def _check_stage_leftover(out: _Out, f: HostFacts) -> None:
    """``stage.peers``: the stage's read-only rsync daemon (root, serving the model cache and the stage directory to
    the cluster's engine hosts) runs only while a stage does; one running now was left by a run that was killed.
    Said only when found (a warning: the next deploy stops it in its first step)."""
    from k3deploy.model.commands import PEERS_UNIT

    daemon = f.stage_peers
    if not isinstance(daemon, StageDaemon) or not daemon.running:
        return
    out.add(f.host, "stage.peers", "warn", f"{PEERS_UNIT}.service {daemon.state}"
            + (f" since {daemon.since}" if daemon.since else "") + " (rsync --daemon as root, left by a killed run)",
            "no stage daemon outside a deploy's stage", f"systemctl stop {PEERS_UNIT} on {f.host} (the next deploy "
            "stops it in its first stage step)")


def _check_rocm(out: _Out, f: HostFacts) -> None:
    versions = f.amd_versions
    required = "amdgpu kernel driver" + (f", host ROCm >= {ROCM_HOST_MIN}" if ROCM_HOST_MIN else "")
    if isinstance(f.rocm_driver, RocmDriver):
        driver = f.rocm_driver.driver
    elif isinstance(versions, AmdSmiVersions) and versions.amdgpu:
        driver = versions.amdgpu
    else:
        driver = None
    if driver is None:
        err = f.rocm_driver if isinstance(f.rocm_driver, FactError) else None
        observed = err.message(f.host) if err else "amdgpu driver version not reported"
        out.add(f.host, "rocm.driver", "fail", observed, required,
                "install amdgpu-dkms (the ROCm image brings its own ROCm; the host needs the kernel driver)")
        return
    out.add(f.host, "rocm.driver", "pass", f"amdgpu {driver}", required)
    rocm = versions.rocm if isinstance(versions, AmdSmiVersions) else None
    if ROCM_HOST_MIN and (rocm is None or not version_at_least(rocm, ROCM_HOST_MIN)):
        out.add(f.host, "rocm.version", "fail", f"host ROCm {rocm or 'N/A'}", f">= {ROCM_HOST_MIN}",
                f"install ROCm {ROCM_HOST_MIN} or newer on the host")
    elif rocm is None:
        out.add(f.host, "rocm.version", "pass", "no host ROCm userspace (the image brings ROCm)", "none")
    else:
        out.add(f.host, "rocm.version", "pass", f"host ROCm {rocm}", ROCM_HOST_MIN or "none")


def _check_ascend(out: _Out, f: HostFacts) -> None:
    info = f.ascend
    required = f"driver (HDK) >= {ASCEND_DRIVER_RECOMMENDED} recommended; version.info and mounted paths present"
    if info is None:
        return
    if isinstance(info, FactError):
        out.error(f.host, "ascend.versions", info, required, "install the Ascend driver and firmware (HDK)")
        return
    mounts_required = "every host path the engine container bind-mounts (docker run -v) exists"
    if info.missing_paths or info.empty_paths:
        parts = []
        if info.missing_paths:
            parts.append("missing " + ", ".join(info.missing_paths))
        if info.empty_paths:
            parts.append("empty directory " + ", ".join(info.empty_paths))
        shown = "; ".join(parts)
        fix = ("install the Ascend driver (HDK) package, which puts these files there, or repair its installation"
               f" ({', '.join([*info.missing_paths, *info.empty_paths])}); docker run -v does not fail on a missing "
               "host path but mounts an empty directory in its place, and the engine then finds no driver tools")
        if info.empty_paths:
            fix += ("; an empty directory where a file belongs is what such a run left behind: remove it (rmdir) "
                    "before reinstalling")
        out.add(f.host, "ascend.mounts", "fail", shown, mounts_required, fix)
    else:
        out.add(f.host, "ascend.mounts", "pass", "all present", mounts_required)
    if info.driver is None:
        out.add(f.host, "ascend.versions", "fail", "no driver version.info", required,
                "install the Ascend driver (HDK)")
    elif not version_at_least(info.driver, ASCEND_DRIVER_RECOMMENDED):
        out.add(f.host, "ascend.versions", "warn",
                f"driver {info.driver}, firmware {info.firmware or '?'}, "
                f"host CANN {info.cann or 'none (image ships CANN)'}",
                required,
                f"upgrade the Ascend HDK to {ASCEND_DRIVER_RECOMMENDED}+ as the vllm-ascend release notes ask")
    else:
        out.add(f.host, "ascend.versions", "pass",
                f"driver {info.driver}, firmware {info.firmware or '?'}, "
                f"host CANN {info.cann or 'none (image ships CANN)'}",
                required)
    if isinstance(f.npu, NpuInfo):
        sick = [f"NPU {c.npu} chip {c.chip}: {c.health}" for c in f.npu.chips if c.health != "OK"]
        if sick:
            out.add(f.host, "ascend.health", "fail", "; ".join(sick), "every NPU chip Health OK",
                    "check npu-smi info -t health -i <id> and the device log; replace or reset the NPU")
        else:
            out.add(f.host, "ascend.health", "pass", f"{len(f.npu.chips)} chips OK", "every NPU chip Health OK")


def _check_ascend_network(out: _Out, sel: Requirements, f: HostFacts) -> None:
    """Every NPU's network port up and healthy, as vllm-ascend's multi-node guides check before a start."""
    ports = f.hccn
    if ports is None:
        return
    count = sel.hardware.gpu_count
    required = f"every NPU (0..{count - 1}): link status UP, net health status Success"
    if isinstance(ports, FactError):
        out.error(f.host, "ascend.network", ports, required,
                  f"install the Ascend driver (HDK), which brings {ports.tool}, and rerun preflight")
        return
    bad: list[str] = []
    ids: list[int] = []
    for p in ports:
        if p.healthy:
            continue
        ids.append(p.device)
        parts = []
        if p.link != "UP":
            parts.append(f"link {p.link or 'not read'}")
        if p.net_health != "Success":
            health = f"net health {p.net_health or 'not read'}"
            if p.net_health is not None and p.netdetect:
                health += f" (probing {p.netdetect})"
            elif p.net_health is not None:
                health += " (no netdetect address)"
            parts.append(health)
        parts += [e for e in p.errors if e.startswith(("-link", "-net_health"))]
        bad.append(f"NPU {p.device}: " + ", ".join(parts))
    if not bad:
        out.add(f.host, "ascend.network", "pass", f"{len(ports)} NPUs: link UP, net health Success", required)
        return
    first = ids[0]
    fix = (f"check the optical module, cable and switch port of NPU {', '.join(map(str, ids))} "
           f"(hccn_tool -i {first} -link -g, -optical -g, -lldp -g) and its address, detection address and gateway "
           f"(hccn_tool -i {first} -ip -g / -netdetect -g / -gateway -g, /etc/hccn.conf); a port left down by hand: "
           f"hccn_tool -i {first} -cfg recovery")
    if any(p.net_health is not None and not p.netdetect for p in ports if p.device in ids):
        fix += f"; set a detection address: hccn_tool -i {first} -netdetect -s address <gateway of its subnet>"
    out.add(f.host, "ascend.network", ASCEND_NETWORK_STATUS, "; ".join(bad), required, fix)


# ------------------------------------------------------------------------------ cross-node NPU ping (ascend.peers)


def peer_targets(read: list[HostFacts]) -> dict[str, list[list[Any]]]:
    """Per host whose NPU ports were read: ``[device, vnic, ip]`` of NPU i on every other such host, for each of
    its own NPUs i (same-index pairs). Empty with fewer than two such hosts."""
    ports = {f.host: {p.device: p for p in f.hccn} for f in read
             if f.unreachable is None and isinstance(f.hccn, list)}
    if len(ports) < 2:
        return {}
    out: dict[str, list[list[Any]]] = {}
    for host, mine in ports.items():
        out[host] = [[dev, peer[dev].vnic or "", peer[dev].ip or ""]
                     for dev in sorted(mine) for other, peer in ports.items()
                     if other != host and dev in peer and (peer[dev].vnic or peer[dev].ip)]
    return out


def peer_checks(read: list[HostFacts], targets: dict[str, list[list[Any]]],
                got: dict[str, Any]) -> list[CheckResult]:
    """``ascend.peers``: every ping of a host's second round came back; each unreachable (NPU i -> peer address)
    named. ``got``: the host's pings (``list[NpuPing]``), or why they could not be read."""
    owner = {addr: f.host for f in read if isinstance(f.hccn, list) for p in f.hccn for addr in (p.vnic, p.ip) if addr}
    out: list[CheckResult] = []
    for host, wanted in targets.items():
        required = (f"NPU i reaches NPU i of every other host ({len(wanted)} same-index pings: "
                    "hccn_tool -i i -hccs_ping -g address <peer>, or -ping where -hccs_ping is unsupported)")
        pings = got.get(host)
        if not isinstance(pings, list):
            out.append(CheckResult(host, "ascend.peers", "fail", f"not read: {pings}", required,
                                   "check the connection to the host and rerun preflight"))
            continue
        done = {(p.device, p.address) for p in pings}
        bad = [f"NPU {p.device} -> {p.address} ({owner.get(p.address, '?')}) {p.method}: {p.shown}"
               for p in pings if not p.ok]
        bad += [f"NPU {dev} -> {vnic or ip} ({owner.get(vnic or ip, '?')}): not pinged (the round ran out of time, "
                "or -hccs_ping is unsupported and there is no -ip address)"
                for dev, vnic, ip in wanted if (dev, vnic) not in done and (dev, ip) not in done]
        if not bad:
            out.append(CheckResult(host, "ascend.peers", "pass",
                                   f"{len(pings)} pings to the peers' NPUs answered", required))
            continue
        out.append(CheckResult(host, "ascend.peers", ASCEND_NETWORK_STATUS, "; ".join(bad), required,
                               "check both ends' NPU ports (hccn_tool -i <i> -link -g / -net_health -g on each), "
                               "their addresses (-ip -g / -vnic -g, /etc/hccn.conf) and the switch or HCCS path "
                               "between them; rerun hccn_tool -i <i> -hccs_ping -g address <peer> by hand"))
    return out


# ------------------------------------------------------------------------------------- entry


def run_checks(sel: Requirements, hosts: list[HostFacts]) -> list[CheckResult]:
    """All checks for all hosts: per-host results in host order, then the cluster-wide ones."""
    out = _Out()
    hw = sel.hardware
    memory: dict[str, float | None] = {}
    fabric_ok: dict[str, tuple[str, str]] = {}
    for f in hosts:
        if f.unreachable is not None:
            out.add(f.host, "host.reachable", "fail", f.unreachable, "SSH connection",
                    "check the address, SSH key and that the node is up")
            memory[f.host] = None
            continue
        devices = _check_accelerators(out, sel, f)
        if devices is not None:
            sizes = [d.memory_gib for d in devices if d.memory_gib is not None]
            memory[f.host] = sum(sizes) if len(sizes) == len(devices) else None
        else:
            memory[f.host] = None
        if sel.brand == "NVIDIA" and devices is not None:
            _check_fabric_manager(out, sel, f)
            if getattr(hw, "nvl", False) and _check_fabric_host(out, sel, f):
                identity = _fabric_identity(f)
                assert identity is not None
                fabric_ok[f.host] = identity
            _check_imex(out, sel, f, hosts)
        _check_toolkit(out, sel, f)
        _check_runtime(out, sel, f)
        if _check_rdma(out, sel, f):
            _check_gpudirect(out, sel, f)
        _check_interface(out, f)
        _check_space(out, f, "disk.images", f.disk_images, IMAGE_DISK_MIN_GIB, "for container images",
                     "free space or point Docker's data-root at a larger disk")
        cache_need = sel.vram_minimum_gb * CACHE_DISK_FACTOR if sel.vram_minimum_gb else None
        held = f.extra.get("weights")   # the rollout's reading of the cache, when it asked (WeightsStatus)
        weights_what = "for the model weights"
        if cache_need is not None and getattr(held, "complete", False):
            cache_need = 0.0   # a re-run, a rollback or pre-staged weights: only what is missing needs room
            weights_what = "more: the weights are in the cache already"
        _check_space(out, f, "disk.cache", f.disk_cache, cache_need, weights_what,
                     "free space in the cache directory or set k3_model_cache to a larger disk")
        _check_space(out, f, "disk.shm", f.shm, SHM_MIN_GIB, "of /dev/shm",
                     "enlarge /dev/shm (mount -o remount,size=64G /dev/shm) and remove stale nccl-* segments",
                     use_size=True)
        _check_stage_leftover(out, f)
        if sel.brand == "AMD":
            _check_rocm(out, f)
        if sel.brand == "Huawei":
            _check_ascend(out, f)
            _check_ascend_network(out, sel, f)

    # ---- cluster-wide: NVLink domain identity
    if getattr(hw, "nvl", False) and len(fabric_ok) > 1 and not sel.one_nvlink_domain:
        # data/expert parallelism over several NVL domains: each tray in a Completed domain; the domains are listed
        domains = Counter(fabric_ok.values())
        for h, (uuid, clique) in fabric_ok.items():
            out.add(h, "nvlink.fabric", "pass", f"Completed; ClusterUUID {uuid}, CliqueId {clique}",
                    FABRIC_REQUIRED)
        per_domain = " + ".join(str(n) for n in domains.values())
        out.add(CLUSTER, "nvlink.domains", "pass" if len(domains) == 1 else "warn",
                f"{len(domains)} NVLink domain(s) ({per_domain} trays)", "one domain keeps all traffic on NVLink",
                "" if len(domains) == 1 else f"{sel.strategy} runs across domains: traffic between them goes over "
                "RDMA")
    elif getattr(hw, "nvl", False) and len(fabric_ok) > 1:
        counts = Counter(fabric_ok.values())
        order = [h.host for h in hosts if h.host in fabric_ok]
        top = max(counts.values())
        # majority identity; ties go to the first host in inventory order (the head)
        majority = next(fabric_ok[h] for h in order if counts[fabric_ok[h]] == top)
        for h in order:
            uuid, clique = fabric_ok[h]
            required = f"ClusterUUID {majority[0]}, CliqueId {majority[1]} (same NVL domain as the other trays)"
            if fabric_ok[h] == majority:
                out.add(h, "nvlink.fabric", "pass", f"Completed; ClusterUUID {uuid}, CliqueId {clique}", required)
            else:
                out.add(h, "nvlink.fabric", "fail", f"ClusterUUID {uuid}, CliqueId {clique}", required,
                        "this tray belongs to another NVLink domain or partition: use trays of one NVL72 rack and "
                        "partition, or plan it as a separate deployment")
    elif getattr(hw, "nvl", False):
        for h, (uuid, clique) in fabric_ok.items():
            out.add(h, "nvlink.fabric", "pass", f"Completed; ClusterUUID {uuid}, CliqueId {clique}",
                    FABRIC_REQUIRED)

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
