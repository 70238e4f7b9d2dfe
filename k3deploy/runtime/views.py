"""What each use of :func:`k3deploy.runtime.gather.gather` reads: one named :class:`View` per command, instead of
flags at every call.

============================  ===========  ====================================================================
view                          hosts read   what it adds to the plan and the rollout
============================  ===========  ====================================================================
:data:`VARIABLES`             none         the variables alone (no plan needed): ``k3deploy vars``
:data:`INVENTORY_ONLY`        none         the rollout from the inventory alone: ``resolve``, ``lint``
:data:`OFFLINE_RUNBOOK`       none         the rollout with each node's settings left as named blanks
:data:`PREFLIGHT`             facts        every check (no plan needed): ``k3deploy preflight``
:data:`RUNBOOK`               facts        every check, the image's tag pinned to its digest: ``runbook``
:data:`EXPORT`                facts        as RUNBOOK: ``export kubernetes --read-nodes`` (each node's settings)
:data:`EXPORT_PROMETHEUS`     + ports      the TCP ports each host listens on: ``export prometheus --read-nodes``
:data:`HISTORY`               + installed  what the hosts run and keep (units, image, weights, revisions, lock)
:data:`SPARES`                + installed  who stands in for whom, what stands by or is quarantined: ``spares``
:data:`PLAN`, :data:`DEPLOY`  + health     whether each serving unit answers ``/health``: ``plan``, the deploy
:data:`STATUS`                + running    each unit as it runs, what the endpoint lists: ``status``
:func:`bundle`                + logs       the tail of every unit's journal and container log: ``bundle``
============================  ===========  ====================================================================

Example::

    >>> STATUS.reads_hosts, STATUS.installed, STATUS.running, bundle(300).log_lines
    (True, True, True, 300)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class View:
    """What one use reads of the hosts, and what it needs of the inventory."""

    name: str
    reads_hosts: bool = True       # connect and read every host's facts (else the inventory alone)
    needs_plan: bool = True        # a plan that does not fit the hosts is an error (else the hosts are still read)
    installed: bool = False        # what the rollout finds installed: units, image, weights, revisions, the lock
    health: bool = False           # whether each serving unit answers /health
    running: bool = False          # each unit as it runs, and what the public endpoint lists
    log_lines: int = 0             # the tail of each unit's journal and container log
    pins_image: bool = False       # the image's tag resolved to its digest without reading what the hosts run
    blanks: bool = False           # no host read: each node's derived settings become named blanks (a runbook)
    exporters: bool = False        # the TCP ports each host listens on (the exporters ``export prometheus`` finds)


#: ``k3deploy vars``: the variables, whether or not they make a plan
VARIABLES = View("variables", reads_hosts=False, needs_plan=False)
#: ``resolve --inventory``, ``lint --inventory``: the plan and the rollout from the inventory alone
INVENTORY_ONLY = View("inventory only", reads_hosts=False)
#: ``runbook --offline``: the rollout from the inventory, what the nodes would tell as named blanks
OFFLINE_RUNBOOK = View("offline runbook", reads_hosts=False, blanks=True)
#: ``k3deploy preflight``: every host checked, with or without a plan that fits them
PREFLIGHT = View("preflight", needs_plan=False)
#: ``k3deploy runbook``: every host checked, the image's tag pinned
RUNBOOK = View("runbook", pins_image=True)
#: ``export kubernetes --read-nodes``: the nodes' settings (interface, RDMA ports) read, the image's tag pinned
EXPORT = View("export", pins_image=True)
#: ``export prometheus --read-nodes``: which exporters each node runs (the ports it listens on)
EXPORT_PROMETHEUS = View("export prometheus", exporters=True)
#: ``k3deploy history``: the revisions the hosts keep
HISTORY = View("history", installed=True)
#: ``k3deploy spares``: the spares, the quarantined nodes and the substitutions the nodes record
SPARES = View("spares", installed=True)
#: ``k3deploy plan``: what a deploy would change
PLAN = View("plan", installed=True, health=True)
#: ``pyinfra INVENTORY deploy/k3.py``: what the deploy changes (read inside pyinfra's own run)
DEPLOY = View("deploy", installed=True, health=True)
#: ``k3deploy status``: what runs and whether it serves
STATUS = View("status", installed=True, running=True)


def bundle(log_lines: int) -> View:
    """``k3deploy bundle``: the status with the tail of each unit's logs."""
    return View("bundle", installed=True, running=True, log_lines=log_lines)
