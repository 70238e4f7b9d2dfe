#!/usr/bin/env python3
"""Each engine unit's start, cold and after a change that keeps the compile inputs, on a simulated cluster.

Usage (as root, with the simulation's host packages installed):

    python benchmarks/compile_cache.py [--nodes 2] [--hardware gb300] [--compile-seconds 900] [--json FILE]

Brings up a cluster (``k3deploy sim up``; ``--compile-seconds``: the simulated engine's nominal cold compile, times
the time scale; 900 s by default here, against the simulated weight load's nominal 300 s: vLLM's issues put a cold
FlashInfer JIT on a new architecture above 600 s, vllm#48031, and torch.compile plus graph capture at ~130 s for a
70B model, vllm#19824), deploys it (every engine compiles: a miss), then deploys a change that keeps the compile inputs
(``k3_extra_env: {NCCL_DEBUG: INFO}``, no ``VLLM_*`` variable: the same cache key), and reads each node's engine
unit journal (``journalctl -u k3-engine -o short-unix``): a unit's start is from systemd's ``Started`` line of its
last start to its engine's ready line (``Application startup complete.``, or the headless node's ``Engine core is
ready``), and its compile phase is a hit or a miss by vLLM's own lines. Prints one line per node and the ratio of
the warm start to the cold one (target: <= 0.5 on every node); brings the cluster down.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

NAME = "ccbench"
READY = ("Application startup complete.", "Engine core is ready")


def k3(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("k3deploy")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from k3deploy.cli import main; main()"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)


def deploy(inventory: str) -> None:
    pyinfra = Path(sys.executable).with_name("pyinfra")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([str(pyinfra), inventory, "deploy/k3.py", "-y"], capture_output=True, text=True, cwd=root)
    if run.returncode != 0:
        raise SystemExit(f"deploy failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")


def ssh(info: dict, rank: int, command: str) -> str:
    d = Path(info["inventory"]).parent
    ip = info["nodes"][rank]["ip"]
    return subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
                           "-o", "BatchMode=yes", f"root@{ip}", command], capture_output=True, text=True,
                          timeout=60).stdout


def last_start(info: dict, rank: int) -> dict:
    """(seconds from the unit's last ``Started`` to its engine's ready line, ``hit`` or ``miss``)."""
    lines = ssh(info, rank, "journalctl -u k3-engine -o short-unix --no-pager").splitlines()
    begun = max(i for i, line in enumerate(lines) if re.search(r"systemd\[1\]: Started ", line))
    t0 = float(lines[begun].split()[0])
    ready = next(line for line in lines[begun:] if any(r in line for r in READY))
    mine = "\n".join(lines[begun:])
    phase = "hit" if "Directly load the compiled" in mine else "miss" if "Compiling a graph" in mine else "?"
    return {"seconds": round(float(ready.split()[0]) - t0, 2), "compile": phase}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--hardware", default="gb300")
    ap.add_argument("--compile-seconds", type=float, default=900.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    k3("sim", "down", "--name", NAME)
    extra = ["--compile-seconds", str(a.compile_seconds)]
    up = k3("sim", "up", "--hardware", a.hardware, "--nodes", str(a.nodes), "--name", NAME, "--json", *extra)
    if up.returncode != 0:
        raise SystemExit(f"sim up failed: {up.stderr}")
    info = json.loads(up.stdout)
    try:
        gv = Path(info["inventory"]).parent / "group_vars" / "all.yml"
        have = yaml.safe_load(gv.read_text()) or {}
        have.setdefault("k3_strategy", "multi_node_tp")
        gv.write_text(yaml.safe_dump(have, sort_keys=False))
        deploy(info["inventory"])
        cold = [last_start(info, r) for r in range(a.nodes)]
        have["k3_extra_env"] = {"NCCL_DEBUG": "INFO"}
        gv.write_text(yaml.safe_dump(have, sort_keys=False))
        deploy(info["inventory"])
        warm = [last_start(info, r) for r in range(a.nodes)]
    finally:
        k3("sim", "down", "--name", NAME)
    rows = [{"node": info["nodes"][r]["name"], "cold": cold[r], "warm": warm[r],
             "ratio": round(warm[r]["seconds"] / cold[r]["seconds"], 2)} for r in range(a.nodes)]
    for row in rows:
        print(f"{row['node']}: cold {row['cold']['seconds']} s ({row['cold']['compile']}), warm "
              f"{row['warm']['seconds']} s ({row['warm']['compile']}): {row['ratio']}x")
    ok = all(r["ratio"] <= 0.5 and r["warm"]["compile"] == "hit" for r in rows)
    print("target (<= 0.5x, a hit on every node):", "met" if ok else "missed")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
