"""End-to-end tests on the simulated cluster: real pyinfra over real SSH to nodes with a real systemd."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def sim_available() -> str | None:
    if os.geteuid() != 0:
        return "the simulated cluster needs root"
    if shutil.which("systemd-nspawn") is None:
        return "systemd-nspawn is not installed (bash .ci/install-sim.sh)"
    return None


skip_no_sim = pytest.mark.skipif(sim_available() is not None, reason=sim_available() or "")


def k3(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", "from k3deploy.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"k3deploy {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def deploy(inventory: str, *extra: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the deploy; pyinfra's whole output (it logs to stderr) ends up in ``stdout``."""
    return subprocess.run([PYINFRA, inventory, "deploy/k3.py", "-y", *extra], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=ROOT, timeout=timeout)


def why(proc: subprocess.CompletedProcess) -> str:
    """What a failed assertion on a run shows: its lines that name an error or a failure (a deploy's output is long
    and the reason is rarely at its end), then the end of the output."""
    out = proc.stdout or ""
    keys = ("rror", "fail", "not serving", "observed", "Traceback", "refus", "timed out")
    hits = [line for line in out.splitlines() if any(k in line for k in keys) and " | " not in line]
    return "\n".join(["--- lines naming an error or a failure:", *hits[:60], "--- the end of the output:",
                      out[-2500:]]) + (f"\n--- stderr:\n{proc.stderr[-1500:]}" if proc.stderr else "")


def totals(output: str) -> tuple[int, int, int]:
    """(success, error, no change) of the run's "Grand total" line."""
    m = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert m, output[-3000:]
    num = [0 if x == "-" else int(x) for x in m.groups()[1:]]
    return num[0], num[1], num[2]


class Sim:
    def __init__(self, name: str, hardware: str, nodes: int, *args: str) -> None:
        import json

        k3("sim", "down", "--name", name, check=False)
        out = k3("sim", "up", "--hardware", hardware, "--nodes", str(nodes), "--name", name, "--json", *args)
        self.info = json.loads(out.stdout)
        self.name = name
        self.inventory = self.info["inventory"]
        self.group_vars = Path(self.inventory).parent / "group_vars" / "all.yml"

    def set_vars(self, text: str) -> None:
        """Set the variables of ``text`` (YAML) in the cluster's group_vars/all.yml: a key already there takes the
        new value (a file naming a key twice is refused)."""
        import yaml

        have = yaml.safe_load(self.group_vars.read_text()) or {}
        have.update(yaml.safe_load(text) or {})
        self.group_vars.write_text("# written by the tests: the selection of this simulated cluster\n"
                                   + yaml.safe_dump(have, sort_keys=False))

    def ssh(self, rank: int, command: str) -> subprocess.CompletedProcess:
        d = Path(self.inventory).parent
        ip = self.info["nodes"][rank]["ip"]
        return subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
                               "-o", "BatchMode=yes", f"root@{ip}", command], capture_output=True, text=True,
                              timeout=60)

    def down(self) -> None:
        k3("sim", "down", "--name", self.name, check=False)


@pytest.fixture
def sim_factory():
    made: list[Sim] = []

    def make(name: str, hardware: str, nodes: int, *args: str) -> Sim:
        s = Sim(name, hardware, nodes, *args)
        made.append(s)
        return s

    yield make
    for s in made:
        s.down()
