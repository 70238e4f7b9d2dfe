"""Faults that can be injected into a simulated node: ``RANK:KIND[=VALUE]``; and cluster faults: ``KIND=VALUE``.

``RANK`` is the node rank (0 = the head, ``node1``). A fault changes what that node's simulated
hardware, tools or engine report; :func:`k3sim.profiles.node_config` applies it. A cluster fault
(:data:`CLUSTER_FAULT_KINDS`, no rank) changes the simulated outside (:mod:`k3sim.outside`).
"""

from __future__ import annotations

import re
import uuid as _uuid
from dataclasses import dataclass

from k3deploy.errors import K3Error

#: kind -> one-line description (shown by ``k3deploy sim up --help`` and in errors)
FAULT_KINDS: dict[str, str] = {
    "driver": "driver=VERSION: the GPU driver reports VERSION (e.g. 570.86.15, below the CUDA 13 floor)",
    "no-nvidia-smi": "nvidia-smi is not installed on the node",
    "no-enroot": "enroot (pyxis's container runtime under Slurm) is not installed on the node",
    "no-docker": "docker is not installed on the node (a Slurm site whose jobs run pyxis or apptainer: the stage "
                 "makes the runtime's image file without it)",
    "gpu-count": "gpu-count=N: the node shows N GPUs instead of the profile's count",
    "gpu-model": "gpu-model=NAME: the GPUs report product name NAME",
    "no-dmabuf": "DMA-BUF memory registration fails (errno 524), as with an mlx5 kernel driver without DMA-BUF memory "
                 "regions (nothing on the host shows it); NCCL needs NCCL_DMABUF_ENABLE=0 + nvidia_peermem",
    "no-peermem": "the nvidia_peermem kernel module is not loaded",
    "no-amd-smi": "amd-smi is not installed (amdgpu-dkms alone, the layout the AMD pack recommends): the health fact "
                  "reads the amdgpu RAS counters in sysfs instead, which a simulated node cannot show (nspawn cannot "
                  "add /sys/class/drm), so its health is unknown: a warning (AMD)",
    "no-peer-memory": "the node has no amdkfd peer-memory interface (no /sys/kernel/mm/memory_peers/amdkfd/version, "
                      "no ib_register_peer_memory_client): RCCL stages GPU transfers through host memory (AMD)",
    "fabric": "fabric=STATE: the NVLink fabric State is STATE (N/A, Not Started, In Progress, Completed); on HGX "
              "boards the GPUs' NVSwitch fabric registration stays at STATE while Fabric Manager is active",
    "fabric-health": "fabric-health=CONDITION: every GPU's fabric Health reports CONDITION: degraded-bandwidth "
                     "(Bandwidth Degraded, Summary Limited Capacity), route-unhealthy or no-partition (Summary "
                     "Unhealthy) (GB200/GB300 trays, HGX boards)",
    "cluster-uuid": "cluster-uuid=UUID: the NVLink fabric reports ClusterUUID UUID",
    "imex-peer-down": "nvidia-imex-ctl -N on the node shows one peer of its IMEX domain UNAVAILABLE and not "
                      "connected, the domain DEGRADED (GB200/GB300, 2+ nodes)",
    "imex-mgmt": "the node runs IMEX on a management network: a second interface mgmt0 (192.168.<subnet>.<host>/24), "
                 "and every tray's nodes_config.cfg lists the node by that address (GB200/GB300)",
    "npu-link-down": "npu-link-down=N[,M...]: the network port of NPU N (hccn_tool device id) is down: "
                     "'link status: DOWN', 'net health status: Fault'; hccn_tool pings from it and to it (from the "
                     "other nodes) lose every packet (Ascend)",
    "npu-smi-a2": "the node's npu-smi prints the Atlas A2 (910B) layout: one chip per NPU, its chip row carrying the "
                  "chip id alone (no Phy-ID), npu-smi info -t health -i N -c 0 per NPU (Ascend)",
    "mount-missing": "mount-missing=PATH: PATH, a host path the engine container bind-mounts (e.g. "
                     "/usr/local/Ascend/driver/tools/hccn_tool), is not on the node (Ascend)",
    "rail-only": "the node's GPU NICs hang off rail switches with no spine: its port i reaches port i of the other "
                 "nodes and no other port, and no other port reaches it (one subnet per rail)",
    "spectrum-x": "the tray sits on a Spectrum-X RoCE fabric: its GPU NICs (ConnectX-8 SuperNICs on GB300) report "
                  "link_layer Ethernet, like its BlueField-3 DPU beside them, so only vendor_part_id tells the DPU "
                  "apart (GB200/GB300)",
    "default-route": "default-route=none|front-end: the node has no default route (an air-gapped site), or has it on "
                     "a front-end interface fe0 (198.51.100.<11+rank>/24) the other nodes do not reach; vLLM's "
                     "get_ip() then gives 0.0.0.0 or that address, and a head without VLLM_HOST_IP advertises its "
                     "message queue there: its workers wait for ever",
    "disk-full": "the image/weights directory and docker's data directory are nearly full",
    "sshd-down": "sshd is not running: the node is unreachable over ssh",
    "xid": "xid=CODE[:GPU]: the kernel log (dmesg) shows XID CODE on GPU GPU (default 0) as the NVIDIA driver prints "
           "it, e.g. 79 (fallen off the bus), 48 (double-bit ECC), 95 (uncontained ECC), 74 (NVLink) (NVIDIA)",
    "ecc": "ecc=KIND[:GPU]: GPU GPU (default 0) reports ECC errors: uncorrectable (volatile DRAM uncorrectable, a "
           "pending row remap), correctable, pending-remap, remap-failure (nvidia-smi -q -d ECC,ROW_REMAPPER), on AMD "
           "uncorrectable, correctable or deferred (amd-smi metric --ecc)",
    "recovery": "recovery=ACTION[:GPU]: the driver's recovery action for GPU GPU (default 0) changes to ACTION (none, "
                "reset, reboot, drain-p2p, drain-and-reset): nvidia-smi -q prints it as GPU Recovery Action and the "
                "kernel log shows XID 154 announcing it (NVIDIA, driver 570 and later)",
    "nvlink-down": "nvlink-down=LINK[:GPU]: NVLink link LINK of GPU GPU (default 0) is <inactive> in nvidia-smi nvlink "
                   "-s (NVIDIA boards with NVLink)",
    "npu-health": "npu-health=NPU[:STATE]: both chips of NPU NPU report Health STATE (Warning, Alarm, Critical; "
                  "default Critical) with an error code in npu-smi info -t health and the npu-smi info table (Ascend)",
    "engine-crash": "the vLLM engine exits 1 shortly after start",
    "engine-slow": "engine-slow=SECONDS: weight loading takes SECONDS longer (wall-clock, not scaled)",
    "docker-slow-create": "docker-slow-create=SECONDS: docker run takes SECONDS (wall-clock) before it creates its "
                          "container, as a busy dockerd does: a unit stopped meanwhile has no container to stop (a "
                          "docker run already waiting keeps its wait when the fault is cleared)",
    "wrong-output": "wrong-output[=MATCH]: the engine is healthy and answers wrong (every answer '!!!!!!!!', as with a "
                    "quantization the checkpoint was not made for); with MATCH, only an engine whose argv or "
                    "environment (NAME=VALUE) holds MATCH, e.g. wrong-output=K3_CHANGE=bad: a change that breaks it",
    "engine-api-key": "engine-api-key=KEY: the engine requires API key KEY whatever its environment says, as an image "
                      "whose own environment or entrypoint sets one (vLLM: 401 on /v1/* without it)",
}

#: cluster-level kind -> one-line description: faults of the simulated outside, written without a rank
CLUSTER_FAULT_KINDS: dict[str, str] = {
    "outside-cut": "outside-cut=MB: the outside serves MB more MiB, then cuts every transfer in progress once "
                   "(closes the connections mid-body), then serves normally again (resume tests)",
}

#: kinds that take ``=VALUE`` or none
OPTIONAL_VALUE_KINDS = frozenset({"wrong-output"})
#: kinds that need ``=VALUE``
VALUE_KINDS = frozenset({"driver", "gpu-count", "gpu-model", "fabric", "fabric-health", "cluster-uuid", "engine-slow",
                         "docker-slow-create",
                         "engine-api-key",
                         "npu-link-down", "mount-missing", "default-route", "xid", "ecc", "nvlink-down", "npu-health",
                         "recovery"})

#: ECC error kinds the simulated tools report (fault ``ecc``); AMD's amd-smi knows the first three
ECC_KINDS = ("uncorrectable", "correctable", "deferred", "pending-remap", "remap-failure")
#: the driver's recovery actions a fault can set (fault ``recovery``: NVML's nvmlDeviceGpuRecoveryAction_t 0-4)
RECOVERY_ACTIONS = ("none", "reset", "reboot", "drain-p2p", "drain-and-reset")
#: NPU chip health states of ``npu-smi info -t health`` a fault can set (fault ``npu-health``)
NPU_STATES = ("Warning", "Alarm", "Critical")

#: fabric states nvidia-smi prints (NVML: NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED)
FABRIC_STATES = ("N/A", "Not Started", "In Progress", "Completed")
#: fabric health conditions the simulated nvidia-smi prints (its HEALTH_CONDITIONS)
FABRIC_HEALTH = ("degraded-bandwidth", "route-unhealthy", "no-partition")

#: what fault ``default-route`` leaves a node (:func:`k3sim.network.set_default_route`)
DEFAULT_ROUTES = ("none", "front-end")

_DRIVER_RE = re.compile(r"^\d+(\.\d+){1,2}$")


@dataclass(frozen=True)
class Fault:
    rank: int
    kind: str
    value: str | None = None

    def __str__(self) -> str:
        return f"{self.rank}:{self.kind}" + (f"={self.value}" if self.value is not None else "")


@dataclass(frozen=True)
class ClusterFault:
    kind: str
    value: str

    def __str__(self) -> str:
        return f"{self.kind}={self.value}"


def is_cluster_fault(text: str) -> bool:
    """``text`` names a cluster fault kind (``KIND`` or ``KIND=VALUE``, no rank)."""
    return text.strip().partition("=")[0].strip() in CLUSTER_FAULT_KINDS


def parse_cluster_fault(text: str) -> ClusterFault:
    """Parse ``KIND=VALUE`` of a cluster fault (e.g. ``outside-cut=8``); raise :class:`K3Error` on bad input."""
    kind, eq, raw = text.strip().partition("=")
    kind = kind.strip()
    if kind not in CLUSTER_FAULT_KINDS:
        raise K3Error(f"unknown cluster fault {text!r}: choose one of {', '.join(sorted(CLUSTER_FAULT_KINDS))}")
    if not eq or not raw.strip():
        raise K3Error(f"fault {text!r} needs a value: {CLUSTER_FAULT_KINDS[kind]}")
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if not 0 <= mib <= 1 << 20:
        raise K3Error(f"bad {kind} value {raw.strip()!r} in {text!r}: give MiB to serve before the cut, e.g. 8")
    return ClusterFault(kind, f"{mib:g}")


def _kinds_hint() -> str:
    return ", ".join(sorted(FAULT_KINDS))


def parse_fault(text: str) -> Fault:
    """Parse ``RANK:KIND[=VALUE]`` (e.g. ``1:driver=570.86.15``); raise :class:`K3Error` on bad input."""
    raw = text.strip()
    rank_s, sep, rest = raw.partition(":")
    if not sep or not rank_s.strip().isdigit():
        raise K3Error(f"bad fault {text!r}: write RANK:KIND[=VALUE] with RANK a node rank (0 = head), "
                      f"e.g. 1:driver=570.86.15; kinds: {_kinds_hint()}")
    kind, eq, raw_value = rest.partition("=")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise K3Error(f"unknown fault kind {kind!r} in {text!r}: choose one of {_kinds_hint()}")
    value: str | None = None
    if kind in VALUE_KINDS:
        if not eq or not raw_value.strip():
            raise K3Error(f"fault {text!r} needs a value: {FAULT_KINDS[kind]}")
        value = _check_value(kind, raw_value.strip(), text)
    elif kind in OPTIONAL_VALUE_KINDS:
        value = raw_value.strip() or None
    elif eq:
        raise K3Error(f"fault kind {kind!r} takes no value (got {text!r}): write {rank_s.strip()}:{kind}")
    return Fault(int(rank_s), kind, value)


def _check_value(kind: str, value: str, text: str) -> str:
    if kind == "driver" and not _DRIVER_RE.match(value):
        raise K3Error(f"bad driver version {value!r} in {text!r}: write it as nvidia-smi prints it, "
                      "e.g. 570.86.15")
    if kind == "gpu-count":
        if not value.isdigit() or int(value) > 64:
            raise K3Error(f"bad GPU count {value!r} in {text!r}: use a whole number from 0 to 64")
        return str(int(value))
    if kind == "fabric":
        for state in FABRIC_STATES:
            if value.lower() == state.lower():
                return state
        raise K3Error(f"bad fabric state {value!r} in {text!r}: choose one of {', '.join(FABRIC_STATES)}")
    if kind == "fabric-health":
        if value.lower() not in FABRIC_HEALTH:
            raise K3Error(f"bad fabric health {value!r} in {text!r}: choose one of {', '.join(FABRIC_HEALTH)}")
        return value.lower()
    if kind == "default-route":
        if value.lower() not in DEFAULT_ROUTES:
            raise K3Error(f"bad default route {value!r} in {text!r}: choose one of {', '.join(DEFAULT_ROUTES)}")
        return value.lower()
    if kind == "cluster-uuid":
        try:
            return str(_uuid.UUID(value))
        except ValueError:
            raise K3Error(f"bad ClusterUUID {value!r} in {text!r}: use a UUID such as "
                          "8f7e1c2a-3b4d-4e5f-9a6b-7c8d9e0f1a2b") from None
    if kind == "npu-link-down":
        ids = [part.strip() for part in value.split(",")]
        if not all(i.isdigit() and int(i) < 64 for i in ids):
            raise K3Error(f"bad NPU list {value!r} in {text!r}: give hccn_tool device ids, e.g. 3 or 3,11")
        return ",".join(str(int(i)) for i in ids)
    if kind == "mount-missing":
        from k3deploy.vendors.ascend import MOUNTS

        hosts = {h.rstrip("/"): h for h, _ in MOUNTS}
        if value.rstrip("/") not in hosts:
            raise K3Error(f"bad path {value!r} in {text!r}: choose a host path the Ascend engine container "
                          f"bind-mounts: {', '.join(sorted(hosts))}")
        return value.rstrip("/")
    if kind in ("xid", "ecc", "nvlink-down", "npu-health", "recovery"):
        return _health_value(kind, value, text)
    if kind in ("engine-slow", "docker-slow-create"):
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= 86400:
            what = "extra load seconds" if kind == "engine-slow" else "seconds before the container is created"
            raise K3Error(f"bad {kind} value {value!r} in {text!r}: give {what}, e.g. 5")
    return value


def _health_value(kind: str, value: str, text: str) -> str:
    """``WHAT[:WHERE]`` of the health faults, checked and normalised (WHERE, when given: the GPU's index, or the NPU's
    state): ``xid=79``, ``ecc=uncorrectable:2``, ``nvlink-down=3:1``, ``npu-health=5:Alarm``.

        >>> _health_value("xid", "079", "1:xid=079"), _health_value("npu-health", "3:alarm", "t")
        ('79', '3:Alarm')
    """
    what, _, where = value.partition(":")
    what, where = what.strip(), where.strip()
    if kind == "npu-health":
        state = next((s for s in NPU_STATES if s.lower() == (where or "Critical").lower()), None)
        if not what.isdigit() or int(what) > 63 or state is None:
            raise K3Error(f"bad NPU health {value!r} in {text!r}: write NPU[:STATE], STATE one of "
                          f"{', '.join(NPU_STATES)}, e.g. 3:Critical")
        return f"{int(what)}" + (f":{state}" if where else "")
    if where and (not where.isdigit() or int(where) > 63):
        raise K3Error(f"bad GPU index {where!r} in {text!r}: give the GPU's index (nvidia-smi -L), e.g. {what}:0")
    gpu = f":{int(where)}" if where else ""
    if kind == "xid":
        if not what.isdigit() or not 1 <= int(what) <= 999:
            raise K3Error(f"bad XID {what!r} in {text!r}: give the XID code, e.g. 79 (fallen off the bus)")
        return f"{int(what)}{gpu}"
    if kind == "recovery":
        if what.lower() not in RECOVERY_ACTIONS:
            raise K3Error(f"bad recovery action {what!r} in {text!r}: choose one of {', '.join(RECOVERY_ACTIONS)}")
        return f"{what.lower()}{gpu}"
    if kind == "ecc":
        if what.lower() not in ECC_KINDS:
            raise K3Error(f"bad ECC kind {what!r} in {text!r}: choose one of {', '.join(ECC_KINDS)}")
        return f"{what.lower()}{gpu}"
    if not what.isdigit() or int(what) > 17:
        raise K3Error(f"bad NVLink link {what!r} in {text!r}: give a link number from 0 to 17")
    return f"{int(what)}{gpu}"


def check_ranks(faults: list[Fault], nodes: int) -> None:
    """Raise :class:`K3Error` when a fault names a rank outside ``0..nodes-1``."""
    for fault in faults:
        if fault.rank >= nodes:
            raise K3Error(f"fault {str(fault)!r} names rank {fault.rank}, but the cluster has {nodes} "
                          f"node(s): use a rank from 0 to {nodes - 1}")
