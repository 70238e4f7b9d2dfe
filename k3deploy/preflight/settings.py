"""Per-host settings derived from facts (never hard-coded), handed to the rollout as environment.

:func:`derive_settings` returns, for one host, the environment variables NCCL/Gloo/UCX/HCCL need on
that host and a short reason for each. Which variables a vendor's engines use is its pack's
:class:`~k3deploy.vendors.base.Transport`; the settings only its own facts tell (NVLink across trays, DMA-BUF) come
from its preflight side (:class:`~k3deploy.preflight.base.VendorChecks`).

How they reach an engine (:func:`k3deploy.model.rollout.engine_env`): they *replace* the plan's values of the same
names (the recipe's ``$IFACE_NAME`` placeholders, which would give NCCL a prefix match, and a P/D prefill's
``UCX_NET_DEVICES=all``), the rollout adds ``VLLM_HOST_IP`` (the node's ``k3_ip``), and ``k3_extra_env`` is applied
last: the site's own word wins over the plan's and these. A variable not derived here keeps the plan's value.

* ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``: ``k3_iface`` when set, else the interface carrying the node's
  inventory address (falls back to the default-route interface when no address is known); never ``lo``. NCCL's is
  the exact-match form ``=eth1`` (a bare name is a prefix to NCCL: ``eth1`` also selects ``eth10``); Gloo takes
  interface names as they are.
* ``NCCL_MNNVL_ENABLE`` / ``NCCL_CUMEM_ENABLE`` / ``NCCL_NVLS_ENABLE`` = 1 on GB200/GB300 NVL72 compute trays
  (not where the tray's GPUs report no NVLink fabric at all, as a GB200 NVL4 board does).
* ``NCCL_DMABUF_ENABLE=0`` when DMA-BUF GPUDirect RDMA is not usable; then, on x86, ``nvidia_peermem`` must be
  loaded (``peermem_required`` is set so the rollout can load it or refuse; CUDA 13 deprecates it, Grace has none).
* ``NCCL_IB_HCA`` from the chosen RDMA ports (exact match: ``=mlx5_0:1,mlx5_1:1``): ``k3_ib_hca`` when set, else
  the active ports, no BlueField DPU's beside other NICs (``ibv_devinfo``'s ``vendor_part_id``), InfiniBand only
  beside an InfiniBand fabric, only HCAs PIX/PXB to a GPU where ``nvidia-smi topo -m`` tells them apart, never the
  port of the default route (:func:`k3deploy.facts.rdma.choose_ports`); preflight warns when their number is not
  the GPU count.
  RoCE needs no ``NCCL_IB_GID_INDEX``: NCCL picks the RoCE v2 GID.
* P/D (NIXL over UCX, which reads no ``NCCL_*``): ``UCX_NET_DEVICES`` = the same ports (``mlx5_0:1,mlx5_1:1``) and
  ``UCX_TLS`` = RC verbs plus the vendor's GPU-memory copy transport: ``rc,cuda_copy`` on NVIDIA (the recipe's
  value), ``rc,rocm_copy`` on AMD (``cuda_copy`` does not exist there).
* Ascend: ``HCCL_IF_IP``, ``HCCL_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from k3deploy.facts.host import AddressInterface
from k3deploy.facts.rdma import choose_ports
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import HostFacts, gpu_topology, vendor_checks
from k3deploy.vendors.base import HostAnswers


@dataclass
class HostSettings:
    host: str
    env: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    peermem_required: bool = False

    def set(self, key: str, value: str, reason: str) -> None:
        self.env[key] = value
        self.reasons[key] = reason


def socket_interface(itf: AddressInterface | None, setting: str | None = None) -> tuple[str | None, str]:
    """The interface for NCCL/Gloo bootstrap sockets and why: ``setting`` (``k3_iface``) when given.

    >>> from k3deploy.facts.host import Ipv4Address
    >>> socket_interface(AddressInterface("10.77.0.12", "eth1", "eth0", [Ipv4Address("eth1", "10.77.0.12", 24)]))
    ('eth1', 'carries 10.77.0.12')
    >>> socket_interface(None, "bond0")
    ('bond0', 'k3_iface')
    """
    if setting:
        return setting.lstrip("="), "k3_iface"
    if itf is None:
        return None, ""
    if itf.interface and itf.interface != "lo":
        return itf.interface, f"carries {itf.address}"
    if not itf.address and itf.default_interface and itf.default_interface != "lo":
        return itf.default_interface, "default route (no node address given)"
    return None, ""


def host_answers(sel: Requirements, facts: HostFacts) -> tuple[HostAnswers, bool]:
    """What the host's facts answer to the transport settings (:class:`~k3deploy.vendors.base.HostAnswers`), and
    whether a kernel module (nvidia_peermem) must be loaded for the GPU's path to the RDMA ports."""
    judges = vendor_checks(sel)
    itf = facts.interface if isinstance(facts.interface, AddressInterface) else None
    ifname, why = socket_interface(itf, facts.iface)
    address = itf.address if ifname and itf and itf.address and itf.interface == ifname else None
    answers = HostAnswers(ifname, why, address, judges.nvlink(sel, facts))
    devices = facts.rdma if isinstance(facts.rdma, list) else []
    if not (sel.needs_rdma and devices and judges.pack.transport.rdma_ports):
        return answers, False
    choice = choose_ports(devices, itf.default_interface if itf else None, facts.ib_hca, gpu_topology(facts))
    if not choice.ports:
        return answers, False
    if choice.from_setting:
        why = "k3_ib_hca"
    else:
        why = "RDMA ports with an active link"
        if choice.excluded:
            why += "; not " + ", ".join(f"{d}:{p} ({reason})" for d, p, reason in choice.excluded)
    gpu_path, peermem = judges.rdma_settings(sel, facts)
    return replace(answers, ports=choice.ucx_net_devices, ports_why=why, gpu_path=tuple(gpu_path)), peermem


def derive_settings(sel: Requirements, facts: HostFacts) -> HostSettings:
    """The host's settings: what its facts answer (:func:`host_answers`) through the one derivation
    (:meth:`k3deploy.vendors.base.Transport.settings`), which the offline runbook runs on blanks."""
    out = HostSettings(host=facts.host)
    if facts.unreachable is not None:
        return out
    answers, out.peermem_required = host_answers(sel, facts)
    for key, value, reason in vendor_checks(sel).pack.transport.settings(answers, sel.pd):
        out.set(key, value, reason)
    return out
