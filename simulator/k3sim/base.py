"""The shared, read-only base root of the simulated nodes.

The base is a Debian 12 (bookworm) ``debootstrap --variant=minbase`` root with systemd, dbus,
OpenSSH server, Python 3 (with its standard library), procps, iproute2, curl, rsync and keepalived (VRRP for the
site's virtual address, enabled only by a deploy that sets ``k3_vip``), and Debian's Slurm 22.05
(slurmd, slurmctld, slurm-client, munge) with its units disabled: only ``sim up --slurm`` enables them, per node
(:mod:`k3sim.slurm`). It is built once and
cached under ``/var/cache/k3deploy/base-<id>``, where ``<id>`` hashes everything that decides its
content (suite, variant, package list, build steps). Nodes mount it as the lower layer of an
overlayfs and never modify it. Building takes about a minute and needs a Debian mirror; every later
``sim up`` reuses it.

Environment:

- ``K3SIM_CACHE``: cache directory (default ``/var/cache/k3deploy``).
- ``K3SIM_MIRROR``: Debian mirror for debootstrap (default: the host's apt mirror for bookworm,
  else ``http://deb.debian.org/debian``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from k3deploy.errors import K3Error
from k3deploy.runtime.progress import tree_bytes, watch

SUITE = "bookworm"
VARIANT = "minbase"
#: packages added to minbase; the nodes need each of them
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "procps",
    "iproute2",
    "curl",
    "rsync",
    "ca-certificates",
    "less",
    # Slurm for `sim up --slurm`: in the one base (not a second one) so that a fresh machine builds one root;
    # their units are disabled below and enabled per node (k3sim.slurm)
    "munge",
    "slurmd",
    "slurmctld",
    "slurm-client",
    # VRRP for the site's virtual address (k3_vip): the deploy configures and enables it per node
    "keepalived",
)
#: units the packages above enable on install; the base disables them (a cluster without --slurm runs none)
DISABLED_UNITS = ("munge.service", "slurmd.service", "slurmctld.service", "keepalived.service")
#: bump when the post-install steps below change, so that caches are rebuilt
BUILD_FORMAT = 2
MARKER = ".k3deploy-base.json"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

#: sshd drop-in of every node: one host key per node (written before boot), key login only
SSHD_DROPIN = """\
# simulated node: one ed25519 host key per node, key login for root only
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 64:30:200
MaxSessions 64
"""


def cache_dir() -> Path:
    return Path(os.environ.get("K3SIM_CACHE", "/var/cache/k3deploy"))


def mirror() -> str:
    """``K3SIM_MIRROR``, else the host's own apt mirror for the suite, else deb.debian.org."""
    return os.environ.get("K3SIM_MIRROR") or _host_mirror() or DEFAULT_MIRROR


def _host_mirror(apt_dir: Path = Path("/etc/apt")) -> str | None:
    """The URI the host's apt uses for ``SUITE`` itself (deb822 ``.sources`` or one-line ``.list``)."""
    files = sorted((apt_dir / "sources.list.d").glob("*.sources")) if (apt_dir / "sources.list.d").is_dir() else []
    for f in files:
        with contextlib.suppress(OSError):
            for stanza in f.read_text().split("\n\n"):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if ":" in line and not line.lstrip().startswith("#"):
                        key, _, value = line.partition(":")
                        fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and SUITE in fields.get("suites", "").split():
                    uris = fields.get("uris", "").split()
                    if uris:
                        return uris[0]
    lists = [apt_dir / "sources.list"]
    if (apt_dir / "sources.list.d").is_dir():
        lists += sorted((apt_dir / "sources.list.d").glob("*.list"))
    for f in lists:
        with contextlib.suppress(OSError):
            for line in f.read_text().splitlines():
                parts = line.split("#", 1)[0].split()
                if parts and parts[0] == "deb":
                    parts = [p for p in parts[1:] if not p.startswith("[")]
                    if len(parts) >= 2 and parts[1] == SUITE:
                        return parts[0]
    return None


def base_id() -> str:
    """Hash of everything that decides the base root's content."""
    doc = {
        "suite": SUITE,
        "variant": VARIANT,
        "packages": sorted(PACKAGES),
        "format": BUILD_FORMAT,
        "sshd": SSHD_DROPIN,
        "disabled": sorted(DISABLED_UNITS),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def base_path() -> Path:
    return cache_dir() / f"base-{base_id()}"


#: what a base root takes on disk, for the progress of the first build (Debian 12 minbase with :data:`PACKAGES`)
BASE_BYTES = 290 * 2**20


def expected_bytes() -> int:
    """What the base root being built will take: the size an earlier build recorded, else :data:`BASE_BYTES`."""
    for marker in sorted(cache_dir().glob(f"base-*/{MARKER}"), key=lambda p: p.stat().st_mtime, reverse=True):
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(json.loads(marker.read_text())["bytes"])
    return BASE_BYTES


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "usr/lib/systemd/systemd").exists()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_base(progress: Callable[[str], None] | None = None, rebuild: bool = False) -> Path:
    """Return the cached base root, building it first when it is missing (about a minute)."""
    final = base_path()
    if is_complete(final) and not rebuild:
        return final
    if os.geteuid() != 0:
        raise K3Error("building the simulated cluster's base root needs root: run it as root (sudo)")
    if shutil.which("debootstrap") is None:
        raise K3Error(
            "debootstrap not found: install it (apt-get install debootstrap) to build the simulated nodes' base root"
        )
    with _lock(cache_dir() / "base.lock"):
        if is_complete(final) and not rebuild:
            return final
        _build(final, progress or (lambda _msg: None))
    return final


def _build(final: Path, progress: Callable[[str], None]) -> None:
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{final.name}.partial*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = root / f"{final.name}.partial{os.getpid()}"
    log = root / f"{final.name}.log"
    started = time.monotonic()
    progress(f"building the base root {final} (debootstrap {VARIANT} {SUITE}, about a minute)")
    cmd = [
        "debootstrap",
        f"--variant={VARIANT}",
        "--include=" + ",".join(PACKAGES),
        SUITE,
        str(work),
        mirror(),
    ]
    # debootstrap says nothing for a minute or more: the root's bytes on disk against the last build's, as they grow
    with open(log, "w") as fh, watch("base root (debootstrap)", lambda: tree_bytes(work), total=expected_bytes()):
        res = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        last = ""
        with contextlib.suppress(OSError):
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            last = lines[-1] if lines else ""
        raise K3Error(
            f"debootstrap of the base root failed (exit {res.returncode}: {last!r}); see {log}, "
            f"check that {mirror()} is reachable or set K3SIM_MIRROR"
        )
    _post_install(work)
    (work / MARKER).write_text(
        json.dumps(
            {
                "id": base_id(),
                "suite": SUITE,
                "variant": VARIANT,
                "packages": list(PACKAGES),
                "mirror": mirror(),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.monotonic() - started, 1),
                "bytes": tree_bytes(work),
            },
            indent=2,
        )
        + "\n"
    )
    if final.exists():
        old = final.with_name(final.name + f".old{os.getpid()}")
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    work.rename(final)
    progress(f"base root ready in {time.monotonic() - started:.0f} s: {final}")


def _post_install(root: Path) -> None:
    # every node gets its own host key before boot; the base keeps none
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/k3sim.conf").write_text(SSHD_DROPIN)
    # persistent journal: the host can read a node's logs with journalctl -D <node root>/var/log/journal
    (root / "var/log/journal").mkdir(parents=True, exist_ok=True)
    (root / "etc/k3sim").mkdir(parents=True, exist_ok=True)
    # each node writes its own machine-id before boot
    (root / "etc/machine-id").write_text("")
    # the nodes reach no mirror: drop the package caches (about 60 MB)
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        d = root / sub
        if d.is_dir():
            for entry in d.iterdir():
                if entry.is_file() and entry.name not in ("lock",):
                    entry.unlink()
    # Slurm and munge start only on the nodes of a cluster made with --slurm (k3sim.slurm enables them per
    # node); no key is shared by every cluster built from this base: each such cluster writes its own
    for wants in (root / "etc/systemd/system").glob("*.wants"):
        for unit in DISABLED_UNITS:
            with contextlib.suppress(FileNotFoundError):
                (wants / unit).unlink()
    with contextlib.suppress(FileNotFoundError):
        (root / "etc/munge/munge.key").unlink()
    # units that only cost boot time or fail inside a container
    for unit in ("e2scrub_reap.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        link = root / "etc/systemd/system" / unit
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to("/dev/null")


def remove_base() -> list[Path]:
    """Delete every cached base root; returns what was removed."""
    removed = []
    root = cache_dir()
    if root.is_dir():
        for entry in sorted(root.glob("base-*")):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed
