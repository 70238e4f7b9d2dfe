"""The nodes' processes: the ``systemd-nspawn`` per node, its cgroups, and stopping them by PID.

Processes are stopped by PID only, after checking that the PID still runs ``systemd-nspawn`` with the
recorded start time (:func:`ours`), or because they sit in the node's own cgroups
(``k3deploy-sim/CLUSTER/NODE`` in every hierarchy :func:`cgroup_hierarchies` returns).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from k3sim import profiles
from k3sim import router as sim_router
from k3sim.state import NodeLayout

CG_ROOT = Path("/sys/fs/cgroup")
CG_PARENT = "k3deploy-sim"


# --------------------------------------------------------------------------- PIDs


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def ours(pid: int | None, start: int | None, name: str = "systemd-nspawn") -> bool:
    """The PID still runs the process this module started (guards against PID reuse)."""
    if not pid:
        return False
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == start and comm(pid) == name


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def node_init_pid(rec: dict[str, Any]) -> int | None:
    """Host PID of the node's systemd (PID 1 inside the node)."""
    if not ours(rec.get("pid"), rec.get("pid_start")):
        return None
    for c in children(rec["pid"]):
        if comm(c) == "systemd":
            return c
    return None


# --------------------------------------------------------------------------- cgroups


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


def cluster_cgroups(cluster: str) -> list[Path]:
    """The cluster's own cgroup in every hierarchy (the parent of its nodes' cgroups)."""
    return [h / CG_PARENT / cluster for h in cgroup_hierarchies()]


def node_cgroups(cluster: str, node: str) -> list[Path]:
    return [h / CG_PARENT / cluster / node for h in cgroup_hierarchies()]


def cgroup_pids(cg: Path) -> list[int]:
    """PIDs in the cgroup ``cg`` and its descendants.

    The tree changes while it is read (systemd inside a node removes its own cgroups as units stop): os.walk
    skips a directory that is gone by the time it is listed, where Path.rglob raises.
    """
    pids: list[int] = []
    for top, _dirs, files in os.walk(cg):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                pids += [int(p) for p in Path(top, "cgroup.procs").read_text().split()]
    return pids


def remove_cgroup_tree(cg: Path) -> bool:
    """Remove ``cg`` and its descendants (those that are empty); True when ``cg`` is gone."""
    if not cg.is_dir():
        return True
    dirs = [Path(top) for top, _dirs, _files in os.walk(cg, topdown=False)]  # children before parents
    for d in dirs or [cg]:
        with contextlib.suppress(OSError):
            d.rmdir()
    return not cg.exists()


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
        for pid in set(cgroup_pids(cg)):
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        break
    return total


# --------------------------------------------------------------------------- start


#: the node directory's folder bound over the node's /sys/kernel/mm (:func:`k3sim.profiles.sysfs_mm_files`)
SYSFS_MM_DIR = "sys-kernel-mm"


#: where a node sees the engine venv (the real vLLM 0.33.0, CPU build, made by tools/engine-venv.sh), read-only: the
#: client ``k3deploy bench`` runs from the engines' image is vLLM's own, from there (node_tools ``vllmsim_bench.py``)
ENGINE_VENV_NODE_DIR = "/opt/k3sim/vllm-engine"


def engine_venv() -> Path | None:
    """``K3SIM_ENGINE_VENV``, else the repository's ``.venv-engine``, its real path; None when it is not there."""
    env = os.environ.get("K3SIM_ENGINE_VENV")
    venv = Path(env) if env else Path(__file__).resolve().parents[2] / ".venv-engine"
    return venv.resolve() if (venv / "pyvenv.cfg").is_file() else None


def spawn(cluster: str, nd: NodeLayout, append_log: bool = False, own_uptime: bool = False) -> subprocess.Popen[bytes]:
    """Start ``systemd-nspawn --boot`` for the node inside the node's own cgroups.

    ``append_log``: add to the node's ``console.log`` instead of starting it afresh (a reboot). ``own_uptime``: the
    node's processes live in a time namespace of their own whose boot clock starts at this boot (``uptime``,
    ``sysinfo()``), so that what asks a node when it booted sees a reboot (slurmd reports it to slurmctld, which
    then ends the jobs the node lost).
    """
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
        # the node's own network namespace is its to configure, as a host's is: keepalived adds and removes the
        # site's virtual address (k3_vip) on eth0 (nspawn keeps CAP_NET_ADMIN only with --private-network)
        "--capability=CAP_NET_ADMIN",
    ]  # fmt: skip
    # the real vllm-router, installed once on the host (k3sim.router), read-only on every node
    rdir = sim_router.router_dir()
    if rdir.is_dir():
        cmd.append(f"--bind-ro={rdir}:{sim_router.NODE_DIR}")
    venv = engine_venv()
    if venv is not None:
        cmd.append(f"--bind-ro={venv}:{ENGINE_VENV_NODE_DIR}")
    # placeholder device nodes (GPUs, IMEX channel, RDMA) so that existence checks see a real node's /dev
    cfg_path = nd.merged / profiles.NODE_CONFIG_PATH.lstrip("/")
    if cfg_path.is_file():
        config = json.loads(cfg_path.read_text())
        for dev in profiles.device_nodes(config):
            cmd.append(f"--bind-ro=/dev/null:{dev}")
        # what the node's kernel shows under /sys/kernel/mm (AMD: the amdkfd peer-memory interface), bound over it
        mm_files = profiles.sysfs_mm_files(config)
        if mm_files is not None:
            profiles.write_sysfs_mm(nd.dir / SYSFS_MM_DIR, mm_files)
            cmd.append(f"--bind-ro={nd.dir / SYSFS_MM_DIR}:{profiles.SYSFS_MM}")
    if own_uptime:  # unshare execs nspawn (same PID); nspawn's children, the node, get the new time namespace
        up = Path("/proc/uptime").read_text().split()[0].split(".")[0]
        cmd = ["unshare", "--time", f"--boottime=-{up}", *cmd]
    with open(nd.dir / "console.log", "ab" if append_log else "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=enter_cgroups,
            close_fds=True,
        )
    # the node's PID is checked by its name (ours()): return once unshare has become systemd-nspawn
    deadline = time.monotonic() + 10
    while own_uptime and comm(proc.pid) == "unshare" and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def console_tail(nd: NodeLayout) -> str:
    """The last non-empty line the node's nspawn wrote to its console log."""
    with contextlib.suppress(OSError):
        lines = [ln for ln in (nd.dir / "console.log").read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return "no console output"


# --------------------------------------------------------------------------- stop


def stop_nodes(recs: list[dict[str, Any]], timeout: float = 15) -> None:
    """Power every node off at once, then SIGKILL each nspawn still running after ``timeout`` seconds.

    nspawn forwards SIGTERM to the node's systemd as SIGRTMIN+3 (a clean poweroff).
    """
    for r in recs:
        if ours(r.get("pid"), r.get("pid_start")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for r in recs:
        while ours(r.get("pid"), r.get("pid_start")) and time.monotonic() < deadline:
            reap(r["pid"])
            time.sleep(0.05)
        if ours(r.get("pid"), r.get("pid_start")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(r["pid"], signal.SIGKILL)
        if r.get("pid"):
            reap(r["pid"])


def reboot_node(rec: dict[str, Any], timeout: float) -> bool:
    """Reboot the node's systemd as ``systemctl reboot`` does and wait until its nspawn has exited.

    The node's systemd gets SIGRTMIN+5 (``reboot.target``, job mode replace-irreversibly, as ``systemctl reboot``):
    it stops every unit (``ExecStop=``, SIGTERM to their processes, SIGKILL after their stop timeouts), then reboots,
    and nspawn exits (status 133). True when it went that way; False when the nspawn's systemd never appeared or the
    nspawn still ran after ``timeout`` seconds, and was SIGKILLed (a reset).
    """
    pid, start = int(rec.get("pid") or 0), rec.get("pid_start")
    deadline = time.monotonic() + timeout
    appear = time.monotonic() + min(timeout, 5.0)
    pid1 = node_init_pid(rec)
    while pid1 is None and ours(pid, start) and time.monotonic() < appear:
        time.sleep(0.05)  # nspawn has not started the node's systemd yet
        pid1 = node_init_pid(rec)
    clean = pid1 is not None
    if pid1 is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGRTMIN + 5)
    else:
        deadline = time.monotonic()
    while ours(pid, start) and time.monotonic() < deadline:
        reap(pid)  # only ours to reap when this process started it (up and reboot in one Python process)
        time.sleep(0.05)
    if ours(pid, start):
        clean = False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        gone = time.monotonic() + 10
        while ours(pid, start) and time.monotonic() < gone:
            reap(pid)
            time.sleep(0.05)
    if pid:
        reap(pid)
    return clean


def kill_cgroups(cg_roots: list[Path]) -> None:
    """SIGKILL whatever is left in these cgroups (all of it descends from the cluster's nspawns)."""
    for _ in range(100):
        pids = [p for cg in cg_roots for p in cgroup_pids(cg)]
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
            reap(p)
        time.sleep(0.05)


def remove_cgroups(cg_roots: list[Path]) -> None:
    """Remove the cluster's cgroup trees, then ``k3deploy-sim/`` once no cluster uses it."""
    for cg in cg_roots:
        for _ in range(40):
            if remove_cgroup_tree(cg):
                break
            time.sleep(0.05)
        parent = cg.parent
        with contextlib.suppress(OSError):
            parent.rmdir()  # k3deploy-sim/, once no cluster uses it


def remove_nspawn_leftovers(node: str) -> None:
    """The host's /run is no tmpfs, so nspawn leaves the node's propagation directory behind."""
    shutil.rmtree(f"/run/systemd/nspawn/propagate/{node}", ignore_errors=True)
