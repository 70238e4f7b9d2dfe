"""The command a person runs to see what each preflight check reads (the facts read the same sources)."""

from __future__ import annotations

import shlex

from k3deploy.model.units import ASCEND_MOUNTS

#: the command a person runs for each preflight check (the facts read the same sources)
CHECK_COMMANDS: dict[str, str] = {
    "nvidia.driver": "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u",
    "nvidia.fabricmanager": "systemctl is-active nvidia-fabricmanager; nv-fabricmanager --version",
    "nvlink.fabric": "nvidia-smi -q | grep -A6 -E '^ *Fabric'",
    "nvidia.imex": "systemctl is-active nvidia-imex; ls /dev/nvidia-caps-imex-channels",
    "container.toolkit": "nvidia-ctk --version",
    "container.runtime": "docker version --format '{{.Server.Version}}'",
    "rdma.devices": "ibv_devinfo | grep -E 'hca_id|state|link_layer'",
    "rdma.gpudirect": "uname -r; lsmod | grep -E '^nvidia_peermem' || echo 'nvidia_peermem not loaded'",
    "disk.images": "df -h \"$(docker info --format '{{.DockerRootDir}}')\"",
    "disk.shm": "df -h /dev/shm",
    "rocm.driver": "rocm-smi --showdriverversion",
    "rocm.version": "amd-smi version",
    "rocm.devices": "rocm-smi --showmeminfo vram",
    "ascend.driver": "npu-smi info",
    "ascend.health": "npu-smi info",
    "ascend.versions": "cat /usr/local/Ascend/driver/version.info",
    "ascend.mounts": "ls -d " + " ".join(host for host, _ in ASCEND_MOUNTS),
    "ascend.network": "t=/usr/local/Ascend/driver/tools/hccn_tool; for i in $(seq 0 15); do $t -i $i -link -g; "
                      "$t -i $i -net_health -g; done",
}
DEVICE_COMMANDS = {
    "NVIDIA": {"gpu.model": "nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c",
               "gpu.count": "nvidia-smi -L | wc -l"},
    "AMD": {"gpu.model": "rocm-smi --showproductname", "gpu.count": "rocm-smi --showproductname"},
    "Huawei": {"gpu.model": "npu-smi info", "gpu.count": "npu-smi info"},
}


def check_command(check: str, brand: str, address: str, cache: str) -> str:
    if check == "network.interface":
        return f"ip -o -4 addr show | grep -F ' {address}/'" if address else "ip -o -4 route show default"
    if check == "disk.cache":
        return f"p={shlex.quote(cache)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; df -h \"$p\""
    return DEVICE_COMMANDS.get(brand, {}).get(check) or CHECK_COMMANDS.get(check, "")
