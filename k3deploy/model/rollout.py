"""The rollout, planned: per host the files to write, the units to run, the groups to (re)start and in which
order, and where readiness is judged. Pure: the deploy file feeds it the inventory and facts.

It is made in stages, each a new frozen value, so a command renders it once and nothing changes it afterwards:
:func:`lay_out` binds the plan to the hosts (a :class:`Placement`: which unit runs where; what the rollout reads of
each host needs no more), :func:`render` renders every unit and env file once the hosts' settings are known (a
:class:`Rollout`); :func:`plan_rollout` does both. What the hosts run decides what restarts
(:func:`mark_changes`), and :meth:`Rollout.decided` gives the rollout that restarts it.

Example::

    >>> rollout = plan_rollout(plan, hosts, variables)                            # doctest: +SKIP
    >>> rollout.decided(mark_changes(rollout, installed)).changed_groups        # doctest: +SKIP

Order rules (vLLM 0.33.0): a multi-node head cannot become healthy before its workers joined, so a group
starts as head -> head's rendezvous port accepts TCP -> all workers -> readiness of the serving nodes.
P/D pools are independent groups started side by side; the router starts once both pools serve.
A change to any node of a group restarts the whole group, never half of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from urllib.parse import urlsplit

from k3deploy.errors import K3Error
from k3deploy.model import compilecache
from k3deploy.model.binding import BoundHost, BoundNode, HostRecord, bind, fill, rendezvous_port
from k3deploy.model.engine import EngineSpec, Word, env_words, ranked, words
from k3deploy.model.images import run_ref
from k3deploy.model.inventory import ROLE_GROUPS, SPARES
from k3deploy.model.observed import Installed
from k3deploy.model.secrets import API_KEY_ENV
from k3deploy.model.units import ContainerSpec, Fence, Healing, engine_unit_spec, router_unit, workers_file
from k3deploy.model.variables import Variables
from k3deploy.recipe.plan import NodePlan, Plan
from k3deploy.recipe.taxonomy import hardware
from k3deploy.vendors import pack_for_container

HEALTH_PATH = "/health"
ENGINE_GROUP = "engine"
REPLICA_PREFIX = "engine-r"
_ORDER = ("engine", "prefill", "decode")


def replica_group(replica: int, count: int) -> str:
    """The engine group's name: ``engine`` for a single group, ``engine-r<N>`` for replica N of several.

    >>> replica_group(0, 1), replica_group(1, 2)
    ('engine', 'engine-r1')
    """
    return ENGINE_GROUP if count <= 1 else f"{REPLICA_PREFIX}{replica}"


def group_order(group: str) -> tuple[int, int]:
    """Start order of a group: engine groups (replicas by number), P/D pools, then the router."""
    if group.startswith(REPLICA_PREFIX):
        return (0, int(group[len(REPLICA_PREFIX):]))
    return (_ORDER.index(group), 0) if group in _ORDER else (len(_ORDER), 0)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class UnitWork:
    """One systemd unit on one host: where it runs and, once rendered, its :class:`EngineSpec`, from which its
    files render. A unit that keeps the files a host holds (a rollback to a revision, a group that runs it) carries
    them as read (``kept_unit_text``, ``kept_env_text``, ``launch_text``): they are then its files."""

    host: str
    unit: str                       # e.g. k3-engine.service
    group: str                      # engine | prefill | decode | router
    rank: int
    node: BoundNode
    unit_path: str
    env_path: str
    serves: str | None              # http://addr:port when this unit answers HTTP
    join: tuple[str, int] | None    # (head address, port) a worker waits for before starting
    container: str
    watches: str | None = None      # the group head's address:port a healing member watches (k3_heal)
    spec: EngineSpec | None = field(default=None, repr=False)   # None: laid out only (:func:`lay_out`)
    launch_text: str | None = None  # k3_launcher: slurm: a restored revision's launch script (None: rendered)
    kept_unit_text: str | None = None   # the unit file a host holds, kept (None: rendered from ``spec``)
    kept_env_text: str | None = field(default=None, repr=False)   # the env file a host holds, kept (a secret)

    @property
    def is_group_head(self) -> bool:
        return self.rank == 0

    @property
    def unit_text(self) -> str:
        """The unit file: kept, or rendered from the spec ("" while laid out only)."""
        if self.kept_unit_text is not None:
            return self.kept_unit_text
        return self.spec.unit_text if self.spec is not None else ""

    @property
    def env_text(self) -> str:
        """The env file: kept, or rendered from the spec ("" while laid out only). May hold a secret."""
        if self.kept_env_text is not None:
            return self.kept_env_text
        return self.spec.env_text if self.spec is not None else ""

    def require_spec(self) -> EngineSpec:
        if self.spec is None:
            raise ValueError(f"{self.host}:{self.unit} is laid out only: render the rollout first")
        return self.spec

    def kept(self, *, unit_text: str | None = None, launch_text: str | None = None,
             env_text: str | None = None) -> UnitWork:
        """This unit with files a host holds in place of the rendered ones (a revision it keeps or returns to)."""
        return replace(self, kept_unit_text=unit_text if unit_text is not None else self.kept_unit_text,
                       launch_text=launch_text if launch_text is not None else self.launch_text,
                       kept_env_text=env_text if env_text is not None else self.kept_env_text)


@dataclass(frozen=True)
class Placement:
    """The plan bound to the hosts (:func:`lay_out`): every unit placed, its files not rendered yet (the unit and
    env texts are empty); what a rollout reads of each host needs no more."""

    plan: Plan
    vars: Variables
    units: list[UnitWork]
    endpoint: str                   # the public base URL (http://host:port)
    ready_timeout: int
    deadline: int
    spares: dict[str, str] = field(default_factory=dict)   # host -> its cluster address: the spares standing by
    vip_holder: str | None = None   # k3_vip: the host that serves the endpoint and so holds the virtual address
    #: the API key (``k3_api_key_file``'s content) every unit's env file gets as ``VLLM_API_KEY``; never shown
    api_key: str | None = field(default=None, repr=False)

    @property
    def rendered(self) -> bool:
        """Whether the units' files are rendered (a :class:`Rollout`)."""
        return False

    def on_host(self, name: str) -> list[UnitWork]:
        return [u for u in self.units if u.host == name]

    def group(self, name: str) -> list[UnitWork]:
        return sorted((u for u in self.units if u.group == name), key=lambda u: u.rank)

    @property
    def groups(self) -> list[str]:
        """Groups in start order: engine groups (replicas in replica order; P/D: prefill, decode), then the
        router."""
        present = {u.group for u in self.units}
        return sorted(present, key=group_order)

    @property
    def replicas(self) -> list[str]:
        """The engine groups that are replicas behind the router (empty with a single engine group)."""
        return [g for g in self.groups if g.startswith(REPLICA_PREFIX)]

    def router_list(self, router: UnitWork, groups: list[str]) -> tuple[str, list[str]] | None:
        """The worker file of ``router`` (:func:`k3deploy.model.units.workers_file`) listing ``groups``' serving
        URLs, as a roll writes it (:func:`k3deploy.model.commands.router_list`); None: no replicas behind it."""
        return (workers_file(router.env_path), self.serving_urls(groups)) if len(self.replicas) > 1 else None

    def serving_urls(self, groups: list[str]) -> list[str]:
        """The HTTP endpoints of these groups' serving units (what a router in front of them lists)."""
        return [u.serves for g in groups for u in self.group(g) if u.serves]

    def how_changes_roll(self) -> str:
        """One line for people: how an engine change reaches this deployment."""
        if len(self.replicas) > 1:
            return (f"{len(self.replicas)} replicas behind the router at {self.endpoint}: an engine change rolls "
                    f"{self.vars.k3_max_unavailable} replica(s) at a time (out of the router, drained, restarted, "
                    "serving, back in); a router change restarts everything at once")
        if self.plan.strategy == "pd_cluster":
            return "P/D pools: an engine change restarts each changed pool as a whole (and the router)"
        return ("one engine group (no replicas): an engine change restarts the whole group, the endpoint is down "
                "meanwhile (with k3_replica, several replicas roll one at a time behind a router)")

    @property
    def hosts(self) -> list[str]:
        """Hosts with a unit, in inventory order."""
        return list(dict.fromkeys(u.host for u in self.units))


@dataclass(frozen=True)
class Rollout(Placement):
    """A placement with every unit's files rendered (:func:`render`); with what restarts and what the running
    router lists once the hosts were read (:meth:`decided`)."""

    changed_groups: frozenset[str] = frozenset()
    router_workers: tuple[str, ...] | None = None   # what the running router sends requests to (replicas; read)
    ifaces: dict[str, str] = field(default_factory=dict)   # host -> its cluster interface (from its facts, k3_iface)

    @property
    def rendered(self) -> bool:
        return True

    def decided(self, changed: Iterable[str] | None = None, *,
                router_workers: tuple[str, ...] | None = None) -> Rollout:
        """This rollout restarting the groups ``changed`` (None: those it restarts already), with what the running
        router lists (None: as it is)."""
        return replace(self, changed_groups=self.changed_groups if changed is None else frozenset(changed),
                       router_workers=self.router_workers if router_workers is None else router_workers)

    @property
    def rolling(self) -> bool:
        """Changed replicas restart replica by replica behind a router that keeps serving (the router itself does
        not restart)."""
        return len(self.replicas) > 1 and "router" not in self.changed_groups

    def waves(self) -> list[list[str]]:
        """The restart in steps: with ``rolling``, the changed replicas, ``k3_max_unavailable`` at a time; else one
        step with every changed group."""
        if not self.rolling:
            return [[g for g in self.groups if g in self.changed_groups]] if self.changed_groups else []
        changed = [g for g in self.replicas if g in self.changed_groups]
        n = self.vars.k3_max_unavailable
        return [changed[i:i + n] for i in range(0, len(changed), n)]

    def in_router(self, group: str) -> bool | None:
        """Whether the running router sends requests to this replica (None: no replicas, or the router's list
        was not read)."""
        if len(self.replicas) < 2 or self.router_workers is None or group not in self.replicas:
            return None
        return all(url in self.router_workers for url in self.serving_urls([group]))

    def missing_from_router(self) -> list[str]:
        """Replicas that do not restart but that the running router leaves out (e.g. a roll that stopped, or a
        worker removed by hand): the deploy puts them back."""
        if "router" in self.changed_groups:
            return []
        return [g for g in self.replicas if g not in self.changed_groups and self.in_router(g) is False]

    def start_plan(self, groups: set[str] | None = None) -> StartPlan:
        """How ``groups`` (default: the changed ones) restart, per host and phase, as the deploy runs it."""
        return StartPlan.of(self, set(self.changed_groups) if groups is None else groups)


@dataclass(frozen=True)
class HostStart:
    """What one host does in each phase of a restart."""

    host: str
    routers: list[str]                    # router units to stop and start
    workers: list[str]                    # worker units (rank > 0)
    heads: list[str]                      # group heads (rank 0)
    joins: list[tuple[str, int]]          # rendezvous (head address, port) to wait for before the workers start

    @property
    def engines(self) -> list[str]:
        return self.heads + self.workers


@dataclass(frozen=True)
class StartPlan:
    """A restart of some groups, in the order vLLM's rendezvous needs: stop routers, workers, heads; start the
    heads; each worker waits for its head's rendezvous port, then the workers start; the engine groups must
    serve; then the router starts and must serve. P/D pools restart side by side."""

    hosts: list[HostStart]
    engine_groups: list[str]              # restarting engine groups, in start order
    router: bool                          # the router restarts

    @classmethod
    def of(cls, rollout: Rollout, groups: set[str]) -> StartPlan:
        out = []
        for h in rollout.hosts:
            mine = [u for u in rollout.on_host(h) if u.group in groups]
            engines = [u for u in mine if u.group != "router"]
            joins = list(dict.fromkeys(u.join for u in engines if not u.is_group_head and u.join))
            out.append(HostStart(host=h, routers=[u.unit for u in mine if u.group == "router"],
                                 workers=[u.unit for u in engines if not u.is_group_head],
                                 heads=[u.unit for u in engines if u.is_group_head], joins=joins))
        return cls(hosts=out, engine_groups=[g for g in rollout.groups if g in groups and g != "router"],
                   router="router" in groups and "router" in rollout.groups)

    def on(self, host: str) -> HostStart:
        return next((h for h in self.hosts if h.host == host), HostStart(host, [], [], [], []))

    @property
    def empty(self) -> bool:
        return not (self.engine_groups or self.router)


def _ready_timeout(plan: Plan, variables: Variables) -> int:
    if variables.k3_engine_ready_timeout:
        return variables.k3_engine_ready_timeout
    values = [int(n.env["VLLM_ENGINE_READY_TIMEOUT_S"]) for n in plan.nodes
              if n.env.get("VLLM_ENGINE_READY_TIMEOUT_S", "").isdigit()]
    return max(values) if values else 600


def _http(head: BoundNode | None) -> str | None:
    """``address:port`` of a group head's HTTP server (what its members watch), None when it serves none."""
    if head is None or not head.node.serves_http:
        return None
    return f"{head.address}:{head.node.port or 8000}"


def front_router_argv(urls: list[str], variables: Variables) -> list[str]:
    argv = ["vllm-router", "--policy", "round_robin", "--worker-urls", *urls,
            "--host", variables.k3_router_host, "--port", str(variables.k3_router_port)]
    return argv


def lay_out(plan: Plan, hosts: list[HostRecord], variables: Variables, api_key: str | None = None) -> Placement:
    """Bind the plan to the hosts: every unit placed (its host, group, rank, files, what it serves, whom it joins)
    and the public endpoint, its files not rendered yet (a :class:`Placement`; :func:`render` renders them). Raises
    :class:`K3Error` when the plan does not fit the hosts. What a rollout reads of each host needs no more than
    this. ``api_key``: the key every unit's env file gets (``k3_api_key_file``'s content)."""
    bound: dict[str, BoundHost] = bind(plan, hosts, dp_rpc_port=variables.k3_dp_rpc_port,
                                       router_host=variables.k3_router_host, router_port=variables.k3_router_port)
    ready = _ready_timeout(plan, variables)
    units: list[UnitWork] = []
    cfg = variables.k3_config_dir.rstrip("/")
    pd = plan.strategy == "pd_cluster"

    def add(host: BoundHost, node: BoundNode, group: str, unit_base: str, head_addr: str | None,
            head_http: str | None = None) -> None:
        unit = f"{unit_base}.service"
        if node.role == "router":
            serves: str | None = f"http://{host.host.address}:{variables.k3_router_port}"
            watches = None
        else:
            own = _http(node)
            serves = f"http://{own}" if own else None
            watches = head_http if (variables.k3_heal and node.rank > 0) else None
        join = None
        if node.rank > 0 and head_addr is not None:
            port = rendezvous_port(node.argv)
            join = (head_addr, port) if port else None
        units.append(UnitWork(host=host.host.name, unit=unit, group=group, rank=node.rank, node=node,
                              unit_path=f"/etc/systemd/system/{unit}", env_path=f"{cfg}/{unit_base}.env",
                              serves=serves, join=join, container=unit_base, watches=watches))

    base = variables.k3_unit_name
    if pd:
        heads: dict[str, BoundNode] = {}
        for b in bound.values():
            for node in [b.engine, *b.extras]:
                if node is not None and node.rank == 0:
                    heads[node.role] = node
        for b in bound.values():
            for node in [n for n in [b.engine, *b.extras] if n is not None]:
                hd = heads.get(node.role)
                add(b, node, node.role, f"{base}-{node.role}", hd.address if hd else None, _http(hd))
            if b.router is not None:
                add(b, b.router, "router", f"{base}-router", None)
        router_host = next(b for b in bound.values() if b.router is not None)
        endpoint = f"http://{router_host.host.address}:{variables.k3_router_port}"
    else:
        engines = [b for b in bound.values() if b.engine is not None]
        count = len({b.engine.replica for b in engines if b.engine is not None})
        group_heads = {b.engine.replica: b for b in engines if b.engine is not None and b.engine.rank == 0}
        for b in engines:
            assert b.engine is not None
            hd = group_heads[b.engine.replica].engine
            assert hd is not None
            add(b, b.engine, replica_group(b.engine.replica, count), base, hd.address if b.engine.rank else None,
                _http(hd))
        head = group_heads[0]
        serving = [((u.node.replica, u.rank), u.serves) for u in units if u.serves]
        if count > 1 or (len(serving) > 1 and variables.k3_front_hybrid_lb):
            argv = front_router_argv([url for _, url in sorted(serving)], variables)
            node = BoundNode(NodePlan(role="router", rank=0, argv=argv, env={}), argv, {}, head.host.address)
            add(head, node, "router", f"{base}-router", None)
            endpoint = f"http://{head.host.address}:{variables.k3_router_port}"
        else:
            endpoint = serving[0][1] if serving else f"http://{head.host.address}:8000"
    deadline = variables.k3_rollout_deadline or ready + 900
    spares = {h.name: h.address for h in hosts if SPARES in h.groups and not set(ROLE_GROUPS) & set(h.groups)}
    holder = None
    if variables.k3_vip is not None:
        endpoint, holder = _virtual(endpoint, variables.k3_vip, units, hosts, variables.k3_vip_prefix)
    return Placement(plan=plan, vars=variables, units=units, endpoint=endpoint, ready_timeout=ready,
                     deadline=deadline, spares=spares, vip_holder=holder, api_key=api_key)


def _virtual(endpoint: str, vip: str, units: list[UnitWork], hosts: list[HostRecord],
             prefix: int = 24) -> tuple[str, str]:
    """The public endpoint on the virtual address ``vip`` (same port), and the host that serves it (so holds it).
    The address must be no host's and, where the host's address is an IP address, in its subnet (``prefix``).

    >>> _virtual("http://10.0.0.1:8000", "10.0.0.250", [], [HostRecord("n1", ("head",), {"k3_ip": "10.0.0.1"})])
    ('http://10.0.0.250:8000', 'n1')
    """
    url = urlsplit(endpoint)
    taken = {h.address: h.name for h in hosts}
    if vip in taken:
        raise K3Error(f"k3_vip {vip} is the address of host {taken[vip]}: give the virtual address a free address "
                      "of the cluster's subnet that no host has")
    served = {u.serves: u.host for u in units if u.serves}
    holder = served.get(endpoint) or next((h.name for h in hosts if h.address == url.hostname), None)
    if holder is None:
        raise K3Error(f"k3_vip {vip}: no host of the inventory serves the endpoint {endpoint}")
    with contextlib.suppress(ValueError):   # a host name: its subnet is not known here
        net = ipaddress.ip_network(f"{url.hostname}/{prefix}", strict=False)
        if ipaddress.ip_address(vip) not in net:
            raise K3Error(f"k3_vip {vip} is not in the subnet of {holder} ({net}, k3_vip_prefix {prefix}), which "
                          "serves the endpoint: give a free address of that subnet")
    return f"http://{vip}:{url.port or 80}", holder


def _with_iface(node: BoundNode, iface: str | None) -> BoundNode:
    """The node with ``$IFACE_NAME`` filled (the host's interface, read from its facts or set by ``k3_iface``)."""
    if iface is None:
        return node
    names = {"IFACE_NAME": iface}
    return BoundNode(node.node, [fill(a, names) for a in node.argv],
                     {k: fill(val, names) for k, val in node.env.items()}, node.address, node.replica,
                     {**node.values, **names})


#: vllm-router's flags of its Prometheus listener (vllm-router 0.1.17 ``router_args.py``: ``--prometheus-port``,
#: default 29000, and ``--prometheus-host``, default ``127.0.0.1``)
ROUTER_METRICS_FLAGS = ("--prometheus-host", "--prometheus-port")


def with_router_metrics(node: BoundNode, variables: Variables) -> BoundNode:
    """A router that serves its Prometheus metrics where the exported scrape reaches them: vllm-router binds them to
    ``127.0.0.1`` by default (vllm-router 0.1.17 ``router_args.py``), so the target ``k3_router_metrics_port`` names
    on the router's host would be down. The router gets ``--prometheus-host`` = its own bind address
    (``k3_router_host``, ``0.0.0.0`` by default: the metrics listen wherever the router's endpoint does, which is
    what a scrape of the host's cluster address needs on every launcher, a Kubernetes pod's unknown address
    included) and ``--prometheus-port`` = ``k3_router_metrics_port``; flags the plan's argv already sets are left as
    they are, and ``k3_router_metrics_port: 0`` (not scraped) leaves the argv as the plan has it. A deliberate
    difference from the builder's P/D router argv (docs/monitoring.md).

        >>> from k3deploy.model.variables import Variables
        >>> n = BoundNode(NodePlan(role="router", rank=0, argv=["vllm-router", "--port", "30000"], env={}),
        ...               ["vllm-router", "--port", "30000"], {}, "10.0.0.1")
        >>> with_router_metrics(n, Variables()).argv
        ['vllm-router', '--port', '30000', '--prometheus-host', '0.0.0.0', '--prometheus-port', '29000']
        >>> with_router_metrics(n, Variables(k3_router_metrics_port=0)).argv
        ['vllm-router', '--port', '30000']
    """
    port = variables.k3_router_metrics_port
    if not port:
        return node
    add: list[str] = []
    for flag, value in zip(ROUTER_METRICS_FLAGS, (variables.k3_router_host, str(port)), strict=True):
        if not any(a == flag or a.startswith(flag + "=") for a in node.argv):
            add += [flag, value]
    if not add:
        return node
    plan = node.node.model_copy(update={"argv": [*node.node.argv, *add]})
    return replace(node, node=plan, argv=[*node.argv, *add])


#: vLLM's own address (``get_ip()``): what the head advertises its message queue on to the other nodes' workers
HOST_IP_ENV = "VLLM_HOST_IP"


def engine_env(node: BoundNode, derived: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The env file of an engine, in layers, each over the one before:

    1. the plan's env (the recipe's; its ``$IFACE_NAME`` filled);
    2. the settings derived from the host's facts (:mod:`k3deploy.preflight.settings`): exact values the tool
       chose, so they *replace* the plan's placeholders and catch-alls (a P/D prefill's ``UCX_NET_DEVICES=all``,
       a prefix-match ``NCCL_SOCKET_IFNAME=eth1`` that also selects ``eth10``);
    3. ``VLLM_HOST_IP`` = the node's cluster address (``k3_ip``): vLLM's ``get_ip()`` is ``VLLM_HOST_IP``, else the
       address of the default route, else ``0.0.0.0``, and a multi-node head advertises its message queue on it, so
       without it a node with no default route, or with its default route on a network the peers do not reach,
       leaves its workers waiting for ever; ``HF_HUB_OFFLINE=1`` unless the plan says otherwise;
    4. ``k3_extra_env``: the site's own word, last.

    >>> from k3deploy.recipe.plan import NodePlan
    >>> n = BoundNode(NodePlan(role="prefill", rank=0, argv=[], env={}), [],
    ...               {"UCX_NET_DEVICES": "all", "NCCL_SOCKET_IFNAME": "eth1"}, "10.0.0.11")
    >>> env = engine_env(n, {"UCX_NET_DEVICES": "mlx5_0:1", "NCCL_SOCKET_IFNAME": "=eth1"}, {"NCCL_DEBUG": "INFO"})
    >>> env["UCX_NET_DEVICES"], env["NCCL_SOCKET_IFNAME"], env["VLLM_HOST_IP"], env["NCCL_DEBUG"]
    ('mlx5_0:1', '=eth1', '10.0.0.11', 'INFO')
    """
    env = dict(node.env)
    env.update(derived)
    env[HOST_IP_ENV] = node.address
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def compile_env(plan: Plan, argv: list[str], env: Mapping[str, str]) -> dict[str, str]:
    """The settings that put an engine's compile and JIT caches in the directory of its key
    (:mod:`k3deploy.model.compilecache`: the image build, the hardware, the hashed arguments and environment)."""
    pack = pack_for_container(plan.vendor)
    key = compilecache.cache_key(argv, env, image=run_ref(plan.image), hardware=plan.hardware)
    return compilecache.cache_env(key, pack.container.jit_caches if pack is not None else ())


def unit_container(layout: Placement, placed: UnitWork) -> ContainerSpec | None:
    """The container a unit runs, as every launcher runs it (the systemd unit, a Slurm job's launch script): the
    plan's image for an engine; for the router ``k3_router_image``, or None (``k3_router_bin`` on the host). A
    pinned build (``REPO@sha256:...``, as a resolved tag is) runs by the local tag named after its digest
    (:func:`~k3deploy.model.images.run_ref`), so a new build is a change of the unit."""
    plan, variables = layout.plan, layout.vars
    if placed.node.role == "router":
        if not variables.k3_router_image:
            return None
        return ContainerSpec(name=placed.container, image=run_ref(variables.k3_router_image), vendor="none",
                             env_file=placed.env_path, cache_dir=variables.k3_model_cache, gpus_per_node=0,
                             docker=variables.k3_docker)
    hw = hardware()[plan.hardware]
    multi = len([n for n in plan.nodes if n.role != "router"]) > 1
    return ContainerSpec(name=placed.container, image=run_ref(plan.image), vendor=plan.vendor,
                         env_file=placed.env_path, cache_dir=variables.k3_model_cache, gpus_per_node=hw.gpu_count,
                         rdma=multi, imex=hw.nvl, docker=variables.k3_docker)


def render(layout: Placement, *, ifaces: Mapping[str, str] | None = None,
           host_env: Mapping[str, Mapping[str, str]] | None = None) -> Rollout:
    """The rollout of a layout (:func:`lay_out`) with every unit and env file rendered: ``$IFACE_NAME`` from
    ``ifaces`` and the settings derived from each host's facts (``host_env``) where they are known. The layout is
    left as it is."""
    plan, variables = layout.plan, layout.vars
    units: list[UnitWork] = []
    heads = {u.group: u.node.address for u in layout.units if u.rank == 0}
    sizes = {g: sum(u.group == g for u in layout.units) for g in heads}
    for placed in layout.units:
        node = _with_iface(placed.node, (ifaces or {}).get(placed.host))
        box = unit_container(layout, placed)
        if node.role == "router":
            node = with_router_metrics(node, variables)
            unit = router_unit(node, model=plan.model, strategy=plan.strategy, hardware=plan.hardware,
                               image=plan.image, ready_timeout=layout.ready_timeout, container=box,
                               router_bin=variables.k3_router_bin,
                               workers=workers_file(placed.env_path) if len(layout.replicas) > 1 else None)
        else:
            assert box is not None   # every engine runs in a container
            own = _http(node)
            healing = Healing(unit=placed.unit, restart_sec=variables.k3_restart_sec,
                              max_delay=variables.k3_restart_max_delay, watch=placed.watches,
                              grace=variables.k3_heal_grace, interval=variables.k3_heal_interval,
                              own=own if placed.watches else None,
                              fence=Fence(placed.group, placed.rank, placed.host, variables.k3_config_dir,
                                          variables.k3_fence_port))
            unit = engine_unit_spec(node, box, model=plan.model, strategy=plan.strategy, hardware=plan.hardware,
                                    ready_timeout=layout.ready_timeout, healing=healing)
        keyed = {API_KEY_ENV: layout.api_key} if layout.api_key else {}
        env = engine_env(node, (host_env or {}).get(placed.host, {}), {**variables.k3_extra_env, **keyed}) \
            if node.role != "router" else {**node.env, **keyed}
        head = heads.get(placed.group) if placed.rank > 0 else None
        argv: tuple[Word, ...] = ranked([words(p, f, node.values, head=head, own=node.address)
                                         for p, f in zip(node.node.argv, node.argv, strict=True)], node.rank,
                                        sizes.get(placed.group))
        if node.role != "router" and variables.k3_compile_cache:
            env = {**compile_env(plan, node.argv, env), **env}
        spec = EngineSpec(argv_words=argv, env=env_words(env, node.node.env, node.values, head=head,
                                                         own=node.address),
                          container=box, unit=unit)
        units.append(replace(placed, node=node, spec=spec))
    placed_fields = {f.name: getattr(layout, f.name) for f in fields(Placement)}
    return Rollout(**{**placed_fields, "units": units}, ifaces=dict(ifaces or {}))


def plan_rollout(plan: Plan, hosts: list[HostRecord], variables: Variables, *, ifaces: dict[str, str] | None = None,
                 host_env: dict[str, dict[str, str]] | None = None, api_key: str | None = None) -> Rollout:
    """Bind the plan to the hosts and render every unit and env file (:func:`lay_out`, then :func:`render`)."""
    return render(lay_out(plan, hosts, variables, api_key), ifaces=ifaces, host_env=host_env)


def files_differ(unit: UnitWork, have: Installed | None) -> bool:
    """The unit file or the env file ``unit`` plans differs from what its host has (``have``; None: nothing read)."""
    return have is None or have.unit_sha != sha256(unit.unit_text) or have.env_sha != sha256(unit.env_text)


def mark_changes(rollout: Rollout, installed: Mapping[tuple[str, str], Installed]) -> frozenset[str]:
    """The groups that restart, from what the hosts have, ``(host, unit) -> Installed`` (:meth:`Rollout.decided`
    gives the rollout that restarts them).

    A group changes when any of its units' files differ from what is planned, any of its units is not running,
    serves HTTP and its ``/health`` does not answer, or (with ``k3_heal`` off) was restarted by systemd since it
    was started (a group whose member restarted may be wedged: headless engines do not recover when their head
    restarts, vllm#32136; with ``k3_heal`` its members restart on their own and a group that serves again is left
    alone); the router group also restarts when an engine group it fronts restarts.
    """
    changed: set[str] = set()
    for u in rollout.units:
        have = installed.get((u.host, u.unit), Installed())
        restarted = have.restarts > 0 and not rollout.vars.k3_heal   # with k3_heal the group recovers on its own
        if files_differ(u, have) or not have.running or restarted or have.answers is False:
            changed.add(u.group)
    if changed - {"router"} and "router" in rollout.groups and len(rollout.replicas) <= 1:
        changed.add("router")   # replicas roll behind a router that keeps serving
    return frozenset(changed)
