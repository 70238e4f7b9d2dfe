"""``k3deploy watch INVENTORY [--repair]``: the control loop a site runs as a service. Every ``k3_watch_interval``
seconds it reads each group's state (the status view, as ``k3deploy status`` reads it: one command per host; a host
that does not answer is a member down), logs one line per change and per action, and with ``--repair`` runs the
deploy (``k3deploy deploy INVENTORY -y``, the installed deploy, with this interpreter) for a group that stays down past
``k3_watch_grace``, backing off after a repair that did not bring it back. What to do is decided by
:mod:`k3deploy.model.watch`; this module reads, logs and runs.

A run that holds the deployment lock (an operator's deploy, or the loop's own repair) is waited for: the loop starts
no repair while the lock is held, and a repair refused by the lock is not counted as one that failed.

SIGTERM or SIGINT ends the loop cleanly: no new look or repair is started; a repair under way is let finish (the
deploy runs in its own process group, so a Ctrl-C at the terminal does not reach it; a second signal interrupts it
with SIGINT, which pyinfra handles by closing its connections and giving the lock back).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from k3deploy.cli.common import echo_json, json_option, read_cluster
from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.model.watch import Change, Decision, Knobs, Look, Watch

#: the directory the watch loop's systemd unit runs in
CHECKOUT = Path(__file__).resolve().parents[2]
#: what the deploy prints when another run holds the deployment lock (:class:`k3deploy.runtime.lock.LockHeld`)
LOCK_REFUSAL = "holds the deployment lock"
#: lines of a repair's output kept to say why it failed (pyinfra's results table alone is a line per operation)
TAIL_LINES = 400
#: the header of pyinfra's results table: it and the rows under it name no error, whatever their words
RESULTS_HEADER = re.compile(r"^\s*Operation\s+Hosts\s+Success\s+Error\s+No Change\s*$")
#: the readiness gate's report of the unit that failed (:class:`k3deploy.runtime.readiness.Failure`)
UNIT_FAILED = re.compile(r" failed during .+: observed .+; required ")
#: an exception as Python prints it last in a traceback (``torch.distributed.DistStoreError: ...``)
EXCEPTION = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception): .+)$")
#: a look does not ask the registry which build the image's tag names (status does, to say whether each unit runs
#: the planned build): a group's state does not depend on it, and a loop asking every interval would spend a
#: registry's pull allowance
LOOK_OVERRIDES = {"k3_image_resolve": False}


def _seconds(least: int) -> Callable[[click.Context, click.Parameter, str | None], int | None]:
    """A whole number of seconds, at least ``least``; anything else is one line and exit 2."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
        if value is None:
            return None
        flag = f"--{param.name}"
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < least:
            raise K3Error(f"{flag} {value!r} is not a whole number of seconds of {least} or more: give one such as "
                          f"{flag} {max(least, 30)}")
        return number

    return parse


class Log:
    """One line per event on stdout: ``TIME text`` or, with ``--json``, one JSON object (``time``, ``event``, the
    event's fields and ``message``: the text)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, event: str, text: str, **fields: Any) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.as_json:
            click.echo(json.dumps({"time": now, "event": event, **fields, "message": text}))
        else:
            click.echo(f"{now} {text}")


def _clock(at: float | None) -> str:
    return "-" if at is None else datetime.fromtimestamp(at, UTC).strftime("%H:%M:%SZ")


class Stop:
    """SIGTERM and SIGINT: the first asks the loop to stop (a repair under way is let finish), a second one during a
    repair interrupts the deploy (SIGINT to its process group)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.event = threading.Event()
        self.child: subprocess.Popen[str] | None = None
        self.signals = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        child = self.child
        if child is not None and child.poll() is None:
            if self.signals == 1:
                self.log("stopping", f"{name}: stopping once the repair under way ends (pid {child.pid}); "
                         "signal again to interrupt it", signal=name, repair_pid=child.pid)
            else:
                self.log("stopping", f"{name}: interrupting the repair (SIGINT to pid {child.pid})", signal=name,
                         repair_pid=child.pid)
                try:
                    os.killpg(child.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        elif self.signals == 1:
            self.log("stopping", f"{name}: stopping", signal=name)
        self.event.set()

    @property
    def asked(self) -> bool:
        return self.event.is_set()

    def sleep(self, seconds: float) -> None:
        self.event.wait(max(0.0, seconds))


@dataclass(frozen=True)
class Returned:
    """A node whose rank a recorded substitution gave to another (``why``) and whose engine units run again
    (``units``): the loop stands it down at once (``link_timeout``: its ``k3_link_timeout``)."""

    host: str
    units: tuple[str, ...]
    why: str
    link_timeout: int


def look(inventory: str, grace: int | None,
         interval: int | None) -> tuple[Look, Knobs, dict[str, str], int, list[Returned]]:
    """One look at the cluster: the :class:`~k3deploy.model.watch.Look`, the knobs (the inventory's variables, the
    options over them), what keeps each group that is not up from being up, the interval to the next look, and the
    nodes back after a spare took their rank whose units run (:class:`Returned`)."""
    from k3deploy.cli.status import status_of
    from k3deploy.model.watch import Knobs, Look, group_state, why_not_up
    from k3deploy.runtime.lock import stale
    from k3deploy.runtime.views import STATUS

    gathered = read_cluster("watch", inventory, view=STATUS, overrides=LOOK_OVERRIDES)
    st = status_of(gathered)
    at = time.time()
    held = {rec.run: rec for rec in gathered.locks.values() if stale(rec) is None}
    lock = "; ".join(f"a run holds the deployment lock: {rec.describe(at)}" for rec in held.values()) or None
    v = gathered.target.vars
    knobs = Knobs(grace=v.k3_watch_grace if grace is None else grace, backoff=v.k3_watch_backoff,
                  backoff_max=v.k3_watch_backoff_max, start_allowance=gathered.require_rollout().ready_timeout)
    groups = {g.name: group_state(g) for g in st.groups}
    settled = gathered.spares
    replaced = {s.lost: s for s in settled.substitutions if s not in settled.new} if settled is not None else {}
    returned = [Returned(host, tuple(units), f"{replaced[host].spare} holds its rank {replaced[host].rank} of "
                         f"group {replaced[host].group}", gathered.target.host_vars(host).k3_link_timeout)
                for host, units in sorted(gathered.stand_down.items()) if host in replaced and units]
    return (Look(at, groups, lock), knobs, {g.name: why_not_up(g) for g in st.groups},
            v.k3_watch_interval if interval is None else interval, returned)


def stand_down(inventory: str, returned: list[Returned]) -> dict[str, str | None]:
    """Stop and disable the units of each returned node (:func:`k3deploy.model.commands.stand_down`, as the deploy
    does for a node that runs nothing): host -> None, or why it could not be done."""
    from k3deploy.model import commands
    from k3deploy.preflight import runner
    from k3deploy.runtime.connections import connect, disconnect, load_inventory
    from k3deploy.runtime.lock import run_on

    state = load_inventory(inventory)
    runner.quiet_pyinfra()
    wanted = {r.host: r for r in returned}
    out: dict[str, str | None] = {}
    for host in [h for h in state.inventory if h.name in wanted]:
        r = wanted[host.name]
        try:
            reason = connect(host, r.link_timeout)
            if reason is not None:
                out[r.host] = f"cannot be reached ({reason})"
                continue
            ok, lines = run_on(host, commands.stand_down(list(r.units)), timeout=120)
            out[r.host] = None if ok else (" ".join(lines)[:200] or "the command failed")
        finally:
            disconnect([host])
    return out


def _stand_down(log: Log, inventory: str, returned: list[Returned]) -> None:
    """Stand the returned nodes down, and log each."""
    for host, error in stand_down(inventory, returned).items():
        r = next(x for x in returned if x.host == host)
        log("stand down", f"{host} is back and runs {', '.join(r.units)} although {r.why}: "
            + ("stopped and disabled" if error is None else f"could not stand it down: {error}"),
            host=host, units=list(r.units), why=r.why, error=error)


def deploy_argv(inventory: str) -> list[str]:
    """The repair: the deploy of the whole inventory (``k3deploy deploy INVENTORY -y``), with this interpreter."""
    from k3deploy.runtime.command import repair_argv

    return repair_argv(str(Path(inventory).resolve()))


def run_repair(inventory: str, stop: Stop) -> tuple[int, float, list[str]]:
    """Run the deploy, its output passed on to stderr as it comes: its exit code, seconds, and its last lines."""
    t0 = time.monotonic()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(deploy_argv(inventory), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    stop.child = proc
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.strip():
                tail.append(line.rstrip())
        rc = proc.wait()
    finally:
        stop.child = None
    return rc, round(time.monotonic() - t0, 1), list(tail)


def _failure(tail: list[str]) -> str:
    """The line of a failed deploy's output that says why: the readiness gate's report of the unit that failed (what
    it observed, what was required, and the first exception of its journal lines), else the last line of k3deploy's
    naming an error, else the last line naming one, never a line of pyinfra's results table (its header names an
    ``Error`` column); else the last line.

    >>> print(_failure(["[n1] head rank 0 on n1 (a) failed during start: observed exit 1; required it serves",
    ...                 "[n1] Dec 06 n1 docker[9]: torch.distributed.DistStoreError: node_rank 1 joined twice",
    ...                 "--> Results:", "    Operation     Hosts   Success   Error   No Change",
    ...                 "    Start | Heads   2   1   1   -", "    Grand total   2   1   1   -",
    ...                 "--> Disconnecting from hosts..."]))
    [n1] head rank 0 on n1 (a) failed during start: observed exit 1; required it serves: torch.distributed.DistSt...
    """
    keys = ("error", "Error", "refus", "fail", "not serving", "cannot")
    lines: list[str] = []
    table = False
    for line in tail:
        if RESULTS_HEADER.match(line):
            table = True
        elif table and line.strip().startswith("Grand total"):
            table = False
        elif not table and line.strip():
            lines.append(line.strip())
    at = next((i for i, x in enumerate(lines) if UNIT_FAILED.search(x)), None)
    if at is not None:
        # its journal lines follow: the first exception there is the engine's own word for it
        host = lines[at].split("]", 1)[0] + "]" if lines[at].startswith("[") else ""
        block = [x for x in lines[at + 1:at + 80] if x.startswith(host)]
        cause = next((m.group(1) for x in block if (m := EXCEPTION.search(x))), None)
        return lines[at] + (f": {cause}" if cause else "")
    named = [x for x in lines if any(k in x for k in keys)]
    ours = [x for x in named if "k3deploy" in x]
    if ours or named:
        return (ours or named)[-1]
    return lines[-1] if lines else (tail[-1].strip() if tail else "")


def _report(log: Log, changes: list[Change], why: dict[str, str]) -> None:
    """One line per group whose state changed."""
    from k3deploy.model.watch import UP

    for c in changes:
        detail = (f" (not up for {c.down_for:.0f} s)" if c.down_for is not None else "") if c.state == UP \
            else f": {why.get(c.group, '')}"
        log("state", f"group {c.group}: {c.state}" + (f" (was {c.was})" if c.was else "") + detail,
            group=c.group, state=c.state, was=c.was, down_for=c.down_for,
            why=None if c.state == UP else why.get(c.group))


def _decision(log: Log, decision: Decision, repair: bool, inventory: str, count: int) -> None:
    """The line of a decision other than a repair."""
    from k3deploy.model.watch import LOCKED, NOTHING, REPAIR, WAIT

    if decision.action == NOTHING:
        log("nothing", f"every group is up ({count}): nothing to do", action=decision.action)
    elif decision.action == LOCKED:
        log("wait", f"not acting on {', '.join(decision.groups)}: {decision.why}; its grace starts again once the "
            "lock is free", action=decision.action, groups=list(decision.groups), lock=decision.why)
    elif decision.action == REPAIR:
        log("due", f"{', '.join(decision.groups)} not up past its grace ({decision.why}): not repairing without "
            f"--repair (k3deploy deploy {inventory} -y repairs it)", action=decision.action,
            groups=list(decision.groups))
    else:
        what = "waiting" if decision.action == WAIT else "backing off"
        log("wait", f"{what}: {decision.why}; " + ("repair" if repair else "past its grace")
            + f" at {_clock(decision.until)}", action=decision.action, groups=list(decision.groups),
            until=_clock(decision.until))


def _repair(log: Log, watch: Watch, decision: Decision, inventory: str, stop: Stop, grace: float) -> None:
    """Run the deploy for the groups of ``decision``, and log what came of it."""
    log("repair", f"repairing {', '.join(decision.groups)} ({decision.why}, grace {grace:.0f} s): "
        f"k3deploy deploy {inventory} -y", groups=list(decision.groups), why=decision.why,
        command=deploy_argv(inventory))
    rc, took, tail = run_repair(inventory, stop)
    if rc != 0 and any(LOCK_REFUSAL in x for x in tail):
        log("repaired", f"the repair was refused: another run holds the deployment lock; waiting for it "
            f"({_failure(tail)})", rc=rc, seconds=took, groups=list(decision.groups), refused=True)
        return
    nexts = watch.repaired(decision.groups, time.time())
    log("repaired", f"repair of {', '.join(decision.groups)} ended: exit {rc} after {took:.0f} s"
        + (f": {_failure(tail)}" if rc else ""), rc=rc, seconds=took, groups=list(decision.groups),
        failure=_failure(tail) if rc else None, next_repair={g: _clock(t) for g, t in nexts.items()})


def loop(inventory: str, *, repair: bool, grace: int | None, interval: int | None, once: bool, log: Log) -> int:
    """The control loop (one pass with ``once``: a look, and with ``--repair`` a repair that is due and a look after
    it). Exit code: 0 every group up at the last look, or stopped by a signal; 1 a group not up; the error's code
    (2: bad input) when the last look could not be taken."""
    from k3deploy.model.watch import REPAIR, UP, Knobs, Watch

    stop = Stop(log)
    stop.install()
    watch = Watch(Knobs(0, 1, 1))
    said: tuple[str, tuple[str, ...], float | None, str] | None = None
    failed: str | None = None
    code = 1
    repaired = False
    log("start", f"watching {inventory}" + (": repairing a group not up past its grace" if repair else
                                            " (without --repair: nothing is changed)"),
        inventory=inventory, repair=repair)
    while not stop.asked:
        try:
            seen, knobs, why, pause, returned = look(inventory, grace, interval)
        except Exception as exc:   # a look that failed is logged, never the end of the loop
            text = str(exc) if isinstance(exc, K3Error) else f"{type(exc).__name__}: {exc}"
            if text != failed:
                log("read failed", f"cannot read the cluster: {text}", error=text)
            failed, code = text, exc.exit_code if isinstance(exc, K3Error) else 1
            if once:
                break
            stop.sleep(interval or 30)
            continue
        if failed is not None:
            log("read", "the cluster reads again")
            failed = None
        watch.knobs = knobs
        _report(log, watch.see(seen), why)
        if repair and returned and seen.lock is None and not stop.asked:
            _stand_down(log, inventory, returned)   # a node back in a place a spare holds: at once, no grace
        code = 0 if all(t.state == UP for t in watch.tracks.values()) else 1
        if once and repaired:
            break
        decision = watch.decide(seen.at)
        if decision.action == REPAIR and repair:
            if stop.asked:
                break
            _repair(log, watch, decision, inventory, stop, knobs.grace)
            said, repaired = None, True
            continue   # look again at once: what the repair brought back
        if decision.key() != said:
            said = decision.key()
            _decision(log, decision, repair, inventory, len(watch.tracks))
        if once:
            break
        stop.sleep(pause)
    if stop.asked:
        log("stopped", "stopped", code=code)
        return 0
    return code


def unit(inventory: str, repair: bool, grace: int | None, interval: int | None) -> tuple[str, str]:
    """The systemd unit that runs this loop as a service, and its name."""
    from k3deploy.model.watch import unit_name, watch_unit
    from k3deploy.runtime.views import INVENTORY_ONLY

    rollout = read_cluster("watch", inventory, view=INVENTORY_ONLY).require_rollout()
    path = str(Path(inventory).resolve())
    argv = [sys.executable, "-m", "k3deploy.cli", "watch", path] + (["--repair"] if repair else []) \
        + ([f"--grace={grace}"] if grace is not None else []) + ([f"--interval={interval}"] if interval is not None
                                                                 else [])
    return watch_unit(argv, str(CHECKOUT), rollout.deadline, path), unit_name(path)


@click.command("watch")
@click.argument("inventory")
@click.option("--repair", is_flag=True, help="Run the deploy for a group down past its grace (else only log).")
@click.option("--grace", metavar="SECONDS", callback=_seconds(0),
              help="Seconds a group may not serve before it is repaired (default: k3_watch_grace).")
@click.option("--interval", metavar="SECONDS", callback=_seconds(1),
              help="Seconds between two looks (default: k3_watch_interval).")
@click.option("--once", is_flag=True, help="One look (and its repair, with --repair), then exit.")
@click.option("--print-unit", is_flag=True, help="Print a systemd unit running this command as a service, and exit.")
@json_option
def watch(inventory: str, repair: bool, grace: int | None, interval: int | None, once: bool, print_unit: bool,
          as_json: bool) -> None:
    """Watch every group of INVENTORY and, with --repair, run the deploy for a group that stays down past its
    grace time, backing off after a repair that did not bring it back. One line per change and per action
    (--json: one JSON object per line); the deploy's own output goes to stderr. SIGTERM/SIGINT end it (a repair
    under way is let finish).

    Exit code (--once): 0 every group up, 1 a group not up, 2 bad input.

    \b
    Example:
      k3deploy watch inventories/gb300.py --repair
      k3deploy watch inventories/gb300.py --once --json
      k3deploy watch inventories/gb300.py --repair --print-unit > /etc/systemd/system/k3-watch-gb300.service
    """
    if not Path(inventory).is_file():
        raise K3Error(f"inventory {inventory!r} is not a file: give the inventory's .py file (as pyinfra takes it)")
    if print_unit:
        text, name = unit(inventory, repair, grace, interval)
        if as_json:
            echo_json({"name": name, "unit": text})
        else:
            click.echo(text, nl=False)
        return
    sys.exit(loop(inventory, repair=repair, grace=grace, interval=interval, once=once, log=Log(as_json)))
