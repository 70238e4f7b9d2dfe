"""AMD's preflight side: the facts it reads and the judges of its checks (preflight layer): the amdgpu kernel
driver (its floor, one version across the group), where a site asks for one the host's ROCm userspace, and on
multi-node hosts the amdkfd peer-memory interface RCCL's GPUDirect RDMA needs. Ids, commands and floors:
:mod:`k3deploy.vendors.amd`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.facts.base import FactError, version_at_least
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import (
    CLUSTER,
    GIB,
    HEALTH,
    Device,
    FactSpec,
    HostFacts,
    Read,
    Results,
    VendorChecks,
    VendorRun,
    as_type,
)
from k3deploy.vendors import amd as vendor
from k3deploy.vendors.amd import facts as facts_amd
from k3deploy.vendors.amd.facts import AmdSmiVersions, PeerMemory, RocmDriver


@dataclass
class AmdFacts(HostFacts):
    """A host's facts on AMD hardware: the common ones, and what AMD's tools say (None: not read): amd-smi's
    versions (amdgpu, host ROCm), the loaded amdgpu module's version, the GPUs, and the amdkfd peer-memory interface
    RCCL's GPUDirect RDMA needs (multi-node)."""

    amd_versions: AmdSmiVersions | FactError | None = None
    rocm_driver: RocmDriver | FactError | None = None
    amd_gpus: list[facts_amd.AmdGpu] | FactError | None = None
    amd_peer_memory: PeerMemory | FactError | None = None  # the amdkfd peer-memory interface RCCL uses

    def read_amd_versions(self, value: AmdSmiVersions | FactError) -> None:
        self.amd_versions = value

    def read_rocm_driver(self, value: RocmDriver | FactError) -> None:
        self.rocm_driver = value

    def read_amd_gpus(self, value: list[facts_amd.AmdGpu] | FactError) -> None:
        self.amd_gpus = value

    def read_amd_peer_memory(self, value: PeerMemory | FactError) -> None:
        self.amd_peer_memory = value


def own(facts: HostFacts) -> AmdFacts:
    """``facts`` as AMD's (:func:`~k3deploy.preflight.base.as_type`)."""
    return as_type(facts, AmdFacts)


def amdgpu_version(host: HostFacts) -> str | None:
    """The host's amdgpu kernel driver version: the loaded module's (or rocm-smi's), else amd-smi's."""
    facts = own(host)
    if isinstance(facts.rocm_driver, RocmDriver):
        return facts.rocm_driver.driver
    versions = facts.amd_versions
    if isinstance(versions, AmdSmiVersions) and versions.amdgpu:
        return versions.amdgpu
    return None


def _check_rocm(out: Results, facts: AmdFacts) -> None:
    versions = facts.amd_versions
    floor = f", host ROCm >= {vendor.ROCM_HOST_MIN}" if vendor.ROCM_HOST_MIN else ""
    required = f"amdgpu >= {vendor.AMDGPU_FLOOR} (ROCm 7 image)" + floor
    driver = amdgpu_version(facts)
    if driver is None:
        err = facts.rocm_driver if isinstance(facts.rocm_driver, FactError) else None
        observed = err.message(facts.host) if err else "amdgpu driver version not reported"
        out.add(facts.host, "rocm.driver", "fail", observed, required, vendor.driver_fix(vendor.AMDGPU_FLOOR))
    elif not version_at_least(driver, vendor.AMDGPU_FLOOR):
        out.add(facts.host, "rocm.driver", "fail", f"amdgpu {driver}", required, vendor.driver_fix(vendor.AMDGPU_FLOOR))
    else:
        out.add(facts.host, "rocm.driver", "pass", f"amdgpu {driver}", required)
    if driver is None:
        return
    rocm = versions.rocm if isinstance(versions, AmdSmiVersions) else None
    if vendor.ROCM_HOST_MIN and (rocm is None or not version_at_least(rocm, vendor.ROCM_HOST_MIN)):
        out.add(facts.host, "rocm.version", "fail", f"host ROCm {rocm or 'N/A'}", f">= {vendor.ROCM_HOST_MIN}",
                f"install ROCm {vendor.ROCM_HOST_MIN} or newer on the host")
    elif rocm is None:
        out.add(facts.host, "rocm.version", "pass", "no host ROCm userspace (the image brings ROCm)", "none")
    else:
        out.add(facts.host, "rocm.version", "pass", f"host ROCm {rocm}", vendor.ROCM_HOST_MIN or "none")


def _check_peer_memory(out: Results, facts: AmdFacts) -> None:
    """``rdma.gpudirect``: RCCL uses GPUDirect RDMA only where it finds the amdkfd peer-memory interface; without it
    every transfer between nodes is staged through host memory, and nothing says so."""
    peer = facts.amd_peer_memory
    if peer is None:
        return
    check = vendor.PACK.check("rdma.gpudirect")
    if isinstance(peer, FactError):
        out.error(facts.host, "rdma.gpudirect", peer, check.required, check.fix)
    elif isinstance(peer, PeerMemory) and peer.available:
        out.add(facts.host, "rdma.gpudirect", "pass", peer.shown, check.required)
    else:
        out.add(facts.host, "rdma.gpudirect", vendor.GPUDIRECT_MISSING_STATUS, peer.shown + ": RCCL stages "
                "through host memory", check.required, check.fix)


class AmdRun(VendorRun):
    def after_rdma(self, out: Results, facts: HostFacts) -> None:
        _check_peer_memory(out, own(facts))

    def last(self, out: Results, facts: HostFacts) -> None:
        _check_rocm(out, own(facts))

    def cluster(self, out: Results) -> None:
        """``rocm.driver.group``: one amdgpu version on every node of a multi-node group (RCCL across nodes, as
        NVIDIA's driver and Fabric Manager must match); the nodes that differ from the most common version fail."""
        drivers = {h.host: amdgpu_version(h) for h in self.hosts if h.unreachable is None}
        known = {h: v for h, v in drivers.items() if v is not None}
        if len(self.hosts) < 2 or len(known) < 2:
            return
        check = vendor.PACK.check("rocm.driver.group")
        counts: dict[str, int] = {}
        for version in known.values():
            counts[version] = counts.get(version, 0) + 1
        if len(counts) == 1:
            out.add(CLUSTER, "rocm.driver.group", "pass", f"amdgpu {next(iter(counts))} on {len(known)} nodes",
                    check.required)
            return
        order = list(known)
        top = max(counts.values())
        # the most common version; a tie goes to the first host in inventory order (the head)
        majority = next(known[h] for h in order if counts[known[h]] == top)
        shown = "; ".join(f"amdgpu {v} on {', '.join(h for h in order if known[h] == v)}" for v in counts)
        for host in order:
            if known[host] != majority:
                out.add(host, "rocm.driver.group", "fail", f"amdgpu {known[host]} (the group's other nodes: "
                        f"{majority})", f"amdgpu {majority}, as on the other nodes", check.fix)
        out.add(CLUSTER, "rocm.driver.group", "fail", shown, check.required, check.fix)


class AmdChecks(VendorChecks):
    pack = vendor.PACK
    facts_type = AmdFacts
    capture = (
        (facts_amd.AmdSmiVersion, {}),
        (facts_amd.RocmDriverVersion, {}),
        (facts_amd.AmdGpus, {}),
        (facts_amd.AmdHealth, {}),
    )

    def facts(self, requirements: Requirements) -> list[FactSpec]:
        rdma: list[FactSpec] = [Read("amd_peer_memory", facts_amd.AmdPeerMemory, AmdFacts.read_amd_peer_memory),
                                Read("topology", facts_amd.AmdGpuNicTopology, HostFacts.read_topology)]
        return [
            Read("amd_gpus", facts_amd.AmdGpus, AmdFacts.read_amd_gpus),
            Read("amd_versions", facts_amd.AmdSmiVersion, AmdFacts.read_amd_versions),
            Read("rocm_driver", facts_amd.RocmDriverVersion, AmdFacts.read_rocm_driver),
            *(rdma if requirements.needs_rdma else []),
        ]

    def devices(self, facts: HostFacts) -> list[Device] | FactError | None:
        gpus = own(facts).amd_gpus
        if gpus is None or isinstance(gpus, FactError):
            return gpus
        return [Device(g.name or "AMD GPU", g.vram_bytes / GIB if g.vram_bytes is not None else None,
                       getattr(g, "device_id", None))
                for g in gpus]

    def begin(self, requirements: Requirements, hosts: Sequence[HostFacts]) -> VendorRun:
        return AmdRun(requirements, hosts)

    def health(self, requirements: Requirements, config_dir: str) -> FactSpec | None:
        return Read(HEALTH, facts_amd.AmdHealth, HostFacts.read_health, {"config_dir": config_dir})


CHECKS = AmdChecks()
