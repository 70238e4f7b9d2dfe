"""AMD facts: ROCm/amdgpu versions (``amd-smi version``, ``rocm-smi --showdriverversion``), GPUs and the amdkfd
peer-memory interface RCCL needs for GPUDirect RDMA."""

from __future__ import annotations

import re
from dataclasses import dataclass

from k3deploy.facts.base import (
    ABSENT_MARK,
    EXIT_MARK,
    SECTION_MARK,
    FactError,
    Jsonable,
    K3Fact,
    Unparsable,
    sections,
)
from k3deploy.facts.health import QUARANTINE_SECTION, HealthReading, health_command, parse_quarantine, section
from k3deploy.facts.rdma import GpuTopology
from k3deploy.model.health import HealthEvent
from k3deploy.vendors.amd import KALLSYMS_GREP, PACK, PEER_MEMORY_PATHS, PEER_MEMORY_SYMBOL, RAS_COUNTERS

ROCM_HINT = "is the amdgpu driver with ROCm SMI (amd-smi / rocm-smi) installed?"


@dataclass(frozen=True)
class AmdSmiVersions(Jsonable):
    tool: str | None
    library: str | None
    rocm: str | None  # None: no host ROCm userspace ("ROCm version: N/A")
    amdgpu: str | None


def _value(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    if not match:
        return None
    value = match.group(1).strip()
    return None if value in ("N/A", "") else value


def parse_amd_smi_version(lines: list[str]) -> AmdSmiVersions:
    """``amd-smi version`` (leading ERROR lines tolerated). With the kernel's own amdgpu module amd-smi prints the
    kernel's ``/proc/version`` squeezed as the amdgpu version (``Linuxversion6.8.0-79-generic(buildd@...)...``):
    the kernel release is kept.

    >>> parse_amd_smi_version(["AMDSMI Tool: 26.0.2+39589fda | AMDSMI Library version: 26.0.2 | "
    ...     "ROCm version: 7.0.2 | amdgpu version: 6.14.14 | amd_hsmp version: N/A"]).rocm
    '7.0.2'
    """
    for line in lines:
        if "AMDSMI Tool:" in line or "ROCm version:" in line:
            amdgpu = _value(r"amdgpu version:\s*([^\s|]+)", line)
            inbox = re.match(r"Linuxversion(\d+\.\d+[^\s(]*)", amdgpu or "")
            if inbox:
                # the kernel's own amdgpu (no amdgpu-dkms): amd-smi prints /proc/version without its blanks
                amdgpu = inbox.group(1)
            return AmdSmiVersions(
                tool=_value(r"AMDSMI Tool:\s*([^\s|]+)", line),
                library=_value(r"AMDSMI Library version:\s*([^\s|]+)", line),
                rocm=_value(r"ROCm version:\s*([^\s|]+)", line),
                amdgpu=amdgpu,
            )
    raise Unparsable("no 'AMDSMI Tool' / 'ROCm version' line")


class AmdSmiVersion(K3Fact[AmdSmiVersions]):
    """ROCm userspace and amdgpu driver versions from ``amd-smi version``.

    ``AMDSMI Tool: 26.0.2+39589fda | AMDSMI Library version: 26.0.2 | ROCm version: 7.0.2 |
    amdgpu version: 6.14.14`` → ``AmdSmiVersions(rocm='7.0.2', amdgpu='6.14.14', ...)``.
    """

    tool = required_binary = "amd-smi"
    hint = ROCM_HINT
    shown_command = PACK.command_of("rocm.version")


    def parse(self, lines: list[str]) -> AmdSmiVersions:
        return parse_amd_smi_version(lines)


@dataclass(frozen=True)
class RocmDriver(Jsonable):
    driver: str


#: the line the driver command prints for the loaded amdgpu module's own version (DKMS builds have one)
SYSFS_DRIVER_MARK = "K3_AMDGPU_MODULE="


def parse_rocm_driver(lines: list[str]) -> RocmDriver:
    """``/sys/module/amdgpu/version`` (what ``rocm-smi`` itself reads), else ``rocm-smi --showdriverversion``:
    ``Driver version: 6.7.0`` → ``RocmDriver(driver='6.7.0')``.

    >>> parse_rocm_driver(["===== ROCm System Management Interface =====", "Driver version: 6.7.0"])
    RocmDriver(driver='6.7.0')
    >>> parse_rocm_driver(["K3_AMDGPU_MODULE=6.10.5"])
    RocmDriver(driver='6.10.5')
    """
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(SYSFS_DRIVER_MARK) and stripped[len(SYSFS_DRIVER_MARK):]:
            return RocmDriver(driver=stripped[len(SYSFS_DRIVER_MARK):])
        match = re.search(r"Driver version:\s*(\S+)", line)
        if match:
            return RocmDriver(driver=match.group(1))
    raise Unparsable("no 'Driver version' line")


class RocmDriverVersion(K3Fact[RocmDriver]):
    """amdgpu kernel driver version: the loaded module's ``/sys/module/amdgpu/version`` (amdgpu-dkms; a container
    host needs no ROCm of its own), else ``rocm-smi --showdriverversion``: ``Driver version: 6.7.0``."""

    tool = "rocm-smi"
    hint = ROCM_HINT
    shown_command = "cat /sys/module/amdgpu/version || rocm-smi --showdriverversion"

    def command(self) -> str:
        return (
            "if [ -s /sys/module/amdgpu/version ]; then "
            f"echo \"{SYSFS_DRIVER_MARK}$(cat /sys/module/amdgpu/version)\"; echo {EXIT_MARK}0; "
            "elif command -v rocm-smi >/dev/null 2>&1; then "
            f"timeout 60 rocm-smi --showdriverversion 2>&1; echo {EXIT_MARK}$?; "
            f"else echo {ABSENT_MARK}rocm-smi; echo {EXIT_MARK}127; fi"
        )

    def parse(self, lines: list[str]) -> RocmDriver:
        return parse_rocm_driver(lines)


@dataclass(frozen=True)
class AmdGpu(Jsonable):
    index: int
    vram_bytes: int | None
    name: str | None
    device_id: str | None = None  # PCI device id, e.g. 0x74a1 (MI300X)


_VRAM_RE = re.compile(r"GPU\[(\d+)\]\s*:\s*VRAM Total Memory \(B\):\s*(\d+)")
# "Card Series" (ROCm 6+) or "Card series" (ROCm 5); a name rocm-smi does not know is printed as the device id
_SERIES_RE = re.compile(r"GPU\[(\d+)\]\s*:\s*Card series:\s*(.+?)\s*$", re.IGNORECASE)
_DEVICE_ID_RE = re.compile(r"^0x[0-9a-fA-F]{4}$")


def _sysfs_gpus(lines: list[str]) -> list[AmdGpu]:
    """``card<N> <device id> <VRAM bytes or -> [product_name]`` per AMD (vendor 0x1002) DRM card."""
    gpus: list[AmdGpu] = []
    for line in lines:
        parts = line.split(None, 3)
        if len(parts) < 3 or not parts[0].startswith("card"):
            continue
        device = parts[1].lower() if _DEVICE_ID_RE.match(parts[1]) else None
        vram = int(parts[2]) if parts[2].isdigit() else None
        product = parts[3].strip() if len(parts) > 3 and parts[3].strip() else None
        gpus.append(AmdGpu(index=len(gpus), vram_bytes=vram, name=product, device_id=device))
    return gpus


def parse_amd_gpus(lines: list[str]) -> list[AmdGpu]:
    """Sections ``sysfs`` (``/sys/class/drm/card*/device``: PCI device id, ``mem_info_vram_total``,
    ``product_name``), ``vram`` (``rocm-smi --showmeminfo vram``) and ``name`` (``--showproductname``).
    The kernel's view wins: rocm-smi only fills in what sysfs does not say (or stands in where sysfs shows no AMD
    GPU, as in a container).

    >>> parse_amd_gpus(["K3_SECTION=vram", "GPU[0]\\t\\t: VRAM Total Memory (B): 309237645312",
    ...                 "K3_SECTION=name", "GPU[0]\\t\\t: Card Series: \\t\\tAMD Instinct MI355X"])
    [AmdGpu(index=0, vram_bytes=309237645312, name='AMD Instinct MI355X', device_id=None)]
    >>> parse_amd_gpus(["K3_SECTION=sysfs", "card1 0x74a1 206158430208 AMD Instinct MI300X OAM"])[0].device_id
    '0x74a1'
    """
    parts = sections(lines)
    vram: dict[int, int] = {}
    for line in parts.get("vram", []):
        match = _VRAM_RE.search(line)
        if match:
            vram[int(match.group(1))] = int(match.group(2))
    names: dict[int, str] = {}
    ids: dict[int, str] = {}
    for line in parts.get("name", []):
        match = _SERIES_RE.search(line)
        if match:
            value = match.group(2)
            if _DEVICE_ID_RE.match(value):
                ids[int(match.group(1))] = value.lower()
            else:
                names[int(match.group(1))] = value
    sysfs = _sysfs_gpus(parts.get("sysfs", []))
    if sysfs:
        same_name = set(names.values()) if len(set(names.values())) == 1 else set()
        same_vram = set(vram.values()) if len(set(vram.values())) == 1 else set()
        return [AmdGpu(index=g.index,
                       vram_bytes=g.vram_bytes if g.vram_bytes is not None else next(iter(same_vram), None),
                       name=g.name or next(iter(same_name), None), device_id=g.device_id) for g in sysfs]
    indices = sorted(set(vram) | set(names) | set(ids))
    if not indices:
        raise Unparsable("no AMD GPU in /sys/class/drm and no 'GPU[N] : VRAM Total Memory (B)' lines")
    return [AmdGpu(index=i, vram_bytes=vram.get(i), name=names.get(i), device_id=ids.get(i)) for i in indices]


#: AMD DRM cards (vendor 0x1002; connectors such as card0-DP-1 skipped): ``card<N> <device> <VRAM bytes> <product>``
_SYSFS_COMMAND = (
    "for d in /sys/class/drm/card[0-9]*; do case ${d##*/} in *-*) continue;; esac; "
    "[ \"$(cat \"$d/device/vendor\" 2>/dev/null)\" = 0x1002 ] || continue; "
    "echo \"${d##*/} $(cat \"$d/device/device\" 2>/dev/null || echo -) "
    "$(cat \"$d/device/mem_info_vram_total\" 2>/dev/null || echo -) "
    "$(cat \"$d/device/product_name\" 2>/dev/null)\"; done"
)


class AmdGpus(K3Fact[list[AmdGpu]]):
    """AMD GPUs with PCI device id, total VRAM (bytes) and product name: from the kernel
    (``/sys/class/drm/card*/device``), which a host with only amdgpu-dkms has, and ``rocm-smi`` where present.

    ``card1 0x74a1 206158430208 AMD Instinct MI300X OAM`` → ``AmdGpu(index=0, vram_bytes=206158430208,
    name='AMD Instinct MI300X OAM', device_id='0x74a1')``; without sysfs, ``GPU[0] : VRAM Total Memory (B):
    309237645312`` + ``GPU[0] : Card Series: AMD Instinct MI355X`` → ``AmdGpu(index=0, vram_bytes=309237645312,
    name='AMD Instinct MI355X')``.
    """

    tool = "rocm-smi"
    hint = "no AMD GPU under /sys/class/drm and no rocm-smi: is the amdgpu driver (amdgpu-dkms) loaded?"
    shown_command = "/sys/class/drm/card*/device; rocm-smi --showmeminfo vram; rocm-smi --showproductname"

    def command(self) -> str:
        return (
            f"echo {SECTION_MARK}sysfs; {_SYSFS_COMMAND}; "
            "if command -v rocm-smi >/dev/null 2>&1; then "
            f"echo {SECTION_MARK}vram; timeout 60 rocm-smi --showmeminfo vram 2>&1; "
            f"echo {SECTION_MARK}name; timeout 60 rocm-smi --showproductname 2>&1; "
            f"else echo {SECTION_MARK}nosmi; fi; echo {EXIT_MARK}0"
        )

    def parse_result(self, lines: list[str], status: int | None) -> list[AmdGpu] | FactError:
        parts = sections(lines)
        if "nosmi" in parts and not _sysfs_gpus(parts.get("sysfs", [])):
            return FactError(kind="absent", tool=self.tool, command=self.shown_command, hint=self.hint)
        return super().parse_result(lines, status)

    def parse(self, lines: list[str]) -> list[AmdGpu]:
        return parse_amd_gpus(lines)


# ------------------------------------------------------------------------------ amdkfd peer memory


@dataclass(frozen=True)
class PeerMemory(Jsonable):
    """Where RCCL would find the amdkfd peer-memory interface: the ``memory_peers/amdkfd/version`` file (its path and
    content) or, failing that, the first ``/proc/kallsyms`` line naming ``ib_register_peer_memory_client``."""

    path: str | None = None
    version: str | None = None
    kallsyms: str | None = None

    @property
    def available(self) -> bool:
        return self.path is not None or self.kallsyms is not None

    @property
    def shown(self) -> str:
        if self.path is not None:
            return f"{self.path}" + (f" (version {self.version})" if self.version else "")
        if self.kallsyms is not None:
            return f"{PEER_MEMORY_SYMBOL} in /proc/kallsyms ({' '.join(self.kallsyms.split()[1:])})"
        return f"no memory_peers/amdkfd/version, no {PEER_MEMORY_SYMBOL} in /proc/kallsyms"


def parse_peer_memory(lines: list[str]) -> PeerMemory:
    """Sections ``peers`` (``<path> <content>`` of each ``memory_peers/amdkfd/version`` that exists, in RCCL's
    order) and ``kallsyms`` (``/proc/kallsyms`` lines of ``ib_register_peer_memory_client``: the exported function,
    which a kernel's or OFED's ib_core with peer memory has).

    >>> parse_peer_memory(["K3_SECTION=peers", "/sys/kernel/mm/memory_peers/amdkfd/version 1.0", "K3_SECTION=kallsyms"])
    PeerMemory(path='/sys/kernel/mm/memory_peers/amdkfd/version', version='1.0', kallsyms=None)
    >>> parse_peer_memory(["K3_SECTION=peers", "K3_SECTION=kallsyms",
    ...     "0000000000000000 T ib_register_peer_memory_client       [ib_uverbs]"]).available
    True
    >>> parse_peer_memory(["K3_SECTION=peers", "K3_SECTION=kallsyms",
    ...     "0000000000000000 b pfn_ib_register_peer_memory_client   [amdgpu]"]).available
    False
    """
    parts = sections(lines)
    if "peers" not in parts and "kallsyms" not in parts:
        raise Unparsable("no 'peers' / 'kallsyms' sections")
    for line in parts.get("peers", []):
        path, _, version = line.strip().partition(" ")
        if path in PEER_MEMORY_PATHS:
            return PeerMemory(path=path, version=version.strip() or None)
    # the function itself (``T ib_register_peer_memory_client [ib_uverbs]``), not amdgpu's own pointer to it
    # (``b pfn_ib_register_peer_memory_client [amdgpu]``, there whenever amdgpu-dkms is loaded), which RCCL's
    # substring search takes for it too
    symbol = next((line.strip() for line in parts.get("kallsyms", [])
                   if line.split()[2:3] == [PEER_MEMORY_SYMBOL] and line.split()[1] in ("T", "t")), None)
    return PeerMemory(kallsyms=symbol)


class AmdPeerMemory(K3Fact[PeerMemory]):
    """The amdkfd peer-memory interface, as RCCL looks for it before it uses GPUDirect RDMA (ROCm/rccl
    ``src/transport/net_ib.cc``, ``ncclIbGdrSupport``): ``/sys/kernel/mm/memory_peers/amdkfd/version`` (or its
    variants under ``/sys/kernel`` and ``/sys``), else ``ib_register_peer_memory_client`` in ``/proc/kallsyms``.
    Without either RCCL stages every transfer through host memory and says nothing above ``NCCL_DEBUG=INFO``.

    ``/sys/kernel/mm/memory_peers/amdkfd/version 1.0`` → ``PeerMemory(path=..., version='1.0')``.
    """

    tool = required_binary = "grep"
    hint = "grep is missing"
    shown_command = PACK.command_of("rdma.gpudirect")

    def command(self) -> str:
        checks = "; ".join(f"[ -e {p} ] && echo \"{p} $(cat {p} 2>/dev/null)\"" for p in PEER_MEMORY_PATHS)
        return (f"echo {SECTION_MARK}peers; {checks}; echo {SECTION_MARK}kallsyms; "
                f"{KALLSYMS_GREP} 2>/dev/null; echo {EXIT_MARK}0")

    def parse(self, lines: list[str]) -> PeerMemory:
        return parse_peer_memory(lines)


# ------------------------------------------------------------------------------ GPU/NIC topology

_BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciPlace:
    """Where a device sits on PCIe: its host bridge (``pci0000:00``), the chain of ports and devices from the root
    port down to it (``0000:00:01.1``, ..., the device), and its NUMA node (-1: none)."""

    name: str
    host_bridge: str
    chain: tuple[str, ...]
    numa: int


def _pci_place(line: str) -> PciPlace | None:
    parts = line.split()
    if len(parts) < 2 or not parts[1].startswith("/sys/devices/"):
        return None
    comps = parts[1].removeprefix("/sys/devices/").split("/")
    bridge = next((c for c in comps if c.startswith("pci")), None)
    if bridge is None:
        return None
    chain = tuple(c.lower() for c in comps[comps.index(bridge) + 1:] if _BDF_RE.match(c))
    numa = int(parts[2]) if len(parts) > 2 and parts[2].lstrip("-").isdigit() else -1
    return PciPlace(parts[0], bridge.lower(), chain, numa)


def pci_relation(gpu: PciPlace, nic: PciPlace) -> str:
    """What ``nvidia-smi topo -m`` (and NCCL/RCCL's topology) would call the path between two PCIe devices: ``PIX``
    (the same switch port above both), ``PXB`` (a switch shared further up), ``PHB`` (only the CPU's root port or
    host bridge shared), ``NODE`` (another host bridge of the same NUMA node), ``SYS`` (another NUMA node)."""
    if gpu.host_bridge == nic.host_bridge:
        common = 0
        for a, b in zip(gpu.chain[:-1], nic.chain[:-1], strict=False):
            if a != b:
                break
            common += 1
        if common >= 2:   # a switch below the root port carries both
            return "PIX" if gpu.chain[:-1] == nic.chain[:-1] else "PXB"
        return "PHB"
    return "NODE" if gpu.numa == nic.numa or -1 in (gpu.numa, nic.numa) else "SYS"


def parse_pci_topology(lines: list[str]) -> GpuTopology:
    """Sections ``gpus`` (``card<N> <sysfs device path> <numa node>`` per AMD GPU) and ``nics`` (``<RDMA device>
    <sysfs device path> <numa node>``) -> each NIC's relation to each GPU, as :class:`GpuTopology` (the form of
    ``nvidia-smi topo -m``, which the port choice reads). The paths are what AMD's system acceptance guide reads
    with ``lspci -PP`` ("Mapping NIC to GPU NUMA Node"): a back-end NIC shares a PCIe switch with its GPU.

    >>> t = parse_pci_topology(["K3_SECTION=gpus",
    ...     "card1 /sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:05:00.0 0",
    ...     "K3_SECTION=nics", "mlx5_0 /sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:09:00.0 0",
    ...     "mlx5_8 /sys/devices/pci0000:b8/0000:b8:01.1/0000:b9:00.0 1"])
    >>> t.nics, t.separates
    ({'mlx5_0': ['PXB'], 'mlx5_8': ['SYS']}, True)
    """
    parts = sections(lines)
    if "gpus" not in parts and "nics" not in parts:
        raise Unparsable("no 'gpus' / 'nics' sections")
    gpus = [g for g in (_pci_place(line) for line in parts.get("gpus", [])) if g is not None]
    nics = [n for n in (_pci_place(line) for line in parts.get("nics", [])) if n is not None]
    return GpuTopology(gpus=[g.name for g in gpus], nics={n.name: [pci_relation(g, n) for g in gpus] for n in nics})


class AmdGpuNicTopology(K3Fact[GpuTopology]):
    """How near each RDMA device sits to the AMD GPUs on PCIe, from sysfs (``/sys/class/drm/card*/device`` of the
    AMD GPUs, ``/sys/class/infiniband/*/device``): the relations ``nvidia-smi topo -m`` gives on NVIDIA hosts, so a
    front-end or storage NIC (no PCIe switch shared with a GPU) stays out of ``NCCL_IB_HCA``.

    ``mlx5_0`` under the switch of ``card1`` → ``PXB``; ``mlx5_8`` on the other socket's root complex → ``SYS``.
    """

    tool = ""
    hint = "sysfs (/sys/class/drm, /sys/class/infiniband) is not readable"
    shown_command = "readlink -f /sys/class/drm/card*/device /sys/class/infiniband/*/device"

    def command(self) -> str:
        return (
            f"echo {SECTION_MARK}gpus; for d in /sys/class/drm/card[0-9]*; do case ${{d##*/}} in *-*) continue;; esac; "
            "[ \"$(cat \"$d/device/vendor\" 2>/dev/null)\" = 0x1002 ] || continue; "
            "echo \"${d##*/} $(readlink -f \"$d/device\") $(cat \"$d/device/numa_node\" 2>/dev/null)\"; done; "
            f"echo {SECTION_MARK}nics; for d in /sys/class/infiniband/*; do [ -e \"$d/device\" ] || continue; "
            "echo \"${d##*/} $(readlink -f \"$d/device\") $(cat \"$d/device/numa_node\" 2>/dev/null)\"; done; "
            f"echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> GpuTopology:
        return parse_pci_topology(lines)


# ------------------------------------------------------------------------------ hardware health

_AMD_GPU_RE = re.compile(r"^GPU:\s*(?P<index>\d+)\s*$")
_AMD_COUNT_RE = re.compile(r"^\s*(?P<key>TOTAL_(?:UN)?CORRECTABLE_COUNT|TOTAL_DEFERRED_COUNT):\s*(?P<value>\S+)\s*$")


def parse_amd_ecc(lines: list[str]) -> list[HealthEvent]:
    """``amd-smi metric --ecc``: per GPU the RAS error counts since the driver loaded. An uncorrectable error is
    fatal (the data on that GPU cannot be trusted until the node reboots and the driver retires the page); a deferred
    one (poisoned data the driver has contained, its page to be retired) is shown, not fatal; correctable ones are
    not events.

    >>> out = parse_amd_ecc(["GPU: 0", "    ECC:", "        TOTAL_CORRECTABLE_COUNT: 5",
    ...     "        TOTAL_UNCORRECTABLE_COUNT: 2", "        TOTAL_DEFERRED_COUNT: 0", "GPU: 1", "    ECC:",
    ...     "        TOTAL_UNCORRECTABLE_COUNT: N/A"])
    >>> [(e.device, e.kind, e.code, e.fatal, e.text) for e in out]
    [('GPU 0', 'ras', 'uncorrectable=2', True, 'TOTAL_UNCORRECTABLE_COUNT: 2')]
    """
    events: list[HealthEvent] = []
    device: str | None = None
    for raw in lines:
        gpu = _AMD_GPU_RE.match(raw.strip())
        if gpu:
            device = f"GPU {gpu.group('index')}"
            continue
        count = _AMD_COUNT_RE.match(raw)
        if device is None or count is None or not count.group("value").isdigit() or not int(count.group("value")):
            continue
        key, value = count.group("key"), int(count.group("value"))
        if key == "TOTAL_UNCORRECTABLE_COUNT":
            events.append(HealthEvent(device, "ras", f"uncorrectable={value}", raw.strip(), True))
        elif key == "TOTAL_DEFERRED_COUNT":
            events.append(HealthEvent(device, "ras", f"deferred={value}", raw.strip(), False))
    return events


_RAS_LINE_RE = re.compile(r"/(?P<card>card\d+)/device/ras/(?P<name>\w+_err_count):"
                          r"(?P<key>ue|ce|de):\s*(?P<value>\d+)\s*$")


def parse_amd_ras(lines: list[str]) -> list[HealthEvent]:
    """amdgpu's RAS error counters (:data:`~k3deploy.vendors.amd.RAS_COUNTERS`) as ``grep -H .`` prints them, one
    ``PATH:key: N`` line each: an uncorrectable count above 0 is fatal, a deferred one is shown, correctable ones are
    not events (as :func:`parse_amd_ecc` judges amd-smi's totals). A connector (``card1-DP-1``) is not a GPU.

    >>> out = parse_amd_ras(["/sys/class/drm/card1/device/ras/umc_err_count:ue: 2",
    ...     "/sys/class/drm/card1/device/ras/umc_err_count:ce: 7",
    ...     "/sys/class/drm/card1/device/ras/gfx_err_count:ue: 0",
    ...     "/sys/class/drm/card2/device/ras/umc_err_count:de: 1"])
    >>> [(e.device, e.kind, e.code, e.fatal, e.text) for e in out]  # doctest: +NORMALIZE_WHITESPACE
    [('card1', 'ras', 'uncorrectable=2', True, 'card1 umc_err_count: ue: 2'),
     ('card2', 'ras', 'deferred=1', False, 'card2 umc_err_count: de: 1')]
    """
    events: list[HealthEvent] = []
    for raw in lines:
        match = _RAS_LINE_RE.search(raw.strip())
        if match is None or not int(match.group("value")):
            continue
        value, card = int(match.group("value")), match.group("card")
        text = f"{card} {match.group('name')}: {match.group('key')}: {value}"
        if match.group("key") == "ue":
            events.append(HealthEvent(card, "ras", f"uncorrectable={value}", text, True))
        elif match.group("key") == "de":
            events.append(HealthEvent(card, "ras", f"deferred={value}", text, False))
    return events


def parse_amd_health(lines: list[str]) -> HealthReading:
    """The sections of :class:`AmdHealth`: ``ecc`` (amd-smi), ``ras`` (amdgpu's counters in sysfs, read where amd-smi
    reported no GPU) and ``quarantine``; with neither, health is unknown: a warning that says so, never "no event".

    >>> parse_amd_health(["K3_SECTION=ecc", "GPU: 3", "    ECC:", "        TOTAL_UNCORRECTABLE_COUNT: 1",
    ...                   "K3_SECTION=quarantine"]).health.summary()
    'ECC uncorrectable=1 on GPU 3'
    >>> parse_amd_health(["K3_SECTION=ecc", "sh: 1: amd-smi: not found", "K3_SECTION=ras",
    ...     "/sys/class/drm/card1/device/ras/umc_err_count:ue: 0", "K3_SECTION=quarantine"]).health.summary()
    'ok'
    >>> parse_amd_health(["K3_SECTION=ecc", "sh: 1: amd-smi: not found", "K3_SECTION=ras"]).health.summary()
    "health unknown on node (nothing reads the GPUs' errors: no amd-smi, no amdgpu RAS counters in sysfs)"
    """
    parts = sections(lines)
    ecc = parts.get("ecc", [])
    ras = parts.get("ras", [])
    if any(_AMD_GPU_RE.match(line.strip()) for line in ecc):
        events = parse_amd_ecc(ecc)
    elif any(_RAS_LINE_RE.search(line.strip()) for line in ras):
        events = parse_amd_ras(ras)
    else:
        said = next((line.strip() for line in ecc if line.strip()), "no output")
        events = [HealthEvent("node", "unread", "unknown",
                              f"amd-smi metric --ecc: {said[:160]}; no {RAS_COUNTERS}", False)]
    return HealthReading(tuple(events), parse_quarantine(parts.get(QUARANTINE_SECTION, [])))


class AmdHealth(K3Fact[HealthReading]):
    """Uncorrectable and deferred ECC (RAS) errors per GPU (``amd-smi metric --ecc``; where amd-smi is not installed,
    the amdgpu driver's RAS counters in sysfs) and the node's quarantine record (``<k3_config_dir>/quarantine``), in
    one command; with neither to read, an event says health is unknown (not fatal).

    ``TOTAL_UNCORRECTABLE_COUNT: 2`` under ``GPU: 0`` → ``HealthEvent(device='GPU 0', kind='ras',
    code='uncorrectable=2', fatal=True)``.
    """

    tool = "amd-smi"
    hint = "is the AMD GPU driver with amd-smi installed?"
    shown_command = PACK.command_of("hardware.health")

    def command(self, config_dir: str = "/etc/k3deploy") -> str:
        # each GPU's RAS counters, one PATH:LINE each (cards without RAS have no ras/ folder)
        return health_command([section("ecc", "amd-smi metric --ecc"),
                               section("ras", f"grep -H . {RAS_COUNTERS}")], config_dir)

    def parse(self, lines: list[str]) -> HealthReading:
        return parse_amd_health(lines)
