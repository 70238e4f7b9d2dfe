"""``k3deploy watch``: what the control loop does now, from each group's state over time. Pure: the loop
(:mod:`k3deploy.cli.watch`) reads the groups through the status view, hands each look here as a :class:`Look`,
and acts on the :class:`Decision`.

A group is **up** (it serves: status's ``serving``, and in the router where it has one), **starting** (none of its
members is down: every one is running or being started, as self-healing or a boot does) or **down** (a member is
stopped, failed, in a crash loop or unreachable: nothing will bring it back on its own). A group that is not up
gets ``grace`` seconds (``k3_watch_grace``) from the look that first saw it so, or, while it is starting, at least
``start_allowance`` seconds (the time an engine may take to serve, as the deploy's readiness gate allows it): a load
is never cut short. Past that the loop **repairs**: it runs the deploy, once for every group that is due. A group
that a repair did not bring back waits ``backoff`` seconds before the next, twice as long after each further one, at
most ``backoff_max`` (``k3_watch_backoff``, ``k3_watch_backoff_max``). While another run holds the deployment lock
the loop only waits, and a group's grace starts again once the lock is free (that run may be restarting it).

Example: a group goes down at 30 s, is repaired at 95 s (grace 60 s), and serves again::

    >>> k = Knobs(grace=60, backoff=300, backoff_max=1200)
    >>> actions(k, [(0, "up"), (30, "down"), (60, "down"), (95, "down"), (140, "up")])
    ['nothing', 'wait', 'wait', 'repair', 'nothing']

Repairs that do not bring it back: the next waits 300 s after the first, 600 s after the second::

    >>> actions(k, [(0, "down"), (60, "down"), (120, "down"), (361, "down"), (900, "down"), (962, "down")])
    ['wait', 'repair', 'back off', 'repair', 'back off', 'repair']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from k3deploy.model.status import UP as UNIT_UP
from k3deploy.model.status import GroupReport
from k3deploy.model.units import exec_line, render_template

UP, STARTING, DOWN = "up", "starting", "down"
#: what the loop does now: nothing (every group up), wait (a group in its grace), repair (run the deploy), back off
#: (a repair did not bring a group back: wait before the next), wait for the lock (another run holds it)
NOTHING, WAIT, REPAIR, BACK_OFF, LOCKED = "nothing", "wait", "repair", "back off", "wait for the lock"


@dataclass(frozen=True)
class Knobs:
    """The loop's times, in seconds (the ``k3_watch_*`` variables, or the command's options)."""

    grace: float                  # a group not up this long is repaired
    backoff: float                # after a repair that did not bring it back, this long before the next
    backoff_max: float            # the backoff doubles after each further one, up to this
    start_allowance: float = 0    # a group whose members are all starting is given at least this long

    def delay(self, repairs: int) -> float:
        """The wait after the ``repairs``-th repair in a row that did not bring a group back.

        >>> [Knobs(60, 300, 1200).delay(n) for n in (1, 2, 3, 4, 5)]
        [300.0, 600.0, 1200.0, 1200.0, 1200.0]
        """
        return float(min(self.backoff * 2 ** max(0, repairs - 1), max(self.backoff, self.backoff_max)))

    def limit(self, state: str) -> float:
        """How long a group in ``state`` (not up) may stay so before it is repaired."""
        return max(self.grace, self.start_allowance) if state == STARTING else self.grace


@dataclass(frozen=True)
class Look:
    """One look at the cluster: when, each group's state (up / starting / down) and, where another run holds the
    deployment lock, who (one line)."""

    at: float
    groups: Mapping[str, str]
    lock: str | None = None


@dataclass(frozen=True)
class Track:
    """What the loop remembers of a group: its state, since when it has not been up (None: up), the repairs in a
    row that did not bring it back and the earliest time of the next."""

    state: str
    down_since: float | None = None
    repairs: int = 0
    not_before: float | None = None

    def due(self, now: float, knobs: Knobs) -> float | None:
        """When the group is to be repaired (None: it is up)."""
        if self.state == UP or self.down_since is None:
            return None
        at = self.down_since + knobs.limit(self.state)
        return max(at, self.not_before) if self.not_before is not None else at


@dataclass(frozen=True)
class Change:
    """A group whose state changed in a look (``was`` None: the first look), and how long it had not been up when
    it comes back up."""

    group: str
    state: str
    was: str | None
    down_for: float | None = None


@dataclass(frozen=True)
class Decision:
    """What to do now, for which groups (``groups``: those that are not up), until when (a wait, a backoff) and
    why, in one line."""

    action: str
    groups: tuple[str, ...] = ()
    until: float | None = None
    why: str = ""

    def key(self) -> tuple[str, tuple[str, ...], float | None, str]:
        """What makes two decisions the same for the log: a wait, a backoff or a repair not made that goes on is
        not logged again (its reason counts only for the lock: another holder is news).

        >>> Decision(REPAIR, ("engine",), why="engine down for 61 s").key() == \\
        ...     Decision(REPAIR, ("engine",), why="engine down for 92 s").key()
        True
        """
        return self.action, self.groups, self.until, self.why if self.action == LOCKED else ""


@dataclass
class Watch:
    """The loop's memory over its looks (:meth:`see`), repairs (:meth:`repaired`) and decisions (:meth:`decide`)."""

    knobs: Knobs
    tracks: dict[str, Track] = field(default_factory=dict)
    lock: str | None = None

    def see(self, look: Look) -> list[Change]:
        """Take in one look: each group's state, the changes to log. A held lock restarts the grace of every group
        that is not up."""
        changes = []
        self.lock = look.lock
        for name, state in look.groups.items():
            old = self.tracks.get(name)
            if state == UP:
                if old is None or old.state != UP:
                    since = old.down_since if old is not None else None
                    changes.append(Change(name, UP, old.state if old else None,
                                          None if since is None else round(look.at - since, 1)))
                self.tracks[name] = Track(UP)
                continue
            if old is None or old.state == UP:
                track = Track(state, down_since=look.at)
            else:
                track = replace(old, state=state)
            if look.lock is not None:
                track = replace(track, down_since=look.at)
            if old is None or old.state != state:
                changes.append(Change(name, state, old.state if old else None))
            self.tracks[name] = track
        for name in [n for n in self.tracks if n not in look.groups]:   # a group gone from the inventory
            del self.tracks[name]
        return changes

    def decide(self, now: float) -> Decision:
        """What to do at ``now``, after the last look."""
        down = tuple(sorted(n for n, t in self.tracks.items() if t.state != UP))
        if not down:
            return Decision(NOTHING)
        if self.lock is not None:
            return Decision(LOCKED, down, why=self.lock)
        due = {n: at for n in down if (at := self.tracks[n].due(now, self.knobs)) is not None}
        ready = tuple(n for n in down if due[n] <= now)
        if ready:
            return Decision(REPAIR, ready, why=", ".join(f"{n} {self.tracks[n].state} for "
                                                         f"{now - (self.tracks[n].down_since or now):.0f} s"
                                                         for n in ready))
        first = min(due.values())
        backing = [n for n in down if self.tracks[n].not_before is not None]
        if backing:
            return Decision(BACK_OFF, down, until=first,
                            why=", ".join(f"{n} after {self.tracks[n].repairs} repair"
                                          f"{'s' if self.tracks[n].repairs > 1 else ''}" for n in backing))
        return Decision(WAIT, down, until=first,
                        why=", ".join(f"{n} {self.tracks[n].state}" for n in down))

    def repaired(self, groups: Iterable[str], ended: float) -> dict[str, float]:
        """A repair of ``groups`` ended at ``ended``: each waits its backoff before the next (a look that sees it
        up forgets it). Returns each group's earliest next repair."""
        out = {}
        for name in groups:
            t = self.tracks.get(name)
            if t is None or t.state == UP:
                continue
            n = t.repairs + 1
            self.tracks[name] = replace(t, repairs=n, not_before=ended + self.knobs.delay(n))
            out[name] = ended + self.knobs.delay(n)
        return out


def group_state(group: GroupReport) -> str:
    """A group's state for the loop, from its status: up, starting or down.

    >>> from k3deploy.model.status import UnitReport
    >>> def unit(verdict): return UnitReport("n1", "k3-engine", "engine", 0, "head", verdict, "x", 0, None, None,
    ...                                      None, True, None, None, None)
    >>> group_state(GroupReport("engine", "serving", [unit("serving"), unit("running")]))
    'up'
    >>> group_state(GroupReport("engine", "down", [unit("starting"), unit("running")]))
    'starting'
    >>> group_state(GroupReport("engine", "down", [unit("down"), unit("unreachable")]))
    'down'
    >>> group_state(GroupReport("engine", "serving", [unit("serving")], in_router=False))
    'down'
    """
    if group.verdict == "serving" and group.in_router is not False:
        return UP
    if group.in_router is not False and all(u.verdict in (*UNIT_UP, "starting") for u in group.units):
        return STARTING
    return DOWN


def why_not_up(group: GroupReport) -> str:
    """What keeps a group from being up, in a few words: each member that is not up and how.

    >>> from k3deploy.model.status import UnitReport
    >>> u = UnitReport("n2", "k3-engine", "engine", 1, "worker", "unreachable", "unknown", 0, None, None, None,
    ...                None, None, None, None)
    >>> why_not_up(GroupReport("engine", "down", [u]))
    'n2 unreachable'
    """
    parts = [f"{u.host} {u.verdict}" + (f" ({u.active})" if u.verdict == "down" and u.active != "unknown" else "")
             for u in group.units if u.verdict not in UNIT_UP]
    if group.in_router is False:
        parts.append("not in the router")
    return ", ".join(parts) or group.verdict


def actions(knobs: Knobs, looks: Iterable[tuple[float, str]], group: str = "engine",
            repair_s: float = 0) -> list[str]:
    """The action after each look of one group (``(time, state)``), a repair taking ``repair_s`` seconds: the
    decision model over a sequence, as the loop runs it."""
    w = Watch(knobs)
    out = []
    for at, state in looks:
        w.see(Look(at, {group: state}))
        d = w.decide(at)
        out.append(d.action)
        if d.action == REPAIR:
            w.repaired(d.groups, at + repair_s)
    return out


#: seconds a stopped loop's repair gets beyond the deploy's start deadline (its preflight, stage and smoke test)
#: before systemd kills it
STOP_MARGIN = 300
#: ``RestartSec=`` of the loop's own unit: a loop that failed to start (a bad inventory) tries again this late
UNIT_RESTART_SEC = 30


def unit_name(inventory: str) -> str:
    """The name the loop's unit is given for an inventory (one loop per cluster).

    >>> unit_name("/srv/site/inventories/gb300.py")
    'k3-watch-gb300.service'
    """
    stem = inventory.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py")
    return f"k3-watch-{''.join(c if c.isalnum() or c in '-_.' else '-' for c in stem)}.service"


def watch_unit(argv: list[str], working_directory: str, deadline: int, inventory: str) -> str:
    """The systemd unit running the loop ``argv`` (the interpreter, ``-m k3deploy.cli watch INVENTORY ...``) from
    the checkout ``working_directory`` (where ``deploy/k3.py`` is); ``deadline``: the deploy's start deadline
    (``k3_rollout_deadline``), which bounds how long a stop waits for a repair under way.

    >>> text = watch_unit(["/opt/k3/.venv/bin/python", "-m", "k3deploy.cli", "watch", "/srv/inv.py", "--repair"],
    ...                   "/opt/k3", 1500, "/srv/inv.py")
    >>> [line for line in text.splitlines() if line.startswith(("ExecStart", "TimeoutStop", "KillMode"))]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['ExecStart="/opt/k3/.venv/bin/python" "-m" "k3deploy.cli" "watch" "/srv/inv.py" "--repair"',
     'KillMode=mixed', 'TimeoutStopSec=1800']
    """
    return render_template(
        "k3-watch.service.j2", summary=f"the watch loop of {inventory}: repairs a group that stays down "
        "(docs/watch.md)", description=f"k3deploy watch {inventory}", working_directory=working_directory,
        exec_start=exec_line(argv), stop_timeout=deadline + STOP_MARGIN, restart_sec=UNIT_RESTART_SEC)
