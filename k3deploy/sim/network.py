"""The cluster's network: a bridge ``NAME0`` on ``<subnet>.1/24``, a network namespace and a veth pair per node.

Node i of cluster ``NAME`` has ``<subnet>.<10+i>/24`` on ``eth0`` inside its namespace ``NAME-node<i>``; the
host side of its veth pair is ``NAME-v<i>``, on the bridge. ``k3sim`` uses ``10.77.0``; other names get a
subnet derived from the name unless one is given.
"""

from __future__ import annotations

import re
import socket
import zlib
from pathlib import Path
from typing import Any

from k3deploy.sim.host import SimError, run
from k3deploy.sim.state import DEFAULT_NAME, NodeLayout, list_names, load_state


def bridge_name(name: str) -> str:
    return f"{name}0"


def default_subnet(name: str) -> str:
    if name == DEFAULT_NAME:
        return "10.77.0"
    return f"10.77.{1 + zlib.crc32(name.encode()) % 250}"


def validate_subnet(subnet: str) -> str:
    parts = subnet.split(".")
    if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise SimError(f"bad subnet {subnet!r}: give the first three octets of a free /24, e.g. 10.77.5")
    return subnet


def free_subnet(name: str, first: str) -> str:
    """The name's default /24, or the next free one when another cluster or interface uses it."""
    a, b, c = (int(x) for x in first.split("."))
    for i in range(250):
        candidate = f"{a}.{b}.{1 + (c - 1 + i) % 250}"
        try:
            check_conflicts(name, candidate)
            return candidate
        except SimError as exc:
            if "network interface" in str(exc):
                raise
    raise SimError("no free 10.77.x.0/24 subnet for a simulated cluster: pass --subnet")


def check_conflicts(name: str, subnet: str) -> None:
    """Fail when the cluster's bridge name or ``subnet`` is taken by an interface or another cluster."""
    br = bridge_name(name)
    if Path(f"/sys/class/net/{br}").exists():
        raise SimError(f"network interface {br} exists and is not part of a simulated cluster: choose another --name")
    for other in list_names():
        st = load_state(other)
        if other != name and st and st.get("subnet") == subnet:
            raise SimError(
                f"subnet {subnet}.0/24 is used by simulated cluster {other!r}: pass --subnet with a free one"
            )
    addrs = run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    if re.search(rf"\binet {re.escape(subnet)}\.\d+/", addrs):
        raise SimError(f"subnet {subnet}.0/24 is already configured on this host: pass --subnet with a free one")


def create_bridge(br: str, subnet: str) -> None:
    run(["ip", "link", "add", br, "type", "bridge"])
    run(["ip", "addr", "add", f"{subnet}.1/24", "dev", br])
    run(["ip", "link", "set", br, "up"])


def prepare_net(nd: NodeLayout, br: str, subnet: str) -> None:
    """The node's network namespace, with ``eth0`` on the bridge and a default route via the host."""
    run(["ip", "netns", "add", nd.netns])
    run(["ip", "link", "add", nd.veth, "type", "veth", "peer", "name", "eth0", "netns", nd.netns])
    run(["ip", "link", "set", nd.veth, "master", br, "up"])
    ns = ["ip", "-n", nd.netns]
    run([*ns, "addr", "add", f"{nd.ip}/24", "dev", "eth0"])
    run([*ns, "link", "set", "eth0", "up"])
    run([*ns, "link", "set", "lo", "up"])
    run([*ns, "route", "add", "default", "via", f"{subnet}.1"])


def remove_node_net(rec: dict[str, Any]) -> None:
    """Delete the node's namespace and veth (those that exist; errors are ignored)."""
    if Path(f"/run/netns/{rec['netns']}").exists():
        run(["ip", "netns", "del", rec["netns"]], check=False)
    if Path(f"/sys/class/net/{rec['veth']}").exists():
        run(["ip", "link", "del", rec["veth"]], check=False)


def remove_bridge(state: dict[str, Any]) -> None:
    """Delete the cluster's bridge when this cluster created it."""
    if state.get("bridge_created") and Path(f"/sys/class/net/{state['bridge']}").exists():
        run(["ip", "link", "del", state["bridge"]], check=False)


def ssh_banner(ip: str, timeout: float = 0.3) -> bool:
    """Something on ``ip``:22 greets with an SSH banner."""
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False
