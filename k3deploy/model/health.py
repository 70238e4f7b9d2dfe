"""Hardware health: what the hosts' own tools say is failing (GPU XID events, ECC and row-remap counters, NVLink
links down, AMD RAS and ECC, Ascend NPU health), as events, and which of them are fatal. Pure: the facts read the
tools and build these; preflight refuses a node with a fatal event, the deploy quarantines it, ``status`` shows it.

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

from k3deploy.vendors import nvidia as nvidia_pack

#: NVIDIA's XID catalog as far as the health check reads it (``code -> (meaning, fatal)``) and the NVLink5 XIDs whose
#: line says whether they are fatal: the NVIDIA pack's data (:mod:`k3deploy.vendors.nvidia`), named here for the events
XID_CODES, NVLINK5_XIDS = nvidia_pack.XID_CODES, nvidia_pack.NVLINK5_XIDS


def xid_event(device: str, code: str, text: str) -> HealthEvent:
    """One XID line's event: its meaning and fatality from :data:`XID_CODES` (an unknown code is not fatal; an NVLink5
    XID is fatal where its line says ``Fatal``).

        >>> xid_event("GPU 00000000:1B:00.0", "48", "...").fatal
        True
        >>> xid_event("GPU 0", "13", "...").fatal, xid_event("GPU 0", "999", "...").fatal
        (False, False)
        >>> xid_event("GPU 1", "145", "145, RLW_RXPIPE Nonfatal XC0 i0 Link 13").fatal
        False
    """
    fatal = XID_CODES.get(code, ("", False))[1]
    if code in NVLINK5_XIDS:
        fatal = " Fatal " in f" {text} "
    return HealthEvent(device, "xid", code, text, fatal)


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
        meaning = XID_CODES.get(self.code, ("", False))[0] if self.kind == "xid" else ""
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
KIND_LABELS = {"xid": "XID", "ecc": "ECC", "row-remap": "row remap", "nvlink": "NVLink", "ras": "ECC",
               "npu-health": "NPU health"}


#: what to do about a fatal event, by kind (an XID by ``xid:<code>`` first): the node is drained either way (a spare
#: takes its place); this is how it comes back
FIXES: dict[str, str] = {
    "xid:79": "the GPU fell off the bus: reseat or replace the GPU or tray (check its power and PCIe/riser), then "
              "power-cycle the node; a GPU reset cannot reach it",
    "xid:74": "an NVLink error: check the GPU's NVLink cables and the NVLink switch tray (nvidia-smi nvlink -s, "
              "nvidia-smi nvlink -e), then reset the GPU (nvidia-smi -r -i N) or reboot",
    "xid:64": "the GPU could not remap a failing memory row: run NVIDIA's field diagnostic and replace the GPU (RMA)",
    "xid": "reset the GPU (nvidia-smi -r -i N, engines stopped) or reboot the node; an XID stays in the kernel log "
           "until the next boot, and one that comes back means the GPU must be replaced",
    "ecc": "reset the GPU (nvidia-smi -r -i N, engines stopped) or reboot: it applies the pending row remap and "
           "clears the volatile counters; errors that come back mean the GPU must be replaced",
    "row-remap": "a pending remap: reset the GPU (nvidia-smi -r -i N) or reboot to apply it; a remapping failure: "
                 "run NVIDIA's field diagnostic and replace the GPU (RMA)",
    "nvlink": "an NVLink link is down: check the tray's NVLink cables or cartridge and the NVLink switch trays, then "
              "reset the GPU or reboot the tray; a link that stays down means the tray must be repaired",
    "ras": "uncorrectable memory errors: reboot the node (the driver retires the bad pages, amd-smi bad-pages lists "
           "them); errors that come back mean the GPU must be replaced",
    "npu-health": "read the NPU's error code (npu-smi info -t health -i N) in the product's black-box error code list, "
                  "then reset the NPU (npu-smi set -t reset -i N -c 0) or reboot; replace it if the alarm comes back",
}


def fix_of(event: HealthEvent) -> str:
    """What to do about ``event`` (:data:`FIXES`).

        >>> fix_of(HealthEvent("GPU 0", "xid", "79", "", True)).startswith("the GPU fell off the bus")
        True
        >>> fix_of(HealthEvent("GPU 0", "xid", "48", "", True)) == FIXES["xid"]
        True
    """
    return FIXES.get(f"{event.kind}:{event.code}") or FIXES.get(event.kind) or FIXES["xid"]


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
