#!/usr/bin/env python3
"""Time ``k3deploy sim up`` / ``sim down`` for 2, 4 and 8 nodes and measure memory per node.

Usage (as root, with the simulation's host packages installed):

    python benchmarks/sim_updown.py [--nodes 2,4,8] [--runs 3] [--hardware gb300] [--json FILE]

Each run calls the real CLI in a subprocess, so the figures include Python start-up and are what a
user sees. ``up`` is timed until every node's sshd accepts the cluster key (what ``sim up`` waits
for); ``down`` until everything is removed. Memory per node is reported two ways: the node's v1
memory cgroup (its processes plus its tmpfs pages, as charged by the kernel) and the drop of the
host's MemAvailable divided by the node count. The base root is built first if it is missing; that
build time is reported separately and not counted in ``up``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

NAME = "k3bench"


def k3(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("k3deploy")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from k3deploy.cli import main; main()"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def one_run(hardware: str, nodes: int) -> dict:
    avail0 = mem_available()
    t0 = time.monotonic()
    res = k3("sim", "up", "--hardware", hardware, "--nodes", str(nodes), "--name", NAME, "--json")
    t_up = time.monotonic() - t0
    if res.returncode != 0:
        k3("sim", "down", "--name", NAME)
        raise SystemExit(f"sim up failed: {res.stderr.strip()}")
    time.sleep(1.0)  # let the nodes' boot-time services settle before measuring memory
    st = json.loads(k3("sim", "status", "--name", NAME, "--json").stdout)["clusters"][0]
    cg_mem = [n["memory_bytes"] for n in st["nodes"] if n["memory_bytes"]]
    avail1 = mem_available()
    t0 = time.monotonic()
    res = k3("sim", "down", "--name", NAME)
    t_down = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"sim down failed: {res.stderr.strip()}")
    return {
        "up_s": round(t_up, 3),
        "down_s": round(t_down, 3),
        "cgroup_mem_per_node_mib": round(statistics.mean(cg_mem) / 2**20, 1) if cg_mem else None,
        "host_mem_per_node_mib": round((avail0 - avail1) / nodes / 2**20, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,4,8", help="comma-separated node counts")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hardware", default="gb300")
    ap.add_argument("--json", dest="json_out", help="also write the JSON report to this file")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the simulated cluster needs root")
    counts = [int(x) for x in args.nodes.split(",")]

    t0 = time.monotonic()
    res = k3("sim", "base")
    if res.returncode != 0:
        raise SystemExit(f"sim base failed: {res.stderr.strip()}")
    base_s = time.monotonic() - t0
    k3("sim", "down", "--name", NAME)

    rows = []
    for n in counts:
        runs = [one_run(args.hardware, n) for _ in range(args.runs)]

        def med(key: str, runs: list[dict] = runs) -> float | None:
            vals = [r[key] for r in runs if r[key] is not None]
            return round(statistics.median(vals), 3) if vals else None

        rows.append(
            {
                "nodes": n,
                "runs": runs,
                "up_s_median": med("up_s"),
                "down_s_median": med("down_s"),
                "cgroup_mem_per_node_mib": med("cgroup_mem_per_node_mib"),
                "host_mem_per_node_mib": med("host_mem_per_node_mib"),
            }
        )
    report = {
        "benchmark": "sim_updown",
        "hardware": args.hardware,
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "base_ready_s": round(base_s, 2),
        "target": {"nodes": 2, "up_s_max": 10.0},
        "results": rows,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(f"\n{'nodes':>5} {'up s (median)':>14} {'down s (median)':>16} {'MiB/node cgroup':>16} {'MiB/node host':>14}")
    for r in rows:
        print(
            f"{r['nodes']:>5} {r['up_s_median']:>14.2f} {r['down_s_median']:>16.2f} "
            f"{r['cgroup_mem_per_node_mib'] or 0:>16.1f} {r['host_mem_per_node_mib']:>14.1f}"
        )
    two = next((r for r in rows if r["nodes"] == 2), None)
    if two is not None:
        verdict = "meets" if float(str(two["up_s_median"])) <= 10.0 else "MISSES"
        print(f"\n2 nodes up in {two['up_s_median']:.2f} s: {verdict} the 10 s target")


if __name__ == "__main__":
    main()
