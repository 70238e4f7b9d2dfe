"""Rollout overhead on the simulated cluster, as figures.

For 2, 4, 8 and 16 GB300 trays (multi_node_tp), measures one `pyinfra <inventory> deploy/k3.py -y`:
- total wall time of the run;
- the engines' own start time: from the head unit's process start to the head engine's
  "Application startup complete." log line (what a hand-started vLLM would take as well);
- the time the tool adds = total - engines' own start time (target: <= 5 s at 2 nodes, flat with N);
and the wall time of an idempotent re-run (target: <= 10 s at 16 nodes).

Run as root: python benchmarks/rollout.py [--nodes 2 4 8 16] [--json]
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


def measure(n: int) -> dict:
    name = f"bro{n}"
    subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                   capture_output=True, cwd=ROOT)
    info = json.loads(k3("sim", "up", "--hardware", "gb300", "--nodes", str(n), "--name", name, "--json",
                         "--strategy", "multi_node_tp"))
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
        return {"nodes": n, "deploy_s": round(total, 2), "engine_start_s": round(engine, 2),
                "tool_overhead_s": round(total - engine, 2), "idempotent_rerun_s": round(rerun, 2)}
    finally:
        subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                       capture_output=True, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(n) for n in args.nodes]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'nodes':>5} {'deploy s':>9} {'engine s':>9} {'tool s':>7} {'re-run s':>9}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['deploy_s']:>9} {r['engine_start_s']:>9} {r['tool_overhead_s']:>7} "
              f"{r['idempotent_rerun_s']:>9}")


if __name__ == "__main__":
    main()
