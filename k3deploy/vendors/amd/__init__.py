"""AMD Instinct (MI300X, MI325X, MI355X): the amdgpu kernel driver on the host, ROCm in the image; devices matched by
PCI device id where the kernel names it, else by product name as words.

Pure: the pack (:data:`PACK`) and the floors. The judges and the facts they read are
:mod:`k3deploy.vendors.amd.checks` (preflight layer). ``ROCM_HOST_MIN``: host ROCm userspace floor (None: the
ROCm image brings its own ROCm); a module variable a site can change before calling
:func:`k3deploy.preflight.checks.run_checks`.

    >>> PACK.transport.ucx_tls, PACK.model_matches("AMD Instinct MI300X OAM", None, ["AMD Instinct MI300X"], [])
    ('rc,rocm_copy', True)
"""

from __future__ import annotations

from k3deploy.vendors.base import Check, Container, Pack, Transport
from k3deploy.vendors.common import COMMON

ROCM_HOST_MIN: str | None = None

PACK = Pack(
    name="amd",
    brand="AMD",
    container_key="amd",
    tool="rocm-smi",
    driver_check="rocm.devices",
    driver_fix="install the amdgpu driver (amdgpu-dkms) and ROCm SMI, then reboot",
    transport=Transport(
        socket_env=("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
        exact_socket_env=("NCCL_SOCKET_IFNAME",),
        ucx_tls="rc,rocm_copy",   # cuda_copy does not exist there
    ),
    container=Container(
        flags=("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--cap-add", "SYS_PTRACE",
               "--security-opt", "seccomp=unconfined"),
    ),
    checks=(
        Check("gpu.model", "rocm-smi --showproductname", "the hardware's GPU product names or PCI device ids",
              "set k3_hardware to what these nodes are"),
        Check("gpu.count", "rocm-smi --showproductname", "the hardware's GPUs per node",
              "a device is missing or hidden: repair the node"),
        Check("rocm.driver", "rocm-smi --showdriverversion", "amdgpu kernel driver",
              "install amdgpu-dkms (the ROCm image brings its own ROCm; the host needs the kernel driver)"),
        Check("rocm.version", "amd-smi version", "host ROCm userspace: none needed (the image brings ROCm)",
              "install the ROCm version named on the host", fact="AmdSmiVersion"),
        Check("rocm.devices", "rocm-smi --showmeminfo vram", "working rocm-smi",
              "install the amdgpu driver (amdgpu-dkms) and ROCm SMI, then reboot"),
        Check("gpu.memory", "rocm-smi --showmeminfo vram",
              "the planned nodes' GPU memory >= the variant's planning minimum",
              "plan more nodes, or choose a smaller variant", each_node=False),
    ),
    guide_notes=((("AMD",), "AMD MoE path"),),
    name_match="words",
    pci_ids=True,
    common=COMMON,
)
