"""What every vendor's hardware-health fact shares: the value it reads (:class:`HealthReading`: the events of
:mod:`k3deploy.model.health` and the node's quarantine record), the quarantine record's section and its parser, and
how the sections of one health command are run (each tool under ``timeout``, the command always ends with exit 0).

The vendor facts (:class:`k3deploy.vendors.nvidia.facts.NvidiaHealth`, :class:`k3deploy.vendors.amd.facts.AmdHealth`,
:class:`k3deploy.vendors.ascend.facts.AscendHealth`) add their tools' sections and parse them.

    >>> parse_quarantine(['{"reason": "XID 79 on GPU 0", "events": [], "when": "2026-12-05T10:00:00Z"}'])
    'XID 79 on GPU 0'
    >>> parse_quarantine([]) is None
    True
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from k3deploy.facts.base import EXIT_MARK, SECTION_MARK, Jsonable
from k3deploy.model.health import Health, HealthEvent

#: seconds each tool of a health command may run (a GPU in a bad state can hang nvidia-smi)
HEALTH_TOOL_TIMEOUT_S = 20
#: the quarantine record's file in ``k3_config_dir`` (written by the deploy, removed by the operator's release)
QUARANTINE_FILE = "quarantine"
#: the section a health command prints the quarantine record in
QUARANTINE_SECTION = "quarantine"


def quarantine_path(config_dir: str) -> str:
    """``<k3_config_dir>/quarantine``.

        >>> quarantine_path("/etc/k3deploy/")
        '/etc/k3deploy/quarantine'
    """
    return config_dir.rstrip("/") + "/" + QUARANTINE_FILE


@dataclass(frozen=True)
class HealthReading(Jsonable):
    """What a health fact read on a host: the events its tools report, and the quarantine record's reason (None: the
    node is not quarantined)."""

    events: tuple[HealthEvent, ...] = ()
    quarantined: str | None = None

    @property
    def health(self) -> Health:
        return Health.of(self.events)

    def to_json(self) -> Any:
        return {"events": [e.as_dict() for e in self.events], "quarantined": self.quarantined}


def parse_quarantine(lines: list[str]) -> str | None:
    """The reason of a quarantine record (JSON: reason, events, when); a record that is not JSON still quarantines
    the node, with its first line as the reason. None: no record."""
    text = "\n".join(lines).strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return text.splitlines()[0][:200] or "quarantined"
    reason = data.get("reason") if isinstance(data, dict) else None
    return str(reason) if reason else "quarantined"


def section(name: str, command: str, keep: str = "", ignore_case: bool = False) -> str:
    """One section of a health command: its mark, then ``command`` under ``timeout`` (stderr folded in); with
    ``keep``, only the lines matching that extended regular expression are sent back (``grep -E`` on the node).

        >>> section("ecc", "nvidia-smi -q -d ECC")
        'echo K3_SECTION=ecc; timeout 20 nvidia-smi -q -d ECC 2>&1'
        >>> section("nvlink", "nvidia-smi nvlink -s", keep="^GPU |inactive", ignore_case=True)
        "echo K3_SECTION=nvlink; timeout 20 nvidia-smi nvlink -s 2>&1 | grep -iE '^GPU |inactive'"
    """
    out = f"echo {SECTION_MARK}{name}; timeout {HEALTH_TOOL_TIMEOUT_S} {command} 2>&1"
    return f"{out} | grep -{'i' if ignore_case else ''}E {shlex.quote(keep)}" if keep else out


def quarantine_section(config_dir: str) -> str:
    """The section that prints the quarantine record, if there is one."""
    # (echo: a record written without a last newline must not run into the exit mark)
    return f"echo {SECTION_MARK}{QUARANTINE_SECTION}; cat {shlex.quote(quarantine_path(config_dir))} 2>/dev/null; echo"


def health_command(parts: list[str], config_dir: str) -> str:
    """The sections, the quarantine record, and exit 0 (a tool's failure is the tool's section's business).

        >>> health_command([], "/etc/k3deploy").endswith("echo K3_EXIT=0")
        True
    """
    return "; ".join([*parts, quarantine_section(config_dir), f"echo {EXIT_MARK}0"])

