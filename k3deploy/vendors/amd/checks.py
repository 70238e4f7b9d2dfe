"""AMD's preflight side: the facts it reads and the judges of its checks (preflight layer): the amdgpu kernel
driver and, where a site asks for one, the host's ROCm userspace. Ids, commands and floors: :mod:`k3deploy.vendors.amd`.
"""

from __future__ import annotations

from k3deploy.facts import amd as facts_amd
from k3deploy.facts.amd import AmdSmiVersions, RocmDriver
from k3deploy.facts.base import FactError, version_at_least
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import GIB, Device, FactSpec, HostFacts, Results, VendorChecks, VendorRun
from k3deploy.vendors import amd as vendor


def _check_rocm(out: Results, facts: HostFacts) -> None:
    versions = facts.amd_versions
    floor = f", host ROCm >= {vendor.ROCM_HOST_MIN}" if vendor.ROCM_HOST_MIN else ""
    required = vendor.PACK.check("rocm.driver").required + floor
    if isinstance(facts.rocm_driver, RocmDriver):
        driver = facts.rocm_driver.driver
    elif isinstance(versions, AmdSmiVersions) and versions.amdgpu:
        driver = versions.amdgpu
    else:
        driver = None
    if driver is None:
        err = facts.rocm_driver if isinstance(facts.rocm_driver, FactError) else None
        observed = err.message(facts.host) if err else "amdgpu driver version not reported"
        out.add(facts.host, "rocm.driver", "fail", observed, required,
                vendor.PACK.check("rocm.driver").fix)
        return
    out.add(facts.host, "rocm.driver", "pass", f"amdgpu {driver}", required)
    rocm = versions.rocm if isinstance(versions, AmdSmiVersions) else None
    if vendor.ROCM_HOST_MIN and (rocm is None or not version_at_least(rocm, vendor.ROCM_HOST_MIN)):
        out.add(facts.host, "rocm.version", "fail", f"host ROCm {rocm or 'N/A'}", f">= {vendor.ROCM_HOST_MIN}",
                f"install ROCm {vendor.ROCM_HOST_MIN} or newer on the host")
    elif rocm is None:
        out.add(facts.host, "rocm.version", "pass", "no host ROCm userspace (the image brings ROCm)", "none")
    else:
        out.add(facts.host, "rocm.version", "pass", f"host ROCm {rocm}", vendor.ROCM_HOST_MIN or "none")


class AmdRun(VendorRun):
    def last(self, out: Results, facts: HostFacts) -> None:
        _check_rocm(out, facts)


class AmdChecks(VendorChecks):
    pack = vendor.PACK

    def facts(self, requirements: Requirements) -> list[FactSpec]:
        return [
            ("amd_gpus", facts_amd.AmdGpus, {}),
            ("amd_versions", facts_amd.AmdSmiVersion, {}),
            ("rocm_driver", facts_amd.RocmDriverVersion, {}),
        ]

    def devices(self, facts: HostFacts) -> list[Device] | FactError | None:
        if facts.amd_gpus is None or isinstance(facts.amd_gpus, FactError):
            return facts.amd_gpus
        return [Device(g.name or "AMD GPU", g.vram_bytes / GIB if g.vram_bytes is not None else None,
                       getattr(g, "device_id", None))
                for g in facts.amd_gpus]

    def begin(self, requirements: Requirements, hosts: list[HostFacts]) -> VendorRun:
        return AmdRun(requirements, hosts)


CHECKS = AmdChecks()
