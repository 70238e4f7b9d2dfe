"""The simulated ``docker run`` as a Slurm step sees it, without a cluster: the client proxies the signals a cancel
sends (SIGCONT, then SIGTERM) to the container, and a ``--rm`` container killed with its client (SIGKILL after
KillWait) is gone, as dockerd removes it, so the next step's ``docker run --name`` does not conflict."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from helpers.engine import DOCKER, Node, free_port, healthy, wait_for

pytestmark = pytest.mark.usefixtures("outside_server")  # the first run pulls from the simulated outside

IMAGE = "vllm/vllm-openai:kimi-k3"


def docker(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DOCKER), *args], capture_output=True, text=True, env=node.env(),
                          timeout=60)


def start(node: Node, name: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port(node.ip)
    proc = subprocess.Popen([sys.executable, str(DOCKER), "run", "--rm", "--name", name, "--gpus", "all", "--network",
                             "host", "-e", "K3SIM_LOAD_SECONDS=0.1", IMAGE, "moonshotai/Kimi-K3", "-tp", "8", "--host",
                             node.ip, "--port", str(port)], env=node.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: healthy(f"http://{node.ip}:{port}"), 30), proc.stderr
    return proc, port


def engine_pid(node: Node, name: str) -> int:
    return int(docker(node, "inspect", "--format", "{{.State.Pid}}", name).stdout)


def test_a_cancel_reaches_the_container_through_the_client(tmp_path, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    proc, _ = start(n, "k3-step")
    try:
        pid = engine_pid(n, "k3-step")
        proc.send_signal(signal.SIGCONT)  # what Slurm sends first: proxied, harmless
        assert docker(n, "ps", "--format", "{{.Names}}").stdout == "k3-step\n"
        proc.send_signal(signal.SIGTERM)  # to the client only: the container gets it through --sig-proxy
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    assert docker(n, "ps", "-a", "-q").stdout == ""


def test_a_rm_container_killed_with_its_client_is_removed(tmp_path, net):
    n = Node(tmp_path, "h200", 0, 1, net)
    proc, _ = start(n, "k3-step")
    pid = engine_pid(n, "k3-step")
    # SIGKILL after KillWait: Slurm's proctrack kills the client and the container process, both of the step
    proc.kill()
    os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}/status") or "State:\tZ" in
                    open(f"/proc/{pid}/status").read(), 10)
    assert docker(n, "ps", "-a", "-q").stdout == ""
    again, _ = start(n, "k3-step")  # the next step's container of the same name: no conflict
    again.send_signal(signal.SIGTERM)
    again.communicate(timeout=20)
    assert again.returncode == 0
