"""Hardware health: what the hosts' own tools say is failing, as events, and which of them are fatal. Pure.

    >>> Health().summary(), Health().fatal
    ('ok', ())
    >>> xid = HealthEvent("GPU 0", "xid", "79", "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.", True)
    >>> Health((xid,)).fatal == (xid,)
    True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthEvent:
    device: str      # "GPU 0" / "GPU 00000000:1B:00.0" / "NPU 3" / "node"
    kind: str        # "xid", "ecc", "row-remap", "nvlink", "ras", "npu-health", ...
    code: str        # "79", "48", "uncorrectable=2", "link 3 down", ...
    text: str        # the tool's own line, as it printed it
    fatal: bool      # True: the node must not serve (quarantine)


@dataclass(frozen=True)
class Health:
    events: tuple[HealthEvent, ...] = ()

    @property
    def fatal(self) -> tuple[HealthEvent, ...]:
        return tuple(e for e in self.events if e.fatal)

    def summary(self) -> str:
        """One line: "ok" or each event, fatal ones first."""
        if not self.events:
            return "ok"
        ordered = sorted(self.events, key=lambda e: not e.fatal)
        return "; ".join(f"{e.kind.upper()} {e.code} on {e.device}" for e in ordered)
