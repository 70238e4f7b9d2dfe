"""The nodes' file systems: a tmpfs per node, an overlay root over the base, the "disks", the node files.

Node ``N`` of a cluster has a tmpfs at ``<state>/N`` holding the overlay's ``upper``/``work`` directories
and the node's root ``merged`` (lower layer: the cached base root, :mod:`k3sim.base`), and a "disk"
tmpfs on each of :data:`DISK_DIRS` (4 TiB nominal, RAM-backed as used; 64 MiB and full under the
``disk-full`` fault).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from k3sim import profiles
from k3sim.host import SimError, run, write_atomic
from k3sim.state import NodeLayout

#: directories that behave as the node's disks; the ``disk-full`` fault fills them
DISK_DIRS = ("var/lib/k3deploy", "var/lib/k3sim/docker")
DISK_SIZE_HEALTHY = "4t"
DISK_SIZE_FULL_MIB = 64
DISK_FILLER = ".k3sim-disk-full"
DISK_SOURCE = "k3sim-disk"


def prepare_root(nd: NodeLayout, base: Path, pubkey: str, hosts: str, doc: dict[str, Any], faults: list[Any]) -> str:
    """Mount the node's tmpfs and overlay root and write its per-node files; returns its host key.

    ``doc`` is the node's ``node.json`` (:func:`k3sim.profiles.node_config`), ``faults`` the node's
    own faults (``disk-full`` and ``sshd-down`` are applied here).
    """
    size = os.environ.get("K3SIM_NODE_TMPFS", "1g")
    nd.dir.mkdir(parents=True, exist_ok=True)
    run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", f"k3sim-{nd.name}", str(nd.dir)])
    for sub in ("upper", "work", "merged"):
        (nd.dir / sub).mkdir()
    run(
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
    write_atomic(ssh_dir / "authorized_keys", pubkey, 0o600)
    write_atomic(root / "etc/hostname", nd.name + "\n")
    write_atomic(root / "etc/hosts", hosts)
    write_atomic(root / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    hk = root / "etc/ssh/ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{nd.name}", "-f", str(hk)])
    host_pub = " ".join(Path(str(hk) + ".pub").read_text().split()[:2])
    install_tools(root, doc)
    write_atomic(root / WARM_SCRIPT.lstrip("/"), profiles.warm_script(doc["hardware"], nd.ip), 0o755)
    full = any(f.kind == "disk-full" for f in faults)
    for rel in DISK_DIRS:
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE_HEALTHY},mode=755", DISK_SOURCE, str(d)])
        if full:
            fill_disk(d)
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


#: run once over SSH when the node has booted (sim up waits for it): fills the simulated tools' cache
WARM_SCRIPT = "/usr/lib/k3sim/warm.sh"


def install_tools(root: Path, doc: dict[str, Any]) -> None:
    """Install the simulated tools for this node's config into its root, then its node.json.

    Tools the config leaves out (other vendors' tools, ``no-nvidia-smi``) are removed, so that a
    runtime fault change installs exactly the right set.
    """
    for rel in profiles.excluded_paths(doc):
        with contextlib.suppress(FileNotFoundError):
            (root / rel.lstrip("/")).unlink()
    for rel in doc.get("paths_missing", []):  # mount-missing: a directory goes with its files
        d = root / rel.lstrip("/")
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
    profiles.install_node_tools(root, doc)
    cfg = root / "etc/k3sim/node.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cfg, json.dumps(doc, indent=2) + "\n")


# --------------------------------------------------------------------------- disks


def fill_disk(d: Path) -> None:
    """Shrink a node disk to 64 MiB and leave about 1 MiB free (the ``disk-full`` fault)."""
    filler = d / DISK_FILLER
    with contextlib.suppress(FileNotFoundError):
        filler.unlink()
    used = _disk_used(d)
    size_mib = max(DISK_SIZE_FULL_MIB, used // (1 << 20) + 2)
    run(["mount", "-o", f"remount,size={size_mib}m", str(d)])
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, max(0, free - (1 << 20)))


def _disk_used(d: Path) -> int:
    st = os.statvfs(d)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def clear_disk(d: Path) -> None:
    """Undo :func:`fill_disk`: the disk grows back to its healthy size, its contents kept."""
    with contextlib.suppress(FileNotFoundError):
        (d / DISK_FILLER).unlink()
    run(["mount", "-o", f"remount,size={DISK_SIZE_HEALTHY}", str(d)])


# --------------------------------------------------------------------------- mounts


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix`` in this mount namespace, deepest first."""
    pre = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = line.split()[4].replace("\\040", " ")
            if mp == pre or mp.startswith(pre + "/"):
                found.append(mp)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def umount(path: str) -> None:
    """Unmount ``path``; lazily when it is busy."""
    if run(["umount", path], check=False).returncode != 0:
        run(["umount", "-l", path], check=False)


def umount_under(prefix: Path) -> None:
    """Unmount everything at or below ``prefix``, deepest first."""
    for mp in mounts_under(prefix):
        umount(mp)
