"""Readiness gates, run from the control machine over the hosts' own connections.

:func:`wait_group` polls every unit of a started group, each from its own node and all nodes at once, with
:func:`k3deploy.model.commands.probe` (the script the runbook's waits run), until every serving unit answers
``/health`` and ``/v1/models`` (listing the served model name) or one fails. A unit that failed, restarted or
stopped, an engine whose ``/health`` answers 503, or the deadline stops the whole group, and the
:class:`Failure` names that node and unit, the phase, what was observed and what was required, with the tail of
its unit journal and container log.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import gevent
from pyinfra import logger

from k3deploy.model import commands
from k3deploy.model.rollout import Rollout, UnitWork
from k3deploy.recipe.argv import served_model_name
from k3deploy.runtime.pyinfra_internals import ssh_transport

PROBE_MARK = "K3_PROBE="


@dataclass(frozen=True)
class Failure:
    unit: UnitWork
    phase: str
    observed: str
    required: str
    logs: str = ""

    @property
    def host(self) -> str:
        return self.unit.host

    def report(self) -> str:
        u = self.unit
        head = (f"{u.node.role} rank {u.rank} on {u.host} ({u.node.address}) failed during {self.phase}: "
                f"observed {self.observed}; required {self.required}")
        return head + ("\n" + self.logs if self.logs else "")


@dataclass(frozen=True)
class Probe:
    """One poll of one unit."""

    status: Literal["ready", "starting", "failed"]
    observed: str = ""


#: the command line of :func:`run` for a long script: the script comes on stdin, read whole before any of it runs (so
#: no command of it can read the rest as its input), as one argument may not exceed 128 KiB
FROM_STDIN = """sh -c 'eval "$(cat)"'"""

#: scripts up to this many bytes go as the argument of ``sh -c`` (a poll's probe: a few hundred bytes); stdin is the
#: empty, closed channel input either way
AS_ARGUMENT = 64 * 1024


def run(hosts: Mapping[str, Any], name: str, script: str, timeout: float | None = None) -> tuple[bool, str]:
    """Run a script on a host over its own connection (shown with ``-vv``, like the operations' commands): a short
    one as the argument of ``sh -c`` (one message to the node), a long one on stdin (:data:`FROM_STDIN`).

    It never raises and never waits longer than ``timeout`` seconds (None: the connection's own bound, see
    :func:`k3deploy.runtime.connections.bound_silence`): a host whose connection was lost, or that does not answer in
    time, is ``(False, one line naming it)``, so the host that runs the script for another (a gate, a router call)
    reports the lost one by name instead of failing itself."""
    h = hosts[name]
    shown = bool(getattr(getattr(h, "state", None), "print_input", False))
    if shown:
        logger.info(f"[{name}] >>> sh -c {shlex.quote(script)}")
    limit = gevent.Timeout(timeout) if timeout is not None else None
    try:
        if limit is not None:
            limit.start()
        if len(script.encode()) <= AS_ARGUMENT:
            ok, out = h.run_shell_command(f"sh -c {shlex.quote(script)}", print_output=False, print_input=False)
        else:
            ok, out = h.run_shell_command(FROM_STDIN, print_output=False, print_input=False, _stdin=script)
    except gevent.Timeout as exc:
        if exc is not limit:
            raise
        return False, f"{name} did not answer within {timeout:.0f} s"
    except Exception as exc:   # the connection is gone (paramiko: EOFError, SSHException, socket errors)
        return False, lost(name, exc)
    finally:
        if limit is not None:
            limit.close()
    text = "\n".join(getattr(out, "stdout_lines", []) or [])
    if not ok and not text and not _connected(h):   # the connector gave up on a dead transport without a word
        return False, f"the SSH connection to {name} was lost (no answer within k3_link_timeout)"
    return bool(ok), text


def _connected(h: Any) -> bool:
    """The host's SSH transport is still up (True where it has none to look at: ``@local``, a test's host)."""
    transport = ssh_transport(h)
    return transport is None or bool(transport.is_active())


def lost(name: str, exc: BaseException) -> str:
    """The one line for a command that could not run on ``name`` because its connection failed.

    >>> lost("node1", EOFError())
    'the SSH connection to node1 was lost (EOFError)'
    >>> lost("node1", OSError("the SSH connection to node1 was lost (no answer within k3_link_timeout): EOFError"))
    'the SSH connection to node1 was lost (no answer within k3_link_timeout): EOFError'
    """
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if name in text and "lost" in text:
        return text
    return f"the SSH connection to {name} was lost ({type(exc).__name__}{': ' + text if text else ''})"


def served_model(work: UnitWork, model: str) -> str:
    """The id ``/v1/models`` must list and clients must send: the unit's ``--served-model-name``, else the model."""
    return served_model_name(work.node.argv, model)


def probe_script(work: UnitWork, model: str) -> str:
    """The probe of one unit: a router is asked for ``/health`` only, an engine also for its model (with the API key
    its env file holds: a 401 or 403 fails it at once)."""
    return commands.probe(work.unit, work.serves, None if work.group == "router" else served_model(work, model),
                          work.env_path)


def probe(hosts: Mapping[str, Any], work: UnitWork, model: str, script: str | None = None,
          timeout: float | None = None) -> Probe:
    """One poll of ``work`` on its node: :func:`probe_script` (its systemd unit), or ``script`` (another launcher's);
    a node that does not answer within ``timeout`` seconds, or whose connection was lost, has failed."""
    text_of = probe_script(work, model) if script is None else script
    ok, text = run(hosts, work.host, f"( {text_of} ); echo {PROBE_MARK}$?", timeout)
    lines = text.splitlines()
    rc = lines[-1][len(PROBE_MARK):] if lines and lines[-1].startswith(PROBE_MARK) else ""
    observed = "\n".join(lines[:-1]).strip()
    if rc == str(commands.PROBE_READY):
        return Probe("ready")
    if rc == str(commands.PROBE_FAILED):
        return Probe("failed", observed)
    if not ok or not rc:
        return Probe("failed", f"the probe could not run on {work.host}: {text.strip()[:200] or 'no output'}")
    return Probe("starting")


#: the longest a gate's poll or log fetch may take on a node beyond the link's bound (``k3_link_timeout``), and a
#: unit's stop beyond that (its ``TimeoutStopSec``, :class:`k3deploy.model.units.UnitSpec`)
COMMAND_SECONDS = 30
STOP_SECONDS = 130


def logs(hosts: Mapping[str, Any], work: UnitWork, docker: str, lines: int = 25, timeout: float | None = None) -> str:
    container = None if work.group == "router" else work.container
    _, text = run(hosts, work.host, commands.logs(work.unit, container, docker, lines), timeout)
    return text


def stop_group(hosts: Mapping[str, Any], units: list[UnitWork], timeout: float | None = None) -> None:
    """Workers first, then the head (vLLM does not stop headless ranks when their head dies); a member whose
    connection was lost is passed over (it is named by the failure)."""
    for u in sorted(units, key=lambda x: -x.rank):
        run(hosts, u.host, commands.stop_units([u.unit]), timeout)


class GroupControl(Protocol):
    """What the gate asks of the launcher that started a group (the systemd units when none is given:
    :class:`UnitControl`)."""

    def probe_script(self, work: UnitWork, model: str) -> str:
        """One poll of a unit, run on its node (exit codes of :func:`k3deploy.model.commands.probe`)."""

    def label(self, work: UnitWork) -> str:
        """How the progress lines name a unit (the systemd path names its unit)."""

    def logs(self, hosts: Mapping[str, Any], work: UnitWork, docker: str, timeout: float | None = None) -> str:
        """What the failure report shows of a unit that failed (waiting no longer than ``timeout`` on its node)."""

    def culprit(self, hosts: Mapping[str, Any], units: list[UnitWork], seen: UnitWork) -> UnitWork:
        """The unit that caused the failure ``seen`` observed (a launcher that ends a group whole knows which)."""

    def stop(self, hosts: Mapping[str, Any], units: list[UnitWork], timeout: float | None = None) -> None:
        """Stop the whole group (no half group), each stop bounded by ``timeout`` on its node."""


@dataclass(frozen=True)
class UnitControl:
    """The gate's view of a group of systemd units: :func:`probe_script`, :func:`logs`, :func:`stop_group`."""

    def probe_script(self, work: UnitWork, model: str) -> str:
        return probe_script(work, model)

    def label(self, work: UnitWork) -> str:
        return work.unit

    def logs(self, hosts: Mapping[str, Any], work: UnitWork, docker: str, timeout: float | None = None) -> str:
        return logs(hosts, work, docker, timeout=timeout)

    def culprit(self, hosts: Mapping[str, Any], units: list[UnitWork], seen: UnitWork) -> UnitWork:
        return seen

    def stop(self, hosts: Mapping[str, Any], units: list[UnitWork], timeout: float | None = None) -> None:
        stop_group(hosts, units, timeout)


#: while a group's head does not serve yet, its other members are polled every this many rounds only, and no more
#: often than every :data:`MEMBERS_SECONDS` (a member that fails is seen within that time; the head, which needs
#: every member, does not serve meanwhile)
MEMBERS_EVERY = 8
#: the shortest time between two polls of a group's members that do not serve yet (with a short poll interval, a
#: large group would otherwise cost its nodes a probe each every few seconds)
MEMBERS_SECONDS = 4.0


def wait_group(rollout: Rollout, group: str, hosts: Mapping[str, Any], *, phase: str = "start",
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic, control: GroupControl | None = None) -> Failure | None:
    """Poll a started group until every serving unit is healthy; on failure stop the group and report.

    No member of a group serves before every rank has joined, the head included: until the head serves, each round
    polls the head and, every :data:`MEMBERS_EVERY` rounds but no more often than every :data:`MEMBERS_SECONDS`, the
    other members (a member that failed or restarted is seen there; one that is lost also fails its head; the first
    round is such a round); from then on every unit that does not serve yet, every round, and
    those that do every period (one that fails is still seen). A group of N members so costs its nodes about one
    probe per member and period while the engines start, not N a round. The head serving means every rank joined: a
    member that serves no API of its own needs no poll then. The round after the one in which the head first serves
    comes at once: members that serve an API of their own (hybrid load balancing) serve with it. ``control``: the
    launcher's probe, logs and stop (default: the systemd units')."""
    units = rollout.group(group)
    head = units[0]   # the group's units by rank: its head first
    deadline = clock() + rollout.deadline
    interval = max(0.2, rollout.vars.k3_poll_interval)
    docker = rollout.vars.k3_docker
    ready: set[str] = set()
    bound = rollout.vars.k3_link_timeout + COMMAND_SECONDS   # no poll or log fetch waits longer on a node
    stop_bound = rollout.vars.k3_link_timeout + STOP_SECONDS

    def key(work: UnitWork) -> str:
        return f"{work.unit}@{work.host}"

    # each unit's probe, written once for the whole wait (a poll round of a large group would otherwise write every
    # script again, the served model name read back from each unit's argv)
    ctl: GroupControl = control if control is not None else UnitControl()
    scripts = {key(u): ctl.probe_script(u, rollout.plan.model) for u in units}

    def poll(some: list[UnitWork]) -> dict[str, Probe]:
        """One poll of each of ``some``, all hosts at once (each over its own connection)."""
        jobs = {key(u): gevent.spawn(probe, hosts, u, rollout.plan.model, scripts[key(u)], bound) for u in some}
        gevent.joinall(list(jobs.values()))
        return {k: job.value if job.successful() else Probe("failed", f"the probe raised {job.exception!r}")
                for k, job in jobs.items()}

    period = max(MEMBERS_EVERY * interval, MEMBERS_SECONDS)
    members_due = clock()   # the first round polls every member (one that fails at once is seen there)
    while True:
        head_serves = not head.serves or key(head) in ready
        members = clock() >= members_due
        if members:
            members_due = clock() + period
        polled = [u for u in units if u is head or members or (head_serves and key(u) not in ready)]
        results = poll(polled)
        for u in polled:
            result = results[key(u)]
            if result.status == "ready" and key(u) not in ready:
                ready.add(key(u))
                if u.serves:
                    logger.info(f"[{u.host}] {ctl.label(u)} serves at {u.serves}")
            elif result.status == "failed":
                culprit = ctl.culprit(hosts, units, u)
                observed = result.observed if culprit is u else f"{result.observed} (seen from {u.host})"
                fail = Failure(culprit, phase, observed, "the engine keeps running and serves",
                               ctl.logs(hosts, culprit, docker, bound))
                ctl.stop(hosts, units, stop_bound)
                return fail
        if all(key(u) in ready for u in units if u.serves):
            return None
        if clock() > deadline:
            waiting = [u for u in units if u.serves and key(u) not in ready]
            u = waiting[0]
            what = "GET /health 200" + ("" if u.group == "router" else
                                         f" and /v1/models listing {served_model(u, rollout.plan.model)!r}")
            fail = Failure(u, phase, f"{u.serves} not serving after {rollout.deadline}s ({what} required)",
                           f"healthy within the deadline (k3_rollout_deadline={rollout.deadline})",
                           ctl.logs(hosts, u, docker, bound))
            ctl.stop(hosts, units, stop_bound)
            return fail
        if head_serves or key(head) not in ready:   # else the head just served: poll its members now
            sleep(interval)
