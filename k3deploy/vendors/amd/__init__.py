"""AMD Instinct (MI300X, MI325X, MI355X): the amdgpu kernel driver on the host, ROCm in the image; devices matched by
PCI device id where the kernel names it, else by product name as words.

Pure: the pack (:data:`PACK`) and the floors. The judges and the facts they read are
:mod:`k3deploy.vendors.amd.checks` (preflight layer). Module variables a site can change before calling
:func:`k3deploy.preflight.checks.run_checks`:

* ``AMDGPU_FLOOR``: the oldest amdgpu kernel driver the ROCm 7 image runs on. ROCm supports its user space with the
  kernel driver of two releases either side (ROCm's "User and kernel-space support matrix"); the image's ROCm 7.0
  user space thus needs the driver of ROCm 6.3 or newer, whose amdgpu-dkms module is 6.10.x (ROCm 6.4: 6.12.x,
  ROCm 7.0: 6.14.x). Every node of a group runs one amdgpu version (RCCL across nodes).
* ``ROCM_HOST_MIN``: host ROCm userspace floor (None: the ROCm image brings its own ROCm).
* ``GPUDIRECT_MISSING_STATUS``: status when RCCL would find no amdkfd peer-memory interface on a multi-node host
  (it then stages every transfer through host memory, silently: it works, much slower, so a multi-node K3
  deployment treats it as a failure; set "warn" to accept it).

    >>> PACK.transport.ucx_tls, PACK.model_matches("AMD Instinct MI300X OAM", None, ["AMD Instinct MI300X"], [])
    ('rc,rocm_copy', True)
"""

from __future__ import annotations

from typing import Literal

from k3deploy.vendors.base import Check, Container, Exporter, HealthKind, Pack, Transport
from k3deploy.vendors.common import COMMON, QUARANTINE_NOTE

AMDGPU_FLOOR = "6.10"
ROCM_HOST_MIN: str | None = None
GPUDIRECT_MISSING_STATUS: Literal["pass", "warn", "fail"] = "fail"

#: where RCCL finds the amdkfd peer-memory interface (ROCm/rccl src/transport/net_ib.cc, ncclIbGdrSupport: the
#: directory moved with the kernel's ib_peer_mem), and the symbol it looks for in /proc/kallsyms otherwise (a kernel
#: whose own ib_core carries peer memory)
PEER_MEMORY_PATHS = ("/sys/kernel/mm/memory_peers/amdkfd/version", "/sys/kernel/memory_peers/amdkfd/version",
                     "/sys/memory_peers/amdkfd/version")
PEER_MEMORY_SYMBOL = "ib_register_peer_memory_client"
#: the exported function (``T``), not amdgpu's own ``pfn_ib_register_peer_memory_client`` pointer
KALLSYMS_GREP = f"grep -m1 -w -E '[Tt] {PEER_MEMORY_SYMBOL}' /proc/kallsyms"

#: the fix of a GPU count that differs from the hardware's: a partitioned GPU shows as several devices
GPU_COUNT_FIX = ("a GPU is missing, or the GPUs are partitioned (CPX compute or NPS4 memory partitions show each GPU "
                 "as several devices): set SPX and NPS1 (amd-smi set --memory-partition NPS1; amd-smi set "
                 "--compute-partition SPX), or repair the node (dmesg | grep amdgpu)")


def driver_fix(floor: str) -> str:
    """The fix of an amdgpu below ``floor`` (or unreadable)."""
    return (f"install amdgpu-dkms with amdgpu >= {floor} (ROCm 6.3's is 6.10.x, 6.4's 6.12.x, 7.0's 6.14.x) and "
            "reboot (the ROCm image brings its own ROCm; the host needs the kernel driver)")


GROUP_FIX = ("install the same amdgpu-dkms version on every node of the group (apt install amdgpu-dkms=<version> or "
             "amdgpu-install of one ROCm release) and reboot the nodes that differ")
GPUDIRECT_FIX = ("install amdgpu-dkms with a peer-memory capable RDMA stack (the NIC vendor's OFED/DOCA or a kernel "
                 "whose ib_core exports ib_register_peer_memory_client) and reboot; otherwise RCCL stages every "
                 "transfer through host memory")


def _peer_memory_command() -> str:
    return "; ".join([*(f"cat {path}" for path in PEER_MEMORY_PATHS), KALLSYMS_GREP])

#: the kind of hardware-health event AMD's tools report (:mod:`k3deploy.model.health`), and how a node comes back
HEALTH_KINDS = (
    HealthKind("ras", "ECC", "uncorrectable memory errors: reboot the node (the driver retires the bad pages, amd-smi "
               "bad-pages lists them); errors that come back mean the GPU must be replaced"),
    HealthKind("unread", "health", "install amd-smi (amd-smi metric --ecc), or run an amdgpu with RAS enabled (its "
               "error counters under /sys/class/drm/card*/device/ras/), so that the GPUs' errors can be read",
               (("unknown", ("nothing reads the GPUs' errors: no amd-smi, no amdgpu RAS counters in sysfs", "")),)),
)

#: the amdgpu kernel driver's RAS error counters, one file per IP block of each GPU ("umc_err_count", "gfx_err_count",
#: ...): ``ue: N`` (uncorrectable), ``ce: N`` (correctable) and, for UMC (the memory controller) since the driver
#: shows deferred errors, ``de: N``. The kernel's amdgpu documentation, "AMDGPU RAS Support", "RAS Error Count sysfs
#: Interface" (https://docs.kernel.org/gpu/amdgpu/ras.html; drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c,
#: ``amdgpu_ras_sysfs_read``; the ``de`` line: commit 2c7a1560e8a6, "drm/amdgpu: Show deferred error count for UMC").
#: The health fact reads them where amd-smi is not installed (amdgpu-dkms alone, the layout this pack recommends).
RAS_COUNTERS = "/sys/class/drm/card*/device/ras/*_err_count"

#: AMD's device-metrics-exporter (github.com/ROCm/device-metrics-exporter: listens on :5000; its fields, in lower
#: case, are the metric names: docs/configuration/metricslist.md)
#: ``gpu_nodes_total`` (GPU_NODES_TOTAL, "Number of GPU nodes on the machine") is served on every platform, bare metal
#: and hypervisor alike (docs/configuration/metricslist.md, "System Information")
EXPORTER = Exporter("amd-device-metrics-exporter", 5000, "ROCm/device-metrics-exporter docs (metrics list)",
                    utilization="gpu_gfx_activity", temperature="gpu_junction_temperature",
                    health="gpu_ecc_uncorrect_total", serves="gpu_nodes_total")

PACK = Pack(
    name="amd",
    rank=2,
    exporter=EXPORTER,
    brand="AMD",
    container_key="amd",
    tool="rocm-smi",
    driver_check="rocm.devices",
    driver_fix="install the amdgpu driver (amdgpu-dkms) and ROCm SMI, then reboot",
    health=HEALTH_KINDS,
    transport=Transport(
        socket_env=("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
        exact_socket_env=("NCCL_SOCKET_IFNAME",),
        ucx_tls="rc,rocm_copy",   # cuda_copy does not exist there
    ),
    container=Container(
        flags=("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--cap-add", "SYS_PTRACE",
               "--security-opt", "seccomp=unconfined"),
        k8s_resource="amd.com/gpu",
        k8s_capabilities=("SYS_PTRACE",),
        k8s_unconfined=True,
        # ROCm/k8s-device-plugin README; ROCm/k8s-gpu-dra-driver v1.0.0 release notes: DeviceClass gpu.amd.com on
        # resource.k8s.io/v1
        k8s_device_plugin="the AMD GPU device plugin (github.com/ROCm/k8s-device-plugin, or the AMD GPU Operator)",
        k8s_dra_class="gpu.amd.com",
        k8s_dra_driver="the AMD GPU DRA driver >= v1.0.0 (github.com/ROCm/k8s-gpu-dra-driver)",
        slurm_runtime="apptainer",
        apptainer_flags=("--rocm",),
        # aiter/jit/core.py (AITER_JIT_DIR: the JIT-built modules, else the package's or ~/.aiter/jit); MIOpen's
        # user database and kernel cache (ROCm docs, "MIOpen environment variables": MIOPEN_USER_DB_PATH,
        # MIOPEN_CUSTOM_CACHE_DIR, default ~/.config/miopen and ~/.cache/miopen)
        jit_caches=(("AITER_JIT_DIR", "aiter"), ("MIOPEN_USER_DB_PATH", "miopen-db"),
                    ("MIOPEN_CUSTOM_CACHE_DIR", "miopen-cache")),
        slurm_runtime_source=("AMD's Infinity Hub containers list Docker Engine and Singularity as their runtimes "
                              "(github.com/amd/InfinityHub-CI README, 'Container Runtimes'); Apptainer is "
                              "Singularity's continuation, with --rocm for AMD GPUs (Apptainer user guide, "
                              "'GPU Support')"),
    ),
    checks=(
        Check("gpu.model", "rocm-smi --showproductname", "the hardware's GPU product names or PCI device ids",
              "set k3_hardware to what these nodes are"),
        Check("gpu.count", "rocm-smi --showproductname", "the hardware's GPUs per node", GPU_COUNT_FIX),
        Check("rocm.driver", "cat /sys/module/amdgpu/version || rocm-smi --showdriverversion",
              f"amdgpu kernel driver >= {AMDGPU_FLOOR} (ROCm 7 image)", driver_fix(AMDGPU_FLOOR)),
        Check("rocm.driver.group", "cat /sys/module/amdgpu/version || rocm-smi --showdriverversion",
              "one amdgpu version on every node of the group", GROUP_FIX, each_node=False),
        Check("rocm.version", "amd-smi version", "host ROCm userspace: none needed (the image brings ROCm)",
              "install the ROCm version named on the host", fact="AmdSmiVersion"),
        Check("rocm.devices", "rocm-smi --showmeminfo vram", "working rocm-smi",
              "install the amdgpu driver (amdgpu-dkms) and ROCm SMI, then reboot"),
        Check("rdma.gpudirect", _peer_memory_command(),
              "the amdkfd peer-memory interface RCCL uses for GPUDirect RDMA (multi-node)", GPUDIRECT_FIX,
              fact="AmdPeerMemory"),
        Check("gpu.memory", "rocm-smi --showmeminfo vram",
              "the planned nodes' GPU memory >= the variant's planning minimum",
              "plan more nodes, or choose a smaller variant", each_node=False),
        Check("hardware.health", f"amd-smi metric --ecc; grep -H . {RAS_COUNTERS}",
              "no uncorrectable ECC (RAS) error on any GPU since the driver loaded (deferred errors are shown, not "
              "fatal), read by amd-smi or, without it, from amdgpu's RAS counters in sysfs; neither: health unknown "
              "(a warning)",
              "the node must not serve: drain it: " + QUARANTINE_NOTE + "; reboot it so that the "
              "driver retires the bad pages (amd-smi bad-pages lists them), and replace the GPU if the errors come "
              "back", fact="AmdHealth"),
    ),
    guide_notes=((("AMD",), "AMD MoE path"),),
    name_match="words",
    pci_ids=True,
    common=COMMON,
)
