"""RDMA facts: InfiniBand/RoCE devices, the ports NCCL should use, loaded kernel modules (nvidia_peermem), DMA-BUF
prerequisites of the host."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from k3deploy.facts.base import (
    ABSENT_MARK,
    EXIT_MARK,
    SECTION_MARK,
    FactError,
    Jsonable,
    K3Fact,
    Unparsable,
    first_line,
    sections,
    version_key,
)
from k3deploy.vendors.common import dpu_model

# ------------------------------------------------------------------------- GPU/NIC topology

#: ``nvidia-smi topo -m`` relations, closest first (its legend): same PCIe switch, several bridges, through the CPU's
#: host bridge, across host bridges of one NUMA node, across NUMA nodes
TOPO_RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
#: the farthest relation at which NCCL uses GPUDirect RDMA between a GPU and a NIC by default (its
#: ``NCCL_NET_GDR_LEVEL`` default; a NIC beyond it logs "GPU Direct RDMA Disabled for GPU ... (distance 6 > 4)")
GDR_NEAREST = ("PIX", "PXB")


@dataclass(frozen=True)
class GpuTopology(Jsonable):
    """The GPU/NIC part of ``nvidia-smi topo -m``: for each NIC (by its RDMA device name from the NIC legend), its
    relation to each GPU (``PIX`` ... ``SYS``)."""

    gpus: list[str] = field(default_factory=list)
    nics: dict[str, list[str]] = field(default_factory=dict)   # mlx5_0 -> [relation to GPU0, GPU1, ...]

    def nearest(self, device: str) -> str | None:
        """The closest relation of ``device`` to any GPU (None: the matrix does not list it)."""
        rels = [r for r in self.nics.get(device, []) if r in TOPO_RELATIONS]
        return min(rels, key=TOPO_RELATIONS.index) if rels else None

    @property
    def separates(self) -> bool:
        """Some NIC is PIX/PXB to a GPU: the matrix tells GPU NICs from the others. On Grace (GB200/GB300) every NIC
        is ``SYS`` from every GPU (the GPUs hang off the CPU through NVLink-C2C), so it tells nothing there."""
        return any(self.nearest(n) in GDR_NEAREST for n in self.nics)


# ------------------------------------------------------------------------------- ibv_devinfo


@dataclass(frozen=True)
class RdmaPort(Jsonable):
    port: int
    state: str  # PORT_ACTIVE, PORT_DOWN, PORT_INIT, ...
    link_layer: str | None  # InfiniBand | Ethernet
    active_mtu: int | None = None
    netdev: str | None = None  # the port's network interface (RoCE netdev or IPoIB), from sysfs

    @property
    def active(self) -> bool:
        return self.state == "PORT_ACTIVE"


@dataclass(frozen=True)
class RdmaDevice(Jsonable):
    name: str
    transport: str | None = None
    fw_ver: str | None = None
    node_guid: str | None = None
    ports: list[RdmaPort] = field(default_factory=list)
    vendor_part_id: int | None = None  # the PCI device id (decimal): 4131 a ConnectX-8, 41692 a BlueField-3
    sys_image_guid: str | None = None  # the adapter's: every PCIe function of one ConnectX shares it

    @property
    def dpu(self) -> str | None:
        """The BlueField generation when this device is a DPU's NIC (by its ``vendor_part_id``), else None."""
        return dpu_model(self.vendor_part_id)


_FIELD_RE = re.compile(r"^\s*([A-Za-z_][^:]*?):\s*(.*?)\s*$")


def parse_ibv_devinfo(lines: list[str]) -> list[RdmaDevice]:
    """Parse ``ibv_devinfo`` (tab-separated fields, one ``hca_id`` block per device, several ports). A ``Failed to
    open device`` line (a device this host or container cannot open) is skipped.

    >>> devs = parse_ibv_devinfo(["hca_id:\\tmlx5_0", "\\ttransport:\\t\\t\\tInfiniBand (0)",
    ...     "\\t\\tport:\\t1", "\\t\\t\\tstate:\\t\\t\\tPORT_ACTIVE (4)", "\\t\\t\\tlink_layer:\\t\\tInfiniBand"])
    >>> devs[0].name, devs[0].ports[0].active, devs[0].ports[0].link_layer
    ('mlx5_0', True, 'InfiniBand')
    """
    devices: list[RdmaDevice] = []
    current: dict[str, Any] | None = None
    port: dict[str, Any] | None = None

    def close_port() -> None:
        nonlocal port
        if port is not None and current is not None:
            if "state" not in port:
                raise Unparsable(f"port {port['port']} of {current['name']} has no state")
            current["ports"].append(
                RdmaPort(
                    port=port["port"],
                    state=port["state"],
                    link_layer=port.get("link_layer"),
                    active_mtu=port.get("active_mtu"),
                )
            )
        port = None

    def close_device() -> None:
        nonlocal current
        close_port()
        if current is not None:
            devices.append(
                RdmaDevice(
                    name=current["name"],
                    transport=current.get("transport"),
                    fw_ver=current.get("fw_ver"),
                    node_guid=current.get("node_guid"),
                    ports=current["ports"],
                    vendor_part_id=current.get("part_id"),
                    sys_image_guid=current.get("sys_image_guid"),
                )
            )
        current = None

    for raw in lines:
        if not raw.strip():
            continue
        if raw.strip().startswith("No IB devices found"):
            return []
        if raw.strip() == "Failed to open device":
            # its stderr line for a device it cannot open (a VF not passed to this container), the others follow
            continue
        match = _FIELD_RE.match(raw)
        if not match:
            if raw.strip() == "Device ports:":
                continue
            raise Unparsable(f"unexpected line {raw.strip()[:60]!r}")
        key, value = match.group(1).strip(), match.group(2)
        if key == "hca_id":
            close_device()
            current = {"name": value, "ports": []}
            continue
        if current is None:
            raise Unparsable("field before the first hca_id")
        if key == "port":
            close_port()
            port = {"port": int(value)}
            continue
        if port is not None:
            if key == "state":
                port["state"] = value.split()[0]
            elif key == "link_layer":
                port["link_layer"] = value
            elif key == "active_mtu":
                port["active_mtu"] = int(value.split()[0])
        elif key in ("transport", "fw_ver", "node_guid", "sys_image_guid"):
            current[key] = value
        elif key.endswith("_part_id") and value.isdigit():  # vendor_part_id: the PCI device id, in decimal
            current["part_id"] = int(value)
    close_device()
    if not devices:
        raise Unparsable("no hca_id block")
    return devices


def parse_port_netdevs(lines: list[str]) -> dict[tuple[str, int], str]:
    """``<device> <port> <netdev or ->`` lines (from ``/sys/class/infiniband``) → ``{(device, port): netdev}``.

    >>> parse_port_netdevs(["mlx5_0 1 -", "rocep1s0f0 1 enp1s0f0np0"])
    {('rocep1s0f0', 1): 'enp1s0f0np0'}
    """
    out: dict[tuple[str, int], str] = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2] != "-":
            out[(parts[0], int(parts[1]))] = parts[2]
    return out


def with_netdevs(devices: list[RdmaDevice], netdevs: dict[tuple[str, int], str]) -> list[RdmaDevice]:
    if not netdevs:
        return devices
    return [replace(d, ports=[replace(p, netdev=netdevs.get((d.name, p.port), p.netdev)) for p in d.ports])
            for d in devices]


#: each RDMA port's network interface: the netdev of its GID 0 (RoCE), else the device's one netdev (IPoIB); where
#: sysfs has no infiniband class (a container that hides it), MLNX/DOCA-OFED's ``ibdev2netdev``
#: (``mlx5_0 port 1 ==> ib0 (Up)``) when installed
_NETDEV_COMMAND = (
    "for p in /sys/class/infiniband/*/ports/*; do [ -d \"$p\" ] || continue; d=${p%/ports/*}; "
    "n=$(cat \"$p/gid_attrs/ndevs/0\" 2>/dev/null); "
    "[ -n \"$n\" ] || { n=$(ls \"$d/device/net\" 2>/dev/null); case $n in *[[:space:]]*) n=;; esac; }; "
    "echo \"${d##*/} ${p##*/} ${n:--}\"; done; "
    "[ -d /sys/class/infiniband ] || "
    "ibdev2netdev 2>/dev/null | awk '$2 == \"port\" && $4 == \"==>\" {print $1, $3, $5}'"
)


class RdmaDevices(K3Fact[list[RdmaDevice]]):
    """RDMA devices with their ports' state, link layer and network interface, from ``ibv_devinfo`` and
    ``/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/ndevs/0`` (the kernel's netdev of a RoCE port).

    ``hca_id: mlx5_0`` / ``port: 1`` / ``state: PORT_ACTIVE (4)`` / ``link_layer: InfiniBand`` →
    ``RdmaDevice(name='mlx5_0', ports=[RdmaPort(port=1, state='PORT_ACTIVE', link_layer='InfiniBand')])``.
    ``No IB devices found`` → ``[]``.
    """

    tool = required_binary = "ibv_devinfo"
    hint = "is rdma-core / ibverbs-utils (or MLNX/DOCA-OFED) installed?"
    shown_command = "ibv_devinfo"

    nothing_found = "No IB devices found"

    def command(self) -> str:
        return (f"timeout 60 ibv_devinfo 2>&1; k3rc=$?; echo {SECTION_MARK}netdev; {_NETDEV_COMMAND}; "
                f"echo {EXIT_MARK}$k3rc")

    def process(self, output: list[str]) -> list[RdmaDevice] | FactError:  # type: ignore[override]
        """``ibv_devinfo``'s own output as before; the netdev section (after it) names each port's interface."""
        mark = f"{SECTION_MARK}netdev"
        at = next((i for i, line in enumerate(output) if line.strip() == mark), None)
        if at is None:
            return super().process(output)
        tail = output[at + 1:]
        netdevs = parse_port_netdevs([line for line in tail if not line.strip().startswith(EXIT_MARK)])
        value = super().process(output[:at] + [line for line in tail if line.strip().startswith(EXIT_MARK)])
        return with_netdevs(value, netdevs) if isinstance(value, list) else value

    def parse(self, lines: list[str]) -> list[RdmaDevice]:
        return parse_ibv_devinfo(lines)


# ------------------------------------------------------------------------------ port choice


@dataclass(frozen=True)
class PortChoice:
    """The RDMA ports NCCL (``NCCL_IB_HCA``) and UCX (``UCX_NET_DEVICES``) should use on a host, and why the other
    active ports are left out."""

    ports: list[tuple[str, int]]
    excluded: list[tuple[str, int, str]] = field(default_factory=list)   # (device, port, why)
    missing: list[str] = field(default_factory=list)   # k3_ib_hca items that are no active port here
    from_setting: bool = False   # chosen by k3_ib_hca
    front_end: bool = False      # the only port left carries the default route (shared with the front end)

    @property
    def nccl_ib_hca(self) -> str | None:
        """Exact-match list: ``=mlx5_0:1,mlx5_1:1`` (without ``=`` NCCL matches prefixes: mlx5_1 would pick
        mlx5_10 too)."""
        return "=" + ",".join(f"{d}:{p}" for d, p in self.ports) if self.ports else None

    @property
    def ucx_net_devices(self) -> str | None:
        """UCX's form of the same ports: ``mlx5_0:1,mlx5_1:1``."""
        return ",".join(f"{d}:{p}" for d, p in self.ports) if self.ports else None


#: the PCI domain in a PCI-path name (systemd's ``P<domain>`` before ``p<bus>s<slot>``, rdma-core's ``roce``/``ibp``
#: names the same way): ``roceP2p1s0f1`` is ``rocep1s0f1``'s function in PCI domain 2
_PCI_DOMAIN = re.compile(r"P\d+(?=p\d+s\d+)")


def same_port_names(devices: list[RdmaDevice]) -> dict[str, str]:
    """The RDMA devices that are a second name of another one's port: ``{second name: the name kept}``.

    A DGX Spark (GB10) reaches its ConnectX-7 through two PCIe links, so each QSFP port is two PCIe functions in two
    PCI domains, each with its RDMA device and netdev: ``rocep1s0f1`` (``enp1s0f1np1``) and ``roceP2p1s0f1``
    (``enP2p1s0f1np1``) are one physical port (NVIDIA's DGX Spark playbook "Connect Two Sparks": "each physical
    port has two names ... use enp1s0f0np0 and enp1s0f1np1 only"; tests/fixtures/README.md). Two devices are one
    port's names when they are functions of one adapter (the same ``sys_image_guid``) whose PCI-path names differ
    only in the PCI domain; the one in the lowest domain is kept. Devices of different adapters are never paired,
    whatever their names (a server with PCI segments has ``rocep1s0f0`` and ``roceP1p1s0f0`` on two NICs).

    >>> g = "4cbb:4703:002d:1a16"
    >>> same_port_names([RdmaDevice("roceP2p1s0f1", sys_image_guid=g), RdmaDevice("rocep1s0f1", sys_image_guid=g),
    ...                  RdmaDevice("rocep1s0f0", sys_image_guid=g)])
    {'roceP2p1s0f1': 'rocep1s0f1'}
    >>> same_port_names([RdmaDevice("rocep1s0f0", sys_image_guid="a"), RdmaDevice("roceP1p1s0f0", sys_image_guid="b")])
    {}
    """
    def domain(name: str) -> int:
        m = _PCI_DOMAIN.search(name)
        return int(m[0][1:]) if m else 0

    kept: dict[tuple[str, str], str] = {}
    out: dict[str, str] = {}
    for d in sorted(devices, key=lambda d: (domain(d.name), d.name)):
        if d.sys_image_guid is None:
            continue
        key = (d.sys_image_guid, _PCI_DOMAIN.sub("", d.name))
        if key in kept:
            out[d.name] = kept[key]
        else:
            kept[key] = d.name
    return out


def _setting_items(setting: str) -> list[str]:
    return [i.strip() for i in setting.strip().removeprefix("=").split(",") if i.strip()]


def choose_ports(devices: list[RdmaDevice], default_interface: str | None = None,
                 setting: str | None = None, topology: GpuTopology | None = None) -> PortChoice:
    """The ports for NCCL and UCX: ``setting`` (``k3_ib_hca``: ``mlx5_0:1,mlx5_3`` = those ports, a device alone =
    its active ports) when given; else every active port but a BlueField DPU's (``vendor_part_id``; unless only
    BlueField ports are up: BlueField-3 SuperNICs as the GPU NICs), InfiniBand only when there is an InfiniBand
    fabric (an Ethernet port beside it is a BlueField or front-end NIC), only those whose HCA sits near a GPU when
    ``topology`` (``nvidia-smi topo -m``) tells GPU NICs from the others, and never the port that carries the
    default route (the front-end/storage network: reachable-looking ports that cannot reach the peers hang NCCL's
    init) unless it is the only one. A port that has two names (a DGX Spark's ConnectX-7 over two PCIe links:
    :func:`same_port_names`) is taken once, by the name NVIDIA says to use.

    Near a GPU means ``PIX`` or ``PXB`` to at least one GPU: the farthest distance at which NCCL uses GPUDirect RDMA
    by default (``NCCL_NET_GDR_LEVEL``). ``NODE`` is not enough: a front-end or storage NIC on the GPUs' socket is
    ``NODE`` to them (a real H200's ``mlx5_bond_0``). Where no HCA is PIX/PXB to any GPU (Grace: GB200/GB300 show
    every NIC as ``SYS``) the matrix tells nothing and no port is left out for it.

    >>> ib = RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", netdev="ens1f0np0")])
    >>> fe = RdmaDevice("mlx5_4", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet", netdev="eno1")])
    >>> choose_ports([ib, fe], "eno1").nccl_ib_hca
    '=mlx5_0:1'
    >>> choose_ports([ib, fe], "eno1", setting="mlx5_4:1").ucx_net_devices
    'mlx5_4:1'
    >>> bf3 = RdmaDevice("mlx5_5", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet")], vendor_part_id=41692)
    >>> choose_ports([ib, bf3]).excluded
    [('mlx5_5', 1, 'BlueField-3 DPU (vendor_part_id 41692)')]
    """
    active = [(d.name, p) for d in devices for p in d.ports if p.active]
    if setting:
        chosen: list[tuple[str, int]] = []
        missing: list[str] = []
        for item in _setting_items(setting):
            name, _, port = item.partition(":")
            found = [(n, p.port) for n, p in active if n == name and (not port or str(p.port) == port)]
            if found:
                chosen += [c for c in found if c not in chosen]
            else:
                missing.append(item)
        return PortChoice(ports=chosen, missing=missing, from_setting=True)
    excluded: list[tuple[str, int, str]] = []
    dpus = {d.name: f"{d.dpu} DPU (vendor_part_id {d.vendor_part_id})" for d in devices if d.dpu}
    if any(n in dpus for n, _ in active) and not all(n in dpus for n, _ in active):
        excluded += [(n, p.port, dpus[n]) for n, p in active if n in dpus]
        active = [(n, p) for n, p in active if n not in dpus]
    twins = same_port_names(devices)
    if twins:
        kept = {(n, p.port) for n, p in active}
        second = [(n, p) for n, p in active if n in twins and (twins[n], p.port) in kept]
        excluded += [(n, p.port, f"a second name of {twins[n]}:{p.port}'s port (another PCIe link to it)")
                     for n, p in second]
        active = [(n, p) for n, p in active if (n, p) not in second]
    if any(p.link_layer == "InfiniBand" for _, p in active):
        excluded += [(n, p.port, "Ethernet beside the InfiniBand fabric") for n, p in active
                     if p.link_layer != "InfiniBand"]
        active = [(n, p) for n, p in active if p.link_layer == "InfiniBand"]
    if topology is not None and topology.separates:
        far = [(n, p) for n, p in active if topology.nearest(n) not in (*GDR_NEAREST, None)]
        if far and len(far) < len(active):
            excluded += [(n, p.port, f"no PIX/PXB path to a GPU (nearest {topology.nearest(n)})") for n, p in far]
            active = [(n, p) for n, p in active if (n, p) not in far]
    front_end = False
    if default_interface:
        routed = [(n, p) for n, p in active if p.netdev == default_interface]
        if routed and len(routed) < len(active):
            excluded += [(n, p.port, f"{default_interface} carries the default route") for n, p in routed]
            active = [(n, p) for n, p in active if p.netdev != default_interface]
        elif routed:
            front_end = True
    return PortChoice(ports=[(n, p.port) for n, p in active], excluded=excluded, front_end=front_end)


# ------------------------------------------------------------------------------------ lsmod


@dataclass(frozen=True)
class LoadedModules(Jsonable):
    names: list[str]

    def __contains__(self, name: object) -> bool:
        return name in self.names


def parse_modules(lines: list[str]) -> LoadedModules:
    """Module names from ``lsmod`` (header line skipped) or ``/proc/modules``.

    >>> parse_modules(["Module                  Size  Used by", "nvidia_peermem         16384  0"]).names
    ['nvidia_peermem']
    """
    names: set[str] = set()
    for line in lines:
        parts = line.split()
        if not parts or parts[0] == "Module":
            continue
        if len(parts) < 3 or not parts[1].isdigit():
            raise Unparsable(f"not a module line: {line.strip()[:60]!r}")
        names.add(parts[0])
    return LoadedModules(names=sorted(names))


class KernelModules(K3Fact[LoadedModules]):
    """Loaded kernel modules (``lsmod``, or ``/proc/modules`` without kmod).

    ``nvidia_peermem  16384  0`` → ``'nvidia_peermem' in LoadedModules(...)``.
    """

    tool = "lsmod"
    hint = "neither lsmod (kmod) nor /proc/modules is available"
    shown_command = "lsmod"

    def command(self) -> str:
        return (
            "if command -v lsmod >/dev/null 2>&1; then lsmod 2>&1; "
            "elif [ -r /proc/modules ]; then cat /proc/modules; "
            f"else echo '{ABSENT_MARK}lsmod'; fi; echo {EXIT_MARK}$?"
        )

    def parse(self, lines: list[str]) -> LoadedModules:
        return parse_modules(lines)


# ------------------------------------------------------------------------- DMA-BUF support

#: DMA-BUF and the RDMA stack's DMA-BUF memory regions (ib_umem_dmabuf, mlx5's user MR from a dma-buf fd) are in the
#: kernel since 5.12
DMABUF_MIN_KERNEL = (5, 12)


@dataclass(frozen=True)
class DmabufSupport(Jsonable):
    """What the host offers for DMA-BUF GPUDirect RDMA. The user-space side (rdma-core's ``ibv_reg_dmabuf_mr``,
    ``mlx5dv_reg_dmabuf_mr``) is the image's, not the host's: NCCL runs in the container. On the host what counts is
    the kernel (dma-buf, and its RDMA core registering dma-buf memory), the NVIDIA open kernel modules (they export
    GPU memory as dma-buf) and the loaded mlx5 kernel driver. Only a registration attempt is definitive: an mlx5
    driver without DMA-BUF MR support fails it with ``errno 524`` (``k3_nccl_probe``)."""

    kernel: str
    kernel_ok: bool
    open_modules: bool | None  # None: no NVIDIA kernel module loaded
    mlx5_loaded: bool | None  # mlx5_ib loaded (lsmod); None: not known
    prerequisites_met: bool | None  # None: unknown
    reasons: list[str] = field(default_factory=list)
    mlx5_version: str | None = None  # modinfo -F version mlx5_ib: MLNX/DOCA-OFED's version; None: the kernel's own
    kconfig: str | None = None  # CONFIG_DMA_SHARED_BUFFER from /boot/config-<release>; None: no config file


def parse_dmabuf(lines: list[str]) -> DmabufSupport:
    """Sections ``kernel`` (``uname -r``), ``nvidia`` (first line of ``/proc/driver/nvidia/version``, else
    ``modinfo -F license nvidia``), ``kconfig`` (``CONFIG_DMA_SHARED_BUFFER=`` of ``/boot/config-<release>``) and
    ``mlx5`` (``loaded`` / ``absent`` for ``mlx5_ib`` in ``lsmod``, then ``modinfo -F version mlx5_ib``).

    >>> parse_dmabuf(["K3_SECTION=kernel", "6.8.0-45-generic", "K3_SECTION=nvidia",
    ...     "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build",
    ...     "K3_SECTION=kconfig", "CONFIG_DMA_SHARED_BUFFER=y", "K3_SECTION=mlx5", "loaded", "24.10-1.1.4"]
    ...     ).prerequisites_met
    True
    """
    parts = sections(lines)
    kernel = first_line(parts.get("kernel", []))
    if not kernel or not re.match(r"^\d+\.\d+", kernel):
        raise Unparsable("no kernel release")
    kernel_ok = version_key(kernel)[:2] >= DMABUF_MIN_KERNEL
    nvidia = first_line(parts.get("nvidia", []))
    open_modules: bool | None = None
    if nvidia.startswith("NVRM version:"):
        open_modules = "Open Kernel Module" in nvidia
    elif nvidia in ("Dual MIT/GPL", "Dual MIT/GPL v2"):  # modinfo -F license nvidia
        open_modules = True
    elif nvidia == "NVIDIA":
        open_modules = False
    kconfig = None
    for line in parts.get("kconfig", []):
        if line.strip().startswith("CONFIG_DMA_SHARED_BUFFER="):
            kconfig = line.strip().split("=", 1)[1]
        elif line.strip() == "# CONFIG_DMA_SHARED_BUFFER is not set":
            kconfig = "n"
    mlx5 = [line.strip() for line in parts.get("mlx5", []) if line.strip()]
    mlx5_loaded = True if mlx5[:1] == ["loaded"] else False if mlx5[:1] == ["absent"] else None
    mlx5_version = next((v for v in mlx5[1:] if re.match(r"^\d+\.\d+", v)), None) if mlx5_loaded else None
    reasons: list[str] = []
    if not kernel_ok:
        reasons.append(f"kernel {kernel} < 5.12")
    if kconfig not in (None, "y"):
        reasons.append(f"kernel built without dma-buf (CONFIG_DMA_SHARED_BUFFER={kconfig})")
    if open_modules is False:
        reasons.append("proprietary NVIDIA kernel modules (DMA-BUF needs the open modules)")
    elif open_modules is None:
        reasons.append("no NVIDIA kernel module loaded")
    if mlx5_loaded is False:
        reasons.append("the mlx5 kernel driver (mlx5_ib) is not loaded")
    elif mlx5_loaded is None:
        reasons.append("whether mlx5_ib is loaded is not known")
    if not kernel_ok or kconfig not in (None, "y") or open_modules is False:
        met: bool | None = False
    elif open_modules is None or not mlx5_loaded:
        met = None
    else:
        met = True
    return DmabufSupport(kernel=kernel, kernel_ok=kernel_ok, open_modules=open_modules, mlx5_loaded=mlx5_loaded,
                         prerequisites_met=met, reasons=reasons, mlx5_version=mlx5_version, kconfig=kconfig)


class DmabufPrerequisites(K3Fact[DmabufSupport]):
    """What the host offers for DMA-BUF GPUDirect RDMA: kernel >= 5.12 built with dma-buf, the NVIDIA open kernel
    modules, and the mlx5 kernel driver loaded (its version when it is MLNX/DOCA-OFED's). The host's libibverbs does
    not matter: NCCL uses the image's.

    Kernel ``6.8.0-45-generic`` + ``Open Kernel Module`` + ``mlx5_ib`` loaded →
    ``DmabufSupport(prerequisites_met=True)``.
    A failed registration (``errno 524``, an mlx5 driver without DMA-BUF MR support) can still happen, so NCCL's log
    stays the final word (``k3_nccl_probe``).
    """

    tool = required_binary = "uname"
    hint = "uname is missing"
    shown_command = ("uname -r; head -n1 /proc/driver/nvidia/version; grep CONFIG_DMA_SHARED_BUFFER /boot/config-*; "
                     "lsmod | grep mlx5_ib; modinfo -F version mlx5_ib")

    def command(self) -> str:
        # the kernel release read once; the module list matched by the shell itself (a line that starts "mlx5_ib ")
        return (
            f"k=$(uname -r); echo {SECTION_MARK}kernel; echo \"$k\"; "
            f"echo {SECTION_MARK}nvidia; if [ -r /proc/driver/nvidia/version ]; then "
            "head -n1 /proc/driver/nvidia/version; else modinfo -F license nvidia 2>/dev/null; fi; "
            f"echo {SECTION_MARK}kconfig; grep -h 'CONFIG_DMA_SHARED_BUFFER' \"/boot/config-$k\" 2>/dev/null; "
            f"echo {SECTION_MARK}mlx5; if command -v lsmod >/dev/null 2>&1; then m=$(lsmod 2>/dev/null); "
            "else m=$(cat /proc/modules 2>/dev/null); fi; "
            "case \"\n$m\" in *\"\nmlx5_ib \"*) echo loaded; modinfo -F version mlx5_ib 2>/dev/null;; "
            "*) [ -z \"$m\" ] || echo absent;; esac; "
            f"echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> DmabufSupport:
        return parse_dmabuf(lines)
