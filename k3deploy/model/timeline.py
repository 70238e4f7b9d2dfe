"""A rollout's starts as a picture: one row per node and unit, a bar per stage step, per start phase and for the
gate, on one axis.

:func:`timeline` lays out a revision's recorded starts (:func:`k3deploy.model.startup.recorded`: ``{host: {unit:
Startup}}``) on a common time axis (seconds after the first of them began: a node's stage or a unit's start): each
step of the node's stage toward it where it ran (``image_pull``, ``weights_download``, ``from_peer``, ...: the
node's stage record, :func:`k3deploy.model.steps.timed_stage`; a node whose stage did nothing has none), each
phase's bar where it ran, and the ``gate`` (from the end of the unit's last phase to when the deploy recorded the
group as serving). Every position is computed here; the SVG template (``k3deploy/data/templates/k3-timeline.svg.j2``)
and the HTML page around it only place what they are given, escaped here. ``k3deploy timeline`` writes it
(``k3deploy/cli/timeline.py``). Pure.

Example::

    >>> from k3deploy.model.startup import Startup
    >>> s = Startup(begun=100.0, phases=(("container", 0.0, 1.0), ("weights", 1.0, 4.0)), gate=106.0, complete=True)
    >>> t = timeline("engine", 3, {"n1": {"k3-engine.service": s}})
    >>> [(b.phase, b.start, b.seconds) for b in t.rows[0].bars]
    [('container', 0.0, 1.0), ('weights', 1.0, 4.0), ('gate', 5.0, 1.0)]
    >>> t.span
    6.0
    >>> staged = Startup(begun=100.0, phases=(("container", 0.0, 1.0),), stage=(("weights_download", 90.0, 98.5),))
    >>> [(b.phase, b.start, b.seconds) for b in timeline("engine", 3, {"n1": {"u": staged}}).rows[0].bars]
    [('weights_download', 0.0, 8.5), ('container', 10.0, 1.0)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from html import escape
from typing import Any

from k3deploy.model.startup import PHASES, Startup
from k3deploy.model.units import render_template

#: each bar's colour (the phases of a start, then the gate)
COLOURS: dict[str, str] = {"container": "#9e9e9e", "rendezvous": "#ffb74d", "weights": "#42a5f5",
                           "compile": "#ab47bc", "kv_cache": "#26a69a", "graphs": "#ef5350", "ready": "#66bb6a",
                           "gate": "#cfd8dc",
                           # the node's stage (:data:`k3deploy.model.steps.STAGE_BARS`)
                           "image_pull": "#5c6bc0", "image_load": "#7986cb", "image_export": "#9fa8da",
                           "image_file": "#3949ab", "image_copy": "#3f51b5", "weights_download": "#8d6e63",
                           "weights_copy": "#795548", "weights_verify": "#a1887f",
                           "weights_check": "#bcaaa4", "from_peer": "#26c6da", "image_from_peer": "#4dd0e1",
                           "weights_from_peer": "#00acc1", "compile_caches": "#ce93d8",
                           "verify": "#d4e157", "router_image": "#78909c", "readahead": "#ffee58"}
#: a stage step's bar without a colour of its own (a later round from a peer: ``from_peer_2``)
OTHER = "#b0bec5"
#: the drawing's geometry, pixels: the label column, the plot's width, a row's height, the axis' room
LABEL_W, PLOT_W, ROW_H, TOP, BOTTOM = 260, 900, 26, 40, 70


@dataclass(frozen=True)
class Bar:
    phase: str
    start: float          # seconds after the timeline's origin
    seconds: float
    note: str = ""        # e.g. the compile cache: hit / miss


@dataclass(frozen=True)
class Row:
    host: str
    unit: str
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class Timeline:
    """A revision's starts: its rows, the origin (epoch seconds) and the span (seconds) the axis covers."""

    group: str
    revision: int
    origin: float | None
    span: float
    rows: tuple[Row, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timeline(group: str, revision: int, starts: Mapping[str, Mapping[str, Startup]]) -> Timeline:
    """The rows of ``starts`` (``{host: {unit: Startup}}``) on one axis."""
    begun = [t for units in starts.values() for s in units.values()
             for t in (*([s.begun] if s.begun is not None else []), *(b for _, b, _ in s.stage))]
    origin = min(begun) if begun else None
    rows = []
    end = 0.0
    for host, units in starts.items():
        for unit, s in units.items():
            shift = (s.begun - origin) if s.begun is not None and origin is not None else 0.0
            bars = [Bar(name, round(began - origin, 3), round(ended - began, 3), "stage")
                    for name, began, ended in s.stage if origin is not None]
            bars += [Bar(name, round(shift + start, 3), length,
                         s.compile_cache or "" if name == "compile" else "") for name, start, length in s.phases]
            last = shift + s.total
            if s.gate is not None and origin is not None and s.gate - origin > last:
                bars.append(Bar("gate", round(last, 3), round(s.gate - origin - last, 3)))
            end = max([end, *(b.start + b.seconds for b in bars)])
            rows.append(Row(host, unit, tuple(bars)))
    return Timeline(group, revision, origin, round(end, 3), tuple(rows))


def _step(span: float) -> float:
    """A round tick interval that gives 4 to 10 ticks over ``span``.

    >>> _step(6.1), _step(95.0), _step(0.4)
    (1.0, 20.0, 0.05)
    """
    raw = max(span, 1e-3) / 8
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def svg(drawn: Timeline) -> str:
    """The timeline as a self-contained SVG drawing (no script, no outside reference)."""
    scale = PLOT_W / (drawn.span or 1.0)
    rects: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    for i, row in enumerate(drawn.rows):
        y = TOP + i * ROW_H
        labels.append({"x": LABEL_W - 8, "y": y + ROW_H * 0.65, "text": escape(f"{row.host} {row.unit}")})
        for b in row.bars:
            note = " (stage)" if b.note == "stage" else f" (cache {b.note})" if b.note else ""
            rects.append({"x": round(LABEL_W + b.start * scale, 2), "y": y + 3,
                          "width": round(b.seconds * scale, 2), "height": ROW_H - 6,
                          "fill": COLOURS.get(b.phase, OTHER),
                          "phase": escape(b.phase), "host": escape(row.host), "unit": escape(row.unit),
                          "kind": "stage" if b.note == "stage" else "gate" if b.phase == "gate" else "start",
                          "seconds": b.seconds, "title": escape(f"{row.host} {row.unit}: {b.phase}{note} "
                                                                f"{b.seconds:.2f} s from {b.start:.2f} s")})
    bottom = TOP + len(drawn.rows) * ROW_H
    step = _step(drawn.span)
    ticks = [{"x": round(LABEL_W + k * step * scale, 2), "label": f"{k * step:g} s"}
             for k in range(int(drawn.span / step + 1e-9) + 1)]
    staged = list(dict.fromkeys(b.phase for row in drawn.rows for b in row.bars if b.note == "stage"))
    legend = [{"x": LABEL_W + (i % 8) * 110, "y": bottom + 40 + (i // 8) * 20, "fill": COLOURS.get(name, OTHER),
               "label": escape(name)} for i, name in enumerate((*staged, *PHASES, "gate"))]
    return render_template("k3-timeline.svg.j2", width=LABEL_W + PLOT_W + 40,
                           height=bottom + BOTTOM + (len(legend) - 1) // 8 * 20,
                           title=escape(f"group {drawn.group}, revision {drawn.revision}: each node's stage, step "
                                        "by step, and its start, phase by phase (seconds after the first began)"),
                           rects=rects, labels=labels, ticks=ticks, axis_y=bottom, plot_x=LABEL_W,
                           plot_end=LABEL_W + PLOT_W, legend=legend)


def html(drawn: Timeline) -> str:
    """The SVG drawing in a page of its own (nothing fetched from a network)."""
    return render_template("k3-timeline.html.j2", title=escape(f"k3deploy timeline: group {drawn.group}, revision "
                                                              f"{drawn.revision}"), drawing=svg(drawn))
