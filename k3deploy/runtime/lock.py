"""The deployment lock: one run at a time changes a cluster.

A run that changes anything (``pyinfra INVENTORY deploy/k3.py`` without ``--dry``) takes the lock on every host of
the inventory before it reads what the hosts run, and so before it numbers the revision it will record: a file
``<k3_config_dir>/deploy.lock`` holding one line of JSON that names the run (its id, who started it on which
control machine, its process, when). The first host is taken alone, then the others all at once: of two runs
started together exactly one gets past the first host, and the other is refused in one line naming the holder.
The lock is released when the run ends, however it ends: on each host over its own connection as pyinfra closes it,
and by an ``atexit`` handler of the control process where that did not happen (a host that cannot be reached then
keeps it).

The lock is a **lease**: the holder renews it on every host it holds, over the run's open connections, every
quarter of ``k3_lock_lease`` seconds (the lock file's modification time, set by the node's own clock), and the
record names the lease's length. Whether the holder is **alive** (:func:`alive`, :func:`stale`) is decided so:
a holder on this very control machine (same host name and boot) is alive while its process runs, whatever its
lease; a holder elsewhere is alive while its lease on the host was renewed within the lease's length (by the node's
clock, so no two machines' clocks are compared); a record without a lease (an older run's) cannot be judged.

A run killed with SIGKILL (or a control machine that died) leaves a **stale** lock: its process is gone, or its lease
ran out. A run takes a stale lock over, and says so. ``k3deploy unlock INVENTORY --run ID`` removes the lock of a
run that is not alive, and refuses one that is (``--force`` removes it anyway, with a warning). ``--dry`` runs,
``plan`` and ``status`` never take it; they show a held one.

Example::

    >>> rec = LockRecord(run="3f2a9c1b7e4d", by="ops@ctl1", pid=4242, pid_start=77, boot="b", started=0,
    ...                  inventory="inventories/gb300.py")
    >>> LockRecord.parse(rec.line()) == rec
    True
    >>> rec.describe(now=125)[:62]
    'run 3f2a9c1b7e4d by ops@ctl1 (pid 4242, inventories/gb300.py),'
    >>> held = LockRecord.parse(rec.line() + "\\nK3_LOCK_AGE=75")          # as a node shows it, the lease's age
    >>> held == rec, held.renewed_ago
    (True, 75)
"""

from __future__ import annotations

import atexit
import contextlib
import getpass
import json
import os
import shlex
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k3deploy.errors import K3Error
from k3deploy.facts.parallel import each_host
from k3deploy.model import commands
from k3deploy.runtime.pyinfra_internals import before_disconnect


class LockHeld(K3Error):
    """Another run holds the deployment lock: the run is refused (exit code 1), nothing changed."""

    exit_code = 1


@dataclass(frozen=True)
class LockRecord:
    run: str
    by: str              # user@control-host
    pid: int
    pid_start: int       # the process's start time (clock ticks since boot, /proc/PID/stat field 22)
    boot: str            # the control machine's boot id
    started: int         # unix time
    inventory: str
    lease: int = 0       # seconds: the holder renews the lock more often than this while it runs (0: no lease)
    #: seconds since the holder last renewed the lock on the host it was read from, by that host's clock (not in the
    #: file: the node says it beside the record, see :func:`k3deploy.model.commands.lock_read`)
    renewed_ago: int | None = field(default=None, compare=False)

    def line(self) -> str:
        data = asdict(self)
        del data["renewed_ago"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> LockRecord | None:
        lines = text.strip().splitlines()
        try:
            data = json.loads(lines[0])
            rec = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k not in ("lease", "renewed_ago")},
                      lease=int(data.get("lease", 0)))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
        age = next((x[len(commands.LOCK_AGE_MARK):] for x in lines[1:] if x.startswith(commands.LOCK_AGE_MARK)), "")
        with contextlib.suppress(ValueError):
            rec = cls(**{**asdict(rec), "renewed_ago": max(0, int(age))})
        return rec

    def age(self, now: float | None = None) -> int:
        return max(0, int((time.time() if now is None else now) - self.started))

    def describe(self, now: float | None = None) -> str:
        since = datetime.fromtimestamp(self.started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (f"run {self.run} by {self.by} (pid {self.pid}, {self.inventory}), since {since} "
                f"({_duration(self.age(now))} ago)")


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def this_run(inventory: str, lease: int = 0) -> LockRecord:
    pid = os.getpid()
    return LockRecord(run=uuid.uuid4().hex[:12], by=f"{getpass.getuser()}@{socket.gethostname()}", pid=pid,
                      pid_start=_pid_start(pid) or 0, boot=_boot_id(), started=int(time.time()),
                      inventory=inventory, lease=lease)


def _here(rec: LockRecord) -> bool:
    """``rec``'s run ran on this control machine, in this boot: its process can be looked at."""
    return rec.by.rpartition("@")[2] == socket.gethostname() and bool(rec.boot) and rec.boot == _boot_id()


def stale(rec: LockRecord) -> str | None:
    """Why ``rec``'s run is certainly gone, else None: on this control machine (same boot) its process is not there
    any more; elsewhere, its lease ran out (not renewed on the host for longer than the lease). A run elsewhere whose
    record has no lease may still be alive, and only its operator knows."""
    if _here(rec):
        started = _pid_start(rec.pid)
        if started is None:
            return f"its process {rec.pid} on {rec.by.rpartition('@')[2]} is gone"
        if started != rec.pid_start:
            return f"process {rec.pid} on {rec.by.rpartition('@')[2]} is another process now"
        return None
    if rec.lease > 0 and rec.renewed_ago is not None and rec.renewed_ago > rec.lease:
        return (f"its lease ran out: last renewed {_duration(rec.renewed_ago)} ago (lease {rec.lease} s, renewed "
                f"every {renew_every(rec.lease):g} s while the run lives)")
    return None


def alive(rec: LockRecord) -> str | None:
    """Why ``rec``'s run counts as alive, else None (gone, or a record without a lease that cannot be judged): on
    this control machine its process runs; elsewhere it renewed its lease within the lease's length."""
    if _here(rec):
        return None if stale(rec) else f"its process {rec.pid} runs on {rec.by.rpartition('@')[2]}"
    if rec.lease > 0 and rec.renewed_ago is not None and rec.renewed_ago <= rec.lease:
        return (f"it renewed its lease {_duration(rec.renewed_ago)} ago (lease {rec.lease} s: it counts as alive "
                "until it has not renewed it for that long)")
    return None


def renew_every(lease: int) -> float:
    """How often (seconds) a holder renews a lease of ``lease`` seconds: four times per lease, so that a renewal
    that fails once or comes late does not let it run out.

    >>> renew_every(60), renew_every(2)
    (15.0, 1.0)
    """
    return max(1.0, lease / 4)


def run_on(h: Any, script: str, timeout: float = 30) -> tuple[bool, list[str]]:
    """Run a lock script on a host over its own connection, within ``timeout`` seconds, without showing it among the
    run's commands (bookkeeping, not a step of the rollout); a host that does not answer is a failure with the reason
    as its one line."""
    import gevent

    try:
        with gevent.Timeout(timeout):
            ok, out = h.run_shell_command(f"sh -c {shlex.quote(script)}", print_output=False, print_input=False)
    except (gevent.Timeout, Exception) as exc:   # a host that stopped answering
        return False, [f"{type(exc).__name__}: {exc}"]
    return bool(ok), list(getattr(out, "stdout_lines", []) or [])


class Lock:
    """The lock of one run over some hosts (``config_dirs``: host name -> its ``k3_config_dir``)."""

    def __init__(self, state: Any, hosts: Mapping[str, Any], config_dirs: Mapping[str, str],
                 record: LockRecord) -> None:
        self.state = state
        self.hosts = dict(hosts)
        self.config_dirs = dict(config_dirs)
        self.record = record
        self.taken: list[str] = []
        self.notes: list[str] = []      # stale locks taken over, for the run's log
        self._renewer: Any = None       # the greenlet that renews the lease (:meth:`renew`)

    def _answer(self, ok: bool, lines: list[str]) -> tuple[str, LockRecord | None, str]:
        """``("taken" | "held" | "error", holder, detail)`` from what :func:`commands.lock_take` printed."""
        marks = [x for x in lines if x.startswith(commands.LOCK_MARK)]
        if not ok or not marks:
            return "error", None, " ".join(lines)[-300:] or "no answer"
        if marks[0] == f"{commands.LOCK_MARK}taken":
            return "taken", None, ""
        rest = lines[lines.index(marks[0]) + 1:]
        holder = LockRecord.parse("\n".join(rest))
        if holder is not None and holder.run == self.record.run:
            return "taken", None, ""
        return "held", holder, "\n".join(rest)[:300]

    def _take_one(self, name: str, answer: list[str] | None = None) -> tuple[str, LockRecord | None, str]:
        """``("taken" | "held" | "error", holder, detail)`` for one host (``answer``: what taking it printed there
        already, in the command that read the host); a stale holder is broken once."""
        d = self.config_dirs[name]
        holder = None
        for attempt in range(2):
            ok, lines = ((bool(answer), answer) if attempt == 0 and answer is not None
                         else run_on(self.hosts[name], commands.lock_take(d, self.record.line())))
            what, holder, detail = self._answer(ok, lines)
            if what != "held":
                return what, holder, detail
            why = stale(holder) if holder is not None else None
            if holder is None or why is None:
                return "held", holder, detail
            run_on(self.hosts[name], commands.lock_release(d, holder.run))
            self.notes.append(f"{name}: took over the stale lock of {holder.describe()}: {why}")
        return "held", holder, ""

    def acquire(self) -> None:
        """Take the lock on every host, or raise :class:`LockHeld` (released again where it was taken)."""
        self.take_first()
        self.settle({})

    def take_first(self) -> None:
        """Take the lock on the first host alone, or raise :class:`LockHeld`: of two runs started at once over the
        same hosts, the one that gets the first host goes on; the other is refused having taken nothing else."""
        names = list(self.hosts)
        if not names:
            return
        result = self._take_one(names[0])
        if result[0] == "taken":
            self.taken = [names[0]]
            return
        self._refuse([(names[0], result[1], result[2])])

    def request(self, name: str) -> tuple[str, str] | None:
        """``(config_dir, record)`` for the command that reads host ``name`` to take the lock there first (None: it
        is taken there already, or the host is not this lock's)."""
        if name not in self.hosts or name in self.taken:
            return None
        return self.config_dirs[name], self.record.line()

    def settle(self, answers: Mapping[str, list[str] | None]) -> None:
        """The lock on every other host: from what taking it printed there (``answers``, by host; a host without one
        is asked now), or raise :class:`LockHeld` (released again where it was taken)."""
        rest = [n for n in self.hosts if n not in self.taken]
        results = list(zip(rest, each_host(self.state, [self.hosts[n] for n in rest],
                                           lambda h: self._take_one(h.name, answers.get(h.name))), strict=True))
        self.taken += [n for n, (what, _, _) in results if what == "taken"]
        refused = [(n, holder, detail) for n, (what, holder, detail) in results if what != "taken"]
        if refused:
            self._refuse(refused)
        for n in self.taken:   # given back over each host's own connection as pyinfra closes it
            self._before_disconnect(self.hosts[n])
        atexit.register(self.release)   # and where that did not happen (a run that died on the way)
        if self.record.lease > 0:
            import gevent

            self._renewer = gevent.spawn(self.renew)

    def renew(self) -> None:
        """Renew the lease on every host the run holds, every :func:`renew_every` seconds, over the hosts' open
        connections, until the lock is given back (a host that does not answer is tried again next time)."""
        import gevent

        every = renew_every(self.record.lease)
        while True:
            gevent.sleep(every)
            hosts = [self.hosts[n] for n in self.taken if getattr(self.hosts[n], "connected", True)]
            if hosts:
                each_host(self.state, hosts, lambda h: run_on(
                    h, commands.lock_renew(self.config_dirs[h.name], self.record.run), timeout=every))

    def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.kill(block=False)
            self._renewer = None

    def _refuse(self, refused: list[tuple[str, LockRecord | None, str]]) -> None:
        self.release()
        name, holder, detail = refused[0]
        if holder is not None:
            raise LockHeld(f"another run holds the deployment lock of this cluster on {name}: {holder.describe()}; "
                           f"wait for it to end, or if it is gone for good: k3deploy unlock {self.record.inventory} "
                           f"--run {holder.run}; nothing was changed")
        raise LockHeld(f"cannot take the deployment lock on {name}: {detail or 'unreadable lock file'}; "
                       f"nothing was changed")

    def _before_disconnect(self, h: Any) -> None:
        def release() -> None:
            if h.name in self.taken:
                self.release_on(h)

        before_disconnect(h, release)

    def release_text(self, name: str) -> str:
        """The command that gives the lock back on host ``name``, for a run's last operation there to end with (see
        :meth:`given_back`)."""
        return commands.lock_release(self.config_dirs[name], self.record.run)

    def given_back(self, name: str) -> None:
        """The lock was given back on host ``name`` by a run's last operation there: nothing left to do as its
        connection closes."""
        if name in self.taken:
            self.taken.remove(name)

    def release_on(self, h: Any) -> bool:
        """Give the lock back on one host over its open connection (the run's last step)."""
        ok = run_on(h, commands.lock_release(self.config_dirs[h.name], self.record.run), timeout=20)[0]
        if ok and h.name in self.taken:
            self.taken.remove(h.name)
        return ok

    def release(self) -> None:
        """Give the lock back on every host where this run took it (a host that does not answer keeps it: the
        next run takes it over once it is stale, see :func:`stale`)."""
        self.stop_renewing()
        hosts = [self.hosts[n] for n in self.taken]

        def one(h: Any) -> bool:
            if not getattr(h, "connected", True):
                try:
                    h.connect(raise_exceptions=True, show_errors=False)
                except Exception:  # unreachable: it keeps the lock
                    return False
            return self.release_on(h)

        if hosts:
            each_host(self.state, hosts, one)


def read_locks(lines_by_host: Mapping[str, list[str]]) -> dict[str, LockRecord]:
    """host -> the record of the lock held there (hosts whose lock is free are left out)."""
    out = {}
    for host, lines in lines_by_host.items():
        rec = LockRecord.parse("\n".join(lines)) if lines else None
        if rec is not None:
            out[host] = rec
    return out


def held_summary(locks: Mapping[str, LockRecord]) -> list[str]:
    """One line per holding run, naming the hosts it holds (for ``plan``, ``status`` and ``--dry``)."""
    runs: dict[str, tuple[LockRecord, list[str]]] = {}
    for host, rec in locks.items():
        runs.setdefault(rec.run, (rec, []))[1].append(host)
    return [f"deployment lock held on {', '.join(hosts)} by {rec.describe()}"
            + (f" (stale: {why})" if (why := stale(rec)) else "") for rec, hosts in runs.values()]
