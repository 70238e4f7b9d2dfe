"""Huawei Ascend (Atlas A2 / A3 with 910B / 910C NPUs): the driver (HDK) on the host, bind-mounted into the
vllm-ascend image, CANN in the image; the NPUs talk across nodes over their own ports (hccn_tool), not the host's
RDMA ports. How many NPUs a node has (A2: 8, A3: 16 dies) is the hardware profile's ``gpu_count``.

Pure: the pack (:data:`PACK`), the container's devices and mounts, the floors. The judges and the facts they read
are :mod:`k3deploy.vendors.ascend.checks` (preflight layer). Module variables a site can change before calling
:func:`k3deploy.preflight.checks.run_checks`:

* ``DRIVER_RECOMMENDED``: Ascend HDK the vllm-ascend K3 images are validated with.
* ``NETWORK_STATUS``: status of ``ascend.network`` when an NPU's port is not ``link status: UP`` with ``net health
  status: Success`` (vllm-ascend's multi-node guides require both on every NPU; set "warn" where the site has
  checked the NPUs' reachability by ``hccn_tool -hccs_ping`` itself), and of ``ascend.peers`` when a ping from NPU
  i to NPU i of another host does not come back.

    >>> PACK.container.run_flags(2)
    ['--privileged', '--device', '/dev/davinci0', '--device', '/dev/davinci1', '--device', '/dev/davinci_manager', \
'--device', '/dev/devmm_svm', '--device', '/dev/hisi_hdc']
"""

from __future__ import annotations

import shlex
from typing import Literal

from k3deploy.vendors.base import Check, Container, Exporter, HealthKind, Pack, Spot, Transport
from k3deploy.vendors.common import COMMON, QUARANTINE_NOTE

DRIVER_RECOMMENDED = "25.5"
NETWORK_STATUS: Literal["pass", "warn", "fail"] = "fail"

DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
#: the NPUs' generic resource under Slurm (``gres.conf``: ``Name=npu File=/dev/davinci[0-7]``). Slurm has no GRES
#: plugin of its own for NPUs (gres.conf(5): a name other than gpu, mps, shard or nic is a generic resource bound
#: to its ``File=`` devices), so the name is the site's: ``npu`` is the one Ascend Slurm sites use; Huawei's
#: MindCluster documents scheduling for Kubernetes and Volcano only. ``k3_slurm_gres`` overrides it
SLURM_GRES = "npu"
#: (host path, container path) of the driver files vllm-ascend's guides bind-mount, in their order
MOUNTS = (
    ("/usr/local/dcmi", "/usr/local/dcmi"),
    ("/usr/local/Ascend/driver/tools/hccn_tool", "/usr/local/Ascend/driver/tools/hccn_tool"),
    ("/usr/local/bin/npu-smi", "/usr/local/bin/npu-smi"),
    ("/usr/local/Ascend/driver/lib64/", "/usr/local/Ascend/driver/lib64/"),
    ("/usr/local/Ascend/driver/version.info", "/usr/local/Ascend/driver/version.info"),
    ("/etc/ascend_install.info", "/etc/ascend_install.info"),
)
#: the CANN environment, sourced before the engine starts (vllm-ascend images start a shell)
PROFILE = ("source /usr/local/Ascend/ascend-toolkit/set_env.sh; "
           "source /usr/local/Ascend/nnal/atb/set_env.sh; ")
HCCN = "/usr/local/Ascend/driver/tools/hccn_tool"


def _each_npu(spot: Spot, queries: tuple[str, ...]) -> str:
    body = "; ".join(f"$t -i $i -{q} -g" for q in queries)
    return f"t={HCCN}; for i in $(seq 0 {max(0, spot.devices - 1)}); do {body}; done"


#: a chip's health states (``npu-smi info`` Health column, ``npu-smi info -t health``), after Huawei's DCMI reference
#: ``dcmi_get_device_health`` (the same value npu-smi prints; the open CANN driver's docs, mirrored at
#: https://github.com/verylucky01/driver/blob/04370735071371c28a9ae26fc9e7d9455cf490c3/docs/zh/Ascend_910_93_DCMI_API/Ascend_910_93_DCMI_API/dcmi_get_device_health.md):
#: 0 OK (normal), 1 Warning (一般告警, a minor alarm), 2 Alarm (重要告警, major), 3 Critical (紧急告警, urgent),
#: 0xFFFFFFFF the device does not exist (npu-smi: UNKNOWN); the most severe alarm of the chip decides. The one rule
#: preflight's ``ascend.health`` and the health model share: these keep a node from serving, a Warning is shown.
NPU_FATAL_STATES = frozenset({"Alarm", "Critical", "UNKNOWN"})

#: the kind of hardware-health event Ascend's tools report (:mod:`k3deploy.model.health`), and how a node comes back
HEALTH_KINDS = (
    HealthKind("npu-health", "NPU health", "read the NPU's error code (npu-smi info -t health -i N) in the product's "
               "black-box error code list, then reset the NPU (npu-smi set -t reset -i N -c 0) or reboot; replace it "
               "if the alarm comes back"),
)

#: Huawei MindCluster's npu-exporter (gitee.com/ascend/mind-cluster: listens on :8082; its Prometheus metrics API
#: names these; health 1 = healthy, 0 = not)
#: (its page opens with ``machine_npu_nums``, the number of NPUs: MindCluster docs, "Prometheus Metrics API")
EXPORTER = Exporter("npu-exporter", 8082, "Ascend MindCluster npu-exporter, Prometheus metrics API",
                    utilization="npu_chip_info_utilization", temperature="npu_chip_info_temperature",
                    health="npu_chip_info_health_status", serves="machine_npu_nums")

PACK = Pack(
    name="ascend",
    rank=3,
    exporter=EXPORTER,
    brand="Huawei",
    container_key="npu",
    tool="npu-smi",
    driver_check="ascend.driver",
    driver_fix="install the Ascend driver and firmware (HDK) so that npu-smi works, then reboot",
    health=HEALTH_KINDS,
    transport=Transport(
        socket_env=("HCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
        address_env="HCCL_IF_IP",
        rdma_ports=False,
    ),
    container=Container(
        flags=("--privileged",),
        per_device="/dev/davinci{index}",
        devices=DEVICES,
        mounts=MOUNTS,
        rdma_devices=False,
        login_profile=PROFILE,
        k8s_resource="huawei.com/Ascend910",
        slurm_gres=SLURM_GRES,
        k8s_privileged=True,
        # Ascend MindCluster's Ascend Device Plugin (huawei.com/Ascend910 on Atlas 800 A2/A3); no DRA driver
        k8s_device_plugin="the Ascend Device Plugin of MindCluster (gitcode.com/Ascend/mind-cluster)",
        slurm_runtime="docker",
        # CANN's operator compile cache (ASCEND_CACHE_PATH, default ~/atc_data) and its working files
        # (ASCEND_WORK_PATH): CANN environment variable reference
        jit_caches=(("ASCEND_CACHE_PATH", "ascend-cache"), ("ASCEND_WORK_PATH", "ascend-work")),
        slurm_runtime_source=("MindCluster's Ascend Docker Runtime mounts the NPUs' devices and driver files into "
                              "Docker or containerd containers only (hiascend.com, MindCluster 7.3 'Ascend Docker "
                              "Runtime', Component Functions): there is no enroot or Apptainer integration"),
    ),
    checks=(
        Check("gpu.model", "npu-smi info", "the hardware's NPU product names",
              "set k3_hardware to what these nodes are"),
        Check("gpu.count", "npu-smi info", "the hardware's NPUs per node", "a device is missing: repair the node"),
        Check("ascend.driver", "npu-smi info", "working npu-smi",
              "install the Ascend driver and firmware (HDK) so that npu-smi works, then reboot", fact="NpuSmiInfo"),
        Check("ascend.health", "npu-smi info",
              "no NPU chip in Health Alarm, Critical or UNKNOWN (a Warning, a minor alarm, is shown, not fatal)",
              "check npu-smi info -t health -i <id> -c <chip> and the device log; reset the NPU (npu-smi set -t "
              "reset -i N -c 0) or replace it"),
        Check("ascend.versions", "cat /usr/local/Ascend/driver/version.info",
              f"driver (HDK) >= {DRIVER_RECOMMENDED} recommended; version.info and mounted paths present",
              "install the Ascend driver and firmware (HDK)", fact="AscendVersions"),
        Check("ascend.mounts", "ls -d " + " ".join(host for host, _ in MOUNTS),
              "every host path the engine container bind-mounts (docker run -v) exists",
              "install the Ascend driver (HDK) package, which puts these files there, or repair its installation"),
        Check("ascend.network", lambda spot: _each_npu(spot, ("link", "net_health")),
              "every NPU: link status UP, net health status Success",
              "check the optical module, cable and switch port of the NPU and its addresses (hccn_tool -i N -ip -g, "
              "/etc/hccn.conf)"),
        Check("ascend.peers", lambda spot: _each_npu(spot, ("vnic", "ip")) + "  # then, from NPU i: "
              f"{shlex.quote(HCCN)} -i i -hccs_ping -g address <NPU i of a peer>",
              "NPU i reaches NPU i of every other host",
              "check both ends' NPU ports, their addresses and the switch or HCCS path between them"),
        Check("gpu.memory", "npu-smi info", "the planned nodes' NPU memory >= the variant's planning minimum",
              "plan more nodes, or choose a smaller variant", each_node=False),
        Check("hardware.health", "npu-smi info; npu-smi info -t health -i $i -c $c",
              "no NPU chip in Health Status Alarm, Critical or UNKNOWN (chip c of NPU i, for each chip whose Health "
              "in npu-smi info is not OK; Warning is shown, not fatal)",
              "the node must not serve: drain it: " + QUARANTINE_NOTE + "; look the error code up in "
              "the product's black-box error code list, reset the NPU (npu-smi set -t reset -i N -c 0) or reboot, "
              "and replace it if the alarm comes back", fact="AscendHealth"),
    ),
    site_docker_form=False,
    no_site_docker_why="Ascend NPUs need their devices and driver mounts, not --gpus",
    probes=("ascend.peers",),
    common=COMMON,
)
