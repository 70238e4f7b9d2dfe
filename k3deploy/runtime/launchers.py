"""What starts the engine groups: their systemd units (the default) or, with ``k3_launcher: slurm``, one Slurm batch
job per group submitted from ``k3_slurm_submit_host`` (docs/slurm.md). The run's context chooses one launcher once
(:func:`launcher_for`); the phases ask it what changes, which files each host gets and how a group is started,
polled and stopped, and never compare the launcher's name themselves.

Example::

    >>> Systemd().batch, Systemd().control is None
    (False, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyinfra import logger

from k3deploy.errors import K3Error
from k3deploy.model import commands, slurm
from k3deploy.model.rollout import Rollout, UnitWork, mark_changes, sha256
from k3deploy.model.slurm import HostFiles, QueuedJob, SlurmJob
from k3deploy.runtime.gather import Gathered
from k3deploy.runtime.readiness import GroupControl, run
from k3deploy.runtime.reading import HostReading

#: seconds a cancelled job is given to stop its steps (their containers' ``docker stop -t 60``, the batch script's
#: grace) before Slurm is told to end it outright (:func:`k3deploy.model.slurm.cancel`)
CANCEL_TIMEOUT = slurm.STOP_GRACE + 30


@dataclass(frozen=True)
class Systemd:
    """The default launcher: each unit under its node's systemd (the units, their order and their revisions are the
    phases' own: :mod:`k3deploy.runtime.phases`)."""

    batch: bool = False              # groups are Slurm batch jobs

    def changes(self, rollout: Rollout, gathered: Gathered) -> frozenset[str]:
        """The groups that restart, from what the hosts have (:func:`k3deploy.model.rollout.mark_changes`)."""
        return mark_changes(rollout, gathered.installed)

    @property
    def control(self) -> GroupControl | None:
        """What the readiness gate polls and stops (None: the systemd units, :mod:`k3deploy.runtime.readiness`)."""
        return None

    def revision_files(self, group: str) -> dict[str, str] | None:
        """``host:path -> sha256`` of what a revision of ``group`` keeps (None: its units' unit and env files, staged
        by the configure phase: :func:`k3deploy.model.revisions.revision_for`)."""
        return None

    def advice(self, group: str, host: str) -> str | None:
        """What to do about a group that failed its gate (None: the phases' own, :func:`~k3deploy.runtime.phases.
        failure_advice`)."""
        return None


@dataclass
class Slurm:
    """``k3_launcher: slurm``: each group one batch job (:func:`k3deploy.model.slurm.jobs`), submitted from
    ``submit_host``; a job that runs the planned revision (its ``--comment``) is left alone."""

    rollout: Rollout
    submit_host: str
    jobs: dict[str, SlurmJob]                  # group -> its planned job
    queued: tuple[QueuedJob, ...]              # what the queue held when the run read it
    submitted: dict[str, str] = field(default_factory=dict)   # group -> the id of the job this run submitted
    batch: bool = True

    def changes(self, rollout: Rollout, gathered: Gathered) -> frozenset[str]:
        """The groups that restart (:func:`k3deploy.model.slurm.changed_groups`): a group whose job is not
        queued with its planned comment, and one whose job runs but whose serving units do not answer ``/health``."""
        running = {q.name for q in self.queued if q.state == "RUNNING"}
        failing = []
        for g, job in self.jobs.items():
            codes = [_health(gathered.readings[u.host], u.unit) for u in rollout.group(g)
                     if u.serves and u.host in gathered.readings]
            if job.name in running and any(code != 200 for code in codes):
                failing.append(g)
        return frozenset(slurm.changed_groups(rollout, self.queued, failing))

    def advice(self, group: str, host: str) -> str | None:
        job = self.jobs[group]
        where = slurm.step_output(self.rollout, group, self.submitted.get(group, "<job id>"), host)
        return (f"group {group} is stopped: its job {self.submitted.get(group, '')} ({job.name}) was cancelled, so "
                f"it runs no half group. {host}'s step output is {host}:{where} (above); the job's own output is "
                f"{slurm.job_output(self.rollout, group, self.submitted.get(group, '<job id>'))} on {job.nodes[0]}. "
                "Fix the cause and run again (pyinfra reports this step next as 'Error: executed 0 commands': the "
                "step is this readiness check, which runs no command of its own)")

    def kept(self, unit: UnitWork) -> list[str]:
        """The files of ``unit`` a revision keeps on its node: its launch script and env file."""
        return [slurm.launch_path(self.rollout, unit), unit.env_path]

    def revision_files(self, group: str) -> dict[str, str]:
        """``host:path -> sha256`` of what ``group`` runs (:meth:`kept`), as a revision records it."""
        out = {}
        for u in self.rollout.group(group):
            out[f"{u.host}:{slurm.launch_path(self.rollout, u)}"] = sha256(slurm.launch_script(self.rollout, u))
            out[f"{u.host}:{u.env_path}"] = sha256(u.env_text)
        return out

    def files(self, host: str) -> HostFiles | None:
        """What ``host`` gets before a job runs there (launch scripts, env files, batch scripts, directories)."""
        return next((f for f in slurm.host_files(self.rollout, self.submit_host) if f.host == host), None)

    @property
    def control(self) -> GroupControl:
        return JobControl(self)

    def resubmit(self, hosts: Mapping[str, Any], stop: Sequence[str], start: Sequence[str]) -> bool:
        """On the submit host: cancel the jobs of the groups ``stop`` (waiting until Slurm holds none of them), then
        submit the jobs of ``start`` in order; each step logged. False when a command failed (said why)."""
        at = self.submit_host
        # (the run holds the deployment lock: no other run submits k3deploy's jobs meanwhile)
        held = [q for q in self.queued if q.name in {self.jobs[g].name for g in stop}]
        names = list(dict.fromkeys(q.name for q in held))
        if names:
            ok, out = self._cancel(hosts, names)
            if not ok:
                logger.error(f"[{at}] cannot cancel the jobs {', '.join(names)}: {out.strip() or 'scancel failed'}")
                return False
            what = ", ".join(f"job {q.id} ({q.name}, {q.comment or 'no comment'})" for q in held)
            logger.info(f"[{at}] cancelled {what}: Slurm holds none of them now")
        for g in start:
            job = self.jobs[g]
            ok, out = run(hosts, at, slurm.submit(job))
            lines = out.strip().splitlines()
            if not ok or not lines:
                logger.error(f"[{at}] sbatch of group {g}'s job {job.path} failed: {out.strip() or 'no output'}")
                return False
            self.submitted[g] = lines[-1].split(";")[0].strip()
            logger.info(f"[{at}] group {g}: job {self.submitted[g]} ({job.name}, {job.comment}) submitted on "
                        f"{','.join(job.nodes)}")
        return True

    def _cancel(self, hosts: Mapping[str, Any], names: Sequence[str]) -> tuple[bool, str]:
        """Stop the jobs ``names`` on the submit host (:func:`k3deploy.model.slurm.cancel`); a job that had to be
        cancelled outright is said as a warning."""
        ok, out = run(hosts, self.submit_host, slurm.cancel(names, CANCEL_TIMEOUT))
        if ok and out.strip():
            logger.warning(f"[{self.submit_host}] {out.strip()}")
        return ok, out

    def cancel(self, hosts: Mapping[str, Any], groups: Sequence[str]) -> None:
        """Cancel the jobs of ``groups`` (a group that failed its gate: no half group), saying so."""
        names = [self.jobs[g].name for g in groups]
        ok, out = self._cancel(hosts, names)
        (logger.warning if ok else logger.error)(
            f"[{self.submit_host}] job {', '.join(names)} cancelled" if ok else
            f"[{self.submit_host}] cannot cancel {', '.join(names)}: {out.strip() or 'scancel failed'}")


def _health(reading: HostReading, unit: str) -> int | None:
    """The ``/health`` code a host read of a serving unit: asked on its own (the deploy, ``plan``) or with how the
    unit runs (``status``, ``bundle``); None: not asked."""
    if unit in reading.health:
        return reading.health[unit]
    run = reading.runs.get(unit)
    return run.health if run is not None else None


@dataclass(frozen=True)
class JobControl:
    """The readiness gate's view of a group run by a Slurm job: each unit polled with
    :func:`k3deploy.model.commands.probe_job` (the job running, then ``/health`` and ``/v1/models``), a failed one
    shown by its step output, the group stopped by cancelling its job."""

    launcher: Slurm

    def probe_script(self, work: UnitWork, model: str) -> str:
        from k3deploy.runtime.readiness import served_model

        job = self.launcher.jobs[work.group]
        return commands.probe_job(job.name, work.serves, None if work.group == "router" else served_model(work, model),
                                  work.env_path)

    def label(self, work: UnitWork) -> str:
        job = self.launcher.jobs[work.group]
        return f"{work.node.role} rank {work.rank} of job {self.launcher.submitted.get(work.group, '')} ({job.name})"

    def logs(self, hosts: Mapping[str, Any], work: UnitWork, docker: str) -> str:
        job_id = self.launcher.submitted.get(work.group, "")
        container = None if work.group == "router" and not self.launcher.rollout.vars.k3_router_image \
            else work.container
        path = slurm.step_output(self.launcher.rollout, work.group, job_id or "<job id>", work.host)
        _, text = run(hosts, work.host, commands.step_logs(path, container, docker))
        return text

    def culprit(self, hosts: Mapping[str, Any], units: list[UnitWork], seen: UnitWork) -> UnitWork:
        """The unit on the node whose step ended first, as the job's own output (on its first node) says."""
        job_id = self.launcher.submitted.get(seen.group)
        if not job_id:
            return seen
        head = units[0]
        _, text = run(hosts, head.host, commands.step_ended(slurm.job_output(self.launcher.rollout, seen.group,
                                                                              job_id)))
        words = text.split()
        node = words[3] if len(words) > 3 and words[:3] == ["the", "step", "on"] else None
        return next((u for u in units if u.host == node), seen)

    def stop(self, hosts: Mapping[str, Any], units: list[UnitWork]) -> None:
        self.launcher.cancel(hosts, sorted({u.group for u in units}))


def launcher_for(gathered: Gathered, inventory_hosts: Sequence[str]) -> Systemd | Slurm:
    """The run's launcher, from ``k3_launcher``. With ``slurm``: the plan checked for Slurm and its submit host
    (:func:`k3deploy.model.slurm.check_submit`), and the queue that host read; raises :class:`K3Error` (one line,
    the fix) where either is missing."""
    rollout = gathered.require_rollout()
    if rollout.vars.k3_launcher != "slurm":
        return Systemd()
    submit = slurm.check_submit(rollout, inventory_hosts)
    queue = gathered.slurm_queue
    if queue is None or queue.error is not None:
        raise K3Error(f"k3_slurm_submit_host {submit}: squeue failed "
                      f"({queue.error if queue is not None else 'not read'}): check that Slurm's commands work "
                      f"there (ssh {submit} squeue)")
    return Slurm(rollout, submit, {j.group: j for j in slurm.jobs(rollout)}, queue.jobs)
