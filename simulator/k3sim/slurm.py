"""A real Slurm in a simulated cluster (``sim up --slurm``): Debian 12's Slurm 22.05 and munge, from the base root.

The base root (:mod:`k3sim.base`) carries the packages with their units disabled. For a cluster made with
``--slurm`` this module writes, into every node's root before it boots:

- ``/etc/munge/munge.key``: one random key per cluster (0600, owner munge), the same on every node;
- ``/etc/slurm/slurm.conf`` (:func:`render_conf`) and ``/etc/slurm/gres.conf`` (:func:`render_gres`), the same on
  every node: the controller on the rank-0 node, one ``NodeName`` per node (the node's host name, which every
  node's ``/etc/hosts`` resolves), the nodes' GPUs as a generic resource named as the vendor's pack names it
  (:func:`gres_name`: ``gpu``, ``npu`` on Ascend), partition ``k3`` over all nodes;
- the units enabled for ``multi-user.target``: ``munge`` and ``slurmd`` on every node, ``slurmctld`` on rank 0;
- the simulator's pyxis (:func:`build_plugin`: ``spank/k3sim_pyxis.c``, a SPANK plugin compiled once per source
  and ``slurm/spank.h`` on the control host with ``cc -shared -fPIC`` against Debian's libslurm-dev, the nodes'
  Slurm 22.05) at ``/usr/lib/k3sim/spank/k3sim_pyxis.so``, loaded by slurmd and srun through
  ``/etc/slurm/plugstack.conf``: srun's ``--container-image`` and the other pyxis options, each task of such a step
  handed to the simulated ``enroot start`` (node tool ``/usr/bin/enroot``), in the job's process tree;
- the user ``k3job`` (:data:`JOB_USER`, the same uid on every node), whom a deploy may submit its jobs as
  (``k3_slurm_user``), as a site that sets ``DisableRootJobs`` needs.

Everything lives in the nodes' own roots and cgroups, so ``sim down`` removes it with the nodes. The cluster's
state records ``{"controller", "submit_host", "partition", "gpus", "cpus", "conf"}`` under ``slurm``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from k3deploy.vendors import PACKS
from k3sim.host import SimError, write_atomic

#: the partition every node of a --slurm cluster is in (the default one)
PARTITION = "k3"
#: the programs ``--slurm`` needs in the base root; a base without them cannot give a cluster Slurm
PROGRAMS = ("usr/sbin/slurmd", "usr/sbin/slurmctld", "usr/sbin/munged", "usr/bin/sbatch", "usr/bin/sinfo")
#: seconds between the SIGTERM and the SIGKILL of a cancelled job's processes. Slurm's default is 30; the simulated
#: engines stop within a second, and a cancel in the tests (and in a deploy's resubmit) should not wait half a minute
KILL_WAIT = 5
#: the nodes' systemd: what is left of a job at shutdown gets its SIGKILL after this (see prepare_node)
SYSTEM_CONF = f"""# written by k3deploy sim up --slurm: a job's processes left at shutdown are killed after
# {KILL_WAIT * 2} s, not 90
[Manager]
DefaultTimeoutStopSec={KILL_WAIT * 2}s
"""
UNITS_ALL = ("munge.service", "slurmd.service")
UNITS_CONTROLLER = ("slurmctld.service",)
#: the job credential's lifetime in the simulated cluster, which is also how long a requeued job waits before it
#: starts again (slurm.conf(5), AuthInfo cred_expire; Slurm's default is 120 s)
CRED_EXPIRE = 10


#: the simulator's pyxis: its source, the header it is built against, where each node has it, the line that loads it
SPANK_SOURCE = Path(__file__).with_name("spank") / "k3sim_pyxis.c"
SPANK_HEADER = Path("/usr/include/slurm/spank.h")
PLUGIN = "/usr/lib/k3sim/spank/k3sim_pyxis.so"
PLUGSTACK = f"# written by k3deploy sim up --slurm: the simulator's pyxis (srun --container-image)\nrequired {PLUGIN}\n"
#: a user that jobs may be submitted as (k3_slurm_user), with the same uid and gid on every node
JOB_USER, JOB_UID = "k3job", 2901


def build_plugin(cache: Path) -> Path:
    """The simulator's pyxis compiled on the control host, once per its source and ``slurm/spank.h``: cached as
    ``cache/k3sim_pyxis-<hash>.so``. One line naming the fix where the compiler or the header is missing."""
    if not SPANK_HEADER.is_file():
        raise SimError(f"{SPANK_HEADER} is missing, so the simulator's pyxis cannot be built: install libslurm-dev "
                       "(.ci/install-sim.sh)")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SimError("no C compiler (cc) to build the simulator's pyxis: install gcc and libc6-dev "
                       "(.ci/install-sim.sh)")
    key = hashlib.sha256(SPANK_SOURCE.read_bytes() + SPANK_HEADER.read_bytes()).hexdigest()[:16]
    out = cache / f"k3sim_pyxis-{key}.so"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".k3sim_pyxis-{key}.{os.getpid()}.so"
    res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(SPANK_SOURCE)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SimError(f"cc could not build {SPANK_SOURCE}: {res.stderr.strip().splitlines()[-1:] or res.returncode}")
    os.replace(tmp, out)
    return out


def add_job_user(root: Path) -> None:
    """The job user (:data:`JOB_USER`) in a node's root: its passwd and group lines and its home, unless present."""
    passwd = root / "etc/passwd"
    if any(line.split(":")[0] == JOB_USER for line in passwd.read_text().splitlines()):
        return
    with passwd.open("a") as fh:
        fh.write(f"{JOB_USER}:x:{JOB_UID}:{JOB_UID}:k3deploy's Slurm jobs:/home/{JOB_USER}:/bin/bash\n")
    with (root / "etc/group").open("a") as fh:
        fh.write(f"{JOB_USER}:x:{JOB_UID}:\n")
    shadow = root / "etc/shadow"
    if shadow.exists():
        with shadow.open("a") as fh:
            fh.write(f"{JOB_USER}:!:19000:0:99999:7:::\n")
    home = root / "home" / JOB_USER
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, JOB_UID, JOB_UID)


def gres_name(vendor: str) -> str:
    """The GRES name of a simulated node of ``vendor`` (a profile's ``nvidia``, ``amd``, ``ascend``): its pack's
    (``Container.slurm_gres``), as a site of that vendor names it and the deploy's ``--gres`` asks for it.

    >>> gres_name("nvidia"), gres_name("ascend")
    ('gpu', 'npu')
    """
    return next((p.container.slurm_gres for p in PACKS if p.name == vendor), "gpu")


def render_conf(cluster: str, nodes: Sequence[tuple[str, str]], cpus: int, gpus: int, gres_name: str = "gpu",
                imex_per_job: bool = False) -> str:
    """``slurm.conf`` of a simulated cluster: ``nodes`` are (host name, address), the first one runs slurmctld.

    >>> text = render_conf("sl1", [("sl1-node1", "10.1.2.11"), ("sl1-node2", "10.1.2.12")], 2, 4)
    >>> [ln for ln in text.splitlines() if ln.startswith(("SlurmctldHost", "NodeName", "PartitionName"))]
    ['SlurmctldHost=sl1-node1(10.1.2.11)', 'NodeName=sl1-node1 NodeAddr=10.1.2.11 CPUs=2 Gres=gpu:4 State=UNKNOWN', \
'NodeName=sl1-node2 NodeAddr=10.1.2.12 CPUs=2 Gres=gpu:4 State=UNKNOWN', \
'PartitionName=k3 Nodes=sl1-node1,sl1-node2 Default=YES MaxTime=INFINITE State=UP']
    >>> "GresTypes" in render_conf("sl1", [("sl1-node1", "10.1.2.11")], 2, 0)
    False
    """
    if not nodes:
        raise SimError("a Slurm cluster needs at least one node")
    head, head_ip = nodes[0]
    gres = f" Gres={gres_name}:{gpus}" if gpus else ""
    lines = [
        f"# slurm.conf of the simulated cluster {cluster!r}, written by k3deploy sim up --slurm",
        f"ClusterName={cluster}",
        f"SlurmctldHost={head}({head_ip})",
        "AuthType=auth/munge",
        f"# a requeued job starts again after {CRED_EXPIRE} s (default 120 s): a node failure test need not wait",
        f"AuthInfo=cred_expire={CRED_EXPIRE}",
        "CredType=cred/munge",
        "SlurmUser=slurm",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "# the nodes share the host's kernel and cgroups: track processes by parent, no cgroup confinement",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "# a node that was down (a sim reboot) is usable again as soon as its slurmd registers",
        "ReturnToService=2",
        f"# SIGKILL {KILL_WAIT} s after the SIGTERM of a cancelled job (default 30): the simulated engines stop within",
        "# a second, and a cancel and resubmit should not wait half a minute",
        f"KillWait={KILL_WAIT}",
        "SlurmdTimeout=120",
        "InactiveLimit=0",
        "MinJobAge=300",
    ]
    if imex_per_job:
        lines += ["# IMEX per job (sim up --imex per-job): Slurm's switch/nvidia_imex (24.05) stood in for by a",
                  "# prolog and an epilog of the simulator's, run by slurmd as root on a job's nodes when allocated",
                  f"Prolog={IMEX_PROLOG}", f"Epilog={IMEX_EPILOG}", "PrologFlags=Alloc"]
    if gpus:
        lines += [f"# the nodes' GPUs as the generic resource {gres_name} (gres.conf names their device files)",
                  f"GresTypes={gres_name}"]
    lines += [f"NodeName={nm} NodeAddr={ip} CPUs={cpus}{gres} State=UNKNOWN" for nm, ip in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nm for nm, _ in nodes)} Default=YES MaxTime=INFINITE "
                 "State=UP")
    return "\n".join(lines) + "\n"


def gpu_files(vendor: str, gpus: int) -> list[str]:
    """The GPUs' device files on a node of ``vendor`` (the placeholders every simulated node has, as a real node's
    /dev: :func:`k3sim.profiles.device_nodes`).

    >>> gpu_files("nvidia", 2), gpu_files("amd", 1), gpu_files("ascend", 1)
    (['/dev/nvidia0', '/dev/nvidia1'], ['/dev/dri/renderD128'], ['/dev/davinci0'])
    """
    if vendor == "nvidia":
        return [f"/dev/nvidia{i}" for i in range(gpus)]
    if vendor == "amd":
        return [f"/dev/dri/renderD{128 + i}" for i in range(gpus)]
    return [f"/dev/davinci{i}" for i in range(gpus)]


def render_gres(files: Sequence[str], name: str = "gpu") -> str:
    """``gres.conf``: one ``name`` (``gpu``, ``npu``: :func:`gres_name`) per device file. slurmd 22.05 counts a
    ``gpu`` without ``File=`` as none (the node is then drained: "gres/gpu count reported lower than configured"),
    so the GPUs are named by their files, as on a site; with ``TaskPlugin=task/none`` nothing opens or confines them.

    >>> render_gres(["/dev/nvidia0", "/dev/nvidia1"]).splitlines()[1:]
    ['Name=gpu File=/dev/nvidia0', 'Name=gpu File=/dev/nvidia1']
    >>> render_gres(["/dev/davinci0"], "npu").splitlines()[1:]
    ['Name=npu File=/dev/davinci0']
    """
    head = "# gres.conf of a simulated node, written by k3deploy sim up --slurm\n"
    return head + "".join(f"Name={name} File={f}\n" for f in files)


def check_base(base: Path) -> None:
    """One line naming the fix when the base root lacks the Slurm packages."""
    # slurmd and slurmctld are absolute links through /etc/alternatives: they resolve inside the node, not here
    missing = [p for p in PROGRAMS if not os.path.lexists(base / p)]
    if missing:
        raise SimError(f"the nodes' base root {base} has no Slurm (/{missing[0]} missing): rebuild it with "
                       "'k3deploy sim base --rebuild' (it installs slurmd, slurmctld, slurm-client and munge)")


def new_key() -> bytes:
    """A munge key: 1024 random bytes, as ``mungekey`` makes."""
    return secrets.token_bytes(1024)


def _ids(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user and len(parts) > 3:
            return int(parts[2]), int(parts[3])
    raise SimError(f"no user {user!r} in {root}/etc/passwd: rebuild the base with 'k3deploy sim base --rebuild'")


#: the simulated switch/nvidia_imex (sim up --imex per-job): programs slurmd runs on each node of a job
IMEX_PROLOG, IMEX_EPILOG = "/etc/slurm/k3sim-imex-prolog", "/etc/slurm/k3sim-imex-epilog"
#: what the simulated site's ``scontrol --version`` says with ``--imex per-job``: a Slurm with switch/nvidia_imex
IMEX_SLURM_VERSION = "24.05.3"


def imex_files() -> dict[str, str]:
    """What a node of a ``--imex per-job`` cluster gets (path in its root -> text), standing in for Slurm >= 24.05's
    ``SwitchType=switch/nvidia_imex`` on Debian's 22.05, which has no such plugin:

    - the prolog (slurm.conf ``Prolog=``, ``PrologFlags=Alloc``: on every node of a job, before it runs) creates
      the job's channel ``/dev/nvidia-caps-imex-channels/channelN``, N = 1 + job id mod 2047 (the plugin hands out
      channels 1 to ``imex_channel_count`` = 2048, channel 0 reserved: src/plugins/switch/nvidia_imex), as a
      placeholder file like the node's other device nodes; the epilog removes it. Unlike the plugin, which
      mounts a tmpfs holding only the job's channel in each step's own mount namespace, the channel is in the
      node's /dev, where ``docker run --device`` finds it;
    - ``/usr/local/bin/scontrol`` (before /usr/bin on PATH) answers ``--version`` and ``show config`` as such a
      site's 24.05 does (``SwitchType = switch/nvidia_imex``, ``SwitchParameters = imex_channel_count=2048``,
      ``SLURM_VERSION``; the simulator's prolog, the plugin's stand-in, not listed) and runs the real scontrol for
      everything else.

    >>> sorted(imex_files())
    ['etc/slurm/k3sim-imex-epilog', 'etc/slurm/k3sim-imex-prolog', 'usr/local/bin/scontrol']
    """
    channel = '/dev/nvidia-caps-imex-channels/channel$(( ${SLURM_JOB_ID:-0} % 2047 + 1 ))'
    head = "#!/bin/sh\n# written by k3deploy sim up --slurm --imex per-job: the simulated switch/nvidia_imex\n"
    scontrol = f"""#!/bin/bash
# written by k3deploy sim up --slurm --imex per-job: scontrol as a Slurm {IMEX_SLURM_VERSION} site with
# SwitchType=switch/nvidia_imex answers (Debian's 22.05 underneath: /usr/bin/scontrol)
case "$1" in
  --version|-V|version) echo "slurm {IMEX_SLURM_VERSION}"; exit 0 ;;
  show|sho)
    if [ "${{2:-}}" = config ]; then
      /usr/bin/scontrol show config | sed -E -e 's|^(SwitchType +=).*|\\1 switch/nvidia_imex|' \\
        -e 's|^(SwitchParameters +=).*|\\1 imex_channel_count=2048|' \\
        -e 's|^(SLURM_VERSION +=).*|\\1 {IMEX_SLURM_VERSION}|' \\
        -e '\\|^Prolog +=.*{IMEX_PROLOG}|d' -e '\\|^Epilog +=.*{IMEX_EPILOG}|d'
      exit "${{PIPESTATUS[0]}}"
    fi ;;
esac
exec /usr/bin/scontrol "$@"
"""
    return {
        IMEX_PROLOG.lstrip("/"): head + f"mkdir -p /dev/nvidia-caps-imex-channels && : > \"{channel}\"\nexit 0\n",
        IMEX_EPILOG.lstrip("/"): head + f"rm -f \"{channel}\"\nexit 0\n",
        "usr/local/bin/scontrol": scontrol,
    }


def prepare_node(root: Path, conf: str, gres: str, key: bytes, controller: bool, imex_per_job: bool = False,
                 plugin: Path | None = None) -> None:
    """Write the cluster's key and configuration into a node's root and enable its Slurm units (before boot); with
    ``imex_per_job`` the simulated switch/nvidia_imex (:func:`imex_files`), and no IMEX daemon at boot; with
    ``plugin`` (:func:`build_plugin`), the simulator's pyxis and the plugstack line that loads it; the job user."""
    muid, mgid = _ids(root, "munge")
    kdir = root / "etc/munge"
    kdir.mkdir(parents=True, exist_ok=True)
    kfile = kdir / "munge.key"
    tmp = kdir / ".munge.key.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    os.chown(tmp, muid, mgid)
    os.chmod(tmp, 0o600)
    os.replace(tmp, kfile)
    sdir = root / "etc/slurm"
    sdir.mkdir(parents=True, exist_ok=True)
    write_atomic(sdir / "slurm.conf", conf, 0o644)
    write_atomic(sdir / "gres.conf", gres, 0o644)
    if plugin is not None:
        dest = root / PLUGIN.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plugin, dest)
        dest.chmod(0o755)
        write_atomic(sdir / "plugstack.conf", PLUGSTACK, 0o644)
    add_job_user(root)
    suid, sgid = _ids(root, "slurm")
    for sub, mode in (("var/lib/slurm/slurmctld", 0o755), ("var/lib/slurm/slurmd", 0o755), ("var/log/slurm", 0o755)):
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, suid, sgid)
        os.chmod(d, mode)
    # a job's slurmstepd outlives slurmd's stop (Debian's unit: KillMode=process, so that jobs survive a slurmd
    # restart) and ignores SIGTERM: at a node's shutdown systemd waits DefaultTimeoutStopSec (90 s) for it before
    # the SIGKILL. A sim reboot (a node failure in a test) should not take a minute and a half
    conf_d = root / "etc/systemd/system.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    write_atomic(conf_d / "k3sim-slurm.conf", SYSTEM_CONF, 0o644)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    if imex_per_job:
        for rel, text in imex_files().items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(root / rel, text, 0o755)
        (wants / "nvidia-imex.service").unlink(missing_ok=True)   # IMEX per job: no standing daemon
    for unit in UNITS_ALL + (UNITS_CONTROLLER if controller else ()):
        link = wants / unit
        if not link.is_symlink():
            link.symlink_to(f"/lib/systemd/system/{unit}")


def record(state: dict[str, Any], cpus: int, gpus: int) -> dict[str, Any]:
    """The cluster's ``slurm`` state entry (controller and submit host: the rank-0 node)."""
    head = state["nodes"][0]["name"]
    return {"controller": head, "submit_host": head, "partition": PARTITION, "cpus": cpus, "gpus": gpus,
            "kill_wait": KILL_WAIT, "version": "22.05", "job_user": JOB_USER,
            "conf": str(Path(state["inventory"]).parent / "slurm.conf")}


#: one SSH command on the controller: sinfo's nodes, then squeue's jobs, parted by a line of its own
QUERY = ("sinfo -h -N -o '%N|%P|%T'; echo '--squeue--'; "
         "squeue -h -o '%i|%j|%u|%T|%P|%D|%N|%r'")


def parse_query(text: str) -> dict[str, Any]:
    """The nodes and jobs of :data:`QUERY`'s output.

    >>> parse_query("a-node1|k3*|idle\\na-node2|k3*|allocated\\n--squeue--\\n7|eng|root|RUNNING|k3|1|a-node2|None\\n")
    ... # doctest: +NORMALIZE_WHITESPACE
    {'nodes': [{'name': 'a-node1', 'partition': 'k3', 'state': 'idle'},
               {'name': 'a-node2', 'partition': 'k3', 'state': 'allocated'}],
     'jobs': [{'id': '7', 'name': 'eng', 'user': 'root', 'state': 'RUNNING', 'partition': 'k3', 'nodes': 1,
               'nodelist': 'a-node2', 'reason': 'None'}]}
    """
    nodes_text, _, jobs_text = text.partition("--squeue--")
    nodes = []
    for line in nodes_text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            nodes.append({"name": parts[0], "partition": parts[1].rstrip("*"), "state": parts[2]})
    jobs = []
    for line in jobs_text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 8:
            jobs.append({"id": parts[0], "name": parts[1], "user": parts[2], "state": parts[3],
                         "partition": parts[4], "nodes": int(parts[5]) if parts[5].isdigit() else parts[5],
                         "nodelist": parts[6], "reason": parts[7]})
    return {"nodes": nodes, "jobs": jobs}


def query(ssh_base: list[str], ip: str, timeout: float = 15) -> dict[str, Any]:
    """sinfo and squeue on the controller over SSH: ``{"nodes": [...], "jobs": [...]}`` or ``{"error": line}``."""
    try:
        res = subprocess.run([*ssh_base, f"root@{ip}", QUERY], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"nodes": [], "jobs": [], "error": f"sinfo/squeue on {ip} did not answer within {timeout:g} s"}
    out = parse_query(res.stdout)
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        out["error"] = lines[-1] if lines else f"sinfo/squeue exited {res.returncode}"
    return out


def registered(state: str) -> bool:
    """Whether sinfo's node state says its slurmd has registered with the controller: idle, or drained or invalid
    by a fault the node carries (fewer GPUs than configured, say), not unknown, down or not responding (``*``).

    >>> [registered(s) for s in ("idle", "inval", "drained", "unknown", "down*", "idle*", "down")]
    [True, True, True, False, False, False, False]
    """
    return not (state.startswith("unk") or state.endswith("*") or state == "down")


def wait_registered(ssh_base: list[str], ip: str, names: list[str], timeout: float) -> dict[str, str]:
    """Wait until every node of ``names`` has registered with the controller (:func:`registered`); returns their
    sinfo states (``idle`` unless a fault keeps one out)."""
    deadline = time.monotonic() + timeout
    while True:
        last = query(ssh_base, ip)
        states = {n["name"]: n["state"] for n in last["nodes"] if n["partition"] == PARTITION}
        if all(registered(states.get(nm, "unknown")) for nm in names):
            return {nm: states[nm] for nm in names}
        if time.monotonic() > deadline:
            seen = ", ".join(f"{nm} {states.get(nm, 'absent')}" for nm in names)
            why = f" ({last['error']})" if last.get("error") else ""
            raise SimError(f"Slurm's nodes did not register within {timeout:.0f} s: {seen}{why}; see "
                           "/var/log/slurm/slurmctld.log on the rank-0 node and slurmd.log on each")
        time.sleep(0.5)
