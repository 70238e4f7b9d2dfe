"""NVIDIA: HGX boards (H100/H200/B200/B300, NVSwitch and Fabric Manager) and the GB200/GB300 NVL72 compute trays
(multi-node NVLink through IMEX, Grace without nvidia_peermem, GB300's ConnectX-8 through Data Direct).

Pure: the pack (:data:`PACK`) and the floors. The judges of its checks and the facts they read are
:mod:`k3deploy.vendors.nvidia.checks` (preflight layer). The floors and statuses are module variables so a site can
change them before calling :func:`k3deploy.preflight.checks.run_checks`:

* ``DRIVER_FLOOR``: minimum Linux driver for the CUDA 13.0 image ``vllm/vllm-openai:kimi-k3``.
* ``CTK_IMEX_CHANNELS_MIN``: Container Toolkit version that understands ``NVIDIA_IMEX_CHANNELS``.
* ``GPUDIRECT_MISSING_STATUS``: status when DMA-BUF cannot serve GPUDirect RDMA and no nvidia_peermem stands in
  (none on Grace) (NCCL then stages through host memory: it works, much slower, so a multi-node K3 deployment
  treats it as a failure; set "warn" to accept it).

    >>> PACK.check("container.toolkit").command
    'nvidia-ctk --version'
    >>> PACK.container.run_flags(4)
    ['--gpus', 'all']
"""

from __future__ import annotations

import shlex
from typing import Literal

from k3deploy.vendors.base import Check, Container, Exporter, HealthKind, Pack, Transport, Trouble
from k3deploy.vendors.common import COMMON, QUARANTINE_NOTE

DRIVER_FLOOR = "580.65.06"
CTK_IMEX_CHANNELS_MIN = "1.17.0"
GPUDIRECT_MISSING_STATUS: Literal["pass", "warn", "fail"] = "fail"

#: hardware ids of HGX baseboards with NVSwitch, where Fabric Manager must run
NVSWITCH_HARDWARE = frozenset({"h100", "h200", "b200", "b300"})
#: hardware whose GPUs reach their ConnectX-8 through Data Direct (Grace has no PCIe ATS): NVIDIA's Grace Blackwell
#: CX8 GPUDirect RDMA guide, "Platform Software and Configuration": the 6.14-nvidia and newer kernels carry the
#: patches (``apt install linux-nvidia-64k-6.14``)
DATA_DIRECT_HARDWARE = frozenset({"gb300"})
DATA_DIRECT_MIN_KERNEL = "6.14"
#: the kernel flavour that carries the Data Direct patches (``6.14.0-1007-nvidia-64k``), and its package
DATA_DIRECT_FLAVOUR = "nvidia"
DATA_DIRECT_KERNEL_PACKAGE = "apt install linux-nvidia-64k-6.14"
#: the IMEX channel an engine container gets on NVL trays used across trays
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"

FABRIC_REQUIRED = ("every GPU: State Completed, Status Success, one ClusterUUID and CliqueId (those of the other "
                   "trays of its group: each replica in one NVLink domain), Health not Unhealthy (no route unhealthy, "
                   "no incorrect configuration), Bandwidth Full")
#: what an HGX board's GPUs must show: each registered with the NVSwitch fabric by Fabric Manager
NVSWITCH_FABRIC_REQUIRED = ("every GPU: Fabric State Completed, Status Success (registered with the NVSwitch fabric "
                            "by Fabric Manager), Health not Unhealthy")
#: the fix of GPUs that have not finished joining the NVSwitch fabric (Not Started / In Progress) while Fabric Manager
#: may well be active: NVIDIA/NVSentinel issues 883 and 889 (stuck after a Fabric Manager failure), and on NVLink5
#: (B200/B300) with FABRIC_MODE=1 the GPUs stay In Progress until a partition holding them is activated
#: (NVIDIA/gpu-driver-container pull request 909)
NVSWITCH_FABRIC_FIX = ("the GPUs have not joined the NVSwitch fabric, so CUDA fails at engine start: read "
                       "journalctl -u nvidia-fabricmanager, then systemctl restart nvidia-fabricmanager and rerun "
                       "preflight; with FABRIC_MODE=1 in /usr/share/nvidia/nvswitch/fabricmanager.cfg (shared NVSwitch "
                       "virtualization) activate the fabric partition that holds these GPUs, or set FABRIC_MODE=0, "
                       "restart Fabric Manager and reset the GPUs (nvidia-smi -r)")
#: the fix of a fabric whose health reports degraded bandwidth (fewer NVLinks than the GPU has) or a recovery
FABRIC_DEGRADED_FIX = ("the NVLink fabric works at reduced capacity (NCCL all-reduce over NVLink is slower): check "
                       "the GPUs' NVLinks (nvidia-smi nvlink -s shows each link's speed, nvidia-smi -q > Fabric > "
                       "Health) and the NVLink switch trays or baseboard, or accept the reduced bandwidth")
#: the fix of an IMEX domain that has not formed
IMEX_DOMAIN_FIX = ("check that /etc/nvidia-imex/nodes_config.cfg lists every tray of the NVLink domain, the same "
                   "file on every tray, then restart nvidia-imex on every tray (systemctl restart nvidia-imex); "
                   "journalctl -u nvidia-imex and nvidia-imex-ctl -N show which peer does not connect")

#: NVIDIA XID codes (https://docs.nvidia.com/deploy/xid-errors/) -> (what it means, fatal). Fatal: the GPU or its
#: memory cannot be trusted until the node is drained and the GPU reset or replaced (docs/health.md says why each).
XID_CODES: dict[str, tuple[str, bool]] = {
    "13": ("graphics engine exception", False),
    "31": ("GPU memory page fault", False),
    "43": ("GPU stopped processing", False),
    "45": ("preemptive cleanup", False),
    "48": ("double-bit ECC error", True),
    "61": ("internal micro-controller breakpoint", True),
    "62": ("internal micro-controller halt", True),
    "63": ("ECC page retirement or row remap recorded", False),
    "64": ("ECC page retirement or row remap failure", True),
    "74": ("NVLink error", True),
    "79": ("fallen off the bus", True),
    "92": ("high single-bit ECC error rate", False),
    "94": ("contained ECC error", False),
    "95": ("uncontained ECC error", True),
    "109": ("context switch timeout", False),
    "119": ("GSP RPC timeout", True),
    "120": ("GSP error", True),
    "140": ("unrecovered ECC error", True),
    # NVLink5 (Blackwell, GB200/GB300 trays): the line says whether the error is Fatal or Nonfatal
    "144": ("NVLink SAW error", True),
    "145": ("NVLink RLW error", True),
    "146": ("NVLink TLW error", True),
    "147": ("NVLink TREX error", True),
    "148": ("NVLink NVLPW control error", True),
    "149": ("NVLink NETIR error", True),
    "150": ("NVLink MSE error", True),
    # the driver's own recovery action changed (R570+): fatal as the action it announces (RECOVERY_ACTIONS)
    "154": ("GPU recovery action changed", True),
}
#: the NVLink5 XIDs, fatal only where their line says ``Fatal`` (leptonai/gpud pull request 1174: the driver prints
#: ``Nonfatal`` for the others)
NVLINK5_XIDS = frozenset({"144", "145", "146", "147", "148", "149", "150"})

#: the driver's recovery action for a GPU (NVML ``nvmlDeviceGpuRecoveryAction_t``, R570+; ``nvidia-smi -q`` prints it
#: as ``GPU Recovery Action``, XID 154 announces each change as ``from 0xA (...) to 0xB (...)``): NVML's number ->
#: (what ``nvidia-smi -q`` prints, what the driver asks for). NVIDIA's "GPU Memory Error Management", "Error Recovery
#: and Response Flags" (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html):
#: None: "the GPU can be immediately used again by starting a new GPU process"; Reset: terminate all GPU processes and
#: reset the GPU; Reboot: the fault "may have left the OS in an inconsistent state"; Drain P2P: quiesce all
#: peer-to-peer traffic, then query again; Drain and Reset. The numbers 5-7 are those of newer NVML headers
#: (cuda-python's ``DeviceGpuRecoveryAction``). Every action but None keeps the GPU from serving.
RECOVERY_ACTIONS: dict[int, tuple[str, str]] = {
    0: ("None", "no action needed"),
    1: ("Reset", "GPU reset required"),
    2: ("Reboot", "node reboot required"),
    3: ("Drain P2P", "peer-to-peer traffic must be drained"),
    4: ("Drain and Reset", "peer-to-peer traffic must be drained, then the GPU reset"),
    5: ("Recover IMEX Domain", "the IMEX domain must be recovered"),
    6: ("Bus Reset", "the GPU's PCIe bus must be reset"),
    7: ("System Reboot", "system reboot required"),
}
#: what the ``GPU Recovery Action`` row may print for "nothing to do" (older drivers: the row is absent or N/A)
RECOVERY_NONE = frozenset({"None", "N/A", "[N/A]", "Not Supported", "[Not Supported]", ""})


def recovery_action_name(printed: str) -> str:
    """The action as :data:`RECOVERY_ACTIONS` names it, whatever spelling the tool printed (``GPU_RESET``,
    ``NODE_REBOOT``, ``Drain P2P``); unknown spellings are kept as printed.

        >>> recovery_action_name("GPU_RESET"), recovery_action_name("Reboot"), recovery_action_name("DRAIN_AND_RESET")
        ('Reset', 'Reboot', 'Drain and Reset')
    """
    key = printed.strip().upper().replace(" ", "_").removeprefix("GPU_RECOVERY_ACTION_")
    aliases = {"GPU_RESET": "Reset", "NODE_REBOOT": "Reboot", "DRAIN_P2P": "Drain P2P"}
    if key in aliases:
        return aliases[key]
    for name, _ in RECOVERY_ACTIONS.values():
        if key == name.upper().replace(" ", "_"):
            return name
    return printed.strip()


#: what the health fact reads, as a person runs it (docs/health.md: which events are fatal and why)
HEALTH_COMMAND = ("dmesg | grep -E 'NVRM: Xid|NVRM: The NVIDIA GPU|fallen off the bus'; "
                  "nvidia-smi -q; nvidia-smi -q -d ECC,ROW_REMAPPER; "
                  "nvidia-smi nvlink -s")
HEALTH_REQUIRED = ("no fatal GPU event: no XID " + ", ".join(c for c, (_, fatal) in XID_CODES.items()
                                                     if fatal and c not in NVLINK5_XIDS and c != "154")
                   + " in the kernel log since boot (nor an NVLink5 XID " + min(NVLINK5_XIDS) + "-" + max(NVLINK5_XIDS)
                   + " the driver calls Fatal, nor an XID 154 announcing a recovery action other than None), GPU "
                   "Recovery Action None on every GPU, no failed row remap, every NVLink link up on NVL72 trays (a "
                   "pending row remap or an uncorrectable ECC error with recovery action None is shown, not fatal)")
HEALTH_FIX = ("the node must not serve: drain it: " + QUARANTINE_NOTE + "; then do what the GPU Recovery Action "
              "asks (nvidia-smi -q): reset the GPU (nvidia-smi -r -i N) or reboot, reseat or replace the GPU or "
              "tray for XID 79, a row remapping failure or a link that stays down; the kernel log keeps an XID until "
              "the next boot")

#: what to do about a fatal XID of these codes (the node is drained either way: a spare takes its place); the others
#: get the XID kind's fix
XID_FIXES = {
    "79": "the GPU fell off the bus: reseat or replace the GPU or tray (check its power and PCIe/riser), then "
          "power-cycle the node; a GPU reset cannot reach it",
    "74": "an NVLink error: check the GPU's NVLink cables and the NVLink switch tray (nvidia-smi nvlink -s, "
          "nvidia-smi nvlink -e), then reset the GPU (nvidia-smi -r -i N) or reboot",
    "64": "the GPU could not remap a failing memory row: run NVIDIA's field diagnostic and replace the GPU (RMA)",
    "154": "the driver asks for a recovery action (the XID line says which; nvidia-smi -q shows GPU Recovery "
           "Action): a reset (engines stopped, nvidia-smi -r -i N), a reboot of the node, or draining peer-to-peer "
           "traffic first; the kernel log keeps the XID until the next boot",
}

#: what to do about each recovery action the driver asks for (NVIDIA's error recovery flags, above)
RECOVERY_FIXES = {
    "Reset": "stop the engines on the node and reset the GPU (nvidia-smi -r -i N); it serves again after the reset",
    "Reboot": "reboot the node: the fault may have left the OS in an inconsistent state",
    "Drain P2P": "stop every process that uses peer-to-peer traffic (the engines) and read GPU Recovery Action again: "
                 "it then names a reset, a reboot or None",
    "Drain and Reset": "stop every process that uses peer-to-peer traffic (the engines), then reset the GPU "
                       "(nvidia-smi -r -i N)",
    "Recover IMEX Domain": "restart nvidia-imex on every tray of the NVLink domain (systemctl restart nvidia-imex)",
    "Bus Reset": "reset the GPU's PCIe bus, or power-cycle the node",
    "System Reboot": "reboot the node",
}

#: the kinds of hardware-health event NVIDIA's tools report (:mod:`k3deploy.model.health`), and how a node comes back
HEALTH_KINDS = (
    HealthKind("xid", "XID", "reset the GPU (nvidia-smi -r -i N, engines stopped) or reboot the node; an XID stays in "
               "the kernel log until the next boot, and one that comes back means the GPU must be replaced",
               tuple((code, (meaning, XID_FIXES.get(code, ""))) for code, (meaning, _) in XID_CODES.items())),
    HealthKind("recovery", "GPU recovery action", "do what the driver's GPU Recovery Action asks (nvidia-smi -q), "
               "then rerun preflight",
               tuple((name, (meaning, RECOVERY_FIXES.get(name, ""))) for name, meaning in RECOVERY_ACTIONS.values()
                     if name != "None")),
    HealthKind("ecc", "ECC", "reset the GPU (nvidia-smi -r -i N, engines stopped) or reboot: it applies the pending "
               "row remap and clears the volatile counters; errors that come back mean the GPU must be replaced"),
    HealthKind("row-remap", "row remap", "a pending remap: reset the GPU (nvidia-smi -r -i N) or reboot to apply "
               "it; a remapping failure: run NVIDIA's field diagnostic and replace the GPU (RMA)"),
    HealthKind("nvlink", "NVLink", "an NVLink link is down: check the tray's NVLink cables or cartridge and the "
               "NVLink switch trays, then reset the GPU or reboot the tray; a link that stays down means the tray "
               "must be repaired"),
)


def _dmabuf_script(unit: str, env_path: str) -> str:
    return (f"journalctl -u {shlex.quote(unit)} --no-pager | grep -m3 -E 'mlx5dv_reg_dmabuf_mr|errno 524' || true\n"
            f"modprobe nvidia_peermem && lsmod | grep -E '^nvidia_peermem'\n"
            f"grep -q '^NCCL_DMABUF_ENABLE=' {shlex.quote(env_path)} || "
            f"echo 'NCCL_DMABUF_ENABLE=0' >> {shlex.quote(env_path)}\n")


def _mnnvl_script(unit: str, env_path: str) -> str:
    return (f"grep -E '^NCCL_(MNNVL|CUMEM|NVLS)_ENABLE=' {shlex.quote(env_path)}\n"
            "systemctl is-active nvidia-imex; ls /dev/nvidia-caps-imex-channels\n")


TROUBLES = (
    Trouble("NCCL error at engine start: `mlx5dv_reg_dmabuf_mr` errno 524", ("dmabuf",),
            "mlx5 dmabuf registration failures (errno 524): set NCCL_DMABUF_ENABLE=0 to fall back to nvidia_peermem.",
            "Check the log for the errno and that nvidia_peermem is loaded; then add `NCCL_DMABUF_ENABLE=0` to the "
            "env file on every node of the group and restart the group in the order of section 3.", _dmabuf_script),
    Trouble("Multi-node NVLink (GB200/GB300)", ("MNNVL",),
            "MNNVL: NCCL_MNNVL_ENABLE=1, NCCL_CUMEM_ENABLE=1, NCCL_NVLS_ENABLE=1.",
            "The env files already carry these variables when the plan uses NVLink across trays; check them and the "
            "IMEX channel on each node:", _mnnvl_script, nvlink_only=True),
)

#: NVIDIA's dcgm-exporter (github.com/NVIDIA/dcgm-exporter: listens on :9400; etc/default-counters.csv names these;
#: every device field it serves is a ``DCGM_FI_DEV_*`` family, the first of its page ``DCGM_FI_DEV_SM_CLOCK``)
EXPORTER = Exporter("dcgm-exporter", 9400, "NVIDIA/dcgm-exporter README and etc/default-counters.csv",
                    utilization="DCGM_FI_DEV_GPU_UTIL", temperature="DCGM_FI_DEV_GPU_TEMP",
                    health="DCGM_FI_DEV_XID_ERRORS", serves="DCGM_FI_DEV_")

PACK = Pack(
    name="nvidia",
    rank=1,
    exporter=EXPORTER,
    brand="NVIDIA",
    container_key="nvidia",
    tool="nvidia-smi",
    driver_check="nvidia.driver",
    driver_fix=f"install the NVIDIA r580 driver (>= {DRIVER_FLOOR}, open kernel modules) and reboot",
    transport=Transport(
        socket_env=("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
        exact_socket_env=("NCCL_SOCKET_IFNAME",),
        nvlink_env=("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"),
        ucx_tls="rc,cuda_copy",
        nvlink_why="{hardware} NVL72 compute tray: multi-node NVLink through IMEX",
        gpu_path_assumed="DMA-BUF GPUDirect RDMA is usable on every node (preflight's rdma.gpudirect passes), so no "
                         "NCCL_DMABUF_ENABLE is set; where it is not, add NCCL_DMABUF_ENABLE=0 to the node's engine "
                         "env files (and, on x86, load nvidia_peermem), as the deploy does from the node's facts",
    ),
    container=Container(
        flags=("--gpus", "all"),
        imex_device=IMEX_CHANNEL,
        docker_runtime="nvidia",
        runtime_fix="nvidia-ctk runtime configure --runtime=docker && systemctl restart docker "
                    "(or use CDI: --device nvidia.com/gpu=all)",
        after_units=("nvidia-fabricmanager.service",),
        imex_units=("nvidia-imex.service",),
        k8s_resource="nvidia.com/gpu",
        k8s_imex_api="resource.nvidia.com/v1beta1",
        # NVIDIA/k8s-device-plugin README (or the GPU Operator, which installs it)
        k8s_device_plugin="the NVIDIA device plugin (github.com/NVIDIA/k8s-device-plugin, or the GPU Operator)",
        # kubernetes-sigs/dra-driver-nvidia-gpu deployments/helm/.../templates/deviceclass-gpu.yaml: gpu.nvidia.com;
        # pkg/featuregates/featuregates.go at v25.8.0: IMEXDaemonsWithDNSNames on by default (ComputeDomain numNodes 0)
        k8s_dra_class="gpu.nvidia.com",
        k8s_dra_driver="the NVIDIA DRA driver for GPUs >= v25.8.0 (github.com/kubernetes-sigs/dra-driver-nvidia-gpu)",
        slurm_runtime="pyxis",
        apptainer_flags=("--nv",),
        # flashinfer/jit/env.py (FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>), the CUDA driver's
        # PTX JIT cache (CUDA_CACHE_PATH, default ~/.nv/ComputeCache: CUDA C++ Programming Guide, "CUDA Environment
        # Variables"); DeepGEMM's follows VLLM_CACHE_ROOT (vllm/utils/deep_gemm.py)
        jit_caches=(("FLASHINFER_WORKSPACE_BASE", "flashinfer"), ("CUDA_CACHE_PATH", "nv-compute")),
        slurm_runtime_source=("NVIDIA's container runtime for Slurm is pyxis, a SPANK plugin over enroot "
                              "(github.com/NVIDIA/pyxis README, 0.24.0: srun --container-image, squashfs images)"),
    ),
    checks=(
        Check("gpu.model", "nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c",
              "the hardware's GPU product names", "set k3_hardware to what these nodes are"),
        Check("gpu.count", "nvidia-smi -L | wc -l", "the hardware's GPUs per node",
              "a device is missing or hidden (CUDA_VISIBLE_DEVICES, MIG, dmesg Xid errors): repair the node"),
        Check("nvidia.driver", "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u",
              f">= {DRIVER_FLOOR} (CUDA 13 image)",
              f"upgrade to an r580 driver >= {DRIVER_FLOOR} (with matching Fabric Manager on NVSwitch systems) and "
              "reboot"),
        Check("nvidia.fabricmanager", "systemctl is-active nvidia-fabricmanager; nv-fabricmanager --version",
              "nvidia-fabricmanager active, version = driver version",
              "install nvidia-fabricmanager of the driver's version and enable it", fact="FabricManager"),
        Check("nvlink.fabric", "nvidia-smi -q | grep -A12 -E '^ *Fabric'", FABRIC_REQUIRED,
              "check the NVLink switch trays and nvidia-imex (journalctl -u nvidia-imex), then rerun preflight"),
        Check("nvswitch.fabric", "nvidia-smi -q | grep -A12 -E '^ *Fabric'", NVSWITCH_FABRIC_REQUIRED,
              NVSWITCH_FABRIC_FIX),
        Check("nvlink.domains", "nvidia-smi -q | grep -E 'ClusterUUID|CliqueId' | sort | uniq -c",
              "one domain keeps all traffic on NVLink", "traffic between NVLink domains goes over RDMA",
              each_node=False),
        Check("nvidia.imex",
              "systemctl is-active nvidia-imex; ls /dev/nvidia-caps-imex-channels; command -v nvidia-imex",
              "nvidia-imex active and /dev/nvidia-caps-imex-channels/channel0 present (IMEX per Slurm job, k3_imex: "
              "per_job: the IMEX packages installed; no standing domain or channel 0 outside a job)",
              "install and enable nvidia-imex (per job: install the IMEX packages of the driver's branch)",
              fact="Imex"),
        Check("nvidia.imex.domain", "nvidia-imex-ctl -N",
              "nvidia-imex-ctl -N: Domain State UP, every node READY, every pair C (Connected); a spare standing "
              "by may be down (Domain State DEGRADED)", IMEX_DOMAIN_FIX,
              fact="ImexDomain"),
        Check("container.toolkit", "nvidia-ctk --version", "nvidia-container-toolkit",
              "install nvidia-container-toolkit and run nvidia-ctk runtime configure --runtime=docker",
              fact="NvidiaContainerToolkit"),
        Check("rdma.gpudirect", "uname -r; lsmod | grep -E '^nvidia_peermem' || echo 'nvidia_peermem not loaded'",
              "DMA-BUF usable", "use the NVIDIA open kernel modules on kernel >= 5.12"),
        Check("gpu.memory", "nvidia-smi --query-gpu=memory.total --format=csv,noheader",
              "the planned nodes' GPU memory >= the variant's planning minimum",
              "plan more nodes, or choose a smaller variant", each_node=False),
        Check("hardware.health", HEALTH_COMMAND, HEALTH_REQUIRED, HEALTH_FIX, fact="NvidiaHealth"),
    ),
    probes=("nccl.probe",),
    health=HEALTH_KINDS,
    troubles=TROUBLES,
    common=COMMON,
)
