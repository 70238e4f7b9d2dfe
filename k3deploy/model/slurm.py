"""The Slurm launcher (``k3_launcher: slurm``), pure: a rendered rollout as Slurm batch jobs, and the commands that
submit, find, cancel and account for them (docs/slurm.md).

Each group of the rollout (each replica's engine group, each P/D pool, the router) becomes one batch job on its
planned nodes (``--nodelist``: Slurm node names are the inventory's host names). Inside the job one step per node
runs that node's *launch script* (``<k3_config_dir>/<container>.launch``): the same container the systemd unit runs,
rendered from the same engine spec (:class:`~k3deploy.model.engine.EngineSpec`: its command and container), after
the same pre-step (a leftover container of its name removed), and stopped on SIGTERM as the unit's ``ExecStop``
stops it. The head's step starts first; each worker's
step waits from its own node for the head's rendezvous port (:func:`k3deploy.model.commands.wait_tcp`, the wait the
systemd path runs) and then starts; the first step that ends ends the job (no half group), naming its node, its exit
code and its output. The templates (``templates/k3-slurm-job.sbatch.j2``, ``templates/k3-slurm-launch.sh.j2``)
hold no logic.

Each job carries its revision in ``--comment`` (``k3deploy:<group>:<hash>``: a hash of its batch script, launch
scripts and env files), which ``squeue``'s ``%k`` shows: a job that runs with the planned comment is left alone.

Node-failure policy (what LWS calls RecreateGroupAfterStart): jobs are submitted with ``--requeue`` and
``--open-mode=append`` (the outputs of earlier runs are kept); once a group served (the batch script watches its
head's ``/health``), a step that ends (a node that failed, an engine that died) makes the job requeue itself, at most
``k3_slurm_requeue_max`` times: Slurm starts it again, whole, on the same nodes after its requeue delay. A step that
ends before the group served, or past that limit, ends the job: the run that started it fails naming the node, and
the next run submits it again.

Example::

    >>> job_name("engine-r1", "k3-engine"), job_name("router", "site-a")
    ('k3-engine-r1', 'site-a-router')
    >>> comment("prefill", "0123456789abcdef")
    'k3deploy:prefill:0123456789abcdef'
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from k3deploy.errors import K3Error
from k3deploy.model import compilecache
from k3deploy.model.commands import wait_tcp
from k3deploy.model.engine import EngineSpec
from k3deploy.model.hosttext import IMAGE_LINE, launch_argv, launch_image
from k3deploy.model.images import run_ref
from k3deploy.model.jobcontainers import Runtime, import_image, runtime, staged_image
from k3deploy.model.rollout import Placement, Rollout, UnitWork, sha256
from k3deploy.model.startup import STEP_BEGAN
from k3deploy.model.units import ContainerSpec, bind_mounts, cleanup_argv, render_template, stop_argv
from k3deploy.model.variables import Variables
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import pack_for_container

BATCH_TEMPLATE = "k3-slurm-job.sbatch.j2"
LAUNCH_TEMPLATE = "k3-slurm-launch.sh.j2"
#: the job name prefix with the default ``k3_unit_name``
JOB_PREFIX = "k3"
DEFAULT_UNIT_NAME = "k3-engine"
#: the first Slurm release whose sbatch accepts ``--segment`` together with ``--nodelist`` (each job names its nodes):
#: sbatch(1) of 25.11 (doc/man/man1/sbatch.1 at slurm-25-11-0-1) adds "When used in conjunction with
#: --nodelist=<node_list>: The requested node count must be less than or equal to the total number of unique nodes
#: specified in the --nodelist argument"; 23.11 to 25.05 document ``--segment`` without it
SEGMENT_SINCE = (25, 11)
#: what ``k3_slurm_version: auto`` is where no submit host was read (``export slurm``): not known
UNKNOWN_VERSION = "auto"
#: what a squeue line holds (``%i %j %T %k %N``: job id, name, state, comment, nodes)
QUEUE_FORMAT = "%i %j %T %k %N"
#: seconds the batch script gives the other steps to stop (their containers' ``docker stop -t 60``) after one ended
STOP_GRACE = 90
#: the exit code of a launch script stopped by SIGTERM
STOPPED = 143
MANAGED = "Managed by k3deploy: do not edit; re-run the deploy (or `k3deploy export slurm`) instead."


def job_name(group: str, unit_name: str = DEFAULT_UNIT_NAME) -> str:
    """The job name of a group: ``k3-<group>``, or ``<k3_unit_name>-<group>`` where the site named its units (two
    deployments on one Slurm cluster keep apart)."""
    return f"{JOB_PREFIX if unit_name == DEFAULT_UNIT_NAME else unit_name}-{group}"


def comment(group: str, revision: str) -> str:
    """The job's ``--comment``: what squeue's ``%k`` shows of the revision it runs."""
    return f"k3deploy:{group}:{revision}"


def launch_path(rollout: Placement, unit: UnitWork) -> str:
    """Where a unit's launch script lives on its node: beside its env file in ``k3_config_dir``.

    >>> from types import SimpleNamespace as N
    >>> launch_path(N(vars=N(k3_config_dir="/etc/k3deploy/")), N(container="k3-engine-prefill"))
    '/etc/k3deploy/k3-engine-prefill.launch'
    """
    return f"{rollout.vars.k3_config_dir.rstrip('/')}/{unit.container}.launch"


def group_dir(rollout: Placement, group: str) -> str:
    """The group's directory under ``k3_slurm_dir``, on each of its nodes: the job's output (``<job id>.out``) and
    one directory per job with each node's step output."""
    return f"{rollout.vars.k3_slurm_dir.rstrip('/')}/{group}"


def step_output(rollout: Placement, group: str, job_id: str, host: str) -> str:
    """The output of ``host``'s step in job ``job_id`` of ``group``, on that host.

    >>> from types import SimpleNamespace as N
    >>> step_output(N(vars=N(k3_slurm_dir="/var/lib/k3deploy/slurm")), "engine", "42", "n1")
    '/var/lib/k3deploy/slurm/engine/42/n1.out'
    """
    return f"{group_dir(rollout, group)}/{job_id}/{host}.out"


def job_output(rollout: Placement, group: str, job_id: str) -> str:
    """The batch script's own output (which step ended, with what), on the job's first node."""
    return f"{group_dir(rollout, group)}/{job_id}.out"


def script_path(rollout: Placement, group: str) -> str:
    """Where the group's batch script lives on ``k3_slurm_submit_host``."""
    return f"{rollout.vars.k3_slurm_dir.rstrip('/')}/{job_name(group, rollout.vars.k3_unit_name)}.sbatch"


def version_tuple(version: str) -> tuple[int, int]:
    """``"25.11"`` or ``"25.11.1"`` -> ``(25, 11)``.

    >>> version_tuple("25.11.1") >= SEGMENT_SINCE, version_tuple("24.05") >= SEGMENT_SINCE
    (True, False)
    """
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def segment(rollout: Placement) -> bool:
    """Whether each job asks for its nodes in one topology block (``--segment``): ``k3_slurm_segment: true``
    (:func:`check` refuses it on a Slurm before :data:`SEGMENT_SINCE`), or ``auto`` on a site whose Slurm is known
    to accept it with ``--nodelist``."""
    v = rollout.vars
    if v.k3_slurm_segment == "auto":
        return v.k3_slurm_version != UNKNOWN_VERSION and version_tuple(v.k3_slurm_version) >= SEGMENT_SINCE
    return bool(v.k3_slurm_segment)


# ---------------------------------------------------------------------------------------------- the site


#: the switch plugin that gives each job an IMEX channel of its own (Slurm >= 24.05; slurm.conf(5) SwitchType, source
#: src/plugins/switch/nvidia_imex: it mounts a tmpfs on /dev/nvidia-caps-imex-channels in each step's mount namespace
#: holding only the job's ``channelN``, N from 1, channel 0 reserved)
IMEX_SWITCH = "switch/nvidia_imex"
#: where the IMEX channels' device nodes are (the driver's, and the switch plugin's per step)
IMEX_CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"
#: the keys of ``scontrol show config`` the deploy reads (src/api/config_info.c prints each ``%-23s = %s``; a key
#: that lists programs, ``Prolog``, as ``Prolog[0]``, ``Prolog[1]``, ... from 24.05)
SITE_KEYS = ("SLURM_VERSION", "SwitchType", "SwitchParameters", "Prolog", "PrologFlags", "TopologyPlugin")


@dataclass(frozen=True)
class SlurmSite:
    """What the submit host's Slurm says of the site: its version (``scontrol --version``) and the settings of
    ``scontrol show config`` that decide what a job may use (``switch``: ``SwitchType``; ``prolog``: ``Prolog``, the
    programs slurmd runs before a job on each node). ``error``: what was not read, and why."""

    version: str | None = None
    switch: str | None = None
    prolog: tuple[str, ...] = ()
    error: str | None = None

    @property
    def imex_per_job(self) -> bool:
        """Slurm gives each job its IMEX channel (``SwitchType=switch/nvidia_imex``)."""
        return self.switch == IMEX_SWITCH


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as ``key -> value`` (``(null)`` is "").

    >>> parse_config("Configuration data as of 2026-12-06T10:00:00\\nSwitchType              = switch/nvidia_imex\\n"
    ...              "Prolog                  = (null)\\n")
    {'SwitchType': 'switch/nvidia_imex', 'Prolog': ''}
    """
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = "" if value.strip() == "(null)" else value.strip()
    return out


def parse_site(version_text: str, config_text: str) -> SlurmSite:
    """The site from ``scontrol --version`` (``slurm 24.05.3``) and ``scontrol show config``; the version from the
    config's ``SLURM_VERSION`` where ``--version`` said none.

    >>> parse_site("slurm 24.05.3", "SwitchType              = switch/nvidia_imex\\nProlog[0]               = "
    ...            "/etc/slurm/prolog.d/*")
    SlurmSite(version='24.05.3', switch='switch/nvidia_imex', prolog=('/etc/slurm/prolog.d/*',), error=None)
    >>> parse_site("", "").error
    'scontrol printed no version'
    """
    conf = parse_config(config_text)
    words = version_text.split()
    version = next((w for w in words if re.fullmatch(r"\d{2}\.\d{1,2}(\.\d+)?(-\S+)?", w)), None)
    version = (version or conf.get("SLURM_VERSION") or "").split("-")[0] or None
    # to 23.11 one ``Prolog = A,B``; from 24.05 one ``Prolog[N] = A`` per program (src/api/config_info.c)
    prolog = tuple(p.strip() for key, value in conf.items() if re.fullmatch(r"Prolog(\[\d+\])?", key)
                   for p in value.split(",") if p.strip())
    return SlurmSite(version, conf.get("SwitchType") or None, prolog,
                     None if version else "scontrol printed no version")


def site_variables(variables: Variables, site: SlurmSite) -> dict[str, str]:
    """What the site decides of the variables left to it (``auto``): ``k3_slurm_version`` (its Slurm, MAJOR.MINOR)
    and ``k3_imex`` (``per_job`` where Slurm gives each job its channel, or the site names the prolog that does;
    else ``standing``). A variable the inventory sets is the site's word and is kept.

    >>> from k3deploy.model.variables import Variables
    >>> site_variables(Variables(k3_hardware="gb300"), SlurmSite("24.05.3", IMEX_SWITCH))
    {'k3_slurm_version': '24.05', 'k3_imex': 'per_job'}
    >>> site_variables(Variables(k3_hardware="gb300", k3_imex="standing"), SlurmSite("22.05.8", "switch/none"))
    {'k3_slurm_version': '22.05'}
    """
    out = {}
    if variables.k3_slurm_version == UNKNOWN_VERSION and site.version:
        out["k3_slurm_version"] = ".".join(site.version.split(".")[:2])
    if variables.k3_imex == "auto":
        out["k3_imex"] = "per_job" if site.imex_per_job or variables.k3_imex_prolog else "standing"
    return out


# ---------------------------------------------------------------------------------------------- checks


def check(rollout: Placement) -> None:
    """Refuse a plan Slurm cannot run as planned (:class:`K3Error`, one line with the fix): ``--segment`` on a Slurm
    older than 25.11 (or of no known version); a host in two groups while each job takes its nodes whole
    (``k3_slurm_exclusive: node``: the second job would wait for ever); two engine groups on one host both asking
    for its GPUs."""
    v = rollout.vars
    if v.k3_slurm_segment is True:
        if v.k3_slurm_version == UNKNOWN_VERSION:
            raise K3Error("k3_slurm_segment: true needs Slurm >= 25.11 (--segment with --nodelist), and the site's "
                          "Slurm version is not known here: set k3_slurm_version to it (`scontrol --version` on the "
                          "submit host), or k3_slurm_segment: auto (left out where it does not hold) or false")
        if version_tuple(v.k3_slurm_version) < SEGMENT_SINCE:
            raise K3Error(f"k3_slurm_segment: true needs Slurm >= 25.11 (sbatch accepts --segment with --nodelist "
                          f"from 25.11), the site's Slurm is {v.k3_slurm_version}: set k3_slurm_segment: auto (left "
                          "out until the site runs 25.11) or false")
    groups_of: dict[str, list[str]] = {}
    for u in rollout.units:
        if u.group not in groups_of.setdefault(u.host, []):
            groups_of[u.host].append(u.group)
    for host, groups in groups_of.items():
        if len(groups) < 2:
            continue
        if v.k3_slurm_exclusive == "node":
            if "router" in groups:
                other = next(g for g in groups if g != "router")
                raise K3Error(f"k3_slurm_exclusive: node: the router's host {host} is also a node of group {other}, "
                              "and a job that takes its nodes whole (--exclusive) leaves no room for the other: set "
                              "`k3_slurm_exclusive: user` (k3deploy's jobs may share a node) or put the router on "
                              "another host")
            raise K3Error(f"k3_slurm_exclusive: node: host {host} runs groups {' and '.join(groups)}, and a job that "
                          "takes its nodes whole (--exclusive) leaves no room for the other: set "
                          "`k3_slurm_exclusive: user` or give each group hosts of its own")
        engines = [g for g in groups if g != "router"]
        if len(engines) > 1 and gres(rollout, engines[0]):
            raise K3Error(f"k3_slurm_gres: host {host} runs engine groups {' and '.join(engines)}, and each job asks "
                          f"for all its GPUs (--gres={gres(rollout, engines[0])}): give each group hosts of its own, "
                          "or set `k3_slurm_gres: \"\"`")


def check_submit(rollout: Placement, inventory_hosts: Sequence[str]) -> str:
    """The submit host of a deploy through Slurm (``k3_slurm_submit_host``, an inventory host), after :func:`check`;
    raises :class:`K3Error` when it is not set or not in the inventory."""
    check(rollout)
    host = rollout.vars.k3_slurm_submit_host
    if host is None:
        raise K3Error("k3_launcher: slurm needs k3_slurm_submit_host: set it to the inventory name of the login or "
                      "controller host where sbatch runs")
    if host not in inventory_hosts:
        raise K3Error(f"k3_slurm_submit_host: {host} is not a host of the inventory: add it (it is reached over SSH "
                      f"like every host) or name one of {', '.join(inventory_hosts)}")
    return host


# ---------------------------------------------------------------------------------------------- launch scripts


def container_runtime(rollout: Placement) -> Runtime:
    """The site's container runtime (:mod:`k3deploy.model.jobcontainers`): ``k3_slurm_container``, else the one
    the vendor pack documents for Slurm (``docker`` for a plan without a pack)."""
    name = rollout.vars.k3_slurm_container
    if name is None:
        pack = pack_for_container(rollout.plan.vendor)
        name = pack.container.slurm_runtime if pack is not None else "docker"
    return runtime(name)


def image_file(rollout: Placement, spec: ContainerSpec) -> str:
    """The image a unit's container runs from, as the site's runtime reads it: the file the stage made on the node
    (:func:`k3deploy.model.jobcontainers.staged_image`), or the image itself (docker)."""
    return staged_image(rollout.vars.k3_stage_dir, run_ref(spec.image), container_runtime(rollout))


def engine_image_file(rollout: Placement) -> str | None:
    """Where each engine node keeps the engine's image as the file the site's runtime reads (pyxis's squashfs,
    apptainer's SIF), which the stage makes once and hands on node to node; None where the runtime reads docker's
    own store (the image then travels through each node's docker)."""
    rt = container_runtime(rollout)
    if rt.staged is None:
        return None
    return staged_image(rollout.vars.k3_stage_dir, run_ref(rollout.plan.image), rt)


def container_command(spec: ContainerSpec, argv: Sequence[str]) -> list[str]:
    """What runs inside a unit's container: the plan's argv, under ``bash -lc`` with the pack's login profile
    sourced first where the vendor's engine needs it (as :func:`k3deploy.model.units.container_argv` runs it)."""
    pack = pack_for_container(spec.vendor)
    profile = pack.container.login_profile if pack is not None else None
    if profile is not None and list(argv[:2]) == ["vllm", "serve"]:
        return ["bash", "-lc", profile + "exec " + shlex.join(argv)]
    return list(argv)


def image_imports(rollout: Placement, host: str) -> list[tuple[str, str]]:
    """``(file, shell)``, one per image other than the engine's that ``host``'s units run, the shell making on
    ``host`` the file of that image in the form the site's runtime reads, from the registry by its pinned reference
    (:func:`k3deploy.model.jobcontainers.import_image`: a router's ``k3_router_image``); none where the runtime reads
    docker's store. The engine's own file is the stage's (:func:`engine_image_file`: made once, handed on)."""
    rt = container_runtime(rollout)
    if rt.staged is None:
        return []
    specs = [u.require_spec().container for u in rollout.on_host(host)]
    engine = run_ref(rollout.plan.image)
    images = {run_ref(i): i for i in dict.fromkeys(s.image for s in specs if s is not None) if run_ref(i) != engine}
    return [(staged_image(rollout.vars.k3_stage_dir, r, rt), import_image(rt, pinned, staged_image(
        rollout.vars.k3_stage_dir, r, rt), local=False)) for r, pinned in images.items()]


def launch_command(rollout: Placement, unit: UnitWork) -> list[str]:
    """What a unit's launch script runs (:func:`launch_script`): the ``docker run`` of its unit, the router's
    binary, or (pyxis, apptainer) what its container runtime execs; that of the script it keeps, read back from the
    host, where it keeps one."""
    if unit.launch_text is not None:
        return launch_argv(unit.launch_text)
    engine = unit.require_spec()
    spec = engine.container
    rt = container_runtime(rollout)
    if spec is None or rt.staged is None:
        return engine.command
    pack = pack_for_container(spec.vendor)
    flags = pack.container.apptainer_flags if pack is not None else ()
    return rt.exec_argv(image_file(rollout, spec), flags, bind_mounts(spec), container_command(spec, engine.argv))


def launch_script(rollout: Placement, unit: UnitWork) -> str:
    """The script a unit's Slurm step runs, as the site's container runtime has it (:func:`container_runtime`).
    With ``docker``, on the node: the unit's container (same argv as its ``ExecStart=``), after the unit's pre-step,
    stopped on SIGTERM as the unit's ``ExecStop`` stops it. With ``pyxis``, inside the step's container: the unit's
    env file exported, then the engine's argv exec'd. With ``apptainer``, on the node: the env file handed in, then
    ``apptainer exec`` of the staged image exec'd. A router run from ``k3_router_bin`` (no container) is exec'd, and
    Slurm's SIGTERM reaches it as systemd's does. A rollback's unit carries the launch script its revision kept
    (``launch_text``), which is then the script."""
    if unit.launch_text is not None:
        return unit.launch_text
    engine = unit.require_spec()
    spec = engine.container
    rt = container_runtime(rollout)
    where = f"{unit.node.role} rank {unit.rank} of group {unit.group} on {unit.host}"
    comments = [f"{where}: {rollout.plan.model} ({rollout.plan.strategy} on {rollout.plan.hardware}).",
                f"The Slurm launcher's form of the systemd unit {unit.unit}: the same command, the same env file "
                f"({unit.env_path})."]
    argv = engine.command
    imex = imex_lines(rollout, spec, argv)
    if spec is not None and rt.staged is not None:
        image = image_file(rollout, spec)
        comments.append(
            f"Container runtime {rt.name} (k3_slurm_container): "
            + ("this script runs inside the step's container (srun --container-image), a process of the job: "
               "its cgroup, its GPUs." if rt.inside else
               f"the container runs from {image}, a process of the job: its cgroup, its GPUs."))
        comments.append(IMAGE_LINE.removeprefix("# ") + image)
        body = ["# The unit's env file, as the systemd unit's container reads it: NAME=value, the value literal.",
                rt.read_env(unit.env_path),
                *(imex[0] if imex else []),
                "# Slurm stops the step with SIGTERM (scancel, the end of the job): it reaches the engine itself.",
                f"exec {shlex.join(launch_command(rollout, unit))}"]
    elif spec is None:
        body = ["# Slurm stops the step with SIGTERM (scancel, the end of the job), as systemd stops the unit.",
                f"exec {shlex.join(argv)}"]
    else:
        body = [
            "# A container of this name left by an earlier run is removed first (the unit's ExecStartPre=-).",
            f"{shlex.join(cleanup_argv(spec))} >/dev/null 2>&1 || true",
            "# Slurm stops a step with SIGTERM, then SIGKILL after KillWait: a `docker run` client killed so would",
            "# leave its container running, so the container is stopped here as the unit's ExecStop= stops it.",
            f"stop_container() {{ {shlex.join(stop_argv(spec))} >/dev/null; }}",
            f"trap 'stop_container; wait \"$run\"; exit {STOPPED}' TERM INT HUP",
            *(imex[0] if imex else []),
            f"{imex[1] if imex else shlex.join(argv)} &",
            "run=$!",
            'wait "$run"',
        ]
    return render_template(LAUNCH_TEMPLATE, managed=MANAGED, comments=comments, body=[*BEGAN, *body])


#: a launch script's first lines: when the step began, in its output (where ``k3deploy history`` reads a start's
#: phases from: :func:`k3deploy.model.commands.step_startup_lines`)
BEGAN = ("# When the step began, on stderr (srun --output takes both into the step's output file: the lines after it",
         "# are this start's, where k3deploy reads its phases).",
         f'echo "{STEP_BEGAN}$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)" >&2')


def imex_lines(rollout: Placement, spec: ContainerSpec | None, argv: Sequence[str]) -> tuple[list[str], str] | None:
    """With IMEX per job (``k3_imex: per_job``) and a container that uses IMEX: the launch script's lines that
    find the channel(s) the job was given, and its ``docker run`` line with them in place of the standing channel 0
    (None: no IMEX per job here). In the step, ``/dev/nvidia-caps-imex-channels`` holds the job's channel: under
    switch/nvidia_imex, a tmpfs of the step's own mount namespace with only ``channelN``; with the site's prolog,
    the channel it created. Each goes to ``docker run`` as ``--device``; ``NVIDIA_IMEX_CHANNELS`` (their numbers,
    as the NVIDIA Container Toolkit >= 1.17 reads it) is exported for runtimes that set up the container with
    libnvidia-container (enroot, apptainer). None found: the step fails at once, naming the node."""
    pack = pack_for_container(spec.vendor) if spec is not None else None
    device = pack.container.imex_device if pack is not None else None
    if rollout.vars.k3_imex != "per_job" or spec is None or not spec.imex or device not in argv:
        return None
    at = list(argv).index(str(device))
    run = f'{shlex.join(argv[:at - 1])} "${{imex[@]}}" {shlex.join(argv[at + 1:])}'
    missing = shlex.quote(f"k3deploy: no IMEX channel in {IMEX_CHANNELS_DIR} for this job on ") + '"$(hostname)"' \
        + shlex.quote(f": k3_imex is per_job, and neither Slurm's {IMEX_SWITCH} nor the site's IMEX prolog gave "
                      "the job one (scontrol show config | grep -E 'SwitchType|Prolog')")
    return [
        "# IMEX per job (k3_imex: per_job): the channel(s) Slurm's switch/nvidia_imex, or the site's prolog, gave",
        "# this job, not a standing channel 0 (under docker each as --device), their numbers as NVIDIA_IMEX_CHANNELS",
        "imex=(); ids=",
        f'for c in {IMEX_CHANNELS_DIR}/channel*; do [ -e "$c" ] || continue; imex+=(--device "$c"); '
        'ids="${ids:+$ids,}${c##*channel}"; done',
        f'[ "${{#imex[@]}}" -gt 0 ] || {{ echo {missing} >&2; exit 1; }}',
        'export NVIDIA_IMEX_CHANNELS="$ids"',
    ], run


def batch_imex(rollout: Placement, group: str) -> list[str]:
    """The batch script's lines that set ``NVIDIA_IMEX_CHANNELS`` before its steps start, where the site's runtime
    sets up the container inside the job with libnvidia-container (pyxis's enroot, apptainer) and the group's
    containers use IMEX; none otherwise (docker: each launch script hands the channel as ``--device``).

    The variable reaches every step's task through srun's environment (``--export=ALL``, the default), so the
    container is set up with the channel instead of finding it afterwards: enroot's hook
    ``conf/hooks/98-nvidia.sh`` (github.com/NVIDIA/enroot) takes each ``NVIDIA_*`` variable of its own environment
    over the image's (``[ -v "${key}" ] || export ...`` over ``$ENROOT_ENVIRON``) and runs ``nvidia-container-cli
    configure``, whose ``--imex-channel`` (libnvidia-container ``src/cli/main.c``, ``src/nvc.c``: one channel
    device made per id; the NVIDIA Container Toolkit >= 1.17 passes ``NVIDIA_IMEX_CHANNELS`` to it) hands the
    channel to the container. With a standing domain: channel 0. With IMEX per job: the job's own channel(s),
    listed by one short step on the head (``switch/nvidia_imex`` sets up the job's channel in every step,
    src/plugins/switch/nvidia_imex ``switch_p_setup_special_steps``; a site's prolog makes it on each node); none
    listed: the job fails at once, naming the head.
    """
    rt = container_runtime(rollout)
    specs = [u.require_spec().container for u in rollout.group(group)]
    if not rt.in_job or rt.staged is None or not any(s is not None and s.imex for s in specs):
        return []
    if rollout.vars.k3_imex != "per_job":
        return ["# IMEX (a standing domain): channel 0, set up in each step's container by the runtime's NVIDIA hook",
                "export NVIDIA_IMEX_CHANNELS=0"]
    head = rollout.group(group)[0].host
    listing = (f'for c in {IMEX_CHANNELS_DIR}/channel*; do [ -e "$c" ] && printf "%s," "${{c##*channel}}"; '
               "done; true")
    missing = shlex.quote(f"k3deploy: group {group}: no IMEX channel in {IMEX_CHANNELS_DIR} for this job on "
                          f"{head}: k3_imex is per_job, and neither Slurm's {IMEX_SWITCH} nor the site's IMEX prolog "
                          "gave the job one (scontrol show config | grep -E 'SwitchType|Prolog')")
    return [
        "# IMEX per job (k3_imex: per_job): the channel(s) Slurm's switch/nvidia_imex, or the site's prolog, gave this",
        "# job, read in a step on the head, then set for every step: the runtime's NVIDIA hook sets them up",
        f"ids=$(srun --nodes=1 --ntasks=1 -w {shlex.quote(head)} sh -c {shlex.quote(listing)})",
        'ids=${ids%,}',
        f'[ -n "$ids" ] || {{ echo {missing} >&2; exit 1; }}',
        'export NVIDIA_IMEX_CHANNELS="$ids"',
    ]


# ---------------------------------------------------------------------------------------------- batch scripts


def gres_name(vendor: str) -> str:
    """The accelerators' GRES name on a site of this vendor family's pack (its container key, ``Plan.vendor``):
    the pack's ``Container.slurm_gres``.

    >>> gres_name("nvidia"), gres_name("amd"), gres_name("npu")
    ('gpu', 'gpu', 'npu')
    """
    pack = pack_for_container(vendor)
    return pack.container.slurm_gres if pack is not None else "gpu"


def gres(rollout: Placement, group: str) -> str:
    """The ``--gres`` of a group's job ("" for the router's, or with ``k3_slurm_gres: ""``): ``{gres}`` is the
    pack's GRES name (:func:`gres_name`), ``{gpus_per_node}`` the hardware's accelerators per node."""
    if group == "router" or not rollout.vars.k3_slurm_gres:
        return ""
    gpus = hardware()[rollout.plan.hardware].gpu_count
    return rollout.vars.k3_slurm_gres.replace("{gpus_per_node}", str(gpus)).replace(
        "{gres}", gres_name(rollout.plan.vendor))


def sbatch_options(rollout: Placement, group: str) -> list[str]:
    """The ``#SBATCH`` options of a group's job, without its ``--comment`` (the revision covers them)."""
    v = rollout.vars
    nodes = [u.host for u in rollout.group(group)]
    out = [f"--job-name={job_name(group, v.k3_unit_name)}", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
           "--ntasks-per-node=1", "--exclusive" if v.k3_slurm_exclusive == "node" else "--exclusive=user"]
    if gres(rollout, group):
        out.append(f"--gres={gres(rollout, group)}")
    for flag, value in (("partition", v.k3_slurm_partition), ("account", v.k3_slurm_account),
                        ("qos", v.k3_slurm_qos), ("time", v.k3_slurm_time)):
        if value:
            out.append(f"--{flag}={value}")
    if segment(rollout):
        out.append(f"--segment={len(nodes)}")
    out += [f"--output={group_dir(rollout, group)}/%j.out", "--open-mode=append", "--requeue"]
    return out


def step_flags(rollout: Placement, unit: UnitWork) -> list[str]:
    """The srun options that run ``unit``'s step in its container, where the site's runtime is the step's (pyxis:
    :meth:`k3deploy.model.jobcontainers.Runtime.step_flags`); none otherwise."""
    spec = unit.require_spec().container
    if spec is None:
        return []
    rt = container_runtime(rollout)
    # a revision's launch script (a rollback) names the image its container ran from: the step runs that one
    kept = launch_image(unit.launch_text) if unit.launch_text is not None else None
    return rt.step_flags(kept or image_file(rollout, spec), bind_mounts(spec), rollout.vars.k3_config_dir.rstrip("/"),
                         unit.container)


def _step(rollout: Placement, unit: UnitWork) -> tuple[list[str], str]:
    """A unit's step: what it does, in words, and its srun line."""
    host = shlex.quote(unit.host)
    # %N: the file is opened on the step's own node (a plain path would be written by srun, on the batch host)
    srun = f"srun --nodes=1 --ntasks=1 -w {host} --output=\"$out\"/%N.out --open-mode=append"
    flags = step_flags(rollout, unit)
    if flags:
        srun += " " + shlex.join(flags)
    launch = shlex.quote(launch_path(rollout, unit))
    if unit.join is None:
        what = [f"{unit.host}: {unit.node.role} rank {unit.rank} ({unit.unit} under systemd) runs its launch script."]
        return what, f"{srun} {launch}"
    address, port = unit.join
    wait = wait_tcp(address, port, rollout.vars.k3_rendezvous_timeout)
    what = [f"{unit.host}: {unit.node.role} rank {unit.rank} waits, from its own node, until the head's rendezvous "
            f"port {address}:{port} accepts TCP",
            f"(at most k3_rendezvous_timeout = {rollout.vars.k3_rendezvous_timeout}s), then runs its launch script."]
    return what, f"{srun} bash -c {shlex.quote(f'{wait} && exec {launch}')}"


def _batch(rollout: Placement, group: str, revision: str | None) -> str:
    units = rollout.group(group)
    v = rollout.vars
    options = sbatch_options(rollout, group)
    if revision is not None:
        options.insert(-3, f"--comment={comment(group, revision)}")
    head = units[0]
    nodes = [u.host for u in units]
    summary = (f"Group {group} of {rollout.plan.model} ({rollout.plan.strategy} on {rollout.plan.hardware}): "
               f"{len(units)} node(s), head {head.host}.")
    steps: list[dict[str, object]] = []
    for u in units:
        what, line = _step(rollout, u)
        steps.append({"comment": what, "command": line, "node": shlex.quote(u.host)})
    fail = (f"k3deploy: group {group}: the step on $node ended with exit code $rc (its output: $node:$out/$node.out); "
            "stopping the group's other steps")
    requeue = (f"k3deploy: group {group} served before the step ended: the job requeues itself (restart "
               f"$(( restarts + 1 )) of {v.k3_slurm_requeue_max}; Slurm starts it again on the same nodes after its "
               "requeue delay)")
    stopped = (f"k3deploy: group {group} served before the step ended, but the job is stopped for good (no longer "
               "requeueable: the deploy, or an operator, stopped it): it ends")
    served_comment = [
        "Recreate after start: once the group served (its head answered /health), a step that ends makes the job",
        "requeue itself: Slurm starts it again, whole, on the same nodes, after its requeue delay (AuthInfo",
        f"cred_expire, 120 s by default), at most k3_slurm_requeue_max = {v.k3_slurm_requeue_max} times. Before it",
        "served, or past that, the job ends: the deploy's gate or the next run reports it. A job the deploy stops",
        "is made not requeueable first (scontrol update JobId=N Requeue=0): it ends."]
    return render_template(
        BATCH_TEMPLATE, managed=MANAGED, summary=summary, options=options,
        out=shlex.quote(group_dir(rollout, group)), nodes=len(nodes),
        mkdir_fail=shlex.quote(f"k3deploy: group {group}: cannot create the step output directory ") + '"$out"'
        + shlex.quote(f" on {', '.join(nodes)}"),
        imex=batch_imex(rollout, group),
        steps=steps, fail=f'"{fail}"', grace=STOP_GRACE, requeue=f'"{requeue}"', stopped=f'"{stopped}"',
        requeue_max=v.k3_slurm_requeue_max,
        health=shlex.quote(head.serves + "/health") if head.serves else "", poll=max(1, round(v.k3_poll_interval)),
        served_comment=served_comment if head.serves else [
            "The group's head serves no HTTP: the job never requeues itself; a step that ends ends the job."],
        submit_note=(
            "Submitted by the deploy from k3_slurm_submit_host (or by hand: sbatch --parsable THIS_FILE); "
            f"the launch scripts and env files must be on the nodes ({v.k3_config_dir})."))


def revision(rollout: Placement, group: str) -> str:
    """The group's revision: 16 hex digits of the hash of what its job runs (its batch script's options and steps,
    each node's launch script and env file). It changes when any of them does, and only then."""
    parts = [_batch(rollout, group, None)]
    for u in rollout.group(group):
        parts += [launch_path(rollout, u), launch_script(rollout, u), u.env_path, u.env_text]
    return sha256("\0".join(parts))[:16]


def batch_script(rollout: Rollout, group: str) -> str:
    """The group's batch script: its ``#SBATCH`` options (``--comment`` carrying :func:`revision`), then the steps."""
    return _batch(rollout, group, revision(rollout, group))


@dataclass(frozen=True)
class SlurmJob:
    """One group's batch job, as the deploy submits it."""

    group: str
    name: str                       # --job-name
    nodes: tuple[str, ...]          # --nodelist, the head first
    path: str                       # the batch script on the submit host
    script: str
    revision: str
    comment: str                    # --comment: what squeue's %k shows while it runs


def jobs(rollout: Placement) -> list[SlurmJob]:
    """Every group's job in submit order: the engine groups (replicas in order; P/D: prefill, decode), then the
    router (once they serve). Raises :class:`K3Error` for a plan Slurm cannot run (:func:`check`)."""
    check(rollout)
    out = []
    for g in rollout.groups:
        rev = revision(rollout, g)
        out.append(SlurmJob(group=g, name=job_name(g, rollout.vars.k3_unit_name),
                            nodes=tuple(u.host for u in rollout.group(g)), path=script_path(rollout, g),
                            script=_batch(rollout, g, rev), revision=rev, comment=comment(g, rev)))
    return out


# ---------------------------------------------------------------------------------------------- files per host


@dataclass(frozen=True)
class NodeFile:
    path: str
    text: str
    mode: str                       # octal, e.g. "0755"
    #: an env file's engine spec, where it renders from one (None: kept as a host holds it, or not an env file)
    spec: EngineSpec | None = field(default=None, repr=False, compare=False)
    owner: str | None = None        # k3_slurm_user: the job's user reads it (an env file); None: root's


@dataclass(frozen=True)
class HostFiles:
    """What one host needs before a job runs there: directories, then files."""

    host: str
    dirs: tuple[str, ...]
    files: tuple[NodeFile, ...]
    owned: tuple[str, ...] = ()     # of ``dirs``, those the job's user writes (``k3_slurm_user``): its output


def host_files(rollout: Placement, submit_host: str | None) -> list[HostFiles]:
    """Per host, the files the Slurm launcher writes: on each node its launch scripts (0755) and env files (0600,
    as the systemd path writes them), the directories of its groups' outputs and of its engines' compile caches
    (the job's user writes both); on ``submit_host``
    (:func:`check_submit`; None: no batch script is placed) the batch scripts (0644). Hosts in inventory order, the
    submit host last when it runs no unit."""
    submit = submit_host
    out: dict[str, tuple[list[str], list[NodeFile]]] = {}
    for u in rollout.units:
        dirs, files = out.setdefault(u.host, ([], []))
        if group_dir(rollout, u.group) not in dirs:
            dirs.append(group_dir(rollout, u.group))
        # the engine's compile caches (k3_compile_cache): their key's directory, which the job's user writes
        key = compilecache.key_of(u.spec.env_map) if u.spec is not None else None
        caches = compilecache.host_dir(rollout.vars.k3_model_cache, key) if key is not None else None
        if caches is not None and caches not in dirs:
            dirs.append(caches)
        files += [NodeFile(u.env_path, u.env_text, "0600", u.spec if u.kept_env_text is None else None,
                           owner=rollout.vars.k3_slurm_user),
                  NodeFile(launch_path(rollout, u), launch_script(rollout, u), "0755")]
    if submit is not None:
        dirs, files = out.setdefault(submit, ([], []))
        if rollout.vars.k3_slurm_dir not in dirs:
            dirs.append(rollout.vars.k3_slurm_dir)
        files += [NodeFile(j.path, j.script, "0644") for j in jobs(rollout)]
    user = rollout.vars.k3_slurm_user
    groups = {group_dir(rollout, g) for g in rollout.groups}
    caches = compilecache.host_root(rollout.vars.k3_model_cache) + "/"
    return [HostFiles(h, tuple(d), tuple(f), tuple(x for x in d if x in groups or x.startswith(caches)) if user else ())
            for h, (d, f) in out.items()]


@dataclass(frozen=True)
class Export:
    """The Slurm files of a rollout, as what renders them (:class:`k3deploy.runtime.launchers.Renderer`): each
    group's job (:func:`jobs`), and per host its files (:func:`host_files`; with ``submit_host``, the batch scripts
    placed there). A unit runs from its launch script, its output is its group's directory, a revision keeps its
    launch script and env file. The Slurm launcher renders through it (its files are the deploy's), and so does
    ``k3deploy export slurm`` (no submit host: the site submits the jobs). Got from
    :func:`k3deploy.runtime.launchers.export_for`.

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> r = desired_rollout(target([HostRecord("n1", ("head",), {"k3_hardware": "b300", "k3_ip": "10.0.0.1"})],
    ...                            None))
    >>> export = Export(r)
    >>> [j.name for j in export.jobs], export.unit_file(r.units[0]), export.log_dir(r.units[0])
    (['k3-engine'], '/etc/k3deploy/k3-engine.launch', '/var/lib/k3deploy/slurm/engine')
    """

    rollout: Placement
    #: where the batch scripts are placed (None: nowhere, the site submits them)
    submit_host: str | None = None
    name: ClassVar[str] = "slurm"

    @cached_property
    def jobs(self) -> list[SlurmJob]:
        """Every group's job in submit order (:func:`jobs`)."""
        return jobs(self.rollout)

    @cached_property
    def host_files(self) -> list[HostFiles]:
        """Per host, what it gets before a job runs there (:func:`host_files`)."""
        return host_files(self.rollout, self.submit_host)

    def files(self, host: str) -> HostFiles | None:
        """What ``host`` gets (None: nothing)."""
        return next((f for f in self.host_files if f.host == host), None)

    def unit_file(self, unit: UnitWork) -> str:
        """Its launch script: what its job's step runs."""
        return launch_path(self.rollout, unit)

    def log_dir(self, unit: UnitWork) -> str | None:
        """Its group's directory under ``k3_slurm_dir``, where each job's step output is."""
        return group_dir(self.rollout, unit.group)

    def kept(self, unit: UnitWork) -> list[str]:
        """The files of ``unit`` a revision keeps on its node: its launch script and env file."""
        return [launch_path(self.rollout, unit), unit.env_path]

    def revision_files(self, group: str) -> dict[str, str]:
        """``host:path -> sha256`` of what ``group`` runs (:meth:`kept`), as a revision records it."""
        out = {}
        for u in self.rollout.group(group):
            out[f"{u.host}:{launch_path(self.rollout, u)}"] = sha256(launch_script(self.rollout, u))
            out[f"{u.host}:{u.env_path}"] = sha256(u.env_text)
        return out


# ---------------------------------------------------------------------------------------------- commands

_ME = '-u "$(id -un)"'


def _names(names: Sequence[str]) -> str:
    return shlex.quote(",".join(names))


def as_user(command: str, user: str | None) -> str:
    """``command`` run as ``user`` on the submit host (``k3_slurm_user``: ``runuser``, util-linux's, which root runs
    without a password or a sudoers rule; the deploy's SSH user there is root, or becomes it with pyinfra's
    ``_sudo``), or as it is (None: the SSH user). ``$(id -un)`` in it is then that user; it runs from ``/`` (the
    SSH user's home may be closed to it, and a job keeps the directory it was submitted from).

    >>> as_user("squeue -h", "k3job"), as_user("squeue -h", None)
    ("runuser -u k3job -- sh -c 'cd / && squeue -h'", 'squeue -h')
    """
    if user is None:
        return command
    return f"runuser -u {shlex.quote(user)} -- sh -c {shlex.quote('cd / && ' + command)}"


def submit(job: SlurmJob, user: str | None = None) -> str:
    """Submit a group's job (as ``user``: :func:`as_user`); prints its job id (``--parsable``: ``ID`` or
    ``ID;CLUSTER``).

    >>> submit(SlurmJob("engine", "k3-engine", ("n0",), "/var/lib/k3deploy/slurm/k3-engine.sbatch", "", "r", "c"))
    'sbatch --parsable /var/lib/k3deploy/slurm/k3-engine.sbatch'
    """
    return as_user(f"sbatch --parsable {shlex.quote(job.path)}", user)


def queue(names: Sequence[str], user: str | None = None) -> str:
    """This user's jobs of these names that Slurm still holds (pending, running, completing), one line each:
    ``JOBID NAME STATE COMMENT NODES`` (:func:`parse_queue`); ``user``: as :func:`as_user`.

    >>> queue(["k3-engine", "k3-router"])
    'squeue -h -u "$(id -un)" --name=k3-engine,k3-router -o \\'%i %j %T %k %N\\''
    """
    return as_user(f"squeue -h {_ME} --name={_names(names)} -o {shlex.quote(QUEUE_FORMAT)}", user)


def cancel(names: Sequence[str], timeout: int, user: str | None = None) -> str:
    """Stop this user's jobs of these names and wait until Slurm holds none of them (exit 1 naming them otherwise).

    Each job is first made not requeueable (``scontrol update JobId=N Requeue=0``: a job that served would otherwise
    requeue itself when its steps end). A running job is stopped as the batch script stops a group: SIGTERM to its
    steps only (``scancel --signal=TERM`` without ``--full``: each launch script stops its container as the unit's
    ``ExecStop`` does, the batch script sees its steps end and exits); a pending one is cancelled. One still queued
    after ``timeout`` seconds is cancelled outright (Slurm: SIGTERM to everything, SIGKILL after KillWait), saying so
    on stdout, and waited for 60 s more."""
    each = [shlex.quote(n) for n in names]
    no_requeue = (f"for j in $(squeue -h {_ME} --name={_names(names)} -o %i); do scontrol update JobId=$j Requeue=0; "
                  "done")
    signal = " ; ".join(f"scancel {_ME} --name={n} --state=PENDING ; scancel {_ME} --name={n} --state=RUNNING "
                        "--signal=TERM" for n in each)
    hard = " ; ".join(f"scancel {_ME} --name={n}" for n in each)
    late = shlex.quote(f"jobs {', '.join(names)} still in the queue after {int(timeout) + 60}s: ") + '"$left"'
    # said on stdout: the run shows it (a job whose steps do not end on SIGTERM has an engine that ignores it)
    outright = shlex.quote(f"not ended {int(timeout)}s after SIGTERM to their steps, so cancelled outright: ") \
        + '"$left"'
    left = f"left=$(squeue -h {_ME} --name={_names(names)} -o '%i %j %T')"
    return as_user(
        f"{{ {no_requeue} ; {signal} ; }} 2>/dev/null; end=$(( $(date +%s) + {int(timeout)} )); hard=0; "
        f"while {left}; [ -n \"$left\" ]; do "
        f"if [ $(date +%s) -ge $end ]; then if [ $hard = 1 ]; then echo {late} >&2; exit 1; fi; "
        f"echo {outright}; {{ {hard} ; }} 2>/dev/null; hard=1; end=$(( $(date +%s) + 60 )); fi; sleep 1; done", user)


def accounting(names: Sequence[str], since: str = "now-7days", user: str | None = None) -> str:
    """This user's jobs of these names that ended since ``since`` (``sacct``: id, name, state, exit code, nodes,
    end), one ``|``-separated line each (:func:`parse_accounting`); ``user``: as :func:`as_user`."""
    return as_user(f"sacct -n -P -X {_ME} --name={_names(names)} -S {shlex.quote(since)} "
                   "-o JobID,JobName,State,ExitCode,NodeList,End", user)


@dataclass(frozen=True)
class QueuedJob:
    id: str
    name: str
    state: str                      # PENDING, RUNNING, COMPLETING, ...
    comment: str                    # the revision it runs (:func:`comment`)
    nodes: str                      # Slurm's node list (compressed: n[0-1])


def parse_queue(text: str) -> list[QueuedJob]:
    """The lines of :func:`queue`.

    >>> parse_queue("41 k3-engine RUNNING k3deploy:engine:0123 n[0-1]\\n42 k3-router PENDING (null) \\n")
    [QueuedJob(id='41', name='k3-engine', state='RUNNING', comment='k3deploy:engine:0123', nodes='n[0-1]'), \
QueuedJob(id='42', name='k3-router', state='PENDING', comment='', nodes='')]
    """
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3:
            continue
        note = words[3] if len(words) > 3 and words[3] != "(null)" else ""
        out.append(QueuedJob(words[0], words[1], words[2], note, words[4] if len(words) > 4 else ""))
    return out


#: what a ``squeue --steps`` line holds (``%i %N``: the step's id ``JOBID.STEPID``, its nodes)
STEPS_FORMAT = "%i %N"


def steps_query(user: str | None = None) -> str:
    """This user's running job steps, one line each: ``JOBID.STEPID NODES`` (:func:`parse_steps`; squeue(1),
    ``--steps``: ``%i`` is the step's id there); ``user``: as :func:`as_user`.

    >>> steps_query()
    'squeue -h -s -u "$(id -un)" -o \\'%i %N\\''
    """
    return as_user(f"squeue -h -s {_ME} -o {shlex.quote(STEPS_FORMAT)}", user)


def parse_steps(text: str) -> tuple[tuple[str, str], ...]:
    """The lines of :func:`steps_query` as ``(JOBID.STEPID, node)``, the steps of one node only (a unit's step:
    ``srun --nodes=1 -w NODE``); the batch script's own steps (``batch``, ``extern``) and those over several nodes
    (the output directory's ``mkdir``) are left out.

    >>> parse_steps("41.0 n[0-1]\\n41.1 n0\\n41.2 n1\\n41.extern n0\\n41.batch n0\\n")
    (('41.1', 'n0'), ('41.2', 'n1'))
    """
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0].partition(".")[2].isdigit() and not any(c in words[1] for c in "[,"):
            out.append((words[0], words[1]))
    return tuple(out)


#: the states of a job that holds (or will hold) its nodes: a job in one of them with the planned comment is kept
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                    "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT"})


@dataclass(frozen=True)
class Decision:
    """What the deploy does with one group's job, from what the queue holds."""

    group: str
    action: str                     # keep | submit (none queued) | replace (cancel the queued ones, then submit)
    cancel: tuple[str, ...]         # job ids of this group's name to cancel first
    why: str


def job_actions(planned: Sequence[SlurmJob], queued: Sequence[QueuedJob]) -> list[Decision]:
    """Per planned job, in submit order: ``keep`` when exactly one job of its name is queued, active (:data:`ACTIVE`)
    and carries the planned comment (nothing changed: a re-run submits nothing); ``submit`` when none of its name is
    queued; else ``replace`` (a job of another revision, an ended one, or several of one name).

    >>> job = SlurmJob("engine", "k3-engine", ("n0",), "/d/k3-engine.sbatch", "", "ab", "k3deploy:engine:ab")
    >>> [d.action for d in job_actions([job], [QueuedJob("7", "k3-engine", "RUNNING", "k3deploy:engine:ab", "n0")])]
    ['keep']
    >>> job_actions([job], [QueuedJob("7", "k3-engine", "RUNNING", "k3deploy:engine:00", "n0")])[0].cancel
    ('7',)
    >>> job_actions([job], [])[0].action
    'submit'
    """
    out = []
    for job in planned:
        mine = [q for q in queued if q.name == job.name]
        ids = tuple(q.id for q in mine)
        if not mine:
            out.append(Decision(job.group, "submit", (), "no job of this name is queued"))
        elif len(mine) == 1 and mine[0].comment == job.comment and mine[0].state in ACTIVE:
            why = f"job {mine[0].id} {mine[0].state} runs revision {job.revision}"
            out.append(Decision(job.group, "keep", (), why))
        else:
            seen = ", ".join(f"{q.id} {q.state} {q.comment or '(no comment)'}" for q in mine)
            out.append(Decision(job.group, "replace", ids, f"queued: {seen}; planned: {job.comment}"))
    return out


def changed_groups(rollout: Rollout, queued: Sequence[QueuedJob], failing: Sequence[str] = ()) -> set[str]:
    """The groups whose job must be (re)submitted (what :func:`k3deploy.model.rollout.mark_changes` is to the systemd
    launcher): every group that :func:`job_actions` does not keep, and the ``failing`` ones (a kept job whose serving
    nodes do not answer ``/health``); the router too when an engine group it fronts changes and there are no
    replicas (replicas roll behind a router that keeps serving)."""
    changed = {d.group for d in job_actions(jobs(rollout), queued) if d.action != "keep"} | set(failing)
    if changed - {"router"} and "router" in rollout.groups and len(rollout.replicas) <= 1:
        changed.add("router")
    return changed


@dataclass(frozen=True)
class EndedJob:
    id: str
    name: str
    state: str                      # COMPLETED, FAILED, NODE_FAIL, TIMEOUT, CANCELLED by N, ...
    exit_code: str                  # CODE:SIGNAL
    nodes: str
    end: str


def parse_accounting(text: str) -> list[EndedJob]:
    """The lines of :func:`accounting`.

    >>> parse_accounting("41|k3-engine|FAILED|1:0|n[0-1]|2026-12-05T07:00:00\\n")
    [EndedJob(id='41', name='k3-engine', state='FAILED', exit_code='1:0', nodes='n[0-1]', end='2026-12-05T07:00:00')]
    """
    out = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) >= 6:
            out.append(EndedJob(*f[:6]))
    return out


@dataclass(frozen=True)
class GroupJob:
    """A group's job as the submit host's ``squeue`` shows it (``k3deploy status``): Slurm keeps no record of a
    job that left the queue here (``sacct`` needs accounting), so a job gone from the queue is ``no job``."""

    name: str                       # the job name the group's job is submitted with
    id: str | None                  # None: no job of that name in the queue
    state: str                      # squeue's state (RUNNING, PENDING, ...), or "no job"
    planned: bool | None            # its --comment is the planned revision (None: no job)
    steps: tuple[tuple[str, str], ...] = ()   # its running steps: (JOBID.STEPID, node), one per unit's node

    def on(self, host: str) -> str:
        """The cell of ``host``'s unit in ``status`` under Slurm: its step and the job's state, else the job's.

        >>> job = GroupJob("k3-engine", "7", "RUNNING", True, (("7.1", "n0"),))
        >>> job.on("n0"), job.on("n1")
        ('7.1 RUNNING', 'job 7 RUNNING')
        """
        step = next((sid for sid, node in self.steps if node == host), None)
        if step is None:
            return self.shown()
        return f"{step} {self.state}" + ("" if self.planned else " (another revision)")

    @property
    def active(self) -> str:
        """The job's state as a systemd ActiveState, for the status verdicts: ``RUNNING`` is active, a job on its
        way to running (pending, configuring, requeued) activating, anything else (ending, no job) inactive.

        >>> GroupJob("k3-engine", "7", "RUNNING", True).active, GroupJob("k3-engine", None, NO_JOB, None).active
        ('active', 'inactive')
        """
        if self.state == "RUNNING":
            return "active"
        return "activating" if self.state in STARTING else "inactive"

    def shown(self) -> str:
        """One cell: ``job 7 RUNNING``, ``job 7 RUNNING (another revision)``, ``no job``."""
        if self.id is None:
            return NO_JOB
        return f"job {self.id} {self.state}" + ("" if self.planned else " (another revision)")


NO_JOB = "no job"
#: the states of a job on its way to running
STARTING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING"})


def group_jobs(planned: Sequence[SlurmJob], queued: Sequence[QueuedJob],
               steps: Sequence[tuple[str, str]] = ()) -> dict[str, GroupJob]:
    """Per group, its job in the queue: the newest of its name (several: a replacement on its way).

    >>> job = SlurmJob("engine", "k3-engine", ("n0",), "/d/k3-engine.sbatch", "", "ab", "k3deploy:engine:ab")
    >>> group_jobs([job], [QueuedJob("7", "k3-engine", "RUNNING", "k3deploy:engine:ab", "n0")])["engine"].shown()
    'job 7 RUNNING'
    >>> group_jobs([job], [])["engine"].shown()
    'no job'
    """
    out = {}
    for job in planned:
        mine = sorted((q for q in queued if q.name == job.name), key=lambda q: int(q.id) if q.id.isdigit() else 0)
        if not mine:
            out[job.group] = GroupJob(job.name, None, NO_JOB, None)
        else:
            q = mine[-1]
            own = tuple(sorted(((sid, node) for sid, node in steps if sid.partition(".")[0] == q.id),
                               key=lambda s: int(s[0].partition(".")[2])))
            out[job.group] = GroupJob(job.name, q.id, q.state, q.comment == job.comment, own)
    return out
