"""The site's virtual address (``k3_vip``): one address clients use that survives a head's replacement.

keepalived (VRRP) runs on every host of the rollout and on every spare, all in state ``BACKUP`` with one
``virtual_router_id`` (``k3_vip_router_id``). Each checks, with a track script, that the endpoint's port answers
``/health`` on its own address; a host whose check fails is in VRRP's ``FAULT`` state and cannot hold the address.
The host that serves the endpoint (the group's head, or the router's host with replicas or P/D) has the highest
priority, so it holds the address while it serves; a spare that takes the head's rank becomes that host at the
next deploy run (its configuration is rewritten with the holder's priority), and a replaced head that comes back
serves no ``/health`` and so never takes the address back. The rollout's endpoint is ``http://<k3_vip>:<port>``
(:func:`k3deploy.model.rollout.lay_out`): ``status``, the smoke test and the runbook use it.

What the deploy does for it is one list of steps, built by :func:`k3deploy.model.steps.virtual_address` and rendered
by both the deploy's virtual address phase and the runbook's section.

Pure: the configuration is rendered from ``templates/k3-keepalived.conf.j2`` (no logic in it); the scripts that
check and apply it are :mod:`k3deploy.model.commands`'.

Example::

    >>> from k3deploy.model.binding import HostRecord
    >>> from k3deploy.model.pipeline import desired_rollout, target
    >>> common = {"k3_hardware": "gb300", "k3_strategy": "multi_node_tp", "k3_vip": "10.0.0.250"}
    >>> hosts = [HostRecord("n1", ("head",), {**common, "k3_ip": "10.0.0.1"}),
    ...          HostRecord("n2", ("workers",), {**common, "k3_ip": "10.0.0.2", "rank": 1}),
    ...          HostRecord("n9", ("spares",), {**common, "k3_ip": "10.0.0.9"})]
    >>> rollout = desired_rollout(target(hosts, None))
    >>> rollout.endpoint, rollout.vip_holder, members(rollout)
    ('http://10.0.0.250:8000', 'n1', ['n1', 'n2', 'n9'])
    >>> [line.strip() for line in keepalived_conf(rollout, "n1", "eth0").splitlines() if "priority" in line]
    ['priority 150']
    >>> health_check(rollout, "n9")
    '/usr/bin/curl -sf -o /dev/null -m 2 http://10.0.0.9:8000/health'
"""

from __future__ import annotations

from urllib.parse import urlsplit

from k3deploy.model.rollout import Rollout
from k3deploy.model.units import render_template

#: keepalived's configuration on every host that takes part
KEEPALIVED_CONF = "/etc/keepalived/keepalived.conf"
KEEPALIVED_UNIT = "keepalived.service"
#: Debian's (and most distributions') package
KEEPALIVED_PACKAGE = "keepalived"
TEMPLATE = "k3-keepalived.conf.j2"
#: VRRP priorities: the host that serves the endpoint, and every other host (a spare, a worker)
HOLDER_PRIORITY = 150
OTHER_PRIORITY = 100
#: seconds between VRRP adverts and between two checks of the host's own /health; checks in a row that fail (fall)
#: or pass (rise) before the host's state changes
ADVERT_INT = 1
CHECK_INTERVAL = 2
CHECK_TIMEOUT = 2
FALL = 2
RISE = 1
#: seconds the host that serves the endpoint may take to hold the virtual address (VRRP: its check passes, then it
#: waits about three adverts for a master before it takes over)
HOLD_TIMEOUT = 60


def members(rollout: Rollout) -> list[str]:
    """The hosts that run keepalived: every host of the rollout, then the spares standing by (inventory order);
    none without ``k3_vip``."""
    if rollout.vars.k3_vip is None:
        return []
    return list(dict.fromkeys([*rollout.hosts, *rollout.spares]))


def address_of(rollout: Rollout, host: str) -> str:
    """The cluster address of ``host`` (a host of the rollout, or a spare)."""
    for unit in rollout.on_host(host):
        return unit.node.address
    return rollout.spares[host]


def port(rollout: Rollout) -> int:
    """The endpoint's port (the head's, or the router's)."""
    return urlsplit(rollout.endpoint).port or 80


def health_check(rollout: Rollout, host: str) -> str:
    """The track script of ``host``: the endpoint's port answers ``/health`` on the host's own address."""
    url = f"http://{address_of(rollout, host)}:{port(rollout)}/health"
    return f"/usr/bin/curl -sf -o /dev/null -m {CHECK_TIMEOUT} {url}"


def keepalived_conf(rollout: Rollout, host: str, interface: str) -> str:
    """keepalived's configuration on ``host`` (its VRRP instance on ``interface``)."""
    vip = rollout.vars.k3_vip
    assert vip is not None, "keepalived_conf without k3_vip"
    holder = host == rollout.vip_holder
    return render_template(
        TEMPLATE, vip=vip, prefix=rollout.vars.k3_vip_prefix, interface=interface,
        router_id=rollout.vars.k3_vip_router_id, router_name=host,
        role="the host that serves the endpoint" if holder else "standing by: it never serves the endpoint's /health",
        priority=HOLDER_PRIORITY if holder else OTHER_PRIORITY, advert_int=ADVERT_INT,
        script_name="k3_endpoint_health", check=health_check(rollout, host), interval=CHECK_INTERVAL,
        timeout=CHECK_TIMEOUT, fall=FALL, rise=RISE, instance="k3_endpoint")


def describe(rollout: Rollout) -> str | None:
    """One line for people (plan, runbook): who holds the virtual address; None without one."""
    if rollout.vars.k3_vip is None or rollout.vip_holder is None:
        return None
    return (f"virtual address {rollout.vars.k3_vip} (keepalived VRRP, router id {rollout.vars.k3_vip_router_id}): "
            f"held by {rollout.vip_holder} while its /health answers on port {port(rollout)}; "
            f"{len(members(rollout)) - 1} other host(s) stand by")
