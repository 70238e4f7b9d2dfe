"""The simulated engine advertises its DP group's message queue where vLLM would: ``get_ip()`` (``VLLM_HOST_IP``,
else the address of the default route, else ``0.0.0.0``); a queue the workers cannot reach leaves them waiting and
the head times out. The node-level fault (``default-route=none|front-end``) is exercised end
to end in tests/e2e/test_host_ip.py."""

from __future__ import annotations

import subprocess
import sys
import time

from helpers.engine import ENGINE, Node, free_port, healthy, http, wait_for

MODEL = "moonshotai/Kimi-K3"


def tp16(node: Node, rank: int, head: Node, port: int, http_port: int) -> list[str]:
    args = [MODEL, "--served-model-name", "kimi-k3", "--tensor-parallel-size", "16", "--nnodes", "2",
            "--node-rank", str(rank), "--master-addr", head.ip, "--master-port", str(port),
            "--host", node.ip, "--port", str(http_port)]
    return args + (["--headless"] if rank else [])


def test_get_ip_is_vllm_host_ip_else_the_default_routes_address_else_0_0_0_0():
    code = ("import socket, sys\n"
            f"sys.path.insert(0, {str(ENGINE.parent)!r})\n"
            "import vllmsim\n"
            "print(vllmsim.get_ip({'VLLM_HOST_IP': '10.1.2.3'}))\n"
            "def unreachable(self, address):\n"
            "    raise OSError(101, 'Network is unreachable')\n"
            "socket.socket.connect = unreachable\n"   # no default route, IPv4 or IPv6
            "print(vllmsim.get_ip({'HOST_IP': '10.9.9.9'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split() == ["10.1.2.3", "0.0.0.0"]
    assert "HOST_IP is deprecated and ignored" in out.stderr
    assert ("UserWarning: Failed to get the IP address, using 0.0.0.0 by default.The value can be set by the "
            "environment variable VLLM_HOST_IP or HOST_IP.") in out.stderr


def test_the_head_advertises_vllm_host_ip_and_the_worker_joins_there(tmp_path, procs, net):
    head, worker = (Node(tmp_path, "h200", r, 2, net) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    h = procs.engine(head, tp16(head, 0, head, mport, hport), VLLM_HOST_IP=head.ip)
    procs.engine(worker, tp16(worker, 1, head, mport, hport), VLLM_HOST_IP=worker.ip)
    assert wait_for(lambda: healthy(f"http://{head.ip}:{hport}"), 10)
    assert (f"DP group leader: node_rank=0, node_rank_within_dp=0, master_addr={head.ip}, mq_connect_ip={head.ip} "
            "(local), world_size=16, local_world_size=8") in procs.output(h)


def test_a_queue_advertised_on_0_0_0_0_leaves_the_worker_waiting_and_times_the_head_out(tmp_path, procs, net):
    # what get_ip() gives on a node without a default route and without VLLM_HOST_IP
    # time_scale 0.002: the head's 600 s VLLM_ENGINE_READY_TIMEOUT_S lasts 1.2 s
    head, worker = (Node(tmp_path, "h200", r, 2, net, scale=0.002) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    h = procs.engine(head, tp16(head, 0, head, mport, hport), VLLM_HOST_IP="0.0.0.0")
    w = procs.engine(worker, tp16(worker, 1, head, mport, hport))
    time.sleep(0.6)
    # the world formed (the TCPStore at --master-addr is reachable), yet nobody loads: the worker waits on the queue
    assert w.poll() is None and http(f"http://{head.ip}:{hport}/health")[0] is None
    assert "Loading weights" not in procs.output(w)
    assert h.wait(timeout=10) == 1
    assert "mq_connect_ip=0.0.0.0 (local)" in procs.output(h)
    assert "TimeoutError: Timed out waiting for engine core processes to start" in procs.output(h)
    assert w.wait(timeout=10) == 1  # and the worker goes when its head does


def test_a_vllm_host_ip_not_on_the_node_fails_the_leader_at_bind(tmp_path, procs, net):
    head, worker = (Node(tmp_path, "h200", r, 2, net) for r in (0, 1))
    mport, hport = free_port(head.ip), free_port(head.ip)
    h = procs.engine(head, tp16(head, 0, head, mport, hport), VLLM_HOST_IP="192.0.2.77")
    assert h.wait(timeout=10) == 1
    assert "zmq.error.ZMQError: Cannot assign requested address (addr='tcp://192.0.2.77:" in procs.output(h)
