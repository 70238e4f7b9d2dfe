"""Numbered revisions of each engine group: what was deployed, when, and from which variables.

Every rollout that restarts a group records a new revision on each host of that group, once the group serves:
``<k3_config_dir>/revisions/<group>/<N>/`` holds the unit and env files that ran, and ``meta.json`` what they came
from (image, selection, the variables that differ from their defaults with the file that set them, the tool's
version, the time). ``<k3_config_dir>/revisions/<group>/current`` names the revision that runs. A rollback
(``k3_rollback: true`` for the previous revision, or ``k3_rollback: N``) restores revision N's files and moves
``current`` to N; the revisions themselves are never rewritten, except a record (``meta.json``) cut short on one
host, which is written again from the group's other hosts where the files it kept there hash to what they recorded
(:meth:`GroupHistory.rebuildable`). A group's hosts that name different current revisions (:attr:`GroupHistory.split`)
run what their files are (``runs_now``); ``k3_rollback: true`` goes to the newest older revision that served.
Pure: the runtime reads and writes the files.

Example::

    >>> r = Revision(group="engine", number=3, created="2026-12-03T10:00:00Z", image="img:1", summary="gb300 x2")
    >>> Revision.from_json(r.to_json()) == r
    True
    >>> rollback_target([1, 2, 3], current=3, wanted=True)
    2
    >>> rollback_target([1, 2, 3], current=3, wanted=True, runs_current=False)   # after a failed rollout
    3
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from k3deploy.errors import K3Error
from k3deploy.model.secrets import MASK, is_secret, mask_repr, scrub, secret_values


@dataclass(frozen=True)
class Revision:
    group: str
    number: int
    created: str                                   # ISO 8601, UTC
    image: str                                     # what the units run: REPO@sha256:... once a tag was resolved
    summary: str                                   # hardware x nodes, strategy, variant, features
    variables: dict[str, str] = field(default_factory=dict)   # k3_* -> "value (source)", defaults left out
    files: dict[str, str] = field(default_factory=dict)       # host:path -> sha256 of what ran
    version: str = ""
    note: str = ""                                 # e.g. "rolled back from 4"
    tag: str = ""                                  # the tag the image was resolved from (REPO:TAG), if any

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Revision:
        data: dict[str, Any] = json.loads(text)
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class GroupHistory:
    """The revisions of one group as its hosts report them: as one host lists them (``kept``: revision -> the
    files its directory holds there), or combined over the group's hosts (:func:`combine`: ``hosts`` read, ``held``:
    revision -> the hosts that hold all of its files)."""

    group: str
    revisions: dict[int, Revision] = field(default_factory=dict)
    current: int | None = None
    kept: dict[int, list[str]] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    held: dict[int, list[str]] = field(default_factory=dict)
    marked: set[int] = field(default_factory=set)   # revisions a host marked served (``served`` in its directory)
    figures: dict[int, str] = field(default_factory=dict)   # revision -> its SLO gate's record (``slo.json``)
    benches: dict[int, str] = field(default_factory=dict)   # revision -> its last benchmark (``bench.json``)
    # a record (``meta.json``) that does not parse, cut short or garbled: revision -> host -> its path (one host's
    # listing: host ""), and the sha256 of each file its directory holds there (name -> digest)
    corrupt: dict[int, dict[str, str]] = field(default_factory=dict)
    sums: dict[int, dict[str, dict[str, str]]] = field(default_factory=dict)
    currents: dict[str, int | None] = field(default_factory=dict)   # host -> the revision its ``current`` names
    runs_now: int | None = None   # where the hosts' ``current`` differ: the recorded revision their files are
    # revision -> host -> unit -> the lines of that unit's start recorded there (``startup-<unit>.log``; one host's
    # listing: host ""), read by :func:`k3deploy.model.startup.parse`
    startups: dict[int, dict[str, dict[str, tuple[str, ...]]]] = field(default_factory=dict)

    @property
    def split(self) -> bool:
        """The group's hosts do not name the same current revision (a run stopped between their marks)."""
        return len(set(self.currents.values())) > 1

    def split_line(self) -> str:
        """What a split marker is, for history, plan and the deploy (empty when it is not split)."""
        if not self.split:
            return ""
        names = ", ".join(f"{h}: {n if n is not None else 'none'}" for h, n in self.currents.items())
        runs = (f"the nodes run revision {self.runs_now}" if self.runs_now is not None
                else "the nodes run no recorded revision")
        return (f"group {self.group}: its current revision is marked differently on its nodes ({names}); {runs}: "
                "the next deploy marks it on every node")

    def corrupt_on(self, number: int) -> dict[str, str]:
        """The hosts whose record of revision ``number`` does not parse, with its path there."""
        return self.corrupt.get(number, {})

    def rebuildable(self, number: int, host: str) -> bool:
        """``host``'s record of revision ``number`` is corrupt, another host's is whole, and the files ``host``
        keeps for that revision hash to what the record says: the record can be written again."""
        rev = self.revisions.get(number)
        if rev is None or host not in self.corrupt_on(number):
            return False
        mine = {key.split(":", 1)[1].rsplit("/", 1)[-1]: digest for key, digest in rev.files.items()
                if key.split(":", 1)[0] == host}
        have = self.sums.get(number, {}).get(host, {})
        return bool(mine) and all(have.get(name) == digest for name, digest in mine.items())

    def served(self, number: int) -> bool:
        """The group served revision ``number`` once. A revision is recorded when its restart begins, so one whose
        restart failed, or was cut short, never did; revisions recorded before the mark existed (up to the current
        one) count as served."""
        return number in self.marked or (self.current is not None and number <= self.current
                                         and not self.marked)

    @property
    def newest_served(self) -> int | None:
        served = [n for n in self.revisions if self.served(n)]
        return max(served) if served else None

    @property
    def numbers(self) -> list[int]:
        return sorted(self.revisions)

    def next_number(self) -> int:
        return max([*self.revisions, *self.corrupt], default=0) + 1

    def lacking(self, number: int) -> list[str]:
        """The group's hosts that do not hold every file of revision ``number`` (a rollback to it cannot restore
        them)."""
        return [h for h in self.hosts if h not in self.held.get(number, [])]

    def restorable(self, number: int) -> bool:
        return number in self.revisions and not self.lacking(number)


def holds(rev: Revision, host: str, kept: list[str] | None) -> bool:
    """``host`` holds revision ``rev``: its directory there has ``meta.json`` and every file the revision recorded
    for that host (``kept``: what the directory holds; None: no such directory)."""
    if kept is None:
        return False
    mine = {key.split(":", 1)[1].rsplit("/", 1)[-1] for key in rev.files if key.split(":", 1)[0] == host}
    return {"meta.json", *mine} <= set(kept)


def combine(group: str, listed: list[tuple[str, GroupHistory]]) -> GroupHistory:
    """A group's history from what each of its hosts lists (``(host, history)`` in group order: the first host's
    record of a revision and its ``current`` win), with which hosts hold each revision.

    >>> rev = Revision(group="engine", number=1, created="t", image="img", summary="s",
    ...                files={"n1:/etc/k3/e.env": "0", "n2:/etc/k3/e.env": "0"})
    >>> n1 = GroupHistory("engine", {1: rev}, 1, kept={1: ["e.env", "meta.json"]})
    >>> h = combine("engine", [("n1", n1), ("n2", GroupHistory("engine", current=1))])
    >>> h.numbers, h.restorable(1), h.lacking(1)
    ([1], False, ['n2'])
    """
    revisions: dict[int, Revision] = {}
    figures: dict[int, str] = {}
    benches: dict[int, str] = {}
    corrupt: dict[int, dict[str, str]] = {}
    sums: dict[int, dict[str, dict[str, str]]] = {}
    marked: set[int] = set()
    startups: dict[int, dict[str, dict[str, tuple[str, ...]]]] = {}
    for host, h in listed:
        marked |= h.marked
        for n, by_host in h.startups.items():
            for by_unit in by_host.values():
                startups.setdefault(n, {})[host] = by_unit
        for n, rev in h.revisions.items():
            revisions.setdefault(n, rev)
        for n, record in h.figures.items():
            figures.setdefault(n, record)
        for n, record in h.benches.items():
            benches.setdefault(n, record)
        for n, paths in h.corrupt.items():
            corrupt.setdefault(n, {})[host] = next(iter(paths.values()))
        for n, by in h.sums.items():
            sums.setdefault(n, {})[host] = next(iter(by.values()))
    held = {n: [host for host, h in listed if n in h.revisions and holds(rev, host, h.kept.get(n))]
            for n, rev in revisions.items()}
    return GroupHistory(group=group, revisions=revisions, hosts=[host for host, _ in listed], held=held,
                        current=next((h.current for _, h in listed if h.current is not None), None), marked=marked,
                        figures=figures, benches=benches, corrupt=corrupt, sums=sums,
                        currents={host: h.current for host, h in listed}, startups=startups)


def revisions_dir(config_dir: str, group: str) -> str:
    return f"{config_dir.rstrip('/')}/revisions/{group}"


def rollback_target(numbers: list[int], current: int | None, wanted: bool | int, *, runs_current: bool = True,
                    served: Collection[int] | None = None) -> int:
    """Which revision a rollback goes to. ``True``: the newest one before ``current`` that served (``served``:
    the revisions that did; None: all) when the hosts run ``current``; the current revision itself when they run
    something newer that was never recorded (a rollout that failed). A number: that revision, served or not.

    >>> rollback_target([1, 2, 3], current=3, wanted=True, served=[1, 3])   # 2 never served
    1
    >>> rollback_target([1, 2, 3], current=3, wanted=2, served=[1, 3])
    2
    """
    if not numbers:
        raise K3Error("nothing to roll back to: no revision is recorded on the hosts (k3deploy history INVENTORY)")
    if wanted is True:
        if current is not None and not runs_current:
            return current
        older = [n for n in numbers if current is None or n < current]
        if not older:
            raise K3Error(f"nothing to roll back to: revision {current} is the oldest recorded "
                          f"(revisions: {', '.join(map(str, numbers))})")
        never = [n for n in older if served is not None and n not in served]
        if len(never) == len(older):
            raise K3Error(f"nothing to roll back to: no revision older than {current} ever served (never served: "
                          f"{', '.join(map(str, never))}; to go to one anyway, name it: k3_rollback={never[-1]})")
        return max(n for n in older if n not in never)
    if wanted not in numbers:
        raise K3Error(f"k3_rollback={wanted}: no such revision (recorded: {', '.join(map(str, numbers))}): "
                      "pick one from k3deploy history INVENTORY")
    return int(wanted)


def runs(rev: Revision, installed: dict[str, str | None]) -> bool:
    """The hosts run exactly ``rev``: every file it recorded has the recorded sha256 (``installed``: host:path ->
    sha256 now, None when missing)."""
    return all(installed.get(key) == digest for key, digest in rev.files.items())


def revision_for(r: Any, group: str, number: int, *, created: str, variables: dict[str, str], version: str,
                 note: str = "", tag: str = "", files: dict[str, str] | None = None) -> Revision:
    """The record of what a group runs now (``r`` a :class:`k3deploy.model.rollout.Rollout`): its image is the
    exact build (``REPO@sha256:...`` once ``tag`` was resolved), so a rollback goes back to that build. ``files``:
    ``host:path -> sha256`` of the files it runs where they are not its units' unit and env files (another
    launcher's)."""
    plan = r.plan
    units = r.group(group)
    engines = len({u.host for u in r.units if u.group != "router"})
    summary = (f"{plan.hardware} x {engines}, {plan.strategy}, variant {plan.variant}, "
               f"features {','.join(plan.features) or '-'}")
    if files is None:
        files = {}
        for u in units:
            files[f"{u.host}:{u.unit_path}"] = sha256(u.unit_text)
            files[f"{u.host}:{u.env_path}"] = sha256(u.env_text)
    # the router's own build where it runs one (k3_router_image), else the engines'
    image = r.vars.k3_router_image if group == "router" and r.vars.k3_router_image else plan.image
    return Revision(group=group, number=number, created=created, image=image, summary=summary,
                    variables=masked_variables(variables, secret_values(r.vars.k3_extra_env)), files=files,
                    version=version, note=note, tag=tag)


_VALUE_FROM = re.compile(r"^(?P<value>.*) \((?P<source>[^()]*)\)$", re.S)


def _split(recorded: str) -> tuple[str, str]:
    """A recorded variable ``"<value> (<file>)"`` -> (value, file); a value without its file -> (value, "")."""
    m = _VALUE_FROM.match(recorded)
    return (m["value"], m["source"]) if m else (recorded, "")


def changes(previous: Revision | None, rev: Revision, values: list[str] | None = None) -> list[str]:
    """What revision ``rev`` changed since ``previous`` (the revision recorded before it; None: the first one),
    one line each: the image, the selection, each variable set, changed or back to its default (with the file
    that sets it now), the tool's version. The first revision lists the variables it was deployed with. Values are
    compared as recorded and shown with secrets masked (:func:`masked_variables`, ``values``: the secrets' values).

    >>> one = Revision(group="engine", number=1, created="t", image="img:1", summary="gb300 x 2",
    ...                variables={"k3_strategy": "'multi_node_tp' (group_vars/all.yml)"}, version="0.1")
    >>> two = Revision(group="engine", number=2, created="t", image="img:1", summary="gb300 x 2", version="0.1",
    ...                variables={"k3_strategy": "'multi_node_tp' (group_vars/all.yml)",
    ...                           "k3_extra_args": "['--max-num-seqs', '64'] (group_vars/all.yml)"})
    >>> changes(one, two)
    ["k3_extra_args: default -> ['--max-num-seqs', '64'] (group_vars/all.yml)"]
    >>> changes(two, one)
    ["k3_extra_args: back to its default (was ['--max-num-seqs', '64'])"]
    >>> changes(None, one)
    ["k3_strategy = 'multi_node_tp' (group_vars/all.yml)"]
    """
    now_shown = masked_variables(rev.variables, values)
    if previous is None:
        return [f"{k} = {v}" for k, v in sorted(now_shown.items())] or ["every variable at its default"]
    was_shown = masked_variables(previous.variables, values)
    out = []
    if previous.image != rev.image:
        out.append(f"image {previous.image} -> {rev.image}")
    if previous.summary != rev.summary:
        out.append(f"{previous.summary} -> {rev.summary}")
    for k in sorted(set(previous.variables) | set(rev.variables)):
        (old, was), (new, now) = _split(was_shown.get(k, "")), _split(now_shown.get(k, ""))
        if k in rev.variables and k in previous.variables and old == new and \
                _split(previous.variables[k])[0] != _split(rev.variables[k])[0]:
            out.append(f"{k}: a secret's value changed (masked)" + (f" ({now})" if now else ""))
        elif k not in rev.variables:
            out.append(f"{k}: back to its default (was {old})")
        elif k not in previous.variables:
            out.append(f"{k}: default -> {new}" + (f" ({now})" if now else ""))
        elif old != new:
            out.append(f"{k}: {old} -> {new}" + (f" ({now})" if now else ""))
        elif was != now:
            out.append(f"{k}: same value, now set in {now or 'default'} (was {was or 'default'})")
    if previous.version != rev.version and previous.version and rev.version:
        out.append(f"k3deploy {previous.version} -> {rev.version}")
    return out or ["no change of image, selection or variables (the same files, deployed again)"]


def masked_variables(variables: dict[str, str], values: list[str] | None = None) -> dict[str, str]:
    """A revision's variables as they are kept and shown: secrets masked (by name, in a recorded mapping, and any
    of the known secret ``values``), whatever wrote them.

    >>> masked_variables({"k3_extra_env": "{'DB_PASSWORD': 'x1'} (group_vars/all.yml)"})
    {'k3_extra_env': "{'DB_PASSWORD': '****'} (group_vars/all.yml)"}
    """
    return {k: MASK if is_secret(k) else scrub(mask_repr(v), values or []) for k, v in variables.items()}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_listing(lines: list[str]) -> GroupHistory:
    """The output of :func:`k3deploy.model.commands.list_revisions` (``K3_CURRENT=``, then per revision
    ``K3_META=<path>``, its JSON, ``K3_KEPT=`` the files of its directory and, where the SLO gate measured it,
    ``K3_SLO=`` its record on one line, ``K3_BENCH=`` its last benchmark, and ``K3_STARTUP=<unit> <line>`` each
    unit's start it keeps) -> the group's history on that host. Unreadable entries are skipped.

    >>> meta = Revision(group="engine", number=1, created="t", image="img", summary="s").to_json()
    >>> h = parse_listing(["K3_CURRENT=1", "K3_META=/etc/k3deploy/revisions/engine/1/meta.json",
    ...                    *meta.splitlines(), "K3_KEPT=meta.json slo.json", 'K3_SLO={"figures": {}}',
    ...                    'K3_BENCH={"points": []}'])
    >>> h.current, h.numbers, h.figures, h.benches
    (1, [1], {1: '{"figures": {}}'}, {1: '{"points": []}'})
    >>> cut = parse_listing(["K3_CURRENT=1", "K3_META=/etc/k3deploy/revisions/engine/1/meta.json", meta[:40],
    ...                      "K3_KEPT=e.env meta.json", "K3_SUMS=ab12  e.env cd34  meta.json"])
    >>> cut.numbers, cut.corrupt, cut.sums
    ([], {1: {'': '/etc/k3deploy/revisions/engine/1/meta.json'}}, {1: {'': {'e.env': 'ab12', 'meta.json': 'cd34'}}})
    """
    current: int | None = None
    group = ""
    revisions: dict[int, Revision] = {}
    kept_by: dict[int, list[str]] = {}
    marked: set[int] = set()
    figures_by: dict[int, str] = {}
    corrupt: dict[int, dict[str, str]] = {}
    sums_by: dict[int, dict[str, dict[str, str]]] = {}
    startups: dict[int, dict[str, dict[str, tuple[str, ...]]]] = {}
    chunks: list[tuple[list[str], list[str], list[str], str, list[str], list[str]]] = []
    benches: dict[int, str] = {}   # chunk index -> its K3_BENCH line
    for line in lines:
        if line.startswith("K3_CURRENT="):
            value = line[len("K3_CURRENT="):].strip()
            current = int(value) if value.isdigit() else None
        elif line.startswith("K3_META="):
            chunks.append(([], [], [], line[len("K3_META="):].strip(), [], []))
        elif line.startswith("K3_KEPT=") and chunks:
            chunks[-1][0].extend(line[len("K3_KEPT="):].split())
        elif line.startswith("K3_SLO=") and chunks:
            chunks[-1][2].append(line[len("K3_SLO="):])
        elif line.startswith("K3_BENCH=") and chunks:
            benches[len(chunks) - 1] = line[len("K3_BENCH="):]
        elif line.startswith("K3_STARTUP=") and chunks:
            chunks[-1][5].append(line[len("K3_STARTUP="):])
        elif line.startswith("K3_SUMS=") and chunks:
            chunks[-1][4].extend(line[len("K3_SUMS="):].split())
        elif chunks:
            chunks[-1][1].append(line)
    bench_by: dict[int, str] = {}
    for i, (kept, body, figures, path, sums, started) in enumerate(chunks):
        try:
            rev = Revision.from_json("\n".join(body))
        except (ValueError, TypeError):
            number = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
            if number.isdigit():   # a record cut short: its revision, where it is, what its files hash to
                corrupt[int(number)] = {"": path}
                sums_by[int(number)] = {"": dict(zip(sums[1::2], sums[0::2], strict=False))}
            continue
        revisions[rev.number] = rev
        kept_by[rev.number] = kept
        if "served" in kept:
            marked.add(rev.number)
        if figures:
            figures_by[rev.number] = figures[-1]
        if i in benches:
            bench_by[rev.number] = benches[i]
        for entry in started:
            unit, _, text = entry.partition(" ")
            by_unit = startups.setdefault(rev.number, {}).setdefault("", {})
            by_unit[unit] = (*by_unit.get(unit, ()), text)
        group = rev.group
    return GroupHistory(group=group, revisions=revisions, current=current, kept=kept_by, marked=marked,
                        figures=figures_by, benches=bench_by, corrupt=corrupt, sums=sums_by, startups=startups)
