"""Every host at once: one gevent greenlet per host, each in the pyinfra state's contexts, results in host order
(:func:`each_host`). What reads or probes several hosts side by side (the rollout's facts, the preflight's rounds
across hosts, the deployment lock) goes through it.

Example::

    >>> each_host(state, list(state.inventory), lambda host: host.name)      # doctest: +SKIP
    ['n1', 'n2']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import gevent
from pyinfra.api.state import State
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

from k3deploy.errors import K3Error

T = TypeVar("T")


def each_host(state: State, hosts: list[Any], fn: Callable[[Any], T]) -> list[T]:
    """``fn(host)`` on every host at once (one greenlet each, in the state's contexts); results in host order.
    An exception in one host's call is raised after all have finished."""
    def run(one: Any) -> T:
        with ctx_state.use(state), ctx_config.use(state.config), ctx_inventory.use(state.inventory), \
                ctx_host.use(one):
            return fn(one)

    jobs = [gevent.spawn(run, one) for one in hosts]
    gevent.joinall(jobs)
    for one, job in zip(hosts, jobs, strict=True):
        if not job.successful():
            raise K3Error(f"reading {one.name} failed: {type(job.exception).__name__}: {job.exception}: check the "
                          "connection and rerun")
    return [job.value for job in jobs]
