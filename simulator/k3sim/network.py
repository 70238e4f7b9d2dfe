"""The cluster's network: a bridge ``NAME0`` on ``<subnet>.1/24``, a network namespace and a veth pair per node,
and one for the simulated outside.

Node i of cluster ``NAME`` has ``<subnet>.<10+i>/24`` on ``eth0`` inside its namespace ``NAME-node<i>``; the
host side of its veth pair is ``NAME-v<i>``, on the bridge. ``k3sim`` uses ``10.77.0``; other names get a
subnet derived from the name unless one is given. The outside (:mod:`k3sim.outside`) has ``<subnet>.254``
on ``eth0`` in ``NAME-out`` (host side ``NAME-vo``). ``<subnet>.250`` is no node's: it is the site's virtual address
(``k3_vip``, ``sim up --vip``), which keepalived on the nodes adds to the ``eth0`` of the node that serves the
endpoint; VRRP's adverts (multicast 224.0.0.18) and gratuitous ARP cross the bridge like any frame.

Shaping (``tc`` ``tbf``; ``netem`` is not available in every kernel): the outside's ``eth0`` egress runs at the
uplink rate, so all nodes share the uplink, and each node's ``eth0`` egress at the cluster rate (node to node).
"""

from __future__ import annotations

import re
import socket
import zlib
from pathlib import Path
from typing import Any

from k3sim.host import SimError, run
from k3sim.state import DEFAULT_NAME, NodeLayout, list_names, load_state


def bridge_name(name: str) -> str:
    return f"{name}0"


#: the last octet of the cluster's virtual address (k3_vip): above every node (.11 to .138) and below the outside
VIP_OCTET = 250


def vip_address(subnet: str) -> str:
    """The virtual address of a cluster on ``subnet``.

    >>> vip_address("10.77.5")
    '10.77.5.250'
    """
    return f"{subnet}.{VIP_OCTET}"


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


#: the front-end network of fault ``default-route=front-end`` (TEST-NET-2, RFC 5737: no node routes to it)
FRONT_END_NET = "198.51.100"
FRONT_END_IF = "fe0"


def set_default_route(netns: str, subnet: str, rank: int, mode: str | None) -> None:
    """The node's default route (fault ``default-route``): via the bridge on ``eth0`` (None, as :func:`prepare_net`
    sets it), none at all (``none``: an air-gapped site), or on a front-end interface ``fe0`` (``front-end``:
    ``198.51.100.<11+rank>/24``, a veth pair inside the node whose other end answers nothing, so no peer reaches
    it). The cluster's own /24 stays on ``eth0`` either way; vLLM's ``get_ip()`` (the address of the default route
    unless ``VLLM_HOST_IP`` is set, else ``0.0.0.0``) follows from it."""
    ns = ["ip", "-n", netns]
    has_fe = run([*ns, "link", "show", FRONT_END_IF], check=False).returncode == 0
    if mode == "front-end":
        if not has_fe:
            run([*ns, "link", "add", FRONT_END_IF, "type", "veth", "peer", "name", FRONT_END_IF + "p"])
            run([*ns, "addr", "add", f"{FRONT_END_NET}.{11 + rank}/24", "dev", FRONT_END_IF])
            run([*ns, "link", "set", FRONT_END_IF + "p", "up"])
            run([*ns, "link", "set", FRONT_END_IF, "up"])
        run([*ns, "route", "replace", "default", "via", f"{FRONT_END_NET}.1", "dev", FRONT_END_IF])
        return
    if has_fe:
        run([*ns, "link", "del", FRONT_END_IF], check=False)
    if mode == "none":
        run([*ns, "route", "del", "default"], check=False)
    else:
        run([*ns, "route", "replace", "default", "via", f"{subnet}.1", "dev", "eth0"])


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


def management_veth(name: str, rank: int) -> str:
    """The host side of node ``rank``'s management interface (fault ``imex-mgmt``)."""
    return f"{name}-m{rank}"


def add_management(name: str, rank: int, netns: str, interface: str, ip: str) -> None:
    """A second network in the node: ``interface`` (a veth whose host side is on no bridge) with ``ip``/24, as a
    tray's management port that IMEX may bind to. Idempotent; it goes with the namespace."""
    ns = ["ip", "-n", netns]
    if Path(f"/run/netns/{netns}").exists() and run([*ns, "link", "show", interface], check=False).returncode == 0:
        return
    host = management_veth(name, rank)
    run(["ip", "link", "add", host, "type", "veth", "peer", "name", interface, "netns", netns])
    run(["ip", "link", "set", host, "up"])
    run([*ns, "addr", "add", f"{ip}/24", "dev", interface])
    run([*ns, "link", "set", interface, "up"])


def remove_management(netns: str, interface: str) -> None:
    """Delete the node's management interface (its host side goes with it)."""
    run(["ip", "-n", netns, "link", "del", interface], check=False)


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


# ----------------------------------------------------------------------------------------------------- rails

#: rail i of a cluster is ``10.<RAIL_BASE + i>.<c>.0/24`` (``<c>``: the cluster subnet's third octet); the spine's leg
#: on each rail is ``.1``
RAIL_BASE = 200


def fabric_netns(name: str) -> str:
    """The namespace holding cluster ``name``'s GPU fabric: one bridge per rail (``r<i>``), and the spine."""
    return f"{name}-fabric"


def _ensure_rail(name: str, rail: int, prefix: str) -> None:
    fab = fabric_netns(name)
    if not Path(f"/run/netns/{fab}").exists():
        run(["ip", "netns", "add", fab])
        run(["ip", "-n", fab, "link", "set", "lo", "up"])
        # the spine routes between the rails: forwarding in the fabric's own namespace only
        run(["ip", "netns", "exec", fab, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
    if run(["ip", "-n", fab, "link", "show", f"r{rail}"], check=False).returncode != 0:
        run(["ip", "-n", fab, "link", "add", f"r{rail}", "type", "bridge"])
        run(["ip", "-n", fab, "addr", "add", f"{prefix}.1/24", "dev", f"r{rail}"])
        run(["ip", "-n", fab, "link", "set", f"r{rail}", "up"])


def prepare_rails(name: str, rank: int, netns: str, rails: dict[str, Any]) -> None:
    """The node's GPU NIC interfaces (``rails["ports"]``: ``{"netdev", "rail", "address"}``), each a veth whose other
    end is on its rail's bridge in the fabric namespace, ``<address>/24`` on it; then its routes to the other rails
    (:func:`set_rail_only`)."""
    ns = ["ip", "-n", netns]
    fab = fabric_netns(name)
    for port in rails["ports"]:
        prefix = port["address"].rpartition(".")[0]
        _ensure_rail(name, int(port["rail"]), prefix)
        leg = f"n{rank}r{port['rail']}"
        run([*ns, "link", "add", port["netdev"], "type", "veth", "peer", "name", leg, "netns", fab])
        run(["ip", "-n", fab, "link", "set", leg, "master", f"r{port['rail']}", "up"])
        run([*ns, "addr", "add", f"{port['address']}/24", "dev", port["netdev"]])
        run([*ns, "link", "set", port["netdev"], "up"])
    set_rail_only(netns, rails, bool(rails.get("rail_only")))


def set_rail_only(netns: str, rails: dict[str, Any], on: bool) -> None:
    """Off: each GPU NIC reaches the other rails through the spine (a route per other rail, via its own rail's
    ``.1``). On (fault ``rail-only``): no such route, and the node drops what arrives on one rail from another
    (strict reverse-path filter), as on a fabric of rail switches without a spine: port i reaches port i only."""
    ns = ["ip", "-n", netns]
    ports = rails["ports"]
    for port in ports:
        prefix = port["address"].rpartition(".")[0]
        for other in ports:
            if other is port:
                continue
            dest = other["address"].rpartition(".")[0] + ".0/24"
            route = [dest, "via", f"{prefix}.1", "dev", port["netdev"], "metric", str(100 + int(port["rail"]))]
            run([*ns, "route", "del" if on else "replace", *route], check=False)
        run(["ip", "netns", "exec", netns, "sysctl", "-qw",
             f"net.ipv4.conf.{port['netdev']}.rp_filter={1 if on else 0}"])
    if not on:
        run(["ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])


def remove_rails(name: str) -> None:
    """Delete the cluster's fabric namespace (the nodes' rail veths go with it)."""
    if Path(f"/run/netns/{fabric_netns(name)}").exists():
        run(["ip", "netns", "del", fabric_netns(name)], check=False)
