"""Per-host settings derived from facts (never hard-coded), handed to the rollout as environment.

:func:`derive_settings` returns, for one host, the environment variables NCCL/Gloo/UCX/HCCL need on
that host and a short reason for each:

* ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``: the interface carrying the node's inventory
  address (falls back to the default-route interface when no address is known); never ``lo``.
* ``NCCL_MNNVL_ENABLE`` / ``NCCL_CUMEM_ENABLE`` / ``NCCL_NVLS_ENABLE`` = 1 on GB200/GB300 NVL trays.
* ``NCCL_DMABUF_ENABLE=0`` when DMA-BUF GPUDirect RDMA is not usable; then ``nvidia_peermem`` must be
  loaded (``peermem_required`` is set so the rollout can load it or refuse).
* ``UCX_TLS=rc,cuda_copy`` where RDMA carries the P/D KV transfer (NIXL over UCX).
* ``NCCL_IB_HCA`` from the RDMA devices with an active port (exact match: ``=mlx5_0:1,mlx5_1:1``).
* Ascend: ``HCCL_IF_IP``, ``HCCL_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3deploy.cluster.requirements import Requirements
from k3deploy.facts.host import AddressInterface
from k3deploy.facts.rdma import DmabufSupport, RdmaDevice
from k3deploy.preflight.checks import HostFacts


@dataclass
class HostSettings:
    host: str
    env: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    peermem_required: bool = False

    def set(self, key: str, value: str, reason: str) -> None:
        self.env[key] = value
        self.reasons[key] = reason


def socket_interface(itf: AddressInterface) -> tuple[str | None, str]:
    """The interface for NCCL/Gloo bootstrap sockets and why.

    >>> from k3deploy.facts.host import Ipv4Address
    >>> socket_interface(AddressInterface("10.77.0.12", "eth1", "eth0", [Ipv4Address("eth1", "10.77.0.12", 24)]))
    ('eth1', 'carries 10.77.0.12')
    """
    if itf.interface and itf.interface != "lo":
        return itf.interface, f"carries {itf.address}"
    if not itf.address and itf.default_interface and itf.default_interface != "lo":
        return itf.default_interface, "default route (no node address given)"
    return None, ""


def ib_hca(devices: list[RdmaDevice]) -> str | None:
    """``NCCL_IB_HCA`` value: active ports, exact names.

    >>> from k3deploy.facts.rdma import RdmaPort
    >>> ib_hca([RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand")]),
    ...         RdmaDevice("mlx5_1", ports=[RdmaPort(1, "PORT_DOWN", "InfiniBand")])])
    '=mlx5_0:1'
    >>> ib_hca([RdmaDevice("mlx5_0", ports=[RdmaPort(1, "PORT_ACTIVE", "InfiniBand")]),
    ...         RdmaDevice("mlx5_4", ports=[RdmaPort(1, "PORT_ACTIVE", "Ethernet")])])
    '=mlx5_0:1'
    """
    ports = [(d.name, p) for d in devices for p in d.ports if p.active]
    # an InfiniBand fabric carries NCCL; an Ethernet port next to it (a BlueField NIC) is not part of it
    if any(p.link_layer == "InfiniBand" for _, p in ports):
        ports = [(n, p) for n, p in ports if p.link_layer == "InfiniBand"]
    active = [f"{n}:{p.port}" for n, p in ports]
    return "=" + ",".join(active) if active else None


def derive_settings(sel: Requirements, facts: HostFacts) -> HostSettings:
    out = HostSettings(host=facts.host)
    if facts.unreachable is not None:
        return out
    brand = sel.brand
    itf = facts.interface if isinstance(facts.interface, AddressInterface) else None
    ifname, why = socket_interface(itf) if itf else (None, "")
    if ifname:
        if brand == "Huawei":
            out.set("HCCL_SOCKET_IFNAME", ifname, why)
            out.set("TP_SOCKET_IFNAME", ifname, why)
            out.set("GLOO_SOCKET_IFNAME", ifname, why)
            if itf and itf.address and itf.interface == ifname:
                out.set("HCCL_IF_IP", itf.address, f"address of {ifname}")
        else:
            out.set("NCCL_SOCKET_IFNAME", ifname, why)
            out.set("GLOO_SOCKET_IFNAME", ifname, why)

    if brand == "NVIDIA" and getattr(sel.hardware, "nvl", False):
        reason = f"{sel.hardware.id} NVL tray: multi-node NVLink through IMEX"
        for key in ("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"):
            out.set(key, "1", reason)

    devices = facts.rdma if isinstance(facts.rdma, list) else []
    hca = ib_hca(devices)
    if sel.needs_rdma and hca and brand != "Huawei":
        out.set("NCCL_IB_HCA", hca, "RDMA devices with an active port")
        if brand == "NVIDIA":
            dmabuf = facts.dmabuf
            if isinstance(dmabuf, DmabufSupport) and dmabuf.prerequisites_met is False:
                out.set("NCCL_DMABUF_ENABLE", "0", "DMA-BUF not usable: " + "; ".join(dmabuf.reasons))
                out.peermem_required = True
        if sel.pd:
            out.set("UCX_TLS", "rc,cuda_copy", "RDMA carries the P/D KV transfer (NIXL over UCX)")
    return out
