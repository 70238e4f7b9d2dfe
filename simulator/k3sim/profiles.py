"""Hardware profiles of the simulated nodes and the per-node configuration the simulated tools read.

Every hardware id of the Kimi-K3 recipe has a profile: vendor, the GPU product name exactly as the
vendor tool prints it, GPUs per node, memory per GPU (MiB), driver/CUDA/ROCm/CANN versions, RDMA
devices and NVLink fabric. :func:`node_config` turns a profile plus the node's identity and faults
into the JSON document stored at ``/etc/k3sim/node.json`` in the node; the tools under
``node_tools/`` re-read it on every call (``K3SIM_NODE_CONFIG`` overrides the path).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid as _uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3deploy.errors import K3Error
from k3sim.faults import FAULT_KINDS, Fault

if TYPE_CHECKING:
    from k3deploy.recipe.taxonomy import HardwareProfile

#: node_tools tree, mirrored at the node's root
NODE_TOOLS = Path(__file__).with_name("node_tools")
#: where the node configuration lives inside a node
NODE_CONFIG_PATH = "/etc/k3sim/node.json"
#: simulated docker's data directory inside a node
DOCKER_DATA_DIR = "/var/lib/k3sim/docker"
#: nominal (unscaled) weight-load time of one engine start, seconds; scaled by time_scale
NOMINAL_LOAD_SECONDS = 300.0

_NV_HGX_BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
_NV_GRACE_BUS = ["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"]
_AMD_BUS = ["05", "26", "46", "65", "85", "a6", "c6", "e5"]
_ASCEND_BUS = ["9D", "9F", "C1", "C3", "81", "83", "A1", "A3", "01", "03", "21", "23", "41", "43", "61", "63"]


def hardware_profiles() -> dict[str, HardwareProfile]:
    """The recipe's hardware profiles by id (read on first use: ``k3deploy --help`` lists ``sim`` without them)."""
    from k3deploy.recipe.taxonomy import hardware

    return hardware()


def _ib(n: int, link_layer: str = "InfiniBand", part: int = 4129, fw: str = "28.39.2048",
        board: str = "MT_0000000838") -> list[dict[str, Any]]:
    devs = []
    for i in range(n):
        ib = link_layer == "InfiniBand"
        devs.append({
            "name": f"mlx5_{i}", "transport": "InfiniBand (0)", "fw_ver": fw,
            "node_guid": f"b859:9f03:00ca:{0xe2f8 + i:04x}", "vendor_id": "0x02c9",
            "vendor_part_id": part, "hw_ver": "0x0", "board_id": board,
            "state": "PORT_ACTIVE (4)", "max_mtu": "4096 (5)",
            "active_mtu": "4096 (5)" if ib else "1024 (3)",
            "sm_lid": 1 if ib else 0, "port_lid": 4 + i if ib else 0, "link_layer": link_layer,
            "gpu": i,  # the GPU it shares a PCIe switch with (nvidia-smi topo -m: PIX)
        })
    return devs


def _storage(name: str = "mlx5_bond_0") -> dict[str, Any]:
    """A front-end/storage NIC (a bonded dual-port ConnectX, RoCE, port up) on the first socket's root complex: no
    GPU shares its PCIe switch (``NODE`` to the first socket's GPUs, ``SYS`` to the others, as a real H200's
    ``mlx5_bond_0`` in ``tests/fixtures/nvidia/topo-m-h200-bond.txt``). Its network is not the GPU fabric."""
    return {"name": name, "transport": "InfiniBand (0)", "fw_ver": "28.39.2048", "node_guid": "9c63:c003:0021:4f10",
            "vendor_id": "0x02c9", "vendor_part_id": 4129, "hw_ver": "0x0", "board_id": "MT_0000000834",
            "state": "PORT_ACTIVE (4)", "max_mtu": "4096 (5)", "active_mtu": "1024 (3)", "sm_lid": 0, "port_lid": 0,
            "link_layer": "Ethernet", "gpu": None, "socket": 0, "fabric": "storage"}


def _bluefield(index: int) -> dict[str, Any]:
    """A dual-port BlueField-3 (Ethernet/RoCE, north-south traffic) with its second port down."""
    return {"name": f"mlx5_{index}", "transport": "InfiniBand (0)", "fw_ver": "32.43.1014",
            "node_guid": "a088:c203:0051:7d2e", "vendor_id": "0x02c9", "vendor_part_id": 41692, "hw_ver": "0x1",
            "board_id": "MT_0000000884", "state": "PORT_ACTIVE (4)", "max_mtu": "4096 (5)",
            "active_mtu": "1024 (3)", "sm_lid": 0, "port_lid": 0, "link_layer": "Ethernet",
            "gpu": None, "fabric": "front-end",
            "extra_ports": [{"state": "PORT_DOWN (1)", "max_mtu": "4096 (5)", "active_mtu": "1024 (3)",
                             "sm_lid": 0, "port_lid": 0, "link_layer": "Ethernet"}]}


_NVIDIA_COMMON: dict[str, Any] = {"vendor": "nvidia", "kernel_module": "open", "ctk_version": "1.17.8",
                                  "container_runtime_version": "1.17.6"}

#: hardware id -> profile
PROFILES: dict[str, dict[str, Any]] = {
    "h100": {**_NVIDIA_COMMON, "product": "NVIDIA H100 80GB HBM3", "architecture": "Hopper", "gpus": 8,
             "memory_mib": 81559, "compute_cap": "9.0", "driver": "580.126.09", "power_w": 700,
             "rdma": _ib(8), "fabric": None, "fabricmanager": True},
    "h200": {**_NVIDIA_COMMON, "product": "NVIDIA H200", "architecture": "Hopper", "gpus": 8,
             "memory_mib": 143771, "compute_cap": "9.0", "driver": "580.126.09", "power_w": 700,
             "rdma": _ib(8), "fabric": None, "fabricmanager": True},
    "b200": {**_NVIDIA_COMMON, "product": "NVIDIA B200", "architecture": "Blackwell", "gpus": 8,
             "memory_mib": 183359, "compute_cap": "10.0", "driver": "580.126.09", "power_w": 1000,
             "rdma": _ib(8), "fabric": None, "fabricmanager": True},
    "b300": {**_NVIDIA_COMMON, "product": "NVIDIA B300 SXM6 AC", "architecture": "Blackwell", "gpus": 8,
             "memory_mib": 275040, "compute_cap": "10.3", "driver": "580.95.05", "power_w": 1100,
             "rdma": _ib(8, "Ethernet", part=4131, fw="40.45.1200", board="MT_0000001093") + [_storage()],
             "fabric": None, "fabricmanager": True},
    "gb200": {**_NVIDIA_COMMON, "product": "NVIDIA GB200", "architecture": "Blackwell", "gpus": 4,
              "memory_mib": 189471, "compute_cap": "10.0", "driver": "580.95.05", "power_w": 1200,
              "rdma": _ib(4) + [_bluefield(4)], "fabric": "nvl", "fabricmanager": False, "imex": True},
    "gb300": {**_NVIDIA_COMMON, "product": "NVIDIA GB300", "architecture": "Blackwell", "gpus": 4,
              "memory_mib": 284208, "compute_cap": "10.3", "driver": "580.95.05", "power_w": 1400,
              "rdma": _ib(4, part=4131, fw="40.45.1200", board="MT_0000001093") + [_bluefield(4)], "fabric": "nvl",
              "fabricmanager": False, "imex": True},
    "mi300x": {"vendor": "amd", "product": "AMD Instinct MI300X", "gfx": "gfx942", "gpus": 8,
               "memory_mib": 196608, "driver": "6.14.14", "rocm": "7.0.2", "amdsmi": "26.0.2+39589fda",
               "device_id": "0x74a1", "power_w": 750, "rdma": _ib(8, "Ethernet")},
    "mi325x": {"vendor": "amd", "product": "AMD Instinct MI325X", "gfx": "gfx942", "gpus": 8,
               "memory_mib": 262144, "driver": "6.14.14", "rocm": "7.0.2", "amdsmi": "26.0.2+39589fda",
               "device_id": "0x74a5", "power_w": 1000, "rdma": _ib(8, "Ethernet")},
    "mi355x": {"vendor": "amd", "product": "AMD Instinct MI355X", "gfx": "gfx950", "gpus": 8,
               "memory_mib": 294912, "driver": "6.14.14", "rocm": "7.0.2", "amdsmi": "26.0.2+39589fda",
               "device_id": "0x75a3", "power_w": 1400, "rdma": _ib(8, "Ethernet")},
    "ascend_910c": {"vendor": "ascend", "product": "Ascend910", "gpus": 16, "memory_mib": 65536,
                    "driver": "25.3.rc1", "firmware": "7.7.0.1.231", "cann": "8.5.0",
                    "innerversion": "V100R001C23SPC002B212", "rdma": []},
}

# files under node_tools that belong to one vendor only (absolute node paths)
_VENDOR_FILES: dict[str, tuple[str, ...]] = {
    "nvidia": ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-ctk", "/usr/bin/nvidia-container-runtime",
               "/usr/bin/nv-fabricmanager", "/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl"),
    "amd": ("/usr/bin/amd-smi", "/usr/bin/rocm-smi", "/opt/rocm/.info/version"),
    "ascend": ("/usr/local/bin/npu-smi", "/usr/local/Ascend/", "/etc/ascend_install.info",
               "/usr/local/dcmi/"),
}


_FABRICMANAGER_FILES = ("/usr/bin/nv-fabricmanager", "/etc/systemd/system/nvidia-fabricmanager.service")
_IMEX_FILES = ("/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl", "/etc/systemd/system/nvidia-imex.service")
#: simulated services enabled at boot when installed (as ``systemctl enable`` would link them)
_ENABLED_UNITS = ("nvidia-fabricmanager.service", "nvidia-imex.service", "docker.service")


def hardware_ids() -> list[str]:
    return sorted(PROFILES)


def supported(where: str | None = None) -> str:
    """k3deploy's one list of the hardware it deploys (:func:`k3deploy.recipe.offering.supported_hardware`), which
    the simulator simulates whole (tests/unit/test_one_spelling.py); ``where``: only the profiles with that key
    set (``imex``, ``fabricmanager``) or, for ``nvl``, those of NVLink-fabric trays.

    >>> supported("imex")
    'gb200, gb300'
    """
    from k3deploy import load_recipe
    from k3deploy.recipe.offering import listing, supported_hardware

    def accepts(h: str) -> bool:
        prof = PROFILES.get(h, {})
        return where is None or bool(prof.get("fabric") == "nvl" if where == "nvl" else prof.get(where))

    return listing(supported_hardware(load_recipe(), accepts))


def profile(hardware: str) -> dict[str, Any]:
    try:
        return PROFILES[hardware]
    except KeyError:
        from k3deploy import load_recipe
        from k3deploy.recipe.offering import unknown_hardware

        raise K3Error(str(unknown_hardware(load_recipe(), hardware))) from None


def cuda_for_driver(version: str) -> str:
    """The ``CUDA Version`` nvidia-smi prints for a driver branch (r580 -> 13.0)."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return "N/A"
    table = [(590, "13.1"), (580, "13.0"), (575, "12.9"), (570, "12.8"), (565, "12.7"), (560, "12.6"),
             (555, "12.5"), (550, "12.4"), (545, "12.3"), (535, "12.2"), (530, "12.1"), (525, "12.0")]
    for floor, cuda in table:
        if major >= floor:
            return cuda
    return "11.8"


def _gpu_ids(prof: dict[str, Any], count: int, name: str, cluster_uuid: str) -> tuple[list[str], list[str]]:
    bus, uuids = [], []
    for i in range(count):
        vendor = prof["vendor"]
        if vendor == "nvidia":
            if prof.get("fabric") == "nvl" and i < len(_NV_GRACE_BUS):
                bus.append(_NV_GRACE_BUS[i])
            else:
                b = _NV_HGX_BUS[i] if i < len(_NV_HGX_BUS) else f"{0xE0 + i:02X}"
                bus.append(f"00000000:{b}:00.0")
        elif vendor == "amd":
            b = _AMD_BUS[i] if i < len(_AMD_BUS) else f"{0xf0 + i:02x}"
            bus.append(f"0000:{b}:00.0")
        else:
            b = _ASCEND_BUS[i] if i < len(_ASCEND_BUS) else f"{0xE0 + i:02X}"
            bus.append(f"0000:{b}:00.0")
        uuids.append(str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"k3sim/{cluster_uuid}/{name}/gpu{i}")))
    return bus, uuids


def _value(fault: Fault) -> str:
    """The value of a fault whose kind needs one (:func:`k3sim.faults.parse_fault` ensures it is there)."""
    if fault.value is None:
        raise K3Error(f"fault {str(fault)!r} needs a value: {FAULT_KINDS[fault.kind]}")
    return fault.value


def node_config(hardware: str, rank: int, nodes: int, name: str, ip: str, faults: list[Fault],
                time_scale: float, cluster_uuid: str) -> dict[str, Any]:
    """The JSON document for ``/etc/k3sim/node.json`` of one node (of the faults for other ranks, only their
    ``npu-link-down`` ports are kept, as the peers' ports the node's simulated NPU pings cannot reach)."""
    prof = profile(hardware)
    if not 0 < time_scale <= 1:
        raise K3Error(f"bad time scale {time_scale!r}: use a factor in (0, 1], e.g. 0.01")
    mine = [f for f in faults if f.rank == rank]
    vendor = prof["vendor"]
    count = prof["gpus"]
    product = prof["product"]
    driver = prof["driver"]
    fabric: dict[str, Any] | None = None
    if prof.get("fabric") == "nvl":
        # one NVLink domain per rack (GB200/GB300 NVL72: 18 trays): trays beyond it are in the next rack's domain
        domain = (hardware_profiles()[hardware].nvl_domain or nodes) if hardware in hardware_profiles() else nodes
        if rank >= domain:
            cluster_uuid = str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"k3sim/{cluster_uuid}/domain{rank // domain}"))
        fabric = {"state": "Completed", "status": "Success", "cluster_uuid": cluster_uuid, "clique_id": 32766}
    # HGX: each GPU's registration with the NVSwitch fabric by Fabric Manager (nvidia-smi -q's Fabric block)
    nvswitch: dict[str, Any] | None = {"state": "Completed", "status": "Success"} if prof.get("fabricmanager") else None
    missing: list[str] = []
    modules_unloaded: list[str] = []
    dmabuf = vendor == "nvidia" and prof.get("kernel_module") == "open"
    crash = False
    imex_down = False
    links_down: list[int] = []
    paths_missing: list[str] = []
    extra_load = 0.0
    create_delay = 0.0
    image_key: str | None = None
    wrong_output: str | None = None
    rdma = [dict(d) for d in prof["rdma"]]
    for f in mine:
        nvidia_only = f.kind in ("no-nvidia-smi", "no-dmabuf", "no-peermem", "fabric", "cluster-uuid",
                                 "imex-peer-down", "fabric-health", "imex-mgmt")
        if nvidia_only and vendor != "nvidia":
            raise K3Error(f"fault {str(f)!r} applies to NVIDIA hardware only, not {hardware!r}: "
                          "drop it or pick an NVIDIA profile")
        if f.kind == "driver":
            driver = _value(f)
        elif f.kind == "gpu-count":
            count = int(_value(f))
        elif f.kind == "gpu-model":
            product = _value(f)
        elif f.kind == "no-nvidia-smi":
            missing.append("nvidia-smi")
        elif f.kind == "no-enroot":
            missing.append("enroot")
        elif f.kind == "no-docker":
            missing.append("docker")
        elif f.kind == "no-dmabuf":
            dmabuf = False
        elif f.kind == "no-peermem":
            modules_unloaded.append("nvidia_peermem")
        elif f.kind in ("fabric", "fabric-health") and fabric is None and nvswitch is not None:
            # HGX: the GPUs stuck in a registration state (Fabric Manager active), or their fabric health degraded
            if f.kind == "fabric":
                nvswitch.update(state=_value(f), status="Success" if f.value == "Completed" else "N/A")
            else:
                nvswitch["condition"] = _value(f)
        elif f.kind in ("fabric", "cluster-uuid", "fabric-health"):
            if fabric is None:
                raise K3Error(f"fault {str(f)!r} needs NVLink-fabric hardware ({supported('nvl')}, or an HGX board "
                              f"with NVSwitch for fabric, fabric-health: {supported('fabricmanager')}), not "
                              f"{hardware!r}")
            if f.kind == "fabric-health":
                fabric["condition"] = _value(f)
            elif f.kind == "fabric":
                fabric["state"] = _value(f)
                fabric["status"] = "Success" if f.value == "Completed" else "N/A"
            else:
                fabric["cluster_uuid"] = _value(f)
        elif f.kind == "imex-mgmt" and not prof.get("imex"):
            raise K3Error(f"fault {str(f)!r} needs IMEX hardware ({supported('imex')}), not {hardware!r}")
        elif f.kind == "imex-peer-down":
            if not prof.get("imex"):
                raise K3Error(f"fault {str(f)!r} needs IMEX hardware ({supported('imex')}), not {hardware!r}")
            if nodes < 2:
                raise K3Error(f"fault {str(f)!r} needs a peer: start at least 2 nodes")
            imex_down = True
        elif f.kind == "npu-smi-a2" and vendor != "ascend":
            raise K3Error(f"fault {str(f)!r} applies to Ascend hardware only, not {hardware!r}")
        elif f.kind in ("npu-link-down", "mount-missing"):
            if vendor != "ascend":
                raise K3Error(f"fault {str(f)!r} applies to Ascend hardware only, not {hardware!r}")
            if f.kind == "npu-link-down":
                links_down = sorted({int(i) for i in _value(f).split(",")})
            else:
                paths_missing.append(_value(f))
        elif f.kind == "rail-only":
            if not any(d.get("gpu") is not None for d in rdma):
                raise K3Error(f"fault {str(f)!r} needs GPU NICs on rails, which {hardware!r} has not")
        elif f.kind == "spectrum-x":
            if prof.get("fabric") != "nvl":
                raise K3Error(f"fault {str(f)!r} needs Grace trays with a BlueField-3 ({supported('nvl')}), not "
                              f"{hardware!r}")
            # RoCE: the GPU NICs' ports are Ethernet (no LIDs); the BlueField-3 beside them already is
            rdma = [{**d, "link_layer": "Ethernet", "sm_lid": 0, "port_lid": 0} if d.get("gpu") is not None else d
                    for d in rdma]
        elif f.kind == "no-amd-smi":
            if vendor != "amd":
                raise K3Error(f"fault {str(f)!r} applies to AMD hardware only, not {hardware!r}")
            missing.append("amd-smi")
        elif f.kind == "no-peer-memory" and vendor != "amd":
            raise K3Error(f"fault {str(f)!r} applies to AMD hardware only, not {hardware!r}")
        elif f.kind in ("xid", "nvlink-down", "recovery") and vendor != "nvidia":
            raise K3Error(f"fault {str(f)!r} applies to NVIDIA hardware only, not {hardware!r}")
        elif f.kind == "nvlink-down" and fabric is None and nvswitch is None:
            raise K3Error(f"fault {str(f)!r} needs GPUs with NVLink (an NVL tray or an HGX board), not {hardware!r}")
        elif f.kind == "npu-health" and vendor != "ascend":
            raise K3Error(f"fault {str(f)!r} applies to Ascend hardware only, not {hardware!r}")
        elif f.kind == "ecc" and (vendor == "ascend" or (vendor == "amd" and _value(f).partition(":")[0] not in
                                                         ("uncorrectable", "correctable", "deferred"))):
            raise K3Error(f"fault {str(f)!r} does not apply to {hardware!r}: NVIDIA GPUs report every ECC kind, AMD "
                          "GPUs uncorrectable, correctable and deferred")
        elif f.kind == "engine-crash":
            crash = True
        elif f.kind == "engine-slow":
            extra_load += float(_value(f))
        elif f.kind == "docker-slow-create":
            create_delay += float(_value(f))
        elif f.kind == "engine-api-key":
            image_key = _value(f)
        elif f.kind == "wrong-output":
            wrong_output = f.value or ""
        # disk-full, sshd-down and default-route are applied by the cluster itself (mounts, services, routes)
    bus, uuids = _gpu_ids(prof, count, name, cluster_uuid)
    gpu: dict[str, Any] = {"product": product, "count": count, "memory_mib": prof["memory_mib"],
                           "bus_ids": bus, "uuids": uuids, "power_w": prof.get("power_w", 0)}
    if vendor == "nvidia":
        gpu.update(compute_cap=prof["compute_cap"], architecture=prof["architecture"],
                   # nvidia-smi topo -m: HGX GPUs sit behind PCIe switches with their NICs; Grace GPUs do not
                   topology="grace" if prof.get("fabric") == "nvl" else "hgx")
    elif vendor == "amd":
        gpu.update(gfx=prof["gfx"], device_id=prof["device_id"])
    config: dict[str, Any] = {
        "schema": 1,
        "name": name, "ip": ip, "rank": rank, "nodes": nodes, "hardware": hardware,
        "cluster_uuid": cluster_uuid, "vendor": vendor,
        "time_scale": time_scale,
        # timeouts stretched by the number of nodes sharing this machine's CPUs (4 nodes run at the plain scale)
        "timeout_scale": round(time_scale * max(1.0, nodes / 4), 4),
        "load_seconds": round(NOMINAL_LOAD_SECONDS * time_scale, 3),
        "gpu": gpu,
        "driver": {"version": driver},
        "rdma": _rail_netdevs(rdma),
        **({"rails": rails} if (rails := _rails(rdma, ip, any(f.kind == "rail-only" for f in mine))) else {}),
        "fabric": fabric,
        **({"nvswitch": nvswitch} if nvswitch is not None else {}),
        "dmabuf": dmabuf,
        "modules_unloaded": modules_unloaded,
        "tools_missing": missing,
        "paths_missing": paths_missing,
        "engine": {"crash": crash, "extra_load_seconds": extra_load, "create_delay_seconds": create_delay,
                   **({"api_key": image_key} if image_key is not None else {}),
                   **({"wrong_output": wrong_output} if wrong_output is not None else {})},
        "docker_data_dir": DOCKER_DATA_DIR,
        "faults": [str(f) for f in mine],
        "health": _health(mine, count),
    }
    if vendor == "nvidia":
        config["driver"].update(cuda_version=cuda_for_driver(driver), kernel_module=prof["kernel_module"],
                                fabricmanager=prof["fabricmanager"], imex=prof.get("imex", False),
                                fabricmanager_version=prof["driver"])
        config["nvidia_ctk"] = {"version": prof["ctk_version"],
                                "runtime_version": prof["container_runtime_version"]}
        if prof.get("imex"):
            # the trays that run IMEX on their management network (fault imex-mgmt): listed by that address
            mgmt = {f.rank for f in faults if f.kind == "imex-mgmt"}
            config["imex"] = _imex_domain(hardware, rank, nodes, ip, imex_down, mgmt)
            if rank in mgmt:
                config["management"] = {"interface": MANAGEMENT_INTERFACE, "ip": management_address(ip)}
    elif vendor == "amd":
        config["rocm"] = {"version": prof["rocm"], "amdsmi": prof["amdsmi"],
                          # amdgpu-dkms with a peer-memory RDMA stack: /sys/kernel/mm/memory_peers/amdkfd/version
                          "peer_memory": bool(prof["rdma"]) and not any(f.kind == "no-peer-memory" for f in mine)}
    else:
        # the other nodes' downed ports: the simulated hccn_tool -ping/-hccs_ping to NPU N of rank R fails on them
        peers_down = {str(f.rank): sorted({int(i) for i in _value(f).split(",")}) for f in faults
                      if f.rank != rank and f.kind == "npu-link-down"}
        config["ascend"] = {"firmware": prof["firmware"], "cann": prof["cann"],
                            "innerversion": prof["innerversion"], "links_down": links_down,
                            "peer_links_down": peers_down,
                            # a SuperPoD (A3) mainboard runs -hccs_ping; others answer that they do not support it
                            "hccs_ping": prof.get("hccs_ping", True),
                            # npu-smi's table: A3 (two dies per NPU, chip and Phy-ID) or A2 (fault npu-smi-a2)
                            "layout": "a2" if any(f.kind == "npu-smi-a2" for f in mine) else "a3"}
    return config


def _health(faults: list[Fault], gpus: int) -> dict[str, list[dict[str, Any]]]:
    """What the node's tools report as failing (faults ``xid``, ``ecc``, ``nvlink-down``, ``npu-health``,
    ``recovery``): the kernel log's XIDs, each GPU's ECC errors and links down, each NPU's health, each GPU's recovery
    action (the simulated ``dmesg``, ``nvidia-smi``, ``amd-smi`` and ``npu-smi`` read it).

        >>> _health([Fault(1, "xid", "79"), Fault(1, "npu-health", "3:Alarm"), Fault(1, "recovery", "reboot:2")], 4)
        ... # doctest: +NORMALIZE_WHITESPACE
        {'xid': [{'code': 79, 'gpu': 0}], 'ecc': [], 'nvlink_down': [], 'npu': [{'npu': 3, 'state': 'Alarm'}],
         'recovery': [{'action': 'reboot', 'gpu': 2}]}
    """
    out: dict[str, list[dict[str, Any]]] = {"xid": [], "ecc": [], "nvlink_down": [], "npu": [], "recovery": []}
    for f in faults:
        if f.kind not in ("xid", "ecc", "nvlink-down", "npu-health", "recovery"):
            continue
        what, _, where = _value(f).partition(":")
        if f.kind == "npu-health":
            out["npu"].append({"npu": int(what), "state": where or "Critical"})
            continue
        where = where or "0"
        if int(where) >= max(gpus, 1):
            raise K3Error(f"fault {str(f)!r} names GPU {where}, but the node has {gpus}: use 0 to {gpus - 1}")
        if f.kind == "xid":
            out["xid"].append({"code": int(what), "gpu": int(where)})
        elif f.kind == "ecc":
            out["ecc"].append({"kind": what, "gpu": int(where)})
        elif f.kind == "recovery":
            out["recovery"].append({"action": what, "gpu": int(where)})
        else:
            out["nvlink_down"].append({"link": int(what), "gpu": int(where)})
    return out


#: the second interface of a tray that runs IMEX on its management network (fault ``imex-mgmt``)
MANAGEMENT_INTERFACE = "mgmt0"


def management_address(ip: str) -> str:
    """The management-network address of the node at cluster address ``ip``: ``192.168.<subnet's third octet>.<the
    same host number>`` (inside the node's own network namespace, so it meets no other network).

    >>> management_address("10.77.5.12")
    '192.168.5.12'
    """
    prefix, _, last = ip.rpartition(".")
    return f"192.168.{prefix.rpartition('.')[2]}.{last}"


def _rail_netdevs(rdma: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GPU NIC's network interface (the IPoIB ``ib<i>``, or a RoCE netdev ``ens<i+1>f0np0``), as
    ``ibdev2netdev`` names it."""
    return [{**d, "netdev": f"ib{d['gpu']}" if d["link_layer"] == "InfiniBand" else f"ens{d['gpu'] + 1}f0np0"}
            if d.get("gpu") is not None else d for d in rdma]


def _rails(rdma: list[dict[str, Any]], ip: str, rail_only: bool) -> dict[str, Any] | None:
    """The node's GPU NICs on the cluster's rails: GPU NIC i on rail i, ``10.<200 + i>.<c>.<d>/24`` for the node's
    ``<a>.<b>.<c>.<d>`` (one subnet per rail, :mod:`k3sim.network`), reaching the other rails through the
    spine unless ``rail_only``. None without GPU NICs or a cluster address."""
    parts = ip.split(".")
    gpu_nics = [d for d in _rail_netdevs(rdma) if d.get("gpu") is not None]
    if len(parts) != 4 or not all(p.isdigit() for p in parts) or not gpu_nics:
        return None
    ports = [{"netdev": d["netdev"], "rail": d["gpu"], "address": f"10.{200 + d['gpu']}.{parts[2]}.{parts[3]}"}
             for d in gpu_nics]
    return {"ports": ports, "rail_only": rail_only}


def _imex_domain(hardware: str, rank: int, nodes: int, ip: str, peer_down: bool,
                 mgmt: set[int] | None = None) -> dict[str, Any]:
    """What ``nvidia-imex-ctl -N`` of this tray reports: the trays of its NVLink domain (its rack: the ranks
    ``domain * k`` to ``domain * (k + 1) - 1``, addressed as the cluster lays nodes out, ``<subnet>.<11 + rank>``),
    in ``nodes_config.cfg`` order, all connected; under ``imex-peer-down`` one peer (the next tray, or the one
    before for the last) is down. A tray in ``mgmt`` (fault ``imex-mgmt``: IMEX bound to its management network, as
    NVIDIA's IMEX guide allows with ``BIND_INTERFACE_IP``) is listed by its management address."""
    domain = (hardware_profiles()[hardware].nvl_domain or nodes) if hardware in hardware_profiles() else nodes
    first = rank // domain * domain
    ranks = list(range(first, min(nodes, first + domain)))
    prefix, _, last = ip.rpartition(".")
    if not last.isdigit():  # not a cluster address (a unit test's placeholder): the tray alone
        return {"nodes": [ip], "down": []}
    base = int(last) - rank

    def address(r: int) -> str:
        cluster = f"{prefix}.{base + r}"
        return management_address(cluster) if r in (mgmt or set()) else cluster

    down: list[str] = []
    if peer_down:
        if len(ranks) < 2:
            raise K3Error(f"fault {rank}:imex-peer-down needs a peer in the tray's NVLink domain")
        peer = rank + 1 if rank + 1 in ranks else rank - 1
        down.append(address(peer))
    return {"nodes": [address(r) for r in ranks], "down": down}


def _tool_files() -> list[str]:
    return sorted("/" + p.relative_to(NODE_TOOLS).as_posix() for p in NODE_TOOLS.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def excluded_paths(config: dict[str, Any]) -> list[str]:
    """Absolute node paths of ``node_tools`` files that must NOT be installed on this node.

    Other vendors' tools are left out (an H200 node has no ``npu-smi``), and so is ``nvidia-smi``
    under the ``no-nvidia-smi`` fault, so that the shell answers ``command not found`` as on a real host.
    """
    skip_prefixes = [p for vendor, files in _VENDOR_FILES.items() if vendor != config["vendor"] for p in files]
    skip_prefixes += [f"/usr/bin/{tool}" for tool in config.get("tools_missing", [])]
    for path in config.get("paths_missing", []):  # a file, or a directory and all in it
        skip_prefixes += [path, path.rstrip("/") + "/"]
    driver = config.get("driver", {})
    if not driver.get("fabricmanager"):
        skip_prefixes += _FABRICMANAGER_FILES
    if not driver.get("imex"):
        skip_prefixes += _IMEX_FILES
    return [f for f in _tool_files()
            if any(f == p or (p.endswith("/") and f.startswith(p)) for p in skip_prefixes)]


#: tools whose output depends only on node.json (and the module state): answered from a cache in the node
CACHED_TOOLS = frozenset({"nvidia-smi", "nvidia-ctk", "ibv_devinfo", "nv-fabricmanager", "amd-smi", "rocm-smi", "dmesg",
                          "modinfo", "lsmod", "docker", "hccn_tool", "nvidia-imex-ctl"})


def warm_script(hardware: str, ip: str) -> str:
    """Run once when a node of ``hardware`` has booted: compile the simulated tools' modules with the node's own
    Python (the tools never write bytecode themselves), then the read-only tool invocations of k3deploy's preflight
    (its own batch command), which fill the tools' cache (see ``/usr/lib/k3sim/cached``)."""
    from k3deploy.facts.batch import Batch, specs
    from k3deploy.model.requirements import Requirements
    from k3deploy.preflight.runner import DEFAULT_CACHE_DIR, fact_plan

    need = Requirements(hardware_profiles()[hardware], "default", None, nodes=2, multi_node=True)
    compile_ = "python3 -m compileall -q /usr/lib/k3sim >/dev/null 2>&1\n"
    return compile_ + Batch().command(specs([read.spec for read in fact_plan(need, ip, DEFAULT_CACHE_DIR, "")])) + "\n"


def _install(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.k3sim-tmp")  # replace atomically: a tool may be running
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def install_node_tools(root: str | Path, config: dict[str, Any]) -> list[str]:
    """Copy ``node_tools`` (minus :func:`excluded_paths`) into a node root and write its node.json.

    Returns the absolute node paths installed. Modes are kept (the tools are executable scripts).
    The simulated services (Fabric Manager on HGX, IMEX on NVL trays) are enabled for boot.
    """
    root = Path(root)
    skip = set(excluded_paths(config))
    installed = []
    for rel in _tool_files():
        if rel in skip:
            continue
        name = rel.rsplit("/", 1)[-1]
        cached = name in CACHED_TOOLS and rel.startswith(("/usr/bin/", "/usr/local/bin/", "/usr/local/Ascend/"))
        # a cached tool: the program under /usr/lib/k3sim/tools, a front that answers from the cache at its path
        dest = root / (f"usr/lib/k3sim/tools/{name}" if cached else rel.lstrip("/"))
        _install(NODE_TOOLS / rel.lstrip("/"), dest)
        if cached:
            front = root / rel.lstrip("/")
            front.parent.mkdir(parents=True, exist_ok=True)
            tmp = front.with_name(f".{front.name}.k3sim-tmp")
            tmp.write_text(f"#!/bin/sh\n# simulated {name}, answered from a cache (/usr/lib/k3sim/cached)\n"
                           f"exec /usr/lib/k3sim/cached {name} \"$@\"\n")
            tmp.chmod(0o755)
            os.replace(tmp, front)
        installed.append(rel)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    for unit in _ENABLED_UNITS:
        link = wants / unit
        if f"/etc/systemd/system/{unit}" in installed:
            wants.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.unlink(missing_ok=True)
                link.symlink_to(f"/etc/systemd/system/{unit}")
        elif link.is_symlink():
            link.unlink()
    info = root / "usr/local/Ascend/driver/version.info"
    if "/usr/local/Ascend/driver/version.info" in installed:  # the driver fault changes the installed version
        version = config["driver"]["version"]
        lines = [f"{key}={version}" if key in ("Version", "package_version") else line
                 for line in info.read_text().splitlines() for key in [line.partition("=")[0]]]
        info.write_text("\n".join(lines) + "\n")
    cfg = root / NODE_CONFIG_PATH.lstrip("/")
    cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.with_name(".node.json.k3sim-tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, cfg)
    return installed


#: where the simulated node's /sys/kernel/mm comes from (nspawn binds a directory over it: sysfs is read-only)
SYSFS_MM = "/sys/kernel/mm"


def sysfs_mm_files(config: dict[str, Any]) -> dict[str, str] | None:
    """Files (relative to ``/sys/kernel/mm``) a real node of this configuration has there and the simulated one
    must show: on AMD the amdkfd peer-memory interface's version (amdgpu's peer-memory bridge registers as
    ``amdkfd``, version ``1.0``, and ib_core's peer memory shows it as ``memory_peers/amdkfd/version``), none under
    the ``no-peer-memory`` fault. None: the node's /sys/kernel/mm stays the kernel's (no directory is bound)."""
    if config.get("vendor") != "amd":
        return None
    return {"memory_peers/amdkfd/version": "1.0\n"} if config.get("rocm", {}).get("peer_memory") else {}


def write_sysfs_mm(directory: Path, files: dict[str, str]) -> None:
    """Make ``directory`` (bound over the node's /sys/kernel/mm) hold exactly ``files``; the directory itself stays
    (a running node has it bound: a fault added or cleared shows at once)."""
    directory.mkdir(parents=True, exist_ok=True)
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for rel, text in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text(text)


def device_nodes(config: dict[str, Any]) -> list[str]:
    """Device paths a real node of this profile has (``/dev/nvidia0`` ...).

    Tools here do not open them; a cluster may expose them as placeholders (for example with
    ``systemd-nspawn --bind-ro=/dev/null:/dev/nvidia0``) so that existence checks pass.
    """
    n = config["gpu"]["count"]
    vendor = config["vendor"]
    devs: list[str] = []
    if vendor == "nvidia":
        devs += [f"/dev/nvidia{i}" for i in range(n)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]
        if config["driver"].get("imex") and not config.get("imex_per_job"):   # per job: a channel per Slurm job
            devs.append("/dev/nvidia-caps-imex-channels/channel0")
    elif vendor == "amd":
        devs += ["/dev/kfd"] + [f"/dev/dri/renderD{128 + i}" for i in range(n)]
    else:
        devs += [f"/dev/davinci{i}" for i in range(n)] + ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    if config.get("rdma"):
        devs += [f"/dev/infiniband/uverbs{i}" for i in range(len(config["rdma"]))] + ["/dev/infiniband/rdma_cm"]
    return devs
