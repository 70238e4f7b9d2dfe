"""The preflight of a cluster as one typed result: what was required, each host's facts, every check's result
and the settings derived per host (:func:`check`). Pure: it takes facts already read.

Example::

    >>> report = check(requirements, facts)                 # doctest: +SKIP
    >>> report.ok, [f.line() for f in report.failures()]    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from k3deploy.model.requirements import Requirements
from k3deploy.preflight.checks import CheckResult, HostFacts, failed_hosts, run_checks, summarize
from k3deploy.preflight.settings import HostSettings, derive_settings


@dataclass(frozen=True)
class Failure:
    """One failed check on one host (``host`` is ``"cluster"`` for cluster-wide checks)."""

    host: str
    check: str
    observed: str
    required: str
    fix: str

    def line(self) -> str:
        return f"{self.check}: observed {self.observed}; required {self.required}" + (
            f"; fix: {self.fix}" if self.fix else "")


@dataclass
class PreflightReport:
    requirements: Requirements
    hosts: list[HostFacts]
    results: list[CheckResult]
    settings: dict[str, HostSettings] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(r.status == "fail" for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def failures(self) -> list[Failure]:
        return [Failure(r.host, r.check, r.observed, r.required, r.fix) for r in self.results if r.status == "fail"]

    def failures_by_host(self) -> dict[str, list[Failure]]:
        out: dict[str, list[Failure]] = {}
        for f in self.failures():
            out.setdefault(f.host, []).append(f)
        return out

    def unreachable(self) -> dict[str, str]:
        """Hosts that could not be reached, with the reason."""
        return {f.host: f.unreachable for f in self.hosts if f.unreachable is not None}

    def host_env(self) -> dict[str, dict[str, str]]:
        return {h: dict(s.env) for h, s in self.settings.items()}

    def to_dict(self) -> dict[str, Any]:
        req = self.requirements
        hosts: dict[str, Any] = {}
        for f in self.hosts:
            data = dataclasses.asdict(f)
            name = data.pop("host")
            unreachable = data.pop("unreachable")
            address = data.pop("address")
            data.pop("extra")
            data.pop("ib_hca")  # a setting, not a fact: it shows in the settings' reasons
            data.pop("iface")  # k3_iface, likewise
            s = self.settings.get(name)
            hosts[name] = {
                "address": address,
                "reachable": unreachable is None,
                "error": unreachable,
                "ok": not any(r.status == "fail" and r.host == name for r in self.results),
                "results": [dataclasses.asdict(r) for r in self.results if r.host == name],
                "settings": dict(s.env) if s else {},
                "settings_reasons": dict(s.reasons) if s else {},
                "peermem_required": bool(s and s.peermem_required),
                "facts": {k: v for k, v in data.items() if v is not None},
            }
        return {
            "selection": {
                "hardware": req.hardware.id,
                "strategy": req.strategy,
                "variant": req.variant,
                "nodes": req.nodes,
                "vram_minimum_gb": req.vram_minimum_gb,
            },
            "ok": self.ok,
            "summary": summarize(self.results),
            "failed_hosts": failed_hosts(self.results),
            "hosts": hosts,
            "cluster": [dataclasses.asdict(r) for r in self.results if r.host == "cluster"],
        }


def check(requirements: Requirements, facts: list[HostFacts]) -> PreflightReport:
    """Run every check over the hosts' facts and derive each host's settings."""
    return PreflightReport(requirements=requirements, hosts=facts, results=run_checks(requirements, facts),
                           settings={f.host: derive_settings(requirements, f) for f in facts})
