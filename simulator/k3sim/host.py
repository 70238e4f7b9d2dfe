"""What every part of the simulator needs from the host: its error type, running a command, atomic writes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from k3deploy.errors import K3Error


class SimError(K3Error):
    """A simulated-cluster operation that cannot be done."""


#: host command -> how to install it (the fix named when it is missing)
COMMAND_PACKAGES = {
    "systemd-nspawn": "install the systemd-container package (apt-get install systemd-container)",
    "ip": "install the iproute2 package (apt-get install iproute2)",
    "tc": "install the iproute2 package (apt-get install iproute2)",
    "ssh": "install the openssh-client package (apt-get install openssh-client)",
    "ssh-keygen": "install the openssh-client package (apt-get install openssh-client)",
    "nsenter": "install the util-linux package (apt-get install util-linux)",
    "mount": "install the mount package (apt-get install mount)",
    "umount": "install the mount package (apt-get install mount)",
}


def run(cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a host command without input; with ``check``, a failure is a :class:`SimError` naming its last line."""
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise SimError(f"{cmd[0]} not found: {COMMAND_PACKAGES.get(cmd[0], 'install it')}") from exc
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise SimError(f"{' '.join(cmd)} failed: {msg[-1] if msg else f'exit {res.returncode}'}")
    return res


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` (readers see the old or the new file, never a part)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
#: inotify instances one booted node takes (its systemd, journald, logind, sshd, udev, ...), with room to spare
INOTIFY_PER_NODE = 8


def ensure_inotify(nodes: int, say: Callable[[str], None]) -> None:
    """Raise ``fs.inotify.max_user_instances`` so ``nodes`` nodes can boot (the kernel default, 128, stops nspawn
    nodes at about the 24th), and say so; never lowers it."""
    try:
        have = int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        return
    need = INOTIFY_PER_NODE * nodes + 256
    if have >= need:
        return
    try:
        INOTIFY_INSTANCES.write_text(f"{need}\n")
    except OSError as exc:
        raise SimError(f"{nodes} nodes need fs.inotify.max_user_instances >= {need} (now {have}) and raising it "
                       f"failed ({exc.strerror}): run sysctl -w fs.inotify.max_user_instances={need}") from None
    say(f"raised fs.inotify.max_user_instances from {have} to {need} for {nodes} simulated nodes")
