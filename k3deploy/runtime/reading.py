"""Reading the hosts: per host a typed plan of what the rollout reads there (:class:`ReadPlan`, a tuple of
:class:`Request` values, built by :func:`plan_host` from the layout and the :class:`~k3deploy.runtime.views.View`;
every host's at once by :func:`plan_hosts`, with the run's one launcher),
read in the same one command as the host's preflight facts (:func:`read_hosts`), into one typed
:class:`HostReading` per host.

Each request names its fact and its arguments, and says where its value goes in the reading (:meth:`Request.keep`):
adding something to read is one request class and one field.

Example::

    >>> plan = plan_host(layout, "n1", STATUS, resolver=None)          # doctest: +SKIP
    >>> [type(r).__name__ for r in plan.requests][:3]                   # doctest: +SKIP
    ['ReadUnit', 'ReadHelper', 'ReadImage']
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from pyinfra.api.facts import FactBase
from pyinfra.api.host import Host
from pyinfra.api.state import State

from k3deploy.facts.batch import read_batch
from k3deploy.facts.monitoring import ListeningPorts, MetricsPages
from k3deploy.facts.parallel import each_host
from k3deploy.facts.rollout import (
    CompileCaches,
    Executable,
    FileHash,
    FileOnHost,
    FileState,
    ImageDigest,
    RegistryDigest,
    Revisions,
    UnitOnHost,
    WeightsState,
    WeightsStatus,
)
from k3deploy.facts.spares import SpareFiles, SpareRecords
from k3deploy.facts.status import (
    DeployLock,
    EndpointModels,
    HealthCode,
    RouterWorkers,
    RuntimeReading,
    RuntimeTools,
    SlurmQueue,
    SlurmQueueReading,
    SlurmSiteFact,
    TakeLock,
    UnitLogs,
    UnitRun,
    UnitRuntime,
)
from k3deploy.model import images as image_pins
from k3deploy.model.compilecache import host_root
from k3deploy.model.images import LocalImage
from k3deploy.model.observed import Installed, token_path
from k3deploy.model.pipeline import Target
from k3deploy.model.revisions import GroupHistory, revisions_dir
from k3deploy.model.rollout import Placement
from k3deploy.model.slurm import SlurmSite, job_name
from k3deploy.model.units import GROUP_MEMBER, fence_paths
from k3deploy.preflight import runner
from k3deploy.preflight.checks import HostFacts
from k3deploy.runtime.connections import connect
from k3deploy.runtime.launchers import Launcher, launcher_for
from k3deploy.runtime.views import View
from k3deploy.vendors import pack_for_container

# ------------------------------------------------------------------------------------- the reading


@dataclass(frozen=True)
class HostReading:
    """What the rollout read on one host (its preflight facts are in :class:`HostFacts`); per unit by unit name,
    per group by group name. A field left at its default was not asked for (see :class:`View`)."""

    host: str
    installed: dict[str, Installed] = field(default_factory=dict)      # unit -> its files and state
    revisions: dict[str, GroupHistory] = field(default_factory=dict)   # group -> its revisions as this host lists them
    image: LocalImage | None = None            # what the host holds of the image's repository (engine hosts)
    helper_read: bool = False                  # the group-member helper was looked for (engine hosts)
    helper: str | None = None                  # its sha256 (None: not there)
    files: dict[str, FileState] = field(default_factory=dict)   # path -> a file the configure step writes in place
    weights: WeightsStatus | None = None       # what the cache holds of the model (engine hosts)
    compile_caches: tuple[str, ...] | None = None   # the compile cache keys it holds whole (engine hosts)
    router_command: bool | None = None         # k3_router_bin is an executable (a router host without its image)
    router_workers: tuple[str, ...] | None = None   # what the running router sends requests to (replicas)
    lock: list[str] | None = None              # the deployment lock's record there (empty: free)
    lock_taken: list[str] | None = None        # this run taking the lock there (:class:`TakeLockThere`)
    runs: dict[str, UnitRun] = field(default_factory=dict)           # unit -> as it runs (the view's ``running``)
    endpoint_models: tuple[str, ...] | None = None   # what the public endpoint lists (its first host; ``running``)
    health: dict[str, int | None] = field(default_factory=dict)      # unit -> its /health code (``health``)
    logs: dict[str, dict[str, str]] = field(default_factory=dict)    # unit -> journal, container log (``log_lines``)
    registry: list[str] | None = None          # the registry's answer for the image's tag (the resolving host)
    router_registry: list[str] | None = None   # the registry's answer for k3_router_image's tag (the router's host)
    router_image: LocalImage | None = None     # what the router's host holds of k3_router_image's repository
    slurm_queue: SlurmQueueReading | None = None   # k3deploy's jobs in the Slurm queue (k3_slurm_submit_host)
    slurm_site: SlurmSite | None = None        # its Slurm's version and settings (k3_slurm_submit_host)
    runtime: RuntimeReading | None = None      # its Slurm container runtime's tools, the staged image file
    spare_files: SpareFiles | None = None      # its spare records: substitutions, quarantine (views of installed)
    listening: frozenset[int] | None = None    # the TCP ports it listens on, reachable (the view's ``exporters``)
    metrics_pages: dict[int, str] | None = None   # exporter port -> what its /metrics answered (``exporters``)


#: the reading's fields kept per unit or per group (a request fills one entry of them)
PER_KEY = frozenset(f.name for f in fields(HostReading) if f.default_factory is dict)

# ------------------------------------------------------------------------------------- the requests


#: the metadata of a request's field that says where the value goes, not what the fact is asked
WHERE = {"argument": False}


@dataclass(frozen=True)
class Request(ABC):
    """One fact the rollout reads on a host, with its arguments (the request's fields, by the fact's parameter
    names; a field marked ``WHERE`` only says where the value goes); :meth:`keep` says where its value goes in the
    reading."""

    fact: ClassVar[type[FactBase[Any]]]

    def arguments(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("argument", True)}

    @abstractmethod
    def keep(self, value: Any) -> dict[str, Any]:
        """Where the fact's value belongs in the reading: its fields this value fills (a field per unit or per group:
        its one entry, ``{unit: value}``)."""


@dataclass(frozen=True)
class ReadUnit(Request):
    """A unit's systemd state and its unit and env files (and, on an engine's host, the token file's mode)."""

    fact = UnitOnHost
    unit: str
    unit_path: str
    env_path: str
    token_path: str | None

    def keep(self, value: Installed) -> dict[str, Any]:
        return {"installed": {self.unit: value}}


@dataclass(frozen=True)
class ReadRegistry(Request):
    """The digest the registry gives for the image's tag (asked from one host)."""

    fact = RegistryDigest
    image: str
    docker: str


    def keep(self, value: list[str] | None) -> dict[str, Any]:
        return {"registry": value}


@dataclass(frozen=True)
class ReadRouterRegistry(ReadRegistry):
    """The digest the registry gives for ``k3_router_image``'s tag (asked from the router's host, which pulls it)."""

    def keep(self, value: list[str] | None) -> dict[str, Any]:
        return {"router_registry": value}


@dataclass(frozen=True)
class ReadHelper(Request):
    """The sha256 of the node-side group-member helper."""

    fact = FileHash

    def arguments(self) -> dict[str, Any]:
        return {"path": GROUP_MEMBER}

    def keep(self, value: str | None) -> dict[str, Any]:
        return {"helper_read": True, "helper": value}


@dataclass(frozen=True)
class ReadFile(Request):
    """The sha256, owner and mode of a file the configure step writes in place (the fence units), as
    :func:`~k3deploy.runtime.operations.write_files` would read it: read with the host's facts, not in a command of
    its own."""

    fact = FileOnHost
    path: str

    def keep(self, value: FileState) -> dict[str, Any]:
        return {"files": {self.path: value}}


@dataclass(frozen=True)
class ReadImage(Request):
    """What the host holds of the image's repository (its digests)."""

    fact = ImageDigest
    image: str
    docker: str


    def keep(self, value: LocalImage) -> dict[str, Any]:
        return {"image": value}


@dataclass(frozen=True)
class ReadRouterImage(ReadImage):
    """What the router's host holds of ``k3_router_image``'s repository."""

    def keep(self, value: LocalImage) -> dict[str, Any]:
        return {"router_image": value}


@dataclass(frozen=True)
class ReadWeights(Request):
    """What the model cache holds of the model's weights."""

    fact = WeightsState
    cache: str
    model: str


    def keep(self, value: WeightsStatus) -> dict[str, Any]:
        return {"weights": value}


@dataclass(frozen=True)
class ReadCompileCaches(Request):
    """The compile cache keys the model cache holds whole (:mod:`k3deploy.model.compilecache`)."""

    fact = CompileCaches
    root: str

    def keep(self, value: tuple[str, ...]) -> dict[str, Any]:
        return {"compile_caches": value}


@dataclass(frozen=True)
class ReadRouterCommand(Request):
    """Whether the router's command (``k3_router_bin``) is an executable."""

    fact = Executable
    path: str


    def keep(self, value: bool) -> dict[str, Any]:
        return {"router_command": value}


@dataclass(frozen=True)
class ReadListening(Request):
    """The TCP ports the host listens on where others reach it (the exporters ``export prometheus`` finds)."""

    fact = ListeningPorts

    def keep(self, value: frozenset[int]) -> dict[str, Any]:
        return {"listening": value}


@dataclass(frozen=True)
class ReadMetricsPages(Request):
    """What ``/metrics`` answers at each exporter port on the host's address (``export prometheus`` confirms each
    exporter it finds listening by what it serves)."""

    fact = MetricsPages
    address: str
    ports: tuple[int, ...]

    def keep(self, value: dict[int, str]) -> dict[str, Any]:
        return {"metrics_pages": value}


@dataclass(frozen=True)
class ReadRouterWorkers(Request):
    """Which workers the running router sends requests to."""

    fact = RouterWorkers
    router: str


    def keep(self, value: tuple[str, ...] | None) -> dict[str, Any]:
        return {"router_workers": value}


@dataclass(frozen=True)
class ReadLock(Request):
    """The deployment lock's record (:mod:`k3deploy.runtime.lock`)."""

    fact = DeployLock
    config_dir: str


    def keep(self, value: list[str]) -> dict[str, Any]:
        return {"lock": value}


@dataclass(frozen=True)
class TakeLockThere(Request):
    """This run takes the deployment lock (:meth:`k3deploy.runtime.lock.Lock.settle` judges the answer): the first
    request of the host's command, so that what the command reads after it is read under the lock."""

    fact = TakeLock
    config_dir: str
    record: str

    def keep(self, value: list[str]) -> dict[str, Any]:
        return {"lock_taken": value}


@dataclass(frozen=True)
class ReadRevisions(Request):
    """A group's recorded revisions on the host."""

    fact = Revisions
    group: str = field(metadata=WHERE)
    directory: str


    def keep(self, value: GroupHistory) -> dict[str, Any]:
        return {"revisions": {self.group: value}}


@dataclass(frozen=True)
class ReadRunning(Request):
    """A unit as it runs: systemd, its container, its HTTP answers."""

    fact = UnitRuntime
    unit: str
    container: str
    docker: str
    url: str | None
    env_file: str | None = None          # the unit's env file: the API key its requests carry
    group_dir: str | None = None         # under Slurm: its start from its step output there (on ``host``)
    host: str | None = None


    def keep(self, value: UnitRun) -> dict[str, Any]:
        return {"runs": {self.unit: value}}


@dataclass(frozen=True)
class ReadEndpoint(Request):
    """The models the public endpoint lists."""

    fact = EndpointModels
    endpoint: str
    env_file: str | None = None          # a unit's env file on this host: the API key the request carries


    def keep(self, value: tuple[str, ...] | None) -> dict[str, Any]:
        return {"endpoint_models": value}


@dataclass(frozen=True)
class ReadHealth(Request):
    """The HTTP code of a serving unit's ``/health``."""

    fact = HealthCode
    unit: str = field(metadata=WHERE)
    url: str | None


    def keep(self, value: int | None) -> dict[str, Any]:
        return {"health": {self.unit: value}}


@dataclass(frozen=True)
class ReadLogs(Request):
    """The tail of a unit's journal and of its container's log (under Slurm: its step output in its group's newest
    job, ``group_dir`` and ``host`` set, instead of a journal)."""

    fact = UnitLogs
    unit: str
    container: str
    docker: str
    lines: int
    group_dir: str | None = None
    host: str | None = None


    def keep(self, value: dict[str, str]) -> dict[str, Any]:
        return {"logs": {self.unit: value}}


@dataclass(frozen=True)
class ReadSlurmQueue(Request):
    """k3deploy's jobs (by name) in the Slurm queue, on the submit host (``k3_launcher: slurm``)."""

    fact = SlurmQueue
    names: tuple[str, ...]
    user: str | None = None          # k3_slurm_user: read as that user

    def keep(self, value: SlurmQueueReading) -> dict[str, Any]:
        return {"slurm_queue": value}


@dataclass(frozen=True)
class ReadSlurmSite(Request):
    """The site's Slurm as the submit host's ``scontrol`` says it: its version, ``SwitchType``, ``Prolog``."""

    fact = SlurmSiteFact

    def keep(self, value: SlurmSite) -> dict[str, Any]:
        return {"slurm_site": value}


@dataclass(frozen=True)
class ReadRuntimeTools(Request):
    """The tools of the site's container runtime under Slurm on an engine node, and the image files it holds in
    ``folder`` (the launcher's :attr:`~k3deploy.runtime.launchers.Launcher.runtime_tools`; the folder where it
    stages a file: :attr:`~k3deploy.runtime.launchers.Launcher.image_file`)."""

    fact = RuntimeTools
    runtime: str
    folder: str = ""

    def keep(self, value: RuntimeReading) -> dict[str, Any]:
        return {"runtime": value}


@dataclass(frozen=True)
class ReadSpareRecords(Request):
    """The node's spare records (:mod:`k3deploy.model.spares`): substitutions in effect, its quarantine."""

    fact = SpareRecords
    config_dir: str

    def keep(self, value: SpareFiles) -> dict[str, Any]:
        return {"spare_files": value}


# ----------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ReadPlan:
    """What the rollout reads on one host, beside its preflight facts (empty: only those)."""

    host: str
    requests: tuple[Request, ...] = ()

    def specs(self) -> list[tuple[str, type[FactBase[Any]], dict[str, Any]]]:
        """The requests as the facts batch takes them: ``(name, fact, arguments)``, named by position."""
        return [(self._name(i, request), request.fact, request.arguments()) for i, request in enumerate(self.requests)]

    def taking_lock(self, request: TakeLockThere) -> ReadPlan:
        """This plan, the lock taken first (instead of only reading who holds it)."""
        return ReadPlan(self.host, (request, *(r for r in self.requests if not isinstance(r, ReadLock))))

    def reading(self, values: dict[str, Any]) -> HostReading | None:
        """The host's reading from the batch's values by name (None: they did not come back, the host failed)."""
        names = [self._name(i, request) for i, request in enumerate(self.requests)]
        if any(name not in values for name in names):
            return None
        filled: dict[str, Any] = {}
        for name, request in zip(names, self.requests, strict=True):
            for where, value in request.keep(values[name]).items():
                filled[where] = {**filled[where], **value} if where in PER_KEY and where in filled else value
        return HostReading(self.host, **filled)

    @staticmethod
    def _name(index: int, request: Request) -> str:
        return f"{type(request).__name__}.{index}"


def router_resolver(layout: Placement) -> str | None:
    """The host that asks the registry which build ``k3_router_image``'s tag names: the router's (it pulls the
    image), or None where the router runs no image, its image is pinned already or resolution is off
    (``k3_image_resolve: false``), or a rollback runs the revision's build."""
    variables = layout.vars
    image = variables.k3_router_image
    if not image or variables.k3_rollback is not False or not image_pins.to_resolve(
            image, resolve=variables.k3_image_resolve, archive=False):
        return None
    return next((u.host for u in layout.units if u.group == "router"), None)


def plan_hosts(layout: Placement, hosts: Sequence[str], view: View, resolver: str | None) -> dict[str, ReadPlan]:
    """Each of ``hosts``' :func:`plan_host`, with one launcher (:func:`~k3deploy.runtime.launchers.launcher_for`)
    for them all."""
    launcher = launcher_for(layout)
    return {host: plan_host(layout, host, view, resolver, launcher) for host in hosts}


def _metrics_pages(layout: Placement, host: str) -> tuple[Request, ...]:
    """The read of what the host's exporters serve: at the address their targets name, the node exporter's port and
    the accelerators' (the pack's, or ``k3_gpu_exporter_port``); nothing where neither is scraped."""
    v = layout.vars
    pack = pack_for_container(layout.plan.vendor)
    gpu = v.k3_gpu_exporter_port if v.k3_gpu_exporter_port is not None else \
        pack.exporter.port if pack is not None and pack.exporter is not None else 0
    ports = tuple(dict.fromkeys(p for p in (v.k3_node_exporter_port, gpu) if p))
    units = layout.on_host(host)
    if not ports or not units:
        return ()
    return (ReadMetricsPages(units[0].node.address, ports),)


def plan_host(layout: Placement, host: str, view: View, resolver: str | None,
              launcher: Launcher | None = None) -> ReadPlan:
    """What ``view`` reads on ``host`` of the rollout laid out in ``layout``: each unit (state and files), the
    image's digests there, the weights, the lock and the revisions of every group with a unit here; on
    ``k3_slurm_submit_host`` (``k3_launcher: slurm``) the groups' jobs in the Slurm queue and the site's Slurm
    (its ``scontrol``, in every view that reads the hosts, ``preflight`` too); on ``resolver``
    the digest the registry gives for the image's tag (also in a view that reads nothing installed but pins the
    image); with ``running`` each unit as it runs and, on the first host, what the endpoint lists; else with
    ``health`` whether each serving unit's ``/health`` answers; with ``log_lines`` each unit's logs. ``launcher``:
    the layout's (:func:`plan_hosts` makes one for every host; None: made here)."""
    variables = layout.vars
    registry = ReadRegistry(layout.plan.image, variables.k3_docker)
    launcher = launcher if launcher is not None else launcher_for(layout)
    site: tuple[Request, ...] = (ReadSlurmSite(),) if host == launcher.queue_host else ()   # preflight reads it too
    router = router_resolver(layout) == host and (view.installed or view.pins_image)
    router_registry = (ReadRouterRegistry(variables.k3_router_image or "", variables.k3_docker),) if router else ()
    listening: tuple[Request, ...] = (ReadListening(), *_metrics_pages(layout, host)) if view.exporters else ()
    tools = launcher.runtime_tools
    engine_host = host in layout.spares or any(u.group != "router" for u in layout.on_host(host))
    # the runtime's tools (preflight's slurm.container) and the image file it runs from, on every engine node
    held = launcher.image_file
    runtime: tuple[Request, ...] = (ReadRuntimeTools(tools.name, held.rsplit("/", 1)[0] if held else ""),) \
        if tools is not None and engine_host else ()
    if not view.installed:
        return ReadPlan(host, ((registry,) if view.pins_image and host == resolver else ()) + site + router_registry
                        + listening + runtime)
    mine = layout.on_host(host)
    token = token_path(variables.k3_config_dir) if variables.k3_hf_token_file else None   # with an engine's files
    # (under Slurm a unit's file is its launch script: what its job's step runs, beside its env file)
    out: list[Request] = [ReadUnit(u.unit, launcher.unit_file(u), u.env_path,
                                   token if u.group != "router" else None) for u in mine]
    if host == resolver:
        out.append(registry)
    if any(u.group != "router" for u in mine):
        out += [ReadHelper(), *(ReadFile(p) for p in fence_paths(variables.k3_fence_port)),
                ReadImage(layout.plan.image, variables.k3_docker),
                ReadWeights(variables.k3_model_cache, layout.plan.model)]
        if variables.k3_compile_cache:
            out.append(ReadCompileCaches(host_root(variables.k3_model_cache)))
    if any(u.group == "router" for u in mine) and not variables.k3_router_image:
        out.append(ReadRouterCommand(variables.k3_router_bin))
    if any(u.group == "router" for u in mine) and variables.k3_router_image:
        out += [*router_registry, ReadRouterImage(variables.k3_router_image, variables.k3_docker)]
    if len(layout.replicas) > 1:   # which replicas the router sends requests to
        out += [ReadRouterWorkers(u.serves) for u in mine if u.group == "router" and u.serves]
    if host == launcher.queue_host:   # the groups' jobs
        out += [ReadSlurmQueue(tuple(job_name(g, variables.k3_unit_name) for g in layout.groups),
                               variables.k3_slurm_user), *site]
    out.append(ReadLock(variables.k3_config_dir))
    out += [ReadRevisions(g, revisions_dir(variables.k3_config_dir, g))
            for g in layout.groups if any(u.host == host for u in layout.group(g))]
    if view.running:
        out += [ReadRunning(u.unit, u.container, variables.k3_docker, u.serves, u.env_path, launcher.log_dir(u),
                            host if launcher.log_dir(u) is not None else None) for u in mine]
        if layout.units and host == layout.hosts[0]:
            out.append(ReadEndpoint(layout.endpoint, mine[0].env_path))
    elif view.health:
        out += [ReadHealth(u.unit, u.serves) for u in mine if u.serves]
    if view.log_lines:   # (under Slurm the step output of each unit's job, not a journal)
        out += [ReadLogs(u.unit, u.container, variables.k3_docker, view.log_lines,
                         launcher.log_dir(u), host if launcher.log_dir(u) is not None else None) for u in mine]
    if not mine:
        out += standing_by(layout)
    out.append(ReadSpareRecords(variables.k3_config_dir))
    return ReadPlan(host, (*out, *runtime))


def standing_by(layout: Placement) -> list[Request]:
    """What is read on a host without a unit (a spare, or a member that was lost): whether any of the rollout's
    units is installed or runs there (it must run nothing), and what it holds of the image and the weights (a
    spare is staged like an engine host)."""
    variables = layout.vars
    seen: dict[str, Request] = {}
    for u in layout.units:
        seen.setdefault(u.unit, ReadUnit(u.unit, u.unit_path, u.env_path, None))
    return [*seen.values(), ReadImage(layout.plan.image, variables.k3_docker),
            ReadWeights(variables.k3_model_cache, layout.plan.model)]


# ---------------------------------------------------------------------------------------- the read


def read_hosts(state: State, hosts: list[Host], wanted: Target, plans: dict[str, ReadPlan], *,
               connect_first: bool) -> tuple[list[HostFacts], dict[str, HostReading]]:
    """Every host at once, one command each: its preflight facts and what its plan asks (an unreachable host
    becomes a host with its connection error, and has no reading). The facts of a host whose reading holds its
    weights carry them too (``HostFacts.extra["weights"]``: the cache's space check counts only what is missing)."""
    requirements, variables = wanted.requirements, wanted.vars

    def one(host: Host) -> tuple[HostFacts, HostReading | None]:
        mine = wanted.host_vars(host.name)
        if connect_first:
            reason = connect(host, mine.k3_link_timeout)
            if reason is not None:
                return HostFacts(host=host.name, address=runner.host_address(host), unreachable=reason), None
        plan = plans.get(host.name) or ReadPlan(host.name)
        facts = runner.host_facts(state, host, requirements, variables.k3_model_cache, variables.k3_image_dir,
                                  plan.specs() or None, ib_hca=mine.k3_ib_hca, iface=mine.k3_iface,
                                  config_dir=variables.k3_config_dir)
        reading = plan.reading(facts.extra) if plan.requests else None
        facts.extra = {"weights": reading.weights} if reading is not None and reading.weights is not None else {}
        return facts, reading

    both = each_host(state, hosts, one)
    return [facts for facts, _ in both], {r.host: r for _, r in both if r is not None}


def read_again(state: State, hosts: list[Host], plans: dict[str, ReadPlan]) -> dict[str, HostReading]:
    """What ``plans`` ask of these (reachable) hosts, without their preflight facts again: after the spares changed
    who runs what (:mod:`k3deploy.model.spares`), the hosts whose part changed. A host that fails has no reading."""
    def one(host: Host) -> HostReading | None:
        plan = plans[host.name]
        try:
            return plan.reading(read_batch(state, host, plan.specs()))
        except Exception:  # the connection went in between: the host is read as failed
            return None

    return {r.host: r for r in each_host(state, hosts, one) if r is not None}
