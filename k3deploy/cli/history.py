"""``k3deploy history INVENTORY``: the numbered revisions of each group, as the hosts keep them: what was
deployed, when, from which variables, which one runs now, and which ones every host of the group holds (only
those can be restored)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.model import bench, startup
from k3deploy.model.revisions import GroupHistory, changes, masked_variables
from k3deploy.model.secrets import secret_values
from k3deploy.model.slo import Figures, read_record


@click.command("history")
@click.argument("inventory")
@json_option
def history(inventory: str, as_json: bool) -> None:
    """List each group's revisions: number, when, image, what was deployed, what changed since the revision
    before it (image, selection, each variable changed with the file that sets it; the first revision: the variables
    that differed from their defaults; secrets masked; --json has every variable too), the SLO gate's figures where
    it measured the revision (TTFT and ITL at p95, failed requests, the load, hit or miss), its last benchmark
    (k3deploy bench: TTFT and ITL at p50/p99 and output tokens/s per concurrency), which revision runs now, and
    whether each can be restored: only a revision every host of the group holds (its directory, with its unit
    and env files) can; and each node's start of it, phase by phase (container, rendezvous, weights, compile and
    its cache, KV cache, graphs, ready: seconds each, from the engine's log);
    otherwise the hosts that lack it are named. Read-only.

    \b
    Roll back to one: pyinfra INVENTORY deploy/k3.py -y --data k3_rollback=N (preview: k3deploy plan
    INVENTORY --rollback N).
    """
    from k3deploy.runtime.gather import require_reachable
    from k3deploy.runtime.views import HISTORY

    gathered = read_cluster("history", inventory, view=HISTORY)
    require_reachable(gathered)
    groups = {g: h for g, h in gathered.history.items()}
    values = secret_values(gathered.target.vars.k3_extra_env)
    subs = gathered.spares.substitutions if gathered.spares is not None else []
    fresh = set(gathered.spares.new) if gathered.spares is not None else set()
    if as_json:
        echo_json({"inventory": inventory, "groups": {
            g: {"current": h.current, "hosts": h.hosts, "marked_current": h.currents, "split": h.split_line() or None,
                "revisions": [shown(h, n, values) for n in h.numbers],
                "substitutions": [{**s.as_dict(), "new": s in fresh} for s in subs if s.group == g]}
            for g, h in groups.items()}})
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    from k3deploy.runtime.launchers import launcher_for

    if gathered.rollout is not None and launcher_for(gathered.rollout).revision_note:
        console.print(launcher_for(gathered.rollout).revision_note)
    for g, h in groups.items():
        for sub in (s for s in subs if s.group == g):   # who stands in for whom, from the nodes' records
            new = " (new: the next deploy run makes it)" if sub in fresh else ""
            console.print(f"substitution: {sub.line()}{new}", highlight=False, soft_wrap=True)
        if not h.revisions:
            console.print(f"group {g}: no revision recorded yet (the first rollout that restarts it records one)")
            continue
        table = Table("rev", "created", "image", "deployed", "changed since the revision before", "restorable",
                      "SLO gate (p95)", "bench (p50/p99)", title=f"group {g}", title_justify="left")
        for n in h.numbers:
            rev = shown(h, n, values)
            mark = f"{n} (current)" if n == h.current else str(n) if rev["served"] else f"{n} (never served)"
            image = rev["image"] + (f"\n(tag {rev['tag']})" if rev["tag"] else "")
            table.add_row(mark, rev["created"], image, rev["summary"] + (f"; {rev['note']}" if rev["note"] else ""),
                          "\n".join(rev["changes"]), "yes" if rev["restorable"] else f"no: {why_not(rev)}",
                          slo_cell(rev["slo"]), bench.cell(bench.Record.from_json(h.benches[n])
                                                           if n in h.benches else None))
        console.print(table)
        for n in h.numbers:   # where each start's time went, as the revision recorded it
            for host, units in startup.recorded(h.startups.get(n, {})).items():
                for unit, s in units.items():
                    console.print(f"group {g}: revision {n} started on {host} ({unit}): {s.line()}",
                                  highlight=False, soft_wrap=True)
        if h.split:
            console.print(h.split_line(), highlight=False, soft_wrap=True)
        for n in h.numbers:
            if not h.restorable(n):
                console.print(f"group {g}: revision {n} is not restorable: {why_not(shown(h, n, values))} (a "
                              "rollback to it is refused)", highlight=False, soft_wrap=True)
            for host, path in h.corrupt_on(n).items():
                fix = ("the next deploy writes it again from the other nodes' record (its files there hash to it)"
                       if h.rebuildable(n, host) else "its files there differ from the other nodes' record: it "
                       "cannot be written again")
                console.print(f"group {g}: the record of revision {n} on {host} is corrupt ({path}, cut short or "
                              f"unreadable); {fix}", highlight=False, soft_wrap=True)
        for n, where in sorted(h.corrupt.items()):
            if n not in h.revisions:
                console.print(f"group {g}: the record of revision {n} is corrupt on every node that keeps it "
                              f"({', '.join(f'{host}: {path}' for host, path in where.items())}): it is not "
                              "restorable", highlight=False, soft_wrap=True)


def why_not(rev: dict[str, Any]) -> str:
    """Why a revision (as :func:`shown` gives it) is not restorable: the hosts whose record is corrupt, then those
    that lack its files.

    >>> why_not({"corrupt_on": {"n2": "/etc/k3deploy/revisions/engine/1/meta.json"}, "missing_on": ["n2", "n3"]})
    'n2: its record is corrupt (/etc/k3deploy/revisions/engine/1/meta.json); n3 lacks its files'
    """
    corrupt = rev["corrupt_on"]
    lacking = [h for h in rev["missing_on"] if h not in corrupt]
    parts = [f"{h}: its record is corrupt ({path})" for h, path in corrupt.items()]
    if lacking:
        parts.append(f"{', '.join(lacking)} {'lacks' if len(lacking) == 1 else 'lack'} its files")
    return "; ".join(parts)


def shown(history: GroupHistory, number: int, values: list[str]) -> dict[str, Any]:
    """Revision ``number`` as history shows it: its record (secrets masked, whatever wrote it), whether every host of
    the group holds it (``restorable``) and the hosts that lack it (``missing_on``)."""
    rev = asdict(history.revisions[number])
    rev["variables"] = masked_variables(rev["variables"], values)
    rev["restorable"], rev["missing_on"] = history.restorable(number), history.lacking(number)
    rev["corrupt_on"] = history.corrupt_on(number)
    rev["served"] = history.served(number)
    older = [n for n in history.numbers if n < number]
    previous = history.revisions[max(older)] if older else None
    rev["changes"] = changes(previous, history.revisions[number], values)
    rev["since"] = max(older) if older else None
    figures, record = read_record(history.figures[number]) if number in history.figures else (None, {})
    rev["slo"] = {**record, "figures": figures.to_json()} if figures is not None else None
    kept = bench.Record.from_json(history.benches[number]) if number in history.benches else None
    rev["bench"] = (None if kept is None else
                    {"when": kept.when, "client": kept.client, "endpoint": kept.endpoint, "gpus": kept.gpus,
                     "load": asdict(kept.load), "figures": bench.summary(list(kept.points)),
                     "points": [asdict(p) for p in kept.points]})
    starts = startup.recorded(history.startups.get(number, {}))
    rev["startup"] = {host: {unit: s.to_dict() for unit, s in units.items()} for host, units in starts.items()}
    # each node's stage toward the revision, {step: seconds} (kept in each of its units' start records)
    rev["stage"] = {host: next(s.stage_seconds for s in units.values()) for host, units in starts.items() if units}
    return rev


def slo_cell(record: dict[str, Any] | None) -> str:
    """The SLO gate's figures of a revision, for the table: what it measured, the verdict, under which load.

    >>> slo_cell(None)
    '-'
    >>> slo_cell({"figures": Figures(20, 0, 45.0, 24.25).to_json(), "verdict": "miss",
    ...           "load": {"requests": 20, "concurrency": 4, "prompt_tokens": 256, "output_tokens": 64}})
    'miss: TTFT p95 45.0 ms, ITL p95 24.2 ms, 0 of 20 requests failed\\n(20 requests, 4 at a time, 256/64 tokens)'
    """
    if not record:
        return "-"
    figures = Figures.from_json(record["figures"])
    load = record.get("load") or {}
    verdict = record.get("verdict") or "measured"
    under = (f"\n({load['requests']} requests, {load['concurrency']} at a time, {load['prompt_tokens']}/"
             f"{load['output_tokens']} tokens)" if load else "")
    return f"{verdict}: {figures.line()}{under}"

