"""A head whose default route is missing (an air-gapped site) or on a front-end network the other trays do not reach:
vLLM's ``get_ip()`` gives ``0.0.0.0`` or that address, and without ``VLLM_HOST_IP`` the head advertises its message
queue there, so its workers wait and the head times out. The deploy sets ``VLLM_HOST_IP`` to each node's ``k3_ip``
and the group serves (the simulator's side: ``sim up --fault 0:default-route=none|front-end``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from helpers import deploy, why
from helpers.simulated import Sim

pytestmark = pytest.mark.sim

ENV = "/etc/k3deploy/k3-engine.env"


@pytest.mark.parametrize("route, advertised", [("none", "0.0.0.0"), ("front-end", "198.51.100.11")])
def test_vllm_host_ip_lets_a_head_without_a_cluster_default_route_serve(sim_factory: Callable[..., Sim],
                                                                         route: str, advertised: str):
    sim = sim_factory("hostip", "gb300", 2, "--fault", f"0:default-route={route}")
    head_ip = sim.info["nodes"][0]["ip"]
    # what happens without it (the site blanks it): the head advertises get_ip()'s answer and nobody loads
    # (the head's ready timeout shortened from vLLM's 600 s: the same failure, seen sooner)
    sim.set_vars("k3_extra_env: {VLLM_HOST_IP: '', VLLM_ENGINE_READY_TIMEOUT_S: '100'}\n")
    bad = deploy(sim.inventory)
    assert bad.returncode != 0, why(bad)
    assert f"mq_connect_ip={advertised} (local)" in bad.stdout, why(bad)
    assert "Timed out waiting for engine core processes to start" in bad.stdout, why(bad)
    # the deploy's own value: each node's cluster address
    sim.set_vars("k3_extra_env: {}\n")
    ok = deploy(sim.inventory)
    assert ok.returncode == 0, why(ok)
    for rank, node in enumerate(sim.info["nodes"]):
        assert f"VLLM_HOST_IP={node['ip']}\n" in sim.ssh(rank, f"cat {ENV}").stdout
    journal = sim.ssh(0, "journalctl -u k3-engine.service --no-pager | grep 'DP group leader' | tail -1").stdout
    assert f"mq_connect_ip={head_ip} (local)" in journal
