"""Facts ``k3deploy status`` reads: each unit as it runs (systemd state, restarts, since when, the container's
image, ``/health`` and ``/v1/models``) and the model ids the public endpoint lists.

Example::

    >>> run = UnitRuntime().process(["K3_LoadState=loaded", "K3_ActiveState=active", "K3_SubState=running",
    ...     "K3_NRestarts=0", "K3_ActiveEnterTimestamp=@1764750000", "K3_IMAGE=vllm/vllm-openai:kimi-k3 sha256:2e42",
    ...     "K3_HEALTH=200", 'K3_MODELS={"data":[{"id":"moonshotai/Kimi-K3"}]}'])
    >>> run.active, run.health, run.models, run.image_id
    ('active', 200, ('moonshotai/Kimi-K3',), 'sha256:2e42')
    >>> EndpointModels().process(['{"data":[{"id":"m"}]}'])
    ('m',)
    >>> RouterWorkers().process(['{"urls":["http://10.0.0.2:8000","http://10.0.0.1:8000"]}'])
    ('http://10.0.0.2:8000', 'http://10.0.0.1:8000')
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.facts import FactBase

from k3deploy.model.commands import (
    endpoint_models,
    health_code,
    job_logs,
    lock_read,
    lock_take,
    router_workers,
    unit_logs,
    unit_status,
)
from k3deploy.model.jobcontainers import RUNTIMES, parse_tools, tools_probe
from k3deploy.model.slurm import (
    SITE_KEYS,
    QueuedJob,
    SlurmSite,
    parse_queue,
    parse_site,
    parse_steps,
    queue,
    steps_query,
)
from k3deploy.model.startup import BEGIN, CLOCK, LINE, STEP


def model_ids(text: str) -> tuple[str, ...] | None:
    """The ids of an OpenAI ``/v1/models`` answer; None when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    return tuple(str(m.get("id")) for m in data["data"] if isinstance(m, dict))


@dataclass(frozen=True)
class UnitRun:
    """One unit as it runs now."""

    active: str = "absent"              # ActiveState, or "absent" when the unit is not installed
    sub: str = ""
    restarts: int = 0
    since: float | None = None          # when it last became active (epoch seconds)
    image: str | None = None            # the container's image reference
    image_id: str | None = None
    health: int | None = None           # HTTP code of /health (0: no answer); None: the unit serves no HTTP
    models: tuple[str, ...] | None = None
    startup: tuple[str, ...] = ()       # its last start's lines (:func:`k3deploy.model.startup.parse`)


class UnitRuntime(FactBase[UnitRun]):
    """One unit as it runs (see :func:`k3deploy.model.commands.unit_status`)."""

    def command(self, unit: str, container: str, docker: str = "docker", url: str | None = None,
                env_file: str | None = None, group_dir: str | None = None, host: str | None = None) -> str:
        return unit_status(unit, container, docker, url, env_file, group_dir, host)

    def process(self, output: list[str]) -> UnitRun:
        values: dict[str, str] = {}
        started = tuple(line for line in output if line.startswith((BEGIN, LINE, STEP, CLOCK)))
        for line in output:
            if line.startswith((LINE, STEP, CLOCK)):
                continue
            key, sep, value = line.partition("=")
            if sep and key.startswith("K3_"):
                values[key[3:]] = value.strip()
        active = "absent" if values.get("LoadState") == "not-found" else values.get("ActiveState", "absent")
        stamp = values.get("ActiveEnterTimestamp", "").lstrip("@")
        image, _, image_id = values.get("IMAGE", "").partition(" ")
        health = values.get("HEALTH")
        return UnitRun(active=active, sub=values.get("SubState", ""), restarts=int(values.get("NRestarts") or 0),
                       since=float(stamp) if stamp.replace(".", "", 1).isdigit() and float(stamp) > 0 else None,
                       image=image or None, image_id=image_id or None,
                       health=(int(health) if health.isdigit() else 0) if health is not None else None,
                       models=model_ids(values["MODELS"]) if "MODELS" in values else None, startup=started)

    @staticmethod
    def default() -> UnitRun:
        return UnitRun()


class EndpointModels(FactBase["tuple[str, ...] | None"]):
    """The model ids the public endpoint lists, asked from this host; None when it does not answer."""

    def command(self, endpoint: str, env_file: str | None = None) -> str:
        return endpoint_models(endpoint, env_file)

    def process(self, output: list[str]) -> tuple[str, ...] | None:
        return model_ids("".join(output).strip())


class RouterWorkers(FactBase["tuple[str, ...] | None"]):
    """The workers a running vllm-router sends requests to (``GET /list_workers``), asked on the router's host;
    None when it does not answer."""

    def command(self, router: str) -> str:
        return router_workers(router)

    def process(self, output: list[str]) -> tuple[str, ...] | None:
        try:
            data = json.loads("".join(output).strip())
        except ValueError:
            return None
        urls = data.get("urls") if isinstance(data, dict) else None
        return tuple(str(u) for u in urls) if isinstance(urls, list) else None


class UnitLogs(FactBase[dict[str, str]]):
    """The tail of a unit's journal and of its container's log: ``{"journal": ..., "container": ...}``. Under
    ``k3_launcher: slurm`` (``group_dir``: its group's directory under ``k3_slurm_dir``, ``host``: this node) no
    journal but the id of the group's newest job here, the tail of this node's step output in it (and of the job's
    own output, on its batch host): ``{"job": ..., "step": ..., "batch": ..., "container": ...}``.

        >>> UnitLogs().process(["K3_LOG=job", "42", "K3_LOG=step", "INFO up", "K3_LOG=container", "x"])
        {'job': '42\\n', 'step': 'INFO up\\n', 'container': 'x\\n'}
    """

    def command(self, unit: str, container: str, docker: str = "docker", lines: int = 300,
                group_dir: str | None = None, host: str | None = None) -> str:
        if group_dir is not None and host is not None:
            return job_logs(group_dir, host, container, docker, lines)
        return unit_logs(unit, container, docker, lines)

    def process(self, output: list[str]) -> dict[str, str]:
        out: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in output:
            if line.startswith("K3_LOG="):
                current = out.setdefault(line[len("K3_LOG="):].strip(), [])
            elif current is not None:
                current.append(line)
        return {k: "".join(f"{x}\n" for x in v) for k, v in out.items()}

    @staticmethod
    def default() -> dict[str, str]:
        return {}


class HealthCode(FactBase[int]):
    """The HTTP code of ``url``'s ``/health`` asked from this host (0: no answer within 3 s)."""

    def command(self, url: str) -> str:
        return health_code(url)

    def process(self, output: list[str]) -> int:
        text = output[-1].strip() if output else ""
        return int(text) if text.isdigit() else 0

    @staticmethod
    def default() -> int:
        return 0


class TakeLock(FactBase["list[str]"]):
    """This run takes the deployment lock on the host (:func:`~k3deploy.model.commands.lock_take`), in the command
    that reads the host: ``K3_LOCK=taken``, or ``K3_LOCK=held`` and the holder's record.

        >>> TakeLock().process(["K3_LOCK=taken", ""])
        ['K3_LOCK=taken']
    """

    def command(self, config_dir: str, record: str) -> str:
        return lock_take(config_dir, record)

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip()]

    @staticmethod
    def default() -> list[str]:
        return []


class DeployLock(FactBase["list[str]"]):
    """The record of the deployment lock held on the host (:mod:`k3deploy.runtime.lock`); empty when it is free.

        >>> DeployLock().process(['{"run": "3f2a"}'])
        ['{"run": "3f2a"}']
    """

    def command(self, config_dir: str) -> str:
        return lock_read(config_dir)

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip()]

    @staticmethod
    def default() -> list[str]:
        return []


#: the lines :class:`SlurmSiteFact`'s command prints before ``scontrol --version`` and ``scontrol show config``
SITE_VERSION, SITE_CONFIG = "K3_SLURM_VERSION", "K3_SLURM_CONFIG"


class SlurmSiteFact(FactBase[SlurmSite]):
    """What the submit host's Slurm says of the site (:class:`k3deploy.model.slurm.SlurmSite`): ``scontrol
    --version`` and the lines of ``scontrol show config`` the deploy reads (:data:`k3deploy.model.slurm.SITE_KEYS`).

        >>> SlurmSiteFact().process([SITE_VERSION, "slurm 24.05.3", SITE_CONFIG,
        ...                          "SwitchType              = switch/nvidia_imex"])
        SlurmSite(version='24.05.3', switch='switch/nvidia_imex', prolog=(), error=None)
        >>> SlurmSiteFact().process([SITE_VERSION, "bash: scontrol: command not found", SITE_CONFIG]).error
        'scontrol printed no version: bash: scontrol: command not found'
    """

    def command(self) -> str:
        keys = "|".join(SITE_KEYS)
        return (f"echo {SITE_VERSION}; scontrol --version 2>&1 | tail -n 3; echo {SITE_CONFIG}; "
                f"scontrol show config 2>/dev/null | grep -E '^({keys})(\\[[0-9]+\\])? +='")

    def process(self, output: list[str]) -> SlurmSite:
        text = "\n".join(output)
        _, _, rest = text.partition(SITE_VERSION)
        version, _, config = rest.partition(SITE_CONFIG)
        site = parse_site(version, config)
        if site.error is not None and version.strip():
            return SlurmSite(site.version, site.switch, site.prolog, f"{site.error}: {' '.join(version.split())}")
        return site

    @staticmethod
    def default() -> SlurmSite:
        return SlurmSite(error="scontrol gave no answer")


@dataclass(frozen=True)
class RuntimeReading:
    """A node's Slurm container runtime as it answered: what of its tools it lacks (each as the stage's check says
    it: ``no enroot on PATH``) and the names of the image files it holds whole (each with its checksum), in the
    stage's images directory."""

    lacks: tuple[str, ...] = ()
    files: tuple[str, ...] = ()


class RuntimeTools(FactBase[RuntimeReading]):
    """A node's tools of the site's container runtime under Slurm (``k3_slurm_container``: pyxis's enroot and
    ``srun --container-image``, or apptainer) and, where given, the image files in ``folder``
    (:func:`k3deploy.model.jobcontainers.tools_probe`).

        >>> RuntimeTools().process(["K3_LACKS no enroot on PATH"])
        RuntimeReading(lacks=('no enroot on PATH',), files=())
    """

    def command(self, runtime: str, folder: str = "") -> str:
        rt = RUNTIMES.get(runtime)
        if rt is None:   # no runtime of that name: nothing of it to look for (the variable's type refuses it first)
            return "true"
        return tools_probe(rt, folder or None)

    def process(self, output: list[str]) -> RuntimeReading:
        lacks, files = parse_tools(output)
        return RuntimeReading(lacks, files)

    @staticmethod
    def default() -> RuntimeReading:
        return RuntimeReading()


#: the line :class:`SlurmQueue`'s command prints first when ``squeue`` answered (its lines follow), and when it
#: failed (its error follows)
SQUEUE_OK, SQUEUE_FAILED = "K3_SQUEUE", "K3_SQUEUE_FAILED"
#: where the queue's running steps follow its jobs (:func:`k3deploy.model.slurm.steps_query`)
STEPS_MARK = "K3_SQUEUE_STEPS"


@dataclass(frozen=True)
class SlurmQueueReading:
    """What the submit host's ``squeue`` holds of k3deploy's jobs; ``error``: squeue failed (what it said)."""

    jobs: tuple[QueuedJob, ...] = ()
    error: str | None = None
    steps: tuple[tuple[str, str], ...] = ()   # the running steps of one node (:func:`parse_steps`)


class SlurmQueue(FactBase[SlurmQueueReading]):
    """This user's jobs of these names in the Slurm queue (:func:`k3deploy.model.slurm.queue`), read on the submit
    host (``k3_launcher: slurm``).

        >>> SlurmQueue().process([SQUEUE_OK, "41 k3-engine RUNNING k3deploy:engine:0123 n[0-1]"]).jobs[0].id
        '41'
        >>> SlurmQueue().process([SQUEUE_FAILED, "squeue: error: Unable to contact slurm controller"]).error
        'squeue: error: Unable to contact slurm controller'
    """

    def command(self, names: Sequence[str], user: str | None = None) -> str:
        return (f"if k3_q=$({queue(list(names), user)} 2>&1); then echo {SQUEUE_OK}; printf '%s\\n' \"$k3_q\"; "
                f"echo {STEPS_MARK}; {steps_query(user)} 2>/dev/null || true; "
                f"else echo {SQUEUE_FAILED}; printf '%s\\n' \"$k3_q\" | tail -n 3; fi")

    def process(self, output: list[str]) -> SlurmQueueReading:
        if output and output[0].strip() == SQUEUE_FAILED:
            return SlurmQueueReading(error=" ".join(x.strip() for x in output[1:] if x.strip()) or "no output")
        if not output or output[0].strip() != SQUEUE_OK:
            return SlurmQueueReading(error=" ".join(x.strip() for x in output if x.strip())[:300] or "no output")
        jobs, _, steps = "\n".join(output[1:]).partition(STEPS_MARK)
        return SlurmQueueReading(tuple(parse_queue(jobs)), steps=parse_steps(steps))

    @staticmethod
    def default() -> SlurmQueueReading:
        return SlurmQueueReading(error="squeue gave no answer")
