"""Self-healing groups on the simulated cluster, as figures: the seconds from a failure to `k3deploy status`
saying serving again (exit 0), with no tool run in between, for a head kill, a worker kill and a reboot of a
worker's node and of the head's node.

The group is a 2-node multi-node group (default B300 `multi_node_dep`: hybrid DP with a vllm-router in front, the
simulated engines keep running when their head dies, as vLLM's do, vllm#32136). The simulated cluster's timings are
those `sim up` writes (`k3_restart_sec: 2`, `k3_heal_grace: 3`, `k3_heal_interval: 1`); the engines start in about a
second, so the figures are the healing's own latency (restart delay, grace, rendezvous), not model loading. Status is
polled as fast as it answers (about once a second).

Run as root: python benchmarks/heal.py [--hardware b300] [--strategy multi_node_dep] [--json]
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
UNIT = "k3-engine.service"


def k3(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", *args], check=check,
                          capture_output=True, text=True, cwd=ROOT)


def until(inventory: str, code: int, timeout: float, must: bool = True) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if k3("status", inventory, "--json", check=False).returncode == code:
            return time.monotonic() - t0
    if must:
        raise SystemExit(f"status did not exit {code} within {timeout:.0f} s")
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", default="b300")
    ap.add_argument("--strategy", default="multi_node_dep")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    name = "bheal"
    k3("sim", "down", "--name", name, check=False)
    info = json.loads(k3("sim", "up", "--hardware", args.hardware, "--nodes", "2", "--name", name, "--json",
                         "--strategy", args.strategy).stdout)
    inv = info["inventory"]
    d = Path(inv).parent

    def ssh(rank: int, command: str) -> None:
        subprocess.run(["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o",
                        "BatchMode=yes", f"root@{info['nodes'][rank]['ip']}", command], check=True,
                       capture_output=True)

    rows = []
    try:
        gv = d / "group_vars" / "all.yml"
        gv.write_text(gv.read_text() + "k3_stage: per_node\n")
        if subprocess.run([PYINFRA, inv, "deploy/k3.py", "-y"], cwd=ROOT, capture_output=True).returncode != 0:
            raise SystemExit("the deploy failed")
        until(inv, 0, 60)
        events = [("head killed (SIGKILL)", lambda: ssh(0, f"systemctl kill --signal=SIGKILL {UNIT}")),
                  ("worker killed (SIGKILL)", lambda: ssh(1, f"systemctl kill --signal=SIGKILL {UNIT}")),
                  ("worker's node rebooted", lambda: k3("sim", "reboot", name, "1")),
                  ("head's node rebooted", lambda: k3("sim", "reboot", name, "0"))]
        for what, act in events:
            t0 = time.monotonic()
            act()
            seen_down = until(inv, 1, 15, must=False) is not None    # down (or degraded) first
            until(inv, 0, 300)
            rows.append({"event": what, "serving_again_s": round(time.monotonic() - t0, 1),
                         "seen_down": seen_down})
            time.sleep(3)
    finally:
        k3("sim", "down", "--name", name, check=False)
    for r in rows:
        print(f"{r['event']:<26} serving again after {r['serving_again_s']:5.1f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
