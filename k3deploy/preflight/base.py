"""What every preflight check works with: a host's facts (:class:`HostFacts`), one result (:class:`CheckResult`),
the collector the judges add results to (:class:`Results`), and what a vendor pack's preflight side provides
(:class:`VendorChecks`, :class:`VendorRun`, :class:`ClusterProbe`).

Nothing here touches a host. :mod:`k3deploy.preflight.checks` runs the checks; each vendor's judges live in
``k3deploy/vendors/<vendor>/checks.py`` and build on this module (never on :mod:`k3deploy.preflight.checks`, which
imports them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, Literal, TypeVar

from k3deploy.facts.base import FactError, K3Fact
from k3deploy.facts.health import HealthReading
from k3deploy.facts.host import AddressInterface, ContainerRuntime, DiskSpace, KernelRelease
from k3deploy.facts.rdma import GpuTopology, RdmaDevice
from k3deploy.facts.rollout import StageDaemon
from k3deploy.model.health import Health
from k3deploy.model.requirements import Requirements
from k3deploy.vendors import Pack
from k3deploy.vendors.base import Setting

CLUSTER = "cluster"
GIB = 1024**3

Status = Literal["pass", "warn", "fail"]

#: the fact plan's name of the hardware-health fact (:meth:`VendorChecks.health`; :meth:`HostFacts.read_health`)
HEALTH = "health"

Facts = TypeVar("Facts", bound="HostFacts")
Value = TypeVar("Value")


@dataclass(frozen=True)
class Read(Generic[Facts, Value]):
    """One fact to read on a host: its name in the host's batch (the field it fills), the fact and its arguments,
    and ``into``, the facts type's method that fills that field with what was read (the fact's value or its
    :class:`FactError`): typed, so a fact whose value is not its field's type is a type error, not a setattr.

        >>> from k3deploy.facts.host import KernelVersion
        >>> read, f = Read("kernel", KernelVersion, HostFacts.read_kernel), HostFacts("n1")
        >>> read.into(f, KernelVersion().process(["6.8.0-45-generic", "K3_EXIT=0"]))
        >>> read.spec[0], f.kernel.release
        ('kernel', '6.8.0-45-generic')
    """

    name: str
    fact: type[K3Fact[Value]]
    into: Callable[[Facts, Value | FactError], None]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> tuple[str, type[K3Fact[Value]], dict[str, Any]]:
        """As the facts batch takes it (:func:`k3deploy.facts.batch.read_batch`): (name, fact, arguments)."""
        return self.name, self.fact, self.kwargs

    def __iter__(self) -> Iterator[Any]:
        return iter(self.spec)


#: a fact to read on a host of a pack's facts type
FactSpec = Read[Any, Any]


@dataclass(frozen=True)
class CheckResult:
    host: str
    check: str
    status: Status
    observed: str
    required: str
    fix: str = ""


@dataclass
class HostFacts:
    """Facts of one host, as every host has them; a vendor pack's preflight side reads its own on top, as a type of
    its own (``NvidiaFacts``, ``AmdFacts``, ``AscendFacts``: :attr:`VendorChecks.facts_type`). None = not collected
    (the fact does not apply to this hardware)."""

    host: str
    address: str = ""
    unreachable: str | None = None  # the connection error, when the host could not be reached
    rdma: list[RdmaDevice] | FactError | None = None
    topology: GpuTopology | FactError | None = None  # how near each HCA sits to the accelerators (nvidia-smi topo -m)
    kernel: KernelRelease | FactError | None = None
    runtime: ContainerRuntime | FactError | None = None
    disk_images: DiskSpace | FactError | None = None
    disk_cache: DiskSpace | FactError | None = None
    shm: DiskSpace | FactError | None = None
    interface: AddressInterface | FactError | None = None
    stage_peers: StageDaemon | FactError | None = None   # the stage's rsync daemon, when a killed run left it up
    #: what the host's tools say is failing (``health_read``: the health fact was read; ``health_error``: it could
    #: not be), and the reason of its quarantine record (``<k3_config_dir>/quarantine``; None: not quarantined)
    health: Health = Health()
    quarantined: str | None = None
    health_read: bool = False
    health_error: FactError | None = None
    ib_hca: str | None = None  # k3_ib_hca: the RDMA ports the site names for NCCL and UCX (not read from the host)
    iface: str | None = None  # k3_iface: the interface the site names for NCCL/Gloo sockets (not read from the host)
    extra: dict[str, Any] = field(default_factory=dict)

    def read_rdma(self, value: list[RdmaDevice] | FactError) -> None:
        self.rdma = value

    def read_topology(self, value: GpuTopology | FactError) -> None:
        self.topology = value

    def read_kernel(self, value: KernelRelease | FactError) -> None:
        self.kernel = value

    def read_runtime(self, value: ContainerRuntime | FactError) -> None:
        self.runtime = value

    def read_disk_images(self, value: DiskSpace | FactError) -> None:
        self.disk_images = value

    def read_disk_cache(self, value: DiskSpace | FactError) -> None:
        self.disk_cache = value

    def read_shm(self, value: DiskSpace | FactError) -> None:
        self.shm = value

    def read_interface(self, value: AddressInterface | FactError) -> None:
        self.interface = value

    def read_stage_peers(self, value: StageDaemon | FactError) -> None:
        self.stage_peers = value

    def read_health(self, value: HealthReading | FactError) -> None:
        """The health fact's reading fills :attr:`health` and :attr:`quarantined` (its error, :attr:`health_error`).

            >>> f = HostFacts("n1")
            >>> f.read_health(HealthReading((), "XID 79 on GPU 0"))
            >>> f.health_read, f.quarantined, f.health.summary()
            (True, 'XID 79 on GPU 0', 'ok')
        """
        self.health_read = True
        if isinstance(value, HealthReading):
            self.health, self.quarantined = value.health, value.quarantined
        else:
            self.health_error = value


F = TypeVar("F", bound=HostFacts)


def as_type(facts: HostFacts, cls: type[F]) -> F:
    """``facts`` as a pack's facts type: itself when it is one; else its common facts, none of the pack's read (a
    host that could not be reached)."""
    if isinstance(facts, cls):
        return facts
    return cls(**{f.name: getattr(facts, f.name) for f in fields(HostFacts)})


@dataclass(frozen=True)
class Device:
    """One accelerator as the checks compare it: product name, memory in GiB (the recipe's GB), PCI device id."""

    name: str
    memory_gib: float | None
    device_id: str | None = None

    @property
    def shown(self) -> str:
        return f"{self.name} ({self.device_id})" if self.device_id else self.name


class Results:
    """The results of one run, in the order the checks add them; a passing result carries no fix."""

    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    def add(self, host: str, check: str, status: Status, observed: str, required: str, fix: str = "") -> None:
        self.results.append(CheckResult(host, check, status, observed, required, fix if status != "pass" else ""))

    def error(self, host: str, check: str, err: FactError, required: str, fix: str) -> None:
        self.add(host, check, "fail", err.message(host), required, fix)


def gib(value: float) -> str:
    return f"{value:.1f} GiB"


def unit_name(hardware: Any) -> str:
    return str(getattr(hardware, "label", None) or hardware.id)


def describe_mix(names: list[str]) -> str:
    counts = Counter(names)
    return ", ".join(f"{n}x {name}" for name, n in sorted(counts.items()))


class VendorRun:
    """One run of a vendor's judges over the planned hosts. The hooks are called per host, each where its results
    belong in the list (:func:`k3deploy.preflight.checks.run_checks`); each adds nothing by default."""

    def __init__(self, requirements: Requirements, hosts: Sequence[HostFacts]) -> None:
        self.requirements = requirements
        self.hosts = hosts

    def devices_listed(self, out: Results, facts: HostFacts) -> None:
        """The accelerators were listed (before their model and count are judged): the driver."""

    def after_devices(self, out: Results, facts: HostFacts, listed: bool) -> None:
        """After the accelerators (``listed``: they could be listed), before Docker: fabric, daemons, toolkit."""

    def after_rdma(self, out: Results, facts: HostFacts) -> None:
        """An RDMA port is active: the GPU's path to it."""

    def last(self, out: Results, facts: HostFacts) -> None:
        """After the host's common checks: the vendor's own driver and network checks."""

    def cluster(self, out: Results) -> None:
        """Once every host was judged: the vendor's cluster-wide results (before the planned memory's)."""


@dataclass(frozen=True)
class ProbeRound:
    """What a cluster-wide probe gets once every host's facts are in: pyinfra's state and the hosts, the target,
    each host's facts, whether every check so far passed, each host's derived settings, and the rollout where it
    was rendered (None: the probe's round comes before)."""

    state: Any
    hosts: list[Any]
    target: Any
    facts: list[HostFacts]
    ok: bool
    host_env: dict[str, dict[str, str]]
    rollout: Any = None


class ClusterProbe:
    """A pack's cluster-wide probe: a second round across hosts that no host's facts can replace (an NCCL
    all-reduce in the image, the NPUs' pings to their peers). ``check``: the id of its results; ``after_render``:
    it runs on the rendered rollout (else once every host's facts are in, before it is rendered)."""

    check: str = ""
    after_render: bool = False

    def run(self, at: ProbeRound) -> list[CheckResult]:
        """The probe's results (none where it does not apply to the plan)."""
        return []


def probe_not_run() -> CheckResult:
    """``k3_nccl_probe`` where the plan has no NCCL across nodes to probe (one node, or a pack without the probe)."""
    return CheckResult(CLUSTER, "nccl.probe", "pass", "not run: no multi-node NCCL over RDMA in this plan",
                       "k3_nccl_probe: a two-node NCCL all-reduce where NCCL crosses nodes")


class VendorChecks:
    """The preflight side of a vendor pack: the facts it reads, its accelerators as :class:`Device`, its judges
    (:meth:`begin` a :class:`VendorRun`) and the settings its facts derive."""

    pack: Pack
    #: the type of a host's facts on this vendor's hardware: the common ones and the pack's own fields
    facts_type: type[HostFacts] = HostFacts
    #: every fact of the vendor with the arguments a capture of a machine runs it with (``python -m
    #: k3deploy.preflight.runner --local``: :data:`k3deploy.preflight.runner.CAPTURE_FACTS`)
    capture: tuple[tuple[type[K3Fact[Any]], dict[str, Any]], ...] = ()

    def facts(self, requirements: Requirements) -> list[FactSpec]:
        """The vendor's facts to read on a host of this plan (before the RDMA ports and the common facts), each
        named as its field of :attr:`facts_type`."""
        return []

    def devices(self, facts: HostFacts) -> list[Device] | FactError | None:
        """The host's accelerators; None when they were not read."""
        return None

    def health(self, requirements: Requirements, config_dir: str) -> FactSpec | None:
        """The vendor's hardware-health fact (named :data:`HEALTH`), reading the quarantine record in
        ``config_dir`` too; None: the vendor reads none."""
        return None

    def begin(self, requirements: Requirements, hosts: Sequence[HostFacts]) -> VendorRun:
        return VendorRun(requirements, hosts)

    def probes(self) -> tuple[ClusterProbe, ...]:
        """The vendor's cluster-wide probes (their ids are the pack's ``probes``)."""
        return ()

    def nvlink(self, requirements: Requirements, facts: HostFacts) -> str | None:
        """Why the host's trays use multi-node NVLink (the pack's ``nvlink_env`` set to 1), None where they do not."""
        return None

    def rdma_settings(self, requirements: Requirements, facts: HostFacts) -> tuple[list[Setting], bool]:
        """Settings for the GPU's path to the RDMA ports (after NCCL_IB_HCA), and whether a kernel module
        (nvidia_peermem) must be loaded for it."""
        return [], False

