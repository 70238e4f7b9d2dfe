"""Hardware health: what the hosts' own tools say is failing, as events, and which of them are fatal; the frame every
vendor shares. Pure: each pack's facts read its tools and build these; preflight refuses a node with a fatal event,
the deploy quarantines it, ``status`` shows it. The kinds of event, how they are shown and what to do about them are
each pack's (``Pack.health``: NVIDIA's XID, ECC, row remap and NVLink, AMD's RAS, Ascend's NPU health).

    >>> line = "NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus."
    >>> xid = HealthEvent("GPU 0", "xid", "79", line, True)
    >>> Health((xid,)).summary()
    'XID 79 on GPU 0 (fallen off the bus)'
    >>> Health().summary(), Health().fatal
    ('ok', ())
    >>> ecc = HealthEvent("GPU 1", "ecc", "correctable=12", "Volatile SRAM Correctable : 12", False)
    >>> Health((ecc, xid)).fatal == (xid,)
    True
    >>> Health((ecc,)).summary()
    'ECC correctable=12 on GPU 1 (not fatal)'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from k3deploy.vendors import PACKS

#: every pack's kinds of event, by kind (:class:`~k3deploy.vendors.base.HealthKind`: label, fix, the codes' meanings)
KINDS = {k.kind: k for pack in PACKS for k in pack.health}


@dataclass(frozen=True)
class HealthEvent:
    """One thing a host's tool reported about one device: ``device`` ("GPU 0", "NPU 3", "node"), ``kind`` ("xid",
    "ecc", "row-remap", "nvlink", "ras", "npu-health"), ``code`` ("79", "uncorrectable=2", "link 3 down"), the
    tool's own line as it printed it, and whether it is fatal (the node must not serve)."""

    device: str
    kind: str
    code: str
    text: str
    fatal: bool

    def title(self) -> str:
        """A few words for the event: the kind, the code and, for an XID, its meaning.

            >>> HealthEvent("GPU 2", "nvlink", "link 3 down", "Link 3: <inactive>", True).title()
            'NVLink link 3 down on GPU 2'
        """
        label = KIND_LABELS.get(self.kind, self.kind)
        meaning = MEANINGS.get(f"{self.kind}:{self.code}", "")
        shown = f"{label} {self.code} on {self.device}"
        if meaning:
            return f"{shown} ({meaning})"
        return shown if self.fatal else f"{shown} (not fatal)"

    def as_dict(self) -> dict[str, Any]:
        """The event as JSON (``status --json``, the quarantine record).

            >>> HealthEvent("NPU 0", "npu-health", "Alarm", "Health Status : Alarm", True).as_dict()["kind"]
            'npu-health'
        """
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> HealthEvent:
        """The inverse of :meth:`as_dict`.

            >>> e = HealthEvent("GPU 0", "xid", "79", "x", True)
            >>> HealthEvent.from_dict(e.as_dict()) == e
            True
        """
        return HealthEvent(str(data["device"]), str(data["kind"]), str(data["code"]), str(data["text"]),
                           bool(data["fatal"]))


#: how each kind of event is named when shown
KIND_LABELS = {kind: k.label for kind, k in KINDS.items()}

#: what each code of a kind means (``kind:code``), as the vendor's catalog says
MEANINGS = {f"{kind}:{code}": meaning for kind, k in KINDS.items() for code, (meaning, _) in k.codes if meaning}

#: what to do about a fatal event, by kind (a code's own by ``kind:code`` first): the node is drained either way (a
#: spare takes its place); this is how it comes back
FIXES: dict[str, str] = {
    **{f"{kind}:{code}": fix for kind, k in KINDS.items() for code, (_, fix) in k.codes if fix},
    **{kind: k.fix for kind, k in KINDS.items()},
}

#: what to do about an event of a kind no pack names (a record written by another version)
UNKNOWN_FIX = "reset the device or reboot the node; an event that comes back means the device must be replaced"


def fix_of(event: HealthEvent) -> str:
    """What to do about ``event`` (:data:`FIXES`).

        >>> fix_of(HealthEvent("GPU 0", "xid", "79", "", True)).startswith("the GPU fell off the bus")
        True
        >>> fix_of(HealthEvent("GPU 0", "xid", "48", "", True)) == FIXES["xid"]
        True
    """
    return FIXES.get(f"{event.kind}:{event.code}") or FIXES.get(event.kind) or UNKNOWN_FIX


@dataclass(frozen=True)
class Health:
    """Every event read from one host (in the order the tools printed them; an event is reported once)."""

    events: tuple[HealthEvent, ...] = ()

    @property
    def fatal(self) -> tuple[HealthEvent, ...]:
        """The events that keep the node from serving."""
        return tuple(e for e in self.events if e.fatal)

    def summary(self) -> str:
        """One line: ``ok``, or each event's title, fatal ones first.

            >>> a = HealthEvent("GPU 0", "ecc", "correctable=1", "", False)
            >>> b = HealthEvent("GPU 1", "xid", "95", "", True)
            >>> Health((a, b)).summary()
            'XID 95 on GPU 1 (uncontained ECC error); ECC correctable=1 on GPU 0 (not fatal)'
        """
        if not self.events:
            return "ok"
        ordered = sorted(self.events, key=lambda e: not e.fatal)
        return "; ".join(e.title() for e in ordered)

    def fixes(self) -> list[str]:
        """What to do about the fatal events, each fix once, in the order of the events."""
        return list(dict.fromkeys(fix_of(e) for e in self.fatal))

    def as_dicts(self) -> list[dict[str, Any]]:
        """The events as JSON, in order."""
        return [e.as_dict() for e in self.events]

    @staticmethod
    def of(events: list[HealthEvent] | tuple[HealthEvent, ...]) -> Health:
        """Health of ``events`` with repeats dropped (a kernel log repeats an XID for every retry).

            >>> e = HealthEvent("GPU 0", "xid", "79", "line", True)
            >>> len(Health.of([e, e]).events)
            1
        """
        return Health(tuple(dict.fromkeys(events)))
