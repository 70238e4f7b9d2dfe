"""Hot spares: the hosts of the inventory group ``spares`` stand by (checked by preflight, the image and the weights
staged on them) and run nothing. When a member of a group is lost (unreachable, or quarantined for a fatal hardware
event), the next deploy run gives its rank and role to a spare, restarts the group in rendezvous order and records
the substitution on the nodes. The site's inventory file is never edited: every run builds its rollout from the
inventory with the recorded substitutions applied (:func:`apply`). Pure: the runtime reads and writes the records.

What the nodes keep, in ``k3_config_dir``:

- ``substitutions.json``: the substitutions in effect, oldest first, ``[{group, rank, lost, spare, why, when}]``
  (on every node the deploy reaches; the reading is their union);
- ``quarantine``: the node is quarantined (JSON: ``reason``, ``events``, ``when``): it runs nothing and is no spare
  until the operator releases it (``k3deploy spares INVENTORY --release NODE``);
- ``quarantine.released``: the events the operator released it from; they do not quarantine it again (a new
  event does);
- ``fence``: who holds each rank of the deployment, at an epoch that every change of it raises, and the addresses of
  the deployment's hosts (:class:`Fence`): an engine unit starts only where its node still holds its rank in the
  newest record it finds on the node or on its peers (``k3-group-member holds``; docs/spares.md, *Fencing*).

Example::

    >>> recs = [HostRecord("n1", ("head",), {"rank": 0}), HostRecord("n2", ("workers",), {"rank": 1}),
    ...         HostRecord("n3", ("spares",), {})]
    >>> sub = Substitution("engine", 1, "n2", "n3", "unreachable", "2026-12-05T10:00:00Z")
    >>> [(r.name, r.groups, r.data.get("rank")) for r in apply(recs, [sub])[0]]
    [('n1', ('head',), 0), ('n3', ('workers',), 1), ('n2', ('spares',), None)]
    >>> sub.line()
    'group engine rank 1: n3 in place of n2 (unreachable), since 2026-12-05T10:00:00Z'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from k3deploy.model.binding import HostRecord
from k3deploy.model.health import Health
from k3deploy.model.inventory import ROLE_GROUPS, SPARES
from k3deploy.model.rollout import Placement, Rollout, group_order

#: the records' file names in ``k3_config_dir``
SUBSTITUTIONS_FILE = "substitutions.json"
QUARANTINE_FILE = "quarantine"
RELEASED_FILE = "quarantine.released"
FENCE_FILE = "fence"
#: a host's place in its group: what a spare takes over from the member it replaces
PLACE_KEYS = ("rank", "k3_replica")


@dataclass(frozen=True)
class Substitution:
    """``spare`` runs rank ``rank`` of ``group`` in place of ``lost``, since ``when`` (UTC, ISO 8601), because of
    ``why`` (``unreachable: ...`` or ``quarantined: ...``)."""

    group: str
    rank: int
    lost: str
    spare: str
    why: str
    when: str

    def line(self) -> str:
        return (f"group {self.group} rank {self.rank}: {self.spare} in place of {self.lost} ({self.why}), "
                f"since {self.when}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Unfilled:
    """A lost member no spare could replace."""

    group: str
    rank: int
    lost: str
    why: str

    def line(self) -> str:
        """
        >>> Unfilled("engine", 1, "n2", "unreachable: timed out").line()
        'group engine: n2 (rank 1) is lost (unreachable: timed out) and no spare is left'
        """
        return f"group {self.group}: {self.lost} (rank {self.rank}) is lost ({self.why}) and no spare is left"


def parse_substitutions(text: str | None) -> list[Substitution]:
    """The substitutions of a ``substitutions.json`` (none for a missing, empty or unreadable file).

    >>> parse_substitutions('[{"group": "engine", "rank": 1, "lost": "n2", "spare": "n3", "why": "x", "when": "t"}]')
    [Substitution(group='engine', rank=1, lost='n2', spare='n3', why='x', when='t')]
    >>> parse_substitutions("not json"), parse_substitutions(None)
    ([], [])
    """
    try:
        data = json.loads(text or "[]")
    except ValueError:
        return []
    out = []
    for item in data if isinstance(data, list) else []:
        try:
            out.append(Substitution(str(item["group"]), int(item["rank"]), str(item["lost"]), str(item["spare"]),
                                    str(item.get("why", "")), str(item.get("when", ""))))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def substitutions_text(subs: Sequence[Substitution]) -> str:
    """``substitutions.json`` holding ``subs``.

    >>> parse_substitutions(substitutions_text([Substitution("engine", 1, "n2", "n3", "x", "t")]))[0].spare
    'n3'
    """
    return json.dumps([s.as_dict() for s in subs], indent=1, sort_keys=True) + "\n"


def merged(lists: Iterable[Sequence[Substitution]]) -> list[Substitution]:
    """The substitutions every node lists, once each, oldest first (what the deployment has in effect).

    >>> a, b = Substitution("engine", 1, "n2", "n3", "x", "t1"), Substitution("engine", 0, "n1", "n4", "y", "t2")
    >>> merged([[b, a], [a]]) == [a, b]
    True
    """
    return sorted({s for subs in lists for s in subs}, key=lambda s: (s.when, s.group, s.rank, s.lost, s.spare))


@dataclass(frozen=True)
class Quarantine:
    """A quarantined node's record: why, the fatal events (as the health facts gave them), when."""

    reason: str
    events: tuple[dict[str, Any], ...] = ()
    when: str = ""

    def to_json(self) -> str:
        return json.dumps({"reason": self.reason, "events": list(self.events), "when": self.when}, indent=1,
                          sort_keys=True) + "\n"

    @staticmethod
    def from_text(text: str | None) -> Quarantine | None:
        """A ``quarantine`` file's record (None: no file); a file that is not this JSON still quarantines the node,
        its first line as the reason (an operator may write one by hand).

        >>> Quarantine.from_text(Quarantine("XID 79 on GPU 0", when="t").to_json()).reason
        'XID 79 on GPU 0'
        >>> Quarantine.from_text("drained by hand\\n").reason, Quarantine.from_text(None)
        ('drained by hand', None)
        """
        if text is None:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            return Quarantine(first[:200] or "quarantined (an empty quarantine file)")
        events = tuple(e for e in data.get("events", []) if isinstance(e, dict))
        return Quarantine(str(data.get("reason") or "quarantined"), events, str(data.get("when", "")))


def _event_key(event: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (str(event.get("device", "")), str(event.get("kind", "")), str(event.get("code", "")),
            str(event.get("text", "")))


def quarantine_for(health: Health, released: Sequence[Mapping[str, Any]], when: str) -> Quarantine | None:
    """The quarantine a host's health asks for: its fatal events, less those the operator released it from; None
    when none is left.

    >>> from k3deploy.model.health import HealthEvent
    >>> xid = HealthEvent("GPU 0", "xid", "79", "Xid 79", True)
    >>> quarantine_for(Health((xid,)), [], "t").reason
    'XID 79 on GPU 0 (fallen off the bus)'
    >>> quarantine_for(Health((xid,)), [xid.as_dict()], "t") is None, quarantine_for(Health(), [], "t") is None
    (True, True)
    """
    gone = {_event_key(e) for e in released}
    fatal = [e for e in health.fatal if _event_key(e.as_dict()) not in gone]
    if not fatal:
        return None
    return Quarantine("; ".join(e.title() for e in fatal), tuple(e.as_dict() for e in fatal), when)


def parse_released(text: str | None) -> list[dict[str, Any]]:
    """The events of a ``quarantine.released`` file (none for a missing or unreadable one)."""
    try:
        data = json.loads(text or "[]")
    except ValueError:
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def released_text(before: Sequence[Mapping[str, Any]], quarantine: Quarantine | None) -> str:
    """``quarantine.released`` after a release: the events released before and those of ``quarantine``.

    >>> q = Quarantine("x", ({"device": "GPU 0", "kind": "xid", "code": "79", "text": "t", "fatal": True},), "t")
    >>> len(parse_released(released_text([], q))), len(parse_released(released_text(q.events, q)))
    (1, 1)
    """
    events = list(before)
    keys = {_event_key(e) for e in events}
    for e in quarantine.events if quarantine is not None else ():
        if _event_key(e) not in keys:
            events.append(dict(e))
            keys.add(_event_key(e))
    return json.dumps(events, indent=1, sort_keys=True) + "\n"


# --------------------------------------------------------------------------------------------- the model


def is_spare(record: HostRecord) -> bool:
    """The host stands by: in group ``spares`` and in no role group."""
    return SPARES in record.groups and not set(ROLE_GROUPS) & set(record.groups)


def apply(records: Sequence[HostRecord], subs: Sequence[Substitution]) -> tuple[list[HostRecord], list[Substitution]]:
    """The records with ``subs`` applied in order (each spare takes its lost member's place in the list, role
    groups, ``rank`` and ``k3_replica``; the lost member becomes a host of ``spares`` without a rank), and the
    substitutions that applied. One that no longer fits the inventory (a host gone from it, a spare that is in a
    role group now, a lost member that is in none: the site made it permanent) is left out."""
    out = list(records)
    applied: list[Substitution] = []

    def others(record: HostRecord) -> tuple[str, ...]:
        return tuple(g for g in record.groups if g not in ROLE_GROUPS and g != SPARES)

    for sub in subs:
        names = [r.name for r in out]
        if sub.lost not in names or sub.spare not in names:
            continue
        i, j = names.index(sub.lost), names.index(sub.spare)
        lost, spare = out[i], out[j]
        roles = tuple(g for g in lost.groups if g in ROLE_GROUPS)
        if not roles or not is_spare(spare):
            continue
        placed = {k: v for k, v in spare.data.items() if k not in PLACE_KEYS}
        placed.update({k: lost.data[k] for k in PLACE_KEYS if k in lost.data})
        out[i] = HostRecord(spare.name, (*others(spare), *roles), placed, spare.origins)
        out[j] = HostRecord(lost.name, (*others(lost), SPARES),
                            {k: v for k, v in lost.data.items() if k not in PLACE_KEYS}, lost.origins)
        applied.append(sub)
    return out, applied


def places(rollout: Placement) -> dict[str, tuple[str, int]]:
    """host -> (group, rank) of the unit it runs (its engine's, where it also runs the router), in unit order."""
    out: dict[str, tuple[str, int]] = {}
    for u in sorted(rollout.units, key=lambda u: u.group == "router"):
        out.setdefault(u.host, (u.group, u.rank))
    return out


def choose(placed: Mapping[str, tuple[str, int]], lost: Mapping[str, str],
           candidates: Sequence[str], when: str) -> tuple[list[Substitution], list[Unfilled]]:
    """A spare for each lost member (``lost``: host -> why), in start order (groups, then ranks), the spares taken in
    inventory order (``candidates``); the members left without one.

    >>> placed = {"n1": ("engine", 0), "n2": ("engine", 1)}
    >>> new, left = choose(placed, {"n2": "unreachable", "n1": "quarantined"}, ["n3"], "t")
    >>> [(s.lost, s.spare, s.rank) for s in new], [u.lost for u in left]
    ([('n1', 'n3', 0)], ['n2'])
    """
    free = list(candidates)
    new: list[Substitution] = []
    left: list[Unfilled] = []
    for host in sorted((h for h in lost if h in placed), key=lambda h: (group_order(placed[h][0]), placed[h])):
        group, rank = placed[host]
        if free:
            new.append(Substitution(group, rank, host, free.pop(0), lost[host], when))
        else:
            left.append(Unfilled(group, rank, host, lost[host]))
    return new, left


@dataclass(frozen=True)
class Settled:
    """Who runs what once the spares are taken into account: the records the rollout is built from, the
    substitutions in effect (``new``: those this reading chose, which the next deploy run records), the lost members
    no spare replaces, the spares standing by, and each host that runs nothing with why (lost, quarantined, a spare
    that fails a check)."""

    records: list[HostRecord]
    substitutions: list[Substitution] = field(default_factory=list)
    new: list[Substitution] = field(default_factory=list)
    unfilled: list[Unfilled] = field(default_factory=list)
    standby: list[str] = field(default_factory=list)
    out: dict[str, str] = field(default_factory=dict)

    @property
    def lost(self) -> set[str]:
        """The members replaced by a spare."""
        return {s.lost for s in self.substitutions}

    def lines(self) -> list[str]:
        """For people: each substitution (a new one: what the next deploy run does), each lost member without a
        spare, each host that runs nothing, the spares standing by."""
        fresh = set(self.new)
        out = [s.line() + (" (new: the next deploy run makes it)" if s in fresh else "") for s in self.substitutions]
        out += [u.line() for u in self.unfilled]
        out += [f"{host} runs nothing: {why}" for host, why in self.out.items()]
        if self.standby:
            out.append(f"spares standing by: {', '.join(self.standby)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        fresh = set(self.new)
        return {"substitutions": [{**s.as_dict(), "new": s in fresh} for s in self.substitutions],
                "unfilled": [asdict(u) for u in self.unfilled], "standby": list(self.standby),
                "out": dict(self.out)}


def settle(records: Sequence[HostRecord], recorded: Sequence[Substitution],
           placed_of: Callable[[list[HostRecord]], Mapping[str, tuple[str, int]]], *,
           unreachable: Mapping[str, str], quarantined: Mapping[str, str], unusable: Mapping[str, str],
           when: str) -> Settled:
    """The substitutions ``recorded`` on the nodes applied to the inventory's ``records``, then a spare chosen for
    every member that is lost now (``unreachable``: host -> the connection error; ``quarantined``: host -> why).
    ``placed_of(records)`` says where each host runs (:func:`places` of their layout). A spare takes a rank only when
    it is reachable, not quarantined and not ``unusable`` (host -> the check it fails).

    >>> recs = [HostRecord("n1", ("head",), {}), HostRecord("n2", ("workers",), {}),
    ...         HostRecord("n3", ("spares",), {}), HostRecord("n4", ("spares",), {})]
    >>> def placed_of(rs):
    ...     return {r.name: ("engine", i) for i, r in enumerate(x for x in rs if not is_spare(x))}
    >>> s = settle(recs, [], placed_of, unreachable={"n2": "timed out"}, quarantined={}, unusable={}, when="t")
    >>> [r.name for r in s.records], [(x.lost, x.spare) for x in s.new], s.standby, s.out
    (['n1', 'n3', 'n2', 'n4'], [('n2', 'n3')], ['n4'], {'n2': 'unreachable: timed out'})
    """
    recs, applied = apply(records, recorded)
    placed = placed_of(recs)
    bad = {**{h: f"unreachable: {why}" for h, why in unreachable.items()},
           **{h: f"quarantined: {why}" for h, why in quarantined.items()}}
    lost = {h: bad[h] for h in placed if h in bad}
    candidates = [r.name for r in recs if is_spare(r) and r.name not in bad and r.name not in unusable]
    new, unfilled = choose(placed, lost, candidates, when)
    recs, _ = apply(recs, new)
    taken = {s.spare for s in new}
    kept = {u.lost for u in unfilled}
    running = {*placed, *taken} - {s.lost for s in new}
    out = {r.name: bad.get(r.name) or f"a spare that fails {unusable[r.name]}" for r in recs
           if r.name not in running and r.name not in kept and (r.name in bad or r.name in unusable)}
    return Settled(recs, [*applied, *new], new, unfilled, [c for c in candidates if c not in taken], out)


# --------------------------------------------------------------------------------------------- fencing


@dataclass(frozen=True)
class Fence:
    """The fence record: at ``epoch``, ``holders`` ((group, rank) -> host) says which host holds each engine rank,
    and ``peers`` (host -> address) where the deployment's hosts answer for their own copy. The newest epoch wins:
    a node that was away when a spare took its rank still has an older record, and its engine's start check
    (``k3-group-member holds``) finds the newer one on a peer. Only the deploy writes it; ``holds`` lines name
    engine ranks only (a router joins no rendezvous).

    >>> f = Fence(1765000000, {("engine", 0): "n1", ("engine", 1): "n3"}, {"n1": "10.0.0.1", "n3": "10.0.0.3"})
    >>> print(f.text(), end="")
    # Managed by k3deploy: do not edit; re-run the deploy instead. Who holds each rank (docs/spares.md).
    epoch 1765000000
    holds engine 0 n1
    holds engine 1 n3
    peer n1 10.0.0.1
    peer n3 10.0.0.3
    >>> Fence.from_text(f.text()) == f, Fence.from_text("garbage") is None, Fence.from_text(None) is None
    (True, True, True)
    """

    epoch: int
    holders: Mapping[tuple[str, int], str]
    peers: Mapping[str, str]

    def text(self) -> str:
        lines = ["# Managed by k3deploy: do not edit; re-run the deploy instead. Who holds each rank (docs/spares.md).",
                 f"epoch {self.epoch}"]
        lines += [f"holds {g} {r} {h}" for (g, r), h in sorted(self.holders.items())]
        lines += [f"peer {h} {a}" for h, a in self.peers.items()]
        return "\n".join(lines) + "\n"

    def same_record(self, other: Fence | None) -> bool:
        """The same holders and peers (the epoch aside)."""
        return other is not None and dict(self.holders) == dict(other.holders) and dict(self.peers) == dict(
            other.peers)

    @staticmethod
    def from_text(text: str | None) -> Fence | None:
        """The record of a ``fence`` file (None: no file, or one without its epoch)."""
        epoch: int | None = None
        holders: dict[tuple[str, int], str] = {}
        peers: dict[str, str] = {}
        for line in (text or "").splitlines():
            words = line.split()
            try:
                if words[:1] == ["epoch"] and len(words) == 2:
                    epoch = int(words[1])
                elif words[:1] == ["holds"] and len(words) == 4:
                    holders[(words[1], int(words[2]))] = words[3]
                elif words[:1] == ["peer"] and len(words) == 3:
                    peers[words[1]] = words[2]
            except ValueError:
                continue
        return Fence(epoch, holders, peers) if epoch is not None else None


def fence_for(rollout: Rollout, recorded: Iterable[Fence | None], now: int) -> Fence:
    """The fence record of ``rollout``: each engine unit's (group, rank) held by its host, every host of the
    rollout and every spare standing by as a peer (at its cluster address). Its epoch is that of the newest
    ``recorded`` one (the records the run read on the nodes) where that says the same, else above it and at least
    ``now`` (seconds since the epoch): a record the nodes lost is still outdated by the next one.

    >>> from types import SimpleNamespace as NS
    >>> def unit(host, group, rank):
    ...     return NS(host=host, group=group, rank=rank, node=NS(address="10.0.0." + host[-1]))
    >>> r = NS(units=[unit("n1", "engine", 0), unit("n3", "engine", 1), unit("n1", "router", 0)],
    ...        spares={"n2": "10.0.0.2"})
    >>> first = fence_for(r, [None], 100)
    >>> first.epoch, first.holders, first.peers
    (100, {('engine', 0): 'n1', ('engine', 1): 'n3'}, {'n1': '10.0.0.1', 'n3': '10.0.0.3', 'n2': '10.0.0.2'})
    >>> fence_for(r, [first], 200).epoch, fence_for(r, [Fence(300, {}, {})], 200).epoch
    (100, 301)
    """
    holders = {(u.group, u.rank): u.host for u in rollout.units if u.group != "router"}
    peers: dict[str, str] = {}
    for u in rollout.units:
        peers.setdefault(u.host, u.node.address)
    for host, address in rollout.spares.items():
        peers.setdefault(host, address)
    newest = max((f for f in recorded if f is not None), key=lambda f: f.epoch, default=None)
    fence = Fence(0, holders, peers)
    if newest is not None and fence.same_record(newest):
        return replace(fence, epoch=newest.epoch)
    return replace(fence, epoch=max(now, newest.epoch + 1 if newest is not None else 0))
