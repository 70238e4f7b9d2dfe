"""The checks every host gets, whatever its vendor: reachability, the node's address, disk space, Docker, the RDMA
ports, a stage daemon left behind, the router command, the image's build, the planned memory and the NCCL probe.

Pure. Each is a :class:`~k3deploy.vendors.base.Check`; a pack lists them after its own
(:meth:`~k3deploy.vendors.base.Pack.all_checks`).

    >>> from k3deploy.vendors.base import Spot
    >>> by_id = {c.id: c for c in COMMON}
    >>> by_id["disk.cache"].command_for(Spot(cache="/data/cache"))
    'p=/data/cache; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -h "$p"'
    >>> by_id["network.interface"].command_for(Spot(address="10.0.0.1"))
    "ip -o -4 addr show | grep -F ' 10.0.0.1/'"
"""

from __future__ import annotations

import shlex

from k3deploy.vendors.base import Check, Spot

#: ``/dev/shm`` size (GiB) below which NCCL/PyTorch shared memory runs out: the ``disk.shm`` check's floor, and the
#: size of the memory ``emptyDir`` a Kubernetes pod gets as its ``/dev/shm`` (:mod:`k3deploy.model.kubernetes`)
SHM_MIN_GIB = 16.0

#: the NICs of NVIDIA BlueField DPUs by ``ibv_devinfo``'s ``vendor_part_id`` (the PCI device id, in decimal; pci.ids:
#: 15b3:a2d2, a2d6, a2dc, a2d9, a2df; the last, BlueField-4's integrated ConnectX-8, also in Linux's mlx5_core
#: ``mlx5_core_pci_table``, drivers/net/ethernet/mellanox/mlx5/core/main.c): north-south, storage or management
#: ports beside a node's GPU NICs (a GB300 Spectrum-X tray: ConnectX-8 SuperNICs and a BlueField-3, all RoCE). An
#: extra RoCE port in ``NCCL_IB_HCA`` is a known cause of ``ibv_modify_qp`` timeouts. (BlueField-3 SuperNICs, where
#: they are the GPU NICs, report 41692 too: the port choice leaves BlueField ports out only when other ports remain.)
DPU_PART_IDS: dict[int, str] = {
    0xA2D2: "BlueField", 0xA2D6: "BlueField-2", 0xA2DC: "BlueField-3", 0xA2D9: "BlueField-3 Lx",
    0xA2DF: "BlueField-4",
}


def dpu_model(part_id: int | None) -> str | None:
    """The BlueField generation of an RDMA device's ``vendor_part_id``, None for any other NIC.

    >>> dpu_model(41692), dpu_model(41695), dpu_model(4131), dpu_model(None)
    ('BlueField-3', 'BlueField-4', None, None)
    """
    return DPU_PART_IDS.get(part_id) if part_id is not None else None


def _interface(spot: Spot) -> str:
    return f"ip -o -4 addr show | grep -F ' {spot.address}/'" if spot.address else "ip -o -4 route show default"


def _cache(spot: Spot) -> str:
    return f"p={shlex.quote(spot.cache)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; df -h \"$p\""


#: what happens to a node with a fatal hardware-health event (each pack's ``hardware.health`` fix says it)
QUARANTINE_NOTE = ("the deploy quarantines it and gives its place to a spare where the inventory has one "
                   "(docs/health.md)")

COMMON: tuple[Check, ...] = (
    Check("host.reachable", lambda spot: f"ssh {shlex.quote(spot.address or 'NODE')} true", "SSH connection",
          "check the address, SSH key and that the node is up", where="control"),
    Check("network.interface", _interface, "the node's address on a non-loopback interface",
          "set k3_ip (or ssh_hostname) to the node's cluster address"),
    Check("container.runtime", "docker version --format '{{.Server.Version}}'", "docker daemon answering",
          "install Docker Engine and start it", fact="DockerRuntime"),
    Check("rdma.devices", "ibv_devinfo | grep -E 'hca_id|state|link_layer'",
          "an ACTIVE InfiniBand/RoCE port (multi-node)",
          "install rdma-core (ibverbs-utils) or DOCA-OFED; without RDMA NCCL falls back to TCP sockets"),
    Check("rdma.reach", "ping -c 2 -W 2 -I <port netdev> <peer port address>  # each chosen port to each peer's",
          "with k3_rdma_reach: true and expert parallelism across nodes: each chosen RDMA port reaches each chosen "
          "port of the other nodes",
          "connect the rails (a spine, or routes between the rail subnets), or choose a strategy without expert "
          "parallelism across nodes"),
    Check("disk.images", "df -h \"$(docker info --format '{{.DockerRootDir}}')\"", "free space for container images",
          "free space or point Docker's data-root at a larger disk"),
    Check("disk.cache", _cache, "free space for the model weights",
          "free space in the cache directory or set k3_model_cache to a larger disk"),
    Check("disk.shm", "df -h /dev/shm", "size of /dev/shm",
          "enlarge /dev/shm (mount -o remount,size=64G /dev/shm) and remove stale nccl-* segments"),
    Check("node.quarantine", lambda spot: f"cat {spot.config_dir}/quarantine",
          "no quarantine record: the deploy quarantines a node with a fatal hardware-health event",
          "repair or replace the node's hardware, then release it (k3deploy spares INVENTORY --release NODE): it "
          "comes back as a spare"),
    Check("stage.peers", lambda spot: f"systemctl show -p ActiveState -p ActiveEnterTimestamp {spot.peers_unit}",
          "no stage daemon outside a deploy's stage", "systemctl stop the stage daemon (the next deploy stops it in "
          "its first stage step)", fact="StagePeers"),
    Check("router.command", lambda spot: f"test -x {shlex.quote(spot.router_bin)} && echo executable",
          "the vllm-router command at k3_router_bin (the router unit's ExecStart)",
          "pip install vllm-router==0.1.17 on the router host, or set k3_router_bin to where it is (or "
          "k3_router_image to run it from an image)", each_node=False),
    Check("slurm.site", "scontrol --version; scontrol show config | grep -E '^(SwitchType|Prolog) '",
          "with k3_launcher: slurm, the site's Slurm read on k3_slurm_submit_host (its version; with IMEX per job, "
          "SwitchType=switch/nvidia_imex or the prolog k3_imex_prolog names)",
          "make scontrol answer on the submit host; for IMEX per job set SwitchType=switch/nvidia_imex (Slurm >= "
          "24.05) or name the site's IMEX prolog in k3_imex_prolog, or set k3_imex: standing", each_node=False),
    Check("slurm.container", "command -v enroot; srun --help | grep -- --container-image  # pyxis; apptainer: "
          "command -v apptainer",
          "with k3_launcher: slurm, the tools of the site's container runtime (k3_slurm_container) on every engine "
          "node: pyxis: enroot, and srun --help lists --container-image; apptainer: apptainer (docker: the "
          "container.runtime check)",
          "install the runtime (enroot and pyxis: github.com/NVIDIA/pyxis, plugstack.conf.d/pyxis.conf, then restart "
          "slurmd; Apptainer: apptainer.org/docs/admin), or set k3_slurm_container to the runtime the site has"),
    Check("image.digest", lambda spot: f"docker buildx imagetools inspect {shlex.quote(spot.image)}",
          "the registry names the build of the image's tag (every node runs that one digest)",
          "pin the build: k3_image: REPO@sha256:<digest>, or let the node reach the registry", each_node=False),
    Check("gpu.memory", "k3deploy preflight INVENTORY",
          "the planned nodes' accelerator memory >= the variant's planning minimum",
          "plan more nodes, or choose a smaller variant", where="control", each_node=False),
    Check("nccl.probe", "k3deploy preflight INVENTORY  # with k3_nccl_probe: true",
          "k3_nccl_probe: a two-node NCCL all-reduce where NCCL crosses nodes",
          "fix what the probe's NCCL log names, then rerun preflight", where="control", each_node=False),
)
