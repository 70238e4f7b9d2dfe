"""Bring simulated clusters up and down.

A cluster named ``NAME`` with N nodes consists of, for node i (1 <= i <= N, rank i-1):

- node name (hostname, nspawn machine name, network namespace): ``NAME-node<i>``;
- address ``<subnet>.<10+i>/24`` on ``eth0`` inside the namespace; the host side of the veth pair is
  ``NAME-v<i>`` on the bridge ``NAME0`` (``<subnet>.1``). ``k3sim`` uses ``10.77.0``; other names get
  a subnet derived from the name unless one is given;
- a tmpfs at ``<state>/NAME-node<i>`` holding the overlay's ``upper``/``work`` directories and the
  node's root ``merged`` (lower layer: the cached base root, :mod:`k3deploy.sim.base`);
- a "disk" tmpfs on ``/var/lib/k3deploy`` and on ``/var/lib/k3sim/docker`` (4 TiB nominal, RAM-backed
  as used; 64 MiB and full under the ``disk-full`` fault);
- its own cgroups ``k3deploy-sim/NAME/NAME-node<i>`` in every cgroup hierarchy nspawn uses (plus the
  v1 ``memory`` controller for accounting, where present);
- ``systemd-nspawn --boot`` (real systemd as the node's PID 1) and the node's own OpenSSH sshd with its
  own ed25519 host key, accepting the cluster key for root.

The state lives in ``/run/k3deploy/sim/NAME/`` (``K3SIM_STATE`` overrides the parent): ``state.json``,
the cluster key ``id_ed25519``, ``known_hosts``, the pyinfra inventory ``NAME.py`` and the node
tmpfs mounts. Every resource is recorded in ``state.json`` before it is created, so ``down`` (and an
``up`` after a crash) can remove exactly what an earlier run made. Processes are stopped by PID only,
after checking that the PID still runs ``systemd-nspawn`` with the recorded start time, or because
they sit in the node's own cgroups.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from k3deploy.errors import K3Error
from k3deploy.sim import base as sim_base
from k3deploy.sim import faults as sim_faults
from k3deploy.sim import profiles

DEFAULT_NAME = "k3sim"
MAX_NODES = 16
STATE_VERSION = 1
CG_ROOT = Path("/sys/fs/cgroup")
CG_PARENT = "k3deploy-sim"
#: directories that behave as the node's disks; the ``disk-full`` fault fills them
DISK_DIRS = ("var/lib/k3deploy", "var/lib/k3sim/docker")
DISK_SIZE_HEALTHY = "4t"
DISK_SIZE_FULL_MIB = 64
DISK_FILLER = ".k3sim-disk-full"
DISK_SOURCE = "k3sim-disk"
NAME_RE = re.compile(r"^[a-z][a-z0-9]{1,9}$")
RESERVED_NAMES = {"all", "head", "workers", "node", "lo"}

class SimError(K3Error):
    """A simulated-cluster operation that cannot be done."""


# --------------------------------------------------------------------------- faults and profiles


class _Clear(NamedTuple):
    """``sim fault --clear RANK``: every fault kind of that rank."""

    rank: int
    kind: str = "*"
    value: str | None = None


def fault_kinds() -> dict[str, str]:
    return dict(sim_faults.FAULT_KINDS)


def parse_fault(text: str) -> Any:
    """``RANK:KIND[=VALUE]`` -> :class:`k3deploy.sim.faults.Fault` (rank, kind, value)."""
    return sim_faults.parse_fault(text)


def fault_text(fault: Any) -> str:
    value = getattr(fault, "value", None)
    return f"{fault.rank}:{fault.kind}" + ("" if value in (None, "") else f"={value}")


def hardware_ids() -> list[str]:
    return list(profiles.hardware_ids())


def node_config(
    hardware: str,
    rank: int,
    nodes: int,
    name: str,
    ip: str,
    faults: list[Any],
    time_scale: float,
    cluster_uuid: str,
) -> dict[str, Any]:
    """The node's ``/etc/k3sim/node.json`` document (:func:`k3deploy.sim.profiles.node_config`)."""
    return profiles.node_config(
        hardware=hardware,
        rank=rank,
        nodes=nodes,
        name=name,
        ip=ip,
        faults=faults,
        time_scale=time_scale,
        cluster_uuid=cluster_uuid,
    )


# --------------------------------------------------------------------------- utilities


def state_root() -> Path:
    return Path(os.environ.get("K3SIM_STATE", "/run/k3deploy/sim"))


def _run(cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise SimError(f"{cmd[0]} not found: {_PACKAGE_OF.get(cmd[0], 'install it')}") from exc
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise SimError(f"{' '.join(cmd)} failed: {msg[-1] if msg else f'exit {res.returncode}'}")
    return res


_PACKAGE_OF = {
    "systemd-nspawn": "install the systemd-container package (apt-get install systemd-container)",
    "ip": "install the iproute2 package (apt-get install iproute2)",
    "ssh": "install the openssh-client package (apt-get install openssh-client)",
    "ssh-keygen": "install the openssh-client package (apt-get install openssh-client)",
    "nsenter": "install the util-linux package (apt-get install util-linux)",
    "mount": "install the mount package (apt-get install mount)",
    "umount": "install the mount package (apt-get install mount)",
}


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _alive(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ours(pid: int | None, start: int | None, comm: str = "systemd-nspawn") -> bool:
    """The PID still runs the process this module started (guards against PID reuse)."""
    if not pid:
        return False
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == start and _comm(pid) == comm


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix`` in this mount namespace, deepest first."""
    pre = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = line.split()[4].replace("\\040", " ")
            if mp == pre or mp.startswith(pre + "/"):
                found.append(mp)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def _umount(path: str) -> None:
    if _run(["umount", path], check=False).returncode != 0:
        _run(["umount", "-l", path], check=False)


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One simulation change at a time on this host (flock on the state directory itself).

    Re-entrant within one process (a nested call does not wait for itself); another process holding the
    lock for longer than ``K3SIM_LOCK_TIMEOUT`` seconds (default 600) is an error, not a hang.
    """
    if _LOCK_DEPTH.get(os.getpid(), 0):
        _LOCK_DEPTH[os.getpid()] += 1
        try:
            yield
        finally:
            _LOCK_DEPTH[os.getpid()] -= 1
        return
    root = state_root()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + float(os.environ.get("K3SIM_LOCK_TIMEOUT", "600"))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SimError(f"another k3deploy sim command holds {root} (cluster {name!r} waited too long): "
                                   "wait for it to finish, or stop it") from None
                time.sleep(0.1)
        _LOCK_DEPTH[os.getpid()] = 1
        try:
            yield
        finally:
            _LOCK_DEPTH[os.getpid()] = 0
    finally:
        os.close(fd)


_LOCK_DEPTH: dict[int, int] = {}


def cgroup_hierarchies() -> list[Path]:
    """The cgroup trees each node gets its own cgroup in.

    Hybrid layout (systemd not PID 1 on Debian 12): the ``name=systemd`` v1 tree and cgroup2 at
    ``unified`` (both used by nspawn), plus the v1 ``memory`` controller for per-node accounting.
    Pure cgroup2: the root.
    """
    if (CG_ROOT / "cgroup.controllers").exists():
        return [CG_ROOT]
    hs = [CG_ROOT / h for h in ("systemd", "unified") if (CG_ROOT / h / "cgroup.procs").exists()]
    if (CG_ROOT / "memory" / "cgroup.procs").exists():
        hs.append(CG_ROOT / "memory")
    return hs


def _cgroup_pids(cg: Path) -> list[int]:
    pids: list[int] = []
    if not cg.is_dir():
        return pids
    for procs in cg.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def _remove_cgroup_tree(cg: Path) -> bool:
    if not cg.is_dir():
        return True
    dirs = sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for d in [*dirs, cg]:
        with contextlib.suppress(OSError):
            d.rmdir()
    return not cg.exists()


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class NodeLayout:
    name: str
    rank: int
    ip: str
    veth: str
    dir: Path

    @property
    def netns(self) -> str:
        return self.name

    @property
    def merged(self) -> Path:
        return self.dir / "merged"


def validate_name(name: str) -> str:
    if not NAME_RE.match(name) or name in RESERVED_NAMES:
        raise SimError(
            f"bad cluster name {name!r}: use 2-10 characters, lowercase letters and digits, starting with a letter"
        )
    return name


def default_subnet(name: str) -> str:
    if name == DEFAULT_NAME:
        return "10.77.0"
    return f"10.77.{1 + zlib.crc32(name.encode()) % 250}"


def validate_subnet(subnet: str) -> str:
    parts = subnet.split(".")
    if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise SimError(f"bad subnet {subnet!r}: give the first three octets of a free /24, e.g. 10.77.5")
    return subnet


def layout(name: str, subnet: str, nodes: int) -> list[NodeLayout]:
    d = state_root() / name
    return [
        NodeLayout(f"{name}-node{i}", i - 1, f"{subnet}.{10 + i}", f"{name}-v{i}", d / f"{name}-node{i}")
        for i in range(1, nodes + 1)
    ]


def bridge_name(name: str) -> str:
    return f"{name}0"


def node_cgroups(cluster: str, node: str) -> list[Path]:
    return [h / CG_PARENT / cluster / node for h in cgroup_hierarchies()]


# --------------------------------------------------------------------------- state


def state_dir(name: str) -> Path:
    return state_root() / name


def load_state(name: str) -> dict[str, Any] | None:
    f = state_dir(name) / "state.json"
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"name": name, "nodes": [], "phase": "corrupt"}


def _save_state(state: dict[str, Any]) -> None:
    _write_atomic(state_dir(state["name"]) / "state.json", json.dumps(state, indent=2) + "\n", 0o600)


def list_names() -> list[str]:
    root = state_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "state.json").exists())


# --------------------------------------------------------------------------- checks


def check_host() -> None:
    """Root, the needed commands and a cgroup layout nspawn can use; one line naming the fix."""
    if os.geteuid() != 0:
        raise SimError("the simulated cluster needs root: run k3deploy sim as root (sudo)")
    for cmd in ("systemd-nspawn", "ip", "ssh", "ssh-keygen", "nsenter", "mount", "umount"):
        if shutil.which(cmd) is None:
            raise SimError(f"{cmd} not found: {_PACKAGE_OF[cmd]}")
    if not cgroup_hierarchies():
        raise SimError(f"no usable cgroup hierarchy under {CG_ROOT}: mount cgroup2 or the hybrid hierarchies")


# --------------------------------------------------------------------------- up


Progress = Callable[[str], None]


def up(
    hardware: str,
    nodes: int,
    name: str = DEFAULT_NAME,
    faults: list[str] | None = None,
    time_scale: float = 0.01,
    subnet: str | None = None,
    progress: Progress | None = None,
    boot_timeout: float | None = None,
    pd_layout: str | None = None,
) -> dict[str, Any]:
    """Create and boot a cluster; returns ``{"name", "inventory", "nodes": [{"name", "ip", "rank"}]}``.

    ``pd_layout`` ``"pd:P,D"`` writes an inventory with groups prefill (P nodes), decode (D nodes) and router
    (the first prefill node) instead of head and workers.
    """
    say = progress or (lambda _m: None)
    validate_name(name)
    pools = parse_layout(pd_layout, nodes)
    hw_ids = hardware_ids()
    if hardware not in hw_ids:
        raise SimError(f"unknown hardware {hardware!r}: choose one of {', '.join(hw_ids)}")
    if not 1 <= nodes <= MAX_NODES:
        raise SimError(f"bad node count {nodes}: the simulation runs 1 to {MAX_NODES} nodes")
    if not time_scale > 0:
        raise SimError(f"bad time scale {time_scale}: give a factor > 0, e.g. 0.01")
    parsed = [parse_fault(f) for f in faults or []]
    for f in parsed:
        if not 0 <= f.rank < nodes:
            raise SimError(f"bad fault {fault_text(f)!r}: rank {f.rank} is not in 0..{nodes - 1}")
    explicit_subnet = subnet is not None
    subnet = validate_subnet(subnet or default_subnet(name))
    for nd in layout(name, subnet, nodes):  # profile and fault errors surface before anything is created
        node_config(hardware, nd.rank, nodes, nd.name, nd.ip, parsed, time_scale, "00000000-0000-0000-0000-000000000000")
    if boot_timeout is None:
        boot_timeout = float(os.environ.get("K3SIM_BOOT_TIMEOUT", "90"))
    check_host()

    with _locked(name):
        old = load_state(name)
        if old is not None:
            if old.get("phase") == "up" and _cluster_alive(old):
                raise SimError(f"simulated cluster {name!r} is already up: run 'k3deploy sim down --name {name}' first")
            say(f"cleaning up leftovers of an earlier run of {name!r}")
            _down_locked(name, old)
        else:
            _clean_orphans(name)
        if explicit_subnet:
            _check_conflicts(name, subnet)
        else:
            subnet = _free_subnet(name, subnet)
        base = sim_base.ensure_base(say)
        started = time.monotonic()
        # node files get the modes a normal root would give them, whatever the caller's umask
        umask = os.umask(0o022)
        try:
            result = _up_locked(name, hardware, nodes, subnet, parsed, time_scale, base, say, boot_timeout, pools)
        except BaseException as exc:
            state = load_state(name)
            with contextlib.suppress(Exception):
                _down_locked(name, state)
            if isinstance(exc, K3Error):
                raise
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise SimError(f"sim up {name!r} failed and was rolled back: {exc}") from exc
        finally:
            os.umask(umask)
        say(f"{nodes} node(s) up in {time.monotonic() - started:.1f} s")
        return result


def _free_subnet(name: str, first: str) -> str:
    """The name's default /24, or the next free one when another cluster or interface uses it."""
    a, b, c = (int(x) for x in first.split("."))
    for i in range(250):
        candidate = f"{a}.{b}.{1 + (c - 1 + i) % 250}"
        try:
            _check_conflicts(name, candidate)
            return candidate
        except SimError as exc:
            if "network interface" in str(exc):
                raise
    raise SimError("no free 10.77.x.0/24 subnet for a simulated cluster: pass --subnet")


def _check_conflicts(name: str, subnet: str) -> None:
    br = bridge_name(name)
    if Path(f"/sys/class/net/{br}").exists():
        raise SimError(f"network interface {br} exists and is not part of a simulated cluster: choose another --name")
    for other in list_names():
        st = load_state(other)
        if other != name and st and st.get("subnet") == subnet:
            raise SimError(f"subnet {subnet}.0/24 is used by simulated cluster {other!r}: pass --subnet with a free one")
    addrs = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    if re.search(rf"\binet {re.escape(subnet)}\.\d+/", addrs):
        raise SimError(f"subnet {subnet}.0/24 is already configured on this host: pass --subnet with a free one")


def _up_locked(
    name: str,
    hardware: str,
    n: int,
    subnet: str,
    faults: list[Any],
    time_scale: float,
    base: Path,
    say: Progress,
    boot_timeout: float,
    pools: dict[str, int] | None = None,
) -> dict[str, Any]:
    sdir = state_dir(name)
    sdir.mkdir(parents=True, exist_ok=True)
    os.chmod(sdir, 0o700)
    nodes = layout(name, subnet, n)
    cluster_uuid = str(uuid.uuid4())
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "name": name,
        "hardware": hardware,
        "subnet": subnet,
        "bridge": bridge_name(name),
        "bridge_created": False,
        "base": str(base),
        "cluster_uuid": cluster_uuid,
        "time_scale": time_scale,
        "phase": "starting",
        "created": time.time(),
        "inventory": str(sdir / f"{name}.py"),
        "pools": pools,
        "key": str(sdir / "id_ed25519"),
        "known_hosts": str(sdir / "known_hosts"),
        "cgroups": [str(h / CG_PARENT / name) for h in cgroup_hierarchies()],
        "nodes": [
            {
                "name": nd.name,
                "rank": nd.rank,
                "ip": nd.ip,
                "netns": nd.netns,
                "veth": nd.veth,
                "dir": str(nd.dir),
                "faults": [fault_text(f) for f in faults if f.rank == nd.rank],
                "pid": None,
                "pid_start": None,
            }
            for nd in nodes
        ],
    }
    _save_state(state)

    key = sdir / "id_ed25519"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"k3deploy-sim-{name}", "-f", str(key)])
    pubkey = (sdir / "id_ed25519.pub").read_text()

    br = state["bridge"]
    state["bridge_created"] = True
    _save_state(state)
    _run(["ip", "link", "add", br, "type", "bridge"])
    _run(["ip", "addr", "add", f"{subnet}.1/24", "dev", br])
    _run(["ip", "link", "set", br, "up"])

    hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
        f"{nd.ip}\t{nd.name}\n" for nd in nodes
    )
    host_keys: dict[str, str] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for nd, rec in zip(nodes, state["nodes"], strict=True):
        node_faults = [f for f in faults if f.rank == nd.rank]
        host_keys[nd.name] = _prepare_root(nd, base, pubkey, hosts, hardware, n, node_faults, time_scale, cluster_uuid)
        _prepare_net(nd, br, subnet)
        proc = _spawn(name, nd)
        procs[nd.name] = proc
        st = _proc_stat(proc.pid)
        rec["pid"], rec["pid_start"] = proc.pid, st[1] if st else None
        _save_state(state)

    (sdir / "known_hosts").write_text("".join(f"{nd.ip},{nd.name} {host_keys[nd.name]}\n" for nd in nodes))
    _write_inventory(state)
    say(f"booting {n} node(s) of {hardware} ({name}, {subnet}.0/24)")
    _wait_ready(state, nodes, faults, boot_timeout)
    state["phase"] = "up"
    state["up_at"] = time.time()
    _save_state(state)
    # the nodes outlive this process: stop tracking them as children
    for proc in procs.values():
        proc.returncode = 0
    return summary(state)


@contextlib.contextmanager
def running(
    hardware: str, nodes: int, name: str = DEFAULT_NAME, faults: list[str] | None = None, **kwargs: Any
) -> Iterator[dict[str, Any]]:
    """``with running("gb300", 2, name="t1") as c:`` -- a cluster for the block, removed afterwards."""
    result = up(hardware, nodes, name=name, faults=faults, **kwargs)
    try:
        yield result
    finally:
        down(name)


def summary(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": state["name"],
        "inventory": state["inventory"],
        "nodes": [{"name": r["name"], "ip": r["ip"], "rank": r["rank"]} for r in state["nodes"]],
    }


def _prepare_root(
    nd: NodeLayout,
    base: Path,
    pubkey: str,
    hosts: str,
    hardware: str,
    n: int,
    faults: list[Any],
    time_scale: float,
    cluster_uuid: str,
) -> str:
    """Mount the node's tmpfs and overlay root and write its per-node files; returns its host key."""
    size = os.environ.get("K3SIM_NODE_TMPFS", "1g")
    nd.dir.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", f"k3sim-{nd.name}", str(nd.dir)])
    for sub in ("upper", "work", "merged"):
        (nd.dir / sub).mkdir()
    _run(
        [
            "mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={base},upperdir={nd.dir / 'upper'},workdir={nd.dir / 'work'}",
            str(nd.merged),
        ]
    )  # fmt: skip
    root = nd.merged
    home = _root_home(root)
    ssh_dir = root / home.lstrip("/") / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    _write_atomic(ssh_dir / "authorized_keys", pubkey, 0o600)
    _write_atomic(root / "etc/hostname", nd.name + "\n")
    _write_atomic(root / "etc/hosts", hosts)
    _write_atomic(root / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    hk = root / "etc/ssh/ssh_host_ed25519_key"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{nd.name}", "-f", str(hk)])
    host_pub = " ".join(Path(str(hk) + ".pub").read_text().split()[:2])
    doc = node_config(
        hardware=hardware,
        rank=nd.rank,
        nodes=n,
        name=nd.name,
        ip=nd.ip,
        faults=faults,
        time_scale=time_scale,
        cluster_uuid=cluster_uuid,
    )
    _install_tools(root, doc)
    full = any(f.kind == "disk-full" for f in faults)
    for rel in DISK_DIRS:
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE_HEALTHY},mode=755", DISK_SOURCE, str(d)])
        if full:
            _fill_disk(d)
    if any(f.kind == "sshd-down" for f in faults):
        for unit in ("ssh.service", "ssh.socket", "sshd.service"):
            link = root / "etc/systemd/system" / unit
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            link.symlink_to("/dev/null")
    return host_pub


def _root_home(root: Path) -> str:
    for line in (root / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == "root" and len(parts) > 5:
            return parts[5] or "/root"
    raise SimError(f"no root user in {root}/etc/passwd: rebuild the base with 'k3deploy sim base --rebuild'")


def _install_tools(root: Path, doc: dict[str, Any]) -> None:
    """Install the simulated tools for this node's config into its root, then its node.json.

    Tools the config leaves out (other vendors' tools, ``no-nvidia-smi``) are removed, so that a
    runtime fault change installs exactly the right set.
    """
    for rel in profiles.excluded_paths(doc):
        with contextlib.suppress(FileNotFoundError):
            (root / rel.lstrip("/")).unlink()
    profiles.install_node_tools(root, doc)
    cfg = root / "etc/k3sim/node.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(cfg, json.dumps(doc, indent=2) + "\n")


def _fill_disk(d: Path) -> None:
    """Shrink a node disk to 64 MiB and leave about 1 MiB free (the ``disk-full`` fault)."""
    filler = d / DISK_FILLER
    with contextlib.suppress(FileNotFoundError):
        filler.unlink()
    used = _disk_used(d)
    size_mib = max(DISK_SIZE_FULL_MIB, used // (1 << 20) + 2)
    _run(["mount", "-o", f"remount,size={size_mib}m", str(d)])
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, max(0, free - (1 << 20)))


def _disk_used(d: Path) -> int:
    st = os.statvfs(d)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _clear_disk(d: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (d / DISK_FILLER).unlink()
    _run(["mount", "-o", f"remount,size={DISK_SIZE_HEALTHY}", str(d)])


def _prepare_net(nd: NodeLayout, br: str, subnet: str) -> None:
    _run(["ip", "netns", "add", nd.netns])
    _run(["ip", "link", "add", nd.veth, "type", "veth", "peer", "name", "eth0", "netns", nd.netns])
    _run(["ip", "link", "set", nd.veth, "master", br, "up"])
    ns = ["ip", "-n", nd.netns]
    _run([*ns, "addr", "add", f"{nd.ip}/24", "dev", "eth0"])
    _run([*ns, "link", "set", "eth0", "up"])
    _run([*ns, "link", "set", "lo", "up"])
    _run([*ns, "route", "add", "default", "via", f"{subnet}.1"])


def _spawn(cluster: str, nd: NodeLayout) -> subprocess.Popen[bytes]:
    """Start ``systemd-nspawn --boot`` for the node inside the node's own cgroups."""
    cgs = node_cgroups(cluster, nd.name)
    for cg in cgs:
        cg.mkdir(parents=True, exist_ok=True)
    procs_files = [str(cg / "cgroup.procs") for cg in cgs]

    def enter_cgroups() -> None:  # runs in the child between fork and exec
        me = str(os.getpid()).encode()
        for f in procs_files:
            fd = os.open(f, os.O_WRONLY)
            try:
                os.write(fd, me)
            finally:
                os.close(fd)

    cmd = [
        "systemd-nspawn", "-q", "-D", str(nd.merged), "--boot",
        # no host systemd to register with or to create a scope: stay in our own cgroup
        "--register=no", "--keep-unit",
        f"--machine={nd.name}", f"--hostname={nd.name}",
        f"--network-namespace-path=/run/netns/{nd.netns}",
        "--console=pipe", "--resolv-conf=off", "--timezone=off", "--link-journal=no",
        # a GPU node's /dev/shm is large (NCCL, PyTorch IPC); tmpfs size is a limit, not an allocation
        "--tmpfs=/dev/shm:mode=1777,size=64g",
    ]  # fmt: skip
    # placeholder device nodes (GPUs, IMEX channel, RDMA) so that existence checks see a real node's /dev
    cfg_path = nd.merged / profiles.NODE_CONFIG_PATH.lstrip("/")
    if cfg_path.is_file():
        for dev in profiles.device_nodes(json.loads(cfg_path.read_text())):
            cmd.append(f"--bind-ro=/dev/null:{dev}")
    with open(nd.dir / "console.log", "wb") as log:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=enter_cgroups,
            close_fds=True,
        )


def node_init_pid(rec: dict[str, Any]) -> int | None:
    """Host PID of the node's systemd (PID 1 inside the node)."""
    if not _ours(rec.get("pid"), rec.get("pid_start")):
        return None
    for c in _children(rec["pid"]):
        if _comm(c) == "systemd":
            return c
    return None


def _ssh_base(state: dict[str, Any]) -> list[str]:
    return [
        "ssh", "-q", "-i", state["key"],
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={state['known_hosts']}", "-o", "ConnectTimeout=2",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip


def _ssh_banner(ip: str, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _wait_ready(state: dict[str, Any], nodes: list[NodeLayout], faults: list[Any], timeout: float) -> None:
    """Wait until every node's sshd accepts the cluster key (or, with sshd-down, its systemd is up)."""
    no_ssh = {f.rank for f in faults if f.kind == "sshd-down"}
    pending = {nd.name: nd for nd in nodes}
    recs = {r["name"]: r for r in state["nodes"]}
    checks: dict[str, subprocess.Popen[bytes]] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for nm, nd in list(pending.items()):
            rec = recs[nm]
            if not _ours(rec["pid"], rec["pid_start"]):
                _reap(rec["pid"])
                raise SimError(f"node {nm} stopped while booting: {_console_tail(nd)}")
            proc = checks.get(nm)
            if proc is not None:
                rc = proc.poll()
                if rc is None:
                    continue
                del checks[nm]
                out = proc.stdout.read().decode().strip() if proc.stdout else ""
                # ssh: exit 0; systemctl is-system-running --wait: booted, "running" or "degraded"
                if rc == 0 or out == "degraded":
                    del pending[nm]
                continue
            if nd.rank in no_ssh:
                pid1 = node_init_pid(rec)
                if pid1:
                    checks[nm] = subprocess.Popen(
                        ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p",
                         "systemctl", "is-system-running", "--wait"],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                    )  # fmt: skip
            elif _ssh_banner(nd.ip):
                checks[nm] = subprocess.Popen(
                    [*_ssh_base(state), f"root@{nd.ip}", "true"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                )  # fmt: skip
        if not pending:
            break
        if time.monotonic() > deadline:
            for p in checks.values():
                p.kill()
                p.wait()
            names = ", ".join(sorted(pending))
            raise SimError(f"node(s) {names} not reachable over SSH after {timeout:.0f} s (raise K3SIM_BOOT_TIMEOUT)")
        time.sleep(0.05)


def _console_tail(nd: NodeLayout) -> str:
    with contextlib.suppress(OSError):
        lines = [ln for ln in (nd.dir / "console.log").read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return "no console output"


def parse_layout(layout: str | None, nodes: int) -> dict[str, int] | None:
    """``None`` (head + workers) or ``"pd:P,D"`` -> ``{"prefill": P, "decode": D}`` with P + D == nodes."""
    if layout is None or layout == "head":
        return None
    m = re.fullmatch(r"pd:(\d+),(\d+)", layout)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise K3Error(f"layout {layout!r} is not pd:P,D with P, D >= 1 (e.g. pd:1,2)")
    p, d = int(m.group(1)), int(m.group(2))
    if p + d != nodes:
        raise K3Error(f"layout {layout} needs {p + d} nodes, got --nodes {nodes}: make P + D equal --nodes")
    return {"prefill": p, "decode": d}


def _write_inventory(state: dict[str, Any]) -> None:
    ssh = {
        "ssh_user": "root",
        "ssh_key": state["key"],
        "ssh_known_hosts_file": state["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
    }

    def host(rec: dict[str, Any]) -> str:
        data = {"ssh_hostname": rec["ip"], "rank": rec["rank"], "k3_ip": rec["ip"], "k3_sim": state["name"]}
        return f"    ({rec['name']!r}, {{**_ssh, **{data!r}}}),\n"

    recs = state["nodes"]
    pools = state.get("pools")
    head = (
        f'"""pyinfra inventory of the simulated cluster {state["name"]!r} '
        f'({len(recs)} x {state["hardware"]}), written by k3deploy sim up."""\n\n'
        f"_ssh = {ssh!r}\n\n"
    )
    if pools:
        p = pools["prefill"]

        def pool(rs: list[dict[str, Any]]) -> str:
            return "".join(host({**r, "rank": i}) for i, r in enumerate(rs))

        text = head + (f"prefill = [\n{pool(recs[:p])}]\n\n"
                       f"decode = [\n{pool(recs[p:])}]\n\n"
                       f"router = [\n{host({**recs[0], 'rank': 0})}]\n")
    else:
        text = head + f"head = [\n{host(recs[0])}]\n\nworkers = [\n{''.join(host(r) for r in recs[1:])}]\n"
    _write_atomic(Path(state["inventory"]), text, 0o600)
    # the selection for `pyinfra <inventory> deploy/k3.py`, Ansible-style next to the inventory
    gv = Path(state["inventory"]).parent / "group_vars"
    gv.mkdir(exist_ok=True)
    lines = ["# written by k3deploy sim up: the selection for this simulated cluster",
             f"k3_hardware: {state['hardware']}"]
    if pools:
        lines.append("k3_strategy: pd_cluster")
    if state["hardware"] == "ascend_910c":
        lines.append("k3_variant: ascend_w4a8")
    lines.append("k3_poll_interval: 0.5")
    _write_atomic(gv / "all.yml", "\n".join(lines) + "\n", 0o644)


# --------------------------------------------------------------------------- down


def _cluster_alive(state: dict[str, Any]) -> bool:
    recs = state.get("nodes") or []
    return bool(recs) and all(_ours(r.get("pid"), r.get("pid_start")) for r in recs)


def down(name: str = DEFAULT_NAME, progress: Progress | None = None) -> bool:
    """Stop and remove a cluster; False when there was nothing to remove."""
    validate_name(name)
    check_host()
    with _locked(name):
        state = load_state(name)
        if state is None and not _has_orphans(name):
            return False
        started = time.monotonic()
        _down_locked(name, state)
        if progress:
            progress(f"{name} down in {time.monotonic() - started:.1f} s")
        return True


def _has_orphans(name: str) -> bool:
    return state_dir(name).exists() or any(
        (h / CG_PARENT / name).exists() for h in cgroup_hierarchies()
    )


def _clean_orphans(name: str) -> None:
    if _has_orphans(name):
        _down_locked(name, None)


def _down_locked(name: str, state: dict[str, Any] | None) -> None:
    state = state or {"name": name, "nodes": []}
    recs = state.get("nodes") or []
    if state.get("phase") == "up":
        state["phase"] = "stopping"
        with contextlib.suppress(OSError):
            _save_state(state)
    # 1. power every node off at once: nspawn forwards SIGTERM to the node's systemd as SIGRTMIN+3
    for r in recs:
        if _ours(r.get("pid"), r.get("pid_start")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 15
    for r in recs:
        while _ours(r.get("pid"), r.get("pid_start")) and time.monotonic() < deadline:
            _reap(r["pid"])
            time.sleep(0.05)
        if _ours(r.get("pid"), r.get("pid_start")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(r["pid"], signal.SIGKILL)
        if r.get("pid"):
            _reap(r["pid"])
    # 2. anything left in the cluster's cgroups descends from its nspawns
    cg_roots = [Path(p) for p in state.get("cgroups", [])] or [h / CG_PARENT / name for h in cgroup_hierarchies()]
    for _ in range(100):
        pids = [p for cg in cg_roots for p in _cgroup_pids(cg)]
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
            _reap(p)
        time.sleep(0.05)
    # 3. file systems: disks, overlays, node tmpfs (deepest first)
    sdir = state_dir(name)
    for mp in _mounts_under(sdir):
        _umount(mp)
    # 4. network
    for r in recs:
        if Path(f"/run/netns/{r['netns']}").exists():
            _run(["ip", "netns", "del", r["netns"]], check=False)
        if Path(f"/sys/class/net/{r['veth']}").exists():
            _run(["ip", "link", "del", r["veth"]], check=False)
        # the host's /run is no tmpfs, so nspawn leaves its propagation directory behind
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{r['name']}", ignore_errors=True)
    if state.get("bridge_created") and Path(f"/sys/class/net/{state['bridge']}").exists():
        _run(["ip", "link", "del", state["bridge"]], check=False)
    # 5. cgroups, then the state directory
    for cg in cg_roots:
        for _ in range(40):
            if _remove_cgroup_tree(cg):
                break
            time.sleep(0.05)
        parent = cg.parent
        with contextlib.suppress(OSError):
            parent.rmdir()  # k3deploy-sim/, once no cluster uses it
    left = _mounts_under(sdir)
    if left:
        raise SimError(f"cannot unmount {left[0]}: a process outside the simulation uses it; stop it and run sim down again")
    shutil.rmtree(sdir, ignore_errors=True)


# --------------------------------------------------------------------------- status


def status(name: str | None = None) -> list[dict[str, Any]]:
    """One entry per cluster: name, hardware, phase, inventory and per-node liveness."""
    out = []
    for nm in [name] if name else list_names():
        st = load_state(nm)
        if st is None:
            continue
        nodes = []
        for r in st.get("nodes", []):
            running = _ours(r.get("pid"), r.get("pid_start"))
            nodes.append(
                {
                    "name": r["name"],
                    "ip": r["ip"],
                    "rank": r["rank"],
                    "running": running,
                    "ssh": running and _ssh_banner(r["ip"], 0.5),
                    "faults": r.get("faults", []),
                    "memory_bytes": node_memory(st, r) if running else None,
                }
            )
        phase = st.get("phase", "unknown")
        if phase == "up" and not all(n["running"] for n in nodes):
            phase = "degraded"
        out.append(
            {
                "name": nm,
                "hardware": st.get("hardware"),
                "phase": phase,
                "subnet": f"{st.get('subnet')}.0/24",
                "inventory": st.get("inventory"),
                "nodes": nodes,
            }
        )
    return out


def node_memory(state: dict[str, Any], rec: dict[str, Any]) -> int | None:
    """Memory charged to the node: its processes plus its tmpfs pages (v1 memory cgroup), else its RSS."""
    mem_cg = CG_ROOT / "memory" / CG_PARENT / state["name"] / rec["name"]
    with contextlib.suppress(OSError, ValueError):
        return int((mem_cg / "memory.usage_in_bytes").read_text())
    v2 = CG_ROOT / CG_PARENT / state["name"] / rec["name"] / "memory.current"
    with contextlib.suppress(OSError, ValueError):
        return int(v2.read_text())
    total = 0
    for cg in node_cgroups(state["name"], rec["name"]):
        for pid in set(_cgroup_pids(cg)):
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        break
    return total


# --------------------------------------------------------------------------- runtime faults


def set_faults(
    name: str, add: list[str] | None = None, clear: list[str] | None = None, clear_all: bool = False
) -> dict[str, list[str]]:
    """Add or clear faults on a running cluster; returns each node's faults afterwards.

    The node's ``/etc/k3sim/node.json`` is rewritten (the simulated tools re-read it on every call);
    ``disk-full`` shrinks and fills the node's disks, ``sshd-down`` stops and masks ``ssh.service``.
    """
    validate_name(name)
    check_host()
    with _locked(name):
        state = load_state(name)
        if state is None or state.get("phase") != "up":
            raise SimError(f"no simulated cluster {name!r} is up: start one with 'k3deploy sim up --name {name} ...'")
        n = len(state["nodes"])
        adds = [parse_fault(t) for t in add or []]
        clears = [_parse_clear(t) for t in clear or []]
        for f in [*adds, *clears]:
            if not 0 <= f.rank < n:
                raise SimError(f"bad fault {fault_text(f)!r}: rank {f.rank} is not in 0..{n - 1}")
        plan = []
        for rec in state["nodes"]:
            before = [parse_fault(t) for t in rec.get("faults", [])]
            after = [] if clear_all else list(before)
            after = [
                f for f in after if not any(c.rank == f.rank and c.kind in ("*", f.kind) for c in clears)
            ]
            for f in adds:
                if f.rank == rec["rank"]:
                    after = [g for g in after if g.kind != f.kind] + [f]
            if [fault_text(f) for f in after] != rec.get("faults", []):
                # a fault the profile cannot take fails here, before any node changes
                node_config(state["hardware"], rec["rank"], n, rec["name"], rec["ip"], after,
                            state["time_scale"], state["cluster_uuid"])  # fmt: skip
                plan.append((rec, before, after))
        umask = os.umask(0o022)
        try:
            for rec, before, after in plan:
                _apply_faults(state, rec, before, after)
                rec["faults"] = [fault_text(f) for f in after]
                _save_state(state)
        finally:
            os.umask(umask)
        return {rec["name"]: rec.get("faults", []) for rec in state["nodes"]}


def _parse_clear(text: str) -> _Clear:
    """``RANK`` (all faults of that node) or ``RANK:KIND[=VALUE]`` (that kind; the value is ignored)."""
    rank, _, rest = text.strip().partition(":")
    kind = rest.partition("=")[0] or "*"
    if not rank.isdigit() or (kind != "*" and kind not in sim_faults.FAULT_KINDS):
        raise SimError(
            f"bad fault to clear {text!r}: use RANK or RANK:KIND with KIND one of {', '.join(sim_faults.FAULT_KINDS)}"
        )
    return _Clear(int(rank), kind)


def _apply_faults(state: dict[str, Any], rec: dict[str, Any], before: list[Any], after: list[Any]) -> None:
    nd = Path(rec["dir"])
    doc = node_config(
        hardware=state["hardware"],
        rank=rec["rank"],
        nodes=len(state["nodes"]),
        name=rec["name"],
        ip=rec["ip"],
        faults=after,
        time_scale=state["time_scale"],
        cluster_uuid=state["cluster_uuid"],
    )
    _install_tools(nd / "merged", doc)
    had = {f.kind for f in before}
    has = {f.kind for f in after}
    root = nd / "merged"
    if "disk-full" in has - had:
        for rel in DISK_DIRS:
            _fill_disk(root / rel)
    elif "disk-full" in had - has:
        for rel in DISK_DIRS:
            _clear_disk(root / rel)
    if ("sshd-down" in had) != ("sshd-down" in has):
        pid1 = node_init_pid(rec)
        if pid1 is None:
            raise SimError(f"node {rec['name']} is not running: run 'k3deploy sim down --name {state['name']}' and up again")
        action = ["mask", "--now"] if "sshd-down" in has else ["unmask"]
        enter = ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p"]
        _run([*enter, "systemctl", *action, "ssh.service"])
        if "sshd-down" not in has:
            _run([*enter, "systemctl", "start", "ssh.service"])
