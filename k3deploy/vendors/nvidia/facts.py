"""NVIDIA facts: GPUs, driver flavour, Container Toolkit, Fabric Manager, IMEX, NVLink fabric state."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace

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
    wrap,
)
from k3deploy.facts.health import (
    HEALTH_TOOL_TIMEOUT_S,
    QUARANTINE_SECTION,
    HealthReading,
    health_command,
    parse_quarantine,
    section,
)
from k3deploy.facts.rdma import GpuTopology
from k3deploy.model.health import HealthEvent
from k3deploy.vendors.nvidia import (
    NVLINK5_XIDS,
    PACK,
    RECOVERY_ACTIONS,
    RECOVERY_NONE,
    XID_CODES,
    recovery_action_name,
)

DRIVER_HINT = "is the NVIDIA driver installed?"
NA_VALUES = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}
_DRIVER_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")
_MEMORY_RE = re.compile(r"^(\d+)(\s*MiB)?$")


_XID154_TO_RE = re.compile(r"\bto 0x(?P<value>[0-9A-Fa-f]+)")


def announced_action(text: str) -> str | None:
    """The recovery action an XID 154 line announces (``... changed from 0x0 (None) to 0x2 (Node Reboot Required)``),
    as :data:`~k3deploy.vendors.nvidia.RECOVERY_ACTIONS` names it; None where the line does not say.

        >>> announced_action("154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
        'Reboot'
        >>> announced_action("154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
        'None'
    """
    match = _XID154_TO_RE.search(text)
    if match is None:
        return None
    value = int(match.group("value"), 16)
    return RECOVERY_ACTIONS[value][0] if value in RECOVERY_ACTIONS else f"0x{value:x}"


def xid_event(device: str, code: str, text: str) -> HealthEvent:
    """One XID line's event: its fatality from the pack's :data:`~k3deploy.vendors.nvidia.XID_CODES` (an unknown code
    is not fatal; an NVLink5 XID is fatal where its line says ``Fatal``; an XID 154 as the recovery action it
    announces: fatal but for None).

        >>> xid_event("GPU 00000000:1B:00.0", "48", "...").fatal
        True
        >>> xid_event("GPU 0", "13", "...").fatal, xid_event("GPU 0", "999", "...").fatal
        (False, False)
        >>> xid_event("GPU 1", "145", "145, RLW_RXPIPE Nonfatal XC0 i0 Link 13").fatal
        False
        >>> xid_event("GPU 0", "154", "154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"
        ...           ).fatal
        False
    """
    fatal = XID_CODES.get(code, ("", False))[1]
    if code in NVLINK5_XIDS:
        fatal = " Fatal " in f" {text} "
    elif code == "154":
        fatal = announced_action(text) != "None"
    return HealthEvent(device, "xid", code, text, fatal)


# --------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class NvidiaGpu(Jsonable):
    name: str
    memory_mib: int | None
    driver: str | None


def parse_gpu_query(lines: list[str]) -> list[NvidiaGpu]:
    """Parse ``nvidia-smi --query-gpu=driver_version,name,memory.total,count --format=csv,noheader``.

    Works with and without ``nounits``; ``[N/A]`` fields become None; ``No devices were found`` is
    an empty list.

    >>> parse_gpu_query(["580.126.09, NVIDIA H200, 143771 MiB, 8"])
    [NvidiaGpu(name='NVIDIA H200', memory_mib=143771, driver='580.126.09')]
    """
    gpus: list[NvidiaGpu] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("No devices were found"):
            return []
        fields = [part.strip() for part in line.split(",")]
        if len(fields) != 4:
            raise Unparsable(f"expected 4 comma-separated fields, got {len(fields)}")
        driver, name, memory, _count = fields
        if driver in NA_VALUES:
            driver_value = None
        elif _DRIVER_RE.match(driver):
            driver_value = driver
        else:
            raise Unparsable(f"driver version {driver!r} is not a version")
        if memory in NA_VALUES:
            memory_value = None
        else:
            match = _MEMORY_RE.match(memory)
            if not match:
                raise Unparsable(f"memory.total {memory!r} is not a MiB value")
            memory_value = int(match.group(1))
        if not name or name in NA_VALUES:
            raise Unparsable("empty GPU name")
        gpus.append(NvidiaGpu(name=name, memory_mib=memory_value, driver=driver_value))
    if not gpus:
        raise Unparsable("no GPU lines")
    return gpus


class NvidiaGpus(K3Fact[list[NvidiaGpu]]):
    """One entry per GPU: product name, total memory in MiB, driver version.

    Example output line: ``580.126.09, NVIDIA H200, 143771 MiB, 8`` →
    ``NvidiaGpu(name='NVIDIA H200', memory_mib=143771, driver='580.126.09')``.
    ``No devices were found`` → ``[]``; no ``nvidia-smi`` → ``FactError(kind='absent')``;
    "couldn't communicate with the NVIDIA driver" → ``FactError(kind='failed')``.
    """

    tool = required_binary = "nvidia-smi"
    hint = DRIVER_HINT
    shown_command = (
        "nvidia-smi --query-gpu=driver_version,name,memory.total,count --format=csv,noheader,nounits"
    )

    nothing_found = "No devices were found"


    def parse(self, lines: list[str]) -> list[NvidiaGpu]:
        return parse_gpu_query(lines)


# ------------------------------------------------------------------------------ driver flavour


@dataclass(frozen=True)
class DriverFlavour(Jsonable):
    flavour: str  # "open" | "proprietary"
    version: str | None
    source: str  # "proc" | "modinfo"


_NVRM_RE = re.compile(r"NVRM version:\s*(?P<desc>.*?Kernel Module.*?)\s+(?P<version>\d+\.\d+(?:\.\d+)?)\s")


def parse_driver_flavour(lines: list[str]) -> DriverFlavour:
    """Parse ``/proc/driver/nvidia/version`` or ``modinfo -F license nvidia``.

    >>> parse_driver_flavour(["NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  "
    ...                       "Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Oct 23 2025"])
    DriverFlavour(flavour='open', version='580.105.08', source='proc')
    >>> parse_driver_flavour(["Dual MIT/GPL"])
    DriverFlavour(flavour='open', version=None, source='modinfo')
    """
    text = [line.strip() for line in lines if line.strip()]
    if not text:
        raise Unparsable("empty output")
    for line in text:
        if line.startswith("NVRM version:"):
            match = _NVRM_RE.search(line + " ")
            if not match:
                raise Unparsable("NVRM line without a kernel module version")
            flavour = "open" if "Open Kernel Module" in match.group("desc") else "proprietary"
            return DriverFlavour(flavour=flavour, version=match.group("version"), source="proc")
    license_line = text[0]
    if license_line in ("Dual MIT/GPL", "Dual MIT/GPL v2"):
        return DriverFlavour(flavour="open", version=None, source="modinfo")
    if license_line == "NVIDIA":
        return DriverFlavour(flavour="proprietary", version=None, source="modinfo")
    raise Unparsable("neither an NVRM version line nor a module license")


class NvidiaDriverFlavour(K3Fact[DriverFlavour]):
    """Open kernel modules or the proprietary flavour (DMA-BUF needs the open modules).

    Reads ``/proc/driver/nvidia/version``; without it, ``modinfo -F license nvidia``.
    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build ...`` →
    ``DriverFlavour(flavour='open', version='580.105.08', source='proc')``;
    ``Dual MIT/GPL`` → open, ``NVIDIA`` → proprietary.
    """

    tool = "nvidia kernel module"
    hint = DRIVER_HINT
    shown_command = "cat /proc/driver/nvidia/version || modinfo -F license nvidia"

    def command(self) -> str:
        return (
            "if [ -r /proc/driver/nvidia/version ]; then cat /proc/driver/nvidia/version 2>&1; "
            "elif command -v modinfo >/dev/null 2>&1; then modinfo -F license nvidia 2>&1; "
            f"else echo '{ABSENT_MARK}nvidia kernel module'; fi; echo {EXIT_MARK}$?"
        )

    def parse_result(self, lines: list[str], status: int | None) -> DriverFlavour | FactError:
        if any("not found" in line and "nvidia" in line for line in lines[:2]) and status:
            # modinfo: ERROR: Module nvidia not found.
            return FactError(kind="absent", tool=self.tool, command=self.shown_command, hint=self.hint)
        return super().parse_result(lines, status)

    def parse(self, lines: list[str]) -> DriverFlavour:
        return parse_driver_flavour(lines)


# ---------------------------------------------------------------------- NVIDIA Container Toolkit


@dataclass(frozen=True)
class ToolkitVersion(Jsonable):
    version: str


_CTK_RE = re.compile(r"NVIDIA Container Toolkit CLI version\s+(\d+(?:\.\d+)+)")


def parse_ctk_version(lines: list[str]) -> ToolkitVersion:
    """``NVIDIA Container Toolkit CLI version 1.17.8`` → ``ToolkitVersion(version='1.17.8')``.

    >>> parse_ctk_version(["NVIDIA Container Toolkit CLI version 1.17.8", "commit: f202b80a"])
    ToolkitVersion(version='1.17.8')
    """
    for line in lines:
        match = _CTK_RE.search(line)
        if match:
            return ToolkitVersion(version=match.group(1))
    raise Unparsable("no 'NVIDIA Container Toolkit CLI version' line")


class NvidiaContainerToolkit(K3Fact[ToolkitVersion]):
    """Version of the NVIDIA Container Toolkit (``nvidia-ctk --version``).

    ``NVIDIA Container Toolkit CLI version 1.17.8`` → ``ToolkitVersion(version='1.17.8')``.
    """

    tool = required_binary = "nvidia-ctk"
    hint = "is the NVIDIA Container Toolkit (nvidia-container-toolkit) installed?"
    shown_command = PACK.command_of("container.toolkit")


    def parse(self, lines: list[str]) -> ToolkitVersion:
        return parse_ctk_version(lines)


# ---------------------------------------------------------------- Fabric Manager and IMEX

_SYSTEMD_STATES = {"active", "inactive", "failed", "activating", "deactivating", "reloading", "unknown"}


def parse_unit_state(lines: list[str]) -> str:
    """First line of ``systemctl is-active UNIT``; anything else (no systemd) becomes ``unknown``.

    >>> parse_unit_state(["active"]), parse_unit_state(["System has not been booted with systemd"])
    ('active', 'unknown')
    """
    line = first_line(lines)
    return line if line in _SYSTEMD_STATES else "unknown"


@dataclass(frozen=True)
class FabricManagerState(Jsonable):
    service: str  # systemctl is-active
    version: str | None  # nv-fabricmanager --version
    detail: str = ""  # first line when the state is not a systemd state


_FM_VERSION_RE = re.compile(r"(\d+\.\d+\.\d+)")


def parse_fabricmanager(lines: list[str]) -> FabricManagerState:
    """Sections ``state`` (``systemctl is-active nvidia-fabricmanager``) and ``version``.

    >>> parse_fabricmanager(["K3_SECTION=state", "active", "K3_SECTION=version",
    ...                      "Fabric Manager version is : 580.95.05"])
    FabricManagerState(service='active', version='580.95.05', detail='')
    """
    parts = sections(lines)
    if "state" not in parts:
        raise Unparsable("no state section")
    state = parse_unit_state(parts["state"])
    version = None
    for line in parts.get("version", []):
        match = _FM_VERSION_RE.search(line)
        if match:
            version = match.group(1)
            break
    detail = "" if state != "unknown" else first_line(parts["state"])
    return FabricManagerState(service=state, version=version, detail=detail)


class FabricManager(K3Fact[FabricManagerState]):
    """NVIDIA Fabric Manager (HGX systems with NVSwitch): service state and version.

    Its version must equal the driver version, otherwise CUDA fails with error 802.
    ``active`` + ``Fabric Manager version is : 580.95.05`` →
    ``FabricManagerState(service='active', version='580.95.05')``.
    """

    tool = required_binary = "systemctl"
    hint = "Fabric Manager is checked with systemd's systemctl"
    shown_command = PACK.command_of("nvidia.fabricmanager")

    def command(self) -> str:
        return (
            f"echo {SECTION_MARK}state; systemctl is-active nvidia-fabricmanager 2>&1; "
            f"echo {SECTION_MARK}version; nv-fabricmanager --version 2>&1; echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> FabricManagerState:
        return parse_fabricmanager(lines)


@dataclass(frozen=True)
class ImexState(Jsonable):
    service: str  # systemctl is-active nvidia-imex
    channels: list[str] = field(default_factory=list)  # entries of /dev/nvidia-caps-imex-channels
    major: int | None = None  # from /proc/devices
    detail: str = ""
    installed: bool | None = None  # command -v nvidia-imex found it (None: not asked)


def parse_imex(lines: list[str]) -> ImexState:
    """Sections ``state``, ``channels`` (``ls /dev/nvidia-caps-imex-channels``), ``devices``, ``installed``
    (``command -v nvidia-imex``: the IMEX packages, whether or not the daemon runs).

    >>> parse_imex(["K3_SECTION=state", "active", "K3_SECTION=channels", "channel0",
    ...             "K3_SECTION=devices", "234 nvidia-caps-imex-channels"])
    ImexState(service='active', channels=['channel0'], major=234, detail='', installed=None)
    >>> parse_imex(["K3_SECTION=state", "inactive", "K3_SECTION=channels", "K3_SECTION=devices",
    ...             "234 nvidia-caps-imex-channels", "K3_SECTION=installed", "/usr/bin/nvidia-imex"]).installed
    True
    """
    parts = sections(lines)
    if "state" not in parts:
        raise Unparsable("no state section")
    state = parse_unit_state(parts["state"])
    channels = sorted(
        line.strip()
        for line in parts.get("channels", [])
        if re.fullmatch(r"channel\d+", line.strip())
    )
    major = None
    for line in parts.get("devices", []):
        match = re.fullmatch(r"\s*(\d+)\s+nvidia-caps-imex-channels\s*", line)
        if match:
            major = int(match.group(1))
    detail = "" if state != "unknown" else first_line(parts["state"])
    installed = (any(line.strip().endswith("/nvidia-imex") for line in parts["installed"])
                 if "installed" in parts else None)
    return ImexState(service=state, channels=channels, major=major, detail=detail, installed=installed)


class Imex(K3Fact[ImexState]):
    """IMEX service (GB200/GB300 multi-node NVLink) and its channel devices.

    ``active`` + ``channel0`` + ``234 nvidia-caps-imex-channels`` →
    ``ImexState(service='active', channels=['channel0'], major=234)``.
    """

    tool = required_binary = "systemctl"
    hint = "IMEX is checked with systemd's systemctl"
    shown_command = PACK.command_of("nvidia.imex")

    def command(self) -> str:
        return (
            f"echo {SECTION_MARK}state; systemctl is-active nvidia-imex 2>&1; "
            f"echo {SECTION_MARK}channels; ls /dev/nvidia-caps-imex-channels 2>/dev/null; "
            f"echo {SECTION_MARK}devices; grep nvidia-caps-imex-channels /proc/devices 2>/dev/null; "
            f"echo {SECTION_MARK}installed; command -v nvidia-imex 2>/dev/null; "
            f"echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> ImexState:
        return parse_imex(lines)


# ------------------------------------------------------------------------- IMEX domain status

#: connectivity codes of ``nvidia-imex-ctl -N`` (its legend); only ``C`` is a working connection
IMEX_CONNECTED = "C"
IMEX_CODES = {
    "I": "Invalid (node not reachable)",
    "N": "Never Connected",
    "R": "Recovering",
    "D": "Disconnected",
    "A": "Authenticating",
    "!V!": "version mismatch",
    "!M!": "node map mismatch",
    "C": "Connected",
}
_IMEX_NODE_RE = re.compile(r"^Node\s+#(\d+)\s+-\s+(\S+)\s+-\s+(\S+)(?:\s+-\s+Version:\s*(\S+))?\s*$")
_IMEX_ROW_RE = re.compile(r"^\s*(\d+)\s+(\S.*)$")


@dataclass(frozen=True)
class ImexNode(Jsonable):
    index: int  # "Node #<index>": the line of the node in nodes_config.cfg
    address: str  # as nodes_config.cfg lists it (an IP address, or a host name)
    status: str  # READY, UNAVAILABLE, ...
    version: str | None = None  # "Version: 570.172" (newer nvidia-imex-ctl only)
    links: list[str] = field(default_factory=list)  # its row of the table: connection to node 0, 1, ...


@dataclass(frozen=True)
class ImexDomainState(Jsonable):
    domain_state: str  # "Domain State: UP" (UP, DEGRADED, DOWN)
    nodes: list[ImexNode] = field(default_factory=list)
    timestamp: str = ""

    def not_connected(self) -> list[tuple[ImexNode, ImexNode | None, str]]:
        """Every (from, to, code) of the table whose code is not ``C``; ``to`` is None for a column no node has."""
        by_index = {n.index: n for n in self.nodes}
        order = [n.index for n in self.nodes]
        out: list[tuple[ImexNode, ImexNode | None, str]] = []
        for node in self.nodes:
            for col, code in enumerate(node.links):
                if code != IMEX_CONNECTED:
                    out.append((node, by_index.get(order[col]) if col < len(order) else None, code))
        return out

    @property
    def formed(self) -> bool:
        """Domain UP, every node READY, every pair of nodes Connected."""
        return (self.domain_state == "UP" and bool(self.nodes)
                and all(n.status == "READY" and len(n.links) == len(self.nodes) for n in self.nodes)
                and not self.not_connected())


def parse_imex_domain(lines: list[str]) -> ImexDomainState:
    r"""Parse ``nvidia-imex-ctl -N``: the legend, a timestamp, ``Nodes:`` (one line per node of
    ``/etc/nvidia-imex/nodes_config.cfg``), the ``Nodes From\To`` connectivity table and ``Domain State``.

    Format: the output NVIDIA's IMEX 570 prints (``tests/fixtures/nvidia/imex-ctl-N-*.txt``; the ``Version`` column
    is absent before 570.172).

    >>> d = parse_imex_domain(["3/25/2025 10:42:08.082", "Nodes:", "Node #0   - 10.136.206.47   - READY",
    ...     "Node #1   - 10.136.206.48   - READY", "", r" Nodes From\To  0  1", "       0        C  C",
    ...     "       1        C  C", "Domain State: UP"])
    >>> d.formed, [(n.address, n.status, n.links) for n in d.nodes]
    (True, [('10.136.206.47', 'READY', ['C', 'C']), ('10.136.206.48', 'READY', ['C', 'C'])])
    >>> parse_imex_domain(["Node #0   - 10.0.0.1   - READY", r" Nodes From\To  0  1", "       0        C  N",
    ...     "Domain State: DEGRADED"]).formed
    False
    """
    nodes: dict[int, dict[str, object]] = {}
    columns: list[int] = []
    rows: dict[int, list[str]] = {}
    domain_state: str | None = None
    timestamp = ""
    in_table = False
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Domain State:"):
            domain_state = stripped.split(":", 1)[1].strip()
            in_table = False
            continue
        node = _IMEX_NODE_RE.match(stripped)
        if node:
            nodes[int(node.group(1))] = {"address": node.group(2), "status": node.group(3),
                                         "version": node.group(4)}
            continue
        if stripped.startswith("Nodes From\\To"):
            columns = [int(c) for c in stripped[len("Nodes From\\To"):].split()]
            in_table = True
            continue
        if in_table:
            row = _IMEX_ROW_RE.match(line)
            if row:
                rows[int(row.group(1))] = row.group(2).split()
                continue
            in_table = False
        if re.match(r"^\d+/\d+/\d+\s+\d+:\d+:\d+", stripped):
            timestamp = stripped
    if domain_state is None:
        raise Unparsable("no 'Domain State:' line")
    if not nodes:
        raise Unparsable("no 'Node #' lines")
    out = []
    for index in sorted(nodes):
        links = rows.get(index, [])
        if columns and len(links) != len(columns):
            raise Unparsable(f"row {index} of the connectivity table has {len(links)} entries for {len(columns)} nodes")
        values = nodes[index]
        out.append(ImexNode(index=index, address=str(values["address"]), status=str(values["status"]),
                            version=values["version"] if isinstance(values["version"], str) else None,
                            links=links))
    return ImexDomainState(domain_state=domain_state, nodes=out, timestamp=timestamp)


class ImexDomain(K3Fact[ImexDomainState]):
    """The IMEX domain as this tray's ``nvidia-imex`` sees it: ``nvidia-imex-ctl -N`` (the command service reads
    ``/etc/nvidia-imex/config.cfg``). A formed domain is ``Domain State: UP`` with every node ``READY`` and every
    pair ``C`` in the connectivity table; ``nvidia-imex`` active and ``channel0`` present do not imply it.

    ``Node #0 - 10.136.206.47 - READY`` ... ``Domain State: UP`` →
    ``ImexDomainState(domain_state='UP', nodes=[ImexNode(index=0, address='10.136.206.47', status='READY', ...)])``.
    """

    tool = required_binary = "nvidia-imex-ctl"
    hint = "is the nvidia-imex package (which ships nvidia-imex-ctl) installed?"
    shown_command = PACK.command_of("nvidia.imex.domain")

    def parse(self, lines: list[str]) -> ImexDomainState:
        return parse_imex_domain(lines)


# ------------------------------------------------------------------------- NVLink fabric state

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_GPU_HEADER_RE = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KV_RE = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


#: ``Health`` rows of the Fabric block (NVML's fabric health mask, decoded by nvidia-smi) whose value ``True`` means
#: the condition holds: those that stop the fabric (fail) and those that only slow or interrupt it (warn)
HEALTH_FAILING = ("Route Unhealthy",)
HEALTH_DEGRADING = ("Route Recovery in progress", "Access Timeout Recovery")
#: ``Incorrect Configuration`` values that mean none (NVML: NONE, NOT_SUPPORTED)
_NO_MISCONFIGURATION = (None, "None")


@dataclass(frozen=True)
class GpuFabric(Jsonable):
    gpu: str  # PCI bus id from the "GPU 00000000:xx:00.0" header, or the block's position
    state: str | None
    status: str | None
    clique_id: str | None
    cluster_uuid: str | None
    health: str | None = None  # Health/Summary on newer drivers: Healthy, Unhealthy, Limited Capacity
    bandwidth: str | None = None  # Health/Bandwidth: Full, Degraded
    #: the other Health rows that are reported (not N/A): Route Recovery in progress, Route Unhealthy, Access
    #: Timeout Recovery (True/False), Incorrect Configuration (None, No Partition, ...)
    conditions: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def completed(self) -> bool:
        return self.state == "Completed" and self.status == "Success"

    @property
    def has_cluster(self) -> bool:
        return self.cluster_uuid not in (None, ZERO_UUID)

    @property
    def health_failures(self) -> list[str]:
        """What in the fabric health stops this GPU's NVLink: Summary Unhealthy, a route unhealthy, an incorrect
        configuration (for example insufficient NVLinks, no partition).

        >>> GpuFabric("0", "Completed", "Success", "1", "u", "Unhealthy", "Full",
        ...           {"Route Unhealthy": "True", "Incorrect Configuration": "No Partition"}).health_failures
        ['Health Unhealthy', 'Route Unhealthy', 'Incorrect Configuration No Partition']
        """
        out = [f"Health {self.health}"] if self.health == "Unhealthy" else []
        out += [key for key in HEALTH_FAILING if self.conditions.get(key) == "True"]
        misconfigured = self.conditions.get("Incorrect Configuration")
        if misconfigured not in _NO_MISCONFIGURATION:
            out.append(f"Incorrect Configuration {misconfigured}")
        return out

    @property
    def health_degraded(self) -> list[str]:
        """What in the fabric health slows this GPU's NVLink without stopping it: Summary Limited Capacity,
        Bandwidth not Full (degraded: fewer NVLinks than the GPU has), a route or access-timeout recovery running.

        >>> GpuFabric("0", "Completed", "Success", "1", "u", "Limited Capacity", "Degraded").health_degraded
        ['Health Limited Capacity', 'Bandwidth Degraded']
        """
        out = [f"Health {self.health}"] if self.health == "Limited Capacity" else []
        if self.bandwidth not in (None, "Full"):
            out.append(f"Bandwidth {self.bandwidth}")
        out += [key for key in HEALTH_DEGRADING if self.conditions.get(key) == "True"]
        return out


def _na(value: str) -> str | None:
    return None if value in NA_VALUES else value


def parse_fabric(lines: list[str]) -> list[GpuFabric]:
    """Extract every GPU's ``Fabric`` block from ``nvidia-smi -q``.

    >>> parse_fabric(["GPU 00000008:01:00.0", "    Fabric", "        State : Completed",
    ...               "        Status : Success", "        CliqueId : 32766",
    ...               "        ClusterUUID : 5bd2e8a5-8b4e-4d7e-9a2f-0c1e2d3f4a5b"])[0].completed
    True
    """
    result: list[GpuFabric] = []
    gpu: str | None = None
    saw_smi = False
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        header = _GPU_HEADER_RE.match(line)
        if header:
            gpu, saw_smi = header.group(1), True
            i += 1
            continue
        if line.strip().startswith(("Driver Version", "==============NVSMI LOG")):
            saw_smi = True
        if line.strip() == "Fabric":
            indent = len(line) - len(line.lstrip())
            values: dict[str, str] = {}
            sub: str | None = None
            sub_indent = 0
            i += 1
            while i < len(lines):
                inner = lines[i].rstrip()
                if not inner.strip():
                    i += 1
                    continue
                inner_indent = len(inner) - len(inner.lstrip())
                if inner_indent <= indent:
                    break
                match = _KV_RE.match(inner)
                if match and ":" in inner:
                    key, value = match.group(2), match.group(3)
                    if sub is not None and inner_indent > sub_indent:
                        values[f"{sub}/{key}"] = value
                    else:
                        sub = None
                        values[key] = value
                else:
                    sub, sub_indent = inner.strip(), inner_indent
                i += 1
            if not any(key in values for key in ("State", "Status", "ClusterUUID", "CliqueId")):
                raise Unparsable("Fabric block without State/Status/ClusterUUID/CliqueId")
            result.append(
                GpuFabric(
                    gpu=gpu if gpu is not None else str(len(result)),
                    state=_na(values.get("State", "")),
                    status=_na(values.get("Status", "")),
                    clique_id=_na(values.get("CliqueId", "")),
                    cluster_uuid=_na(values.get("ClusterUUID", "")),
                    health=_na(values.get("Health/Summary", "")),
                    bandwidth=_na(values.get("Health/Bandwidth", "")),
                    conditions={key[len("Health/"):]: value for key, value in values.items()
                                if key.startswith("Health/") and key not in ("Health/Summary", "Health/Bandwidth")
                                and _na(value) is not None},
                )
            )
            continue
        i += 1
    if not result and not saw_smi:
        raise Unparsable("no Fabric block and no GPU sections")
    return result


#: what the node keeps of ``nvidia-smi -q`` for :class:`NvlinkFabric`: every line before the report's header (an
#: error message), the header, each GPU's header line, each ``Fabric`` block (to the next line indented no deeper
#: than its title) and the exit mark; ``parse_fabric`` reads the kept lines as it reads the whole report
FABRIC_BLOCKS_AWK = (
    "{ n = match($0, /[^ ]/) - 1 } "
    "/^=+NVSMI LOG=+ *$/ || /^GPU / { s = 1; f = 0; print; next } "
    f"!s || /^{EXIT_MARK}/ {{ print; next }} "
    "f && n >= 0 && n <= fi { f = 0 } "
    "/^ *Fabric *$/ { f = 1; fi = n } "
    "f { print }"
)


class NvlinkFabric(K3Fact[list[GpuFabric]]):
    """Per-GPU NVLink fabric state from ``nvidia-smi -q``: GB200/GB300 multi-node NVLink, and on HGX boards the GPU's
    registration with the NVSwitch fabric through Fabric Manager (``Not Started`` → ``In Progress`` → ``Completed``,
    ``CliqueId 0`` and the zero ``ClusterUUID`` there), with the fabric's ``Health`` rows where the driver reports
    them (``Summary``, ``Bandwidth``, ``Route Unhealthy``, ``Incorrect Configuration`` ...).

    MNNVL is usable when every GPU shows ``State: Completed``, ``Status: Success`` and the same
    non-zero ``ClusterUUID`` and ``CliqueId``. A PCIe GPU shows ``N/A`` everywhere →
    ``GpuFabric(state=None, status=None, clique_id=None, cluster_uuid=None)``. ``[]`` means the
    driver prints no Fabric block (too old to report it).
    """

    tool = required_binary = "nvidia-smi"
    hint = DRIVER_HINT
    shown_command = "nvidia-smi -q"

    def command(self) -> str:
        # the node sends back only what parse_fabric reads (a GB300 tray's full report is ~16 KB here, more on a
        # real one): the lines before the report (an error), its header, each GPU's header and Fabric block
        return f"{{ {wrap(self.shown_command)}; }} | awk {shlex.quote(FABRIC_BLOCKS_AWK)}"

    def parse(self, lines: list[str]) -> list[GpuFabric]:
        return parse_fabric(lines)


# ------------------------------------------------------------------------- GPU/NIC topology

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


def parse_topo(lines: list[str]) -> GpuTopology:
    """Parse ``nvidia-smi topo -m``: the header (``GPU0 ... NIC0 ... CPU Affinity ...``), one row per GPU and NIC,
    the legend and the ``NIC Legend`` (``NIC0: mlx5_0``). Cells may be separated by tabs or spaces; older drivers
    name the NIC columns by device (``mlx5_0``) and print no NIC legend.

    >>> t = parse_topo(["        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity",
    ...     "GPU0     X      NV18    PIX     0-47    0", "GPU1    NV18     X      SYS     48-95   1",
    ...     "NIC0    PIX     SYS      X", "", "NIC Legend:", "", "  NIC0: mlx5_0"])
    >>> t.nics, t.nearest("mlx5_0"), t.separates
    ({'mlx5_0': ['PIX', 'SYS']}, 'PIX', True)
    """
    text = [_ANSI_RE.sub("", line).rstrip() for line in lines]
    header: list[str] | None = None
    rows: dict[str, list[str]] = {}
    legend: dict[str, str] = {}
    for line in text:
        fields = line.split()
        if not fields:
            continue
        match = _NIC_LEGEND_RE.match(line)
        if match:
            legend[match.group(1)] = match.group(2)
            continue
        if header is None and fields[0] == "GPU0" and line[:1].isspace():
            header = []
            for f in fields:
                if f in ("CPU", "NUMA"):
                    break
                header.append(f)
            continue
        if header is not None and fields[0] in header and len(fields) > 1:
            rows[fields[0]] = fields[1:1 + len(header)]
    if header is None:
        raise Unparsable("no header row starting with GPU0")
    gpus = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    if not gpus:
        raise Unparsable("no GPU columns")
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise Unparsable(f"no row for {', '.join(missing)}")
    columns = {h: i for i, h in enumerate(header)}
    nics: dict[str, list[str]] = {}
    for h in header:
        if h in gpus:
            continue
        name = legend.get(h, h)
        rels = []
        for g in gpus:
            cells = rows[g]
            i = columns[h]
            if i >= len(cells):
                raise Unparsable(f"row {g} has no cell for {h}")
            rels.append(cells[i])
        nics[name] = rels
    return GpuTopology(gpus=gpus, nics=nics)


class GpuNicTopology(K3Fact[GpuTopology]):
    """How close each RDMA NIC sits to the GPUs: ``nvidia-smi topo -m`` (its NIC legend maps ``NIC0`` to ``mlx5_0``).

    ``GPU0 ... PIX`` in the ``NIC0`` column + ``NIC0: mlx5_0`` → ``GpuTopology(nics={'mlx5_0': ['PIX', ...]})``.
    A NIC with no ``PIX``/``PXB`` path to any GPU is no GPU fabric port (NCCL would not use GPUDirect RDMA through
    it); see :func:`k3deploy.facts.rdma.choose_ports`.
    """

    tool = required_binary = "nvidia-smi"
    hint = DRIVER_HINT
    shown_command = "nvidia-smi topo -m"

    def parse(self, lines: list[str]) -> GpuTopology:
        return parse_topo(lines)


# --------------------------------------------------------------- ConnectX-8 Data Direct functions

#: the PCI id of a ConnectX-8's Data Direct function, which the kernel's ``mlx5_data_direct`` driver binds (Linux
#: ``drivers/infiniband/hw/mlx5/data_direct.c``: ``PCI_VDEVICE(MELLANOX, 0x2100) /* ConnectX-8 Data Direct */``)
DATA_DIRECT_PCI_ID = ("0x15b3", "0x2100")
DATA_DIRECT_DRIVER = "mlx5_data_direct"


@dataclass(frozen=True)
class DataDirectFunction(Jsonable):
    address: str  # PCI address, 0000:03:00.1
    driver: str | None  # the driver bound to it (mlx5_data_direct); None: none bound


def parse_data_direct(lines: list[str]) -> list[DataDirectFunction]:
    """One line per ConnectX-8 Data Direct PCI function: ``<address> [<driver>]`` (the sysfs device directory's name,
    then the name its ``driver`` link points to, empty when no driver is bound).

    >>> [(f.address, f.driver) for f in parse_data_direct(["0000:03:00.1 mlx5_data_direct", "0002:03:00.1"])]
    [('0000:03:00.1', 'mlx5_data_direct'), ('0002:03:00.1', None)]
    >>> parse_data_direct([])
    []
    """
    out: list[DataDirectFunction] = []
    for raw in lines:
        words = raw.split()
        if not words:
            continue
        if len(words) > 2 or not re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", words[0]):
            raise Unparsable(f"not '<pci address> [driver]': {raw.strip()[:60]!r}")
        out.append(DataDirectFunction(words[0], words[1] if len(words) > 1 else None))
    return out


class DataDirect(K3Fact[list[DataDirectFunction]]):
    """The ConnectX-8 Data Direct PCI functions of the host (vendor ``0x15b3``, device ``0x2100`` in sysfs) and the
    driver bound to each. GB300 trays reach their ConnectX-8 through Data Direct for GPUDirect RDMA (NVIDIA's Grace
    Blackwell CX8 GPUDirect RDMA guide); a function bound to ``mlx5_data_direct`` shows the kernel drives it.

    ``0000:03:00.1 mlx5_data_direct`` → ``[DataDirectFunction(address='0000:03:00.1', driver='mlx5_data_direct')]``;
    no such function → ``[]``.
    """

    tool = "sysfs"
    hint = "/sys/bus/pci is not readable"
    shown_command = ("for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor)\" = 0x15b3 ] && "
                     "[ \"$(cat $d/device)\" = 0x2100 ] && echo \"${d##*/} $(basename \"$(readlink $d/driver)\")\"; "
                     "done")

    def command(self) -> str:
        return ("for d in /sys/bus/pci/devices/*; do "
                f"if [ \"$(cat \"$d/vendor\" 2>/dev/null)\" = {DATA_DIRECT_PCI_ID[0]} ] && "
                f"[ \"$(cat \"$d/device\" 2>/dev/null)\" = {DATA_DIRECT_PCI_ID[1]} ]; then "
                "drv=$(readlink \"$d/driver\" 2>/dev/null); echo \"${d##*/} ${drv##*/}\"; fi; done; "
                f"echo {EXIT_MARK}0")

    def parse(self, lines: list[str]) -> list[DataDirectFunction]:
        return parse_data_direct(lines)


# ------------------------------------------------------------------------------ hardware health

_XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\): "
                     r"(?P<code>\d+)\b")
_OFF_BUS_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})")
_SMI_GPU_RE = re.compile(r"^GPU\s+(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-9A-Fa-f]\s*$")
_NVLINK_GPU_RE = re.compile(r"^GPU (?P<index>\d+): ")
_NVLINK_LINK_RE = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.+?)\s*$")
#: the kernel log lines the health fact keeps: XID events, and the driver's multi-line "fallen off the bus"
KERNEL_LOG_PATTERN = "NVRM: Xid|NVRM: The NVIDIA GPU|fallen off the bus"
#: what reads them (as the ``hardware.health`` check shows it)
KERNEL_LOG_COMMAND = f"dmesg | grep -E '{KERNEL_LOG_PATTERN}'"
#: the most kernel log lines kept (the newest): a GPU in trouble repeats its XID
KERNEL_LOG_LINES = 400
#: the lines of ``nvidia-smi -q -d ECC,ROW_REMAPPER`` the node sends back: the GPU headers, every block title (a line
#: without a colon: ``parse_ecc_remap`` places a row by the titles above it) and the rows that can make an event (an
#: uncorrectable count above 0, a Yes); a healthy GPU sends its titles only
ECC_LINES = "^GPU |Uncorrectable[^:]*: *[1-9]|: *Yes *$|^[^:]+$"
#: the lines of ``nvidia-smi -q`` the node sends back for the recovery actions: the GPU headers and their ``GPU
#: Recovery Action`` row
RECOVERY_LINES = "^GPU |GPU Recovery Action"
#: the lines of ``nvidia-smi nvlink -s`` the node sends back: each GPU's header and the links that are down (an NVL72
#: tray's GPUs print 18 links each)
NVLINK_LINES = "^GPU |inactive"


def pci_key(address: str) -> tuple[int, int, int]:
    """Domain, bus and device of a PCI address, whatever its width: the kernel log's ``0000:1b:00``, nvidia-smi's
    ``00000000:1B:00.0``.

    >>> pci_key("00000008:01:00.0") == pci_key("0008:01:00")
    True
    """
    domain, bus, rest = address.split(":")[:3]
    return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


def gpu_names(lines: list[str]) -> dict[tuple[int, int, int], str]:
    """``nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`` -> each GPU's PCI address -> ``GPU <index>``.

    >>> gpu_names(["0, 00000008:01:00.0", "No devices were found"])
    {(8, 1, 0): 'GPU 0'}
    """
    out: dict[tuple[int, int, int], str] = {}
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].count(":") == 2:
            out[pci_key(parts[1])] = f"GPU {parts[0]}"
    return out


def _device(pci: str, names: dict[tuple[int, int, int], str]) -> str:
    """``GPU <index>`` where ``names`` knows the address, else ``GPU dddd:bb:dd`` (the kernel log's form, whichever
    form the tool printed).

        >>> _device("00000000:1B:00.0", {}), _device("0000:1b:00", {(0, 27, 0): "GPU 4"})
        ('GPU 0000:1b:00', 'GPU 4')
    """
    try:
        key = pci_key(pci)
    except ValueError:
        return f"GPU {pci}"
    return names.get(key, "GPU {:04x}:{:02x}:{:02x}".format(*key))


def parse_xid_log(lines: list[str], names: dict[tuple[int, int, int], str]) -> list[HealthEvent]:
    """XID events in the kernel log (``dmesg``, or ``journalctl -k -b``), each on the GPU it names (by index where
    ``names`` knows its PCI address); the driver's multi-line "The NVIDIA GPU ... has fallen off the bus" without an
    XID counts as XID 79 (as NVIDIA's NVSentinel and leptonai/gpud read it).

    >>> line = ("[ 1843.308145] NVRM: Xid (PCI:0008:01:00): 79, pid='<unknown>', name=<unknown>, "
    ...         "GPU has fallen off the bus.")
    >>> e = parse_xid_log([line], {(8, 1, 0): "GPU 0"})[0]
    >>> e.device, e.code, e.fatal, e.text[:25]
    ('GPU 0', '79', True, 'NVRM: Xid (PCI:0008:01:00')
    >>> [e.code for e in parse_xid_log(["[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0", "  NVRM: (PCI ID: 10de:26b5) ...",
    ...  "  NVRM: fallen off the bus and is not responding to commands."], {})]
    ['79']
    """
    events: list[HealthEvent] = []
    off_bus: str | None = None
    for raw in lines:
        line = raw.strip()
        match = _XID_RE.search(line)
        if match:
            text = line[match.start():]
            events.append(xid_event(_device(match.group("pci"), names), match.group("code"), text))
            continue
        gpu = _OFF_BUS_GPU_RE.search(line)
        if gpu:
            off_bus = gpu.group("pci")
        elif off_bus is not None and "fallen off the bus" in line:
            events.append(xid_event(_device(off_bus, names), "79", f"NVRM: The NVIDIA GPU {off_bus} ... "
                                    + line[line.find("NVRM:"):].removeprefix("NVRM: ")))
            off_bus = None
    return _latest_recovery(events)


def _latest_recovery(events: list[HealthEvent]) -> list[HealthEvent]:
    """Each GPU's XID 154 lines announce its recovery action as it changes: the newest one decides, the earlier ones
    are shown, not fatal (a GPU whose action went back to None after a reset serves again).

        >>> reset = xid_event("GPU 0", "154", "154, ... changed from 0x0 (None) to 0x1 (GPU Reset Required)")
        >>> back = xid_event("GPU 0", "154", "154, ... changed from 0x1 (GPU Reset Required) to 0x0 (None)")
        >>> [e.fatal for e in _latest_recovery([reset, back])], [e.fatal for e in _latest_recovery([back, reset])]
        ([False, False], [False, True])
    """
    last = {e.device: i for i, e in enumerate(events) if e.code == "154"}
    return [replace(e, fatal=False) if e.code == "154" and last[e.device] != i else e for i, e in enumerate(events)]


def _count(value: str) -> int:
    return int(value) if value.isdigit() else 0


def parse_ecc_remap(lines: list[str], names: dict[tuple[int, int, int], str],
                    actions: dict[str, str] | None = None) -> list[HealthEvent]:
    """``nvidia-smi -q -d ECC,ROW_REMAPPER``: per GPU, the uncorrectable ECC errors since the driver loaded (the
    ``Volatile`` DRAM and SRAM counters: a GPU reset clears them), the aggregate SRAM threshold (NVIDIA's field
    diagnostic's RMA threshold), a pending row remap or page retirement (applied by a GPU reset) and a row remapping
    failure (the GPU is out of spare rows: RMA).

    A pending remap and the volatile uncorrectable errors are shown, not fatal, while the GPU's recovery action
    (``actions``: device -> the action ``GPU Recovery Action`` prints, :func:`parse_recovery_actions`) is None or
    unknown: NVIDIA's memory error management guide, "Error Recovery and Response Flags": with the remap pending flag
    set "unaffected applications can continue running without affecting accuracy and performance, and new workloads
    can be launched", and with recovery action None "the GPU can be immediately used again by starting a new GPU
    process". Under any other action they are fatal with it.

    >>> out = parse_ecc_remap(["GPU 00000000:1B:00.0", "    ECC Errors", "        Volatile",
    ...     "            DRAM Uncorrectable            : 2", "        Aggregate",
    ...     "            DRAM Uncorrectable            : 7", "    Remapped Rows",
    ...     "        Pending                           : Yes",
    ...     "        Remapping Failure Occurred        : No"], {(0, 27, 0): "GPU 0"})
    >>> [(e.device, e.kind, e.code, e.fatal) for e in out]
    [('GPU 0', 'ecc', 'uncorrectable=2', False), ('GPU 0', 'row-remap', 'pending', False)]
    """
    actions = actions or {}
    events: list[HealthEvent] = []
    device: str | None = None
    block: list[str] = []            # the enclosing block headers, outermost first, by indent
    indents: list[int] = []
    uncorrectable: list[str] = []
    volatile = 0
    found: list[HealthEvent] = []    # the GPU's other events, after its ECC errors

    def acting(gpu: str) -> bool:
        return actions.get(gpu, "None") not in RECOVERY_NONE

    def flush() -> None:
        nonlocal volatile, uncorrectable, found
        if device is not None and volatile:
            events.append(HealthEvent(device, "ecc", f"uncorrectable={volatile}", "; ".join(uncorrectable),
                                      acting(device)))
        events.extend(found)
        volatile, uncorrectable, found = 0, [], []

    for raw in lines:
        if not raw.strip():
            continue
        header = _SMI_GPU_RE.match(raw.rstrip())
        if header:
            flush()
            device, block, indents = _device(header.group("pci"), names), [], []
            continue
        if device is None:
            continue
        indent = len(raw) - len(raw.lstrip())
        while indents and indents[-1] >= indent:
            indents.pop()
            block.pop()
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            block.append(key)
            indents.append(indent)
            continue
        where = "/".join(block)
        text = raw.strip()
        if where == "ECC Errors/Volatile" and "Uncorrectable" in key and _count(value):
            volatile += _count(value)
            uncorrectable.append(f"Volatile {' '.join(text.split())}")
        elif where == "ECC Errors/Aggregate" and key == "SRAM Threshold Exceeded" and value == "Yes":
            found.append(HealthEvent(device, "ecc", "SRAM threshold exceeded", " ".join(text.split()), True))
        elif where == "Remapped Rows" and key == "Pending" and value == "Yes":
            found.append(HealthEvent(device, "row-remap", "pending", " ".join(text.split()), acting(device)))
        elif where == "Remapped Rows" and key == "Remapping Failure Occurred" and value == "Yes":
            found.append(HealthEvent(device, "row-remap", "failure", " ".join(text.split()), True))
        elif where == "Retired Pages" and key == "Pending Page Blacklist" and value == "Yes":
            found.append(HealthEvent(device, "row-remap", "page retirement pending", " ".join(text.split()),
                                     acting(device)))
    flush()
    return events


def parse_recovery_actions(lines: list[str], names: dict[tuple[int, int, int], str]) -> dict[str, str]:
    """``nvidia-smi -q | grep -E '^GPU |GPU Recovery Action'``: each GPU's recovery action as the driver reports it
    now (R570+; older drivers print no such row: no entry), as :data:`~k3deploy.vendors.nvidia.RECOVERY_ACTIONS`
    names it.

    >>> parse_recovery_actions(["GPU 00000000:18:00.0", "    GPU Recovery Action                   : None",
    ...     "GPU 00000000:2A:00.0", "    GPU Recovery Action                   : GPU_RESET"], {(0, 0x18, 0): "GPU 0"})
    {'GPU 0': 'None', 'GPU 0000:2a:00': 'Reset'}
    """
    out: dict[str, str] = {}
    device: str | None = None
    for raw in lines:
        header = _SMI_GPU_RE.match(raw.rstrip())
        if header:
            device = _device(header.group("pci"), names)
            continue
        key, sep, value = raw.strip().partition(":")
        if device is not None and sep and key.strip() == "GPU Recovery Action":
            out[device] = recovery_action_name(value) if value.strip() not in RECOVERY_NONE else "None"
    return out


def recovery_events(actions: dict[str, str]) -> list[HealthEvent]:
    """A fatal event for each GPU whose recovery action is not None: the driver asks for a reset, a reboot or a
    drain before the GPU serves again.

    >>> [(e.device, e.kind, e.code, e.fatal, e.text) for e in recovery_events({"GPU 0": "None", "GPU 3": "Reboot"})]
    [('GPU 3', 'recovery', 'Reboot', True, 'GPU Recovery Action : Reboot')]
    """
    return [HealthEvent(device, "recovery", action, f"GPU Recovery Action : {action}", True)
            for device, action in actions.items() if action not in RECOVERY_NONE]


def parse_nvlink_status(lines: list[str], fatal: bool) -> list[HealthEvent]:
    """``nvidia-smi nvlink -s``: each link of each GPU with its speed, ``<inactive>`` for a link that is down; a GPU
    whose links are all down makes NVML say so instead. ``fatal``: the GPUs reach the other trays over these links
    (an NVL72 compute tray), so one down cuts the tray off the NVLink domain's full bandwidth.

    >>> out = parse_nvlink_status(["GPU 0: NVIDIA GB300 (UUID: GPU-1)", "\\t Link 0: 50 GB/s",
    ...                            "\\t Link 3: <inactive>"], fatal=True)
    >>> [(e.device, e.code, e.fatal, e.text) for e in out]
    [('GPU 0', 'link 3 inactive', True, 'GPU 0: Link 3: <inactive>')]
    """
    events: list[HealthEvent] = []
    device: str | None = None
    for raw in lines:
        line = raw.strip()
        gpu = _NVLINK_GPU_RE.match(line)
        if gpu:
            device = f"GPU {gpu.group('index')}"
            continue
        if device is None:
            continue
        if "all links are inActive" in line or "all links are inactive" in line:
            events.append(HealthEvent(device, "nvlink", "all links inactive", f"{device}: {line}", fatal))
            continue
        link = _NVLINK_LINK_RE.match(line)
        if link and "inactive" in link.group("state").lower():
            events.append(HealthEvent(device, "nvlink", f"link {link.group('link')} inactive",
                                      f"{device}: {line}", fatal))
    return events


def parse_nvidia_health(lines: list[str]) -> HealthReading:
    """The sections of :class:`NvidiaHealth`: ``nvl`` (1 on an NVL72 compute tray), ``gpus``, ``kernel``,
    ``recovery``, ``ecc``, ``nvlink``, ``quarantine``.

    >>> r = parse_nvidia_health(["K3_SECTION=nvl", "1", "K3_SECTION=gpus", "0, 00000008:01:00.0",
    ...     "K3_SECTION=kernel", "[ 5.1] NVRM: Xid (PCI:0008:01:00): 48, pid=0, name=x, An uncorrectable double bit",
    ...     "K3_SECTION=quarantine"])
    >>> r.health.summary(), r.quarantined
    ('XID 48 on GPU 0 (double-bit ECC error)', None)
    """
    parts = sections(lines)
    names = gpu_names(parts.get("gpus", []))
    nvl = first_line(parts.get("nvl", [])) == "1"
    actions = parse_recovery_actions(parts.get("recovery", []), names)
    events = [*parse_xid_log(parts.get("kernel", []), names), *recovery_events(actions),
              *parse_ecc_remap(parts.get("ecc", []), names, actions),
              *parse_nvlink_status(parts.get("nvlink", []), nvl)]
    return HealthReading(tuple(dict.fromkeys(events)), parse_quarantine(parts.get(QUARANTINE_SECTION, [])))


class NvidiaHealth(K3Fact[HealthReading]):
    """What says a GPU or link is failing, and the node's quarantine record, in one command: XID events in the kernel
    log since boot (``dmesg``; ``journalctl -k -b`` where dmesg is not allowed), each GPU's recovery action (``GPU
    Recovery Action`` of ``nvidia-smi -q``), uncorrectable ECC errors and row remapping (``nvidia-smi -q -d
    ECC,ROW_REMAPPER``), NVLink links down (``nvidia-smi nvlink -s``), and
    ``<k3_config_dir>/quarantine``. Each tool runs under ``timeout``; a tool that fails adds nothing.

    ``NVRM: Xid (PCI:0008:01:00): 79, ... GPU has fallen off the bus.`` →
    ``HealthEvent(device='GPU 0', kind='xid', code='79', fatal=True)``.
    """

    tool = "nvidia-smi"
    hint = DRIVER_HINT
    shown_command = PACK.command_of("hardware.health")

    def command(self, config_dir: str = "/etc/k3deploy", nvl: bool = False) -> str:
        # the kernel log since boot: dmesg, or where it may not read the ring buffer, the journal's kernel messages
        # (a function named dmesg, so that the command shown runs as it is written)
        t = HEALTH_TOOL_TIMEOUT_S
        kernel = (f"dmesg() {{ timeout {t} dmesg 2>/dev/null || timeout {t} journalctl -k -b --no-pager "
                  f"-o short-monotonic 2>/dev/null; }}; {KERNEL_LOG_COMMAND} | tail -n {KERNEL_LOG_LINES}")
        return health_command([
            f"echo {SECTION_MARK}nvl; echo {1 if nvl else 0}",
            section("gpus", "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader"),
            f"echo {SECTION_MARK}kernel; {kernel}",
            section("recovery", "nvidia-smi -q", keep=RECOVERY_LINES),
            section("ecc", "nvidia-smi -q -d ECC,ROW_REMAPPER", keep=ECC_LINES),
            section("nvlink", "nvidia-smi nvlink -s", keep=NVLINK_LINES, ignore_case=True),
        ], config_dir)

    def parse(self, lines: list[str]) -> HealthReading:
        return parse_nvidia_health(lines)
