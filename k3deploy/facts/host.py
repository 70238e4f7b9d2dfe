"""Host facts: kernel, container runtime, free disk, /dev/shm, the interface carrying an address."""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field

from k3deploy.facts.base import (
    EXIT_MARK,
    SECTION_MARK,
    Jsonable,
    K3Fact,
    Unparsable,
    first_line,
    sections,
    version_key,
)

# ---------------------------------------------------------------------------------- kernel


@dataclass(frozen=True)
class KernelRelease(Jsonable):
    release: str
    version: tuple[int, ...]


def parse_kernel(lines: list[str]) -> KernelRelease:
    """``uname -r``.

    >>> parse_kernel(["6.8.0-45-generic"])
    KernelRelease(release='6.8.0-45-generic', version=(6, 8, 0))
    """
    release = first_line(lines)
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", release)
    if not match:
        raise Unparsable("not a kernel release")
    return KernelRelease(release=release, version=version_key(release.split("-")[0]))


class KernelVersion(K3Fact[KernelRelease]):
    """Running kernel release (``uname -r``): ``6.8.0-45-generic`` → version ``(6, 8, 0)``."""

    tool = required_binary = "uname"
    hint = "uname is missing"
    shown_command = "uname -r"


    def parse(self, lines: list[str]) -> KernelRelease:
        return parse_kernel(lines)


# ------------------------------------------------------------------------- container runtime


@dataclass(frozen=True)
class ContainerRuntime(Jsonable):
    engine: str
    server_version: str | None  # None: the daemon did not answer
    runtimes: list[str] = field(default_factory=list)
    error: str = ""  # first line when the daemon did not answer


_DOCKER_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([-+~.][\w.+~-]*)?$")


def parse_docker(lines: list[str]) -> ContainerRuntime:
    """Sections ``version`` (``docker version --format '{{.Server.Version}}'``) and ``runtimes``.

    >>> parse_docker(["K3_SECTION=version", "28.3.2", "K3_SECTION=runtimes",
    ...               "io.containerd.runc.v2 nvidia runc "])
    ContainerRuntime(engine='docker', server_version='28.3.2', runtimes=['io.containerd.runc.v2', 'nvidia', 'runc'], \
error='')
    """
    parts = sections(lines)
    if "version" not in parts:
        raise Unparsable("no version section")
    version_lines = [line.strip() for line in parts["version"] if line.strip()]
    version = version_lines[0] if version_lines and _DOCKER_VERSION_RE.match(version_lines[0]) else None
    runtimes: list[str] = []
    if version is not None:
        for line in parts.get("runtimes", []):
            runtimes.extend(word for word in line.split() if re.fullmatch(r"[\w.-]+", word))
    error = "" if version is not None else (version_lines[0][:200] if version_lines else "no answer")
    return ContainerRuntime(engine="docker", server_version=version, runtimes=sorted(set(runtimes)), error=error)


class DockerRuntime(K3Fact[ContainerRuntime]):
    """Docker daemon version and registered runtimes (``nvidia`` when the Container Toolkit is set up).

    ``28.3.2`` / ``io.containerd.runc.v2 nvidia runc`` →
    ``ContainerRuntime(server_version='28.3.2', runtimes=['io.containerd.runc.v2', 'nvidia', 'runc'])``;
    a stopped daemon → ``server_version=None`` and ``error='Cannot connect to the Docker daemon ...'``.
    """

    tool = required_binary = "docker"
    hint = "is Docker installed?"
    shown_command = "docker version --format '{{.Server.Version}}'"

    def command(self) -> str:
        return (
            f"echo {SECTION_MARK}version; docker version --format '{{{{.Server.Version}}}}' 2>&1; "
            f"echo {SECTION_MARK}runtimes; "
            "docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null; "
            f"echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> ContainerRuntime:
        return parse_docker(lines)


# ------------------------------------------------------------------------------- disk space


@dataclass(frozen=True)
class DiskSpace(Jsonable):
    path: str  # the existing path that was measured (the nearest existing parent of the request)
    filesystem: str
    size_bytes: int
    available_bytes: int
    mount: str


def parse_df(lines: list[str]) -> DiskSpace:
    """``df -P -B1 PATH`` preceded by ``K3_PATH=<measured path>``.

    >>> parse_df(["K3_PATH=/dev/shm", "Filesystem 1-blocks Used Available Capacity Mounted on",
    ...           "tmpfs 25275973632 0 25275973632 0% /dev/shm"]).available_bytes
    25275973632
    """
    path = ""
    rows: list[str] = []
    for line in lines:
        if line.startswith("K3_PATH="):
            path = line[len("K3_PATH=") :].strip()
        elif line.strip():
            rows.append(line)
    if len(rows) < 2 or not rows[0].startswith("Filesystem"):
        raise Unparsable("no df header and row")
    fields = rows[1].split()
    if len(fields) < 6:
        raise Unparsable("df row with fewer than 6 fields")
    size, available = int(fields[1]), int(fields[3])
    return DiskSpace(
        path=path or " ".join(fields[5:]),
        filesystem=fields[0],
        size_bytes=size,
        available_bytes=available,
        mount=" ".join(fields[5:]),
    )


def _df_command(path: str) -> str:
    quoted = shlex.quote(path)
    return (
        f'p={quoted}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
        f'echo "K3_PATH=$p"; df -P -B1 "$p" 2>&1; echo {EXIT_MARK}$?'
    )


class DiskFree(K3Fact[DiskSpace]):
    """Free bytes on the file system holding ``path`` (or its nearest existing parent).

    ``df -P -B1 /var/lib/docker`` → ``DiskSpace(available_bytes=82390536192, mount='/', ...)``.
    """

    tool = required_binary = "df"
    hint = "coreutils' df is missing"
    shown_command = "df -P -B1"

    def command(self, path: str) -> str:
        return _df_command(path)

    def parse(self, lines: list[str]) -> DiskSpace:
        return parse_df(lines)


class ImageStoreFree(K3Fact[DiskSpace]):
    """Free bytes where Docker keeps images: its ``DockerRootDir`` (``/var/lib/docker`` when the
    daemon does not say), measured like :class:`DiskFree`.

    ``docker info --format '{{.DockerRootDir}}'`` → ``/var/lib/docker`` → ``DiskSpace(path='/var/lib/docker', ...)``.
    """

    tool = required_binary = "df"
    hint = "coreutils' df is missing"
    shown_command = "df -P -B1 $(docker info --format '{{.DockerRootDir}}')"

    def command(self) -> str:
        return (
            "p=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null); "
            '[ -n "$p" ] || p=/var/lib/docker; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            f'echo "K3_PATH=$p"; df -P -B1 "$p" 2>&1; echo {EXIT_MARK}$?'
        )

    def parse(self, lines: list[str]) -> DiskSpace:
        return parse_df(lines)


class ShmSize(K3Fact[DiskSpace]):
    """Size of ``/dev/shm`` (NCCL and PyTorch shared memory with ``--ipc=host``).

    ``tmpfs 25275973632 0 25275973632 0% /dev/shm`` → ``DiskSpace(size_bytes=25275973632, ...)``.
    """

    tool = required_binary = "df"
    hint = "coreutils' df is missing"
    shown_command = "df -P -B1 /dev/shm"

    def command(self) -> str:
        return _df_command("/dev/shm")

    def parse(self, lines: list[str]) -> DiskSpace:
        return parse_df(lines)


# ------------------------------------------------------------------------------- interfaces


@dataclass(frozen=True)
class Ipv4Address(Jsonable):
    interface: str
    address: str
    prefix: int


@dataclass(frozen=True)
class AddressInterface(Jsonable):
    address: str  # the address asked about ("" if none was given)
    interface: str | None  # the interface carrying it
    default_interface: str | None  # the interface of the default route
    addresses: list[Ipv4Address] = field(default_factory=list)


_IP_ADDR_RE = re.compile(r"^\d+:\s+(?P<ifname>\S+?)(?:@\S+)?\s+inet\s+(?P<addr>[\d.]+)/(?P<prefix>\d+)\s")


def parse_ip_addr(lines: list[str]) -> AddressInterface:
    """``K3_ADDR=<address>``, then ``ip -o -4 addr show``, then section ``route``
    (``ip -o -4 route show default``).

    >>> parse_ip_addr(["K3_ADDR=10.77.0.12",
    ...     "2: eth0    inet 10.77.0.12/24 brd 10.77.0.255 scope global eth0\\\\       valid_lft forever",
    ...     "K3_SECTION=route", "default via 10.77.0.1 dev eth0 proto static"]).interface
    'eth0'
    """
    parts = sections(lines)
    address = ""
    addresses: list[Ipv4Address] = []
    for line in parts[""]:
        if line.startswith("K3_ADDR="):
            address = line[len("K3_ADDR=") :].strip()
            continue
        if not line.strip():
            continue
        match = _IP_ADDR_RE.match(line.strip())
        if not match:
            raise Unparsable(f"not an 'ip -o -4 addr' line: {line.strip()[:60]!r}")
        addresses.append(
            Ipv4Address(interface=match["ifname"], address=match["addr"], prefix=int(match["prefix"]))
        )
    if not addresses:
        raise Unparsable("no IPv4 addresses")
    default_interface = None
    for line in parts.get("route", []):
        words = line.split()
        if words[:1] == ["default"] and "dev" in words:
            default_interface = words[words.index("dev") + 1]
            break
    interface = None
    if address:
        for entry in addresses:
            if entry.address == address:
                interface = entry.interface
                break
    return AddressInterface(
        address=address, interface=interface, default_interface=default_interface, addresses=addresses
    )


class InterfaceForAddress(K3Fact[AddressInterface]):
    """The interface that carries ``address`` (the node's inventory address), from ``ip -o -4 addr``.

    ``2: eth0    inet 10.77.0.12/24 ...`` with ``address='10.77.0.12'`` →
    ``AddressInterface(interface='eth0', ...)``. ``interface=None`` means the address is not
    configured on this host. With ``address=''`` only the default-route interface is reported.
    """

    tool = required_binary = "ip"
    hint = "is iproute2 installed?"
    shown_command = "ip -o -4 addr show"

    def command(self, address: str = "") -> str:
        if address:
            ipaddress.IPv4Address(address)  # only literal IPv4 addresses reach the host
        return (
            f"echo K3_ADDR={address}; ip -o -4 addr show 2>&1; "
            f"echo {SECTION_MARK}route; ip -o -4 route show default 2>/dev/null; echo {EXIT_MARK}0"
        )

    def parse(self, lines: list[str]) -> AddressInterface:
        return parse_ip_addr(lines)
