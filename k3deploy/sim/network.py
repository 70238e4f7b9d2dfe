"""The cluster's network: a bridge ``NAME0`` on ``<subnet>.1/24``, a network namespace and a veth pair per node,
and one for the simulated outside.

Node i of cluster ``NAME`` has ``<subnet>.<10+i>/24`` on ``eth0`` inside its namespace ``NAME-node<i>``; the
host side of its veth pair is ``NAME-v<i>``, on the bridge. ``k3sim`` uses ``10.77.0``; other names get a
subnet derived from the name unless one is given. The outside (:mod:`k3deploy.sim.outside`) has ``<subnet>.254``
on ``eth0`` in ``NAME-out`` (host side ``NAME-vo``).

Shaping (``tc`` ``tbf``; ``netem`` is not available in every kernel): the outside's ``eth0`` egress runs at the
uplink rate, so all nodes share the uplink, and each node's ``eth0`` egress at the cluster rate (node to node).
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


def prepare_net(nd: NodeLayout, br: str, subnet: str, rate_mbps: float | None = None) -> None:
    """The node's network namespace, with ``eth0`` on the bridge and a default route via the host; its egress
    shaped to ``rate_mbps`` when given."""
    _veth_netns(nd.netns, nd.veth, br, nd.ip)
    run(["ip", "-n", nd.netns, "route", "add", "default", "via", f"{subnet}.1"])
    if rate_mbps:
        shape(nd.netns, "eth0", rate_mbps)


def _veth_netns(netns: str, veth: str, br: str, ip: str) -> None:
    run(["ip", "netns", "add", netns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    run(["ip", "link", "set", veth, "master", br, "up"])
    ns = ["ip", "-n", netns]
    run([*ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
    run([*ns, "link", "set", "eth0", "up"])
    run([*ns, "link", "set", "lo", "up"])


def outside_names(name: str) -> tuple[str, str]:
    """(network namespace, host-side veth) of cluster ``name``'s outside."""
    return f"{name}-out", f"{name}-vo"


def prepare_outside_net(netns: str, veth: str, br: str, ip: str, uplink_mbps: float) -> None:
    """The outside's namespace on the bridge at ``ip``, its egress (everything it sends the nodes) shaped."""
    _veth_netns(netns, veth, br, ip)
    shape(netns, "eth0", uplink_mbps)


def shape(netns: str, dev: str, mbps: float) -> None:
    """A token-bucket filter on ``dev``'s egress in ``netns`` at ``mbps`` megabits per second."""
    rate_bytes = mbps * 1e6 / 8
    burst = max(256 * 1024, int(rate_bytes / 200))  # 5 ms at the rate; enough for GSO segments
    run(["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{max(1, int(mbps * 1000))}kbit",
         "burst", str(burst), "latency", "50ms"])


def remove_outside_net(netns: str, veth: str) -> None:
    """Delete the outside's namespace and veth (those that exist)."""
    remove_node_net({"netns": netns, "veth": veth})


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
