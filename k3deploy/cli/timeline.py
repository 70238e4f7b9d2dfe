"""``k3deploy timeline INVENTORY [--group G] [--revision R] -o FILE.svg|FILE.html [--json]``: a rollout's starts as a
picture, one row per node and unit, a bar per start phase (container, rendezvous, weights, compile, KV cache, graphs,
ready) and for the gate, on one time axis; drawn from what each node recorded of its start when its group served
(:mod:`k3deploy.model.timeline`). Read-only.

Example::

    >>> writer_for("rollout.svg").__name__, writer_for("rollout.HTML").__name__
    ('svg', 'html')
    >>> writer_for("rollout.png")
    Traceback (most recent call last):
    k3deploy.errors.K3Error: -o rollout.png: give a file ending in .svg or .html
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.model.revisions import GroupHistory
    from k3deploy.model.timeline import Timeline

#: what ``-o`` writes, by its suffix: the drawing's function of :mod:`k3deploy.model.timeline`
WRITERS = {".svg": "svg", ".html": "html"}


def writer_for(output: str) -> Callable[[Timeline], str]:
    """What writes ``output`` (by its suffix), or one line saying which suffixes there are."""
    from k3deploy.model import timeline as drawing  # (jinja2: not imported for --help)

    name = WRITERS.get(Path(output).suffix.lower())
    if name is None:
        raise K3Error(f"-o {output}: give a file ending in .svg or .html")
    writer: Callable[[Timeline], str] = getattr(drawing, name)
    return writer


def revision_timeline(group: str, history: GroupHistory, revision: int | None) -> Timeline:
    """The timeline of ``revision`` of ``group`` (None: its current one), or one line saying why there is none."""
    from k3deploy.model import startup
    from k3deploy.model import timeline as drawing

    number = revision if revision is not None else history.current
    if number is None:
        raise K3Error(f"group {group}: no revision runs yet: deploy first, then k3deploy timeline draws its start")
    if number not in history.revisions:
        known = ", ".join(map(str, history.numbers)) or "none"
        raise K3Error(f"group {group} has no revision {number} (recorded: {known}): give one of them to --revision")
    starts = startup.recorded(history.startups.get(number, {}))
    if not starts:
        raise K3Error(f"group {group}: revision {number} recorded no start (it was recorded before starts were, "
                      "or its group never served): deploy a change, then draw that revision")
    return drawing.timeline(group, number, starts)


@click.command("timeline")
@click.argument("inventory")
@click.option("--group", "group", default=None, metavar="GROUP",
              help="The engine group to draw (default: the first of the rollout's).")
@click.option("--revision", type=int, default=None, metavar="N",
              help="The revision to draw (default: the current one).")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the picture: FILE.svg (an SVG drawing) or FILE.html (a page holding it).")
@json_option
def timeline(inventory: str, group: str | None, revision: int | None, output: str | None, as_json: bool) -> None:
    """Draw a rollout's starts: one row per node and unit, a bar per start phase (container, rendezvous, weights,
    compile with its cache hit or miss, KV cache, graphs, ready, each measured from the engine's own log lines) and
    for the gate (until the deploy recorded the group as serving), on one time axis. Self-contained SVG or HTML
    (nothing fetched when opened); --json: the same rows and bars.

    \b
    Example:
      k3deploy timeline inventories/gb300.py -o rollout.svg
      k3deploy timeline inventories/gb300.py --revision 3 --json
    """
    from k3deploy.runtime.gather import require_reachable
    from k3deploy.runtime.views import HISTORY

    if output is None and not as_json:
        raise K3Error("k3deploy timeline: nothing to write: give -o FILE.svg (or FILE.html), or --json")
    write = writer_for(output) if output is not None else None
    gathered = read_cluster("timeline", inventory, view=HISTORY)
    require_reachable(gathered)
    histories = gathered.history
    name = group if group is not None else next((g for g in histories if g != "router"), None)
    if name is None or name not in histories:
        raise K3Error(f"--group {group}: no such engine group: give one of {', '.join(histories) or 'none'}")
    t = revision_timeline(name, histories[name], revision)
    if output is not None and write is not None:
        Path(output).write_text(write(t))
        if not as_json:
            click.echo(f"{output}: group {t.group}, revision {t.revision}: {len(t.rows)} row(s) over {t.span:.1f} s")
    if as_json:
        echo_json(t.to_dict())

