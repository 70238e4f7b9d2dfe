"""Ascend's preflight side: the facts it reads and the judges of its checks (preflight layer): the driver (HDK)
versions and the paths the container bind-mounts, every NPU's health, every NPU's network port, and the cross-node
round where NPU i pings NPU i of every other host (``ascend.peers``). Ids, commands and floors:
:mod:`k3deploy.vendors.ascend`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from k3deploy.facts.base import FactError, version_at_least
from k3deploy.model.requirements import Requirements
from k3deploy.preflight.base import (
    HEALTH,
    CheckResult,
    ClusterProbe,
    Device,
    FactSpec,
    HostFacts,
    ProbeRound,
    Read,
    Results,
    VendorChecks,
    VendorRun,
    as_type,
)
from k3deploy.preflight.rounds import ping_round
from k3deploy.vendors import ascend as vendor
from k3deploy.vendors.ascend import facts as facts_ascend
from k3deploy.vendors.ascend.facts import NpuInfo


@dataclass
class AscendFacts(HostFacts):
    """A host's facts on Ascend hardware: the common ones, and what Ascend's tools say (None: not read): the NPUs
    (npu-smi info), the driver's versions and the paths the container bind-mounts, and each NPU's network port
    (multi-node)."""

    npu: NpuInfo | FactError | None = None
    ascend: facts_ascend.AscendVersionInfo | FactError | None = None
    hccn: list[facts_ascend.NpuPort] | FactError | None = None  # the NPUs' network ports (multi-node Ascend)

    def read_npu(self, value: NpuInfo | FactError) -> None:
        self.npu = value

    def read_ascend(self, value: facts_ascend.AscendVersionInfo | FactError) -> None:
        self.ascend = value

    def read_hccn(self, value: list[facts_ascend.NpuPort] | FactError) -> None:
        self.hccn = value


def own(facts: HostFacts) -> AscendFacts:
    """``facts`` as Ascend's (:func:`~k3deploy.preflight.base.as_type`)."""
    return as_type(facts, AscendFacts)


def _check_ascend(out: Results, facts: AscendFacts) -> None:
    info = facts.ascend
    required = f"driver (HDK) >= {vendor.DRIVER_RECOMMENDED} recommended; version.info and mounted paths present"
    if info is None:
        return
    if isinstance(info, FactError):
        out.error(facts.host, "ascend.versions", info, required, "install the Ascend driver and firmware (HDK)")
        return
    mounts_required = vendor.PACK.check("ascend.mounts").required
    if info.missing_paths or info.empty_paths:
        parts = []
        if info.missing_paths:
            parts.append("missing " + ", ".join(info.missing_paths))
        if info.empty_paths:
            parts.append("empty directory " + ", ".join(info.empty_paths))
        shown = "; ".join(parts)
        fix = ("install the Ascend driver (HDK) package, which puts these files there, or repair its installation"
               f" ({', '.join([*info.missing_paths, *info.empty_paths])}); docker run -v does not fail on a missing "
               "host path but mounts an empty directory in its place, and the engine then finds no driver tools")
        if info.empty_paths:
            fix += ("; an empty directory where a file belongs is what such a run left behind: remove it (rmdir) "
                    "before reinstalling")
        out.add(facts.host, "ascend.mounts", "fail", shown, mounts_required, fix)
    else:
        out.add(facts.host, "ascend.mounts", "pass", "all present", mounts_required)
    if info.driver is None:
        out.add(facts.host, "ascend.versions", "fail", "no driver version.info", required,
                "install the Ascend driver (HDK)")
    elif not version_at_least(info.driver, vendor.DRIVER_RECOMMENDED):
        out.add(facts.host, "ascend.versions", "warn",
                f"driver {info.driver}, firmware {info.firmware or '?'}, "
                f"host CANN {info.cann or 'none (image ships CANN)'}",
                required,
                f"upgrade the Ascend HDK to {vendor.DRIVER_RECOMMENDED}+ as the vllm-ascend release notes ask")
    else:
        out.add(facts.host, "ascend.versions", "pass",
                f"driver {info.driver}, firmware {info.firmware or '?'}, "
                f"host CANN {info.cann or 'none (image ships CANN)'}",
                required)
    if isinstance(facts.npu, NpuInfo):
        health = vendor.PACK.check("ascend.health")
        sick = [f"NPU {c.npu} chip {c.chip}: {c.health}" for c in facts.npu.chips if c.health != "OK"]
        fatal = [c for c in facts.npu.chips if c.health in vendor.NPU_FATAL_STATES]
        if fatal:
            out.add(facts.host, "ascend.health", "fail", "; ".join(sick), health.required, health.fix)
        elif sick:
            out.add(facts.host, "ascend.health", "warn", "; ".join(sick), health.required,
                    "not fatal (a Warning is a minor alarm): the node serves; read npu-smi info -t health -i <id> -c "
                    "<chip> and watch whether it becomes an Alarm")
        else:
            out.add(facts.host, "ascend.health", "pass", f"{len(facts.npu.chips)} chips OK", health.required)


def _check_ascend_network(out: Results, sel: Requirements, facts: AscendFacts) -> None:
    """Every NPU's network port up and healthy, as vllm-ascend's multi-node guides check before a start."""
    ports = facts.hccn
    if ports is None:
        return
    count = sel.hardware.gpu_count
    required = f"every NPU (0..{count - 1}): link status UP, net health status Success"
    if isinstance(ports, FactError):
        out.error(facts.host, "ascend.network", ports, required,
                  f"install the Ascend driver (HDK), which brings {ports.tool}, and rerun preflight")
        return
    bad: list[str] = []
    ids: list[int] = []
    for p in ports:
        if p.healthy:
            continue
        ids.append(p.device)
        parts = []
        if p.link != "UP":
            parts.append(f"link {p.link or 'not read'}")
        if p.net_health != "Success":
            health = f"net health {p.net_health or 'not read'}"
            if p.net_health is not None and p.netdetect:
                health += f" (probing {p.netdetect})"
            elif p.net_health is not None:
                health += " (no netdetect address)"
            parts.append(health)
        parts += [e for e in p.errors if e.startswith(("-link", "-net_health"))]
        bad.append(f"NPU {p.device}: " + ", ".join(parts))
    if not bad:
        out.add(facts.host, "ascend.network", "pass", f"{len(ports)} NPUs: link UP, net health Success", required)
        return
    first = ids[0]
    fix = (f"check the optical module, cable and switch port of NPU {', '.join(map(str, ids))} "
           f"(hccn_tool -i {first} -link -g, -optical -g, -lldp -g) and its address, detection address and gateway "
           f"(hccn_tool -i {first} -ip -g / -netdetect -g / -gateway -g, /etc/hccn.conf); a port left down by hand: "
           f"hccn_tool -i {first} -cfg recovery")
    if any(p.net_health is not None and not p.netdetect for p in ports if p.device in ids):
        fix += f"; set a detection address: hccn_tool -i {first} -netdetect -s address <gateway of its subnet>"
    out.add(facts.host, "ascend.network", vendor.NETWORK_STATUS, "; ".join(bad), required, fix)


def peer_targets(hosts: Sequence[HostFacts]) -> dict[str, list[list[Any]]]:
    """Per host whose NPU ports were read: ``[device, vnic, ip]`` of NPU i on every other such host, for each of
    its own NPUs i (same-index pairs). Empty with fewer than two such hosts."""
    read = [own(h) for h in hosts]
    ports = {facts.host: {p.device: p for p in facts.hccn} for facts in read
             if facts.unreachable is None and isinstance(facts.hccn, list)}
    if len(ports) < 2:
        return {}
    out: dict[str, list[list[Any]]] = {}
    for host, mine in ports.items():
        out[host] = [[dev, peer[dev].vnic or "", peer[dev].ip or ""]
                     for dev in sorted(mine) for other, peer in ports.items()
                     if other != host and dev in peer and (peer[dev].vnic or peer[dev].ip)]
    return out


def peer_checks(hosts: Sequence[HostFacts], targets: dict[str, list[list[Any]]],
                got: dict[str, Any]) -> list[CheckResult]:
    """``ascend.peers``: every ping of a host's second round came back; each unreachable (NPU i -> peer address)
    named. ``got``: the host's pings (``list[NpuPing]``), or why they could not be read."""
    read = [own(h) for h in hosts]
    owner = {addr: facts.host for facts in read if isinstance(facts.hccn, list)
             for p in facts.hccn for addr in (p.vnic, p.ip) if addr}
    out: list[CheckResult] = []
    for host, wanted in targets.items():
        required = (f"NPU i reaches NPU i of every other host ({len(wanted)} same-index pings: "
                    "hccn_tool -i i -hccs_ping -g address <peer>, or -ping where -hccs_ping is unsupported)")
        pings = got.get(host)
        if not isinstance(pings, list):
            out.append(CheckResult(host, "ascend.peers", "fail", f"not read: {pings}", required,
                                   "check the connection to the host and rerun preflight"))
            continue
        done = {(p.device, p.address) for p in pings}
        bad = [f"NPU {p.device} -> {p.address} ({owner.get(p.address, '?')}) {p.method}: {p.shown}"
               for p in pings if not p.ok]
        bad += [f"NPU {dev} -> {vnic or ip} ({owner.get(vnic or ip, '?')}): not pinged (the round ran out of time, "
                "or -hccs_ping is unsupported and there is no -ip address)"
                for dev, vnic, ip in wanted if (dev, vnic) not in done and (dev, ip) not in done]
        if not bad:
            out.append(CheckResult(host, "ascend.peers", "pass",
                                   f"{len(pings)} pings to the peers' NPUs answered", required))
            continue
        out.append(CheckResult(host, "ascend.peers", vendor.NETWORK_STATUS, "; ".join(bad), required,
                               "check both ends' NPU ports (hccn_tool -i <i> -link -g / -net_health -g on each), "
                               "their addresses (-ip -g / -vnic -g, /etc/hccn.conf) and the switch or HCCS path "
                               "between them; rerun hccn_tool -i <i> -hccs_ping -g address <peer> by hand"))
    return out


class NpuPeerRound(ClusterProbe):
    """Multi-node Ascend: the NPUs talk over their own RoCE ports, which only a round across hosts can test. Once
    every host's NPU addresses are read, each host pings, from NPU i, NPU i of every other host (same-index pairs,
    what the RoCE plane connects; not every NPU pair), one command per host, all hosts at once; then
    ``ascend.peers`` per host (:func:`peer_checks`)."""

    check = "ascend.peers"

    def run(self, at: ProbeRound) -> list[CheckResult]:
        if not at.target.requirements.needs_rdma:
            return []
        targets = peer_targets(at.facts)
        if not targets:
            return []
        return peer_checks(at.facts, targets, ping_round(at.state, at.hosts, targets, facts_ascend.HccnPing))


class AscendRun(VendorRun):
    def last(self, out: Results, facts: HostFacts) -> None:
        _check_ascend(out, own(facts))
        _check_ascend_network(out, self.requirements, own(facts))


class AscendChecks(VendorChecks):
    pack = vendor.PACK
    facts_type = AscendFacts
    capture = (
        (facts_ascend.NpuSmiInfo, {}),
        (facts_ascend.AscendVersions, {}),
        (facts_ascend.HccnNetwork, {"devices": 16}),
        (facts_ascend.AscendHealth, {}),
    )

    def facts(self, requirements: Requirements) -> list[FactSpec]:
        plan: list[FactSpec] = [Read("npu", facts_ascend.NpuSmiInfo, AscendFacts.read_npu),
                                Read("ascend", facts_ascend.AscendVersions, AscendFacts.read_ascend)]
        if requirements.needs_rdma:  # across nodes (or P/D) the NPUs talk over their own ports: read them
            plan.append(Read("hccn", facts_ascend.HccnNetwork, AscendFacts.read_hccn,
                             {"devices": int(requirements.hardware.gpu_count)}))
        return plan

    def devices(self, facts: HostFacts) -> list[Device] | FactError | None:
        npu = own(facts).npu
        if npu is None or isinstance(npu, FactError):
            return npu
        return [Device(c.name, c.hbm_total_mb / 1024 if c.hbm_total_mb is not None else None) for c in npu.chips]

    def begin(self, requirements: Requirements, hosts: Sequence[HostFacts]) -> VendorRun:
        return AscendRun(requirements, hosts)

    def health(self, requirements: Requirements, config_dir: str) -> FactSpec | None:
        return Read(HEALTH, facts_ascend.AscendHealth, HostFacts.read_health, {"config_dir": config_dir})

    def probes(self) -> tuple[ClusterProbe, ...]:
        return (NpuPeerRound(),)


CHECKS = AscendChecks()
