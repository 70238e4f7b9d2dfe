"""Render what a node runs: the container command, the env file and the systemd unit (jinja2 template).

Pure. The template (``templates/k3-engine.service.j2``) holds no logic: every value is computed here.

Quoting: ``ExecStart=`` is parsed by systemd, not by a shell, so each argument is written in systemd's own
quoting (double quotes, C escapes, ``%%`` for ``%`` and ``$$`` for ``$``). On Ascend the engine runs under
``bash -lc`` (the CANN environment lives in the login profile), so its command is shell-quoted first and the
whole string then systemd-quoted: both layers apply and the engine still receives the plan's argv byte for byte.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from k3deploy.model.binding import BoundNode
from k3deploy.vendors import pack_for_container

#: ``templates/`` of the project (shipped in the package as ``k3deploy/data/templates``)
TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"

#: where the model cache is mounted in every engine container
CONTAINER_CACHE = "/root/.cache"


def systemd_quote(arg: str) -> str:
    """Quote one argument for an ``Exec*=`` line so systemd passes it through unchanged."""
    escaped = (arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
               .replace("%", "%%").replace("$", "$$"))
    return f'"{escaped}"'


def exec_line(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


@dataclass(frozen=True)
class ContainerSpec:
    """How to run one engine (or router) container on a host."""

    name: str
    image: str
    vendor: str                 # the plan's container vendor (nvidia | amd | npu; none: no accelerators)
    env_file: str
    cache_dir: str
    gpus_per_node: int
    rdma: bool = False          # talks across nodes: /dev/infiniband and memlock where the pack's engines use them
    imex: bool = False          # GB200/GB300 IMEX channel
    docker: str = "/usr/bin/docker"


def bind_mounts(spec: ContainerSpec) -> list[tuple[str, str]]:
    """``(host path, container path)`` of every ``-v`` the container gets, in ``docker run`` order: the one list
    :func:`container_argv` writes and preflight checks (:func:`prepared_mount_sources`): the vendor pack's driver
    mounts, then the model cache."""
    pack = pack_for_container(spec.vendor)
    if pack is None:
        return []
    return [*pack.container.mounts, (spec.cache_dir, CONTAINER_CACHE)]


def prepared_mount_sources(spec: ContainerSpec) -> list[str]:
    """Host paths of the bind mounts that must exist before the container starts: all but the model cache, which
    the deploy fills itself. ``docker run -v`` does not fail on a missing host path: it creates an empty directory
    there (where a file was meant, too), and the engine finds nothing inside.

    >>> prepared_mount_sources(ContainerSpec("k3", "img", "nvidia", "/e.env", "/cache", 8))
    []
    >>> prepared_mount_sources(ContainerSpec("k3", "img", "npu", "/e.env", "/cache", 16))[:2]
    ['/usr/local/dcmi', '/usr/local/Ascend/driver/tools/hccn_tool']
    """
    return [host for host, _ in bind_mounts(spec) if host != spec.cache_dir]


def _volumes(spec: ContainerSpec) -> list[str]:
    return [arg for host, inside in bind_mounts(spec) for arg in ("-v", f"{host}:{inside}")]


def container_argv(spec: ContainerSpec, argv: list[str]) -> list[str]:
    """``docker run`` for a plan argv (``vllm serve <model> ...`` or ``vllm-router ...``): the devices, flags and
    mounts the vendor pack names (:attr:`k3deploy.vendors.base.Pack.container`)."""
    d = [spec.docker, "run", "--rm", "--name", spec.name, "--network", "host", "--ipc", "host",
         "--env-file", spec.env_file]
    pack = pack_for_container(spec.vendor)
    profile = None
    if pack is not None:
        box = pack.container
        d += [*box.run_flags(spec.gpus_per_node), *_volumes(spec)]
        if spec.imex and box.imex_device:
            d += ["--device", box.imex_device]
        profile = box.login_profile
    if spec.rdma and pack is not None and pack.container.rdma_devices:
        d += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1",
              "--ulimit", "stack=67108864"]
    if argv[:2] == ["vllm", "serve"]:
        if profile is not None:
            # the image starts a shell and the engine's environment needs a login shell (vllm-ascend: CANN)
            return d + ["--entrypoint", "bash", spec.image, "-lc", profile + "exec " + shlex.join(argv)]
        return d + [spec.image, *argv[2:]]  # vllm/vllm-openai* entrypoint is `vllm serve`
    return d + ["--entrypoint", argv[0], spec.image, *argv[1:]]


def env_file_text(env: dict[str, str]) -> str:
    """A docker ``--env-file``: one ``NAME=value`` per line, values taken literally (no quoting)."""
    for k, v in env.items():
        if "\n" in v or "\n" in k:
            raise ValueError(f"env value of {k} contains a newline; docker env files cannot carry it")
    return "".join(f"{k}={v}\n" for k, v in env.items())


@dataclass(frozen=True)
class UnitSpec:
    description: str
    summary: str
    argv: list[str]             # the full container command
    cleanup: list[str]
    stop: list[str]
    start_timeout: int
    stop_timeout: int = 120
    restart_sec: int = 10
    after: str = "network-online.target"
    wants: str = "network-online.target"
    requires: str = ""          # units this one cannot run without (docker.service for a container)
    mounts_for: str = ""        # paths whose filesystems must be mounted first (the model cache)
    condition: tuple[tuple[str, ...], ...] = ()     # first: a start refused by one is skipped (the fence)
    start_pre: tuple[tuple[str, ...], ...] = ()     # before the cleanup (the crash-loop backoff)
    start_post: tuple[tuple[str, ...], ...] = ()    # after the start (the group watcher of a member)
    stop_post: tuple[tuple[str, ...], ...] = ()     # after every stop (notes a failed run for the backoff)
    service_lines: tuple[str, ...] = ()             # more [Service] settings (a router's worker list)
    #: the words of ``argv`` that systemd takes from :data:`WORKERS_VAR` at each start (a router's workers)
    workers: tuple[int, int] | None = None

    def exec_words(self) -> list[str]:
        """``ExecStart=`` as systemd splits it, before it expands variables: ``argv`` with the span of
        ``workers`` as the one word ``$K3_ROUTER_WORKERS``."""
        if self.workers is None:
            return list(self.argv)
        start, end = self.workers
        return [*self.argv[:start], f"${WORKERS_VAR}", *self.argv[end:]]

    def start_line(self) -> str:
        """The ``ExecStart=`` value: ``argv`` quoted, the span of ``workers`` as the unquoted variable."""
        if self.workers is None:
            return exec_line(self.argv)
        start, end = self.workers
        return " ".join([exec_line(self.argv[:start]), f"${WORKERS_VAR}", exec_line(self.argv[end:])]).strip()


@cache
def _env() -> jinja2.Environment:
    """One environment per process: it compiles each template once (and again only when its file changes)."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render_template(template: str, **values: object) -> str:
    """A file of ``templates/`` filled with ``values`` (every placeholder must be given)."""
    return _env().get_template(template).render(**values)


def render_unit(spec: UnitSpec, template: str = "k3-engine.service.j2") -> str:
    return _env().get_template(template).render(
        description=spec.description, summary=spec.summary, after=spec.after, wants=spec.wants,
        unit_lines=[line for line in (f"Requires={spec.requires}" if spec.requires else "",
                                      f"RequiresMountsFor={spec.mounts_for}" if spec.mounts_for else "") if line],
        exec_cleanup=exec_line(spec.cleanup), exec_start=spec.start_line(),
        exec_stop=exec_line(spec.stop), service_lines=list(spec.service_lines),
        restart_sec=spec.restart_sec, start_timeout=spec.start_timeout, stop_timeout=spec.stop_timeout,
        exec_condition=[exec_line(list(a)) for a in spec.condition],
        exec_start_pre=[exec_line(list(a)) for a in spec.start_pre],
        exec_start_post=["-" + exec_line(list(a)) for a in spec.start_post],
        exec_stop_post=["-" + exec_line(list(a)) for a in spec.stop_post])


#: the node-side helper of engine units (``k3deploy/data/node/k3-group-member``, written by the configure phase)
GROUP_MEMBER = "/usr/local/lib/k3deploy/k3-group-member"
GROUP_MEMBER_SOURCE = Path(__file__).resolve().parents[1] / "data" / "node" / "k3-group-member"


def group_member_text() -> str:
    """The helper's text, as the configure phase writes it to :data:`GROUP_MEMBER`."""
    return GROUP_MEMBER_SOURCE.read_text()


@dataclass(frozen=True)
class Fence:
    """An engine unit's start check (``k3-group-member holds``): ``host`` still holds rank ``rank`` of ``group`` in
    the newest fence record (``<config_dir>/fence``) of this node and of its peers, asked on ``port`` (where
    :func:`fence_units` answer). Refused: the unit does not start (``ExecCondition=``) and is disabled."""

    group: str
    rank: int
    host: str
    config_dir: str
    port: int

    @property
    def socket(self) -> str:
        """The socket unit that answers this node's record (its port in its name: a new port is a new unit)."""
        return f"k3-fence-{self.port}.socket"


def fence_paths(port: int) -> tuple[str, str]:
    """Where :func:`fence_units` are written: the socket, and the service each connection starts.

    >>> fence_paths(8479)
    ('/etc/systemd/system/k3-fence-8479.socket', '/etc/systemd/system/k3-fence-8479@.service')
    """
    base = f"/etc/systemd/system/k3-fence-{port}"
    return base + ".socket", base + "@.service"


def fence_units(port: int, config_dir: str) -> dict[str, str]:
    """The units that answer a peer with this node's fence record: path -> text (a socket, and the service each
    connection starts, at :func:`fence_paths`; templates ``k3-fence.socket.j2`` and ``k3-fence@.service.j2``).

    >>> sorted(fence_units(8479, "/etc/k3deploy")) == sorted(fence_paths(8479))
    True
    """
    socket, service = fence_paths(port)
    return {socket: render_template("k3-fence.socket.j2", port=port),
            service: render_template("k3-fence@.service.j2",
                                     exec_start=exec_line([GROUP_MEMBER, "record", config_dir]))}


@dataclass(frozen=True)
class Healing:
    """How an engine unit looks after itself without the control machine (``k3deploy/data/node/k3-group-member``).

    ``watch`` is the group head's ``host:port`` for a member that is not the head (None: the head, a single node,
    or healing off); ``own`` the member's own ``host:port`` where it serves an API of its own (data parallel with
    hybrid load balancing): once it serves, its group formed and the head is watched even if it never served."""

    unit: str
    restart_sec: int = 10
    max_delay: int = 300
    watch: str | None = None
    grace: int = 30
    interval: int = 5
    own: str | None = None
    fence: Fence | None = None

    def condition(self) -> tuple[tuple[str, ...], ...]:
        """The start check of :class:`Fence`: does this node still hold its rank?"""
        f = self.fence
        if f is None:
            return ()
        return ((GROUP_MEMBER, "holds", self.unit, f.group, str(f.rank), f.host, f.config_dir, str(f.port)),)

    def start_pre(self) -> tuple[tuple[str, ...], ...]:
        if self.max_delay <= 0:
            return ()
        return ((GROUP_MEMBER, "backoff", self.unit, str(self.restart_sec), str(self.max_delay)),)

    def start_post(self) -> tuple[tuple[str, ...], ...]:
        if self.watch is None:
            return ()
        name = self.unit.removesuffix(".service") + "-watch"
        return (("/usr/bin/systemd-run", "--no-block", "--quiet", "--collect", f"--unit={name}",
                 f"--property=BindsTo={self.unit}", f"--description=k3deploy: restarts {self.unit} when its group's "
                 f"head at {self.watch} stops serving", GROUP_MEMBER, "watch", self.unit, self.watch,
                 str(self.grace), str(self.interval), *([self.own] if self.own else [])),)

    def stop_post(self) -> tuple[tuple[str, ...], ...]:
        return ((GROUP_MEMBER, "stopped", self.unit),) if self.max_delay > 0 else ()


def _summary(node: BoundNode, strategy: str, hardware: str, image: str) -> str:
    return f"{node.role} rank {node.rank} of {strategy} on {hardware}, image {image}"


def engine_unit(node: BoundNode, spec: ContainerSpec, *, model: str, strategy: str, hardware: str,
                ready_timeout: int, healing: Healing | None = None) -> str:
    """The systemd unit of an engine, rendered (:func:`engine_unit_spec`)."""
    return render_unit(engine_unit_spec(node, spec, model=model, strategy=strategy, hardware=hardware,
                                        ready_timeout=ready_timeout, healing=healing))


def engine_unit_spec(node: BoundNode, spec: ContainerSpec, *, model: str, strategy: str, hardware: str,
                     ready_timeout: int, healing: Healing | None = None) -> UnitSpec:
    """The systemd unit of an engine: its container run in the foreground, removed before and stopped after;
    with ``healing`` its crash-loop backoff and, for a member of a group, the watcher of its head."""
    h = healing or Healing(unit=spec.name + ".service", max_delay=0)
    fenced = [h.fence.socket] if h.fence is not None else []
    return UnitSpec(
        description=f"k3deploy {node.role} rank {node.rank}: {model} ({strategy})",
        summary=_summary(node, strategy, hardware, spec.image),
        argv=container_argv(spec, node.argv),
        cleanup=cleanup_argv(spec),
        stop=stop_argv(spec),
        after=" ".join(["network-online.target", "docker.service", *_after_fabric(spec), *fenced]),
        wants=" ".join(["network-online.target", *fenced]),
        requires="docker.service",
        mounts_for=systemd_path(spec.cache_dir),
        start_timeout=ready_timeout + 900 + h.max_delay,
        restart_sec=h.restart_sec,
        condition=h.condition(), start_pre=h.start_pre(), start_post=h.start_post(), stop_post=h.stop_post(),
    )


def cleanup_argv(spec: ContainerSpec) -> list[str]:
    """What runs before an engine container starts: a leftover container of its name removed (every launcher)."""
    return [spec.docker, "rm", "-f", spec.name]


def stop_argv(spec: ContainerSpec) -> list[str]:
    """How an engine container is stopped (every launcher): ``docker stop``, the engine given 60 s to exit."""
    return [spec.docker, "stop", "-t", "60", spec.name]


def _after_fabric(spec: ContainerSpec) -> list[str]:
    """The units the vendor pack says an engine starts after: on NVIDIA the fabric manager and, on NVL trays, the
    IMEX daemon (ordering only: where a node has no such unit nothing waits; preflight checks that the ones the
    hardware needs are active)."""
    pack = pack_for_container(spec.vendor)
    return pack.container.after(spec.imex) if pack is not None else []


def systemd_path(path: str) -> str:
    """A path in a unit setting that takes paths (specifiers escaped; spaces in it are not supported by systemd)."""
    return path.replace("%", "%%")


def router_argv(node: BoundNode, container: ContainerSpec | None, router_bin: str) -> list[str]:
    """The command a router runs (every launcher): the plan's ``vllm-router`` argv in ``container``, or with
    ``router_bin`` (its absolute path on the host) without one."""
    if container is not None:
        return container_argv(container, node.argv)
    return [router_bin if node.argv[0] == "vllm-router" else node.argv[0], *node.argv[1:]]


#: ``RestartSec=`` of a router: clients see a killed router for this long, plus its start (no engine to load)
ROUTER_RESTART_SEC = 1
#: the variable of a router unit that holds its workers (``--worker-urls``): the unit's own list, replaced by the
#: worker file's (:func:`router_workers_text`) where the rollout wrote one
WORKERS_VAR = "K3_ROUTER_WORKERS"


def workers_file(env_path: str) -> str:
    """The worker file of the router whose env file is ``env_path``: the workers it sends requests to, written by the
    rollout when it takes a replica out and puts it back, read by the router's unit at every start.

    >>> workers_file("/etc/k3deploy/k3-engine-router.env")
    '/etc/k3deploy/k3-engine-router.workers'
    """
    return env_path.removesuffix(".env") + ".workers"


def router_workers_text(urls: list[str]) -> str:
    r"""A worker file's text (an ``EnvironmentFile=``): the router's workers, one word each.

    >>> router_workers_text(["http://10.0.0.1:8000", "http://10.0.0.3:8000"])
    'K3_ROUTER_WORKERS="http://10.0.0.1:8000 http://10.0.0.3:8000"\n'
    """
    return f'{WORKERS_VAR}="{" ".join(urls)}"\n'


def _worker_urls(argv: list[str]) -> tuple[int, int] | None:
    """Where the URLs after ``--worker-urls`` are in ``argv`` (start, end), or None."""
    if "--worker-urls" not in argv:
        return None
    start = argv.index("--worker-urls") + 1
    end = start
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return start, end


def router_unit(node: BoundNode, *, model: str, strategy: str, hardware: str, image: str, ready_timeout: int,
                container: ContainerSpec | None = None, router_bin: str = "/usr/local/bin/vllm-router",
                workers: str | None = None) -> UnitSpec:
    """The systemd unit of a vllm-router: ``router_bin`` on the host (the plan's ``vllm-router`` argv with the
    command's absolute path), or in ``container`` when given (the plan's ``image`` is named in the summary). It
    restarts :data:`ROUTER_RESTART_SEC` after a crash. With ``workers`` (the worker file's path) its
    ``--worker-urls`` come from :data:`WORKERS_VAR`: the planned list, set in the unit, unless the worker file says
    otherwise (a router that restarts while a replica is out of it keeps it out)."""
    argv = router_argv(node, container, router_bin)
    span = _worker_urls(argv) if workers else None
    lines: tuple[str, ...] = ()
    if span is not None and workers:
        urls = argv[span[0]:span[1]]
        lines = (f"Environment={systemd_quote(WORKERS_VAR + '=' + ' '.join(urls))}",
                 f"EnvironmentFile=-{systemd_path(workers)}")
    return UnitSpec(
        description=f"k3deploy {node.role} rank {node.rank}: {model} ({strategy})",
        summary=_summary(node, strategy, hardware, image),
        argv=argv,
        cleanup=["/bin/true"],
        stop=["/bin/true"],  # then systemd stops the process itself (SIGTERM to the unit's cgroup)
        after="network-online.target" + (" docker.service" if container is not None else ""),
        requires="docker.service" if container is not None else "",
        start_timeout=ready_timeout + 900,
        restart_sec=ROUTER_RESTART_SEC,
        service_lines=lines,
        workers=span if span is not None and workers else None,
    )
