"""What starts the engine groups, behind one interface (:class:`Launcher`): their systemd units (the default), or with
``k3_launcher: slurm`` one Slurm batch job per group submitted from ``k3_slurm_submit_host`` (docs/slurm.md).
:func:`launcher_for` is the one reader of ``k3_launcher``: the reads, the run, ``plan``, ``status``, ``history`` and
``bundle`` ask the launcher it gives what to read, what changes, which files a revision keeps, how a group is polled
and stopped, and never compare its name. Its half that renders the files (:class:`Renderer`: the file each unit runs
from, its output, what a revision keeps) is also what an export is: the Kubernetes manifests (``k3deploy export
kubernetes``) and the Slurm batch jobs (``k3deploy export slurm``), from :func:`export_for`, start nothing.

Example::

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> hosts = [HostRecord("n1", ("head",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {"k3_hardware": "gb300", "k3_ip": "10.0.0.2"})]
    >>> r = desired_rollout(target(hosts, None))
    >>> launcher = launcher_for(r)
    >>> launcher.name, launcher.queue_host, launcher.unit_file(r.units[0]) == r.units[0].unit_path
    ('systemd', None, True)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, overload

from pyinfra import logger

from k3deploy.errors import K3Error
from k3deploy.facts.status import RuntimeReading, SlurmQueueReading
from k3deploy.model import commands, slurm, steps
from k3deploy.model.jobcontainers import Runtime
from k3deploy.model.observed import Installed
from k3deploy.model.rollout import Placement, Rollout, UnitWork, files_differ, mark_changes, sha256
from k3deploy.model.slurm import HostFiles, QueuedJob, SlurmJob
from k3deploy.model.staging import engines as engine_hosts
from k3deploy.model.steps import StartSteps
from k3deploy.model.units import CONTAINER_CACHE
from k3deploy.preflight.base import CheckResult
from k3deploy.runtime import readiness
from k3deploy.runtime.readiness import GroupControl, run

#: docker's own checks (k3deploy/vendors/common.py): not needed on an engine node whose runtime runs no docker
DOCKER_CHECKS = frozenset({"container.runtime", "disk.images"})

if TYPE_CHECKING:
    from k3deploy.model.diff import PlanReport
    from k3deploy.model.kubernetes import Export
    from k3deploy.model.slurm import GroupJob


class Readings(Protocol):
    """What a launcher reads of the hosts to say what changes (a :class:`k3deploy.runtime.gather.Gathered`)."""

    @property
    def installed(self) -> Mapping[tuple[str, str], Installed]: ...

    @property
    def readings(self) -> Mapping[str, Any]: ...   # host -> its HostReading

    @property
    def helpers(self) -> Mapping[str, str | None]: ...   # host -> sha256 of its group member helper, where read


class Renderer(Protocol):
    """What renders a rollout's files for what runs its units: the file each unit runs from, where its output is,
    what a revision keeps and records. Every :class:`Launcher` is one, and so is an export that starts nothing
    (:class:`k3deploy.model.kubernetes.Export`, :class:`k3deploy.model.slurm.Export`: from :func:`export_for`)."""

    #: how ``status`` names it (``systemd``, ``slurm``, ``kubernetes``)
    name: ClassVar[str]

    def unit_file(self, unit: UnitWork) -> str:
        """The file ``unit`` runs from (on its node: what is read and kept beside its env file)."""

    def log_dir(self, unit: UnitWork) -> str | None:
        """Where ``unit``'s output is on its node (None: its journal, or its pod's log)."""

    def kept(self, unit: UnitWork) -> list[str]:
        """The files of ``unit`` a revision keeps (on its node)."""

    def revision_files(self, group: str) -> dict[str, str]:
        """``host:path -> sha256`` of what ``group`` runs, as a revision records it (an export's: ``file ->
        sha256``)."""


class Launcher(Renderer, Protocol):
    """What starts a rollout's groups: what each host is asked (its units' files, the queue), which groups change,
    how the readiness gate polls, reports and stops a group, and what the commands that read the systemd units only
    say instead; its files as its :class:`Renderer` renders them."""

    @property
    def queue_host(self) -> str | None:
        """The host whose queue the run reads with the hosts (None: no queue)."""
    #: the SLO gate judges a restart it starts (:func:`k3deploy.model.slo.plan_gate`)
    slo_gated: ClassVar[bool]
    #: the commands that read the systemd units only -> why they refuse, with the fix (``{inventory}`` filled in)
    refuses: ClassVar[Mapping[str, str]]
    #: what ``history`` says first about the revisions it keeps (empty: nothing)
    revision_note: ClassVar[str]

    @property
    def runtime_tools(self) -> Runtime | None:
        """The container runtime whose tools preflight reads on every engine node (None: none of its own)."""

    @property
    def image_file(self) -> str | None:
        """Where each engine node keeps the image as a file that the stage makes once and hands on (None: the image
        travels through each node's docker)."""

    def preflight(self, results: Sequence[CheckResult], runtimes: Mapping[str, RuntimeReading]) -> list[CheckResult]:
        """Preflight's results as this launcher runs the engines: its own checks added (``runtimes``: what each
        engine node answered of :attr:`runtime_tools`)."""

    def changes(self, rollout: Rollout, gathered: Readings) -> frozenset[str]:
        """The groups that restart, from what the hosts have."""

    def new_revision(self, group: str, installed: Mapping[tuple[str, str], Installed],
                     recorded: Mapping[str, str] | None) -> bool:
        """A restart of ``group`` records a new revision: its files change (``installed``: what the hosts have;
        ``recorded``: what its current revision records, None: none)."""

    def control(self, submitted: Mapping[str, str]) -> GroupControl:
        """What the readiness gate polls, shows of a failed unit, and stops (``submitted``: group -> the id of the
        job this run submitted, the run's state)."""

    def advice(self, group: str, host: str, changed: bool = True, submitted: Mapping[str, str] | None = None) -> str:
        """What to do about a group that failed its gate on ``host`` (``changed``: the run started it with other
        files than those of the revision it last served; ``submitted``: as for :meth:`control`)."""

    @property
    def start_steps(self) -> StartSteps:
        """Its part of the rollout's steps (:func:`k3deploy.model.steps.restart`, its configure step)."""

    def submit(self, hosts: Mapping[str, Any], stop: Sequence[str], start: Sequence[str],
               submitted: dict[str, str]) -> bool:
        """Its start steps' ``submit`` step on the submit host: cancel what runs ``stop``, submit ``start``, each
        id kept in ``submitted``; False when a command failed (said why)."""

    def plan(self, rollout: Rollout, gathered: Readings) -> PlanReport:
        """``plan``'s report of ``rollout`` (the groups that restart decided: :func:`k3deploy.runtime.decide.decide`)
        against what the hosts have."""

    def plan_text(self, report: PlanReport, rollout: Rollout) -> str:
        """That report for people."""

    def group_jobs(self, inventory_hosts: Sequence[str], unreachable: Collection[str],
                   queue: SlurmQueueReading | None) -> dict[str, GroupJob] | None:
        """``status``: each group's job as the queue shows it (None: no jobs). Raises :class:`K3Error` (one line,
        the fix) where the queue cannot be read."""

    def bundle_names(self, unit: UnitWork) -> tuple[str, str]:
        """What the bundle names ``unit``'s files after, and the suffix of the file it runs from."""

    def bench_command(self, unit: UnitWork, args: Sequence[str], concurrency: Sequence[int], rounds: int) -> str:
        """The shell that runs vLLM's benchmark client (``k3deploy bench``: :func:`k3deploy.model.commands.bench_with`)
        on ``unit``'s node, in a container of the engines' image as this launcher's engines run it."""


def docker_bench(unit: UnitWork, args: Sequence[str], concurrency: Sequence[int], rounds: int) -> str:
    """The benchmark client in a docker container of ``unit``'s image (:func:`k3deploy.model.commands.bench_serve`)."""
    c = unit.require_spec().container
    assert c is not None
    return commands.bench_serve(c.docker, c.image, c.cache_dir, unit.env_path, args, concurrency, rounds)


@dataclass(frozen=True)
class Systemd:
    """The default launcher: each unit under its node's systemd, from its unit and env files."""

    rollout: Placement
    name: ClassVar[str] = "systemd"
    slo_gated: ClassVar[bool] = True
    refuses: ClassVar[Mapping[str, str]] = {}
    revision_note: ClassVar[str] = ""

    @property
    def runtime_tools(self) -> Runtime | None:
        """None: the units run docker, which preflight checks on every host (``container.runtime``)."""
        return None

    @property
    def image_file(self) -> str | None:
        return None

    def preflight(self, results: Sequence[CheckResult], runtimes: Mapping[str, RuntimeReading]) -> list[CheckResult]:
        """The results as they are: the systemd units contribute no check."""
        return list(results)

    def unit_file(self, unit: UnitWork) -> str:
        return unit.unit_path

    def log_dir(self, unit: UnitWork) -> str | None:
        return None

    def kept(self, unit: UnitWork) -> list[str]:
        """The unit's unit file and env file."""
        return [unit.unit_path, unit.env_path]

    def revision_files(self, group: str) -> dict[str, str]:
        """Each unit's unit file and env file as rendered (:func:`k3deploy.model.revisions.revision_for`)."""
        out = {}
        for u in self.rollout.group(group):
            out[f"{u.host}:{u.unit_path}"], out[f"{u.host}:{u.env_path}"] = sha256(u.unit_text), sha256(u.env_text)
        return out

    def changes(self, rollout: Rollout, gathered: Readings) -> frozenset[str]:
        """The groups that restart, from what the hosts have (:func:`k3deploy.model.rollout.mark_changes`)."""
        return mark_changes(rollout, gathered.installed)

    @property
    def queue_host(self) -> str | None:
        """None: no queue."""
        return None

    @property
    def start_steps(self) -> StartSteps:
        """Stop, record and swap, start heads, then workers (:class:`k3deploy.model.steps.UnitSteps`)."""
        return steps.UNITS

    def new_revision(self, group: str, installed: Mapping[tuple[str, str], Installed],
                     recorded: Mapping[str, str] | None) -> bool:
        """Some unit's unit or env file differs from what its host has (the configure phase stages it)."""
        return any(files_differ(u, installed.get((u.host, u.unit))) for u in self.rollout.group(group))

    def control(self, submitted: Mapping[str, str]) -> GroupControl:
        """Each unit polled with :func:`~k3deploy.runtime.readiness.probe_script`, its journal and container log
        shown, the group stopped workers first."""
        return readiness.UnitControl()

    def advice(self, group: str, host: str, changed: bool = True, submitted: Mapping[str, str] | None = None) -> str:
        """When this run changed the group's files, the revisions it ran before (a rollback); when it did not (it
        restarted the revision it last served), the cause is on the node, where a rollback would not help. Both
        explain the ``Error: executed 0 commands`` pyinfra prints next."""
        return failure_advice(group, host, changed)

    def submit(self, hosts: Mapping[str, Any], stop: Sequence[str], start: Sequence[str],
               submitted: dict[str, str]) -> bool:
        """Nothing: its start steps start the units by their scripts and have no ``submit`` step."""
        return True

    def plan(self, rollout: Rollout, gathered: Readings) -> PlanReport:
        """Each unit's unit and env file changes and its restart (:func:`k3deploy.model.diff.build`)."""
        from k3deploy.model.diff import build

        return build(rollout, dict(gathered.installed), gathered.helpers)

    def plan_text(self, report: PlanReport, rollout: Rollout) -> str:
        from k3deploy.model.diff import render_text

        return render_text(report, rollout)

    def group_jobs(self, inventory_hosts: Sequence[str], unreachable: Collection[str],
                   queue: SlurmQueueReading | None) -> dict[str, GroupJob] | None:
        """None: systemd units, no jobs."""
        return None

    def bundle_names(self, unit: UnitWork) -> tuple[str, str]:
        """The unit's name; its unit file."""
        return unit.unit, "unit"

    def bench_command(self, unit: UnitWork, args: Sequence[str], concurrency: Sequence[int], rounds: int) -> str:
        """In a docker container of the unit's image, as its unit runs the engine."""
        return docker_bench(unit, args, concurrency, rounds)


def failure_advice(group: str, host: str, changed: bool) -> str:
    """What to do about a group of systemd units that failed to serve (:meth:`Systemd.advice`).

    >>> "k3_rollback" in failure_advice("engine", "n2", changed=False)
    False
    >>> "k3_rollback=true" in failure_advice("engine", "n2", changed=True)
    True
    """
    head = f"group {group} is stopped; it runs no half-started version. "
    noise = (" (pyinfra reports this step next as 'Error: executed 0 commands': the step is this readiness check, "
             "which runs no command of its own)")
    if changed:
        return head + ("It was starting other files than those of the revision it last served; if that change "
                       "caused it, the revisions it ran before are in k3deploy history INVENTORY (roll back with "
                       "--data k3_rollback=true)" + noise)
    return head + (f"It was starting the files of the revision it last served, so the cause is on "
                   f"{host}, not in the settings: see its journal above, k3deploy preflight INVENTORY and k3deploy "
                   "bundle INVENTORY; a rollback would not help" + noise)


#: seconds a cancelled job is given to stop its steps (their containers' ``docker stop -t 60``, the batch script's
#: grace) before Slurm is told to end it outright (:func:`k3deploy.model.slurm.cancel`)
CANCEL_TIMEOUT = slurm.STOP_GRACE + 30


@dataclass(frozen=True)
class Slurm:
    """``k3_launcher: slurm``: each group one batch job (:func:`k3deploy.model.slurm.jobs`), submitted from
    ``submit_host``; a job that runs the planned revision (its ``--comment``) is left alone."""

    rollout: Placement
    submit_host: str
    jobs: dict[str, SlurmJob]                  # group -> its planned job
    queued: tuple[QueuedJob, ...]              # what the queue held when the run read it
    name: ClassVar[str] = "slurm"
    slo_gated: ClassVar[bool] = False   # not gated yet
    refuses: ClassVar[Mapping[str, str]] = {
        "runbook": "walks the systemd units' bring-up; for a Slurm site, 'k3deploy export slurm {inventory} -o DIR' "
                   "writes the batch and launch scripts, commented step by step, with their README",
    }
    revision_note: ClassVar[str] = (
        "k3_launcher: slurm: each revision keeps the group's launch scripts and env files (k3_rollback puts them back "
        "and submits the group's job again). Each group's job carries its revision hash in its --comment, "
        "k3deploy:<group>:<hash> (squeue -o '%i %j %T %k %N' on k3_slurm_submit_host)")

    @property
    def queue_host(self) -> str | None:
        """The submit host."""
        return self.submit_host

    @property
    def runtime_tools(self) -> Runtime | None:
        """The site's container runtime (``k3_slurm_container``), where it has tools of its own to check (pyxis:
        enroot and ``srun --container-image``; apptainer); None for docker (``container.runtime``)."""
        rt = slurm.container_runtime(self.rollout)
        return rt if rt.needs else None

    @property
    def image_file(self) -> str | None:
        """The runtime's file of the engine's image (:func:`k3deploy.model.slurm.engine_image_file`)."""
        return slurm.engine_image_file(self.rollout)

    def preflight(self, results: Sequence[CheckResult], runtimes: Mapping[str, RuntimeReading]) -> list[CheckResult]:
        """``slurm.container`` on every engine node: the runtime's tools there (observed: what it lacks; the
        runtime's requirement and fix), as the stage checks them before it makes the image file. Where the runtime
        runs the engines without docker (pyxis, apptainer), docker's own checks on the engine nodes
        (``container.runtime``, ``disk.images``) do not fail a run: the nodes need no docker."""
        rt = slurm.container_runtime(self.rollout)
        engines = set(engine_hosts(self.rollout))
        out = []
        for r in results:
            if rt.staged is not None and r.check in DOCKER_CHECKS and r.host in engines and r.status != "pass":
                out.append(CheckResult(r.host, r.check, "pass", f"not used: k3_slurm_container {rt.name} runs the "
                                       f"engines without docker ({r.observed})", r.required))
            else:
                out.append(r)
        for host, seen in runtimes.items():
            if seen.lacks:
                out.append(CheckResult(host, "slurm.container", "fail", f"k3_slurm_container: {rt.name}: "
                                       f"{', '.join(seen.lacks)}", rt.required, rt.fix))
            else:
                out.append(CheckResult(host, "slurm.container", "pass", f"k3_slurm_container: {rt.name}: "
                                       f"its tools answer ({rt.tool})", rt.required))
        return out

    @property
    def start_steps(self) -> StartSteps:
        """Record, then cancel and submit the jobs on the submit host (:class:`k3deploy.model.steps.JobSteps`)."""
        return steps.JobSteps(self.submit_host)

    @cached_property
    def renderer(self) -> slurm.Export:
        """What renders its files (the export's renderer, with the batch scripts placed on the submit host)."""
        return slurm.Export(self.rollout, self.submit_host)

    def unit_file(self, unit: UnitWork) -> str:
        """Its launch script: what its job's step runs."""
        return self.renderer.unit_file(unit)

    def log_dir(self, unit: UnitWork) -> str | None:
        """Its group's directory under ``k3_slurm_dir``, where each job's step output is."""
        return self.renderer.log_dir(unit)

    def changes(self, rollout: Rollout, gathered: Readings) -> frozenset[str]:
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

    def advice(self, group: str, host: str, changed: bool = True, submitted: Mapping[str, str] | None = None) -> str:
        """The group's job was cancelled: where its step output and the job's own output are."""
        job = self.jobs[group]
        ids = submitted or {}
        where = slurm.step_output(self.rollout, group, ids.get(group, "<job id>"), host)
        return (f"group {group} is stopped: its job {ids.get(group, '')} ({job.name}) was cancelled, so "
                f"it runs no half group. {host}'s step output is {host}:{where} (above); the job's own output is "
                f"{slurm.job_output(self.rollout, group, ids.get(group, '<job id>'))} on {job.nodes[0]}. "
                "Fix the cause and run again (pyinfra reports this step next as 'Error: executed 0 commands': the "
                "step is this readiness check, which runs no command of its own)")

    def new_revision(self, group: str, installed: Mapping[tuple[str, str], Installed],
                     recorded: Mapping[str, str] | None) -> bool:
        """Its current revision does not record exactly its launch scripts and env files (written in place)."""
        return recorded != self.revision_files(group)

    def kept(self, unit: UnitWork) -> list[str]:
        """The files of ``unit`` a revision keeps on its node: its launch script and env file."""
        return self.renderer.kept(unit)

    def revision_files(self, group: str) -> dict[str, str]:
        """``host:path -> sha256`` of what ``group`` runs (:meth:`kept`), as a revision records it."""
        return self.renderer.revision_files(group)

    def files(self, host: str) -> HostFiles | None:
        """What ``host`` gets before a job runs there (launch scripts, env files, batch scripts, directories)."""
        return self.renderer.files(host)

    def control(self, submitted: Mapping[str, str]) -> GroupControl:
        return JobControl(self, submitted)

    def plan(self, rollout: Rollout, gathered: Readings) -> PlanReport:
        """Per group what happens to its job (keep, submit, replace), and each unit's launch script and env file
        changes (:func:`k3deploy.model.diff.build_jobs`)."""
        from k3deploy.model.diff import build_jobs

        return build_jobs(rollout, gathered.installed, list(self.jobs.values()), list(self.queued),
                          rollout.changed_groups, self.start_steps)

    def plan_text(self, report: PlanReport, rollout: Rollout) -> str:
        from k3deploy.model.diff import render_jobs_text

        return render_jobs_text(report, rollout)

    def group_jobs(self, inventory_hosts: Sequence[str], unreachable: Collection[str],
                   queue: SlurmQueueReading | None) -> dict[str, GroupJob] | None:
        """Each group's job as the submit host's ``squeue`` shows it; raises :class:`K3Error` where the submit host
        is not set, not in the inventory, unreachable, or its squeue failed."""
        submit = slurm.check_submit(self.rollout, inventory_hosts)
        if submit in unreachable:
            raise K3Error(f"k3_slurm_submit_host {submit} is unreachable, so the Slurm queue cannot be read: check "
                          f"that it answers over SSH (ssh {submit} squeue)")
        if queue is None or queue.error is not None:
            raise K3Error(f"k3_slurm_submit_host {submit}: squeue failed "
                          f"({queue.error if queue is not None else 'not read'}): check that Slurm's commands work "
                          f"there (ssh {submit} squeue)")
        return slurm.group_jobs(list(self.jobs.values()), queue.jobs, queue.steps)

    def bundle_names(self, unit: UnitWork) -> tuple[str, str]:
        """Its container's name (no systemd unit); its launch script."""
        return unit.container, "launch"

    def bench_command(self, unit: UnitWork, args: Sequence[str], concurrency: Sequence[int], rounds: int) -> str:
        """With docker, as :class:`Systemd`. With a runtime of its own (pyxis, apptainer: a site that may have no
        docker), from the staged image file the unit's job runs, as the stage's download runs the image's CLI
        (:meth:`k3deploy.model.jobcontainers.Runtime.run_argv`, on the node, outside any job: a client, no GPU),
        the model cache at ``~/.cache`` and the unit's env file read in the container at its own path."""
        rt = slurm.container_runtime(self.rollout)
        spec = unit.require_spec().container
        assert spec is not None
        if rt.staged is None:
            return docker_bench(unit, args, concurrency, rounds)
        config = unit.env_path.rsplit("/", 1)[0] or "/"
        mounts = [(spec.cache_dir, CONTAINER_CACHE), (config, config)]
        python = rt.run_argv(slurm.image_file(self.rollout, spec), mounts, [("HF_HUB_OFFLINE", "1")], ["python3"])
        return commands.bench_with(python, args, concurrency, rounds, env_file=unit.env_path)

    def submit(self, hosts: Mapping[str, Any], stop: Sequence[str], start: Sequence[str],
               submitted: dict[str, str]) -> bool:
        """On the submit host: cancel the jobs of the groups ``stop`` (waiting until Slurm holds none of them), then
        submit the jobs of ``start`` in order, each id kept in ``submitted``; each step logged. False when a command
        failed (said why)."""
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
            ok, out = run(hosts, at, slurm.submit(job, self.rollout.vars.k3_slurm_user))
            lines = out.strip().splitlines()
            if not ok or not lines:
                logger.error(f"[{at}] sbatch of group {g}'s job {job.path} failed: {out.strip() or 'no output'}")
                return False
            submitted[g] = lines[-1].split(";")[0].strip()
            logger.info(f"[{at}] group {g}: job {submitted[g]} ({job.name}, {job.comment}) submitted on "
                        f"{','.join(job.nodes)}")
        return True

    def _cancel(self, hosts: Mapping[str, Any], names: Sequence[str]) -> tuple[bool, str]:
        """Stop the jobs ``names`` on the submit host (:func:`k3deploy.model.slurm.cancel`); a job that had to be
        cancelled outright is said as a warning."""
        ok, out = run(hosts, self.submit_host,
                       slurm.cancel(names, CANCEL_TIMEOUT, self.rollout.vars.k3_slurm_user))
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


def _health(reading: Any, unit: str) -> int | None:
    """The ``/health`` code a host read of a serving unit: asked on its own (the deploy, ``plan``) or with how the
    unit runs (``status``, ``bundle``); None: not asked."""
    if unit in reading.health:
        code: int | None = reading.health[unit]
        return code
    run = reading.runs.get(unit)
    return run.health if run is not None else None


@dataclass(frozen=True)
class JobControl:
    """The readiness gate's view of a group run by a Slurm job: each unit polled with
    :func:`k3deploy.model.commands.probe_job` (the job running, then ``/health`` and ``/v1/models``), a failed one
    shown by its step output, the group stopped by cancelling its job."""

    launcher: Slurm
    submitted: Mapping[str, str]   # group -> the id of the job this run submitted

    def probe_script(self, work: UnitWork, model: str) -> str:
        from k3deploy.runtime.readiness import served_model

        job = self.launcher.jobs[work.group]
        return commands.probe_job(job.name, work.serves, None if work.group == "router" else served_model(work, model),
                                  work.env_path, self.launcher.rollout.vars.k3_slurm_user)

    def label(self, work: UnitWork) -> str:
        job = self.launcher.jobs[work.group]
        return f"{work.node.role} rank {work.rank} of job {self.submitted.get(work.group, '')} ({job.name})"

    def logs(self, hosts: Mapping[str, Any], work: UnitWork, docker: str, timeout: float | None = None) -> str:
        job_id = self.submitted.get(work.group, "")
        container = None if work.group == "router" and not self.launcher.rollout.vars.k3_router_image \
            else work.container
        path = slurm.step_output(self.launcher.rollout, work.group, job_id or "<job id>", work.host)
        _, text = run(hosts, work.host, commands.step_logs(path, container, docker), timeout)
        return text

    def culprit(self, hosts: Mapping[str, Any], units: list[UnitWork], seen: UnitWork) -> UnitWork:
        """The unit on the node whose step ended first, as the job's own output (on its first node) says."""
        job_id = self.submitted.get(seen.group)
        if not job_id:
            return seen
        head = units[0]
        _, text = run(hosts, head.host, commands.step_ended(slurm.job_output(self.launcher.rollout, seen.group,
                                                                              job_id)))
        words = text.split()
        node = words[3] if len(words) > 3 and words[:3] == ["the", "step", "on"] else None
        return next((u for u in units if u.host == node), seen)

    def stop(self, hosts: Mapping[str, Any], units: list[UnitWork], timeout: float | None = None) -> None:
        """Its job cancelled (bounded by :data:`CANCEL_TIMEOUT`, not ``timeout``)."""
        self.launcher.cancel(hosts, sorted({u.group for u in units}))


def launcher_for(rollout: Placement, queue: SlurmQueueReading | None = None,
                 inventory_hosts: Sequence[str] | None = None) -> Launcher:
    """The launcher of ``rollout``, from ``k3_launcher`` (the one place that reads it). Before the hosts are read
    (what to ask them, from the rollout laid out only) it needs nothing more, and has no jobs yet. For a run
    (``inventory_hosts`` given) with ``slurm``: the plan checked for Slurm and its submit host
    (:func:`k3deploy.model.slurm.check_submit`), and the ``queue`` that host read; raises :class:`K3Error` (one
    line, the fix) where either is missing."""
    if rollout.vars.k3_launcher != "slurm":
        if rollout.vars.k3_imex == "per_job":   # a channel per job is Slurm's to give (docs/slurm.md)
            raise K3Error("k3_imex: per_job needs k3_launcher: slurm (Slurm's switch/nvidia_imex, or the site's "
                          "prolog, gives each job its IMEX channel): with systemd units set k3_imex: standing (or "
                          "auto)")
        return Systemd(rollout)
    jobs = {j.group: j for j in slurm.jobs(rollout)} if isinstance(rollout, Rollout) else {}
    if inventory_hosts is None:
        return Slurm(rollout, rollout.vars.k3_slurm_submit_host or "", jobs, queue.jobs if queue is not None else ())
    submit = slurm.check_submit(rollout, inventory_hosts)
    if queue is None or queue.error is not None:
        raise K3Error(f"k3_slurm_submit_host {submit}: squeue failed "
                      f"({queue.error if queue is not None else 'not read'}): check that Slurm's commands work "
                      f"there (ssh {submit} squeue)")
    return Slurm(rollout, submit, jobs, queue.jobs)


@overload
def export_for(rollout: Rollout, tokens: Mapping[str, str] | None = None,
               kind: Literal["kubernetes"] = "kubernetes") -> Export: ...


@overload
def export_for(rollout: Rollout, tokens: Mapping[str, str] | None = None, *,
               kind: Literal["slurm"]) -> slurm.Export: ...


def export_for(rollout: Rollout, tokens: Mapping[str, str] | None = None,
               kind: Literal["kubernetes", "slurm"] = "kubernetes") -> Export | slurm.Export:
    """What renders the ``kind`` export of ``rollout`` (a :class:`Renderer`, not a :class:`Launcher`: an export
    starts nothing), whatever ``k3_launcher`` says: the Kubernetes manifests (``tokens``: a node's blank -> the one
    blank its pool's pod template carries), or the Slurm batch jobs and each node's files, as the Slurm launcher
    renders them with no submit host (the site submits the jobs)."""
    if kind == "slurm":
        return slurm.Export(rollout)
    from k3deploy.model.kubernetes import Export

    return Export(rollout, dict(tokens or {}))
