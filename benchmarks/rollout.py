"""Rollout overhead on the simulated cluster, as figures.

For GB300 trays, multi_node_tp on 2, 8 and 18 (one NVL72 rack: tensor parallelism stays in one NVLink domain) and
multi_node_dep (data and expert parallelism over every GPU, behind one router; it may span racks) on 18, 36 and 72,
measures one `pyinfra <inventory> deploy/k3.py -y`:
- total wall time of the run;
- the engines' own start time: from the head unit's process start to the head engine's
  "Application startup complete." log line (what a hand-started vLLM would take as well);
- the time the tool adds = total - engines' own start time;
and the wall time of an idempotent re-run. Targets: added time at 18 trays <= 5 s and <= 1.5x the 2-tray figure,
at 72 trays <= 2.5x it; a re-run of 72 trays <= 10 s. Every simulated node shares this machine's CPUs, so what
each node does itself (sshd, its shell, the simulated tools) grows with N here, where real nodes run in parallel.

Run as root: python benchmarks/rollout.py [--runs multi_node_tp:2 ... multi_node_dep:72] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PYINFRA = str(Path(PY).parent / "pyinfra")


def k3(*args: str) -> str:
    return subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", *args], check=True,
                          capture_output=True, text=True, cwd=ROOT).stdout


def ssh(info: dict, rank: int, cmd: str) -> str:
    d = Path(info["inventory"]).parent
    return subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
                           f"root@{info['nodes'][rank]['ip']}", cmd], check=True, capture_output=True,
                          text=True).stdout


def measure(n: int, strategy: str) -> dict:
    name = f"b{strategy.split('_')[-1]}{n}"
    subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                   capture_output=True, cwd=ROOT)
    info = json.loads(k3("sim", "up", "--hardware", "gb300", "--nodes", str(n), "--name", name, "--json",
                         "--strategy", strategy))
    try:
        t0 = time.monotonic()
        run = subprocess.run([PYINFRA, info["inventory"], "deploy/k3.py", "-y"], cwd=ROOT, capture_output=True,
                             text=True)
        total = time.monotonic() - t0
        if run.returncode != 0:
            raise SystemExit(f"deploy of {n} nodes failed:\n{run.stderr[-3000:]}")
        started = float(ssh(info, 0, "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value "
                                     "k3-engine.service").strip().lstrip("@"))
        ready_line = ssh(info, 0, "journalctl -u k3-engine.service -o short-unix --no-pager | "
                                  "grep -m1 'Application startup complete'")
        engine = float(ready_line.split()[0]) - started
        t1 = time.monotonic()
        again = subprocess.run([PYINFRA, info["inventory"], "deploy/k3.py", "-y"], cwd=ROOT, capture_output=True,
                               text=True)
        rerun = time.monotonic() - t1
        assert again.returncode == 0
        return {"nodes": n, "strategy": strategy, "deploy_s": round(total, 2), "engine_start_s": round(engine, 2),
                "tool_overhead_s": round(total - engine, 2), "idempotent_rerun_s": round(rerun, 2)}
    finally:
        subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                       capture_output=True, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", metavar="STRATEGY:TRAYS",
                    default=["multi_node_tp:2", "multi_node_tp:8", "multi_node_tp:18", "multi_node_dep:18",
                             "multi_node_dep:36", "multi_node_dep:72"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(int(n), strategy) for strategy, n in (r.split(":") for r in args.runs)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'strategy':>15} {'nodes':>5} {'deploy s':>9} {'engine s':>9} {'tool s':>7} {'re-run s':>9}")
    for r in rows:
        print(f"{r['strategy']:>15} {r['nodes']:>5} {r['deploy_s']:>9} {r['engine_start_s']:>9} "
              f"{r['tool_overhead_s']:>7} {r['idempotent_rerun_s']:>9}")


if __name__ == "__main__":
    main()
