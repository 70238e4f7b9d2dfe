"""Staging at scale on the simulated cluster, as figures: a rollout that brings the image and the weights to every
node, fanned out (`k3_stage: fanout`, the default: fetched from outside once, then node to node in rounds) beside
the naive way (`k3_stage: per_node`: every node fetches from outside), in the same run.

For GB300 trays (multi_node_tp) on 2, 8 and 18 trays, measures one `pyinfra <inventory> deploy/k3.py -y` on a
fresh cluster whose simulated outside (registry and hub) serves real bytes behind a tc-shaped uplink
(`sim up --uplink-mbps`, `--weights-mb`, `--image-mb`; node to node `--cluster-mbps`): the rollout's wall time, the
stage phase's wall time (from the first stage operation to the first operation after the stage in pyinfra's log),
the bytes the outside served over the uplink against one node's artifacts (image layers and checkpoint), how many
nodes fetched each artifact from outside and the rounds of node-to-node copies.

Run as root: python benchmarks/stage.py [--trays 2,8,18] [--modes fanout,per_node] [--weights-mb 256]
             [--image-mb 64] [--uplink-mbps 400] [--cluster-mbps 4000] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
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


def ran_on(output: str, operation: str) -> int:
    """On how many hosts an operation did something (pyinfra's summary table)."""
    m = re.search(r"^\s*Stage \| " + re.escape(operation) + r"\s+(\d+)\s+(\S+)", output, re.M)
    return 0 if m is None or m[2] == "-" else int(m[2])


def measure(n: int, mode: str, args: argparse.Namespace) -> dict:
    name = f"bs{'f' if mode == 'fanout' else 'n'}{n}"
    subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                   capture_output=True, cwd=ROOT)
    info = json.loads(k3("sim", "up", "--hardware", "gb300", "--nodes", str(n), "--name", name, "--json",
                         "--strategy", "multi_node_tp", "--weights-mb", str(args.weights_mb), "--image-mb",
                         str(args.image_mb), "--uplink-mbps", str(args.uplink_mbps), "--cluster-mbps",
                         str(args.cluster_mbps)))
    try:
        gv = Path(info["inventory"]).parent / "group_vars" / "all.yml"
        gv.write_text(gv.read_text() + f"k3_stage: {mode}\n")
        t0 = time.monotonic()
        run = subprocess.Popen([PYINFRA, info["inventory"], "deploy/k3.py", "-y"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        stage_start = stage_end = None
        lines = []
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line)
            now = time.monotonic() - t0
            if line.startswith("--> Starting operation: Stage") and stage_start is None:
                stage_start = now
            elif line.startswith("--> Starting operation:") and stage_start is not None and stage_end is None \
                    and "Stage" not in line:
                stage_end = now
        total = time.monotonic() - t0
        if run.wait() != 0:
            raise SystemExit(f"deploy of {n} trays ({mode}) failed:\n{''.join(lines)[-3000:]}")
        out = "".join(lines)
        status = json.loads(k3("sim", "status", "--name", name, "--json"))["clusters"][0]
        rounds = len(re.findall(r"^--> Starting operation: Stage \| Stage round \d+ of", out, re.M))
        return {"trays": n, "mode": mode, "rollout_s": round(total, 2),
                "stage_s": round((stage_end or total) - (stage_start or 0), 2),
                "image_fetches": ran_on(out, "Image vllm/vllm-openai:kimi-k3: from the registry"),
                "weights_fetches": ran_on(out, "Weights of moonshotai/Kimi-K3: from the hub"), "rounds": rounds,
                "outside_bytes": status["outside_bytes"], "artifact_bytes": status["artifact_bytes"],
                "uplink_x": round(status["outside_bytes"] / status["artifact_bytes"], 2)}
    finally:
        subprocess.run([PY, "-c", "from k3deploy.cli import main; main()", "sim", "down", "--name", name],
                       capture_output=True, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trays", default="2,8,18")
    ap.add_argument("--modes", default="fanout,per_node")
    ap.add_argument("--weights-mb", type=float, default=256.0, help="checkpoint size, MiB")
    ap.add_argument("--image-mb", type=float, default=64.0, help="image layers, MiB")
    ap.add_argument("--uplink-mbps", type=float, default=400.0, help="the site's uplink, Mbit/s")
    ap.add_argument("--cluster-mbps", type=float, default=4000.0, help="each node's rate to the others, Mbit/s")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(int(n), mode, args) for n in args.trays.split(",") for mode in args.modes.split(",")]
    for r in rows:
        print(f"{r['trays']:>3} trays {r['mode']:<8} rollout {r['rollout_s']:7.2f} s  stage {r['stage_s']:6.2f} s  "
              f"uplink {r['outside_bytes'] / 2**20:8.1f} MiB = {r['uplink_x']:5.2f}x the artifacts; fetched from "
              f"outside: image x{r['image_fetches']}, weights x{r['weights_fetches']}; {r['rounds']} rounds",
              file=sys.stderr)
    fan = {r["trays"]: r for r in rows if r["mode"] == "fanout"}
    if 2 in fan and 8 in fan:
        print(f"fanout: 8 trays / 2 trays rollout time = {fan[8]['rollout_s'] / fan[2]['rollout_s']:.2f}x "
              "(target <= 1.5x)", file=sys.stderr)
    for r in rows:
        if r["mode"] == "fanout" and r["trays"] == 8:
            print(f"fanout: 8 trays' uplink = {r['uplink_x']:.2f}x the artifacts (target <= 1.2x)", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
