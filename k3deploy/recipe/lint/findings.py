"""What the linter reports: :class:`Finding` (one problem), :class:`Selection` (one resolved selection of the
matrix), :class:`Group` (a finding with every selection it occurs in) and :class:`LintReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")
RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One problem. ``path`` is the recipe key that produced it (``hardware_overrides.amd.extra_env.X``,
    ``strategy_overrides.pd_cluster.prefill.env.Y``, ``guide``), a packaged data file
    (``strategies/pd_cluster.yaml:prefill.env.Z``, ``images.yaml:kimi-k3.amd``) or, for flags the builder
    synthesises itself, ``builder:<strategy> parallel flags``."""

    severity: str
    code: str
    message: str
    fix: str
    path: str | None = None
    roles: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str | None, str, str]:
        return (self.severity, self.code, self.path, self.message, self.fix)

    def line(self) -> str:
        where = f" [{self.path}]" if self.path else ""
        on = f" (on {', '.join(self.roles)})" if self.roles else ""
        return f"{self.code}: {self.message}{on}{where}: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "path": self.path, "message": self.message,
                "fix": self.fix, "roles": list(self.roles)}


def order(finding: Finding) -> tuple[int, str, str, str]:
    """The order findings are reported in: severity, code, path, message."""
    return (RANK[finding.severity], finding.code, finding.path or "", finding.message)


@dataclass(frozen=True)
class Selection:
    """One resolved selection of the matrix; ``extra`` are the opt-in features switched on for it."""

    hardware: str
    strategy: str
    variant: str
    features: tuple[str, ...]
    extra: tuple[str, ...] = ()
    nodes: str = ""

    def label(self) -> str:
        s = f"{self.hardware}/{self.strategy}/{self.variant}"
        return s + "".join(f" +{f}" for f in self.extra)

    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "strategy": self.strategy, "variant": self.variant,
                "features": list(self.features), "opt_in": list(self.extra), "nodes": self.nodes}


@dataclass
class Group:
    """A finding and every selection it occurs in (empty: it concerns the recipe as a whole)."""

    finding: Finding
    selections: list[Selection] = field(default_factory=list)
    roles: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        d = self.finding.to_dict()
        d["roles"] = sorted(self.roles)
        d["scope"] = "selection" if self.selections else "recipe"
        d["selections"] = [s.to_dict() for s in self.selections]
        return d


@dataclass
class LintReport:
    recipe: str
    groups: list[Group]
    checked: list[Selection]

    @property
    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in SEVERITIES}
        for g in self.groups:
            out[g.finding.severity] += 1
        return out

    @property
    def exit_code(self) -> int:
        """1 when any finding is an error, else 0."""
        return 1 if self.counts["error"] else 0

    def to_dict(self) -> dict[str, Any]:
        c = self.counts
        return {"findings": [g.to_dict() for g in self.groups],
                "summary": {"recipe": self.recipe, "selections": len(self.checked), "errors": c["error"],
                            "warnings": c["warning"], "info": c["info"], "findings": len(self.groups),
                            "exit_code": self.exit_code}}
