"""Handles of a simulated cluster for the tests that bring one up: :class:`Sim` (a cluster of the e2e tests, made by
the ``sim_factory`` fixture), the SSH and state readers of the simulator's own tests, and the client of a served
endpoint."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from helpers import K3DEPLOY, ROOT, k3
from k3sim import cluster as sim
from k3sim import processes


def ssh(cluster: dict[str, Any], ip: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    d = Path(cluster["inventory"]).parent
    return subprocess.run(
        ["ssh", "-i", str(d / "id_ed25519"), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o", "ConnectTimeout=3", "-o", "LogLevel=ERROR",
         f"root@{ip}", command],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def resources(name: str) -> dict[str, Any]:
    """What a cluster owns on the host, read from its state file."""
    st = sim.load_state(name)
    assert st is not None
    init_pids = [sim.node_init_pid(r) for r in st["nodes"]]
    return {
        "state": st,
        "nspawn": [(r["pid"], r["pid_start"]) for r in st["nodes"]],
        "init": [p for p in init_pids if p],
        "cg_pids": [p for cg in st["cgroups"] for p in processes.cgroup_pids(Path(cg))],
        "starts": {p: stat[1] for cg in st["cgroups"] for p in processes.cgroup_pids(Path(cg))
                   if (stat := processes.proc_stat(p))},
    }


def leftovers(res: dict[str, Any]) -> list[str]:
    """Everything of the cluster that is still on the host after ``down``."""
    st = res["state"]
    name = st["name"]
    left = []
    for r in st["nodes"]:
        if Path(f"/run/netns/{r['netns']}").exists():
            left.append(f"netns {r['netns']}")
        if Path(f"/sys/class/net/{r['veth']}").exists():
            left.append(f"veth {r['veth']}")
        if Path(f"/run/systemd/nspawn/propagate/{r['name']}").exists():
            left.append(f"nspawn propagate dir of {r['name']}")
    if Path(f"/sys/class/net/{st['bridge']}").exists():
        left.append(f"bridge {st['bridge']}")
    out = st.get("outside") or {}
    if out.get("netns") and Path(f"/run/netns/{out['netns']}").exists():
        left.append(f"netns {out['netns']}")
    if out.get("veth") and Path(f"/sys/class/net/{out['veth']}").exists():
        left.append(f"veth {out['veth']}")
    with open("/proc/self/mountinfo") as fh:
        mounts = [ln.split()[4] for ln in fh]
    left += [f"mount {m}" for m in mounts if m.startswith(str(sim.state_dir(name)))]
    left += [f"cgroup {cg}" for cg in st["cgroups"] if Path(cg).exists()]
    # a PID known with its start time is the same process only if it started then (other tests' clusters, in the
    # other test process, start processes all the time: a PID may be reused between the down and this check)
    started = {**res["starts"], **dict(res["nspawn"])}
    for pid in [p for p, _ in res["nspawn"]] + res["init"] + res["cg_pids"] + ([out["pid"]] if out.get("pid") else []):
        stat = processes.proc_stat(pid)
        if stat is not None and stat[0] not in ("Z", "X") and started.get(pid, stat[1]) == stat[1]:
            left.append(f"process {pid} ({processes.comm(pid)})")
    if sim.state_dir(name).exists():
        left.append(f"state dir {sim.state_dir(name)}")
    return left


def bring_up(name: str, hardware: str, nodes: int, *faults: str) -> dict[str, Any]:
    """``k3deploy sim up --json`` of a new cluster NAME (a leftover of that name brought down first): its JSON."""
    sim.down(name)  # a leftover of an interrupted earlier test run
    args = ["sim", "up", "--hardware", hardware, "--nodes", str(nodes), "--name", name, "--json"]
    for f in faults:
        args += ["--fault", f]
    res = k3(*args)
    assert res.returncode == 0, res.stderr
    cluster: dict[str, Any] = json.loads(res.stdout)
    return cluster


class Sim:
    """A simulated cluster of the e2e tests (the ``sim_factory`` fixture makes them and brings them down)."""

    def __init__(self, name: str, hardware: str, nodes: int, *args: str) -> None:
        sim.down(name)  # a leftover of an interrupted earlier test run (in this process: no interpreter to start)
        out = k3("sim", "up", "--hardware", hardware, "--nodes", str(nodes), "--name", name, "--json", *args,
                 check=True)
        self.info = json.loads(out.stdout)
        self.name = name
        self.inventory = self.info["inventory"]
        self.group_vars = Path(self.inventory).parent / "group_vars" / "all.yml"

    def set_vars(self, text: str) -> None:
        """Set the variables of ``text`` (YAML) in the cluster's group_vars/all.yml: a key already there takes the
        new value (a file naming a key twice is refused)."""
        have = yaml.safe_load(self.group_vars.read_text()) or {}
        have.update(yaml.safe_load(text) or {})
        self.group_vars.write_text("# written by the tests: the selection of this simulated cluster\n"
                                   + yaml.safe_dump(have, sort_keys=False))

    def ssh(self, rank: int, command: str) -> subprocess.CompletedProcess[str]:
        d = Path(self.inventory).parent
        ip = self.info["nodes"][rank]["ip"]
        return subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
                               "-o", "BatchMode=yes", f"root@{ip}", command], capture_output=True, text=True,
                              timeout=60)

    def down(self) -> None:
        """``k3deploy sim down --name NAME``'s work, in this process."""
        sim.down(self.name)


def endpoint_of(output: str) -> str:
    """The endpoint a deploy's output names for its chat completion."""
    m = re.search(r"Chat completion through (http://[0-9.]+:\d+)", output)
    assert m, output[-2000:]
    return m.group(1)


def openai_client(endpoint: str, model: str = "moonshotai/Kimi-K3") -> str:
    """A chat completion through ``endpoint`` with the OpenAI client (``tools/chat.py``): its output."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "chat.py"), endpoint, "--model", model],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Generated text: " in proc.stdout
    return proc.stdout


class WatchLoop:
    """``k3deploy watch ... --json`` running in the background; its event lines are collected as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*K3DEPLOY, "watch", *args, "--json"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT, stdin=subprocess.DEVNULL)
        self.events: list[dict] = []
        self.stderr = ""
        self._out = threading.Thread(target=self._read, daemon=True)
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._out.start()
        self._err.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:   # as it comes: a test may act on a line of a repair under way
            self.stderr += line

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        self._out.join(10)
        self._err.join(10)
        return rc


def slurm_jobs(sim: Sim) -> list[list[str]]:
    """The queue on a ``sim up --slurm`` cluster's submit host (its first node): ``[id, name, state, comment]`` per
    job."""
    out = sim.ssh(0, "squeue -h -o '%i %j %T %k'")
    assert out.returncode == 0, out.stderr
    return [line.split() for line in out.stdout.splitlines() if line.strip()]
