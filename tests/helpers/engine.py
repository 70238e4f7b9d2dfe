"""Utilities shared by the simulated-engine, docker and router tests (fixtures: tests/sim/conftest.py).

Engines run on the host as real processes, each "node" on its own loopback address (127.x.y.z), with
its own node.json; every process started here is stopped by PID at the end of the test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from k3sim import outside
from k3sim.faults import parse_fault
from k3sim.profiles import NODE_TOOLS, node_config

ENGINE = NODE_TOOLS / "usr/lib/k3sim/engine.py"
DOCKER = NODE_TOOLS / "usr/bin/docker"
#: the node's vllm-router command: runs the real vllm-router 0.1.17 (K3SIM_ROUTER_DIR: where it is installed)
ROUTER = NODE_TOOLS / "usr/local/bin/vllm-router"
UUID = "8f7e1c2a-3b4d-4e5f-9a6b-7c8d9e0f1a2b"
#: ADDRESS:PORT of the simulated outside the host's "nodes" use (K3SIM_OUTSIDE), set by the ``outside`` fixture
OUTSIDE_ADDR: str | None = None


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Node:
    """One simulated node on the host: a loopback address, a node.json and a state directory."""

    def __init__(self, tmp: Path, hardware: str, rank: int, nodes: int, net: str, faults=(), scale=0.01):
        self.name = f"node{rank + 1}"
        self.ip = f"{net}.{11 + rank}"
        self.dir = tmp / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = node_config(hardware, rank, nodes, self.name, self.ip, [parse_fault(f) for f in faults],
                                  scale, UUID)
        (self.dir / "node.json").write_text(json.dumps(self.config))

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("K3SIM_", "VLLM_", "NCCL_"))}
        env.update(K3SIM_NODE_CONFIG=str(self.dir / "node.json"), K3SIM_STATE_DIR=str(self.dir / "state"))
        if OUTSIDE_ADDR:
            env["K3SIM_OUTSIDE"] = OUTSIDE_ADDR
        env.update(extra)
        return env


class Procs:
    """Processes started by one test; all are stopped (by PID) at teardown."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        out = open(self.tmp / f"{log}.out", "w")
        err = open(self.tmp / f"{log}.err", "w")
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def engine(self, node: Node, args: list[str], log: str | None = None, **env: str) -> subprocess.Popen:
        env.setdefault("K3SIM_LOAD_SECONDS", "0.3")
        env.setdefault("K3SIM_COMPILE_SECONDS", "0.1")
        return self.start([sys.executable, str(ENGINE), "serve", *args], node.env(**env), log or node.name)

    def output(self, proc: subprocess.Popen) -> str:
        log = proc.log  # type: ignore[attr-defined]
        return (self.tmp / f"{log}.out").read_text() + (self.tmp / f"{log}.err").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Outside:
    """The simulated outside (registries and hub) on a loopback address of its own, as a real process."""

    def __init__(self, d: Path, ip: str, image_mb: float = 4, weights_mb: float = 4) -> None:
        self.dir = d
        self.ip = ip
        self.port = free_port(ip)
        self.addr = f"{ip}:{self.port}"
        self.log = open(d / "outside.log", "w")
        self.proc = subprocess.Popen([sys.executable, outside.__file__, "--dir", str(d), "--bind", ip, "--port",
                                      str(self.port), "--image-mb", str(image_mb), "--weights-mb", str(weights_mb)],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                with socket.create_connection((ip, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the outside server did not listen: {(d / 'outside.log').read_text()}")

    def payload(self) -> int:
        return int(outside.read_counters(self.dir)["payload_bytes"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def http(url: str, body: dict | None = None, headers: dict | None = None, timeout: float = 5):
    """(status, parsed JSON or raw text) or (None, error) when nothing listens."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode()
            code = resp.status
    except urllib.error.HTTPError as exc:
        raw, code = exc.read().decode(), exc.code
    except (ConnectionRefusedError, urllib.error.URLError) as exc:
        return None, str(exc)
    try:
        return code, json.loads(raw) if raw else ""
    except ValueError:
        return code, raw


def wait_for(pred, timeout: float, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        val = pred()
        if val:
            return val
        time.sleep(step)
    return pred()


def healthy(base: str) -> bool:
    return http(base + "/health", timeout=1)[0] == 200


def chat(base: str, model: str, **extra) -> tuple:
    return http(base + "/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": "Say hello"}], **extra})
