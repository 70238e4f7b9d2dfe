"""What a vendor pack is: one frozen :class:`Pack` per vendor family, made of plain data.

Pure (stdlib only). A pack says, for its vendor: the tool that lists the accelerators, its checks (each a
:class:`Check`: id, the command a person runs to see what it reads, what is required, the usual fix), the
collective/transport settings a host's facts turn into (:class:`Transport`), what the engine container gets
(:class:`Container`) and a few switches (whether the recipes site's ``docker run`` form runs there, which
cluster-wide probes apply). The judges of the checks, which read fact values, live at the preflight layer
(``k3deploy/vendors/<vendor>/checks.py``).

Example::

    >>> c = Check("disk.shm", "df -h /dev/shm", ">= 16 GiB of /dev/shm", "enlarge /dev/shm")
    >>> c.command_for(Spot())
    'df -h /dev/shm'
    >>> words_match("AMD Instinct MI300X OAM", ["AMD Instinct MI300X"]), words_match("MI300A", ["MI300X"])
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Spot:
    """Where a check's command runs, as far as the command needs it: the node's cluster address, the model cache,
    the router command, the planned image, the accelerators per node, the stage daemon's unit and the deploy's
    records (``k3_config_dir``) (the runbook
    fills them from the rollout: :func:`k3deploy.model.runbook.checks.spot_for`)."""

    address: str = ""
    cache: str = "/var/lib/k3deploy/cache"
    router_bin: str = "/usr/local/bin/vllm-router"
    image: str = "IMAGE"
    devices: int = 8
    peers_unit: str = "STAGE_UNIT"
    config_dir: str = "/etc/k3deploy"


#: a command: its text, or a function of the spot it runs on
CommandText = str | Callable[[Spot], str]


@dataclass(frozen=True)
class Check:
    """One registered check: its id, the command a person runs to see what it reads, what is required and the
    usual fix. ``fact``: the fact class whose ``shown_command`` is this command (the same source, named once);
    ``where``: where a person runs the command (``control``: on the machine holding the inventory); ``each_node``:
    every node of the plan reports it (False: one host, the router host, or the cluster as a whole)."""

    id: str
    command: CommandText
    required: str
    fix: str
    fact: str = ""
    where: Literal["node", "control"] = "node"
    each_node: bool = True

    def command_for(self, spot: Spot) -> str:
        return self.command if isinstance(self.command, str) else self.command(spot)


@dataclass(frozen=True)
class Transport:
    """The collective/transport settings derived from a host's facts (:meth:`settings`, the one derivation).

    ``socket_env``: variables set to the interface carrying the node's address (those in ``exact_socket_env`` get
    NCCL's exact-match form ``=eth1``); ``address_env``: a variable set to that address; ``nvlink_env``: set to 1
    where the trays talk over multi-node NVLink (``nvlink_why``: why, of the hardware's id); ``rdma_ports``: NCCL/UCX
    use the host's RDMA ports (False: the accelerators have their own ports); ``ucx_tls``: RC verbs plus the vendor's
    GPU-memory copy transport for the P/D KV transfer (NIXL over UCX), None where there is none; ``gpu_path_assumed``:
    what the derivation from blanks (no facts: the offline runbook, the Kubernetes export) assumes of the GPU's path
    to the RDMA ports, which a host's facts decide online (``HostAnswers.gpu_path``), and what a node where it does
    not hold needs ("": the vendor sets nothing for it)."""

    socket_env: tuple[str, ...]
    exact_socket_env: tuple[str, ...] = ()
    address_env: str | None = None
    nvlink_env: tuple[str, ...] = ()
    rdma_ports: bool = True
    ucx_tls: str | None = None
    nvlink_why: str = "{hardware}: multi-node NVLink"
    gpu_path_assumed: str = ""

    def nvlink(self, hardware: Any) -> str | None:
        """Why the hardware's trays talk over multi-node NVLink (an NVL72 compute tray: ``nvlink_why``), as far as
        its profile says (the host's own fabric may still say otherwise: the pack's judge); None where they do not."""
        if not (self.nvlink_env and getattr(hardware, "nvl", False)):
            return None
        return self.nvlink_why.format(hardware=hardware.id)

    def settings(self, answers: HostAnswers, pd: bool) -> list[Setting]:
        """The one derivation of a host's collective/transport settings (variable, value, why) from what the host
        answers: read from its facts (``k3deploy preflight``, the deploy) or, before the nodes answer, blanks that
        stand for the same values (the offline runbook, the Kubernetes export). ``pd``: the plan is P/D (NIXL over
        UCX carries the KV transfer).

            >>> t = Transport(("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"), ("NCCL_SOCKET_IFNAME",), ucx_tls="rc,x")
            >>> env = dict((k, v) for k, v, _ in t.settings(HostAnswers("eth1", "carries 10.0.0.1",
            ...                                                         ports="mlx5_0:1"), pd=True))
            >>> env
            {'NCCL_SOCKET_IFNAME': '=eth1', 'GLOO_SOCKET_IFNAME': 'eth1', 'NCCL_IB_HCA': '=mlx5_0:1', \
'UCX_TLS': 'rc,x', 'UCX_NET_DEVICES': 'mlx5_0:1'}
        """
        out: list[Setting] = []
        ifname, why = answers.interface, answers.interface_why
        if ifname:
            for key in self.socket_env:
                if key in self.exact_socket_env:
                    out.append((key, "=" + ifname, why + " (=: this name exactly, not a prefix)"))
                else:
                    out.append((key, ifname, why))
            if self.address_env and answers.address:
                out.append((self.address_env, answers.address, f"address of {ifname}"))
        if answers.nvlink is not None:
            out += [(key, "1", answers.nvlink) for key in self.nvlink_env]
        if not (self.rdma_ports and answers.ports):
            return out
        out.append(("NCCL_IB_HCA", "=" + answers.ports, answers.ports_why))
        out += answers.gpu_path
        if pd:
            if self.ucx_tls:
                out.append(("UCX_TLS", self.ucx_tls, "RDMA carries the P/D KV transfer (NIXL over UCX)"))
            out.append(("UCX_NET_DEVICES", answers.ports,
                        f"the ports of NCCL_IB_HCA ({answers.ports_why}) for NIXL's UCX, which reads no NCCL_* "
                        "variable"))
        return out


#: a derived setting: (variable, value, why)
Setting = tuple[str, str, str]


@dataclass(frozen=True)
class HostAnswers:
    """What one host answers to the transport settings (:meth:`Transport.settings`): the interface for the
    bootstrap sockets (without NCCL's ``=``) and why; the address it carries (None: not known to carry the node's
    address); why its trays use multi-node NVLink (None: they do not); the RDMA ports NCCL and UCX use
    (``mlx5_0:1,mlx5_1:1``; None: none) and why; the vendor's settings for the GPU's path to those ports (after
    ``NCCL_IB_HCA``). Each value is what the host's facts say or, offline, a blank's token."""

    interface: str | None = None
    interface_why: str = ""
    address: str | None = None
    nvlink: str | None = None
    ports: str | None = None
    ports_why: str = ""
    gpu_path: tuple[Setting, ...] = ()


@dataclass(frozen=True)
class Container:
    """What the engine container gets on this vendor's hosts, in ``docker run`` order: ``flags``, one ``--device``
    per accelerator (``per_device`` with ``{index}``), ``devices``, the driver ``mounts`` (host, container) before
    the model cache, and ``imex_device`` where the plan uses IMEX. ``docker_runtime``: the Docker runtime it needs
    (with ``runtime_fix``); ``after_units`` (and ``imex_units`` with IMEX): units the engine starts after;
    ``rdma_devices``: ``/dev/infiniband`` and memlock across nodes; ``login_profile``: ``vllm serve`` runs under
    ``bash -lc`` with this sourced first.

    On Kubernetes (:mod:`k3deploy.model.kubernetes`): ``k8s_resource`` is the extended resource the vendor's device
    plugin advertises (one per accelerator), ``k8s_capabilities`` the Linux capabilities the ``docker run`` flags
    add, ``k8s_privileged`` a privileged container (as ``--privileged``), ``k8s_unconfined`` no seccomp profile (as
    ``--security-opt seccomp=unconfined``), ``k8s_imex_api`` the API of the DRA
    driver's ``ComputeDomain`` that hands a pod its IMEX channel where the plan uses one; ``k8s_device_plugin``
    names what advertises ``k8s_resource`` (the export's README.txt says it), ``k8s_dra_class`` the DeviceClass
    of the vendor's DRA driver (``k3_k8s_gpus: dra``; None: the vendor has none) and ``k8s_dra_driver`` names that
    driver, with the version it needs.

    Under Slurm (:mod:`k3deploy.model.slurm`): ``slurm_gres`` is the name of the accelerators' generic resource in
    the site's ``gres.conf`` (``Name=``), what an engine job's ``--gres`` asks for (``k3_slurm_gres`` overrides);
    ``slurm_runtime`` is the container runtime the vendor documents for its Slurm sites (``pyxis``, ``docker``,
    ``apptainer``; ``k3_slurm_container`` overrides it, :mod:`k3deploy.model.jobcontainers`), ``slurm_runtime_source``
    where it says so, and ``apptainer_flags`` what hands the accelerators to an Apptainer container (``--nv``,
    ``--rocm``: the Apptainer user guide, "GPU Support").

    ``jit_caches``: where the vendor's kernel libraries keep what they compile at run time, each placed by its
    variable in the engine's keyed cache directory (:mod:`k3deploy.model.compilecache`)."""

    flags: tuple[str, ...] = ()
    per_device: str | None = None
    devices: tuple[str, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    imex_device: str | None = None
    docker_runtime: str | None = None
    runtime_fix: str = ""
    after_units: tuple[str, ...] = ()
    imex_units: tuple[str, ...] = ()
    rdma_devices: bool = True
    login_profile: str | None = None
    k8s_resource: str | None = None
    k8s_capabilities: tuple[str, ...] = ()
    k8s_privileged: bool = False
    k8s_unconfined: bool = False
    k8s_imex_api: str | None = None
    k8s_device_plugin: str = ""
    k8s_dra_class: str | None = None
    k8s_dra_driver: str = ""
    slurm_gres: str = "gpu"
    slurm_runtime: Literal["pyxis", "docker", "apptainer"] = "docker"
    slurm_runtime_source: str = ""
    apptainer_flags: tuple[str, ...] = ()
    #: the vendor's compile/JIT caches beyond every vendor's (:data:`k3deploy.model.compilecache.COMMON`): (the
    #: variable that places one, its directory under the cache key's), from each library's source
    jit_caches: tuple[tuple[str, str], ...] = ()

    def run_flags(self, gpus_per_node: int) -> list[str]:
        """The ``docker run`` words before the volumes."""
        out = list(self.flags)
        if self.per_device is not None:
            for i in range(gpus_per_node):
                out += ["--device", self.per_device.format(index=i)]
        for dev in self.devices:
            out += ["--device", dev]
        return out

    def after(self, imex: bool) -> list[str]:
        return [*self.after_units, *(self.imex_units if imex else ())]


@dataclass(frozen=True)
class Trouble:
    """A troubleshooting entry of a multi-node runbook: its heading, the guide's note it quotes (the note with all
    of ``note_words``; ``note_default`` without one), what to do, and the script for each engine node (of its unit
    and env file). ``nvlink_only``: only where the trays talk over multi-node NVLink."""

    heading: str
    note_words: tuple[str, ...]
    note_default: str
    advice: str
    script: Callable[[str, str], str]
    nvlink_only: bool = False


@dataclass(frozen=True)
class HealthKind:
    """One kind of hardware-health event a vendor's tools report (:mod:`k3deploy.model.health`): its ``kind``
    ("xid", "ras"), how it is named when shown (``label``), what to do about a fatal one (``fix``), and per code the
    code's meaning and its own fix where it has one (``codes``: code -> (meaning, fix), either ""). A vendor's kinds
    are its own: no two packs share one."""

    kind: str
    label: str
    fix: str
    codes: tuple[tuple[str, tuple[str, str]], ...] = ()


def names_match(name: str, allowed: Sequence[str]) -> bool:
    """A product name equals an allowed one, spaces and case aside."""
    norm = " ".join(name.split()).casefold()
    return any(norm == " ".join(a.split()).casefold() for a in allowed)


def words_match(name: str, allowed: Sequence[str]) -> bool:
    """An allowed name appears in the product name as whole words, in any case (rocm-smi prints the form factor
    and more after the model: "AMD Instinct MI300X OAM", "AMD INSTINCT MI250 (MCM) OAM AC MBA")."""
    have = name.casefold().split()
    for a in allowed:
        want = a.casefold().split()
        if want and any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1)):
            return True
    return False


@dataclass(frozen=True)
class Exporter:
    """The vendor's Prometheus exporter of accelerator health: its name, its default port (``k3_gpu_exporter_port``
    overrides it), where that is documented, and the metric names a dashboard shows of it (utilization in percent,
    temperature in degrees Celsius, a health figure: what the exporter reports of errors). ``serves``: a metric
    name its ``/metrics`` always serves, or a prefix of every name it serves (ending in ``_``): what tells the
    exporter from anything else listening on its port (``export prometheus --read-nodes``)."""

    name: str
    port: int
    source: str
    utilization: str
    temperature: str
    health: str
    serves: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.utilization, self.temperature, self.health)


@dataclass(frozen=True)
class Pack:
    """One vendor family. ``brand``: the taxonomy's brand; ``container_key``: the plan's ``vendor``; ``tool``: what
    lists the accelerators, ``driver_check`` reports it unreadable, with ``driver_fix``; ``name_match``: how a
    device's product name is compared with the hardware's (``words``: as whole words; with ``pci_ids``, a device
    whose PCI id the hardware names matches too); ``checks``: the vendor's own checks, in the order a runbook
    lists them (the common ones follow: :mod:`k3deploy.vendors.common`); ``site_docker_form``: the recipes site's
    ``docker run`` form runs a single node (else ``no_site_docker_why``); ``probes``: the ids of the cluster-wide
    probes its preflight side runs (:meth:`k3deploy.preflight.base.VendorChecks.probes`); ``health``: the kinds of
    hardware-health event its tools report (:class:`HealthKind`); ``troubles``: the runbook's troubleshooting entries;
    ``guide_notes``: (words, heading) of the guide's notes the runbook quotes for this vendor; ``rank``: where the
    pack comes among the packs (:data:`k3deploy.vendors.PACKS`: the table of docs/requirements.md, the brands a
    refusal names)."""

    name: str
    brand: str
    container_key: str
    tool: str
    driver_check: str
    driver_fix: str
    transport: Transport
    container: Container
    checks: tuple[Check, ...]
    name_match: Literal["exact", "words"] = "exact"
    pci_ids: bool = False
    site_docker_form: bool = True
    no_site_docker_why: str = ""
    probes: tuple[str, ...] = ()
    health: tuple[HealthKind, ...] = ()
    troubles: tuple[Trouble, ...] = ()
    guide_notes: tuple[tuple[tuple[str, ...], str], ...] = ()
    common: tuple[Check, ...] = field(default=(), repr=False)
    rank: int = 100
    exporter: Exporter | None = None

    def check(self, check_id: str) -> Check:
        """The registered check of this id: the vendor's own, else the common one."""
        for c in (*self.checks, *self.common):
            if c.id == check_id:
                return c
        raise KeyError(f"{check_id!r} is not a registered check of {self.name}")

    def command_of(self, check_id: str) -> str:
        """The command of a check that needs nothing of the node: the one text its fact shows (and runs)."""
        command = self.check(check_id).command
        if not isinstance(command, str):
            raise TypeError(f"the command of {check_id!r} depends on the node: use Check.command_for")
        return command

    def all_checks(self) -> list[Check]:
        """The vendor's checks, then the common ones it does not replace."""
        own = {c.id for c in self.checks}
        return [*self.checks, *(c for c in self.common if c.id not in own)]

    def model_matches(self, name: str, device_id: str | None, allowed: Sequence[str], ids: Sequence[str]) -> bool:
        """The device is one of the hardware's products: by PCI device id where the kernel says it (and the pack
        reads ids), else by its product name."""
        if self.pci_ids and device_id is not None and device_id.lower() in ids:
            return True
        return words_match(name, allowed) if self.name_match == "words" else names_match(name, allowed)
